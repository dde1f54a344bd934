// The autotuner (pto/tuning.h, docs/tuning.md "The tuner").
//
// One run of the model captures every step's inputs; each tunable step's kernel is then compiled
// again with candidate knobs and timed on them, interleaved with the planner's kernel.
#include "pto/tuning.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <unordered_map>

#include "backend/cpu/conv/conv.h"
#include "backend/cpu/gemm/gemm.h"
#include "pto/backend.h"
#include "pto/error.h"
#include "pto/log.h"
#include "pto/parallel.h"
#include "pto/progress.h"
#include "pto/runtime.h"
#include "tile/tile_planner.h"
#include "tune/signature.h"
#include "tune/tune_cache.h"

namespace pto::tune {
namespace {

constexpr int kEarlyStop = 6;        // candidates without improvement before a kernel stops
constexpr double kModelGain = 0.01;  // the tuned model must be at least this much faster
// The default timer's kernel samples last sample_seconds / kSplit, and a comparison takes
// kSplit x repeats of them, interleaved: the same time in all as samples of sample_seconds, but
// a burst of another process's work now lands on both kernels' samples instead of on all of one
// kernel's (samples of 5 ms, minima of 5, compared MobileNetV2's conv with itself at 0.42x to
// 1.0x on 2 threads under a build's load, and kept winners that were 1.3x to 2x slower).
constexpr int kSplit = 5;
// Shape classes: at most this many at `normal` (the smallest planes first), and a class phase
// stops after this many classes without improvement.
constexpr size_t kNormalClasses = 4;
constexpr int kClassEarlyStop = 2;

const Backend* backend_for(const Graph& g, const KernelGroup& k) {
  for (const Backend* b : BackendRegistry::global().backends())
    if (b->supports(g, k)) return b;
  return nullptr;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Seconds per call of `run`, called until `min_seconds` have passed (once at least).
double wall_time(const std::function<void()>& run, double min_seconds) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  int64_t n = 0;
  double elapsed = 0;
  do {
    run();
    ++n;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (elapsed < min_seconds);
  return elapsed / static_cast<double>(n);
}

// Seconds per run of a whole model as `pto bench` measures it: warm-up runs, then runs timed one by
// one, the median (p50); at least kModelRuns runs and 10 x `min_seconds`.
constexpr int kModelWarmup = 2, kModelRuns = 5;
double bench_time(const std::function<void()>& run, double min_seconds) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < kModelWarmup; ++i) run();
  std::vector<double> t;
  double total = 0;
  while (t.size() < static_cast<size_t>(kModelRuns) || total < 10 * min_seconds) {
    const auto t0 = Clock::now();
    run();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    total += t.back();
  }
  return median(std::move(t));
}

// Tile shapes for a tile program whose output's last dimension is `cols` (of `rows` rows): pieces
// of rows (the executor merges contiguous dimensions, so a piece may span several of these rows)
// and blocks of whole rows (what a row reduction needs), nearest the planner's usual capacity
// first. Those the kernel cannot take fail to compile and are skipped.
std::vector<Knobs> tile_candidates(int64_t rows, int64_t cols) {
  std::vector<std::vector<int64_t>> shapes;
  for (int64_t w = 256; w <= 16384; w *= 2) shapes.push_back({1, w});
  for (int64_t r = 1; r <= 64 && r <= rows; r *= 2)
    if (r * cols <= 16384 && r * cols >= 256 && !(r == 1 && (cols & (cols - 1)) == 0))
      shapes.push_back({r, cols});
  auto distance = [](const std::vector<int64_t>& s) {
    return std::abs(std::log2(static_cast<double>(s[0] * s[1]) / 2048.0));
  };
  std::stable_sort(shapes.begin(), shapes.end(),
                   [&](const auto& a, const auto& b) { return distance(a) < distance(b); });
  std::vector<Knobs> out;
  for (auto& s : shapes) out.push_back({{"tile", s}});
  return out;
}

// GEMM block sizes around the planner's: KC in {128..512}, MC and NC scaled by 1/2, 1 and 2;
// the ones changing fewer of the three first.
std::vector<Knobs> gemm_candidates(int64_t m, int64_t n, int64_t k, bool b_const) {
  cpu::GemmArgs args;
  args.m = m;
  args.n = n;
  args.k = k;
  const cpu::GemmPlan p = cpu::plan_gemm(args, 1, b_const, num_threads());
  const int64_t kc0 = std::clamp<int64_t>(p.kc, 128, 512);
  struct Cand {
    std::vector<int64_t> blocks;
    int changed;
    double distance;
  };
  std::vector<Cand> cands;
  for (int64_t kc : {128, 192, 256, 384, 512})
    for (double sm : {1.0, 0.5, 2.0})
      for (double sn : {1.0, 0.5, 2.0}) {
        const auto mc = static_cast<int64_t>(static_cast<double>(p.mc) * sm);
        const auto nc = static_cast<int64_t>(static_cast<double>(p.nc) * sn);
        const int changed = (kc != kc0) + (sm != 1.0) + (sn != 1.0);
        if (changed == 0 || mc < p.mr || nc < p.nr) continue;
        cands.push_back({{kc, mc, nc},
                         changed,
                         std::abs(std::log2(static_cast<double>(kc) / static_cast<double>(kc0)))});
      }
  std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
    return a.changed != b.changed ? a.changed < b.changed : a.distance < b.distance;
  });
  // With several threads, task grids of 1..8 tasks per thread other than the planner's, nearest
  // its number of tasks first; taken in turn with the blockings.
  std::vector<std::vector<int64_t>> grids;
  const int threads = num_threads();
  const int64_t mp = (m + p.mr - 1) / p.mr, np = (n + p.nr - 1) / p.nr;
  for (int64_t tm = 1; threads > 1 && tm <= std::min<int64_t>(mp, 8); tm *= 2)
    for (int64_t tn = 1; tn <= std::min<int64_t>(np, 32); tn *= 2)
      if (tm * tn >= threads && tm * tn <= 8 * threads && !(tm == p.tm && tn == p.tn))
        grids.push_back({tm, tn});
  auto tasks_off = [&](const std::vector<int64_t>& t) {
    return std::abs(std::log2(static_cast<double>(t[0] * t[1]) / static_cast<double>(p.tm * p.tn)));
  };
  std::stable_sort(grids.begin(), grids.end(),
                   [&](const auto& a, const auto& b) { return tasks_off(a) < tasks_off(b); });
  std::vector<Knobs> out;
  for (size_t i = 0; i < std::max(cands.size(), grids.size()); ++i) {
    if (i < grids.size()) out.push_back({{"gemm.grid", grids[i]}});
    if (i < cands.size()) out.push_back({{"gemm.blocks", cands[i].blocks}});
  }
  return out;
}

// Attention tiles: query rows per task and keys per chunk in powers of two, clamped to the
// queries and keys of this run (Q [B, H, Sq, D], K [B, Hkv, L, D]), nearest 256 x 256 first.
std::vector<Knobs> attention_candidates(const KernelGroup& core, const Node& a,
                                        const std::vector<Tensor>& inputs) {
  auto dims = [&](size_t i) -> const Dims* {
    auto it = std::find(core.inputs.begin(), core.inputs.end(), a.inputs.at(i));
    return it == core.inputs.end() ? nullptr : &inputs[it - core.inputs.begin()].shape();
  };
  const Dims *q = dims(0), *k = dims(1);
  // 4-D [B, H, S, D] or 3-D [B, S, H * D] (FoldAttentionHeads): the sequence is axis rank - 2.
  if (!q || !k || q->size() != k->size() || (q->size() != 4 && q->size() != 3)) return {};
  const size_t seq = q->size() - 2;
  std::vector<std::vector<int64_t>> tiles;
  for (int64_t rows = 32; rows <= 512; rows *= 2)
    for (int64_t block = 64; block <= 1024; block *= 2) {
      const std::vector<int64_t> t = {std::min(rows, (*q)[seq]), std::min(block, (*k)[seq])};
      if (std::find(tiles.begin(), tiles.end(), t) == tiles.end()) tiles.push_back(t);
    }
  auto distance = [](const std::vector<int64_t>& t) {
    return std::abs(std::log2(static_cast<double>(t[0]) / 256.0)) +
           std::abs(std::log2(static_cast<double>(t[1]) / 256.0));
  };
  std::stable_sort(tiles.begin(), tiles.end(),
                   [&](const auto& x, const auto& y) { return distance(x) < distance(y); });
  std::vector<Knobs> out;
  for (auto& t : tiles) out.push_back({{"attn.tiles", t}});
  return out;
}

// Conv: the algorithms (Winograd first; those that do not apply fail to compile, and one of them
// is the planner's; the small-output kernel only on planes of at most 64 positions), on several
// threads the conv on the calling thread only, then, where the
// conv runs on the implicit GEMM, output columns per GEMM in powers of two from 256 to the plane
// other than the planner's, nearest it first (X [N, C, H, W] and W as in this run).
std::vector<Knobs> conv_candidates(const Graph& g, const KernelGroup& core, const Node& a,
                                   const std::vector<Tensor>& inputs, bool thread_knobs) {
  std::vector<Knobs> out = {{{"conv.algo", {2}}}, {{"conv.algo", {1}}}, {{"conv.algo", {0}}}};
  auto slot = std::find(core.inputs.begin(), core.inputs.end(), a.inputs[0]);
  const TensorType& wt = g.value(a.inputs[1]).type;
  Dims w;
  for (const Dim& d : wt.shape ? *wt.shape : Shape{}) w.push_back(d.is_known() ? d.value : -1);
  std::optional<cpu::ConvGeometry> geo;
  if (slot != core.inputs.end() && (w.size() == 3 || w.size() == 4) &&
      std::find(w.begin(), w.end(), -1) == w.end()) {
    const Dims& x = inputs[slot - core.inputs.begin()].shape();
    try {
      if (x.size() == w.size()) geo = cpu::conv_geometry(a.attrs, x, w, "");
    } catch (const ValueError&) {
    }
  }
  // The small-output kernel (conv.algo {3}) where the output plane is small enough that it may
  // win (cpu::small_output_wins); it applies to any plane, but on large ones it only costs
  // tuning time.
  if (geo && !geo->depthwise() && geo->out_plane() <= cpu::kSmallConvTunePlane)
    out.push_back({{"conv.algo", {3}}});
  // On several threads, the conv on the calling thread alone (small convs: the pool's hand-off
  // costs more than the second thread saves), with the planner's algorithm; not when the pool
  // probe found the cores busy (TuneOptions::for_load).
  if (num_threads() > 1 && thread_knobs) out.push_back({{"conv.threads", {1}}});
  if (!geo || w.size() != 4) return out;
  const int64_t planner = cpu::conv_column_block(*geo), plane = geo->out_plane();
  if (planner == 0) return out;
  std::vector<int64_t> cols;
  for (int64_t c = 256; c < 2 * plane && c <= 16384; c *= 2)
    if (std::min(c, plane) != planner) cols.push_back(std::min(c, plane));
  std::stable_sort(cols.begin(), cols.end(), [&](int64_t p, int64_t q) {
    return std::abs(std::log2(static_cast<double>(p) / static_cast<double>(planner))) <
           std::abs(std::log2(static_cast<double>(q) / static_cast<double>(planner)));
  });
  for (int64_t c : cols) out.push_back({{"conv.cols", {c}}});
  return out;
}

// The knobs worth trying for a step's kernel (the planner's, empty knobs, is not among them), from
// the sizes of this run: its inputs and `out`, its first output.
std::vector<Knobs> candidates(const Graph& g, const KernelGroup& core,
                              const std::vector<Tensor>& inputs, const Tensor& out,
                              bool thread_knobs) {
  if (!out.defined() || out.rank() == 0 || out.numel() == 0) return {};
  const int64_t cols = out.shape().back();
  if (is_tile_group(g, core)) {
    // A tile tuned at one size may not hold whole rows at another: symbolic kernels keep theirs.
    const TensorType& t = g.value(core.outputs[0]).type;
    for (const Dim& d : t.shape ? *t.shape : Shape{})
      if (!d.is_known()) return {};
    return tile_candidates(out.numel() / cols, cols);
  }
  const int32_t anchor = core.anchor >= 0 ? core.anchor : core.nodes[0];
  const Node& a = g.nodes()[anchor];
  if (!a.domain.empty()) return {};
  if (a.op == "Conv") return conv_candidates(g, core, a, inputs, thread_knobs);
  if (a.op == "Attention") return attention_candidates(core, a, inputs);
  if (a.op != "MatMul" && a.op != "Gemm") return {};
  auto slot = std::find(core.inputs.begin(), core.inputs.end(), a.inputs[0]);
  if (slot == core.inputs.end()) return {};
  const Dims& ad = inputs[slot - core.inputs.begin()].shape();
  if (ad.empty()) return {};
  // The product's N and M as the kernel folds them (a reshaping view after it keeps the rows).
  const bool trans_a = a.op == "Gemm" && a.attr_int("transA") != 0;
  const int64_t k = trans_a && ad.size() == 2 ? ad[0] : ad.back();
  const TensorType& bt = g.value(a.inputs[1]).type;
  const int64_t n = bt.shape && !bt.shape->empty() && bt.shape->back().is_known()
                        ? (a.op == "Gemm" && a.attr_int("transB") != 0 ? (*bt.shape)[0].value
                                                                       : bt.shape->back().value)
                        : cols;
  const int64_t m = n > 0 ? out.numel() / n : 0;
  if (m <= 0 || n <= 0 || k <= 0) return {};
  return gemm_candidates(m, n, k, g.initializer(a.inputs[1]) != nullptr);
}

// "MatMul+Gelu f32[128, 3072]"
std::string step_name(const Graph& g, const KernelGroup& core) {
  return cat(kernel_label(g, core), " ",
             core.outputs.empty() ? std::string() : g.value(core.outputs[0]).type.str());
}

struct Step {
  size_t index;
  KernelGroup core;
  const Backend* backend;
  std::vector<Tensor> inputs;
  Tensor output;  // the planner kernel's first output on them
  std::unique_ptr<CompiledKernel> planner;
  std::string signature;
  double seconds = 0;  // the planner's kernel
};

class Tuner {
 public:
  explicit Tuner(const TuneOptions& o) : o_(o) {
    if (!o_.timer) {
      const double min_s = o_.sample_seconds;
      split_ = kSplit;
      o_.timer = [min_s](const Trial& t, const std::function<void()>& run) {
        return t.step == -1 ? bench_time(run, min_s) : wall_time(run, min_s / kSplit);
      };
    }
  }

  // Minima of `repeats` samples of a and b, interleaved (a first). Minima, not medians: on a
  // shared machine other processes only ever add time, in bursts longer than a sample, so the
  // least disturbed sample of each is the fairer comparison (with 5 processes on 2 cores the
  // medians of the same plan differed by 20%, hiding a 1.2x Winograd gain from the model check).
  std::pair<double, double> compare(const Trial& ta, const std::function<void()>& a,
                                    const Trial& tb, const std::function<void()>& b) const {
    double ma = 0, mb = 0;
    for (int r = 0; r < std::max(1, o_.repeats) * split_; ++r) {
      const double sa = o_.timer(ta, a), sb = o_.timer(tb, b);
      ma = r == 0 ? sa : std::min(ma, sa);
      mb = r == 0 ? sb : std::min(mb, sb);
    }
    return {ma, mb};
  }

  // The whole model, planner (a) and tuned (b): `repeats` rounds interleaved (alternating which
  // goes first), each round's time
  // as `pto bench` takes it (the default timer: warm-up, runs, p50), the median over rounds, as
  // bench/tune.py compares them.
  std::pair<double, double> compare_models(const std::function<void()>& a,
                                           const std::function<void()>& b) const {
    std::vector<double> sa, sb;
    for (int r = 0; r < std::max(1, o_.repeats); ++r) {  // a b, b a, a b, ...: neither always first
      if (r % 2 == 0) sa.push_back(o_.timer(Trial{-1, nullptr, false}, a));
      sb.push_back(o_.timer(Trial{-1, nullptr, true}, b));
      if (r % 2 == 1) sa.push_back(o_.timer(Trial{-1, nullptr, false}, a));
    }
    return {median(std::move(sa)), median(std::move(sb))};
  }

  // Tunes one step; returns the winner (empty: the planner's) and its time ratio to the planner.
  std::pair<Knobs, double> tune_step(const Graph& g, Step& st, KernelTuning& kt, ProgressBar& bar,
                                     size_t done, size_t total) {
    static const Knobs kNone;
    std::vector<Knobs> cands = candidates(g, st.core, st.inputs, st.output, thread_knobs_);
    const size_t cap = o_.level == Level::kFast     ? 8
                       : o_.level == Level::kNormal ? 32
                                                    : cands.size();
    if (cands.size() > cap) cands.resize(cap);
    const Trial planner{static_cast<int64_t>(st.index), &kNone, false};
    auto run_planner = [&] { st.planner->run(st.inputs); };
    Knobs best;
    double best_ratio = 1.0;
    int since = 0;
    for (const Knobs& c : cands) {
      if (o_.num_trials > 0 && trials_ >= o_.num_trials) break;
      if (o_.early_stop && since >= kEarlyStop) break;
      KernelGroup pinned = st.core;
      apply_knobs(pinned, c);
      std::unique_ptr<CompiledKernel> kernel;
      try {
        if (!st.backend->supports(g, pinned)) continue;
        kernel = st.backend->compile(g, pinned);
        kernel->run(st.inputs);  // warm-up; a candidate that fails is no candidate
      } catch (const std::exception& e) {
        log(LogLevel::kDebug, cat("tune: ", kt.name, " ", knobs_str(c), ": ", e.what()));
        continue;
      }
      ++trials_;
      ++kt.trials;
      const Trial trial{static_cast<int64_t>(st.index), &c, false};
      auto run_cand = [&] { kernel->run(st.inputs); };
      auto ratio = [&] {
        const auto [p, t] = compare(planner, run_planner, trial, run_cand);
        return p > 0 ? t / p : 1.0;
      };
      double r = ratio();
      log(LogLevel::kDebug, cat("tune: ", kt.name, " ", knobs_str(c), ": ", r, "x the planner"));
      bool improved = false;
      if (r <= 1.0 - o_.min_gain && r < best_ratio) {
        r = std::max(r, ratio());  // confirmed by a second comparison
        if (r <= 1.0 - o_.min_gain && r < best_ratio) {
          best = c;
          best_ratio = r;
          improved = true;
        }
      }
      since = improved ? 0 : since + 1;
      if (o_.progress) bar.update(done, total, cat(kt.name, " best ", best_ratio, "x"));
    }
    return {best, best_ratio};
  }

  // A shape class's ratio to the planner: the members' kernels (`planner` and `cand`, in model
  // order) run one after the other as one unit, compared as a step's kernel is; a second
  // comparison when the first finds it at least min_gain faster, the larger ratio kept.
  double class_ratio(const std::vector<size_t>& members, const Knobs& knobs,
                     const std::vector<std::function<void()>>& planner,
                     const std::vector<std::function<void()>>& cand) {
    static const Knobs kNone;
    ++trials_;
    const Trial tp{-2, &kNone, false, &members}, tc{-2, &knobs, false, &members};
    auto run_all = [](const std::vector<std::function<void()>>& runs) {
      return [&runs] {
        for (const auto& r : runs) r();
      };
    };
    auto ratio = [&] {
      const auto [p, t] = compare(tp, run_all(planner), tc, run_all(cand));
      return p > 0 ? t / p : 1.0;
    };
    double r = ratio();
    if (r <= 1.0 - o_.min_gain) r = std::max(r, ratio());
    return r;
  }

  // The pool's speed-up right now over one thread on a compute-bound job (2 tasks per thread of
  // about 30 us of FMA chains each): on the pool and on this thread alone (run_as_on_pool),
  // interleaved, the ratio of their medians over kProbeRounds samples (medians: the state the
  // model will typically run in, not the luckiest sample).
  double pool_speedup() const {
    static const Knobs kNone, kAlone = {{"conv.threads", {1}}};
    constexpr int kProbeRounds = 15;
    const int64_t tasks = 2 * num_threads();
    std::vector<float> sink(static_cast<size_t>(tasks));
    auto task = [&sink](int64_t t) {
      float acc[16];
      for (int k = 0; k < 16; ++k) acc[k] = static_cast<float>(t + k) * 1e-3f;
      for (int i = 0; i < 8192; ++i)
        for (float& v : acc) v = v * 0.999999f + 1e-6f;
      float sum = 0;
      for (float v : acc) sum += v;
      sink[static_cast<size_t>(t)] = sum;
    };
    auto on_pool = [&] { parallel_tasks(tasks, task); };
    auto alone = [&] { run_as_on_pool(on_pool); };
    std::vector<double> p, a;
    for (int r = 0; r < kProbeRounds; ++r) {
      p.push_back(o_.timer(Trial{-3, &kNone, false, nullptr}, on_pool));
      a.push_back(o_.timer(Trial{-3, &kAlone, false, nullptr}, alone));
    }
    const double mp = median(std::move(p));
    return mp > 0 ? median(std::move(a)) / mp : 0.0;
  }
  void set_thread_knobs(bool on) { thread_knobs_ = on; }
  bool thread_knobs() const { return thread_knobs_; }

  int64_t trials() const { return trials_; }
  const TuneOptions& options() const { return o_; }

 private:
  TuneOptions o_;
  bool thread_knobs_ = true;  // conv.threads and its shape classes are tried
  int split_ = 1;             // kSplit with the default timer
  int64_t trials_ = 0;
};

// The output plane (positions of one image) of a conv step on 4-D tensors; 0 for other steps.
int64_t conv_plane(const Graph& g, const KernelGroup& core, const Tensor& out) {
  const int32_t anchor = core.anchor >= 0 ? core.anchor : core.nodes[0];
  const Node& a = g.nodes()[anchor];
  if (a.op != "Conv" || !a.domain.empty() || !out.defined() || out.rank() != 4) return 0;
  return out.shape()[2] * out.shape()[3];
}

}  // namespace

Level parse_level(const std::string& name) {
  if (name == "fast") return Level::kFast;
  if (name == "normal") return Level::kNormal;
  if (name == "exhaustive") return Level::kExhaustive;
  throw ValueError(cat("tuning level '", name, "': expected fast, normal or exhaustive"));
}

const char* level_name(Level level) {
  return level == Level::kFast ? "fast" : level == Level::kNormal ? "normal" : "exhaustive";
}

TuneReport tune(const Graph& g, const std::vector<Tensor>& inputs, const CompileOptions& compile,
                const TuneOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  Tuner tuner(options);
  TuneReport report;
  TuneCache cache = TuneCache::open(options.cache_path);
  report.cache_path = cache.path();
  const int threads = num_threads();
  if (threads > 1) {
    report.pool_speedup = tuner.pool_speedup();
    report.contended = report.pool_speedup < kContendedSpeedup * threads;
    tuner.set_thread_knobs(!report.contended || options.for_load);
    log(LogLevel::kDebug, cat("tune: the pool's speed-up on ", threads, " threads: ",
                              report.pool_speedup, "x", report.contended ? " (contended)" : ""));
  }

  // The planner's model, with every weight kept in the graph, run once to capture step inputs.
  CompileOptions base = compile;
  base.use_tune_cache = false;
  base.release_packed_weights = false;
  const Executable exe = pto::compile(g, base);
  const Graph& eg = exe.graph();
  std::unordered_map<ValueId, Tensor> values;
  exe.run_observing_values(inputs, [&](ValueId v, const Tensor& t) { values[v] = t.clone(); });
  for (size_t i = 0; i < eg.inputs().size() && i < inputs.size(); ++i)
    values[eg.inputs()[i]] = inputs[i];
  // Kernels allocate their outputs per call; timed on fresh pages from the system, a 5 MB output's
  // page faults tripled a 0.55 ms conv (1.8 ms), hiding every candidate's gain behind the same
  // overhead. The executor writes them into its arena, reused from run to run: a pool, which hands
  // the block each call frees to the next, times them the same way. Kernels only: under it the
  // whole-model check below measured MobileNetV2's winners 1.14x faster where `pto bench` found
  // them 0.94x (and without it, 0.68x), so the check runs without.
  std::optional<AllocatorScope> pooled(std::in_place, std::make_shared<MemoryPool>());

  std::vector<Step> steps;
  for (size_t s = 0; s < exe.num_steps(); ++s) {
    if (exe.step(s).backend != "cpu") continue;
    Step st{s, exe.step_group(s), nullptr, {}, {}, nullptr, {}};
    st.core.tile.clear();
    st.core.knobs.clear();
    st.signature = kernel_signature(eg, st.core);
    st.backend = backend_for(eg, st.core);
    if (st.signature.empty() || !st.backend) continue;
    bool complete = true;
    for (ValueId v : st.core.inputs) {
      auto it = values.find(v);
      const Tensor* init = eg.initializer(v);
      if (it != values.end())
        st.inputs.push_back(it->second);
      else if (init)
        st.inputs.push_back(*init);
      else
        complete = false;
    }
    if (!complete) continue;
    st.planner = st.backend->compile(eg, st.core);
    static const Knobs kNone;
    const Trial planner{static_cast<int64_t>(s), &kNone, false};
    try {
      const std::vector<Tensor> outs = st.planner->run(st.inputs);  // warm-up
      if (!outs.empty()) st.output = outs[0];
    } catch (const KernelDeclined&) {
      continue;
    }
    std::vector<double> t;
    for (int r = 0; r < 3; ++r)
      t.push_back(tuner.options().timer(planner, [&] { st.planner->run(st.inputs); }));
    st.seconds = median(t);
    steps.push_back(std::move(st));
  }
  std::stable_sort(steps.begin(), steps.end(),
                   [](const Step& a, const Step& b) { return a.seconds > b.seconds; });
  double total = 0;
  for (const Step& st : steps) total += st.seconds;
  // The level's steps: the slowest covering 80% of the time, those of at least 1%, or all.
  size_t count = steps.size();
  if (options.level != Level::kExhaustive) {
    double covered = 0;
    count = 0;
    for (const Step& st : steps) {
      if (options.level == Level::kFast && covered >= 0.8 * total) break;
      if (options.level == Level::kNormal && st.seconds < 0.01 * total) break;
      covered += st.seconds;
      ++count;
    }
  }
  // What the cache held before this run (a shape class leaves those steps alone).
  std::vector<bool> cached_before(steps.size(), false);
  for (size_t i = 0; i < steps.size() && options.reuse_cache; ++i)
    cached_before[i] = cache.lookup(steps[i].signature, threads).has_value();

  ProgressBar bar("tuning");
  if (!options.progress) bar.finish();
  // This run's winners by signature (what the model check drops when the model is not faster).
  std::unordered_map<std::string, TuneEntry> won;
  for (size_t i = 0; i < count; ++i) {
    Step& st = steps[i];
    KernelTuning kt;
    kt.step = st.index;
    kt.name = step_name(eg, st.core);
    kt.signature = st.signature;
    kt.planner_seconds = st.seconds;
    kt.tuned_seconds = st.seconds;
    if (options.progress) bar.update(i, count, kt.name);
    std::optional<TuneEntry> cached =
        options.reuse_cache ? cache.lookup(st.signature, threads) : std::nullopt;
    if (cached) {
      kt.from_cache = true;
      kt.knobs = cached->knobs;
      kt.tuned_seconds =
          st.seconds * (cached->planner_ns > 0 ? static_cast<double>(cached->tuned_ns) /
                                                     static_cast<double>(cached->planner_ns)
                                               : 1.0);
    } else if (options.num_trials > 0 && tuner.trials() >= options.num_trials) {
      kt.capped = true;  // not tuned, so not stored: a later run tunes it
    } else {
      auto [knobs, ratio] = tuner.tune_step(eg, st, kt, bar, i, count);
      kt.knobs = knobs;
      kt.tuned_seconds = st.seconds * ratio;
      TuneEntry e;
      e.knobs = knobs;
      e.planner_ns = static_cast<int64_t>(st.seconds * 1e9);
      e.tuned_ns = static_cast<int64_t>(kt.tuned_seconds * 1e9);
      cache.store(st.signature, threads, e);
      if (!knobs.empty()) {
        won[st.signature] = e;
        log(LogLevel::kDebug,
            cat("tune: winner ", kt.name, " ", knobs_str(knobs), ": ", ratio, "x the planner"));
      }
    }
    report.kernels.push_back(std::move(kt));
  }

  // Shape classes (normal and exhaustive, on several threads): `conv.threads {1}` on every conv
  // whose output plane is at most P positions, for P among the planes of the model's convs,
  // smallest first, the members' kernels timed as one unit against the planner's. One conv of
  // MobileNetV2 at 7x7 or 14x14 takes 0.3-1% of the model, too little to tune (or time) alone;
  // together they are a quarter of it. Members: every conv step (below 1% too) the cache did not
  // hold before this run and that won nothing on its own above. The best class, when it wins
  // (at least min_gain faster, twice), gives its knob to every member.
  const bool try_classes = threads > 1 && tuner.thread_knobs() && options.level != Level::kFast &&
                           !(options.num_trials > 0 && tuner.trials() >= options.num_trials);
  std::vector<std::pair<size_t, int64_t>> eligible;  // (index into steps, plane)
  for (size_t i = 0; i < steps.size() && try_classes; ++i) {
    const int64_t plane = conv_plane(eg, steps[i].core, steps[i].output);
    if (plane > 0 && !cached_before[i] && !won.count(steps[i].signature))
      eligible.push_back({i, plane});
  }
  std::vector<int64_t> planes;
  for (const auto& [i, p] : eligible) planes.push_back(p);
  std::sort(planes.begin(), planes.end());
  planes.erase(std::unique(planes.begin(), planes.end()), planes.end());
  if (options.level == Level::kNormal && planes.size() > kNormalClasses)
    planes.resize(kNormalClasses);
  const Knobs class_knobs = {{"conv.threads", {1}}};
  std::unordered_map<size_t, std::unique_ptr<CompiledKernel>> class_kernels;  // by step index
  std::optional<size_t> best_class;
  double best_class_ratio = 1.0;
  int class_since = 0;
  for (int64_t plane : planes) {
    if (options.early_stop && class_since >= kClassEarlyStop) break;
    if (options.num_trials > 0 && tuner.trials() >= options.num_trials) break;
    ClassTuning ct;
    ct.knobs = class_knobs;
    ct.name = cat(knobs_str(class_knobs), " on convs with planes <= ", plane);
    std::vector<std::pair<size_t, size_t>> members;  // (model step, index into steps)
    for (const auto& [i, p] : eligible) {
      if (p > plane) continue;
      if (!class_kernels.count(i)) {
        Step& st = steps[i];
        KernelGroup pinned = st.core;
        apply_knobs(pinned, class_knobs);
        try {
          if (!st.backend->supports(eg, pinned)) continue;
          std::unique_ptr<CompiledKernel> k = st.backend->compile(eg, pinned);
          k->run(st.inputs);  // warm-up; a member that fails is no member
          class_kernels[i] = std::move(k);
        } catch (const std::exception& e) {
          log(LogLevel::kDebug,
              cat("tune: ", ct.name, ": ", step_name(eg, st.core), ": ", e.what()));
          class_kernels[i] = nullptr;
        }
      }
      if (class_kernels[i]) members.push_back({steps[i].index, i});
    }
    if (members.empty()) continue;
    std::sort(members.begin(), members.end());
    std::vector<std::function<void()>> planner_runs, cand_runs;
    for (const auto& [s, i] : members) {
      ct.steps.push_back(s);
      Step& st = steps[i];
      planner_runs.push_back([&st] { st.planner->run(st.inputs); });
      CompiledKernel* k = class_kernels[i].get();
      cand_runs.push_back([k, &st] { k->run(st.inputs); });
    }
    if (options.progress) bar.update(count, count, ct.name);
    ct.ratio = tuner.class_ratio(ct.steps, ct.knobs, planner_runs, cand_runs);
    log(LogLevel::kDebug,
        cat("tune: ", ct.name, " (", ct.steps.size(), " steps): ", ct.ratio, "x the planner"));
    if (ct.ratio <= 1.0 - options.min_gain && ct.ratio < best_class_ratio) {
      best_class = report.classes.size();
      best_class_ratio = ct.ratio;
      class_since = 0;
    } else {
      ++class_since;
    }
    report.classes.push_back(std::move(ct));
  }
  if (best_class) {
    ClassTuning& ct = report.classes[*best_class];
    ct.won = true;
    for (size_t s : ct.steps) {
      const auto it =
          std::find_if(steps.begin(), steps.end(), [&](const Step& st) { return st.index == s; });
      TuneEntry e;
      e.knobs = ct.knobs;
      e.planner_ns = static_cast<int64_t>(it->seconds * 1e9);
      e.tuned_ns = static_cast<int64_t>(it->seconds * ct.ratio * 1e9);
      cache.store(it->signature, threads, e);
      won[it->signature] = e;
      auto kt = std::find_if(report.kernels.begin(), report.kernels.end(),
                             [&](const KernelTuning& k) { return k.step == s; });
      if (kt == report.kernels.end()) {
        report.kernels.emplace_back();
        kt = report.kernels.end() - 1;
        kt->step = s;
        kt->name = step_name(eg, it->core);
        kt->signature = it->signature;
        kt->planner_seconds = it->seconds;
      }
      kt->knobs = ct.knobs;
      kt->from_class = true;
      kt->tuned_seconds = it->seconds * ct.ratio;
    }
  }
  // Steps of this run sharing a winner's signature (reported "cached" above) take it too.
  for (KernelTuning& k : report.kernels)
    if (k.from_cache && won.count(k.signature)) k.knobs = won[k.signature].knobs;
  bar.finish();
  report.trials = tuner.trials();

  // The whole model with and without the winners, interleaved: this run's winners stay only when
  // the model is faster with them. Timed as `pto run` runs them, outside the tuner's pool.
  pooled.reset();
  if (!won.empty()) {
    CompileOptions planner_opts = compile, tuned_opts = compile;
    planner_opts.use_tune_cache = false;
    tuned_opts.use_tune_cache = true;
    tuned_opts.tune_cache_path = cache.path();
    const Executable planner = pto::compile(g, planner_opts);
    const Executable tuned = pto::compile(g, tuned_opts);
    planner.run(inputs);
    tuned.run(inputs);
    // Two comparisons, each of which must find the tuned model faster by kModelGain: on a busy
    // machine one can be luck.
    bool faster = true;
    for (int round = 0; round < 2 && faster; ++round) {
      const auto [p, t] =
          tuner.compare_models([&] { planner.run(inputs); }, [&] { tuned.run(inputs); });
      report.model_planner_seconds = p;
      report.model_tuned_seconds = t;
      report.model_checks.push_back({p, t});
      faster = t < p * (1.0 - kModelGain);
      log(LogLevel::kDebug, cat("tune: model check ", round + 1, ": planner ", p * 1e3,
                                " ms, tuned ", t * 1e3, " ms: ", p / t, "x"));
    }
    if (!faster) {
      report.kept = false;
      for (auto& [sig, e] : won) {
        e.knobs.clear();
        e.tuned_ns = e.planner_ns;
        cache.store(sig, threads, e);
      }
      for (KernelTuning& k : report.kernels)
        if (won.count(k.signature)) {
          k.knobs.clear();
          k.tuned_seconds = k.planner_seconds;
        }
      for (ClassTuning& ct : report.classes) ct.won = false;
    }
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace pto::tune
