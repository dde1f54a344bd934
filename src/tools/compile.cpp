// `pto compile`: compile an ONNX model and show what the compiler made of it: the graph after
// any pass (--dump-after), the kernels and their tile programs (--dump-tiles), and the kernel
// count and planned memory (--stats). Saving the compiled model (-o) is not implemented yet and
// is refused rather than ignored.
#include <iomanip>
#include <iostream>

#include "cli.h"
#include "pto/device_info.h"
#include "pto/executable.h"
#include "pto/onnx.h"
#include "pto/parallel.h"
#include "pto/passes.h"

namespace pto::cli {
namespace {

const char* kUsage =
    "usage: pto compile model.onnx [--level L] [--dump-after PASS[,PASS...]|all] [--dump-tiles]\n"
    "                   [--tile [KERNEL=]ROWSxCOLS] [--stats] [--list-passes]\n"
    "\n"
    "Compiles a model and shows what the compiler made of it.\n"
    "\n"
    "options:\n"
    "  --level L          optimization level 0..3 (default 2): 1 runs the graph passes, 2 adds\n"
    "                     fusion into kernels and memory planning\n"
    "  --dump-after PASS  print the graph after these passes (as PTO_DUMP_AFTER does)\n"
    "  --dump-tiles       print every kernel: its nodes, fusion rule, backend, tile program and\n"
    "                     tiling plan (tile shape, tiles, working set against the cache budget)\n"
    "  --tile [K=]RxC     pin the tile shape of tile kernel K (a node or output name; none or "
    "'*':\n"
    "                     every tile kernel) to R rows x C columns (or C alone); repeatable\n"
    "  --stats            print node and kernel counts, pass times and planned memory\n"
    "  --list-passes      print the passes and the pipeline of each level\n"
    "  -o FILE            save the compiled model (not implemented yet: refused)\n";

void list_passes() {
  for (const std::string& name : PassRegistry::global().names())
    std::cout << "  " << std::left << std::setw(32) << name
              << PassRegistry::global().find(name)->doc << "\n";
  for (int level = 0; level <= 3; ++level) {
    std::cout << "level " << level << ":";
    for (const std::string& p : pipeline(level)) std::cout << " " << p;
    std::cout << (level >= 2 ? " + FuseKernels + memory plan" : "") << "\n";
  }
}

// "[KERNEL=]ROWSxCOLS" or "[KERNEL=]COLS" into options.tiles.
void pin_tile(ArgReader& a, CompileOptions& options) {
  const std::string v = a.value();
  const size_t eq = v.find('=');
  const std::string name = eq == std::string::npos ? "*" : v.substr(0, eq);
  const std::string dims = eq == std::string::npos ? v : v.substr(eq + 1);
  std::vector<int64_t> shape;
  for (size_t start = 0; start <= dims.size();) {
    size_t end = dims.find('x', start);
    if (end == std::string::npos) end = dims.size();
    const std::string part = dims.substr(start, end - start);
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos ||
        part.size() > 12)
      a.fail(cat("--tile ", v, ": expected [KERNEL=]ROWSxCOLS or [KERNEL=]COLS, e.g. 8x256"));
    shape.push_back(std::stoll(part));
    start = end + 1;
  }
  if (name.empty()) a.fail(cat("--tile ", v, ": empty kernel name"));
  options.tiles[name] = shape;
}

void print_cache_budget() {
  const CacheModel& c = cache_model();
  std::cout << "tiling planner: L1d " << c.l1d / 1024 << " KiB, L2 " << c.l2 / 1024 << " KiB, L3 "
            << c.l3 / 1024 << " KiB per core" << (c.from_env ? " (PTO_CACHE_SIZES)" : "") << "; "
            << num_threads() << " threads\n";
}

void print_stats(const Executable& exe) {
  const ExecutableStats s = exe.stats();
  std::cout << "nodes: " << s.nodes_in << " -> " << s.nodes << " after the passes\n";
  for (const PassReport& r : exe.pass_report()) {
    std::cout << "  " << std::left << std::setw(32) << r.name << std::right << std::setw(5)
              << r.nodes_before << " -> " << std::setw(5) << r.nodes_after << "  " << std::fixed
              << std::setprecision(2) << r.seconds * 1e3 << " ms";
    for (const auto& [rule, count] : r.fired) std::cout << "  " << rule << " x" << count;
    std::cout << "\n";
  }
  std::cout << "kernels: " << s.kernels << " (" << s.fused_kernels << " fused)\n";
  std::cout << "weights: " << cat(std::fixed, std::setprecision(2), s.weight_bytes / 1048576.0)
            << " MiB, packed for the GEMMs: "
            << cat(std::fixed, std::setprecision(2), s.packed_weight_bytes / 1048576.0)
            << " MiB (originals released: "
            << cat(std::fixed, std::setprecision(2), s.released_weight_bytes / 1048576.0)
            << " MiB)\n";
  if (s.memory_planned || s.unplanned_peak_bytes) {
    auto mib = [](size_t b) {
      return cat(std::fixed, std::setprecision(2), b / 1048576.0, " MiB");
    };
    std::cout << "intermediate memory: " << mib(s.peak_bytes)
              << (s.memory_planned ? " planned" : " (no plan)") << ", "
              << mib(s.unplanned_peak_bytes) << " unplanned, " << mib(s.live_peak_bytes)
              << " live at most; " << s.unplanned_values << " values left to the pool\n";
  } else {
    std::cout << "intermediate memory: planned per input shape at the first run (symbolic dims)\n";
  }
}

int compile_main(const std::vector<std::string>& args) {
  ArgReader a(args, "compile");
  std::string model;
  CompileOptions options;
  bool tiles = false, stats = false;
  while (a.next()) {
    if (a.is_help()) {
      std::cout << kUsage;
      return 0;
    } else if (a.is("--level")) {
      options.level = static_cast<int>(a.int_value(0, 3));
    } else if (a.is("--dump-after")) {
      std::string v = a.value();
      for (size_t start = 0; start <= v.size();) {
        size_t end = v.find(',', start);
        if (end == std::string::npos) end = v.size();
        if (end > start) options.dump_after.push_back(v.substr(start, end - start));
        start = end + 1;
      }
    } else if (a.is("--dump-tiles")) {
      tiles = true;
    } else if (a.is("--tile")) {
      pin_tile(a, options);
    } else if (a.is("--stats")) {
      stats = true;
    } else if (a.is("--list-passes")) {
      list_passes();
      return 0;
    } else if (a.is("-o") || a.is("--output")) {
      throw UnsupportedError(
          "pto compile: saving a compiled model (-o) is not implemented yet in this version");
    } else if (a.positional() && model.empty()) {
      model = a.arg();
    } else {
      a.unknown();
    }
  }
  if (model.empty()) throw UsageError("pto compile: no model given", "compile");
  Executable exe = compile(onnx::load(model), options);
  if (tiles) {
    print_cache_budget();
    const Graph& g = exe.graph();
    for (size_t i = 0; i < exe.num_steps(); ++i) {
      const StepInfo& s = exe.step(i);
      std::cout << "kernel " << i << " [" << s.backend << "] "
                << (s.rule.empty() ? g.nodes()[s.nodes[0]].op : s.rule) << ":";
      for (int32_t n : s.nodes) std::cout << " " << g.nodes()[n].name;
      std::cout << "\n";
      const std::string program = exe.describe_step(i);
      if (!program.empty()) std::cout << program << (program.back() == '\n' ? "" : "\n");
    }
  }
  if (stats || !tiles) print_stats(exe);
  return 0;
}

}  // namespace

Command compile_command() {
  return {"compile", "Compile a model; show passes, kernels, tile programs and memory.", kUsage,
          compile_main};
}

}  // namespace pto::cli
