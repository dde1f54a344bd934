// `pto run`: load an ONNX model, feed it inputs from .npy files or random ones made from the
// declared shapes, run it and summarize (or save) the outputs.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "cli.h"
#include "inputs.h"
#include "pto/executable.h"
#include "pto/npy.h"
#include "pto/onnx.h"
#include "pto/parallel.h"
#include "pto/reference.h"
#include "pto/serialize.h"
#include "run_util.h"

namespace pto::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* kUsage =
    "usage: pto run model.onnx|model.pto [--input NAME=FILE.npy ...] [--output-dir DIR] [--seed "
    "N]\n"
    "               [--dim SYMBOL=VALUE ...] [--repeat N] [--print-graph] [--threads N]\n"
    "               [--level L] [--precision f32|bf16|f16] [--engine cpu|reference]\n"
    "               [--matmul-precision highest|high|medium]\n"
    "               [--conv-precision highest|high|medium]\n"
    "\n"
    "Loads an ONNX model, runs it and prints each output's name, dtype, shape, min/max/mean/std\n"
    "and first values, with the load time and the run time (median of --repeat runs).\n"
    "The model is compiled (pto::compile) and runs on the CPU backend; nodes the backend has no\n"
    "kernel for run on the reference interpreter's, and the summary lists them. A saved model\n"
    "(pto compile -o model.pto) runs as it was compiled, without compiling again.\n"
    "\n"
    "options:\n"
    "  --input NAME=FILE.npy  feed graph input NAME from a .npy file; its dtype and rank must\n"
    "                         match the model's declaration. A sequence input takes a list,\n"
    "                         NAME=a.npy,b.npy (one file per element); FILE.pb is ONNX test\n"
    "                         data (TensorProto, SequenceProto or OptionalProto). An optional\n"
    "                         input not given is empty\n"
    "  --dim SYMBOL=VALUE     the size of a symbolic dimension (e.g. --dim batch=8) for the\n"
    "                         random inputs; default 1 (a note says so), or the size a --input\n"
    "                         file gave the same symbol\n"
    "  --seed N               seed of the random inputs (default 0)\n"
    "  --repeat N             run N times and report the median time (default 1)\n"
    "  --output-dir DIR       write each output to DIR/NAME.npy; characters of NAME outside\n"
    "                         [A-Za-z0-9_.-] become '_' (bf16 outputs are saved as float32);\n"
    "                         a sequence to DIR/NAME_0.npy, NAME_1.npy, ...\n"
    "  --print-graph          print the imported graph\n"
    "  --threads N            run kernels on N threads (default: PTO_NUM_THREADS, else the\n"
    "                         cores this process may use)\n"
    "  --level L              optimization level 0..3 (default 2)\n"
    "  --no-tune-cache        ignore the tuning cache: the planner's knobs only\n"
    "  --precision P          f32, bf16 or f16: bf16/f16 computes the matrix products on\n"
    "                         operands rounded to it (docs/precision.md)\n"
    "  --matmul-precision M   highest, high or medium, as torch.set_float32_matmul_precision:\n"
    "                         high computes fp32 MatMul/Gemm as three bf16 products of the\n"
    "                         operands' heads and tails (bf16x3, ~1e-5 relative error) where\n"
    "                         the CPU has AMX-BF16, medium as bf16 products (docs/precision.md)\n"
    "  --conv-precision M     the same for fp32 Conv (not depthwise), as torch.backends.mkldnn.\n"
    "                         conv.fp32_precision (ieee, tf32, bf16: highest, high, medium)\n"
    "  --engine E             cpu (default: the compiled Executable) or reference (the\n"
    "                         reference interpreter alone, the oracle)\n"
    "\n"
    "Inputs not given with --input are random, from a fixed-seed generator: floats uniform in\n"
    "[-1, 1), integers uniform in [0, 10), bools true or false with equal chance.\n";

struct Options {
  std::string model;
  InputSpec inputs;  // --input, --dim, --seed
  std::string output_dir;
  int64_t repeat = 1;
  bool print_graph = false;
  std::optional<int64_t> threads;
  std::optional<int64_t> level;
  CompileOptions precision;  // --precision: auto_mixed_precision and mixed_precision
  std::string engine = "cpu";
};

std::optional<Options> parse(const std::vector<std::string>& args) {
  Options o;
  ArgReader a(args, "run");
  while (a.next()) {
    if (a.is_help()) {
      std::cout << kUsage;
      return std::nullopt;
    } else if (read_input_option(a, o.inputs)) {
    } else if (a.is("--output-dir")) {
      o.output_dir = a.value();
      if (o.output_dir.empty()) a.fail("--output-dir needs a folder");
    } else if (a.is("--repeat")) {
      o.repeat = a.int_value(1, 1000000);
    } else if (a.is("--threads")) {
      o.threads = a.int_value(1, 4096);
    } else if (a.is("--engine")) {
      o.engine = a.value();
      if (o.engine != "cpu" && o.engine != "reference")
        throw UsageError(cat("--engine must be cpu or reference, got '", o.engine, "'"), "run");
    } else if (a.is("--level")) {
      o.level = a.int_value(0, 3);
    } else if (read_tune_cache_option(a)) {
    } else if (read_precision_option(a, o.precision)) {
    } else if (a.is("--print-graph")) {
      o.print_graph = true;
    } else if (a.positional() && o.model.empty()) {
      o.model = a.arg();
    } else {
      a.unknown();
    }
  }
  if (o.model.empty()) a.fail("no model file given");
  return o;
}

void make_output_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw ValueError(cat(dir, ": cannot create the output folder",
                         ec ? cat(" (", ec.message(), ")") : std::string(" (a file is there)")));
}

void write_outputs(const Graph& g, const std::vector<Tensor>& outs, const std::string& dir) {
  std::set<std::string> taken;
  for (size_t i = 0; i < outs.size(); ++i) {
    std::string base = sanitize_file_name(g.value(g.outputs()[i]).name, i);
    std::string name = base;
    for (int k = 1; !taken.insert(name).second; ++k) name = cat(base, "_", k);
    const std::string& output = g.value(g.outputs()[i]).name;
    auto write = [&](Tensor t, const std::string& file) {
      if (t.dtype() == DType::kBF16) {
        std::cerr << "note: output '" << output
                  << "' is bf16, which numpy lacks; saved as float32\n";
        t = bf16_to_f32(t);
      }
      std::string path = (fs::path(dir) / (file + ".npy")).string();
      write_npy(path, t);
      std::cout << "wrote " << path << "\n";
    };
    if (outs[i].kind() == ValueKind::kNone) {
      std::cerr << "note: output '" << output << "' is an empty optional; nothing written\n";
    } else if (outs[i].kind() == ValueKind::kSequence) {
      const std::vector<Tensor>& items = outs[i].items();
      for (size_t k = 0; k < items.size(); ++k) write(items[k], cat(name, "_", k));
      if (items.empty())
        std::cerr << "note: output '" << output << "' is an empty sequence; nothing written\n";
    } else {
      write(outs[i], name);
    }
  }
}

int run_main(const std::vector<std::string>& args) {
  auto opts = parse(args);
  if (!opts) return 0;
  const Options& o = *opts;

  if (o.threads) set_num_threads(static_cast<int>(*o.threads));
  if (o.level && o.engine == "reference")
    std::cerr << "note: --level has no effect on the reference engine\n";
  if (reduces_precision(o.precision) && o.engine == "reference")
    throw UsageError(cat(precision_flag(o.precision),
                         " needs the cpu engine (the reference runs the graph as it is)"),
                     "run");
  auto t0 = Clock::now();
  std::optional<Executable> exe;
  std::optional<LoadedExecutable> saved;
  if (is_saved_model(o.model)) {  // compiled already: no passes, no fusion, no --level
    if (o.level || reduces_precision(o.precision))
      throw UsageError(
          cat(o.model, " is a saved model, compiled already at the level and ",
              "precision its file records: --level, --precision, --matmul-precision and ",
              "--conv-precision apply to ONNX models"),
          "run");
    saved.emplace(load_executable(o.model));
  }
  Graph g = saved ? saved->exe.graph_with_weights() : onnx::load(o.model);
  double load_ms = ms_since(t0);
  if (o.print_graph) std::cout << print(g);

  std::vector<Tensor> inputs = make_inputs(g, o.inputs);
  if (!o.output_dir.empty()) make_output_dir(o.output_dir);  // fail before a long run
  std::string engine = "reference";
  if (o.engine == "cpu") {
    auto t1 = Clock::now();
    if (saved)
      exe.emplace(std::move(saved->exe));
    else {
      ProgressBar bar("compiling");
      exe.emplace(compile(g, {.level = static_cast<int>(o.level.value_or(2)),
                              .auto_mixed_precision = o.precision.auto_mixed_precision,
                              .mixed_precision = o.precision.mixed_precision,
                              .matmul_precision = o.precision.matmul_precision,
                              .conv_precision = o.precision.conv_precision,
                              .on_progress = progress_on(bar)}));
    }
    size_t on_cpu = 0;
    std::map<std::string, int> fallback;
    for (size_t i = 0; i < exe->graph().nodes().size(); ++i) {
      if (exe->node_backend(i) == "cpu")
        ++on_cpu;
      else
        ++fallback[exe->graph().nodes()[i].op];
    }
    engine =
        cat("cpu, level ", exe->options().level, ", ", on_cpu, " of ", exe->graph().nodes().size(),
            " nodes on CPU kernels (",
            saved ? cat("saved model, PyPTO ", saved->info.pypto_version, ", ", saved->info.isa)
                  : cat("compiled in ", format_ms(ms_since(t1))),
            ")");
    if (!fallback.empty()) {
      engine += "; on the reference:";
      for (const auto& [op, n] : fallback) engine += cat(" ", op, "x", n);
    }
  }
  std::vector<Tensor> outs;
  std::vector<double> times;
  for (int64_t r = 0; r < o.repeat; ++r) {
    auto t1 = Clock::now();
    outs = exe ? exe->run(inputs) : reference::run(g, inputs);
    times.push_back(ms_since(t1));
  }
  std::sort(times.begin(), times.end());
  double median = times.size() % 2 ? times[times.size() / 2]
                                   : (times[times.size() / 2 - 1] + times[times.size() / 2]) / 2;

  std::cout << "engine: " << engine << "\n"
            << "threads: " << num_threads() << "\n"
            << "load:   " << format_ms(load_ms) << "\n"
            << "run:    " << format_ms(median)
            << (o.repeat > 1 ? cat(" (median of ", o.repeat, " runs)") : std::string()) << "\n";
  for (size_t i = 0; i < outs.size(); ++i)
    std::cout << "output " << g.value(g.outputs()[i]).name << ": " << summarize(outs[i]) << "\n";
  if (!o.output_dir.empty()) write_outputs(g, outs, o.output_dir);
  return 0;
}

}  // namespace

Command run_command() {
  return {"run", "Run an ONNX model on random or given inputs and summarize its outputs.", kUsage,
          run_main};
}

}  // namespace pto::cli
