// `pto compile`: compile an ONNX model and show what the compiler made of it: the graph after
// any pass (--dump-after), the kernels and their tile programs (--dump-tiles), the kernel count
// and planned memory (--stats), a picture of the graph (--graph, --graph-after); -o saves the
// compiled model (pto/serialize.h). A saved model (.pto) may be given instead of an ONNX file.
// A progress bar shows passes and kernels on a terminal.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>

#include "cli.h"
#include "inputs.h"
#include "pto/device_info.h"
#include "pto/executable.h"
#include "pto/graph_dot.h"
#include "pto/onnx.h"
#include "pto/op_coverage.h"
#include "pto/parallel.h"
#include "pto/passes.h"
#include "pto/progress.h"
#include "pto/serialize.h"
#include "run_util.h"

extern char** environ;

namespace pto::cli {
namespace {

const char* kUsage =
    "usage: pto compile model.onnx [-o model.pto] [--level L] [--precision f32|bf16|f16]\n"
    "                   [--matmul-precision highest|high|medium]\n"
    "                   [--conv-precision highest|high|medium]\n"
    "                   [--dump-after PASS[,PASS...]|all]\n"
    "                   [--dump-tiles] [--tile [KERNEL=]ROWSxCOLS] [--stats] [--list-passes]\n"
    "                   [--graph FILE.svg|.png|.pdf|.dot] [--graph-after PASS]\n"
    "       pto compile model.pto [--stats] [--dump-tiles] [--graph FILE]\n"
    "\n"
    "Compiles a model and shows what the compiler made of it; -o saves it for pto run and\n"
    "pypto.load, which load it without compiling again.\n"
    "\n"
    "options:\n"
    "  --level L          optimization level 0..3 (default 2): 1 runs the graph passes, 2 adds\n"
    "                     fusion into kernels and memory planning\n"
    "  --no-tune-cache    ignore the tuning cache: the planner's knobs only\n"
    "  --precision P      bf16 or f16: matrix products on bf16 (f16) operands with fp32\n"
    "                     accumulation, the rest fp32 (docs/precision.md); with --stats, its\n"
    "                     error against an fp32 compile on random inputs. Default f32\n"
    "  --matmul-precision M\n"
    "                     highest, high or medium, as torch.set_float32_matmul_precision: high\n"
    "                     computes fp32 MatMul/Gemm as three bf16 products of the operands'\n"
    "                     heads and tails (bf16x3, ~1e-5 relative error) where the CPU has\n"
    "                     AMX-BF16, medium as bf16 products; the rest stays fp32. Default\n"
    "                     highest (fp32 products)\n"
    "  --conv-precision M the same for fp32 Conv (not depthwise), as torch.backends.mkldnn.conv.\n"
    "                     fp32_precision (its ieee, tf32, bf16: highest, high, medium)\n"
    "  --dump-after PASS  print the graph after these passes (as PTO_DUMP_AFTER does)\n"
    "  --dump-tiles       print every kernel: its nodes, fusion rule, backend, tile program and\n"
    "                     tiling plan (tile shape, tiles, working set against the cache budget)\n"
    "  --tile [K=]RxC     pin the tile shape of tile kernel K (a node or output name; none or "
    "'*':\n"
    "                     every tile kernel) to R rows x C columns (or C alone); repeatable\n"
    "  --stats            print node and kernel counts, pass times and planned memory\n"
    "  --list-passes      print the passes and the pipeline of each level\n"
    "  -o, --output FILE  save the compiled model (a .pto file)\n"
    "  --graph FILE       draw the compiled graph, fused kernels as boxes around their nodes:\n"
    "                     .dot writes Graphviz text, .svg/.png/.pdf runs Graphviz's `dot`\n"
    "  --graph-after PASS draw the graph as that pass left it instead (no kernels yet)\n";

void list_passes() {
  for (const std::string& name : PassRegistry::global().names())
    std::cout << "  " << std::left << std::setw(32) << name
              << PassRegistry::global().find(name)->doc << "\n";
  for (int level = 0; level <= 3; ++level) {
    std::cout << "level " << level << ":";
    for (const std::string& p : pipeline(level)) std::cout << " " << p;
    std::cout << (level >= 2 ? " + FuseKernels + memory plan" : "") << "\n";
  }
  std::cout << "--precision bf16|f16: AutoMixedPrecision first, at any level\n";
  std::cout << "--matmul-precision high|medium: MatMulPrecision next, at any level\n";
  std::cout << "--conv-precision high|medium: ConvPrecision next, at any level\n";
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
  std::cout << "kernels: " << s.kernels << " (" << s.fused_kernels << " fused)";
  if (s.subgraph_kernels)
    std::cout << "; in control-flow subgraphs: " << s.subgraph_kernels << " ("
              << s.subgraph_fused_kernels << " fused)";
  std::cout << "\n";
  std::cout << "tuned kernels: " << s.tuned_kernels << " (knobs from the tuning cache)\n";
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
  if (s.subgraph_kernels)
    std::cout << "subgraph memory: "
              << cat(std::fixed, std::setprecision(2), s.subgraph_peak_bytes / 1048576.0)
              << " MiB planned at most at once, beside the model's\n";
}

// The kernels of `exe` as --dump-tiles shows them. A control-flow node's compiled subgraphs follow
// its kernel, numbered under their path ("kernel loop_0/body/1"), the name tile pins take.
void print_kernels(const Executable& exe, const std::string& path) {
  const Graph& g = exe.graph();
  for (size_t i = 0; i < exe.num_steps(); ++i) {
    const StepInfo& s = exe.step(i);
    std::cout << "kernel " << path << i << " [" << s.backend << "] "
              << (s.rule.empty() ? g.nodes()[s.nodes[0]].op : s.rule) << ":";
    for (int32_t n : s.nodes) std::cout << " " << g.nodes()[n].name;
    std::cout << "\n";
    const std::string program = exe.describe_step(i);
    if (!program.empty()) std::cout << program << (program.back() == '\n' ? "" : "\n");
    for (int32_t n : s.nodes) {
      const Node& node = g.nodes()[n];
      for (const auto& [attr, sub] : exe.subgraphs(static_cast<size_t>(n)))
        print_kernels(*sub, cat(path, node.name.empty() ? node.op : node.name, "/", attr, "/"));
    }
  }
}

// The picture's format from the file's extension: "dot" (write the text), or one `dot -T` takes.
std::string picture_format(const std::string& path, const ArgReader& a) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext == ".dot" || ext == ".gv") return "dot";
  if (ext == ".svg" || ext == ".png" || ext == ".pdf") return ext.substr(1);
  a.fail(cat("--graph ", path, ": the file must end in .svg, .png, .pdf or .dot"));
}

// Graphviz's `dot` on PATH, or "".
std::string find_dot() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    const std::string candidate = dir + "/dot";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

void write_picture(const std::string& dot, const std::string& path, const std::string& format) {
  auto write_text = [](const std::string& text, const std::string& file) {
    std::ofstream f(file, std::ios::binary | std::ios::trunc);
    if (!f || !f.write(text.data(), static_cast<std::streamsize>(text.size())) || !f.flush())
      throw ValueError(cat(file, ": cannot write (", std::strerror(errno), ")"));
  };
  if (format == "dot") return write_text(dot, path);
  const std::string exe = find_dot();
  if (exe.empty())
    throw ValueError(cat("--graph ", path, ": drawing a ", format,
                         " needs Graphviz's `dot`, "
                         "which is not on PATH (install graphviz: bash scripts/setup.sh); "
                         "--graph FILE.dot writes the DOT text without it"));
  const std::string tmp = cat(path, ".", ::getpid(), ".dot");
  write_text(dot, tmp);
  const std::string type = "-T" + format;
  std::vector<char*> argv = {const_cast<char*>(exe.c_str()),  const_cast<char*>(type.c_str()),
                             const_cast<char*>(tmp.c_str()),  const_cast<char*>("-o"),
                             const_cast<char*>(path.c_str()), nullptr};
  pid_t pid = 0;
  int status = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), environ);
  if (rc == 0) waitpid(pid, &status, 0);
  std::error_code ec;
  std::filesystem::remove(tmp, ec);
  if (rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw ValueError(cat("--graph ", path, ": ", exe, " ", type, " failed",
                         rc ? cat(" to start (", std::strerror(rc), ")") : std::string()));
}

// --precision bf16 (or --matmul-precision / --conv-precision high|medium) --stats: the
// reduced-precision compile against an fp32 compile of the same model on random inputs, per output
// (docs/precision.md), and how this machine computes it.
void print_precision_report(const Graph& original, const Executable& reduced) {
  const CompileOptions& given = reduced.options();
  const std::string name =
      given.auto_mixed_precision ? std::string(dtype_name(given.mixed_precision))
      : given.matmul_precision == "high" || given.conv_precision == "high" ? "bf16x3"
                                                                           : "bf16";
  std::string how;
  for (const PrecisionPath& p : precision_paths())
    if (p.precision == name) how = p.how;
  CompileOptions f32 = given;
  f32.auto_mixed_precision = false;
  f32.matmul_precision = f32.conv_precision = "highest";
  const Executable full = compile(original, f32);
  std::cout << "precision: " << name << " products (" << how
            << ") against fp32, on random inputs:\n";
  const std::vector<Tensor> inputs = make_inputs(original, {});
  const std::vector<Tensor> got = reduced.run(inputs), want = full.run(inputs);
  for (size_t i = 0; i < got.size(); ++i) {
    if (!is_floating(want[i].dtype())) continue;
    double max_d = 0, max_w = 0, sum_d = 0, sum_w = 0;
    for (int64_t j = 0; j < want[i].numel(); ++j) {
      const double w = want[i].item_as_double(j), d = std::fabs(got[i].item_as_double(j) - w);
      max_d = std::max(max_d, d);
      max_w = std::max(max_w, std::fabs(w));
      sum_d += d;
      sum_w += std::fabs(w);
    }
    std::cout << "  output '" << reduced.graph().value(reduced.graph().outputs()[i]).name
              << "': max relative error "
              << cat(std::scientific, std::setprecision(2), max_w > 0 ? max_d / max_w : max_d)
              << ", mean "
              << cat(std::scientific, std::setprecision(2), sum_w > 0 ? sum_d / sum_w : sum_d)
              << "\n";
  }
}

struct Args {
  std::string model, output, graph, graph_after;
  CompileOptions options;
  bool tiles = false, stats = false, level_given = false;
};

int compile_main(const std::vector<std::string>& args) {
  ArgReader a(args, "compile");
  Args o;
  CompileOptions& options = o.options;
  while (a.next()) {
    if (a.is_help()) {
      std::cout << kUsage;
      return 0;
    } else if (a.is("--level")) {
      options.level = static_cast<int>(a.int_value(0, 3));
      o.level_given = true;
    } else if (a.is("--dump-after")) {
      std::string v = a.value();
      for (size_t start = 0; start <= v.size();) {
        size_t end = v.find(',', start);
        if (end == std::string::npos) end = v.size();
        if (end > start) options.dump_after.push_back(v.substr(start, end - start));
        start = end + 1;
      }
    } else if (a.is("--dump-tiles")) {
      o.tiles = true;
    } else if (a.is("--tile")) {
      pin_tile(a, options);
    } else if (a.is("--stats")) {
      o.stats = true;
    } else if (read_tune_cache_option(a)) {
    } else if (read_precision_option(a, options)) {
    } else if (a.is("--list-passes")) {
      list_passes();
      return 0;
    } else if (a.is("-o") || a.is("--output")) {
      o.output = a.value();
      if (o.output.empty()) a.fail("-o: empty file name");
    } else if (a.is("--graph")) {
      o.graph = a.value();
      picture_format(o.graph, a);
    } else if (a.is("--graph-after")) {
      o.graph_after = a.value();
    } else if (a.positional() && o.model.empty()) {
      o.model = a.arg();
    } else {
      a.unknown();
    }
  }
  if (o.model.empty()) throw UsageError("pto compile: no model given", "compile");
  if (!o.graph_after.empty() && o.graph.empty())
    a.fail("--graph-after needs --graph FILE to draw into");

  std::optional<Executable> exe;
  std::optional<Graph> after;     // the graph --graph-after asked for
  std::optional<Graph> original;  // for --precision bf16 --stats: the fp32 compile
  ProgressBar bar("compiling");
  if (is_saved_model(o.model)) {
    if (o.level_given || !options.dump_after.empty() || !options.tiles.empty() ||
        !o.graph_after.empty() || reduces_precision(options))
      a.fail(cat(o.model,
                 " is a saved model, compiled already: --level, --precision, --matmul-precision, "
                 "--conv-precision, --dump-after, --tile and --graph-after apply to ONNX models"));
    const auto t0 = std::chrono::steady_clock::now();
    LoadedExecutable m = load_executable(o.model);
    std::cerr
        << "loaded " << o.model << " (saved by PyPTO " << m.info.pypto_version << ", level "
        << m.info.options.level << ", " << m.info.isa << ") in " << std::fixed
        << std::setprecision(1)
        << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()
        << " ms\n";
    exe.emplace(std::move(m.exe));
  } else {
    if (!o.graph_after.empty()) check_pass_runs(options.level, o.graph_after);
    options.on_progress = [&, draw = progress_on(bar)](const CompileProgress& p) {
      if (p.graph && p.name == o.graph_after) after = *p.graph;
      draw(p);
    };
    Graph g = onnx::load(o.model);
    if (reduces_precision(options) && o.stats) original = g;
    exe.emplace(compile(std::move(g), options));
    bar.finish();
  }
  if (!o.output.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    save_executable(*exe, o.output);
    std::cout
        << "saved " << o.output << " ("
        << cat(std::fixed, std::setprecision(2), std::filesystem::file_size(o.output) / 1048576.0)
        << " MiB) in "
        << cat(std::fixed, std::setprecision(1),
               std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                   .count())
        << " ms\n";
  }
  if (!o.graph.empty()) {
    DotOptions dot;
    dot.title =
        cat(std::filesystem::path(o.model).filename().string(),
            after ? cat(" after ", o.graph_after)
                  : cat(", level ", exe->options().level, ": ", exe->num_steps(), " kernels"));
    write_picture(after ? to_dot(*after, nullptr, dot) : to_dot(*exe, dot), o.graph,
                  picture_format(o.graph, a));
    std::cout << "wrote " << o.graph << "\n";
  }
  if (o.tiles) {
    print_cache_budget();
    print_kernels(*exe, "");
  }
  if (o.stats || (!o.tiles && o.output.empty() && o.graph.empty())) print_stats(*exe);
  if (original) print_precision_report(*original, *exe);
  return 0;
}

}  // namespace

Command compile_command() {
  return {"compile",
          "Compile a model; show passes, kernels, memory, a graph picture; save it (-o).", kUsage,
          compile_main};
}

}  // namespace pto::cli
