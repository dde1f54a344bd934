// The debugging tools' C++ pieces: pto::compare (tolerances as torch.allclose, NaN/Inf, the worst
// element), Executable::run_observing_values (every kernel output, equal to the reference's
// values of the same name), PTO_VERIFY_PASSES (a test-only pass with a broken rule is named, good
// passes are not) and PTO_TEST_PERTURB_VALUE.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <random>

#include "env_guard.h"
#include "pto/compare.h"
#include "pto/executable.h"
#include "pto/passes.h"
#include "pto/random_tensor.h"
#include "pto/reference.h"

namespace pto {
namespace {

using testing::EnvGuard;

TEST(Compare, ToleranceIsAllclosesRule) {
  Tensor want = Tensor::from_vector<float>({1, 100, 0, -2}, {2, 2});
  // |d| <= atol + rtol * |want|: 1e-4 + 1e-3 * 100 = 0.1001 allows 0.1 at [0, 1], not 0.2.
  Tensor ok = Tensor::from_vector<float>({1, 100.1f, 0.00005f, -2}, {2, 2});
  TensorDiff d = compare(ok, want, 1e-3, 1e-4);
  EXPECT_TRUE(d.ok());
  EXPECT_NEAR(d.max_abs, 0.1, 1e-5);
  EXPECT_NEAR(d.max_rel, 0.1 / 100, 1e-7);
  Tensor bad = Tensor::from_vector<float>({1, 100.2f, 0, -2.5f}, {2, 2});
  d = compare(bad, want, 1e-3, 1e-4);
  EXPECT_EQ(d.mismatches, 2);
  EXPECT_EQ(d.worst, 3);  // |-2.5 - -2| = 0.5 is the largest error
  EXPECT_EQ(index_string(want.shape(), d.worst), "[1, 1]");
  EXPECT_DOUBLE_EQ(d.worst_got, -2.5);
  EXPECT_DOUBLE_EQ(d.worst_want, -2.0);
  EXPECT_NE(describe(d, want.shape()).find("2 of 4 elements beyond tolerance"), std::string::npos);
}

TEST(Compare, NanAndInfDisagreementsAreCounted) {
  const float inf = INFINITY, nan = NAN;
  Tensor want = Tensor::from_vector<float>({nan, inf, 1, -inf, 2}, {5});
  Tensor got = Tensor::from_vector<float>({nan, inf, nan, inf, 2}, {5});
  TensorDiff d = compare(got, want, 1e-3, 1e-5);
  EXPECT_EQ(d.nan_mismatches, 1);  // NaN vs 1
  EXPECT_EQ(d.inf_mismatches, 1);  // +inf vs -inf
  EXPECT_EQ(d.mismatches, 2);
  EXPECT_EQ(d.worst, 2);  // the first disagreement
  EXPECT_EQ(d.max_abs, 0.0);
}

TEST(Compare, IntegersAndIdenticalTensors) {
  Tensor a = Tensor::from_vector<int64_t>({1, 2, 3}, {3});
  TensorDiff d = compare(a, a, 0, 0);
  EXPECT_TRUE(d.ok());
  EXPECT_EQ(d.worst, -1);
  d = compare(Tensor::from_vector<int64_t>({1, 2, 4}, {3}), a, 0, 0);
  EXPECT_EQ(d.mismatches, 1);
  EXPECT_EQ(d.max_abs, 1.0);
}

TEST(Compare, ShapeOrDtypeMismatchIsAnError) {
  Tensor a = Tensor::from_vector<float>({1, 2}, {2});
  EXPECT_THROW(compare(a, Tensor::from_vector<float>({1, 2}, {1, 2}), 0, 0), ValueError);
  EXPECT_THROW(compare(a, Tensor::from_vector<double>({1, 2}, {2}), 0, 0), ValueError);
}

const char* kSmallNet = R"(graph g (opset 18)
  input %x: f32[2, 3]
  input %y: f32[2, 3]
  const %c: f32[3] = [0.5, -1.5, 2]
  %m = Mul(%x, %c)
  %r = Relu(%m)
  %a = Add(%r, %y)
  %e = Exp(%a)
  %t = Transpose(%e)
  %s = Sigmoid(%t)
  return %s
)";

std::vector<Tensor> random_inputs(const Graph& g, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Tensor> out;
  for (size_t i = 0; i < g.inputs().size(); ++i)
    out.push_back(random_tensor(DType::kF32, {2, 3}, rng));
  return out;
}

// Every value a kernel writes is shown once, after its step, and equals the reference's value.
TEST(DebugTools, RunObservingValuesShowsEveryKernelOutput) {
  Graph g = parse_graph(kSmallNet);
  const std::vector<Tensor> inputs = random_inputs(g, 1);
  std::map<std::string, Tensor> want;
  reference::run(g, inputs, [&](const Node& n, const std::vector<Tensor>& outs) {
    want[g.value(n.outputs[0]).name] = outs[0];
  });
  for (int level : {0, 2}) {
    Executable exe = compile(g, {.level = level});
    size_t expected = 0;
    for (size_t s = 0; s < exe.num_steps(); ++s) expected += exe.step(s).outputs.size();
    std::vector<std::string> seen;
    exe.run_observing_values(inputs, [&](ValueId v, const Tensor& t) {
      const std::string& name = exe.graph().value(v).name;
      seen.push_back(name);
      ASSERT_TRUE(want.count(name)) << name;
      EXPECT_TRUE(compare(t, want[name], 1e-5, 1e-6).ok()) << name << " at level " << level;
    });
    EXPECT_EQ(seen.size(), expected) << "level " << level;
    EXPECT_EQ(seen.back(), "s");
    if (level == 0) {
      EXPECT_EQ(seen.size(), 6u);  // one per node
    } else {
      EXPECT_LT(seen.size(), 6u);  // fused kernels hide their insides
    }
  }
}

TEST(DebugTools, PerturbedValueIsOffByOneAndUnknownNamesAreErrors) {
  Graph g = parse_graph(kSmallNet);
  const std::vector<Tensor> inputs = random_inputs(g, 2);
  const std::vector<Tensor> want = reference::run(g, inputs);
  {
    EnvGuard env("PTO_TEST_PERTURB_VALUE", "s");
    Executable exe = compile(g, {.level = 0});
    Tensor got = exe.run(inputs)[0];
    TensorDiff d = compare(got, want[0], 0, 0);
    EXPECT_EQ(d.mismatches, want[0].numel());
    EXPECT_NEAR(d.max_abs, 1.0, 1e-6);
  }
  {
    EnvGuard env("PTO_TEST_PERTURB_VALUE", "no_such_value");
    EXPECT_THROW(compile(g, {.level = 0}), ValueError);
  }
  // At level 2 Mul and Relu are one kernel: `m` is never written, so it cannot be perturbed.
  EnvGuard env("PTO_TEST_PERTURB_VALUE", "m");
  EXPECT_NO_THROW(compile(g, {.level = 0}));
  EXPECT_THROW(compile(g, {.level = 2}), ValueError);
}

// A test-only pass with a broken rule: every Relu becomes Abs.
Graph break_relu(Graph g, const PassContext&) {
  std::string text = print(g);
  for (size_t at; (at = text.find("= Relu(")) != std::string::npos;) text.replace(at, 7, "= Abs(");
  return parse_graph(text);
}

void register_broken_pass() {
  static bool once = [] {
    PassRegistry::global().add({"BreakReluForTest", break_relu, "test only: Relu -> Abs"});
    return true;
  }();
  (void)once;
}

TEST(VerifyPasses, NamesThePassThatChangedResults) {
  register_broken_pass();
  Graph g = parse_graph(kSmallNet);
  PassOptions opts;
  opts.only = {"CanonicalizeOps", "FoldConstants", "BreakReluForTest", "EliminateDeadCode"};
  // Off: the broken pass goes unnoticed.
  EXPECT_NO_THROW(run_passes(g, opts));
  EnvGuard env("PTO_VERIFY_PASSES", "1");
  try {
    run_passes(g, opts);
    FAIL() << "PTO_VERIFY_PASSES did not find the broken pass";
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("pass BreakReluForTest, output 's'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("max abs error"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("FoldConstants"), std::string::npos) << msg;
  }
  // Through compile() too, whose passes are the level's pipeline.
  opts.only = {"BreakReluForTest"};
  EXPECT_THROW(run_passes(g, opts), ValueError);
}

TEST(VerifyPasses, GoodPassesPassAndRoundingChangesAreTolerated) {
  // FoldBatchNorm changes rounding; the level 3 pipeline adds blocked layouts.
  const char* net = R"(graph g (opset 18)
  input %x: f32[1, 2, 3, 3]
  const %w: f32[2, 2, 1, 1] = [0.5, -1, 2, 0.25]
  const %scale: f32[2] = [1.5, 0.5]
  const %bias: f32[2] = [0.1, -0.2]
  const %mean: f32[2] = [0.3, 0.1]
  const %var: f32[2] = [2, 0.5]
  %c = Conv(%x, %w)
  %b = BatchNormalization(%c, %scale, %bias, %mean, %var)
  %r = Relu(%b)
  return %r
)";
  Graph g = parse_graph(net);
  EnvGuard env("PTO_VERIFY_PASSES", "1");
  for (int level : {1, 2, 3}) {
    std::vector<PassReport> report;
    EXPECT_NO_THROW(run_passes(g, {.level = level}, &report)) << "level " << level;
    EXPECT_FALSE(report.empty());
  }
  EXPECT_NO_THROW(compile(g, {.level = 3}));
}

TEST(VerifyPasses, BadSettingsAreErrors) {
  register_broken_pass();
  Graph g = parse_graph(kSmallNet);
  PassOptions opts;
  opts.only = {"EliminateDeadCode"};
  {
    EnvGuard env("PTO_VERIFY_PASSES", "yes");
    EXPECT_THROW(run_passes(g, opts), ValueError);
  }
  EnvGuard env("PTO_VERIFY_PASSES", "1");
  {
    EnvGuard tol("PTO_VERIFY_PASSES_ATOL", "-1");
    EXPECT_THROW(run_passes(g, opts), ValueError);
  }
  // A tolerance wide enough lets the broken pass through: the setting has an effect.
  EnvGuard rtol("PTO_VERIFY_PASSES_RTOL", "10");
  EnvGuard atol("PTO_VERIFY_PASSES_ATOL", "100");
  opts.only = {"BreakReluForTest"};
  EXPECT_NO_THROW(run_passes(g, opts));
}

}  // namespace
}  // namespace pto
