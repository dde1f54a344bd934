// `pto tune`: time alternatives to the planner's knobs for each kernel of a model and store the
// winners in the tuning cache, which later compilations read (docs/tuning.md).
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "cli.h"
#include "inputs.h"
#include "pto/executable.h"
#include "pto/onnx.h"
#include "pto/parallel.h"
#include "pto/tuning.h"
#include "tune/signature.h"

namespace pto::cli {
namespace {

const char* kUsage =
    "usage: pto tune model.onnx [--level fast|normal|exhaustive] [--trials N] [--no-early-stop]\n"
    "                [--threads T] [--dim SYMBOL=VALUE ...] [--input NAME=FILE.npy ...]\n"
    "                [--seed N] [--cache FILE] [--no-tune-cache] [--for-load]\n"
    "\n"
    "Tunes the kernels of a model on this machine: each kernel's tile shape or GEMM blocking is\n"
    "timed against the planner's choice on the model's own intermediate values, and a winner\n"
    "(at least 3% faster, twice) is stored in the tuning cache, keyed by the kernel's signature,\n"
    "the thread count and this machine (CPU, ISA, caches). Later compilations of the same model\n"
    "(pto run, bench, compile, profile, check, pypto.compile) use it automatically. The whole\n"
    "model is then timed with and without the winners, and they are dropped when it is not\n"
    "faster. Prints a table per kernel and the model's speed-up. A progress bar shows on a\n"
    "terminal.\n"
    "\n"
    "options:\n"
    "  --level L              fast (the kernels taking 80% of the time, 8 candidates each),\n"
    "                         normal (kernels taking at least 1%, 32 candidates; default) or\n"
    "                         exhaustive (every kernel, every candidate)\n"
    "  --trials N             time at most N candidates in all\n"
    "  --no-early-stop        do not stop a kernel after 6 candidates without improvement\n"
    "  --threads T            tune for T threads (the cache keys on it; default:\n"
    "                         PTO_NUM_THREADS, else the cores this process may use)\n"
    "  --cache FILE           the tuning cache file (default: $PTO_TUNE_CACHE, else\n"
    "                         ~/.cache/pypto/tune/<machine>.json)\n"
    "  --no-tune-cache        tune every kernel again, ignoring what the cache holds\n"
    "  --for-load             on several threads, try knobs that take threads from a kernel\n"
    "                         (conv.threads) even when other processes hold the cores: the\n"
    "                         winners then suit this load and may be slower without it\n"
    "  --input, --dim, --seed the inputs, as for 'pto run' (random by default); symbolic\n"
    "                         dimensions are tuned at these sizes\n";

struct Options {
  std::string model;
  InputSpec inputs;
  tune::TuneOptions tune;
};

std::optional<Options> parse(const std::vector<std::string>& args) {
  Options o;
  ArgReader a(args, "tune");
  while (a.next()) {
    if (a.is_help()) {
      std::cout << kUsage;
      return std::nullopt;
    } else if (read_input_option(a, o.inputs)) {
    } else if (a.is("--level")) {
      const std::string v = a.value();
      if (v != "fast" && v != "normal" && v != "exhaustive")
        a.fail(cat("--level takes fast, normal or exhaustive, got '", v, "'"));
      o.tune.level = tune::parse_level(v);
    } else if (a.is("--trials")) {
      o.tune.num_trials = a.int_value(1, INT64_MAX);
    } else if (a.is("--no-early-stop")) {
      o.tune.early_stop = false;
    } else if (a.is("--threads")) {
      set_num_threads(static_cast<int>(a.int_value(1, 4096)));
    } else if (a.is("--cache")) {
      o.tune.cache_path = a.value();
    } else if (a.is("--no-tune-cache")) {
      o.tune.reuse_cache = false;
    } else if (a.is("--for-load")) {
      o.tune.for_load = true;
    } else if (a.positional() && o.model.empty()) {
      o.model = a.arg();
    } else {
      a.unknown();
    }
  }
  if (o.model.empty()) a.fail("no model file given");
  return o;
}

std::string ms(double seconds) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(seconds < 0.01 ? 4 : 3) << seconds * 1e3;
  return os.str();
}

int tune_main(const std::vector<std::string>& args) {
  std::optional<Options> o = parse(args);
  if (!o) return 0;
  const Graph g = onnx::load(o->model);
  const std::vector<Tensor> inputs = make_inputs(g, o->inputs);
  const tune::TuneReport r = tune::tune(g, inputs, {}, o->tune);
  std::cout << "tuning cache: " << r.cache_path << " (" << num_threads() << " thread"
            << (num_threads() == 1 ? "" : "s") << ", level " << tune::level_name(o->tune.level)
            << ")\n";
  std::cout << std::left << std::setw(44) << "kernel" << std::right << std::setw(12) << "planner ms"
            << std::setw(12) << "tuned ms"
            << "  knobs\n";
  for (const tune::KernelTuning& k : r.kernels) {
    std::string name = k.name.size() > 43 ? k.name.substr(0, 40) + "..." : k.name;
    std::cout << std::left << std::setw(44) << name << std::right << std::setw(12)
              << ms(k.planner_seconds) << std::setw(12) << ms(k.tuned_seconds) << "  "
              << tune::knobs_str(k.knobs)
              << (k.from_class   ? " (shape class)"
                  : k.from_cache ? " (cached)"
                  : k.capped     ? " (not tuned: --trials spent)"
                                 : "")
              << "\n";
  }
  if (r.pool_speedup > 0)
    std::cout << "pool speed-up " << std::fixed << std::setprecision(2) << r.pool_speedup << "x on "
              << num_threads() << " threads"
              << (!r.contended       ? ""
                  : o->tune.for_load ? " (other processes hold the cores; --for-load: thread "
                                       "knobs tried anyway)"
                                     : " (other processes hold the cores: thread knobs such as "
                                       "conv.threads not tried; --for-load tries them)")
              << "\n";
  for (const tune::ClassTuning& c : r.classes)
    std::cout << "shape class: " << c.name << " (" << c.steps.size() << " kernels): " << std::fixed
              << std::setprecision(3) << c.ratio << "x the planner's time"
              << (c.won ? ", kept" : "") << "\n";
  std::cout << r.kernels.size() << " kernel(s), " << r.trials << " candidate(s) timed in "
            << std::fixed << std::setprecision(1) << r.seconds << " s\n";
  if (r.model_planner_seconds > 0) {
    std::cout << "model: planner " << ms(r.model_planner_seconds) << " ms, tuned "
              << ms(r.model_tuned_seconds) << " ms, speed-up " << std::setprecision(3)
              << r.model_planner_seconds / r.model_tuned_seconds << "x (checks";
    for (const auto& [p, t] : r.model_checks) std::cout << " " << p / t << "x";
    std::cout << ")" << (r.kept ? "" : " (not faster: the planner's knobs are kept)") << "\n";
  } else
    std::cout << "model: no kernel faster than the planner's choice\n";
  return 0;
}

}  // namespace

Command tune_command() {
  return {"tune", "Auto-tune the kernels of a model and store the winners.", kUsage, tune_main};
}

}  // namespace pto::cli
