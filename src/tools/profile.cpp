// `pto profile`: run an ONNX model under the profiler, print the key-averages table and write a
// Chrome/Perfetto trace and an SVG timeline (docs/profiling.md).
#include <iostream>
#include <map>
#include <optional>

#include "cli.h"
#include "inputs.h"
#include "pto/executable.h"
#include "pto/onnx.h"
#include "pto/parallel.h"
#include "pto/profiler.h"
#include "run_util.h"

namespace pto::cli {
namespace {

const char* kUsage =
    "usage: pto profile model.onnx [--trace trace.json] [--timeline timeline.svg]\n"
    "                   [--threads N] [--level L] [--precision f32|bf16|f16] [--repeat N]\n"
    "                   [--matmul-precision highest|high|medium]\n"
    "                   [--conv-precision highest|high|medium] [--warmup N]\n"
    "                   [--input NAME=FILE.npy ...] [--dim SYMBOL=VALUE ...] [--seed N]\n"
    "                   [--sort-by KEY] [--row-limit N] [--shapes]\n"
    "\n"
    "Compiles an ONNX model, runs it --warmup times unrecorded, then --repeat times under the\n"
    "profiler, and prints one row per kernel (and one per model call): self and total time,\n"
    "calls, GFLOP/s and the fraction of the machine's FMA peak, bytes the kernel allocates in\n"
    "the memory plan, and the model nodes it covers.\n"
    "\n"
    "options:\n"
    "  --trace FILE           write a Chrome/Perfetto trace (Trace Event Format JSON): a track\n"
    "                         per thread with kernels and tile tasks, data dependencies as flow\n"
    "                         arrows, live memory as a counter\n"
    "  --timeline FILE        write an SVG timeline: a row per thread, a box per tile task\n"
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
    "  --repeat N             profiled runs (default 1)\n"
    "  --warmup N             runs before profiling, not recorded (default 1)\n"
    "  --input NAME=FILE.npy  feed graph input NAME from a .npy file (or .pb; see 'pto run')\n"
    "  --dim SYMBOL=VALUE     the size of a symbolic dimension for the random inputs\n"
    "  --seed N               seed of the random inputs (default 0)\n"
    "  --sort-by KEY          self (default), total, avg, calls, flops, gflops, alloc, name\n"
    "  --row-limit N          rows of the table (default 30; 0: all)\n"
    "  --shapes               record input shapes and add them to the table\n";

struct Options {
  std::string model, trace, timeline;
  InputSpec inputs;
  std::optional<int64_t> threads;
  int64_t level = 2, repeat = 1, warmup = 1, row_limit = 30;
  CompileOptions precision;  // --precision: auto_mixed_precision and mixed_precision
  std::string sort_by = "self";
  bool shapes = false;
};

std::optional<Options> parse(const std::vector<std::string>& args) {
  Options o;
  ArgReader a(args, "profile");
  while (a.next()) {
    if (a.is_help()) {
      std::cout << kUsage;
      return std::nullopt;
    } else if (a.is("--trace")) {
      o.trace = a.value();
    } else if (a.is("--timeline")) {
      o.timeline = a.value();
    } else if (a.is("--threads")) {
      o.threads = a.int_value(1, 4096);
    } else if (a.is("--level")) {
      o.level = a.int_value(0, 3);
    } else if (read_tune_cache_option(a)) {
    } else if (read_precision_option(a, o.precision)) {
    } else if (a.is("--repeat")) {
      o.repeat = a.int_value(1, 1000000);
    } else if (a.is("--warmup")) {
      o.warmup = a.int_value(0, 1000000);
    } else if (read_input_option(a, o.inputs)) {
    } else if (a.is("--sort-by")) {
      o.sort_by = a.value();
    } else if (a.is("--row-limit")) {
      o.row_limit = a.int_value(0, INT64_MAX);
    } else if (a.is("--shapes")) {
      o.shapes = true;
    } else if (a.positional() && o.model.empty()) {
      o.model = a.arg();
    } else {
      a.unknown();
    }
  }
  if (o.model.empty()) throw UsageError("no model given", "profile");
  try {  // a bad --sort-by is a usage mistake, found before the model is loaded
    profiler::table({}, {}, {.sort_by = o.sort_by});
  } catch (const ValueError& e) {
    throw UsageError(cat("--sort-by: ", e.what()), "profile");
  }
  return o;
}

int profile_main(const std::vector<std::string>& args) {
  auto opts = parse(args);
  if (!opts) return 0;
  const Options& o = *opts;
  if (o.threads) set_num_threads(static_cast<int>(*o.threads));
  const Executable exe =
      compile(onnx::load(o.model), {.level = static_cast<int>(o.level),
                                    .auto_mixed_precision = o.precision.auto_mixed_precision,
                                    .mixed_precision = o.precision.mixed_precision,
                                    .matmul_precision = o.precision.matmul_precision,
                                    .conv_precision = o.precision.conv_precision});
  const std::vector<Tensor> inputs = make_inputs(exe.graph(), o.inputs);
  for (int64_t i = 0; i < o.warmup; ++i) exe.run(inputs);
  profiler::start({.record_shapes = o.shapes, .profile_memory = true});
  try {
    for (int64_t i = 0; i < o.repeat; ++i) exe.run(inputs);
  } catch (...) {
    profiler::stop();
    throw;
  }
  const profiler::Profile p = profiler::stop();
  std::cout << profiler::table(p, profiler::key_averages(p, o.shapes),
                               {.sort_by = o.sort_by,
                                .row_limit = o.row_limit,
                                .peak_gflops = profiler::fma_peak_gflops(p.pool_threads)});
  if (!o.trace.empty()) {
    profiler::write_chrome_trace(p, o.trace);
    std::cout << "trace: " << o.trace << " (open in https://ui.perfetto.dev or chrome://tracing)\n";
  }
  if (!o.timeline.empty()) {
    profiler::write_timeline_svg(p, o.timeline);
    std::cout << "timeline: " << o.timeline << "\n";
  }
  return 0;
}

}  // namespace

Command profile_command() {
  return {"profile", "Profile a model run: key-averages table, Chrome trace, SVG timeline.", kUsage,
          profile_main};
}

}  // namespace pto::cli
