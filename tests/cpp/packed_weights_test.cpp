// Weights the GEMM and convolution kernels hold packed are released from the compiled graph
// (CompileOptions::release_packed_weights): which ones are, that runs still equal the reference
// interpreter, that the fallback to node-by-node kernels gets the originals back, and that
// graph_with_weights() rebuilds them bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <set>

#include "backend/cpu/isa/isa.h"
#include "pto/executable.h"
#include "pto/reference.h"
#include "random_tensor.h"

namespace pto {
namespace {

using testing::constant;
using testing::random_tensor;

void expect_near(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  for (int64_t i = 0; i < a.numel(); ++i)
    ASSERT_NEAR(a.item_as_double(i), b.item_as_double(i), tol) << what << " element " << i;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// x [4, 16] -> MatMul w1 [16, 8] -> Gemm (transB) w2 [6, 8] + c [6] -> y
// img [2, 4, 8, 8] -> Conv w3 [6, 2, 3, 3] (2 groups) -> Conv w4 [6, 1, 3, 3] (depthwise) -> z
// w5 [4, 16] is read by a MatMul (x^T w5) and by an Add: not the MatMul's alone.
Graph model() {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, to_shape({4, 16})});
  ValueId img = g.add_input("img", {DType::kF32, to_shape({2, 4, 8, 8})});
  ValueId w1 = constant(g, "w1", {16, 8}, 1), w2 = constant(g, "w2", {6, 8}, 2);
  ValueId c = constant(g, "c", {6}, 3), w3 = constant(g, "w3", {6, 2, 3, 3}, 4);
  ValueId w4 = constant(g, "w4", {6, 1, 3, 3}, 5), w5 = constant(g, "w5", {4, 16}, 6);
  ValueId m = g.add_value("m"), y = g.add_value("y"), a = g.add_value("a"), z = g.add_value("z");
  ValueId xt = g.add_value("xt"), u = g.add_value("u"), s = g.add_value("s");
  g.add_node("MatMul", {x, w1}, {m}, {}, "mm");
  Attributes tb;
  tb.set("transB", int64_t{1});
  g.add_node("Gemm", {m, w2, c}, {y}, tb, "gemm");
  Attributes conv;
  conv.set("group", int64_t{2});
  conv.set("pads", std::vector<int64_t>{1, 1, 1, 1});
  g.add_node("Conv", {img, w3}, {a}, conv, "grouped");
  Attributes dw;
  dw.set("group", int64_t{6});
  g.add_node("Conv", {a, w4}, {z}, dw, "depthwise");
  g.add_node("Transpose", {x}, {xt}, {}, "t");
  g.add_node("MatMul", {xt, w5}, {u}, {}, "shared_mm");  // [16, 16]
  g.add_node("Add", {x, w5}, {s}, {}, "shared_add");
  g.add_output(y);
  g.add_output(z);
  g.add_output(u);
  g.add_output(s);
  return g;
}

const Tensor& initializer_named(const Graph& g, const std::string& name) {
  auto v = g.find_value(name);
  EXPECT_TRUE(v.has_value()) << name;
  const Tensor* t = v ? g.initializer(*v) : nullptr;
  EXPECT_NE(t, nullptr) << name;
  static const Tensor none;
  return t ? *t : none;
}

TEST(PackedWeights, ReleasedWhereEveryReaderHoldsThemPacked) {
  const Graph g = model();
  Graph typed = g;
  infer_types(typed);
  const std::vector<Tensor> in = {random_tensor({4, 16}, 10), random_tensor({2, 4, 8, 8}, 11)};
  const std::vector<Tensor> want = reference::run(typed, in);
  for (int level : {0, 2}) {
    for (bool release : {true, false}) {
      SCOPED_TRACE(cat("level ", level, " release ", release));
      CompileOptions o;
      o.level = level;
      o.release_packed_weights = release;
      Executable exe = compile(model(), o);  // handed over: the Executable holds the only copy
      std::set<std::string> released;
      for (ValueId v : exe.graph().released()) released.insert(exe.graph().value(v).name);
      if (release) {
        // Packed: both GEMM B operands and the grouped conv's W. Not packed: the depthwise W
        // (a direct kernel reads it); w5 is also read by the Add.
        EXPECT_EQ(released, (std::set<std::string>{"w1", "w2", "w3"}));
      } else {
        EXPECT_TRUE(released.empty());
      }
      const ExecutableStats s = exe.stats();
      EXPECT_EQ(s.released_weight_bytes, release ? (16 * 8 + 6 * 8 + 6 * 2 * 9) * 4u : 0u);
      EXPECT_GE(s.packed_weight_bytes, (16 * 8 + 6 * 8 + 6 * 2 * 9 + 4 * 16) * 4u);
      for (int run = 0; run < 2; ++run) {
        const std::vector<Tensor> got = exe.run(in);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i)
          expect_near(got[i], want[i], 1e-4, cat("output ", i));
      }
      // The complete graph has every weight back, bit for bit, and runs alone.
      const Graph full = exe.graph_with_weights();
      EXPECT_TRUE(full.released().empty());
      for (const char* name : {"w1", "w2", "w3", "w4", "w5"})
        EXPECT_TRUE(same_bits(initializer_named(full, name), initializer_named(g, name))) << name;
      const std::vector<Tensor> again = compile(full, o).run(in);
      for (size_t i = 0; i < again.size(); ++i)
        expect_near(again[i], want[i], 1e-4, cat("recompiled output ", i));
    }
    // Weights the caller's graph still holds would not be freed by releasing: they stay.
    Executable kept = compile(g, {.level = level});
    EXPECT_TRUE(kept.graph().released().empty());
    EXPECT_EQ(kept.stats().released_weight_bytes, 0u);
  }
}

// Memory PyPTO does not own (wrapped, as a torch parameter through DLPack) is never released.
TEST(PackedWeights, WrappedMemoryStays) {
  std::vector<float> data(16 * 8, 0.25f);
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, to_shape({4, 16})});
  ValueId w = g.add_value("w");
  g.set_initializer(w, Tensor::wrap(data.data(), DType::kF32, {16, 8}, {}, [] {}));
  ValueId y = g.add_value("y");
  g.add_node("MatMul", {x, w}, {y}, {}, "mm");
  g.add_output(y);
  Executable exe = compile(std::move(g), {.level = 2});
  EXPECT_TRUE(exe.graph().released().empty());
  ASSERT_NE(exe.graph().initializer(w), nullptr);
  EXPECT_EQ(exe.graph().initializer(w)->raw_data(), data.data());
}

// A fused MatMul + Add + Relu whose residual only broadcasts at run time declines, and the
// runtime runs its nodes one by one: the MatMul then needs W, which was released; it is rebuilt
// from the packed panels and the answer is the reference's.
TEST(PackedWeights, FallbackToUnfusedKernelsGetsTheOriginalBack) {
  auto build = [] {  // twice the same graph (same seeds): one to compile, one for the reference
    Graph g;
    ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::unknown(), 16}});
    ValueId r = g.add_input("r", {DType::kF32, Shape{Dim::unknown(), 8}});
    ValueId w = constant(g, "w", {16, 8}, 20);
    ValueId p = g.add_value("p"), y = g.add_value("y"), z = g.add_value("z");
    g.add_node("MatMul", {x, w}, {p}, {}, "mm");
    g.add_node("Add", {p, r}, {y}, {}, "residual");
    g.add_node("Relu", {y}, {z}, {}, "relu");
    g.add_output(z);
    return g;
  };
  Graph g = build();
  {
    Executable copy = compile(Graph(g), {.level = 2});
    ASSERT_EQ(copy.num_steps(), 1u);
    ASSERT_EQ(copy.graph().released().size(), 0u);  // g still holds w
  }
  Executable exe = compile(std::move(g), {.level = 2});
  ASSERT_EQ(exe.graph().released().size(), 1u);
  Graph typed = build();
  infer_types(typed);
  for (auto [mx, mr] : {std::pair<int64_t, int64_t>{4, 1}, {4, 4}, {1, 5}}) {
    std::vector<Tensor> in = {random_tensor({mx, 16}, 21), random_tensor({mr, 8}, 22)};
    const Tensor want = reference::run(typed, in)[0];
    expect_near(exe.run(in)[0], want, 1e-5, cat(mx, " x ", mr));
  }
}

// A weight the packing node also reads as another input, or that the fused epilogue of the same
// group reads (MatMul + Add of the weight itself), stays in the graph.
TEST(PackedWeights, KeptWhenTheGroupReadsItAgain) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, to_shape({8, 8})});
  ValueId w = constant(g, "w", {8, 8}, 30), v = constant(g, "v", {8, 8}, 31);
  ValueId sq = g.add_value("sq"), m = g.add_value("m"), y = g.add_value("y");
  g.add_node("MatMul", {v, v}, {sq}, {}, "square");
  g.add_node("MatMul", {x, w}, {m}, {}, "mm");
  g.add_node("Add", {m, w}, {y}, {}, "plus_w");
  g.add_output(sq);
  g.add_output(y);
  Graph typed = g;
  infer_types(typed);
  const std::vector<Tensor> in = {random_tensor({8, 8}, 32)};
  const std::vector<Tensor> want = reference::run(typed, in);
  for (int level : {0, 2}) {
    Executable exe = compile(g, {.level = level});
    EXPECT_TRUE(exe.graph().released().empty()) << level;
    const std::vector<Tensor> got = exe.run(in);
    for (size_t i = 0; i < got.size(); ++i) expect_near(got[i], want[i], 1e-4, cat("output ", i));
  }
}

// Level 3 with bf16 products (AutoMixedPrecision's marking): ConvBlocked and DwPwConvBlocked
// hold their weights rounded to bf16 (pair words where AVX512_BF16 runs them), so the fp32
// originals of the plain conv and of both 1x1 convs are released; the depthwise W stays (an fp32
// kernel reads it). graph_with_weights() gives back the rounded weights, which the bf16 products
// read anyway: compiled again it computes the same outputs, as does the first compile with the
// extension turned off (the weights widened from the pairs).
TEST(PackedWeights, Bf16BlockedConvsHoldTheirWeightsOnce) {
  // Where bf16 products run on AMX tiles the convs stay on the implicit GEMM (AssignLayouts):
  // turned off, so that the blocked bf16 kernels compile here too.
  std::optional<cpu::ExtScope> no_amx;
  if (cpu::has_ext(cpu::Ext::kAmxBf16)) no_amx.emplace(cpu::Ext::kAmxBf16);
  auto build = [] {
    Graph g;
    ValueId x = g.add_input("x", {DType::kF32, to_shape({1, 16, 10, 10})});
    ValueId w0 = constant(g, "w0", {32, 16, 3, 3}, 40), we = constant(g, "we", {64, 32, 1, 1}, 41);
    ValueId wd = constant(g, "wd", {64, 1, 3, 3}, 42), wp = constant(g, "wp", {32, 64, 1, 1}, 43);
    auto conv = [&](ValueId in, ValueId w, int64_t group, int64_t k, const char* name) {
      Attributes a;
      a.set("pads", std::vector<int64_t>(4, k / 2));
      if (group > 1)
        a.set("group", group);
      else
        a.set("precision", std::string("bf16"));
      ValueId y = g.add_value(std::string(name) + "_out"),
              r = g.add_value(std::string(name) + "_relu");
      g.add_node("Conv", {in, w}, {y}, a, name);
      g.add_node("Relu", {y}, {r});
      return r;
    };
    const ValueId a = conv(x, w0, 1, 3, "plain");
    const ValueId e = conv(a, we, 1, 1, "expand");
    const ValueId d = conv(e, wd, 64, 3, "depthwise");
    const ValueId p = g.add_value("p");
    g.add_node("Conv", {d, wp}, {p}, Attributes{}, "project");
    Node& project = g.mutable_nodes().back();
    project.attrs.set("precision", std::string("bf16"));
    g.add_output(p);
    return g;
  };
  Graph typed = build();
  infer_types(typed);
  const std::vector<Tensor> in = {random_tensor({1, 16, 10, 10}, 44)};
  const Tensor want = reference::run(typed, in)[0];
  Executable exe = compile(build(), {.level = 3});
  int fused = 0;
  for (const Node& n : exe.graph().nodes()) fused += n.op == "DwPwConvBlocked";
  ASSERT_EQ(fused, 1) << print(exe.graph());
  std::set<std::string> released;
  for (ValueId v : exe.graph().released()) released.insert(exe.graph().value(v).name);
  EXPECT_EQ(released.size(), 3u) << print(exe.graph());  // plain, expand and project W
  for (const std::string& name : released) EXPECT_EQ(name.find("wd"), std::string::npos) << name;
  EXPECT_GT(exe.stats().released_weight_bytes, 0u);
  // The depthwise output is rounded before the projection: a value on a rounding boundary may
  // round the other way than in the reference (double), one bf16 ulp of one input.
  const Tensor got = exe.run(in)[0];
  double scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i)
    scale = std::max(scale, std::fabs(want.item_as_double(i)));
  ASSERT_GT(scale, 0.0);
  expect_near(got, want, 2e-3 * scale, "level 3 bf16");
  const Graph full = exe.graph_with_weights();
  EXPECT_TRUE(full.released().empty());
  expect_near(compile(full, {.level = 3}).run(in)[0], got, 1e-5 * scale,
              "recompiled from the weights");
  if (cpu::has_ext(cpu::Ext::kAvx512Bf16)) {
    cpu::ExtScope off(cpu::Ext::kAvx512Bf16);
    expect_near(exe.run(in)[0], got, 1e-5 * scale, "pairs turned off");
  }
}

TEST(PackedWeights, ExportingACompiledGraphNeedsTheWeightsBack) {
  Executable exe = compile(model(), {.level = 2});
  ASSERT_FALSE(exe.graph().released().empty());
  const std::string text = print(exe.graph());
  EXPECT_NE(text.find("released"), std::string::npos) << text;
  EXPECT_EQ(print(exe.graph_with_weights()).find("released"), std::string::npos);
}

}  // namespace
}  // namespace pto
