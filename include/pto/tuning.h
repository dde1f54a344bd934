// The autotuner (docs/tuning.md "The tuner"): times alternatives to the planner's knobs for each
// kernel of a model on this machine and stores the winners in the tuning cache, which later
// compilations read (CompileOptions::use_tune_cache).
//
//   pto::tune::TuneReport r = pto::tune::tune(graph, inputs, {.level = 2}, {});
//
// The planner's choice is always a candidate and a candidate only wins when it is at least
// `min_gain` faster than the planner in two separate comparisons; at the end the whole model is
// timed with and without the winners, interleaved, twice, and the winners are dropped (stored as
// "planner") unless the model is at least 1% faster both times, so tuning does not make a model
// slower (up to the noise of those comparisons).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "pto/executable.h"

namespace pto::tune {

enum class Level {
  kFast,        // steps covering 80% of the time, at most 8 candidates each
  kNormal,      // steps taking at least 1% of the time, at most 32 candidates each; shape
                // classes (below)
  kExhaustive,  // every step, every candidate; every shape class
};
Level parse_level(const std::string& name);  // "fast", "normal", "exhaustive"; else ValueError
const char* level_name(Level level);

// One timing the tuner asks for: a step's kernel with `knobs` (empty: the planner's), the whole
// model (step -1) with the tuned knobs or without, a shape class (step -2): the kernels of the
// steps `steps` run one after the other as one unit, each with `knobs` (empty: the planner's), or
// the pool probe (step -3): a compute-bound job on the pool (empty knobs) or on the calling
// thread alone (`conv.threads {1}`).
struct Trial {
  int64_t step = -1;
  const Knobs* knobs = nullptr;
  bool tuned = false;                          // step -1: the model with the winners
  const std::vector<size_t>* steps = nullptr;  // step -2: the class's steps, in model order
};
// Seconds one run takes, measured by calling `run` (as often as it likes). Tests inject a fake.
// The default: a kernel (a shape class, the pool probe's job), runs for at least
// `sample_seconds` / 5, their mean, and a comparison takes 5 x `repeats` such samples of each
// side, alternating; the whole model, as `pto bench` times it: 2 warm-up runs, then at least 5
// runs and 10 x `sample_seconds` each timed alone, the median. An injected timer gets `repeats`
// samples of each side per comparison.
using Timer = std::function<double(const Trial& trial, const std::function<void()>& run)>;

struct TuneOptions {
  Level level = Level::kNormal;
  int64_t num_trials = 0;         // candidate timings in all, at most (0: no cap)
  bool early_stop = true;         // a kernel stops after 6 candidates without improvement
  std::string cache_path;         // "": the default tuning cache (tune_cache.h)
  bool reuse_cache = true;        // false: tune kernels the cache already holds, again
  int repeats = 5;                // samples per comparison, interleaved (x5 with the default)
  double min_gain = 0.03;         // a winner is at least this much faster than the planner
  double sample_seconds = 0.005;  // the default timer: a kernel's 5 samples take at least this
  bool progress = true;           // a ProgressBar on stderr (when it is a terminal)
  // On several threads the tuner first measures the pool's speed-up on a compute-bound job; under
  // kContendedSpeedup x the threads, other processes hold the cores, and a knob that takes
  // threads from a kernel (conv.threads, its shape classes) would win by dodging them: on the
  // 2-core Zen 4 such winners made MobileNetV2 1.2x faster under a build's load and 0.6-0.8x
  // as fast without it. So they are not tried then, unless `for_load` (tune for this load).
  bool for_load = false;
  Timer timer;  // empty: wall-clock time
};

// The outcome for one step.
struct KernelTuning {
  size_t step = 0;
  std::string name;       // the rule or op, and the output's shape
  std::string signature;  // the tuning cache's key
  Knobs knobs;            // the winner; empty: the planner's
  double planner_seconds = 0, tuned_seconds = 0;
  int64_t trials = 0;       // candidates timed
  bool from_cache = false;  // the cache already held it (not timed again)
  bool capped = false;      // num_trials was spent before it: not tuned, not stored
  bool from_class = false;  // its knobs are a shape class's (TuneReport::classes)
};

// A shape class (docs/tuning.md): one knob tried on every step of a class of kernels at once
// (on several threads, `conv.threads {1}` on the convs whose output plane is at most `plane`
// positions), timed as one unit against the planner's kernels.
// The pool's speed-up under which the machine counts as contended, per thread (TuneOptions).
constexpr double kContendedSpeedup = 0.75;

struct ClassTuning {
  std::string name;           // "conv.threads=[1] on convs with planes <= 196"
  Knobs knobs;                // the one knob tried on every member
  std::vector<size_t> steps;  // its members (steps), in model order
  double ratio = 1;           // time with the knob / the planner's (the larger of two comparisons)
  bool won = false;           // kept as the members' knobs (before the whole-model check)
};

struct TuneReport {
  std::vector<KernelTuning> kernels;  // tuned or looked-up steps, slowest first; then the
                                      // members of a winning shape class not among them
  std::vector<ClassTuning> classes;   // the shape classes tried, in order
  double pool_speedup = 0;            // the pool probe's speed-up over one thread (0: one thread)
  bool contended = false;  // under kContendedSpeedup x the threads: thread knobs not tried
                           // (unless TuneOptions::for_load)
  double model_planner_seconds = 0, model_tuned_seconds = 0;  // medians, interleaved rounds
  // Every comparison of the whole-model check: {planner, tuned} medians (at most two).
  std::vector<std::pair<double, double>> model_checks;
  bool kept = true;    // false: the model was not faster and the winners were dropped
  int64_t trials = 0;  // candidate timings in all
  double seconds = 0;  // how long tuning took
  std::string cache_path;
};

// Tunes `g` (compiled with `compile`; its tune cache options are ignored) on `inputs`, one per
// graph input, and stores the results in the cache. A kernel with symbolic dimensions is tuned
// at the sizes of `inputs`, and its knobs then serve every size (its signature names the
// symbols, not sizes).
TuneReport tune(const Graph& g, const std::vector<Tensor>& inputs, const CompileOptions& compile,
                const TuneOptions& options = {});

}  // namespace pto::tune
