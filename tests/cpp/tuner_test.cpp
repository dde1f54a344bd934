// Tuning knobs (KernelGroup::knobs), their automatic use from the tuning cache at compile time,
// and the autotuner with an injected timer (pto/tuning.h, docs/tuning.md).
#include "pto/tuning.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

#include "control_flow_models.h"
#include "env_guard.h"
#include "onnx_model_builder.h"
#include "pto/backend.h"
#include "pto/error.h"
#include "pto/executable.h"
#include "pto/parallel.h"
#include "pto/reference.h"
#include "random_tensor.h"
#include "tune/signature.h"
#include "tune/tune_cache.h"

namespace pto::tune {
namespace {

// Every test in this binary compiles without the user's tuning cache unless it names one.
[[maybe_unused]] const bool kNoUserTuneCache = (setenv("PTO_TUNE_CACHE", "off", 1), true);

using testing::TempDir;

float max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  float d = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    d = std::max(d, std::abs(a.data<float>()[i] - b.data<float>()[i]));
  return d;
}

// y1 = Relu(x[64, 300] @ W[300, 200]), and y2 = Exp(z) * c, an elementwise group of its own.
Graph model() {
  Graph g;
  const ValueId x = g.add_input("x", {DType::kF32, Shape{64, 300}});
  const ValueId z = g.add_input("z", {DType::kF32, Shape{64, 200}});
  const ValueId w = testing::constant(g, "w", {300, 200}, 1);
  const ValueId c = testing::constant(g, "c", {64, 200}, 2);
  const ValueId h = g.add_value("h"), y1 = g.add_value("y1"), e = g.add_value("e"),
                y2 = g.add_value("y2");
  g.add_node("MatMul", {x, w}, {h}, {}, "mm");
  g.add_node("Relu", {h}, {y1}, {}, "relu");
  g.add_node("Exp", {z}, {e}, {}, "exp");
  g.add_node("Mul", {e, c}, {y2}, {}, "mul");
  g.add_output(y1);
  g.add_output(y2);
  return g;
}

std::vector<Tensor> inputs() {
  return {testing::random_tensor({64, 300}, 3), testing::random_tensor({64, 200}, 4)};
}

// The largest difference over every output.
float max_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, max_abs_diff(a[i], b[i]));
  return d;
}

// The step whose kernel runs `op` (a node of it), and its signature.
size_t step_with(const Executable& exe, const std::string& op) {
  for (size_t s = 0; s < exe.num_steps(); ++s)
    for (int32_t n : exe.step(s).nodes)
      if (exe.graph().nodes()[n].op == op) return s;
  ADD_FAILURE() << "no step runs " << op;
  return 0;
}

std::string signature_of(const Executable& exe, size_t s) {
  return kernel_signature(exe.graph(), exe.step_group(s));
}

class TunerTest : public ::testing::Test {
 protected:
  CompileOptions with_cache(bool use = true) const {
    CompileOptions o;
    o.use_tune_cache = use;
    o.tune_cache_path = cache_file_;
    return o;
  }
  TempDir dir_;
  std::string cache_file_ = dir_.file("tune.json");
};

// Each knob, stored in the cache, is used by the next compile: the described plan changes, the
// stats count it, and the outputs stay within tolerance of the reference interpreter (a new KC
// changes the order of the additions: not bit for bit).
TEST_F(TunerTest, CachedKnobsChangeThePlanAndKeepTheOutputs) {
  const Graph g = model();
  const std::vector<Tensor> want = reference::run(g, inputs());
  const Executable planner = compile(g, with_cache(false));
  const size_t mm = step_with(planner, "MatMul"), ew = step_with(planner, "Mul");
  ASSERT_NE(mm, ew);
  EXPECT_LT(max_diff(planner.run(inputs()), want), 1e-3f);
  const std::vector<std::pair<size_t, Knobs>> cases = {{mm, {{"gemm.blocks", {128, 16, 64}}}},
                                                       {ew, {{"tile", {2, 200}}}},
                                                       {ew, {{"tile", {1, 512}}}}};
  for (const auto& [step, knobs] : cases) {
    SCOPED_TRACE(knobs_str(knobs));
    TuneCache cache = TuneCache::open(cache_file_);
    cache.clear();
    cache.store(signature_of(planner, step), num_threads(), {knobs, 100, 50, 0});
    const Executable tuned = compile(g, with_cache());
    EXPECT_EQ(tuned.stats().tuned_kernels, 1u);
    EXPECT_NE(tuned.describe_step(step), planner.describe_step(step));
    EXPECT_LT(max_diff(tuned.run(inputs()), want), 1e-3f);
    // Off: the planner's plan again.
    const Executable off = compile(g, with_cache(false));
    EXPECT_EQ(off.stats().tuned_kernels, 0u);
    EXPECT_EQ(off.describe_step(step), planner.describe_step(step));
    testing::EnvGuard env("PTO_TUNE_CACHE", "off");
    CompileOptions o = with_cache();
    o.tune_cache_path = "";
    EXPECT_EQ(compile(g, o).stats().tuned_kernels, 0u);
  }
}

// Knobs that no longer compile (a tile that does not fit L1) are ignored, not trusted.
TEST_F(TunerTest, StaleKnobsAreIgnored) {
  const Graph g = model();
  const Executable planner = compile(g, with_cache(false));
  const size_t ew = step_with(planner, "Mul");
  TuneCache::open(cache_file_)
      .store(signature_of(planner, ew), num_threads(), {{{"tile", {64, 1 << 20}}}, 100, 50, 0});
  const Executable exe = compile(g, with_cache());
  EXPECT_EQ(exe.stats().tuned_kernels, 0u);
  EXPECT_EQ(exe.describe_step(ew), planner.describe_step(ew));
  EXPECT_LT(max_diff(exe.run(inputs()), reference::run(g, inputs())), 1e-3f);
}

// An invalid knob is a ValueError naming the kernel.
TEST_F(TunerTest, InvalidKnobsNameTheKernel) {
  const Graph g = model();
  const Executable exe = compile(g, with_cache(false));
  const Backend* cpu = BackendRegistry::global().find("cpu");
  ASSERT_NE(cpu, nullptr);
  KernelGroup mm = exe.step_group(step_with(exe, "MatMul"));
  mm.knobs["gemm.blocks"] = {256, 0};
  EXPECT_THROW(
      {
        try {
          cpu->compile(exe.graph(), mm);
        } catch (const ValueError& e) {
          EXPECT_NE(std::string(e.what()).find("kernel 'y1'"), std::string::npos) << e.what();
          throw;
        }
      },
      ValueError);
  mm.knobs = {{"attn.tiles", {1, 2}}};
  EXPECT_THROW(cpu->compile(exe.graph(), mm), ValueError);
  KernelGroup ew = exe.step_group(step_with(exe, "Mul"));
  ew.knobs["gemm.blocks"] = {256, 96, 4096};
  EXPECT_THROW(cpu->compile(exe.graph(), ew), ValueError);
}

// conv.algo picks the implicit GEMM, the blocked direct kernel, Winograd on the blocked tensors or
// the small-output kernel (here on 196 positions, in blocks of 8); each matches the reference
// (Winograd within its rounding), and Winograd on a conv it cannot run (3 input channels, a
// strided conv) is stale or a ValueError.
TEST_F(TunerTest, ConvAlgoKnob) {
  for (int64_t c : {32, 3}) {
    SCOPED_TRACE(c);
    Graph g;
    const ValueId x = g.add_input("x", {DType::kF32, Shape{1, c, 14, 14}});
    const ValueId w = testing::constant(g, "w", {32, c, 3, 3}, 5);
    const ValueId y = g.add_value("y");
    Attributes a;
    a.set("pads", std::vector<int64_t>{1, 1, 1, 1});
    g.add_node("Conv", {x, w}, {y}, a, "conv");
    g.add_output(y);
    const std::vector<Tensor> in = {testing::random_tensor({1, c, 14, 14}, 6)};
    const std::vector<Tensor> want = reference::run(g, in);
    const Executable planner = compile(g, with_cache(false));
    const std::string sig = signature_of(planner, 0);
    std::set<std::string> described;
    for (int64_t algo : {0, 1, 2, 3}) {
      TuneCache cache = TuneCache::open(cache_file_);
      cache.clear();
      cache.store(sig, num_threads(), {{{"conv.algo", {algo}}}, 100, 50, 0});
      const Executable exe = compile(g, with_cache());
      EXPECT_LT(max_diff(exe.run(in), want), 1e-3f);
      // Winograd needs a channel block of input channels: the knob is stale for c=3; the blocked
      // direct kernel reads a stem's NCHW input as it is.
      EXPECT_EQ(exe.stats().tuned_kernels, algo != 2 || c == 32 ? 1u : 0u) << algo;
      described.insert(exe.describe_step(0));
    }
    EXPECT_EQ(described.size(), 4u);  // c=3: {0}, {1}, {3}, and {2} stale: the planner's
    KernelGroup k = planner.step_group(0);
    k.knobs["conv.algo"] = {4};
    EXPECT_THROW(BackendRegistry::global().find("cpu")->compile(planner.graph(), k), ValueError);
  }
}

// conv.algo {2} on a strided 3x3 conv (which Winograd F(4x4, 3x3) does not compute) is a
// ValueError; with a fused residual and ReLU at batch 2 Winograd matches the reference.
TEST_F(TunerTest, ConvWinogradKnob) {
  for (int64_t stride : {2, 1}) {
    SCOPED_TRACE(stride);
    Graph g;
    const ValueId x = g.add_input("x", {DType::kF32, Shape{2, 32, 13, 13}});
    const ValueId w = testing::constant(g, "w", {48, 32, 3, 3}, 7);
    const int64_t o = stride == 1 ? 13 : 7;
    const ValueId r = g.add_input("r", {DType::kF32, Shape{2, 48, o, o}});
    const ValueId y = g.add_value("y"), s = g.add_value("s"), z = g.add_value("z");
    Attributes a;
    a.set("pads", std::vector<int64_t>{1, 1, 1, 1});
    a.set("strides", std::vector<int64_t>{stride, stride});
    g.add_node("Conv", {x, w}, {y}, a, "conv");
    g.add_node("Add", {y, r}, {s}, {}, "add");
    g.add_node("Relu", {s}, {z}, {}, "relu");
    g.add_output(z);
    const std::vector<Tensor> in = {testing::random_tensor({2, 32, 13, 13}, 8),
                                    testing::random_tensor({2, 48, o, o}, 9)};
    const Executable planner = compile(g, with_cache(false));
    KernelGroup k = planner.step_group(step_with(planner, "Conv"));
    k.knobs["conv.algo"] = {2};
    const Backend* cpu = BackendRegistry::global().find("cpu");
    if (stride == 2) {
      EXPECT_THROW(cpu->compile(planner.graph(), k), ValueError);
      continue;
    }
    const std::unique_ptr<CompiledKernel> kernel = cpu->compile(planner.graph(), k);
    EXPECT_NE(kernel->describe().find("Winograd"), std::string::npos) << kernel->describe();
    TuneCache cache = TuneCache::open(cache_file_);
    cache.clear();
    cache.store(kernel_signature(planner.graph(), planner.step_group(step_with(planner, "Conv"))),
                num_threads(), {{{"conv.algo", {2}}}, 100, 50, 0});
    const Executable exe = compile(g, with_cache());
    EXPECT_EQ(exe.stats().tuned_kernels, 1u);
    EXPECT_LT(max_diff(exe.run(in), reference::run(g, in)), 1e-3f);
  }
}

// attn.tiles replaces plan_attention's rows and block; outputs stay within tolerance.
TEST_F(TunerTest, AttentionTilesKnob) {
  Graph g;
  const ValueId q = g.add_input("q", {DType::kF32, Shape{1, 2, 77, 40}});
  const ValueId k = g.add_input("k", {DType::kF32, Shape{1, 2, 301, 40}});
  const ValueId v = g.add_input("v", {DType::kF32, Shape{1, 2, 301, 24}});
  const ValueId y = g.add_value("y");
  g.add_node("Attention", {q, k, v}, {y}, {}, "attn", 23);
  g.add_output(y);
  const std::vector<Tensor> in = {testing::random_tensor({1, 2, 77, 40}, 7),
                                  testing::random_tensor({1, 2, 301, 40}, 8),
                                  testing::random_tensor({1, 2, 301, 24}, 9)};
  const std::vector<Tensor> want = reference::run(g, in);
  const Executable planner = compile(g, with_cache(false));
  ASSERT_EQ(planner.step(0).backend, "cpu");
  for (const std::vector<int64_t>& tiles : {std::vector<int64_t>{7, 64}, {77, 1024}, {1, 1}}) {
    SCOPED_TRACE(dims_str(tiles));
    TuneCache cache = TuneCache::open(cache_file_);
    cache.clear();
    cache.store(signature_of(planner, 0), num_threads(), {{{"attn.tiles", tiles}}, 100, 50, 0});
    const Executable exe = compile(g, with_cache());
    EXPECT_EQ(exe.stats().tuned_kernels, 1u);
    EXPECT_NE(exe.describe_step(0), planner.describe_step(0));
    EXPECT_LT(max_diff(exe.run(in), want), 1e-4f);
  }
  KernelGroup bad = planner.step_group(0);
  bad.knobs["attn.tiles"] = {0, 64};
  EXPECT_THROW(BackendRegistry::global().find("cpu")->compile(planner.graph(), bad), ValueError);
}

// A fake timer: the planner's kernels take 1 s, candidates what `cost` says, the whole model
// `model_planner` and `model_tuned`, a shape class of n steps 1 s with the planner's knobs and
// `class_cost(n)` with its knob (default 1 s), the pool probe's job 1 s on the pool and
// `alone` s on one thread (default 2: an idle machine's 2 threads).
struct FakeTimer {
  std::function<double(int64_t step, const Knobs&)> cost;
  double model_planner = 1.0, model_tuned = 1.0;
  std::function<double(size_t members)> class_cost = [](size_t) { return 1.0; };
  double alone = 2.0;
  int64_t calls = 0;
  Timer timer() {
    return [this](const Trial& t, const std::function<void()>&) {
      ++calls;
      if (t.step == -3) return t.knobs->empty() ? 1.0 : alone;
      if (t.step == -2) return t.knobs->empty() ? 1.0 : class_cost(t.steps->size());
      if (t.step < 0) return t.tuned ? model_tuned : model_planner;
      return t.knobs->empty() ? 1.0 : cost(t.step, *t.knobs);
    };
  }
};

TuneOptions fake(FakeTimer& f, const std::string& cache) {
  TuneOptions o;
  o.level = Level::kExhaustive;
  o.cache_path = cache;
  o.progress = false;
  o.timer = f.timer();
  return o;
}

TEST_F(TunerTest, PlannerWinsTiesAndSlowerIsNeverChosen) {
  const Graph g = model();
  for (double candidate : {1.0, 1.01, 2.0}) {
    SCOPED_TRACE(candidate);
    FakeTimer f{[&](int64_t, const Knobs&) { return candidate; }};
    TuneOptions o = fake(f, cache_file_);
    o.reuse_cache = false;
    const TuneReport r = tune(g, inputs(), {}, o);
    ASSERT_EQ(r.kernels.size(), 2u);
    for (const KernelTuning& k : r.kernels) EXPECT_TRUE(k.knobs.empty()) << k.name;
    EXPECT_GT(r.trials, 0);
    EXPECT_EQ(compile(g, with_cache()).stats().tuned_kernels, 0u);
    // Stored as "planner", so not tuned again.
    FakeTimer again{[&](int64_t, const Knobs&) { return 0.5; }};
    const TuneReport r2 = tune(g, inputs(), {}, fake(again, cache_file_));
    EXPECT_EQ(r2.trials, 0);
    for (const KernelTuning& k : r2.kernels) EXPECT_TRUE(k.from_cache);
  }
}

// A candidate 3% faster only once in two comparisons does not win; one faster each time does,
// and the next compile uses it, with outputs within tolerance of the reference.
TEST_F(TunerTest, AFasterCandidateWinsAndIsUsed) {
  const Graph g = model();
  FakeTimer f{[](int64_t, const Knobs& k) {
    const auto it = k.find("gemm.blocks");
    return it != k.end() && it->second[0] == 256 ? 0.8 : 1.0;
  }};
  f.model_tuned = 0.9;
  const TuneReport r = tune(g, inputs(), {}, fake(f, cache_file_));
  EXPECT_TRUE(r.kept);
  bool won = false;
  for (const KernelTuning& k : r.kernels)
    if (k.knobs.count("gemm.blocks")) {
      won = true;
      EXPECT_EQ(k.knobs.at("gemm.blocks")[0], 256);
      EXPECT_NEAR(k.tuned_seconds / k.planner_seconds, 0.8, 1e-9);
    }
  EXPECT_TRUE(won);
  const Executable exe = compile(g, with_cache());
  EXPECT_EQ(exe.stats().tuned_kernels, 1u);
  EXPECT_LT(max_diff(exe.run(inputs()), reference::run(g, inputs())), 1e-3f);
}

// The whole model not faster with the winners: they are dropped and stored as the planner's.
// gemm.grid pins the GEMM's task grid on two threads: the tuner offers grids, a faster one wins
// and round-trips through the cache, the next compile uses it (its plan says so) with outputs
// within tolerance of the reference; a grid out of range is a ValueError.
TEST_F(TunerTest, GemmGridKnob) {
  const int saved = num_threads();
  set_num_threads(2);
  const Graph g = model();
  std::set<std::vector<int64_t>> offered;
  std::vector<int64_t> first;  // the first grid offered is the fast one
  FakeTimer f{[&](int64_t, const Knobs& k) {
    const auto it = k.find("gemm.grid");
    if (it == k.end()) return 1.0;
    offered.insert(it->second);
    if (first.empty()) first = it->second;
    return it->second == first ? 0.8 : 1.0;
  }};
  f.model_tuned = 0.9;
  const TuneReport r = tune(g, inputs(), {}, fake(f, cache_file_));
  EXPECT_TRUE(r.kept);
  EXPECT_GE(offered.size(), 3u);
  CompileOptions keep = with_cache(false);
  keep.release_packed_weights = false;  // W stays in the graph, for the kernel run alone below
  const Executable planner = compile(g, keep);
  const size_t mm = step_with(planner, "MatMul");
  const std::optional<TuneEntry> e =
      TuneCache::open(cache_file_).lookup(signature_of(planner, mm), 2);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->knobs, (Knobs{{"gemm.grid", first}}));
  const Executable exe = compile(g, with_cache());
  EXPECT_EQ(exe.stats().tuned_kernels, 1u);
  EXPECT_NE(exe.describe_step(mm).find(cat("gemm.grid: ", first[0], " row x ", first[1])),
            std::string::npos)
      << exe.describe_step(mm);
  EXPECT_LT(max_diff(exe.run(inputs()), reference::run(g, inputs())), 1e-3f);
  for (const std::vector<int64_t>& grid : {std::vector<int64_t>{1, 7}, {3, 3}}) {
    KernelGroup k = planner.step_group(mm);
    k.knobs["gemm.grid"] = grid;
    const std::unique_ptr<CompiledKernel> kernel =
        BackendRegistry::global().find("cpu")->compile(planner.graph(), k);
    std::vector<Tensor> in;
    for (ValueId v : k.inputs) {
      const Tensor* init = planner.graph().initializer(v);
      in.push_back(init ? *init : inputs()[0]);
    }
    const Tensor want = reference::run(g, inputs())[0];
    std::vector<Tensor> out = kernel->run(in);
    EXPECT_LT(max_abs_diff(out[0], want), 1e-3f) << dims_str(grid);
    k.knobs["gemm.grid"] = {0, 2};
    EXPECT_THROW(BackendRegistry::global().find("cpu")->compile(planner.graph(), k), ValueError);
  }
  set_num_threads(saved);
}

// Conv (pads k / 2, bias) then Relu on a [batch, c, size, size] input, weights of `seed`, bias of
// seed + 1: the graph the conv knob tests tune.
Graph conv_relu(int64_t batch, int64_t c, int64_t m, int64_t k, int64_t stride, int64_t size,
                int64_t group, uint32_t seed) {
  Graph g;
  const ValueId x = g.add_input("x", {DType::kF32, Shape{batch, c, size, size}});
  const ValueId w = testing::constant(g, "w", {m, c / group, k, k}, seed);
  const ValueId b = testing::constant(g, "b", {m}, seed + 1);
  const ValueId y = g.add_value("y"), z = g.add_value("z");
  Attributes a;
  a.set("pads", std::vector<int64_t>(4, k / 2));
  a.set("strides", std::vector<int64_t>{stride, stride});
  a.set("group", group);
  g.add_node("Conv", {x, w, b}, {y}, a, "conv");
  g.add_node("Relu", {y}, {z}, {}, "relu");
  g.add_output(z);
  return g;
}

// conv.cols sets the output columns per GEMM of a conv on the implicit GEMM (a 1x1 conv, a strided
// 3x3 one at stride 3 on fewer channels than a block, through im2col), on one and two threads: the
// plan names it, each value matches the reference, and the tuner offers it; a conv off that path
// (depthwise, or one the planner runs on the blocked kernel) or a value under 16 is a ValueError.
TEST_F(TunerTest, ConvColsKnob) {
  const int saved = num_threads();
  const Backend* cpu = BackendRegistry::global().find("cpu");
  struct Case {
    int64_t c, m, k, stride, size, group;
    bool takes;
  };
  for (const Case& t : {Case{24, 40, 1, 1, 30, 1, true}, Case{4, 32, 3, 3, 49, 1, true},
                        Case{32, 32, 3, 1, 14, 32, false}, Case{32, 32, 3, 1, 7, 1, false}}) {
    SCOPED_TRACE(cat("c ", t.c, " k ", t.k, " stride ", t.stride, " size ", t.size));
    const Graph g = conv_relu(1, t.c, t.m, t.k, t.stride, t.size, t.group, 10);
    const std::vector<Tensor> in = {testing::random_tensor({1, t.c, t.size, t.size}, 12)};
    const std::vector<Tensor> want = reference::run(g, in);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      const Executable planner = compile(g, with_cache(false));
      const size_t s = step_with(planner, "Conv");
      KernelGroup k = planner.step_group(s);
      k.knobs["conv.cols"] = {64};
      if (!t.takes) {
        EXPECT_THROW(cpu->compile(planner.graph(), k), ValueError);
        continue;
      }
      std::set<std::string> described = {planner.describe_step(s)};
      for (int64_t cols : {16, 48, 64, 256, 4096}) {
        TuneCache cache = TuneCache::open(cache_file_);
        cache.clear();
        cache.store(signature_of(planner, s), threads, {{{"conv.cols", {cols}}}, 100, 50, 0});
        const Executable exe = compile(g, with_cache());
        EXPECT_EQ(exe.stats().tuned_kernels, 1u) << cols;
        const std::string plan = exe.describe_step(s);
        EXPECT_NE(plan.find("conv.cols"), std::string::npos) << plan;
        described.insert(plan);
        EXPECT_LT(max_diff(exe.run(in), want), 1e-3f) << cols << " on " << threads;
      }
      // 4096 is the whole plane (at most 900 columns): the planner's block, but named.
      EXPECT_EQ(described.size(), 6u);
      k.knobs["conv.cols"] = {8};
      EXPECT_THROW(cpu->compile(planner.graph(), k), ValueError);
    }
  }
  set_num_threads(saved);
  // The tuner offers columns for the 1x1 conv on a 56x56 plane (the planner's: the whole plane).
  Graph g;
  const ValueId x = g.add_input("x", {DType::kF32, Shape{1, 24, 56, 56}});
  const ValueId w = testing::constant(g, "w", {64, 24, 1, 1}, 13);
  const ValueId y = g.add_value("y");
  g.add_node("Conv", {x, w}, {y}, {}, "conv");
  g.add_output(y);
  std::set<int64_t> offered;
  FakeTimer f{[&](int64_t, const Knobs& k) {
    if (auto it = k.find("conv.cols"); it != k.end()) offered.insert(it->second[0]);
    return 1.0;
  }};
  TuneOptions o = fake(f, cache_file_);
  o.early_stop = false;
  tune(g, {testing::random_tensor({1, 24, 56, 56}, 14)}, {}, o);
  EXPECT_EQ(offered, (std::set<int64_t>{256, 512, 1024, 2048}));
}

// The tuner offers the small-output kernel (conv.algo {3}) on planes of at most 64 positions, 1-D
// or 2-D (16 and 40 here, where the planner takes the GEMM or the blocked kernel), not on an
// 81-position plane nor on a depthwise conv.
TEST_F(TunerTest, OffersSmallOutputOnSmallPlanes) {
  struct Case {
    Dims x, w;
    int64_t group;
    bool offered;
  };
  for (const Case& t :
       {Case{{1, 32, 4, 4}, {32, 32, 3, 3}, 1, true}, Case{{1, 16, 40}, {24, 16, 3}, 1, true},
        Case{{1, 32, 9, 9}, {32, 32, 3, 3}, 1, false},
        Case{{1, 32, 4, 4}, {32, 1, 3, 3}, 32, false}}) {
    SCOPED_TRACE(dims_str(t.x));
    Graph g;
    const ValueId x = g.add_input("x", {DType::kF32, to_shape(t.x)});
    const ValueId w = testing::constant(g, "w", t.w, 13);
    const ValueId y = g.add_value("y");
    Attributes a;
    a.set("group", t.group);
    a.set("pads", t.x.size() == 4 ? Dims{1, 1, 1, 1} : Dims{1, 1});
    g.add_node("Conv", {x, w}, {y}, a, "conv");
    g.add_output(y);
    std::set<int64_t> algos;
    FakeTimer f{[&](int64_t, const Knobs& k) {
      if (auto it = k.find("conv.algo"); it != k.end()) algos.insert(it->second[0]);
      return 1.0;
    }};
    TuneOptions o = fake(f, cache_file_);
    o.early_stop = false;
    tune(g, {testing::random_tensor(t.x, 14)}, {}, o);
    EXPECT_EQ(algos.count(3) == 1, t.offered);
  }
}

// conv.threads {1} runs a conv on the calling thread only, on every path (the implicit GEMM of a
// 1x1 and of a strided 3x3 conv, the blocked depthwise and direct kernels, Winograd): on two
// threads the plan names it and the outputs are the planner's bits, within tolerance of the
// reference; on one thread, or with any value but {1}, it is a ValueError; the tuner offers it on
// two threads, not on one.
TEST_F(TunerTest, ConvThreadsKnob) {
  const int saved = num_threads();
  const Backend* cpu = BackendRegistry::global().find("cpu");
  struct Case {
    int64_t c, m, k, stride, size, group, algo;  // algo -1: the planner's
  };
  for (const Case& t : {Case{24, 40, 1, 1, 30, 1, -1}, Case{16, 32, 3, 2, 33, 1, -1},
                        Case{32, 32, 3, 1, 14, 32, -1}, Case{32, 32, 3, 1, 7, 1, -1},
                        Case{32, 48, 3, 1, 13, 1, 2}}) {
    SCOPED_TRACE(cat("c ", t.c, " k ", t.k, " stride ", t.stride, " size ", t.size, " group ",
                     t.group, " algo ", t.algo));
    const Graph g = conv_relu(2, t.c, t.m, t.k, t.stride, t.size, t.group, 20);
    const std::vector<Tensor> in = {testing::random_tensor({2, t.c, t.size, t.size}, 22)};
    const std::vector<Tensor> want = reference::run(g, in);
    Knobs base;
    if (t.algo >= 0) base["conv.algo"] = {t.algo};
    set_num_threads(2);
    const Executable planner = compile(g, with_cache(false));
    const size_t s = step_with(planner, "Conv");
    const std::string sig = signature_of(planner, s);
    TuneCache cache = TuneCache::open(cache_file_);
    cache.clear();
    if (!base.empty()) cache.store(sig, 2, {base, 100, 50, 0});
    const Executable pool = compile(g, with_cache(!base.empty()));
    const std::vector<Tensor> pooled = pool.run(in);
    Knobs knobs = base;
    knobs["conv.threads"] = {1};
    cache.store(sig, 2, {knobs, 100, 50, 0});
    const Executable one = compile(g, with_cache());
    EXPECT_EQ(one.stats().tuned_kernels, 1u);
    EXPECT_NE(one.describe_step(s).find("conv.threads"), std::string::npos) << one.describe_step(s);
    const std::vector<Tensor> got = one.run(in);
    EXPECT_EQ(max_diff(got, pooled), 0.0f);  // the same bits as on the pool
    EXPECT_LT(max_diff(got, want), 1e-3f);
    KernelGroup k = planner.step_group(s);
    for (const std::vector<int64_t>& bad :
         {std::vector<int64_t>{2}, std::vector<int64_t>{0}, std::vector<int64_t>{1, 1}}) {
      k.knobs["conv.threads"] = bad;
      EXPECT_THROW(cpu->compile(planner.graph(), k), ValueError) << dims_str(bad);
    }
    set_num_threads(1);
    k.knobs["conv.threads"] = {1};
    EXPECT_THROW(cpu->compile(planner.graph(), k), ValueError);
  }
  // The tuner offers it on two threads only.
  Graph g;
  const ValueId x = g.add_input("x", {DType::kF32, Shape{1, 24, 28, 28}});
  const ValueId w = testing::constant(g, "w", {64, 24, 1, 1}, 23);
  const ValueId y = g.add_value("y");
  g.add_node("Conv", {x, w}, {y}, {}, "conv");
  g.add_output(y);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    bool offered = false;
    FakeTimer f{[&](int64_t, const Knobs& k) {
      offered = offered || k.count("conv.threads") > 0;
      return k.count("conv.threads") ? 0.5 : 1.0;
    }};
    f.model_tuned = 0.9;
    TuneOptions o = fake(f, cache_file_);
    o.reuse_cache = false;
    const TuneReport r = tune(g, {testing::random_tensor({1, 24, 28, 28}, 24)}, {}, o);
    EXPECT_EQ(offered, threads == 2) << threads;
    ASSERT_EQ(r.kernels.size(), 1u);
    EXPECT_EQ(r.kernels[0].knobs.count("conv.threads"), threads == 2 ? 1u : 0u);
  }
  set_num_threads(saved);
}

// The whole-model check compares medians over its rounds (as bench/tune.py compares `pto bench`
// p50s): a tuned model faster in one round of five only is not kept; one faster in three is.
TEST_F(TunerTest, ModelCheckTakesTheMedianOfItsRounds) {
  const Graph g = model();
  for (int fast_rounds : {1, 3}) {
    SCOPED_TRACE(fast_rounds);
    int round = 0;
    TuneOptions o;
    o.level = Level::kExhaustive;
    o.cache_path = cache_file_;
    o.progress = false;
    o.reuse_cache = false;
    o.repeats = 5;
    o.timer = [&](const Trial& t, const std::function<void()>&) {
      if (t.step >= 0) return t.knobs->count("gemm.blocks") ? 0.5 : 1.0;
      if (!t.tuned) return 1.0;
      return round++ % 5 < fast_rounds ? 0.5 : 1.2;
    };
    const TuneReport r = tune(g, inputs(), {}, o);
    EXPECT_EQ(r.kept, fast_rounds == 3);
    EXPECT_EQ(compile(g, with_cache()).stats().tuned_kernels, fast_rounds == 3 ? 1u : 0u);
  }
}

// x [1, 8, 28, 28] through three 3x3 convs: 28x28, then stride 2 to 14x14 and 7x7 (planes 784,
// 196, 49), each its own step.
Graph three_convs() {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{1, 8, 28, 28}});
  int64_t c = 8;
  for (int i = 0; i < 3; ++i) {
    const int64_t stride = i == 0 ? 1 : 2;
    const ValueId w = testing::constant(g, cat("w", i), {16, c, 3, 3}, 30 + i);
    const ValueId y = g.add_value(cat("y", i));
    Attributes a;
    a.set("pads", std::vector<int64_t>(4, 1));
    a.set("strides", std::vector<int64_t>{stride, stride});
    g.add_node("Conv", {x, w}, {y}, a, cat("conv", i));
    x = y;
    c = 16;
  }
  g.add_output(x);
  return g;
}

// Shape classes on two threads: conv.threads {1} on the convs of planes <= 49, <= 196, <= 784,
// each class timed as one unit. The best (the 7x7 and 14x14 convs) wins though no conv won on
// its own, the cache gives both its knob (the 28x28 one keeps the planner's), and the next
// compile uses them, bit-equal to the planner's plan and within tolerance of the reference. Not
// on one thread, nor at level fast; dropped with the rest when the model is not faster.
TEST_F(TunerTest, ShapeClassesTuneSmallConvsTogether) {
  const int saved = num_threads();
  const Graph g = three_convs();
  const std::vector<Tensor> in = {testing::random_tensor({1, 8, 28, 28}, 33)};
  set_num_threads(2);
  const Executable planner = compile(g, with_cache(false));
  std::map<int64_t, std::string> sig_of_plane;  // the conv steps by output plane
  for (size_t s = 0; s < planner.num_steps(); ++s) {
    const auto& out = planner.graph().value(planner.step(s).outputs[0]).type.shape;
    sig_of_plane[(*out)[2].value * (*out)[3].value] = signature_of(planner, s);
  }
  ASSERT_EQ(sig_of_plane.size(), 3u);
  FakeTimer f{[](int64_t, const Knobs&) { return 1.0; }};  // no conv wins alone
  f.class_cost = [](size_t n) { return n == 1 ? 0.95 : n == 2 ? 0.9 : 1.4; };
  f.model_tuned = 0.9;
  TuneOptions o = fake(f, cache_file_);
  o.reuse_cache = false;
  const TuneReport r = tune(g, in, {}, o);
  EXPECT_TRUE(r.kept);
  EXPECT_NEAR(r.pool_speedup, 2.0, 1e-9);
  EXPECT_FALSE(r.contended);
  ASSERT_EQ(r.classes.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.classes[i].steps.size(), i + 1);
    EXPECT_EQ(r.classes[i].won, i == 1) << r.classes[i].name;
    EXPECT_EQ(r.classes[i].knobs, (Knobs{{"conv.threads", {1}}}));
  }
  EXPECT_NEAR(r.classes[1].ratio, 0.9, 1e-9);
  size_t from_class = 0;
  for (const KernelTuning& k : r.kernels) from_class += k.from_class;
  EXPECT_EQ(from_class, 2u);
  TuneCache cache = TuneCache::open(cache_file_);
  for (const auto& [plane, sig] : sig_of_plane) {
    const std::optional<TuneEntry> e = cache.lookup(sig, 2);
    ASSERT_TRUE(e) << plane;
    EXPECT_EQ(e->knobs.count("conv.threads"), plane <= 196 ? 1u : 0u) << plane;
  }
  const Executable tuned = compile(g, with_cache());
  EXPECT_EQ(tuned.stats().tuned_kernels, 2u);
  const std::vector<Tensor> got = tuned.run(in);
  EXPECT_EQ(max_diff(got, planner.run(in)), 0.0f);
  EXPECT_LT(max_diff(got, reference::run(g, in)), 1e-3f);

  // The model not faster: the class's knobs are dropped too.
  f.model_tuned = 1.0;
  const TuneReport dropped = tune(g, in, {}, o);
  EXPECT_FALSE(dropped.kept);
  ASSERT_EQ(dropped.classes.size(), 3u);
  for (const ClassTuning& c : dropped.classes) EXPECT_FALSE(c.won);
  EXPECT_EQ(compile(g, with_cache()).stats().tuned_kernels, 0u);

  // No class at level fast, nor on one thread (where the pool is not probed).
  f.model_tuned = 0.9;
  o.level = Level::kFast;
  EXPECT_TRUE(tune(g, in, {}, o).classes.empty());
  o.level = Level::kExhaustive;
  set_num_threads(1);
  const TuneReport one = tune(g, in, {}, o);
  EXPECT_TRUE(one.classes.empty());
  EXPECT_EQ(one.pool_speedup, 0.0);
  set_num_threads(saved);
}

// The pool probe finding the cores busy (2 threads no faster than one): neither conv.threads nor
// a shape class is tried, unless for_load.
TEST_F(TunerTest, ThreadKnobsNeedAnUncontendedPool) {
  const int saved = num_threads();
  const Graph g = three_convs();
  const std::vector<Tensor> in = {testing::random_tensor({1, 8, 28, 28}, 34)};
  set_num_threads(2);
  for (bool for_load : {false, true}) {
    SCOPED_TRACE(for_load);
    bool offered = false;
    FakeTimer f{[&](int64_t, const Knobs& k) {
      offered = offered || k.count("conv.threads") > 0;
      return 1.0;
    }};
    f.class_cost = [](size_t n) { return 0.6 - 0.1 * static_cast<double>(n); };
    f.alone = 1.2;  // the pool 1.2x faster than one thread: under 0.75 x 2
    f.model_tuned = 0.9;
    TuneOptions o = fake(f, cache_file_);
    o.reuse_cache = false;
    o.for_load = for_load;
    const TuneReport r = tune(g, in, {}, o);
    EXPECT_NEAR(r.pool_speedup, 1.2, 1e-9);
    EXPECT_TRUE(r.contended);
    EXPECT_EQ(offered, for_load);
    EXPECT_EQ(r.classes.empty(), !for_load);
    EXPECT_EQ(compile(g, with_cache()).stats().tuned_kernels, for_load ? 3u : 0u);
  }
  set_num_threads(saved);
}

TEST_F(TunerTest, WinnersAreDroppedWhenTheModelIsNotFaster) {
  const Graph g = model();
  FakeTimer f{[](int64_t, const Knobs&) { return 0.5; }};
  f.model_tuned = 1.0;
  const TuneReport r = tune(g, inputs(), {}, fake(f, cache_file_));
  EXPECT_FALSE(r.kept);
  for (const KernelTuning& k : r.kernels) EXPECT_TRUE(k.knobs.empty());
  EXPECT_EQ(compile(g, with_cache()).stats().tuned_kernels, 0u);
  for (const auto& rec : TuneCache::open(cache_file_).entries())
    EXPECT_TRUE(rec.entry.knobs.empty());
}

TEST_F(TunerTest, NumTrialsAndEarlyStopLimitTheCandidates) {
  const Graph g = model();
  FakeTimer f{[](int64_t, const Knobs&) { return 1.0; }};
  TuneOptions o = fake(f, cache_file_);
  o.reuse_cache = false;
  o.num_trials = 3;
  EXPECT_EQ(tune(g, inputs(), {}, o).trials, 3);
  o.num_trials = 0;
  const TuneReport stopped = tune(g, inputs(), {}, o);
  for (const KernelTuning& k : stopped.kernels) EXPECT_EQ(k.trials, 6) << k.name;
  o.early_stop = false;
  // Without it, every candidate that compiles: more than 6 for the GEMM (the elementwise group
  // compiled only 6 tiles on the 2-core Zen 4, whose L1d is 32 KiB; more on a larger L1).
  const TuneReport all = tune(g, inputs(), {}, o);
  size_t more = 0;
  for (const KernelTuning& k : all.kernels) {
    EXPECT_GE(k.trials, 6) << k.name;
    more += k.trials > 6;
  }
  EXPECT_GE(more, 1u);
  // Fast tries at most 8 candidates a kernel.
  o.level = Level::kFast;
  for (const KernelTuning& k : tune(g, inputs(), {}, o).kernels) EXPECT_LE(k.trials, 8);
  EXPECT_THROW(parse_level("quick"), ValueError);
}

// A 3-D Attention reading Q, K and V in place from one input (FoldAttentionHeads' qkv_split) gets
// the same attn.tiles candidates as the 4-D form, its sequence on axis 1: the faster one wins
// and the tuned model keeps the reference's result.
TEST_F(TunerTest, PackedAttentionIsTuned) {
  Graph g;
  const ValueId x = g.add_input("x", {DType::kF32, Shape{1, 100, 96}});
  const ValueId y = g.add_value("y");
  Attributes a;
  a.set("q_num_heads", int64_t{2});
  a.set("kv_num_heads", int64_t{2});
  a.set("qkv_split", std::vector<int64_t>{32, 32, 32});
  g.add_node("Attention", {x, x, x}, {y}, a, "attn", 23);
  g.add_output(y);
  const std::vector<Tensor> in = {testing::random_tensor({1, 100, 96}, 3)};
  FakeTimer f{[](int64_t, const Knobs& k) {
    const auto it = k.find("attn.tiles");
    return it != k.end() && it->second == std::vector<int64_t>{32, 64} ? 0.5 : 1.0;
  }};
  f.model_tuned = 0.6;
  TuneOptions o = fake(f, cache_file_);
  o.early_stop = false;
  const TuneReport r = tune(g, in, {}, o);
  ASSERT_EQ(r.kernels.size(), 1u);
  EXPECT_EQ(r.kernels[0].knobs.at("attn.tiles"), (std::vector<int64_t>{32, 64}));
  const Executable exe = compile(g, with_cache());
  EXPECT_EQ(exe.stats().tuned_kernels, 1u);
  EXPECT_LT(max_diff(exe.run(in), reference::run(g, in)), 1e-4f);
}

// Knobs cached for a kernel of a Loop body (by its signature, as any kernel's) are used when the
// body is compiled with the model: the model's stats count it, and the result stays the
// reference's.
TEST_F(TunerTest, CachedKnobsReachSubgraphKernels) {
  const Graph g = parse_graph(testing::kLoopSigmoidAdd);
  const std::vector<Tensor> in{testing::random_tensor({7, 100}, 1),
                               testing::random_tensor({100}, 2)};
  const Executable planner = compile(g, with_cache(false));
  const Executable& body = *planner.subgraphs(0)[0].second;
  const size_t ew = step_with(body, "Sigmoid");
  TuneCache::open(cache_file_)
      .store(signature_of(body, ew), num_threads(), {{{"tile", {2, 64}}}, 100, 50, 0});
  const Executable exe = compile(g, with_cache());
  EXPECT_EQ(planner.stats().tuned_kernels, 0u);
  EXPECT_EQ(exe.stats().tuned_kernels, 1u);
  const std::string d = exe.subgraphs(0)[0].second->describe_step(ew);
  EXPECT_NE(d.find("of 2x64"), std::string::npos) << d;
  EXPECT_LT(max_diff(exe.run(in), reference::run(g, in)), 1e-5f);
}

}  // namespace
}  // namespace pto::tune
