// The model-level rewrites of level 1 (FoldBatchNorm, CanonicalizeOps, FoldTransposeIntoGemm,
// RecognizeComposites, RecognizeAttention, RecognizeRotaryEmbedding): each test builds a small
// graph, runs one pass alone, checks the structure it expects, and compares the reference
// interpreter's outputs on the graph before and after the pass, on random inputs from a fixed seed.
// Negative cases must keep their form and their numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>

#include "backend/cpu/isa/isa.h"
#include "env_guard.h"
#include "pto/device_info.h"
#include "pto/executable.h"
#include "pto/passes.h"
#include "pto/reference.h"

namespace pto {
namespace {

Tensor random_f32(const Dims& shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  Tensor t = Tensor::empty(DType::kF32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// A graph under construction: inputs, constants and nodes by one-liners.
struct Builder {
  Graph g;
  std::vector<Dims> input_shapes;
  uint32_t seed = 1;

  ValueId input(const std::string& name, const Dims& shape) {
    input_shapes.push_back(shape);
    return g.add_input(name, {DType::kF32, to_shape(shape)});
  }
  ValueId constant(const std::string& name, Tensor t) {
    ValueId v = g.add_value(g.unique_name(name));
    g.set_initializer(v, std::move(t));
    return v;
  }
  ValueId random(const std::string& name, const Dims& shape, float lo = -1, float hi = 1) {
    return constant(name, random_f32(shape, ++seed, lo, hi));
  }
  ValueId scalar(const std::string& name, float v) { return constant(name, Tensor::scalar(v)); }
  // A constant as a Constant node, as the torchscript exporter writes them.
  ValueId constant_node(float v) {
    Attributes a;
    a.set("value", Tensor::scalar(v));
    return op("Constant", {}, std::move(a));
  }
  ValueId op(const std::string& op, std::vector<ValueId> in, Attributes a = {}, int opset = 0) {
    ValueId out = g.add_value(g.unique_name(op + "_out"));
    g.add_node(op, std::move(in), {out}, std::move(a), "", opset);
    return out;
  }
  Attributes attrs(std::initializer_list<std::pair<std::string, Attribute>> kv) {
    Attributes a;
    for (const auto& [k, v] : kv) a.set(k, v);
    return a;
  }
  std::vector<Tensor> inputs(uint32_t s) const {
    std::vector<Tensor> out;
    for (const Dims& d : input_shapes) out.push_back(random_f32(d, s++));
    return out;
  }
};

int count(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node& node : g.nodes()) n += node.op == op;
  return n;
}

const Node& only(const Graph& g, const std::string& op) {
  for (const Node& node : g.nodes())
    if (node.op == op) return node;
  ADD_FAILURE() << "no " << op << " node";
  return g.nodes().front();
}

// The reference's outputs of two graphs on the same inputs agree within `tol` relative (bit for
// bit when tol is 0).
void compare(const Graph& before, const Graph& after, const std::vector<Tensor>& in, double tol) {
  std::vector<Tensor> want = reference::run(before, in), got = reference::run(after, in);
  ASSERT_EQ(want.size(), got.size());
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_EQ(want[k].shape(), got[k].shape());
    for (int64_t i = 0; i < want[k].numel(); ++i) {
      const double w = want[k].item_as_double(i), v = got[k].item_as_double(i);
      if (w == v || (std::isnan(w) && std::isnan(v))) continue;  // equal, infinities included
      if (tol == 0)
        ASSERT_TRUE(w == v || (std::isnan(w) && std::isnan(v)))
            << "output " << k << " element " << i << ": " << v << " != " << w;
      else
        ASSERT_NEAR(v, w, tol * std::max(1.0, std::fabs(w))) << "output " << k << " element " << i;
    }
  }
}

// Runs `pass` alone on b.g at `level` and compares the reference before and after on two random
// inputs. Returns the rewritten graph.
Graph run_and_compare(Builder& b, const std::string& pass, double tol = 1e-5, int level = 2) {
  infer_types(b.g);
  const Graph before = b.g;
  Graph after = run_passes(b.g, {.level = level, .only = {pass}});
  for (uint32_t seed : {7u, 8u}) compare(before, after, b.inputs(seed), tol);
  return after;
}

// ---- FoldBatchNorm ----

// BN(x) with random parameters over `channels`; variance positive.
ValueId batch_norm(Builder& b, ValueId x, int64_t channels, Attributes a = {}) {
  const Dims c = {channels};
  return b.op("BatchNormalization",
              {x, b.random("gamma", c), b.random("beta", c), b.random("mean", c),
               b.random("var", c, 0.1f, 2.0f)},
              std::move(a));
}

TEST(PassFoldBatchNorm, ConvWithBias) {
  Builder b;
  ValueId x = b.input("x", {2, 4, 7, 7});
  ValueId y = b.op("Conv", {x, b.random("w", {6, 4, 3, 3}), b.random("b", {6})},
                   b.attrs({{"pads", std::vector<int64_t>{1, 1, 1, 1}}}));
  b.g.add_output(batch_norm(b, y, 6, b.attrs({{"epsilon", 1e-3}})));
  Graph g = run_and_compare(b, "FoldBatchNorm");
  EXPECT_EQ(count(g, "BatchNormalization"), 0);
  EXPECT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(only(g, "Conv").inputs.size(), 3u);
}

TEST(PassFoldBatchNorm, GroupedConvWithoutBiasKeepsOutputName) {
  Builder b;
  ValueId x = b.input("x", {1, 4, 6, 5});
  ValueId y = b.op("Conv", {x, b.random("w", {6, 2, 3, 1})}, b.attrs({{"group", int64_t{2}}}));
  ValueId z = batch_norm(b, y, 6);
  b.g.value(z).name = "y_out";
  b.g.add_output(b.op("Relu", {z}));
  b.g.add_output(z);
  Graph g = run_and_compare(b, "FoldBatchNorm");
  EXPECT_EQ(count(g, "BatchNormalization"), 0);
  EXPECT_EQ(g.value(g.outputs()[1]).name, "y_out");
  EXPECT_EQ(g.nodes().size(), 2u);
}

TEST(PassFoldBatchNorm, GroupedConvTranspose) {
  Builder b;
  ValueId x = b.input("x", {1, 4, 5, 5});
  // W: [Cin=4, Cout/g=3, 3, 3], group 2: Cout = 6.
  ValueId y = b.op("ConvTranspose", {x, b.random("w", {4, 3, 3, 3}), b.random("b", {6})},
                   b.attrs({{"group", int64_t{2}}, {"strides", std::vector<int64_t>{2, 2}}}));
  b.g.add_output(batch_norm(b, y, 6));
  Graph g = run_and_compare(b, "FoldBatchNorm");
  EXPECT_EQ(count(g, "BatchNormalization"), 0);
  EXPECT_EQ(count(g, "ConvTranspose"), 1);
}

TEST(PassFoldBatchNorm, GemmTransBWithBiasAlphaBeta) {
  Builder b;
  ValueId x = b.input("x", {5, 8});
  ValueId y = b.op("Gemm", {x, b.random("w", {6, 8}), b.random("c", {6})},
                   b.attrs({{"transB", int64_t{1}}, {"alpha", 0.5}, {"beta", 2.0}}));
  b.g.add_output(batch_norm(b, y, 6));
  Graph g = run_and_compare(b, "FoldBatchNorm");
  EXPECT_EQ(g.nodes().size(), 1u);
  const Node& gemm = only(g, "Gemm");
  EXPECT_EQ(gemm.attrs.get_float("beta"), 1.0);
  EXPECT_EQ(gemm.attrs.get_float("alpha"), 0.5);
  EXPECT_EQ(gemm.attrs.get_int("transB"), 1);
}

TEST(PassFoldBatchNorm, MatMulBecomesGemm) {
  Builder b;
  ValueId x = b.input("x", {3, 8});
  ValueId y = b.op("MatMul", {x, b.random("w", {8, 6})});
  b.g.add_output(batch_norm(b, y, 6));
  Graph g = run_and_compare(b, "FoldBatchNorm");
  EXPECT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(only(g, "Gemm").inputs.size(), 3u);
}

// LeViT's Linear + BatchNorm1d: a 3-D MatMul's output flattened to [rows, C] into the BN and
// reshaped back. The product's columns are scaled, the shift is an Add after it, and the view
// makes BN's output; a view that does not keep the last axis ([1, 4, 6] viewed as [6, 4]: BN's
// 4 channels are not the product's 6 columns) is left alone.
TEST(PassFoldBatchNorm, MatMulThroughAFlattenView) {
  {
    Builder b;
    ValueId x = b.input("x", {2, 5, 8});
    ValueId y = b.op("MatMul", {x, b.random("w", {8, 6})});
    ValueId f = b.op("Flatten", {y}, b.attrs({{"axis", int64_t{2}}}));
    ValueId n = batch_norm(b, f, 6);
    b.g.add_output(
        b.op("Reshape", {n, b.constant("s", Tensor::from_vector<int64_t>({2, 5, 6}, {3}))}));
    Graph g = run_and_compare(b, "FoldBatchNorm");
    EXPECT_EQ(count(g, "BatchNormalization"), 0);
    EXPECT_EQ(count(g, "Add"), 1);
    EXPECT_EQ(count(g, "Flatten"), 1);
  }
  {
    Builder b;
    ValueId x = b.input("x", {1, 4, 8});
    ValueId y = b.op("MatMul", {x, b.random("w", {8, 6})});
    ValueId r = b.op("Reshape", {y, b.constant("s", Tensor::from_vector<int64_t>({6, 4}, {2}))});
    b.g.add_output(batch_norm(b, r, 4));
    Graph g = run_and_compare(b, "FoldBatchNorm");
    EXPECT_EQ(count(g, "BatchNormalization"), 1);
  }
}

TEST(PassFoldBatchNorm, LeftAloneWhenNotFoldable) {
  {  // the conv weight is a graph input
    Builder b;
    ValueId x = b.input("x", {1, 3, 5, 5});
    ValueId w = b.input("w", {4, 3, 3, 3});
    b.g.add_output(batch_norm(b, b.op("Conv", {x, w}), 4));
    Graph g = run_and_compare(b, "FoldBatchNorm");
    EXPECT_EQ(count(g, "BatchNormalization"), 1);
  }
  {  // the conv output has a second reader
    Builder b;
    ValueId x = b.input("x", {1, 3, 5, 5});
    ValueId y = b.op("Conv", {x, b.random("w", {4, 3, 3, 3})});
    b.g.add_output(batch_norm(b, y, 4));
    b.g.add_output(b.op("Relu", {y}));
    Graph g = run_and_compare(b, "FoldBatchNorm");
    EXPECT_EQ(count(g, "BatchNormalization"), 1);
  }
  {  // training mode uses batch statistics
    Builder b;
    ValueId x = b.input("x", {2, 3, 5, 5});
    ValueId y = b.op("Conv", {x, b.random("w", {4, 3, 3, 3})});
    b.g.add_output(batch_norm(b, y, 4, b.attrs({{"training_mode", int64_t{1}}})));
    Graph g = run_and_compare(b, "FoldBatchNorm");
    EXPECT_EQ(count(g, "BatchNormalization"), 1);
  }
  {  // not after a layer with weights
    Builder b;
    ValueId x = b.input("x", {2, 3, 5, 5});
    b.g.add_output(batch_norm(b, b.op("Relu", {x}), 3));
    Graph g = run_and_compare(b, "FoldBatchNorm");
    EXPECT_EQ(count(g, "BatchNormalization"), 1);
  }
}

// ---- CanonicalizeOps ----

TEST(PassCanonicalizeOps, PowSquareIsMulBitForBit) {
  Builder b;
  ValueId x = b.input("x", {4, 9});
  b.g.add_output(b.op("Pow", {x, b.scalar("two", 2.0f)}));
  Graph g = run_and_compare(b, "CanonicalizeOps", 0);
  const Node& mul = only(g, "Mul");
  EXPECT_EQ(mul.inputs[0], mul.inputs[1]);
  EXPECT_EQ(count(g, "Pow"), 0);
}

TEST(PassCanonicalizeOps, PowOneIsIdentity) {
  Builder b;
  ValueId x = b.input("x", {3});
  b.g.add_output(b.op("Pow", {x, b.scalar("one", 1.0f)}));
  Graph g = run_and_compare(b, "CanonicalizeOps", 0);
  EXPECT_EQ(count(g, "Identity"), 1);
}

TEST(PassCanonicalizeOps, InexactPowersOnlyAtLevelThree) {
  for (float e : {3.0f, 4.0f, 0.5f, -1.0f, -2.0f, -3.0f}) {
    SCOPED_TRACE(e);
    {
      Builder b;
      ValueId x = b.input("x", {4, 5});
      b.g.add_output(b.op("Pow", {x, b.scalar("e", e)}));
      Graph g = run_and_compare(b, "CanonicalizeOps", 0, 2);
      EXPECT_EQ(count(g, "Pow"), 1);
    }
    Builder b;
    ValueId x = b.input("x", {4, 5});
    // Positive bases: 0.5 and the negative powers are then finite.
    ValueId ax = b.op("Add", {b.op("Abs", {x}), b.scalar("one", 1.0f)});
    b.g.add_output(b.op("Pow", {ax, b.scalar("e", e)}));
    Graph g = run_and_compare(b, "CanonicalizeOps", 1e-6, 3);
    EXPECT_EQ(count(g, "Pow"), 0);
    const int muls = e == 0.5f || e == -1.0f ? 0 : std::fabs(e) == 2.0f ? 1 : 2;
    EXPECT_EQ(count(g, "Mul"), muls);
    EXPECT_EQ(count(g, "Reciprocal"), e < 0 ? 1 : 0);
    EXPECT_EQ(count(g, "Sqrt"), e == 0.5f ? 1 : 0);
  }
}

TEST(PassCanonicalizeOps, SubAndDivByConstants) {
  Builder b;
  ValueId x = b.input("x", {3, 4});
  ValueId s = b.op("Sub", {x, b.random("c", {4})});
  ValueId d =
      b.op("Div", {s, b.constant("q", Tensor::from_vector<float>({4, -0.5f, 1, 1024}, {4}))});
  ValueId e = b.op("Div", {d, b.scalar("three", 3.0f)});  // not a power of two: stays
  b.g.add_output(e);
  Graph g = run_and_compare(b, "CanonicalizeOps", 0);
  EXPECT_EQ(count(g, "Sub"), 0);
  EXPECT_EQ(count(g, "Add"), 1);
  EXPECT_EQ(count(g, "Mul"), 1);
  EXPECT_EQ(count(g, "Div"), 1);
}

TEST(PassCanonicalizeOps, PowByABroadcastingExponentStays) {
  Builder b;
  ValueId x = b.input("x", {3});
  b.g.add_output(b.op("Pow", {x, b.constant("two", Tensor::from_vector<float>({2}, {1, 1}))}));
  Graph g = run_and_compare(b, "CanonicalizeOps", 0);
  EXPECT_EQ(count(g, "Pow"), 1);
}

TEST(PassCanonicalizeOps, SumOfTwoIsAdd) {
  Builder b;
  ValueId x = b.input("x", {3, 4});
  ValueId y = b.input("y", {4});
  b.g.add_output(b.op("Sum", {b.op("Sum", {x, y})}));
  Graph g = run_and_compare(b, "CanonicalizeOps", 0);
  EXPECT_EQ(count(g, "Add"), 1);
  EXPECT_EQ(count(g, "Identity"), 1);
  EXPECT_EQ(count(g, "Sum"), 0);
}

TEST(PassCanonicalizeOps, ClipAttributesBecomeInputs) {
  Builder b;
  ValueId x = b.input("x", {10});
  ValueId y = b.op("Clip", {x}, b.attrs({{"min", -0.25}, {"max", 0.5}}), 6);
  ValueId z = b.op("Clip", {y}, b.attrs({{"min", 0.0}}), 6);
  b.g.add_output(z);
  Graph g = run_and_compare(b, "CanonicalizeOps", 0);
  for (const Node& n : g.nodes()) {
    EXPECT_EQ(n.inputs.size(), 3u);
    EXPECT_FALSE(n.attrs.has("min"));
  }
}

TEST(PassCanonicalizeOps, AxesAttributesBecomeInputs) {
  Builder b;
  ValueId x = b.input("x", {3, 4, 5});
  ValueId m = b.op("ReduceMean", {x}, b.attrs({{"axes", std::vector<int64_t>{-1}}}), 13);
  ValueId s = b.op("Squeeze", {m}, b.attrs({{"axes", std::vector<int64_t>{2}}}), 11);
  b.g.add_output(b.op("Unsqueeze", {s}, b.attrs({{"axes", std::vector<int64_t>{0}}}), 11));
  Graph g = run_and_compare(b, "CanonicalizeOps", 0);
  for (const Node& n : g.nodes()) {
    EXPECT_EQ(n.inputs.size(), 2u) << n.op;
    EXPECT_FALSE(n.attrs.has("axes")) << n.op;
  }
}

TEST(PassCanonicalizeOps, ExpandBeforeMatMulIsDropped) {
  Builder b;
  ValueId x = b.input("x", {3, 5, 8});
  ValueId w = b.random("w", {8, 6});
  ValueId e =
      b.op("Expand", {w, b.constant("shape", Tensor::from_vector<int64_t>({3, 8, 6}, {3}))});
  b.g.add_output(b.op("MatMul", {x, e}));
  Graph g = run_and_compare(b, "CanonicalizeOps", 0);
  EXPECT_EQ(count(g, "Expand"), 0);
  EXPECT_EQ(only(g, "MatMul").inputs[1], w);
}

// ---- FoldTransposeIntoGemm ----

Attributes perm10() {
  Attributes a;
  a.set("perm", std::vector<int64_t>{1, 0});
  return a;
}

TEST(PassFoldTransposeIntoGemm, GemmFlipsTransFlags) {
  Builder b;
  ValueId a = b.input("a", {8, 5});  // A^T: [5, 8]
  ValueId w = b.input("w", {6, 8});  // B = Transpose(w^T ...): transB=1 on a transposed [8, 6]
  ValueId wt = b.op("Transpose", {w}, perm10());
  ValueId y = b.op("Gemm", {b.op("Transpose", {a}, perm10()), b.op("Transpose", {wt}, perm10())},
                   b.attrs({{"transB", int64_t{1}}}));
  b.g.add_output(y);
  Graph g = run_and_compare(b, "FoldTransposeIntoGemm");
  const Node& gemm = only(g, "Gemm");
  EXPECT_EQ(gemm.attrs.get_int("transA"), 1);
  // Both transposes of w fold in (two sweeps), flipping transB twice.
  EXPECT_EQ(count(g, "Transpose"), 0);
  EXPECT_EQ(gemm.attrs.get_int("transB", 0), 1);
}

TEST(PassFoldTransposeIntoGemm, MatMulByTransposedMatrixIsGemm) {
  Builder b;
  ValueId a = b.input("a", {5, 8});
  ValueId w = b.input("w", {6, 8});
  b.g.add_output(b.op("MatMul", {a, b.op("Transpose", {w}, perm10())}));
  Graph g = run_and_compare(b, "FoldTransposeIntoGemm");
  EXPECT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(only(g, "Gemm").attrs.get_int("transB"), 1);
}

TEST(PassFoldTransposeIntoGemm, BatchedMatMulByConstantTransposesTheWeight) {
  Builder b;
  ValueId a = b.input("a", {2, 5, 8});
  b.g.add_output(b.op("MatMul", {a, b.op("Transpose", {b.random("w", {6, 8})}, perm10())}));
  Graph g = run_and_compare(b, "FoldTransposeIntoGemm", 0);
  EXPECT_EQ(g.nodes().size(), 1u);
  const Tensor* w = g.initializer(only(g, "MatMul").inputs[1]);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape(), (Dims{8, 6}));
}

TEST(PassFoldTransposeIntoGemm, SharedTransposeStays) {
  Builder b;
  ValueId a = b.input("a", {5, 8});
  ValueId t = b.op("Transpose", {b.input("w", {6, 8})}, perm10());
  b.g.add_output(b.op("MatMul", {a, t}));
  b.g.add_output(t);
  Graph g = run_and_compare(b, "FoldTransposeIntoGemm");
  EXPECT_EQ(count(g, "Transpose"), 1);
  EXPECT_EQ(count(g, "MatMul"), 1);
}

// ---- RecognizeComposites ----

// The erf GELU in three spellings: 0.5 first, 0.5 last, multiply by 1/sqrt(2).
ValueId erf_gelu(Builder& b, ValueId x, int form) {
  ValueId u = form == 2 ? b.op("Mul", {b.scalar("rs2", 0.70710677f), x})
                        : b.op("Div", {x, b.scalar("s2", 1.4142135f)});
  ValueId s = b.op("Add", {b.op("Erf", {u}), b.scalar("one", 1.0f)});
  if (form == 0) return b.op("Mul", {b.op("Mul", {x, b.scalar("half", 0.5f)}), s});
  if (form == 1) return b.op("Mul", {b.op("Mul", {x, s}), b.scalar("half", 0.5f)});
  return b.op("Mul", {x, b.op("Mul", {b.scalar("half", 0.5f), s})});
}

TEST(PassRecognizeComposites, ErfGelu) {
  for (int form = 0; form < 3; ++form) {
    SCOPED_TRACE(form);
    Builder b;
    ValueId x = b.input("x", {4, 16});
    b.g.add_output(b.op("Relu", {erf_gelu(b, b.op("Neg", {x}), form)}));
    Graph g = run_and_compare(b, "RecognizeComposites");
    EXPECT_EQ(g.nodes().size(), 3u);
    EXPECT_EQ(only(g, "Gelu").attrs.get_string("approximate", "none"), "none");
  }
}

// An fp16 graph's GELU, widened by PromoteHalf: its constants are fp16 values (1/sqrt2 is
// 0.70703125, sqrt2 1.4140625: 1.1e-4 from the fp32 ones, past the 1e-4 an fp32 constant gets).
// A constant as far off that is no half's value stays a chain.
TEST(PassRecognizeComposites, ErfGeluWithTheConstantsOfAHalfGraph) {
  for (bool half_valued : {true, false}) {
    SCOPED_TRACE(half_valued);
    const float s2 = half_valued ? float(Float16(1.4142135f)) : 1.41436f;
    ASSERT_GT(std::fabs(s2 - 1.4142135f), 1e-4f * 1.4142135f);
    Builder b;
    ValueId x = b.input("x", {4, 16});
    ValueId s =
        b.op("Add", {b.op("Erf", {b.op("Div", {x, b.scalar("s2", s2)})}), b.scalar("one", 1.0f)});
    b.g.add_output(b.op("Mul", {b.op("Mul", {x, b.scalar("half", 0.5f)}), s}));
    // The fused Gelu uses the exact constant: within the half's rounding of the chain.
    Graph g = run_and_compare(b, "RecognizeComposites", 1e-3);
    EXPECT_EQ(count(g, "Gelu"), half_valued ? 1 : 0);
  }
}

TEST(PassRecognizeComposites, TanhGeluAsGpt2WritesIt) {
  for (bool pow : {true, false}) {
    SCOPED_TRACE(pow);
    Builder b;
    ValueId x = b.input("x", {3, 10});
    // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
    ValueId cube =
        pow ? b.op("Pow", {x, b.scalar("three", 3.0f)}) : b.op("Mul", {b.op("Mul", {x, x}), x});
    ValueId inner = b.op("Add", {x, b.op("Mul", {b.scalar("k", 0.044715f), cube})});
    ValueId t = b.op("Tanh", {b.op("Mul", {b.scalar("c", 0.7978845608f), inner})});
    ValueId s = b.op("Add", {b.scalar("one", 1.0f), t});
    b.g.add_output(b.op("Mul", {b.op("Mul", {b.scalar("half", 0.5f), x}), s}));
    Graph g = run_and_compare(b, "RecognizeComposites");
    EXPECT_EQ(g.nodes().size(), 1u);
    EXPECT_EQ(only(g, "Gelu").attrs.get_string("approximate"), "tanh");
  }
}

TEST(PassRecognizeComposites, TanhGeluAsBloomWritesIt) {
  // x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x))): the argument factored, the
  // square scaled on either side.
  for (bool scale_first : {true, false}) {
    SCOPED_TRACE(scale_first);
    Builder b;
    ValueId x = b.input("x", {3, 10});
    ValueId q = scale_first ? b.op("Mul", {b.op("Mul", {x, b.scalar("k", 0.044715f)}), x})
                            : b.op("Mul", {b.scalar("k", 0.044715f), b.op("Mul", {x, x})});
    ValueId arg = b.op("Mul", {b.op("Mul", {b.scalar("c", 0.79788456f), x}),
                               b.op("Add", {b.scalar("one", 1.0f), q})});
    ValueId s = b.op("Add", {b.scalar("one2", 1.0f), b.op("Tanh", {arg})});
    b.g.add_output(b.op("Mul", {b.op("Mul", {x, b.scalar("half", 0.5f)}), s}));
    Graph g = run_and_compare(b, "RecognizeComposites");
    EXPECT_EQ(g.nodes().size(), 1u);
    EXPECT_EQ(only(g, "Gelu").attrs.get_string("approximate"), "tanh");
  }
}

TEST(PassRecognizeComposites, ConstantsAsConstantNodes) {
  Builder b;
  ValueId x = b.input("x", {4, 16});
  // torchscript: Div(x, Constant), Erf, Add(., Constant), Mul(x, .), Mul(., Constant 0.5).
  ValueId e = b.op("Erf", {b.op("Div", {x, b.constant_node(1.4142135f)})});
  ValueId s = b.op("Add", {e, b.constant_node(1.0f)});
  ValueId y = b.op("Mul", {b.op("Mul", {x, s}), b.constant_node(0.5f)});
  b.g.add_output(b.op("Pow", {y, b.constant_node(2.0f)}));
  Graph g = run_and_compare(b, "RecognizeComposites");
  EXPECT_EQ(count(g, "Gelu"), 1);
  EXPECT_EQ(count(g, "Erf"), 0);
  g = run_and_compare(b, "CanonicalizeOps", 0);
  EXPECT_EQ(count(g, "Pow"), 0);
}

TEST(PassRecognizeComposites, GeluWithASharedIntermediateStays) {
  Builder b;
  ValueId x = b.input("x", {4, 16});
  ValueId u = b.op("Div", {x, b.scalar("s2", 1.4142135f)});
  ValueId e = b.op("Erf", {u});
  ValueId s = b.op("Add", {e, b.scalar("one", 1.0f)});
  b.g.add_output(b.op("Mul", {b.op("Mul", {x, b.scalar("half", 0.5f)}), s}));
  b.g.add_output(e);  // a second reader of the Erf
  Graph g = run_and_compare(b, "RecognizeComposites");
  EXPECT_EQ(count(g, "Gelu"), 0);
  EXPECT_EQ(g.nodes().size(), 5u);
}

// LayerNorm over the last axis as written by hand: Pow 2 and Div, or Mul(d, d) and Reciprocal.
ValueId layer_norm(Builder& b, ValueId x, bool pow_form, bool axes_input,
                   ValueId* d_out = nullptr) {
  auto mean = [&](ValueId v) {
    if (axes_input)
      return b.op("ReduceMean", {v, b.constant("axes", Tensor::from_vector<int64_t>({-1}, {1}))});
    return b.op("ReduceMean", {v}, b.attrs({{"axes", std::vector<int64_t>{-1}}}), 13);
  };
  ValueId d = b.op("Sub", {x, mean(x)});
  if (d_out) *d_out = d;
  ValueId sq = pow_form ? b.op("Pow", {d, b.scalar("two", 2.0f)}) : b.op("Mul", {d, d});
  ValueId sd = b.op("Sqrt", {b.op("Add", {mean(sq), b.scalar("eps", 1e-5f)})});
  ValueId n = pow_form ? b.op("Div", {d, sd}) : b.op("Mul", {b.op("Reciprocal", {sd}), d});
  ValueId scaled = b.op("Mul", {b.random("gamma", {12}), n});
  return b.op("Add", {scaled, b.random("beta", {12})});
}

TEST(PassRecognizeComposites, LayerNorm) {
  for (int k = 0; k < 4; ++k) {
    SCOPED_TRACE(k);
    Builder b;
    ValueId x = b.input("x", {2, 3, 12});
    b.g.add_output(layer_norm(b, x, k & 1, k & 2));
    Graph g = run_and_compare(b, "RecognizeComposites");
    EXPECT_EQ(g.nodes().size(), 1u);
    const Node& ln = only(g, "LayerNormalization");
    EXPECT_EQ(ln.inputs.size(), 3u);
    EXPECT_NEAR(ln.attrs.get_float("epsilon"), 1e-5, 1e-9);
  }
}

TEST(PassRecognizeComposites, LayerNormAsTorchDynamoExportsItWithoutEps) {
  // onnxscript's optimizer drops `+ 1e-12`: ReduceMean, Sub, Pow, ReduceMean, Sqrt, Div, Mul, Add.
  Builder b;
  ValueId x = b.input("x", {2, 7, 16});
  ValueId axes = b.constant("axes", Tensor::from_vector<int64_t>({-1}, {1}));
  ValueId d = b.op("Sub", {x, b.op("ReduceMean", {x, axes})});
  ValueId var = b.op("ReduceMean", {b.op("Pow", {d, b.scalar("two", 2.0f)}), axes});
  ValueId n = b.op("Div", {d, b.op("Sqrt", {var})});
  b.g.add_output(b.op("Add", {b.op("Mul", {b.random("w", {16}), n}), b.random("b", {16})}));
  Graph g = run_and_compare(b, "RecognizeComposites");
  EXPECT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(only(g, "LayerNormalization").attrs.get_float("epsilon"), 0.0);
}

TEST(PassRecognizeComposites, LayerNormWithASharedIntermediateStays) {
  Builder b;
  ValueId x = b.input("x", {2, 12});
  ValueId d;
  b.g.add_output(layer_norm(b, x, true, false, &d));
  b.g.add_output(d);
  Graph g = run_and_compare(b, "RecognizeComposites");
  EXPECT_EQ(count(g, "LayerNormalization"), 0);
  // What is left is still d / sqrt(mean(d^2) + eps) * gamma on the shared d: an RMSNorm of d.
  EXPECT_EQ(count(g, "RMSNormalization"), 1);
  EXPECT_EQ(only(g, "RMSNormalization").inputs[0], d);
  EXPECT_EQ(count(g, "Sub"), 1);
}

TEST(PassRecognizeComposites, RmsNormAsLlamaWritesIt) {
  Builder b;
  ValueId x = b.input("x", {2, 5, 12});
  // x * rsqrt(mean(x^2) + eps) * w, rsqrt exported as Reciprocal(Sqrt(.)).
  ValueId ms = b.op("ReduceMean", {b.op("Pow", {x, b.scalar("two", 2.0f)}),
                                   b.constant("axes", Tensor::from_vector<int64_t>({-1}, {1}))});
  ValueId r = b.op("Reciprocal", {b.op("Sqrt", {b.op("Add", {ms, b.scalar("eps", 1e-6f)})})});
  b.g.add_output(b.op("Mul", {b.random("w", {12}), b.op("Mul", {x, r})}));
  Graph g = run_and_compare(b, "RecognizeComposites");
  EXPECT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(only(g, "RMSNormalization").inputs.size(), 2u);
}

// ---- together ----

TEST(PassLevelOne, ConvBatchNormGeluLayerNormThroughThePipeline) {
  Builder b;
  ValueId x = b.input("x", {2, 3, 6, 12});
  ValueId y = b.op("Conv", {x, b.random("w", {4, 3, 3, 3}), b.random("b", {4})},
                   b.attrs({{"pads", std::vector<int64_t>{1, 1, 1, 1}}}));
  ValueId z = erf_gelu(b, batch_norm(b, y, 4), 0);
  b.g.add_output(layer_norm(b, z, true, false));
  Graph g = run_and_compare(b, "FoldBatchNorm");  // types, and a first check
  infer_types(b.g);
  const Graph before = b.g;
  std::vector<PassReport> report;
  Graph after = run_passes(b.g, {.level = 1}, &report);
  for (uint32_t seed : {3u, 4u}) compare(before, after, b.inputs(seed), 1e-5);
  std::vector<std::string> ops;
  for (const Node& n : after.nodes()) ops.push_back(n.op);
  EXPECT_EQ(ops, (std::vector<std::string>{"Conv", "Gelu", "LayerNormalization"}));
  // Running the pipeline again changes nothing.
  Graph again = run_passes(after, {.level = 1});
  EXPECT_EQ(print(again), print(after));
}

TEST(PassLevelOne, GeluWithHalvingAsDivByTwo) {
  // (x / 2) * (1 + erf(x / sqrt 2)): CanonicalizeOps makes the halving a Mul by 0.5 first.
  Builder b;
  ValueId x = b.input("x", {5, 6});
  ValueId s = b.op(
      "Add", {b.op("Erf", {b.op("Div", {x, b.scalar("s2", 1.4142135f)})}), b.scalar("one", 1.0f)});
  b.g.add_output(b.op("Mul", {b.op("Div", {x, b.scalar("two", 2.0f)}), s}));
  infer_types(b.g);
  const Graph before = b.g;
  Graph after = run_passes(b.g, {.level = 1});
  compare(before, after, b.inputs(9), 1e-5);
  EXPECT_EQ(after.nodes().size(), 1u);
  EXPECT_EQ(count(after, "Gelu"), 1);
}

TEST(PassLevelOne, OddGraphsAreLeftAlone) {
  Builder b;
  ValueId x = b.input("x", {3, 4});
  // Exponent not a scalar; divisor with a zero; Sub of a non-constant; Gemm fed by a 3-D
  // transpose's input.
  ValueId p = b.op("Pow", {x, b.constant("e", Tensor::from_vector<float>({2, 2, 2, 2}, {4}))});
  ValueId d = b.op("Div", {p, b.constant("q", Tensor::from_vector<float>({2, 0, 4, 8}, {4}))});
  ValueId s = b.op("Sub", {d, x});
  ValueId t = b.op("Transpose", {s}, perm10());
  ValueId bn = b.op("BatchNormalization",
                    {b.op("MatMul", {t, b.random("w", {3, 5})}), b.random("g", {5}),
                     b.random("bb", {5}), b.random("m", {5}), b.random("v", {5}, 0.5f, 1.0f)});
  b.g.add_output(bn);
  infer_types(b.g);
  const Graph before = b.g;
  Graph after = run_passes(b.g, {.level = 3, .only = {"CanonicalizeOps", "RecognizeComposites"}});
  EXPECT_EQ(print(after), print(before));
  // The transpose folds into a Gemm and the BN into that Gemm: both still agree with the original.
  Graph folded = run_passes(after, {.only = {"FoldTransposeIntoGemm", "FoldBatchNorm"}});
  EXPECT_EQ(count(folded, "Transpose"), 0);
  EXPECT_EQ(count(folded, "BatchNormalization"), 0);
  compare(before, folded, b.inputs(5), 1e-5);
}

// ---- RecognizeAttention ----

Tensor bool_tensor(const Dims& shape, uint32_t seed) {
  Tensor t = Tensor::empty(DType::kBool, shape);
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<bool>()[i] = rng() % 5 != 0;
  return t;
}

Tensor lower_triangle(int64_t n) {
  Tensor t = Tensor::empty(DType::kBool, {n, n});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) t.data<bool>()[i * n + j] = j <= i;
  return t;
}

Attributes perm(std::vector<int64_t> p) {
  Attributes a;
  a.set("perm", std::move(p));
  return a;
}

// torch's SDPA decomposition (the PyTorch frontend's): q @ k^T * scale, Where(mask, s, -inf),
// Softmax, the guard for fully masked rows, @ v.
ValueId sdpa(Builder& b, ValueId q, ValueId k, ValueId v, ValueId mask, float scale) {
  ValueId s = b.op("Mul", {b.op("MatMul", {q, b.op("Transpose", {k}, perm({0, 1, 3, 2}))}),
                           b.scalar("scale", scale)});
  const ValueId neg_inf = b.scalar("neg_inf", -INFINITY);
  if (mask != kNoValue) s = b.op("Where", {mask, s, neg_inf});
  ValueId p = b.op("Softmax", {s}, b.attrs({{"axis", int64_t{-1}}}));
  ValueId top = b.op("ReduceMax", {s, b.constant("axes", Tensor::from_vector<int64_t>({-1}, {1}))},
                     b.attrs({{"keepdims", int64_t{1}}}));
  ValueId alive = b.op("Not", {b.op("Equal", {top, neg_inf})});
  p = b.op("Where", {alive, p, b.scalar("zero", 0.0f)});
  return b.op("MatMul", {p, v});
}

TEST(PassRecognizeAttention, TorchSdpaWithBooleanMaskAndGuard) {
  for (bool with_mask : {true, false}) {
    SCOPED_TRACE(with_mask);
    Builder b;
    ValueId q = b.input("q", {2, 3, 5, 8}), k = b.input("k", {2, 3, 7, 8}),
            v = b.input("v", {2, 3, 7, 4});
    ValueId mask = with_mask ? b.constant("mask", bool_tensor({2, 1, 5, 7}, 3)) : kNoValue;
    b.g.add_output(sdpa(b, q, k, v, mask, 0.35f));
    Graph g = run_and_compare(b, "RecognizeAttention");
    ASSERT_EQ(g.nodes().size(), 1u) << print(g);
    const Node& a = only(g, "Attention");
    EXPECT_EQ(a.inputs[1], k);  // the transpose back is the identity: no node
    EXPECT_EQ(a.inputs.size(), with_mask ? 4u : 3u);
    EXPECT_NEAR(a.attrs.get_float("scale"), 0.35, 1e-7);
  }
}

// AutoMixedPrecision (which runs first) marks both MatMuls "bf16": the Attention that replaces
// them computes in bf16 too, and equals the marked graph to bf16's rounding of the probabilities
// (the one operand the MatMuls' form rounds after normalizing); an Attention made directly (the
// PyTorch frontend's SDPA) is marked by AutoMixedPrecision itself. MatMuls that disagree give a
// float32 Attention.
TEST(PassRecognizeAttention, ReducedPrecisionProductsGiveAReducedPrecisionAttention) {
  Builder b;
  ValueId q = b.input("q", {1, 2, 9, 16}), k = b.input("k", {1, 2, 11, 16}),
          v = b.input("v", {1, 2, 11, 8});
  b.g.add_output(sdpa(b, q, k, v, kNoValue, 0.25f));
  infer_types(b.g);
  const Graph marked =
      run_passes(b.g, {.level = 1, .auto_mixed_precision = true, .only = {"AutoMixedPrecision"}});
  EXPECT_EQ(count(marked, "MatMul"), 2);
  for (const Node& n : marked.nodes())
    if (n.op == "MatMul") {
      EXPECT_EQ(n.attrs.get_string("precision"), "bf16");
    }
  const Graph g = run_passes(marked, {.level = 2, .only = {"RecognizeAttention"}});
  ASSERT_EQ(g.nodes().size(), 1u) << print(g);
  EXPECT_EQ(only(g, "Attention").attrs.get_string("precision"), "bf16");
  for (uint32_t seed : {7u, 8u}) compare(marked, g, b.inputs(seed), 1e-2);
  // The Attention alone (no MatMuls to recognize): AutoMixedPrecision marks it.
  const Graph direct =
      run_passes(g, {.level = 1, .auto_mixed_precision = true, .only = {"AutoMixedPrecision"}});
  EXPECT_EQ(only(direct, "Attention").attrs.get_string("precision"), "bf16");
  // One MatMul marked, the other not: float32.
  Graph mixed = b.g;
  for (Node& n : mixed.mutable_nodes())
    if (n.op == "MatMul") {
      n.attrs.set("precision", std::string("bf16"));
      break;
    }
  const Graph f32 = run_passes(mixed, {.level = 2, .only = {"RecognizeAttention"}});
  ASSERT_EQ(f32.nodes().size(), 1u) << print(f32);
  EXPECT_FALSE(only(f32, "Attention").attrs.has("precision"));
  // Both split into bf16x3 products (MatMulPrecision "high"), which Attention has no form of:
  // float32 (more exact), equal to the split MatMuls within their ~1e-5.
  Graph split = b.g;
  for (Node& n : split.mutable_nodes())
    if (n.op == "MatMul") n.attrs.set("precision", std::string("bf16x3"));
  const Graph exact = run_passes(split, {.level = 2, .only = {"RecognizeAttention"}});
  ASSERT_EQ(exact.nodes().size(), 1u) << print(exact);
  EXPECT_FALSE(only(exact, "Attention").attrs.has("precision"));
  compare(split, exact, b.inputs(9), 1e-4);
}

// ---- MatMulPrecision ----

// torch.set_float32_matmul_precision's meaning for float32 MatMul and Gemm: "high" splits them
// into bf16x3 products where this machine has AMX-BF16 (not with AMX turned off), except a
// product of fewer than 16 rows by its static shape; "medium" rounds them to bf16 where it has
// AVX512_BF16; "highest" (the default) leaves the pipeline without the pass; products already
// marked (AutoMixedPrecision) and other ops stay as they are; an unknown value is a ValueError.
TEST(PassMatMulPrecision, FollowsTorchsFloat32MatmulPrecision) {
  Builder b;
  const ValueId x = b.input("x", {2, 16, 64}), row = b.input("row", {1, 64});
  const ValueId w = b.random("w", {64, 32});
  const ValueId big = b.op("MatMul", {x, w});  // 32 rows: A's batch folds into M
  const ValueId gemm =
      b.op("Gemm",
           {b.op("Reshape", {x, b.constant("s", Tensor::from_vector<int64_t>({32, 64}, {2}))}), w});
  const ValueId one = b.op("MatMul", {row, w});  // one row: stays fp32 under "high"
  const ValueId kept = b.op("MatMul", {row, w}, b.attrs({{"precision", std::string("f16")}}));
  for (ValueId v : {big, gemm, one, kept}) b.g.add_output(v);
  infer_types(b.g);
  auto precisions = [](const Graph& g) {
    std::vector<std::string> p;
    for (const Node& n : g.nodes())
      if (n.op == "MatMul" || n.op == "Gemm") p.push_back(n.attrs.get_string("precision", "-"));
    return p;
  };
  const DeviceInfo& d = device_info();
  const bool amx = d.isa == "avx512" && d.amx_bf16 && d.avx512_bf16 && !ext_turned_off("amx_bf16");
  const bool bf16 = d.isa == "avx512" && d.avx512_bf16 && !ext_turned_off("avx512_bf16");
  std::vector<PassReport> report;
  const Graph high = run_passes(
      b.g, {.level = 1, .matmul_precision = "high", .only = {"MatMulPrecision"}}, &report);
  using V = std::vector<std::string>;
  EXPECT_EQ(precisions(high),
            amx ? V({"bf16x3", "bf16x3", "-", "f16"}) : V({"-", "-", "-", "f16"}));
  EXPECT_EQ(report.front().fired.count(amx ? "MatMulPrecision/bf16x3 MatMul/Gemm"
                                           : "MatMulPrecision/float32: no AMX-BF16"),
            1u);
  if (amx) {  // and the split products are within ~1e-5 of fp32 ones on the reference
    compare(b.g, high, b.inputs(3), 1e-4);
    cpu::ExtScope off(cpu::Ext::kAmxBf16);
    EXPECT_EQ(precisions(run_passes(
                  b.g, {.level = 1, .matmul_precision = "high", .only = {"MatMulPrecision"}})),
              V({"-", "-", "-", "f16"}));
  }
  const Graph medium =
      run_passes(b.g, {.level = 1, .matmul_precision = "medium", .only = {"MatMulPrecision"}});
  EXPECT_EQ(precisions(medium),
            bf16 ? V({"bf16", "bf16", "bf16", "f16"}) : V({"-", "-", "-", "f16"}));
  report.clear();
  run_passes(b.g, {.level = 1, .matmul_precision = "high"}, &report);  // first in the pipeline
  EXPECT_EQ(report.front().name, "MatMulPrecision");
  report.clear();
  run_passes(b.g, {.level = 1}, &report);
  for (const PassReport& r : report) EXPECT_NE(r.name, "MatMulPrecision");
  EXPECT_THROW(run_passes(b.g, {.level = 1, .matmul_precision = "fast"}), ValueError);
}

// ---- ConvPrecision ----

// torch.backends.mkldnn.conv.fp32_precision's meaning for float32 Conv ("tf32" and "bf16" are
// "high" and "medium" here): "high" splits convs of 128 or more output and input channels into
// bf16x3 products where this machine has AMX-BF16 (not with AMX turned off), "medium" rounds
// every dense or grouped conv to bf16 where it has AVX512_BF16; depthwise convs, convs already
// marked and MatMuls stay as they are; the pass runs first, only when asked; an unknown value is
// a ValueError.
TEST(PassConvPrecision, FollowsTorchsConvFp32Precision) {
  Builder b;
  const ValueId x = b.input("x", {1, 128, 6, 6});
  const ValueId pad1 = b.op("Conv", {x, b.random("w1", {128, 128, 3, 3}, -0.05f, 0.05f)},
                            b.attrs({{"pads", Dims{1, 1, 1, 1}}}));              // large: split
  const ValueId narrow = b.op("Conv", {pad1, b.random("w2", {64, 128, 1, 1})});  // 64 outputs
  const ValueId grouped = b.op("Conv", {pad1, b.random("w3", {256, 64, 1, 1})},
                               b.attrs({{"group", int64_t{2}}}));  // 128 per group, depth 64
  const ValueId depthwise = b.op("Conv", {pad1, b.random("w4", {128, 1, 3, 3})},
                                 b.attrs({{"group", int64_t{128}}, {"pads", Dims{1, 1, 1, 1}}}));
  const ValueId kept = b.op("Conv", {x, b.random("w5", {128, 128, 1, 1})},
                            b.attrs({{"precision", std::string("f16")}}));
  const ValueId mm = b.op("MatMul", {b.input("a", {32, 64}), b.random("wm", {64, 32})});
  for (ValueId v : {narrow, grouped, depthwise, kept, mm}) b.g.add_output(v);
  infer_types(b.g);
  auto precisions = [](const Graph& g) {
    std::vector<std::string> p;
    for (const Node& n : g.nodes())
      if (n.op == "Conv" || n.op == "MatMul") p.push_back(n.attrs.get_string("precision", "-"));
    return p;
  };
  const DeviceInfo& d = device_info();
  const bool amx = d.isa == "avx512" && d.amx_bf16 && d.avx512_bf16 && !ext_turned_off("amx_bf16");
  const bool bf16 = d.isa == "avx512" && d.avx512_bf16 && !ext_turned_off("avx512_bf16");
  using V = std::vector<std::string>;
  std::vector<PassReport> report;
  const Graph high =
      run_passes(b.g, {.level = 1, .conv_precision = "high", .only = {"ConvPrecision"}}, &report);
  EXPECT_EQ(precisions(high),
            amx ? V({"bf16x3", "-", "-", "-", "f16", "-"}) : V({"-", "-", "-", "-", "f16", "-"}));
  EXPECT_EQ(report.front().fired.count(amx ? "ConvPrecision/bf16x3 Conv"
                                           : "ConvPrecision/float32: no AMX-BF16"),
            1u);
  if (amx) {  // the split products are within ~1e-5 of the fp32 ones on the reference
    EXPECT_EQ(report.front().fired.at("ConvPrecision/float32: fewer than 128 channels"), 2);
    compare(b.g, high, b.inputs(3), 1e-4);
    {  // PTO_CONV_SPLIT_ALL=1 (the per-layer A/B) drops the channel rule
      testing::EnvGuard all("PTO_CONV_SPLIT_ALL", "1");
      EXPECT_EQ(precisions(run_passes(
                    b.g, {.level = 1, .conv_precision = "high", .only = {"ConvPrecision"}})),
                V({"bf16x3", "bf16x3", "bf16x3", "-", "f16", "-"}));
    }
    {
      testing::EnvGuard bad("PTO_CONV_SPLIT_ALL", "yes");
      EXPECT_THROW(
          run_passes(b.g, {.level = 1, .conv_precision = "high", .only = {"ConvPrecision"}}),
          ValueError);
    }
    cpu::ExtScope off(cpu::Ext::kAmxBf16);
    EXPECT_EQ(precisions(run_passes(
                  b.g, {.level = 1, .conv_precision = "high", .only = {"ConvPrecision"}})),
              V({"-", "-", "-", "-", "f16", "-"}));
  }
  const Graph medium =
      run_passes(b.g, {.level = 1, .conv_precision = "medium", .only = {"ConvPrecision"}});
  EXPECT_EQ(precisions(medium), bf16 ? V({"bf16", "bf16", "bf16", "-", "f16", "-"})
                                     : V({"-", "-", "-", "-", "f16", "-"}));
  report.clear();
  run_passes(b.g, {.level = 1, .matmul_precision = "high", .conv_precision = "medium"}, &report);
  ASSERT_GE(report.size(), 2u);
  EXPECT_EQ(report[0].name, "MatMulPrecision");
  EXPECT_EQ(report[1].name, "ConvPrecision");
  report.clear();
  run_passes(b.g, {.level = 1}, &report);
  for (const PassReport& r : report) EXPECT_NE(r.name, "ConvPrecision");
  EXPECT_THROW(run_passes(b.g, {.level = 1, .conv_precision = "tf32"}), ValueError);
}

TEST(PassRecognizeAttention, BertEagerFormWithHeadSplitAndAdditiveMask) {
  // scores = q @ k.permute(0, 2, 3, 1) / 8 + mask; softmax; @ v — K's head split is inside the
  // transpose, so a [0, 2, 1, 3] transpose is inserted for K.
  Builder b;
  ValueId q = b.input("q", {1, 2, 6, 8}), kx = b.input("kx", {1, 6, 2, 8}),
          v = b.input("v", {1, 2, 6, 8}), mask = b.input("mask", {1, 1, 1, 6});
  ValueId s = b.op("MatMul", {q, b.op("Transpose", {kx}, perm({0, 2, 3, 1}))});
  s = b.op("Add", {b.op("Div", {s, b.scalar("d", 8.0f)}), mask});
  b.g.add_output(b.op("MatMul", {b.op("Softmax", {s}, b.attrs({{"axis", int64_t{3}}})), v}));
  Graph g = run_and_compare(b, "RecognizeAttention");
  ASSERT_EQ(g.nodes().size(), 2u) << print(g);
  EXPECT_EQ(only(g, "Transpose").attrs.get_ints("perm"), (std::vector<int64_t>{0, 2, 1, 3}));
  EXPECT_NEAR(only(g, "Attention").attrs.get_float("scale"), 0.125, 1e-9);
}

TEST(PassRecognizeAttention, ScaledOperandsCausalConstantAndMaskedFill) {
  // The ONNX exporters' form: q * c and k^T * c (sqrt-scaling both), a causal Where with a
  // lower-triangular constant, then masked_fill(mask, -inf) as Where(mask, -inf, s).
  Builder b;
  ValueId q = b.input("q", {2, 2, 6, 4}), k = b.input("k", {2, 2, 6, 4}),
          v = b.input("v", {2, 2, 6, 4});
  const ValueId c = b.scalar("c", 0.70710678f), neg_inf = b.scalar("neg_inf", -INFINITY);
  ValueId kt = b.op("Mul", {b.op("Transpose", {k}, perm({0, 1, 3, 2})), c});
  ValueId s = b.op("MatMul", {b.op("Mul", {q, c}), kt});
  s = b.op("Where", {b.constant("causal", lower_triangle(6)), s, neg_inf});
  // Key 0 stays visible: a row with every key hidden is NaN unguarded and 0 in Attention.
  Tensor hidden = bool_tensor({2, 1, 1, 6}, 5);
  hidden.data<bool>()[0] = hidden.data<bool>()[6] = false;
  s = b.op("Where", {b.constant("hidden", hidden), neg_inf, s});
  b.g.add_output(b.op("MatMul", {b.op("Softmax", {s}, b.attrs({{"axis", int64_t{-1}}})), v}));
  Graph g = run_and_compare(b, "RecognizeAttention");
  const Node& a = only(g, "Attention");
  EXPECT_EQ(a.attrs.get_int("is_causal", 0), 1);
  EXPECT_NEAR(a.attrs.get_float("scale"), 0.5, 1e-6);
  EXPECT_EQ(count(g, "Not"), 1);  // masked_fill's mask is "true = hidden"
  EXPECT_EQ(g.nodes().size(), 2u) << print(g);
}

TEST(PassRecognizeAttention, OnnxExporterFormWithNanGuardAndReshapedKeyTranspose) {
  // torch.onnx.export (dynamo) writes GPT-2's attention as: K^T by Reshape to 3-D, Transpose,
  // Reshape back; sqrt-scaling of both operands; an additive mask; Where(IsNaN(p), 0, p).
  Builder b;
  ValueId q = b.input("q", {1, 3, 6, 8}), k = b.input("k", {1, 3, 6, 8}),
          v = b.input("v", {1, 3, 6, 8}), mask = b.input("mask", {1, 1, 6, 6});
  const ValueId c = b.scalar("c", 0.59460356f);  // 8^-0.25
  ValueId k3 = b.op("Reshape", {k, b.constant("s3", Tensor::from_vector<int64_t>({3, 6, 8}, {3}))});
  ValueId kt = b.op("Reshape", {b.op("Transpose", {k3}, perm({0, 2, 1})),
                                b.constant("s4", Tensor::from_vector<int64_t>({1, 3, 8, 6}, {4}))});
  ValueId s = b.op("MatMul", {b.op("Mul", {q, c}), b.op("Mul", {kt, c})});
  ValueId p = b.op("Softmax", {b.op("Add", {s, mask})}, b.attrs({{"axis", int64_t{-1}}}));
  p = b.op("Where", {b.op("IsNaN", {p}), b.scalar("zero", 0.0f), p});
  b.g.add_output(b.op("MatMul", {p, v}));
  Graph g = run_and_compare(b, "RecognizeAttention");
  EXPECT_EQ(count(g, "Attention"), 1) << print(g);
  EXPECT_EQ(count(g, "Softmax") + count(g, "IsNaN") + count(g, "Where") + count(g, "Mul"), 0);
  EXPECT_NEAR(only(g, "Attention").attrs.get_float("scale"), 1 / std::sqrt(8.0), 1e-6);
}

// Llama's repeat_kv: K and V of 2 heads each repeated for 3 query heads, Reshape(Expand(
// Unsqueeze(x, 2), [b, 2, 3, s, d]), [b, 6, s, d]): Attention reads the 2 heads (no copies). With
// V repeated differently from K (or not at all) the copies stay.
TEST(PassRecognizeAttention, GroupedKeyValueHeadsAreReadWithoutTheirCopies) {
  for (bool same_groups : {true, false}) {
    SCOPED_TRACE(same_groups);
    Builder b;
    ValueId q = b.input("q", {1, 6, 5, 8}), k = b.input("k", {1, 2, 7, 8}),
            v = b.input("v", {1, same_groups ? 2 : 6, 7, 4});
    auto repeat = [&](ValueId x, int64_t d) {
      ValueId u = b.op("Unsqueeze", {x, b.constant("ax", Tensor::from_vector<int64_t>({2}, {1}))});
      ValueId e = b.op("Expand",
                       {u, b.constant("rep", Tensor::from_vector<int64_t>({1, 2, 3, 7, d}, {5}))});
      return b.op("Reshape",
                  {e, b.constant("to", Tensor::from_vector<int64_t>({1, 6, 7, d}, {4}))});
    };
    b.g.add_output(sdpa(b, q, repeat(k, 8), same_groups ? repeat(v, 4) : v, kNoValue, 0.35f));
    Graph g = run_and_compare(b, "RecognizeAttention");
    const Node& a = only(g, "Attention");
    EXPECT_EQ(a.inputs[1] == k, same_groups) << print(g);
    EXPECT_EQ(a.inputs[2] == v, true);
    EXPECT_EQ(count(g, "Expand"), same_groups ? 0 : 1) << print(g);
  }
}

// A decode step of a grouped-query decoder as torch.compile hands it over: the K and V caches
// are inputs of their own symbolic lengths (Dynamo names past keys and past values apart), the
// step's key and value are concatenated to them (lengths (s_k+1) and (s_v+1), which no shape
// inference can prove equal), and repeat_kv reshapes to [1, 6, -1, d]. Attention reads the caches'
// 2 heads, whatever their length (it raises where K and V disagree, as the MatMul would). An Expand
// that also grows the batch is not a repeat: its copies stay.
TEST(PassRecognizeAttention, DecodeStepOverConcatenatedCachesOfUnnamedLength) {
  for (bool grows_batch : {false, true}) {
    SCOPED_TRACE(grows_batch);
    Builder b;
    const int64_t batch = grows_batch ? 2 : 1;
    auto cache = [&](const char* name, const char* len, int64_t d) {
      b.input_shapes.push_back({1, 2, 6, d});
      return b.g.add_input(name, {DType::kF32, Shape{1, 2, Dim::sym(len), d}});
    };
    ValueId past_k = cache("past_k", "s_k", 8), past_v = cache("past_v", "s_v", 4);
    ValueId q = b.input("q", {batch, 6, 1, 8}), k = b.input("k", {1, 2, 1, 8}),
            v = b.input("v", {1, 2, 1, 4});
    const Attributes on_length = b.attrs({{"axis", int64_t{2}}});
    ValueId keys = b.op("Concat", {past_k, k}, on_length),
            values = b.op("Concat", {past_v, v}, on_length);
    auto repeat = [&](ValueId x, int64_t d) {
      ValueId u = b.op("Unsqueeze", {x, b.constant("ax", Tensor::from_vector<int64_t>({2}, {1}))});
      ValueId e = b.op(
          "Expand", {u, b.constant("rep", Tensor::from_vector<int64_t>({batch, 1, 3, 1, 1}, {5}))});
      return b.op("Reshape",
                  {e, b.constant("to", Tensor::from_vector<int64_t>({batch, 6, -1, d}, {4}))});
    };
    b.g.add_output(sdpa(b, q, repeat(keys, 8), repeat(values, 4), kNoValue, 0.35f));
    b.g.add_output(keys);  // the updated caches are outputs too
    b.g.add_output(values);
    Graph g = run_and_compare(b, "RecognizeAttention");
    if (grows_batch) {  // [2, 6, ?, d] from [1, 2, ?, d]: MatMul's batch broadcast, not grouping
      EXPECT_EQ(count(g, "Expand"), 2) << print(g);
      continue;
    }
    EXPECT_EQ(g.value(keys).type.str(), "f32[1, 2, (s_k+1), 8]");
    const Node& a = only(g, "Attention");
    EXPECT_EQ(a.inputs[1], keys) << print(g);
    EXPECT_EQ(a.inputs[2], values);
    EXPECT_EQ(count(g, "Expand") + count(g, "Softmax") + count(g, "MatMul"), 0) << print(g);
    // Caches of different lengths: the MatMul raised; Attention raises too, compiled or not.
    std::vector<Tensor> bad = b.inputs(9);
    bad[1] = random_f32({1, 2, 5, 4}, 3);
    EXPECT_ANY_THROW(reference::run(b.g, bad));
    EXPECT_ANY_THROW(reference::run(g, bad));
    EXPECT_ANY_THROW(compile(b.g).run(bad));
  }
}

// T5-style relative position bias added before the padding mask, (s + bias) + pad (the bias on
// the left of its Add): one Attention with the mask bias + pad, [1, 2, 5, 7] + [2, 1, 1, 7]
// summed once. A third float mask has no place: that form stays as it was.
TEST(PassRecognizeAttention, TwoAddedMasksBecomeTheirSum) {
  for (bool third : {false, true}) {
    SCOPED_TRACE(third);
    Builder b;
    ValueId q = b.input("q", {2, 2, 5, 8}), k = b.input("k", {2, 2, 7, 8}),
            v = b.input("v", {2, 2, 7, 4}), bias = b.input("bias", {1, 2, 5, 7});
    Tensor pad = Tensor::empty(DType::kF32, {2, 1, 1, 7});
    for (int64_t j = 0; j < 14; ++j) pad.data<float>()[j] = j >= 12 ? -INFINITY : 0.0f;
    const ValueId pad_mask = b.constant("pad", pad);
    ValueId s = b.op("Mul", {b.op("MatMul", {q, b.op("Transpose", {k}, perm({0, 1, 3, 2}))}),
                             b.scalar("scale", 0.35f)});
    s = b.op("Add", {bias, s});
    if (third) s = b.op("Add", {s, b.random("more", {5, 7})});
    s = b.op("Add", {s, pad_mask});
    b.g.add_output(b.op("MatMul", {b.op("Softmax", {s}, b.attrs({{"axis", int64_t{-1}}})), v}));
    Graph g = run_and_compare(b, "RecognizeAttention");
    if (third) {
      EXPECT_EQ(count(g, "Attention"), 0) << print(g);
      continue;
    }
    ASSERT_EQ(g.nodes().size(), 2u) << print(g);
    const Node& a = only(g, "Attention");
    ASSERT_EQ(a.inputs.size(), 4u);
    const Node& sum = only(g, "Add");
    EXPECT_EQ(sum.inputs, (std::vector<ValueId>{bias, pad_mask}));
    EXPECT_EQ(a.inputs[3], sum.outputs[0]);
    EXPECT_EQ(g.value(sum.outputs[0]).type.str(), "f32[2, 2, 5, 7]");
    EXPECT_NEAR(a.attrs.get_float("scale"), 0.35, 1e-7);
  }
}

// A mask whose key axis is not proved the scores' length: one of 1 (the same for every key), or
// a decode step's padding mask of its own unnamed length. Attention gets mask_broadcast, so the
// mask broadcasts as in the Add (ONNX's Attention would pad a shorter one as masked), and a mask
// that does not broadcast raises, compiled or not, as the Add did.
TEST(PassRecognizeAttention, MaskOfAnUnprovedKeyLengthBroadcastsAsTheAdd) {
  for (bool decode : {false, true}) {
    SCOPED_TRACE(decode);
    Builder b;
    ValueId q = b.input("q", {2, 2, 5, 8}), k = b.input("k", {2, 2, 7, 8}),
            v = b.input("v", {2, 2, 7, 4}), mask;
    if (decode) {
      b.input_shapes.push_back({2, 1, 1, 7});
      mask = b.g.add_input("mask", {DType::kF32, Shape{2, 1, 1, Dim::sym("keys")}});
      k = b.op("Concat", {k, b.input("k_new", {2, 2, 1, 8})}, b.attrs({{"axis", int64_t{2}}}));
      v = b.op("Concat", {v, b.input("v_new", {2, 2, 1, 4})}, b.attrs({{"axis", int64_t{2}}}));
      b.input_shapes[3] = {2, 1, 1, 8};  // the mask covers the cache and the new key
    } else {
      mask = b.input("mask", {2, 1, 1, 1});
    }
    ValueId s = b.op("Mul", {b.op("MatMul", {q, b.op("Transpose", {k}, perm({0, 1, 3, 2}))}),
                             b.scalar("scale", 0.35f)});
    s = b.op("Add", {s, mask});
    b.g.add_output(b.op("MatMul", {b.op("Softmax", {s}, b.attrs({{"axis", int64_t{-1}}})), v}));
    Graph g = run_and_compare(b, "RecognizeAttention");
    const Node& a = only(g, "Attention");
    EXPECT_EQ(a.attrs.get_int("mask_broadcast", 0), 1) << print(g);
    EXPECT_EQ(a.inputs[3], mask);
    const std::vector<Tensor> in = b.inputs(11);  // compiled: the CPU kernel, or its reference
    const std::vector<Tensor> want = reference::run(b.g, in), got = compile(b.g).run(in);
    for (int64_t i = 0; i < want[0].numel(); ++i)
      ASSERT_NEAR(got[0].item_as_double(i), want[0].item_as_double(i), 1e-5) << i;
    if (!decode) continue;
    std::vector<Tensor> bad = b.inputs(9);
    bad[3] = random_f32({2, 1, 1, 3}, 4);  // 3 keys' mask against 8 keys
    EXPECT_ANY_THROW(reference::run(b.g, bad));
    EXPECT_ANY_THROW(reference::run(g, bad));
    EXPECT_ANY_THROW(compile(b.g).run(bad));
  }
}

// Gemma-2's eager attention: scores * scale, a soft cap c tanh(s / c), then the mask added on
// the right. Which operand of the Add is the scores is found through the Tanh (it was taken for
// the mask before): one Attention with the scale, the soft cap and the mask.
TEST(PassRecognizeAttention, SoftCappedScoresWithTheMaskAddedAfter) {
  Builder b;
  ValueId q = b.input("q", {1, 4, 3, 8}), k = b.input("k", {1, 4, 6, 8}),
          v = b.input("v", {1, 4, 6, 8}), mask = b.input("mask", {1, 1, 3, 6});
  const ValueId cap = b.scalar("cap", 50.0f);
  ValueId s = b.op("Mul", {b.op("MatMul", {q, b.op("Transpose", {k}, perm({0, 1, 3, 2}))}),
                           b.scalar("scale", 0.0625f)});
  s = b.op("Mul", {b.op("Tanh", {b.op("Div", {s, cap})}), cap});
  s = b.op("Add", {s, mask});
  b.g.add_output(b.op("MatMul", {b.op("Softmax", {s}, b.attrs({{"axis", int64_t{3}}})), v}));
  Graph g = run_and_compare(b, "RecognizeAttention");
  ASSERT_EQ(g.nodes().size(), 1u) << print(g);
  const Node& a = only(g, "Attention");
  EXPECT_NEAR(a.attrs.get_float("softcap"), 50.0, 1e-9);
  EXPECT_NEAR(a.attrs.get_float("scale"), 0.0625, 1e-9);
  EXPECT_EQ(a.inputs[3], mask);
}

TEST(PassRecognizeAttention, FormsThatAreNotAttentionStay) {
  auto build = [](int variant) {
    Builder b;
    const bool q_broadcast = variant == 0, k_broadcast = variant == 1;
    ValueId q = b.input("q", {q_broadcast ? 1 : 2, 2, 5, 4});
    ValueId k = b.input("k", {2, k_broadcast ? 1 : 2, 5, 4}), v = b.input("v", {2, 2, 5, 4});
    ValueId s = b.op("MatMul", {q, b.op("Transpose", {k}, perm({0, 1, 3, 2}))});
    if (variant == 3) b.g.add_output(s);  // the scores are an output
    if (variant == 4) s = b.op("Mul", {s, b.random("per_head", {2, 1, 1})});  // not a scalar
    const int64_t axis = variant == 5 ? 2 : -1;  // softmax over queries
    b.g.add_output(b.op("MatMul", {b.op("Softmax", {s}, b.attrs({{"axis", axis}})), v}));
    return b;
  };
  for (int variant : {0, 1, 3, 4, 5}) {
    SCOPED_TRACE(variant);
    Builder b = build(variant);
    infer_types(b.g);
    const Graph before = b.g;
    Graph after = run_passes(b.g, {.only = {"RecognizeAttention"}});
    EXPECT_EQ(count(after, "Attention"), 0) << print(after);
    compare(before, after, b.inputs(3), 0);
  }
}

// ---- RecognizeRotaryEmbedding ----

// transformers' apply_rotary_pos_emb on x = [b, 3, 5, 8]: x * cos + rotate_half(x) * sin, the
// caches built as transformers builds them, Unsqueeze(Cos(Concat(f, f)), 1) from angles f
// [b, 5, 4] (or [5, 8] without the Unsqueeze); `variant` spells the same thing in other orders.
struct RotaryForm {
  int variant = 0;     // 0: as written; 1: Add and Mul operands swapped; 2: 2-D caches
  bool proved = true;  // the caches' halves come from Concat(f, f)
  int64_t split = 4;   // where rotate_half cuts the head (4 = the half)
};

Builder rotary_graph(const RotaryForm& form) {
  Builder b;
  const bool flat = form.variant == 2;
  const Dims angles = flat ? Dims{5, 4} : Dims{1, 5, 4};
  ValueId x = b.input("x", {1, 3, 5, 8}), f = b.input("f", angles);
  ValueId g = form.proved ? f : b.input("g", angles);  // another table: halves not equal
  const int64_t last = flat ? 1 : 2;
  auto cache = [&](const char* op) {
    ValueId c = b.op(op, {b.op("Concat", {f, g}, b.attrs({{"axis", last}}))});
    if (flat) return c;
    return b.op("Unsqueeze", {c, b.constant("one", Tensor::from_vector<int64_t>({1}, {1}))});
  };
  const ValueId cos = cache("Cos"), sin = cache("Sin");
  auto slice = [&](int64_t lo, int64_t hi) {
    auto ints = [&](int64_t v) { return b.constant("i", Tensor::from_vector<int64_t>({v}, {1})); };
    return b.op("Slice", {x, ints(lo), ints(hi), ints(-1), ints(1)});
  };
  ValueId rotated =
      b.op("Concat", {b.op("Neg", {slice(form.split, INT64_MAX)}), slice(0, form.split)},
           b.attrs({{"axis", int64_t{-1}}}));
  const bool swap = form.variant == 1;
  ValueId a = swap ? b.op("Mul", {cos, x}) : b.op("Mul", {x, cos});
  ValueId r = swap ? b.op("Mul", {sin, rotated}) : b.op("Mul", {rotated, sin});
  b.g.add_output(swap ? b.op("Add", {r, a}) : b.op("Add", {a, r}));
  return b;
}

TEST(PassRecognizeRotaryEmbedding, RotateHalfWithEqualHalvesBecomesOneOp) {
  for (int variant : {0, 1, 2}) {
    SCOPED_TRACE(variant);
    Builder b = rotary_graph({.variant = variant});
    Graph g = run_and_compare(b, "RecognizeRotaryEmbedding", 1e-6);
    const Node& rope = only(g, "RotaryEmbedding");
    EXPECT_EQ(rope.inputs[0], g.inputs()[0]) << print(g);
    EXPECT_EQ(count(g, "Neg") + count(g, "Mul") + count(g, "Add"), 0) << print(g);
    EXPECT_EQ(count(g, "Slice"), 2);  // each cache's first half, as [1, 5, 4]
    for (ValueId c : {rope.inputs[1], rope.inputs[2]})
      EXPECT_EQ(g.value(c).type.str(), "f32[1, 5, 4]");
  }
}

TEST(PassRecognizeRotaryEmbedding, FormsThatAreNotRotationsStay) {
  // Caches whose halves are not proved equal (a Concat of two tables), and a rotate_half cut
  // elsewhere than the middle: both compute something RotaryEmbedding does not.
  for (const RotaryForm form : {RotaryForm{.proved = false}, RotaryForm{.split = 3}}) {
    SCOPED_TRACE(form.split);
    Builder b = rotary_graph(form);
    Graph g = run_and_compare(b, "RecognizeRotaryEmbedding", 0);
    EXPECT_EQ(count(g, "RotaryEmbedding"), 0) << print(g);
  }
}

}  // namespace
}  // namespace pto
