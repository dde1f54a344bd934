// The blocked-channel layout (level 3): AssignLayouts as Before/Expected pairs in the text form,
// every rewritten graph run through the reference interpreter against the original graph, and
// the CPU kernels of ReorderToBlocked, ConvBlocked and ReorderFromBlocked against the reference
// Conv over random shapes on every ISA (the rewritten graph compiled at level 0, node by node,
// and at level 2, where ConvBlocked takes a residual and an activation).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>

#include "backend/cpu/isa/isa.h"
#include "passes/assign_layouts.h"
#include "pto/executable.h"
#include "pto/parallel.h"
#include "pto/reference.h"

namespace pto {
namespace {

Tensor random_tensor(const Dims& shape, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tensor t = Tensor::empty(DType::kF32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

std::vector<Tensor> random_inputs(const Graph& g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Tensor> in;
  for (ValueId v : g.inputs()) in.push_back(random_tensor(to_dims(*g.value(v).type.shape), rng));
  return in;
}

// Every element within tol of the reference's, relative to the largest reference magnitude; NaN
// where the reference has NaN.
void expect_close(const Tensor& got, const Tensor& want, const std::string& what,
                  double tol = 1e-5) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  double scale = 1e-30;
  for (int64_t i = 0; i < want.numel(); ++i)
    scale = std::max(scale, std::fabs(want.item_as_double(i)));
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = got.item_as_double(i), b = want.item_as_double(i);
    if (std::isnan(a) && std::isnan(b)) continue;
    if (!(std::fabs(a - b) <= tol * scale) && bad++ < 3)
      ADD_FAILURE() << what << ": element " << i << " is " << a << ", reference " << b;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.numel() << " elements differ";
}

Graph parse(const std::string& body) {
  return parse_graph("graph g (opset 18)\n" + body);
}

Graph assign(const Graph& g, int block, std::map<std::string, int>* fired = nullptr,
             bool cost_rule = true) {
  PassContext ctx;
  Graph out = passes::assign_layouts(g, ctx, block, cost_rule);
  verify(out);
  infer_types(out);
  if (fired) *fired = ctx.fired;
  return out;
}

// The original and the rewritten graph (AssignLayouts with `block`) on the reference interpreter,
// same random inputs. Constants the text form left without data (zeros) get random values
// first, so the weights the pass reorders are not trivially zero.
void expect_same_results(const Graph& graph, int block, bool cost_rule = true) {
  Graph before = graph;
  std::mt19937 rng(13);
  for (const auto& [v, t] : graph.initializers()) {
    bool zero = t.dtype() == DType::kF32;
    for (int64_t i = 0; zero && i < t.numel(); ++i) zero = t.data<float>()[i] == 0.0f;
    if (zero) before.set_initializer(v, random_tensor(t.shape(), rng));
  }
  const Graph after = assign(before, block, nullptr, cost_rule);
  const std::vector<Tensor> in = random_inputs(before, 11);
  const std::vector<Tensor> a = reference::run(before, in), b = reference::run(after, in);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) expect_close(b[i], a[i], cat("output ", i));
}

// AssignLayouts with `block` on `before` must give `expected` and compute the same outputs.
std::map<std::string, int> expect_layouts(const std::string& before, const std::string& expected,
                                          int block) {
  const Graph g = parse(before);
  std::map<std::string, int> fired;
  const Graph out = assign(g, block, &fired, false);  // the structure, not the cost rule
  const Graph want = parse(expected);
  std::string why;
  EXPECT_TRUE(structurally_equal(out, want, &why)) << why << "\ngot:\n"
                                                   << print(out) << "expected:\n"
                                                   << print(want);
  expect_same_results(g, block, false);
  return fired;
}

int count_ops(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node& node : g.nodes()) n += node.op == op;
  return n;
}

// ---------------------------------------------------------------- the pass

// Conv -> Relu -> Conv: one reorder in, one out; weights reordered to [OC/c, IC/c, 1, 1, c, c]
// (wb[i, o] = W[o, i]), the 3 output channels of the second conv padded to two blocks of 2.
TEST(LayoutPass, ConvReluConvGetsOneReorderInAndOneOut) {
  const std::map<std::string, int> fired = expect_layouts(
      "  input  %x: f32[1, 2, 5, 4]\n"
      "  const  %w1: f32[2, 2, 1, 1] = [1, 2, 3, 4]\n"
      "  const  %b1: f32[2] = [0.5, -0.5]\n"
      "  const  %w2: f32[3, 2, 1, 1] = [1, 0, 0, 1, 1, 1]\n"
      "  %y = Conv(%x, %w1, %b1)\n"
      "  %r = Relu(%y)\n"
      "  %z = Conv(%r, %w2)\n"
      "  return %z\n",
      "  input  %x: f32[1, 2, 5, 4]\n"
      "  const  %w1b: f32[1, 1, 1, 1, 2, 2] = [1, 3, 2, 4]\n"
      "  const  %b1b: f32[2] = [0.5, -0.5]\n"
      "  const  %w2b: f32[2, 1, 1, 1, 2, 2] = [1, 0, 0, 1, 1, 0, 1, 0]\n"
      "  %xb = pto.ReorderToBlocked(%x) {block=2}\n"
      "  %yb = pto.ConvBlocked(%xb, %w1b, %b1b) {channels=2, kernel_shape=[1, 1]}\n"
      "  %rb = Relu(%yb)\n"
      "  %zb = pto.ConvBlocked(%rb, %w2b) {channels=2, kernel_shape=[1, 1]}\n"
      "  %z = pto.ReorderFromBlocked(%zb) {channels=3}\n"
      "  return %z\n",
      2);
  EXPECT_EQ(fired.at("AssignLayouts/ConvBlocked"), 2);
  EXPECT_EQ(fired.at("AssignLayouts/ReorderToBlocked"), 1);
  EXPECT_EQ(fired.at("AssignLayouts/ReorderFromBlocked"), 1);
}

// A per-channel constant of an Add is reordered to [1, C/c, 1, 1, c] (zero-padded); a scalar
// Mul operand stays as it is.
TEST(LayoutPass, PerChannelConstantIsReorderedAtCompileTime) {
  expect_layouts(
      "  input  %x: f32[2, 2, 3, 3]\n"
      "  const  %w: f32[3, 2, 1, 1] = [1, 2, 3, 4, 5, 6]\n"
      "  const  %c: f32[1, 3, 1, 1] = [10, 20, 30]\n"
      "  const  %s: f32[] = [0.5]\n"
      "  %y = Conv(%x, %w)\n"
      "  %a = Add(%y, %c)\n"
      "  %m = Mul(%s, %a)\n"
      "  return %m\n",
      "  input  %x: f32[2, 2, 3, 3]\n"
      "  const  %wb: f32[2, 1, 1, 1, 2, 2] = [1, 3, 2, 4, 5, 0, 6, 0]\n"
      "  const  %cb: f32[1, 2, 1, 1, 2] = [10, 20, 30, 0]\n"
      "  const  %s: f32[] = [0.5]\n"
      "  %xb = pto.ReorderToBlocked(%x) {block=2}\n"
      "  %yb = pto.ConvBlocked(%xb, %wb) {channels=2, kernel_shape=[1, 1]}\n"
      "  %ab = Add(%yb, %cb)\n"
      "  %mb = Mul(%s, %ab)\n"
      "  %m = pto.ReorderFromBlocked(%mb) {channels=3}\n"
      "  return %m\n",
      2);
}

// A BatchNormalization FoldBatchNorm could not fold (it follows the Relu) keeps the region
// blocked: x * s + t per channel as a depthwise 1x1 ConvBlocked, weights s = gamma / sqrt(var +
// eps) = [1, 2, 1] and bias t = beta - mean * s = [-0.5, -5, -3], both zero-padded to two blocks
// of 2; the second conv reads it blocked.
TEST(LayoutPass, BatchNormOfBlockedValueIsDepthwiseConv) {
  const std::map<std::string, int> fired = expect_layouts(
      "  input  %x: f32[1, 2, 3, 3]\n"
      "  const  %w1: f32[3, 2, 1, 1] = [1, 2, 3, 4, 5, 6]\n"
      "  const  %g: f32[3] = [2, 6, 1]\n"
      "  const  %be: f32[3] = [0.5, -1, 0]\n"
      "  const  %mu: f32[3] = [1, 2, 3]\n"
      "  const  %v: f32[3] = [4, 9, 1]\n"
      "  const  %w2: f32[2, 3, 1, 1] = [1, 0, 1, 0, 1, 1]\n"
      "  %y = Conv(%x, %w1)\n"
      "  %r = Relu(%y)\n"
      "  %n = BatchNormalization(%r, %g, %be, %mu, %v) {epsilon=0.0}\n"
      "  %z = Conv(%n, %w2)\n"
      "  return %z\n",
      "  input  %x: f32[1, 2, 3, 3]\n"
      "  const  %w1b: f32[2, 1, 1, 1, 2, 2] = [1, 3, 2, 4, 5, 0, 6, 0]\n"
      "  const  %s: f32[2, 1, 1, 1, 2] = [1, 2, 1, 0]\n"
      "  const  %t: f32[4] = [-0.5, -5, -3, 0]\n"
      "  const  %w2b: f32[1, 2, 1, 1, 2, 2] = [1, 0, 0, 1, 1, 1, 0, 0]\n"
      "  %xb = pto.ReorderToBlocked(%x) {block=2}\n"
      "  %yb = pto.ConvBlocked(%xb, %w1b) {channels=2, kernel_shape=[1, 1]}\n"
      "  %rb = Relu(%yb)\n"
      "  %nb = pto.ConvBlocked(%rb, %s, %t) {channels=3, group=3, kernel_shape=[1, 1]}\n"
      "  %zb = pto.ConvBlocked(%nb, %w2b) {channels=3, kernel_shape=[1, 1]}\n"
      "  %z = pto.ReorderFromBlocked(%zb) {channels=2}\n"
      "  return %z\n",
      2);
  EXPECT_EQ(fired.at("AssignLayouts/Propagate/ConvBlocked"), 1);
  EXPECT_EQ(fired.at("AssignLayouts/ConvBlocked"), 2);
}

// A value read by a blocked reader (the second conv), an NCHW reader (Flatten) and the caller
// (a graph output) is reordered back once, and the output keeps its name.
TEST(LayoutPass, ValueWithNchwAndBlockedReadersIsReorderedOnce) {
  const Graph g = parse(
      "  input  %x: f32[1, 4, 6, 6]\n"
      "  const  %w1: f32[4, 4, 3, 3]\n"
      "  const  %w2: f32[4, 4, 1, 1]\n"
      "  %y = Conv(%x, %w1) {pads=[1, 1, 1, 1]}\n"
      "  %z = Conv(%y, %w2)\n"
      "  %p = Flatten(%y)\n"
      "  return %y, %z, %p\n");
  const Graph out = assign(g, 4);
  EXPECT_EQ(count_ops(out, "ConvBlocked"), 2);
  EXPECT_EQ(count_ops(out, "ReorderToBlocked"), 1);
  EXPECT_EQ(count_ops(out, "ReorderFromBlocked"), 2) << print(out);  // y once, z once
  EXPECT_EQ(out.value(out.outputs()[0]).name, "y");
  const Node& pool = out.nodes()[static_cast<size_t>(out.value(out.outputs()[2]).producer)];
  EXPECT_EQ(out.nodes()[static_cast<size_t>(out.value(pool.inputs[0]).producer)].op,
            "ReorderFromBlocked");
  expect_same_results(g, 4);
}

// Concat on channels stays blocked when every input's channels fill whole blocks, and becomes a
// GatherChannels of the blocked inputs otherwise; a residual Add of two blocked values stays
// blocked.
TEST(LayoutPass, ConcatOfPartsStaysBlockedAsAGather) {
  const std::string text =
      "  input  %x: f32[1, 4, 5, 5]\n"
      "  const  %w1: f32[C, 4, 3, 3]\n"
      "  const  %w2: f32[C, 4, 1, 1]\n"
      "  %a = Conv(%x, %w1) {pads=[1, 1, 1, 1]}\n"
      "  %b = Conv(%x, %w2)\n"
      "  %s = Add(%a, %b)\n"
      "  %c = Concat(%a, %s) {axis=-3}\n"
      "  %r = Relu(%c)\n"
      "  return %r\n";
  auto with_c = [&](int c) {
    std::string t = text;
    for (size_t p; (p = t.find("[C,")) != std::string::npos;) t.replace(p, 3, cat("[", c, ","));
    return parse(t);
  };
  const Graph whole = with_c(8), part = with_c(6);
  const Graph a = assign(whole, 4, nullptr, false), b = assign(part, 4, nullptr, false);
  EXPECT_EQ(count_ops(a, "ReorderFromBlocked"), 1) << print(a);  // only the output
  // Parts of 6 channels in blocks of 4: the Concat becomes a GatherChannels of the blocked parts
  // (their lanes permuted), so no reorder either.
  EXPECT_EQ(count_ops(b, "ReorderFromBlocked"), 1) << print(b);
  EXPECT_EQ(count_ops(a, "GatherChannels"), 0);
  EXPECT_EQ(count_ops(b, "GatherChannels"), 1);
  EXPECT_EQ(count_ops(a, "ReorderToBlocked"), 1);
  for (const Node& n : a.nodes())
    if (n.op == "Concat") {
      EXPECT_EQ(n.attrs.get_int("axis"), 1);
    }
  expect_same_results(whole, 4, false);
  expect_same_results(part, 4, false);
}

// Squeeze-excitation stays blocked: the spatial mean becomes ReduceMean over {2, 3} of the 5-D
// value, the small convs read it blocked, and the Mul broadcasts the [N, C/c, 1, 1, c] scale.
// A ReduceMean that drops the axes (no keepdims: x.mean([2, 3])) reads it blocked too, keeping
// them, and a Flatten of its reordered [N, C, 1, 1] result gives [N, C].
TEST(LayoutPass, SqueezeExcitationStaysBlocked) {
  const Graph g = parse(
      "  input  %x: f32[2, 8, 6, 5]\n"
      "  const  %w: f32[8, 8, 3, 3]\n"
      "  const  %w1: f32[4, 8, 1, 1]\n"
      "  const  %w2: f32[8, 4, 1, 1]\n"
      "  const  %axes: i64[2] = [-1, -2]\n"
      "  %y = Conv(%x, %w) {pads=[1, 1, 1, 1]}\n"
      "  %p = GlobalAveragePool(%y)\n"
      "  %q = Relu(%p)\n"
      "  %r = Conv(%q, %w1)\n"
      "  %t = Relu(%r)\n"
      "  %u = Conv(%t, %w2)\n"
      "  %s = Sigmoid(%u)\n"
      "  %z = Mul(%y, %s)\n"
      "  %m = ReduceMean(%z, %axes)\n"
      "  %f = ReduceMean(%z, %axes) {keepdims=0}\n"
      "  return %z, %m, %f\n");
  const Graph out = assign(g, 4);
  EXPECT_EQ(count_ops(out, "ConvBlocked"), 3) << print(out);
  EXPECT_EQ(count_ops(out, "ReorderToBlocked"), 1);
  EXPECT_EQ(count_ops(out, "ReorderFromBlocked"), 3);  // %z (an output), %m and %f's mean
  EXPECT_EQ(count_ops(out, "GlobalAveragePool"), 0);
  EXPECT_EQ(count_ops(out, "ReduceMean"), 3);
  EXPECT_EQ(count_ops(out, "Flatten"), 1);
  for (const Node& n : out.nodes())
    if (n.op == "ReduceMean") {
      EXPECT_EQ(out.value(n.inputs[0]).type.shape->size(), 5u) << print(out);
    }
  expect_same_results(g, 4);
  // The same graph on the CPU kernels, at level 2 (fused), against the reference.
  const std::vector<Tensor> in = random_inputs(g, 5);
  const std::vector<Tensor> want = reference::run(g, in);
  Executable exe = compile(assign(g, 8), {.level = 2});
  const std::vector<Tensor> got = exe.run(in);
  for (size_t i = 0; i < want.size(); ++i) expect_close(got[i], want[i], cat("output ", i));
}

// Convs the blocked kernel does not run (grouped, 1-D, weights computed at run time) and graphs
// without vectors (block < 2) are left as they are.
TEST(LayoutPass, LeavesWhatItCannotBlock) {
  const std::string text =
      "  input  %x: f32[1, 4, 5, 5]\n"
      "  input  %wi: f32[4, 4, 1, 1]\n"
      "  input  %v: f32[1, 4, 9]\n"
      "  const  %wg: f32[4, 2, 3, 3]\n"
      "  const  %w1: f32[4, 4, 3]\n"
      "  %a = Conv(%x, %wg) {group=2}\n"
      "  %b = Conv(%a, %wi)\n"
      "  %c = Conv(%v, %w1)\n"
      "  return %b, %c\n";
  const Graph g = parse(text);
  std::string why;
  EXPECT_TRUE(structurally_equal(assign(g, 4), g, &why)) << why;
  const Graph conv = parse(
      "  input  %x: f32[1, 4, 5, 5]\n"
      "  const  %w: f32[4, 4, 1, 1]\n"
      "  %y = Conv(%x, %w)\n"
      "  return %y\n");
  EXPECT_TRUE(structurally_equal(assign(conv, 0), conv, &why)) << why;
  EXPECT_TRUE(structurally_equal(assign(conv, 1), conv, &why)) << why;
  // A mean that drops H and W is split (mean keeping them + Flatten) only for a blocked graph.
  const Graph mean = parse(
      "  input  %x: f32[1, 4, 5, 5]\n"
      "  const  %axes: i64[2] = [2, 3]\n"
      "  %m = ReduceMean(%x, %axes) {keepdims=0}\n"
      "  return %m\n");
  EXPECT_TRUE(structurally_equal(assign(mean, 4), mean, &why)) << why;
}

// The cost rule: a conv that would start a blocked region with mostly empty channel blocks
// (24 channels in blocks of 16) stays NCHW; the same conv inside a blocked region is blocked.
TEST(LayoutPass, CostRuleKeepsPoorlyFilledRegionStartsNchw) {
  const Graph g = parse(
      "  input  %x: f32[1, 16, 4, 4]\n"
      "  const  %w1: f32[32, 16, 1, 1]\n"
      "  const  %w2: f32[24, 32, 1, 1]\n"
      "  const  %w3: f32[24, 16, 1, 1]\n"
      "  %a = Conv(%x, %w1)\n"
      "  %b = Conv(%a, %w2)\n"
      "  %c = Conv(%x, %w3)\n"
      "  return %b, %c\n");
  const Graph out = assign(g, 16);
  EXPECT_EQ(count_ops(out, "ConvBlocked"), 2) << print(out);  // %a, and %b inside the region
  EXPECT_EQ(count_ops(out, "Conv"), 1);                       // %c would start one: NCHW
  EXPECT_EQ(out.nodes()[static_cast<size_t>(out.value(out.outputs()[1]).producer)].op, "Conv");
  expect_same_results(g, 16);
}

// The cost rule: a conv that would start a region whose blocked values reach no other blocked
// conv (a stem read by MaxPool, read by nothing else) stays NCHW; when blocked convs read its
// Relu and its pool, it is blocked, and so are the pool and both convs.
TEST(LayoutPass, CostRuleKeepsIsolatedConvsNchw) {
  const std::string text =
      "  input  %x: f32[1, 3, 16, 16]\n"
      "  const  %w: f32[16, 3, 3, 3]\n"
      "  const  %w2: f32[16, 16, 3, 3]\n"
      "  %y = Conv(%x, %w) {pads=[1, 1, 1, 1]}\n"
      "  %r = Relu(%y)\n"
      "  %p = MaxPool(%r) {kernel_shape=[2, 2], strides=[2, 2]}\n";
  const Graph alone = parse(text + "  return %p\n");
  std::string why;
  EXPECT_TRUE(structurally_equal(assign(alone, 16), alone, &why)) << why;
  const Graph chained = parse(text +
                              "  %z = Conv(%p, %w2) {pads=[1, 1, 1, 1]}\n"
                              "  %q = Conv(%r, %w2) {pads=[1, 1, 1, 1]}\n"
                              "  return %z, %q\n");
  const Graph out = assign(chained, 16);
  EXPECT_EQ(count_ops(out, "ConvBlocked"), 3) << print(out);
  // None: the stem (3 channels, fewer than a block) reads the NCHW input as it is.
  EXPECT_EQ(count_ops(out, "ReorderToBlocked"), 0) << print(out);
  expect_same_results(chained, 16);
}

// MaxPool and AveragePool of a blocked value stay blocked: the same window over H and W with a
// unit window on the channel lanes (pads, strides, dilations, ceil_mode and count_include_pad
// kept), 6 channels in blocks of 4 (padded lanes pooled too, never read).
TEST(LayoutPass, PoolingStaysBlocked) {
  expect_layouts(
      "  input  %x: f32[1, 6, 7, 7]\n"
      "  const  %w: f32[6, 6, 1, 1]\n"
      "  %y = Conv(%x, %w)\n"
      "  %p = MaxPool(%y) {kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], "
      "dilations=[1, 2]}\n"
      "  %q = AveragePool(%p) {kernel_shape=[2, 2], ceil_mode=1, count_include_pad=1, "
      "pads=[0, 1, 1, 0]}\n"
      "  return %q\n",
      "  input  %x: f32[1, 6, 7, 7]\n"
      "  const  %w_blocked: f32[2, 2, 1, 1, 4, 4]\n"
      "  %x_blocked = pto.ReorderToBlocked(%x) {block=4}\n"
      "  %y_blocked = pto.ConvBlocked(%x_blocked, %w_blocked) {channels=6, "
      "kernel_shape=[1, 1]}\n"
      "  %p_blocked = MaxPool(%y_blocked) {kernel_shape=[3, 3, 1], strides=[2, 2, 1], "
      "pads=[1, 1, 0, 1, 1, 0], dilations=[1, 2, 1]}\n"
      "  %q_blocked = AveragePool(%p_blocked) {kernel_shape=[2, 2, 1], ceil_mode=1, "
      "count_include_pad=1, pads=[0, 1, 0, 1, 0, 0]}\n"
      "  %q = pto.ReorderFromBlocked(%q_blocked) {channels=6}\n"
      "  return %q\n",
      4);
}

// A YOLOv8 C2f block on an input of symbolic height and width: the stride-2 conv's output size
// is unknown ("?"), so only the graph's structure proves that SiLU's x * sigmoid(x), the residual
// Add and the Concat combine values of one size. Everything stays blocked, the Split on
// channels too (parts of whole blocks, split in blocks); the results match the reference on
// inputs of several sizes, and on the CPU kernels at level 2 (fused) with 1 and 2 threads.
TEST(LayoutPass, DynamicPlaneC2fBlockStaysBlocked) {
  const std::string text =
      "  input  %x: f32[batch, 8, height, width]\n"
      "  const  %w0: f32[16, 8, 3, 3]\n"
      "  const  %b0: f32[16]\n"
      "  const  %w1: f32[8, 8, 3, 3]\n"
      "  const  %w2: f32[12, 24, 1, 1]\n"
      "  const  %parts: i64[2] = [8, 8]\n"
      "  %y = Conv(%x, %w0, %b0) {pads=[1, 1, 1, 1], strides=[2, 2]}\n"
      "  %ys = Sigmoid(%y)\n"
      "  %a = Mul(%y, %ys)\n"
      "  %s0, %s1 = Split(%a, %parts) {axis=1}\n"
      "  %m = Conv(%s1, %w1) {pads=[1, 1, 1, 1]}\n"
      "  %ms = Sigmoid(%m)\n"
      "  %mm = Mul(%m, %ms)\n"
      "  %r = Add(%s1, %mm)\n"
      "  %c = Concat(%s0, %s1, %r) {axis=1}\n"
      "  %z = Conv(%c, %w2)\n"
      "  return %z\n";
  Graph g = parse(text);
  std::mt19937 rng(21);
  const Graph parsed = g;
  for (const auto& [v, t] : parsed.initializers())
    if (t.dtype() == DType::kF32) g.set_initializer(v, random_tensor(t.shape(), rng));
  std::map<std::string, int> fired;
  const Graph out = assign(g, 4, &fired);
  EXPECT_EQ(count_ops(out, "ConvBlocked"), 3) << print(out);
  EXPECT_EQ(count_ops(out, "ReorderToBlocked"), 1) << print(out);
  EXPECT_EQ(count_ops(out, "ReorderFromBlocked"), 1) << print(out);  // the output only
  EXPECT_EQ(fired["AssignLayouts/Propagate/Split"], 1);
  EXPECT_EQ(fired["AssignLayouts/Propagate/Add"], 1);
  EXPECT_EQ(fired["AssignLayouts/Propagate/Mul"], 2);
  for (const Node& n : out.nodes())
    if (n.op == "Split") {
      const Tensor* parts = out.initializer(n.inputs[1]);
      ASSERT_NE(parts, nullptr);
      EXPECT_EQ(parts->numel(), 2);
      EXPECT_EQ(parts->item_as_double(0), 2.0);  // 8 channels in blocks of 4
      EXPECT_EQ(n.attrs.get_int("axis"), 1);
    }
  const int saved = num_threads();
  for (const Dims& shape : {Dims{1, 8, 12, 12}, Dims{2, 8, 11, 9}, Dims{1, 8, 5, 20}}) {
    const std::vector<Tensor> in = {random_tensor(shape, rng)};
    const Tensor want = reference::run(g, in)[0];
    expect_close(reference::run(out, in)[0], want, cat("reference, ", dims_str(shape)));
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Executable exe = compile(assign(g, 8), {.level = 2});
      expect_close(exe.run(in)[0], want,
                   cat("cpu, ", dims_str(shape), ", ", threads, " thread(s)"));
    }
  }
  set_num_threads(saved);
}

// What the structure does not prove stays NCHW: two stride-2 convs of different inputs have
// sizes "?" that may differ, so their Add reads NCHW (and each conv, isolated, stays NCHW); a
// Split into parts that are not whole blocks (4 + 12 channels in blocks of 8) reads NCHW.
TEST(LayoutPass, DynamicPlanesOfUnprovenSizeStayNchw) {
  const Graph add = parse(
      "  input  %x: f32[1, 8, h1, w1]\n"
      "  input  %u: f32[1, 8, h2, w2]\n"
      "  const  %w: f32[8, 8, 3, 3]\n"
      "  %a = Conv(%x, %w) {pads=[1, 1, 1, 1], strides=[2, 2]}\n"
      "  %b = Conv(%u, %w) {pads=[1, 1, 1, 1], strides=[2, 2]}\n"
      "  %s = Add(%a, %b)\n"
      "  %r = Relu(%s)\n"
      "  %z = Conv(%r, %w) {pads=[1, 1, 1, 1]}\n"
      "  return %z\n");
  const Graph a = assign(add, 8);
  EXPECT_EQ(count_ops(a, "Add"), 1);
  for (const Node& n : a.nodes())
    if (n.op == "Add") {
      for (ValueId in : n.inputs)
        EXPECT_EQ(a.value(in).type.shape->size(), 4u) << print(a);  // NCHW operands
    }
  const Graph split = parse(
      "  input  %x: f32[1, 16, h, w]\n"
      "  const  %w: f32[16, 16, 3, 3]\n"
      "  const  %w1: f32[8, 12, 3, 3]\n"
      "  const  %parts: i64[2] = [4, 12]\n"
      "  %y = Conv(%x, %w) {pads=[1, 1, 1, 1], strides=[2, 2]}\n"
      "  %s0, %s1 = Split(%y, %parts) {axis=1}\n"
      "  %z = Conv(%s1, %w1) {pads=[1, 1, 1, 1]}\n"
      "  return %s0, %z\n");
  std::map<std::string, int> fired;
  const Graph b = assign(split, 8, &fired, false);
  EXPECT_EQ(fired.count("AssignLayouts/Propagate/Split"), 0u) << print(b);
  for (const Node& n : b.nodes())
    if (n.op == "Split") {
      EXPECT_EQ(b.value(n.inputs[0]).type.shape->size(), 4u) << print(b);
    }
  std::mt19937 rng(4);
  const std::vector<Tensor> in = {random_tensor({1, 16, 9, 10}, rng)};
  Graph sw = split;
  for (const auto& [v, t] : split.initializers())
    if (t.dtype() == DType::kF32) sw.set_initializer(v, random_tensor(t.shape(), rng));
  const std::vector<Tensor> want = reference::run(sw, in),
                            got = reference::run(assign(sw, 8, nullptr, false), in);
  for (size_t i = 0; i < want.size(); ++i) expect_close(got[i], want[i], cat("output ", i));
}

// A Resize of H and W by constant scales [1, 1, sh, sw] between blocked convs stays blocked, as
// the same Resize of the 5-D value with scales [1, 1, sh, sw, 1]: nearest (YOLO's 2x upsample,
// one pass of pixel copies on the CPU), linear and cubic; a Resize that scales channels reads
// NCHW. Against the reference, and on the CPU kernels at level 2 in blocks of 8 and 16 (copies
// of 8 and 16 lanes a pixel), 1 and 2 threads.
void expect_cpu_matches(const Graph& b, const std::vector<Tensor>& in, const Tensor& want,
                        const std::string& what, double tol = 1e-5);

TEST(LayoutPass, PlaneResizeStaysBlocked) {
  const std::vector<std::pair<std::string, std::string>> resizes = {
      {"[1, 1, 2, 2]",
       "{coordinate_transformation_mode=\"asymmetric\", mode=\"nearest\", "
       "nearest_mode=\"floor\"}"},
      {"[1, 1, 1.5, 2]", "{mode=\"linear\"}"},
      {"[1, 1, 2, 0.75]", "{mode=\"cubic\", coordinate_transformation_mode=\"align_corners\"}"},
      {"[1, 1, 3, 2]", "{mode=\"nearest\", nearest_mode=\"round_prefer_ceil\"}"},
  };
  std::mt19937 rng(17);
  const int saved = num_threads();
  for (const auto& [scales, attrs] : resizes) {
    SCOPED_TRACE(scales + " " + attrs);
    Graph g = parse(
        "  input  %x: f32[2, 12, 5, 7]\n"
        "  const  %w1: f32[24, 12, 1, 1]\n"
        "  const  %w2: f32[16, 24, 3, 3]\n"
        "  const  %s: f32[4] = " +
        scales +
        "\n"
        "  %a = Conv(%x, %w1)\n"
        "  %r = Resize(%a, _, %s) " +
        attrs +
        "\n"
        "  %z = Conv(%r, %w2) {pads=[1, 1, 1, 1]}\n"
        "  return %z\n");
    const Graph parsed = g;
    for (const auto& [v, t] : parsed.initializers())
      if (t.numel() > 4) g.set_initializer(v, random_tensor(t.shape(), rng));
    std::map<std::string, int> fired;
    const Graph out = assign(g, 8, &fired, false);  // the structure, not the cost rule
    EXPECT_EQ(fired["AssignLayouts/Propagate/Resize"], 1) << print(out);
    EXPECT_EQ(count_ops(out, "ReorderFromBlocked"), 1) << print(out);  // the output only
    const std::vector<Tensor> in = random_inputs(g, 3);
    const Tensor want = reference::run(g, in)[0];
    expect_close(reference::run(out, in)[0], want, "reference");
    for (int block : {8, 16}) {
      const Graph b = assign(g, block, nullptr, false);
      expect_cpu_matches(b, in, want, cat("level 0, block ", block));  // every node on the CPU
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        Executable exe = compile(b, {.level = 2});
        expect_close(exe.run(in)[0], want, cat("cpu, block ", block, ", ", threads, " thread(s)"));
      }
    }
  }
  set_num_threads(saved);
  // Channels scaled too: the Resize reads NCHW.
  const Graph c = parse(
      "  input  %x: f32[1, 8, 4, 4]\n"
      "  const  %w: f32[8, 8, 1, 1]\n"
      "  const  %s: f32[4] = [1, 2, 2, 2]\n"
      "  %a = Conv(%x, %w)\n"
      "  %r = Resize(%a, _, %s) {mode=\"nearest\"}\n"
      "  %z = Conv(%r, %w)\n"
      "  return %z\n");
  std::map<std::string, int> fired;
  assign(c, 8, &fired, false);
  EXPECT_EQ(fired.count("AssignLayouts/Propagate/Resize"), 0u);
}

TEST(LayoutPass, IsInTheLevel3PipelineOnly) {
  auto has = [](int level) {
    const std::vector<std::string> p = pipeline(level);
    return std::find(p.begin(), p.end(), "AssignLayouts") != p.end();
  };
  EXPECT_FALSE(has(1));
  EXPECT_FALSE(has(2));
  EXPECT_TRUE(has(3));
  // Last but one: FuseBlockedConvs joins the blocked convs it made.
  const std::vector<std::string> p3 = pipeline(3);
  ASSERT_GE(p3.size(), 2u);
  EXPECT_EQ(p3[p3.size() - 2], "AssignLayouts");
  EXPECT_EQ(p3.back(), "FuseBlockedConvs");
}

// ---------------------------------------------------------------- the CPU kernels

struct Case {
  int64_t n, c, h, w, m, k;
  int64_t stride = 1, pad = 0, dilation = 1;
  bool depthwise = false, bias = true;
  int64_t group = 1;  // groups of a general conv (depthwise sets its own)
};

// A Conv graph for the case (random weights), with a residual Add and a Relu after it when
// `epilogue` is set.
Graph conv_graph(const Case& t, bool epilogue, std::mt19937& rng) {
  Graph g;
  const int64_t m = t.depthwise ? t.c : t.m;
  const ValueId x = g.add_input("x", {DType::kF32, Shape{t.n, t.c, t.h, t.w}});
  const ValueId w =
      g.add_constant("w", random_tensor({m, t.depthwise ? 1 : t.c / t.group, t.k, t.k}, rng));
  std::vector<ValueId> ins = {x, w};
  if (t.bias) ins.push_back(g.add_constant("b", random_tensor({m}, rng)));
  Attributes a;
  a.set("strides", Dims{t.stride, t.stride});
  a.set("pads", Dims{t.pad, t.pad, t.pad, t.pad});
  a.set("dilations", Dims{t.dilation, t.dilation});
  if (t.depthwise) a.set("group", t.c);
  if (t.group > 1) a.set("group", t.group);
  ValueId y = g.add_value("y");
  g.add_node("Conv", ins, {y}, a, "conv");
  if (epilogue) {
    infer_types(g);
    const Dims yd = to_dims(*g.value(y).type.shape);
    const ValueId r = g.add_input("r", {DType::kF32, to_shape(yd)});
    const ValueId s = g.add_value("s"), z = g.add_value("z");
    g.add_node("Add", {y, r}, {s});
    g.add_node("Relu", {s}, {z});
    y = z;
  }
  g.add_output(y);
  infer_types(g);
  return g;
}

std::vector<Case> random_cases() {
  std::vector<Case> cases = {
      {1, 3, 17, 19, 20, 3, 2, 1},            // a stem: fewer input channels than a block
      {2, 33, 9, 7, 17, 3, 1, 1, 1},          // odd channels both sides
      {1, 16, 7, 7, 32, 3, 1, 1},             // 7x7: the interior is one register block
      {1, 40, 5, 30, 48, 5, 1, 2, 2},         // dilation with padding
      {1, 32, 12, 12, 16, 1, 2, 0},           // strided 1x1
      {1, 20, 9, 10, 100, 3, 1, 1},           // 13 blocks of 8 (4 + 4 + 4 + 1), 7 of 16 (4 + 2 + 1)
      {1, 24, 7, 7, 80, 1, 1, 0},             // 5 blocks of 16: 4 + 1
      {1, 8, 3, 3, 8, 5, 1, 2},               // kernel larger than the image: no interior
      {1, 16, 4, 31, 32, 3, 1, 8, 4},         // pad 8 > 7: two checked blocks before the interior
      {1, 16, 4, 5, 48, 3, 1, 1},             // a row narrower than a register block
      {1, 48, 11, 13, 48, 3, 2, 1, 1, true},  // depthwise, strided
      {1, 32, 5, 37, 32, 3, 1, 1, 1, true},   // depthwise, rows of 14 + 14 + 7 interior pixels
      {1, 32, 5, 61, 32, 3, 2, 1, 1, true},   // depthwise, stride 2: 14 + 14 + 1 interior
      {2, 20, 8, 9, 20, 3, 1, 1, 1, true},    // depthwise, odd channels
      {1, 17, 6, 40, 17, 5, 1, 4, 2, true, false},  // depthwise, dilated, no bias
      {1, 32, 6, 37, 32, 5, 1, 2, 1, true},         // depthwise 5x5: rows of 14 + 14 + 5 interior
      {1, 24, 7, 61, 24, 5, 2, 2, 1, true},         // depthwise 5x5, stride 2: 14 + 14 + 1 interior
      {2, 40, 7, 7, 40, 5, 1, 2, 1, true},          // depthwise 5x5 on 7x7: a padded copy, no edges
      {1, 20, 9, 14, 20, 3, 1, 1, 1, true},         // depthwise 3x3 on 9x14: a padded copy
      {1, 32, 6, 37, 32, 7, 1, 3, 1, true},         // depthwise 7x7: a padded copy, 7-wide windows
      {1, 24, 7, 7, 24, 7, 1, 3, 1, true},          // depthwise 7x7 on 7x7 (FastViT's last stage)
      {1, 16, 5, 70, 16, 7, 1, 3, 1, true},         // depthwise 7x7, rows past the copy: edges
      {1, 16, 8, 20, 16, 7, 1, 0, 1, true},         // depthwise 7x7 unpadded: windows only
      {1, 16, 9, 30, 16, 7, 2, 3, 1, true},         // depthwise 7x7, stride 2: the general loop
      {1, 64, 9, 11, 96, 3, 1, 1, 1, false, true, 2},   // 2 groups: 32 -> 48 channels each
      {2, 64, 7, 10, 64, 3, 2, 1, 1, false, false, 4},  // 4 groups of one block of 16, strided
      {1, 96, 6, 5, 48, 1, 1, 0, 1, false, true, 3},    // 3 groups, 1x1: 32 -> 16 each
      {1, 20, 3, 65, 16, 1, 1, 0},                      // 1x1, one output block: 28 + 28 + 9 pixels
      {2, 40, 2, 45, 40, 1, 1, 0},  // 1x1, 2 + 1 blocks of 16 (5 of 8), wide rows
      {1, 12, 3, 64, 9, 3, 1, 1},   // 3x3 stride 1, one block, 62 interior pixels
      {1, 16, 5, 70, 16, 3, 2, 1},  // stride 2 as a constant: 28 + 6 interior pixels, one block
      {2, 20, 4, 64, 32, 3, 2, 1},  // stride 2, two output blocks (of 16): 14 + 14 + 3
      {1, 3, 6, 71, 16, 3, 2, 1},   // a stem at stride 2 reading NCHW: 28 + 6
      {1, 40, 3, 33, 72, 1, 2, 0},  // 1x1 stride 2, 4 + 1 blocks of 16 (9 of 8)
      {2, 160, 3, 3, 96, 1, 1, 0},  // 1x1 on a 3x3 plane: one row of 9 pixels, batch 2
      {1, 40, 4, 4, 200, 1, 1, 0},  // 1x1 on 4x4: one row of 16 (13 blocks of 16, 25 of 8)
      {1, 24, 2, 5, 40, 1, 1, 0},   // 1x1 on 2x5: one row of 10
      {1, 20, 4, 40, 64, 1, 1, 1, 1, false, false},  // 1x1 padded, no bias: rows of zeros
      {1, 48, 5, 33, 40, 1, 2, 1},                   // 1x1 padded, stride 2: 14 + 2 interior
  };
  std::mt19937 rng(5);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int i = 0; i < 8; ++i) {
    Case t{pick(1, 2), pick(1, 40), pick(1, 16), pick(1, 33), pick(1, 40), pick(1, 3) * 2 - 1};
    t.stride = pick(1, 3);
    t.dilation = pick(1, 2);
    t.pad = pick(0, t.k / 2 * t.dilation);
    t.depthwise = pick(0, 3) == 0;
    t.bias = pick(0, 1) == 1;
    if ((t.h + 2 * t.pad - t.dilation * (t.k - 1) - 1) < 0 ||
        (t.w + 2 * t.pad - t.dilation * (t.k - 1) - 1) < 0)
      t.pad = t.k / 2 * t.dilation, t.h = std::max(t.h, t.k), t.w = std::max(t.w, t.k);
    cases.push_back(t);
  }
  return cases;
}

std::string describe(const Case& t) {
  return cat("N", t.n, " C", t.c, " ", t.h, "x", t.w, " M", t.m, " k", t.k, " s", t.stride, " p",
             t.pad, " d", t.dilation, t.depthwise ? " depthwise" : "", t.bias ? "" : " no bias",
             t.group > 1 ? cat(" group ", t.group) : "");
}

// `b` compiled at level 0 runs every node on a CPU kernel and gives `want`, on every ISA the
// machine has, with 1 and 2 threads.
void expect_cpu_matches(const Graph& b, const std::vector<Tensor>& in, const Tensor& want,
                        const std::string& what, double tol) {
  for (cpu::Isa isa : cpu::supported_isas()) {
    cpu::IsaScope scope(isa);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Executable exe = compile(b, {.level = 0});
      for (size_t i = 0; i < b.nodes().size(); ++i) ASSERT_EQ(exe.node_backend(i), "cpu") << what;
      expect_close(exe.run(in)[0], want,
                   cat(what, ", ", cpu::isa_name(isa), ", ", threads, " thread(s)"), tol);
    }
  }
}

// The rewritten graph (reorder, ConvBlocked, reorder back) on the CPU kernels, on every ISA,
// with 1 and 2 threads and blocks of 8 and 16, against the reference Conv of the original graph.
TEST(LayoutKernels, ConvBlockedMatchesReferenceConv) {
  std::mt19937 rng(3);
  const int saved = num_threads();
  for (const Case& t : random_cases()) {
    const Graph g = conv_graph(t, false, rng);
    const std::vector<Tensor> in = random_inputs(g, 17);
    const Tensor want = reference::run(g, in)[0];
    for (int block : {8, 16}) {
      const Graph b = assign(g, block, nullptr, false);
      ASSERT_EQ(count_ops(b, "ConvBlocked"), 1) << describe(t);
      expect_close(reference::run(b, in)[0], want, cat(describe(t), " reference, block ", block));
      expect_cpu_matches(b, in, want, cat(describe(t), ", block ", block));
    }
  }
  set_num_threads(saved);
}

// A first conv with fewer input channels than a block reads the NCHW input itself (no reorder of
// the image), on every ISA and thread count, with a stride, padding, and a residual and Relu.
TEST(LayoutKernels, StemReadsNchwInput) {
  std::mt19937 rng(8);
  // The third: YOLOv8's stem (3 -> 16, 3x3 stride 2), 35 output pixels a row: one register
  // block of 28 at the constant stride, a tail of 5 and the checked edges. Then a 1x1 at stride
  // 2, and a dilated 3x3 RGB stem with 2 + 1 output blocks (the unrolled stem path).
  for (const Case& t : {Case{2, 3, 23, 19, 40, 7, 2, 3}, Case{1, 1, 9, 8, 16, 3, 1, 1},
                        Case{2, 3, 7, 70, 16, 3, 2, 1}, Case{1, 3, 5, 64, 32, 1, 2, 0},
                        Case{1, 3, 9, 64, 40, 3, 2, 2, 2}}) {
    for (bool epilogue : {false, true}) {
      const Graph g = conv_graph(t, epilogue, rng);
      const std::vector<Tensor> in = random_inputs(g, 21);
      const Tensor want = reference::run(g, in)[0];
      for (int block : {8, 16}) {
        const Graph b = assign(g, block, nullptr, false);
        ASSERT_EQ(count_ops(b, "ConvBlocked"), 1) << describe(t);
        ASSERT_EQ(count_ops(b, "ReorderToBlocked"), epilogue ? 1 : 0) << print(b);  // residual
        expect_close(reference::run(b, in)[0], want, cat(describe(t), " reference"));
        expect_cpu_matches(b, in, want, cat(describe(t), ", block ", block));
      }
    }
  }
}

// An inverted-residual block (1x1 expand, Clip, depthwise, Clip or Relu or nothing, 1x1 project,
// residual Add) at level 3: FuseBlockedConvs joins the depthwise and project convs into one
// DwPwConvBlocked, which runs on the CPU and matches the reference of the original graph on
// every ISA, on 1 and 2 threads, with strides and odd sizes. Again with the 1x1 convs'
// precision="bf16" (AutoMixedPrecision's marking): the fused node keeps it and computes their
// products on bf16 pairs (AVX512_BF16, blocks of 16) or on rounded operands, against the
// reference's rounded operands; with the extension turned off too, before and after compiling.
TEST(LayoutKernels, DepthwiseAndPointwiseFuse) {
  // Where bf16 products run on AMX tiles the 1x1 convs stay on the implicit GEMM
  // (AssignLayouts): turned off, so that the fused bf16 kernel compiles here too.
  std::optional<cpu::ExtScope> no_amx;
  if (cpu::has_ext(cpu::Ext::kAmxBf16)) no_amx.emplace(cpu::Ext::kAmxBf16);
  struct Block {
    int64_t n, c, h, w, e, stride;
    std::string act;   // between the depthwise and the project conv
    int64_t k = 3;     // the depthwise kernel
    std::string post;  // after the block: an activation the kernel applies after its stores
  };
  for (const Block& t : {Block{1, 24, 9, 11, 72, 1, "Clip"}, Block{2, 16, 8, 7, 48, 2, "Relu"},
                         Block{1, 32, 5, 5, 96, 1, ""},
                         Block{1, 128, 3, 3, 256, 1, "Clip"},  // 3 rows: blocks split too
                         Block{1, 16, 3, 61, 32, 1, "Clip"},   // one project block, wide rows
                         Block{1, 48, 12, 40, 144, 1, "", 7},  // FastViT's 7x7 ConvMlp
                         Block{2, 24, 4, 58, 72, 1, ""},       // 2 project blocks, 56 + 2
                         // Expanded planes of 1 MiB and more: the expansion joins the node too
                         // (a ring of expanded rows; several images; stride 2; padded lanes).
                         Block{1, 16, 64, 66, 64, 1, "Clip"}, Block{2, 32, 48, 48, 120, 1, "Relu"},
                         Block{1, 16, 65, 64, 64, 2, "Clip"},
                         // 960 -> 160 (0.6 MB of project weights): on two threads a 7-row plane
                         // splits its pixels, two 8-row images give 8 chunks of 2 rows.
                         Block{1, 160, 7, 7, 960, 1, "Clip"}, Block{2, 160, 8, 8, 960, 1, "Relu"},
                         // MobileNetV2 at 96x96: narrow rows projected in groups of rows (6x6 in
                         // two groups of 3, 3x3 in one; 12x12 stride 2 -> 6x6, two images).
                         Block{1, 96, 6, 6, 576, 1, "Clip"}, Block{2, 160, 3, 3, 960, 1, "Clip"},
                         Block{2, 32, 12, 12, 192, 2, "Clip"},
                         // Planes up to kFlatDwPwPlane project runs of rows as one row: three
                         // images of odd 5x5 planes (stride 2), a 5x5 kernel on 7x9, one output
                         // block on 2 threads (the rows split in two runs); 30x20 = 600 pixels
                         // stay row by row.
                         Block{3, 24, 10, 9, 48, 2, "Relu"}, Block{1, 16, 7, 9, 48, 1, "Clip", 5},
                         Block{1, 16, 13, 5, 32, 2, ""}, Block{1, 24, 30, 20, 48, 1, "Clip"},
                         // On two threads 7x7 and 7x9 planes split their pixels mid-row (24 +
                         // 25, 31 + 32), here with an epilogue that runs after the stores.
                         Block{1, 48, 7, 7, 144, 1, "Clip", 5, "Sigmoid"},
                         Block{1, 16, 7, 9, 48, 1, "Relu", 3, "Tanh"}}) {
    for (bool bf16 : {false, true}) {
      std::mt19937 rng(9);
      Graph g;
      const ValueId x = g.add_input("x", {DType::kF32, Shape{t.n, t.c, t.h, t.w}});
      auto conv = [&](ValueId in, int64_t out, int64_t in_per_group, int64_t k, int64_t stride,
                      int64_t group) {
        const ValueId w = g.add_constant("w", random_tensor({out, in_per_group, k, k}, rng));
        const ValueId b = g.add_constant("b", random_tensor({out}, rng));
        Attributes a;
        a.set("strides", Dims{stride, stride});
        a.set("pads", Dims{k / 2, k / 2, k / 2, k / 2});
        if (group > 1) a.set("group", group);
        if (bf16 && group == 1) a.set("precision", std::string("bf16"));
        const ValueId y = g.add_value(g.unique_name("y"));
        g.add_node("Conv", {in, w, b}, {y}, a);
        return y;
      };
      auto relu6 = [&](ValueId in) {
        const ValueId lo = g.add_constant("lo", Tensor::scalar(0.0f));
        const ValueId hi = g.add_constant("hi", Tensor::scalar(6.0f));
        const ValueId y = g.add_value(g.unique_name("r"));
        g.add_node("Clip", {in, lo, hi}, {y});
        return y;
      };
      ValueId v = relu6(conv(x, t.e, t.c, 1, 1, 1));
      v = conv(v, t.e, 1, t.k, t.stride, t.e);
      if (t.act == "Clip") v = relu6(v);
      if (t.act == "Relu") {
        const ValueId r = g.add_value("relu");
        g.add_node("Relu", {v}, {r});
        v = r;
      }
      v = conv(v, t.c, t.e, 1, 1, 1);
      if (t.stride == 1) {
        const ValueId s = g.add_value("sum");
        g.add_node("Add", {v, x}, {s});
        v = s;
      }
      if (!t.post.empty()) {
        const ValueId p = g.add_value("post");
        g.add_node(t.post, {v}, {p});
        v = p;
      }
      g.add_output(v);
      infer_types(g);
      const std::vector<Tensor> in = random_inputs(g, 23);
      const Tensor want = reference::run(g, in)[0];
      // PTO_DWPW_FLAT: runs of pixels as one row, or not; PTO_DWPW_CHANNEL_SPLIT: the halves of a
      // plane whose rows the threads do not split evenly split apart, or not.
      for (const auto& [flat, split] : {std::pair{"1", "1"}, {"1", "0"}, {"0", "1"}})
        for (cpu::Isa isa : cpu::supported_isas()) {
          if (isa == cpu::Isa::kGeneric) continue;  // no channel block: nothing blocked
          cpu::IsaScope scope(isa);
          setenv("PTO_DWPW_FLAT", flat, 1);
          setenv("PTO_DWPW_CHANNEL_SPLIT", split, 1);
          const std::string what =
              cat("C", t.c, " E", t.e, " ", t.h, "x", t.w, " k", t.k, " s", t.stride, " ",
                  t.act.empty() ? "no activation" : t.act, ", PTO_DWPW_FLAT=", flat,
                  ", PTO_DWPW_CHANNEL_SPLIT=", split, bf16 ? ", bf16" : "");
          for (int threads : {1, 2}) {
            set_num_threads(threads);
            Executable exe = compile(g, {.level = 3});
            int fused = 0;
            const bool big = t.h * t.w * (t.e + 15) / 16 * 16 * 4 >= (1 << 20);
            for (size_t i = 0; i < exe.graph().nodes().size(); ++i) {
              const Node& node = exe.graph().nodes()[i];
              if (node.op != "DwPwConvBlocked") continue;
              ++fused;
              EXPECT_EQ(exe.node_backend(i), "cpu") << what;
              EXPECT_EQ(node.inputs.size(), big ? 7u : 5u) << what << ": the expansion joins it";
              EXPECT_EQ(node.attrs.get_string("precision", ""), bf16 ? "bf16" : "") << what;
              if (bf16) {
                const bool pairs = cpu::has_ext(cpu::Ext::kAvx512Bf16) && isa == cpu::Isa::kAvx512;
                EXPECT_EQ(exe.describe_step(exe.step_of_node(i))
                              .rfind(pairs ? "bf16-pairs" : "bf16-rounded", 0),
                          0u)
                    << what;
              }
            }
            EXPECT_EQ(fused, 1) << what;
            // bf16: the projection rounds the depthwise output, which the kernel computes in
            // fp32 and the reference in double, so a value on a rounding boundary may round
            // the other way (one bf16 ulp of one input: within 2e-3 of max|y| here).
            const double tol = bf16 ? 2e-3 : 1e-5;
            const Tensor got = exe.run(in)[0];
            expect_close(got, want, cat(what, ", ", cpu::isa_name(isa), ", ", threads), tol);
            // The reference kernel of the fused node: the same block, one op after the other.
            if (threads == 1)
              expect_close(reference::run(exe.graph_with_weights(), in)[0], want,
                           cat(what, ", reference"), tol);
            if (bf16 && threads == 2 && isa == cpu::Isa::kAvx512 &&
                cpu::has_ext(cpu::Ext::kAvx512Bf16)) {
              // The same depthwise output rounded the same way: the fp32 kernel on rounded
              // operands gives the pairs' products, up to the order of the additions.
              cpu::ExtScope off(cpu::Ext::kAvx512Bf16);  // pairs prepared, run without
              expect_close(exe.run(in)[0], got, cat(what, ", pairs turned off"));
              expect_close(compile(g, {.level = 3}).run(in)[0], got, cat(what, ", no AVX512_BF16"));
            }
          }
        }
    }
  }
  unsetenv("PTO_DWPW_FLAT");
  unsetenv("PTO_DWPW_CHANNEL_SPLIT");
  set_num_threads(0);
}

// GroupNorm between convs (ResNetV2's pre-activation blocks, UNets' GroupNorm + SiLU): at level 3
// the GroupNormalization of a blocked value runs as GroupNormBlocked, with the Relu or the SiLU
// (x * Sigmoid(x)) after it as its activation, on every ISA with a channel block and on 1 and 2
// threads, against the reference of the original graph. Groups of 2 channels, of a whole block, of
// 5 (60 channels: padded lanes), one group, one channel a group; conv outputs far from 0 (bias +
// 40) so that the variance is a small part of E[x^2].
TEST(LayoutKernels, GroupNormRunsBlocked) {
  struct GnCase {
    int64_t n, c, h, w, groups;
    std::string act;  // "", "Relu" or "Silu"
  };
  for (const GnCase& t : {GnCase{1, 64, 9, 11, 32, "Relu"}, GnCase{2, 48, 7, 5, 3, ""},
                          GnCase{1, 60, 6, 13, 12, "Silu"}, GnCase{2, 32, 5, 5, 1, "Relu"},
                          GnCase{1, 32, 70, 70, 32, ""}, GnCase{1, 64, 17, 19, 32, "Silu"}}) {
    std::mt19937 rng(31);
    Graph g;
    const ValueId x = g.add_input("x", {DType::kF32, Shape{t.n, t.c, t.h, t.w}});
    auto conv = [&](ValueId in, int64_t k, float offset) {
      Tensor b = random_tensor({t.c}, rng);
      for (int64_t i = 0; i < t.c; ++i) b.data<float>()[i] += offset;
      const ValueId w = g.add_constant("w", random_tensor({t.c, t.c, k, k}, rng));
      Attributes a;
      a.set("pads", Dims{k / 2, k / 2, k / 2, k / 2});
      const ValueId y = g.add_value(g.unique_name("y"));
      g.add_node("Conv", {in, w, g.add_constant("b", std::move(b))}, {y}, a);
      return y;
    };
    ValueId v = conv(x, 3, 40.0f);
    Attributes a;
    a.set("num_groups", t.groups);
    const ValueId n = g.add_value("norm");
    g.add_node("GroupNormalization",
               {v, g.add_constant("scale", random_tensor({t.c}, rng)),
                g.add_constant("bias", random_tensor({t.c}, rng))},
               {n}, a, "gn", 21);
    v = n;
    if (t.act == "Relu") {
      const ValueId r = g.add_value("relu");
      g.add_node("Relu", {v}, {r});
      v = r;
    } else if (t.act == "Silu") {
      const ValueId s = g.add_value("sigmoid"), r = g.add_value("silu");
      g.add_node("Sigmoid", {v}, {s});
      g.add_node("Mul", {v, s}, {r});
      v = r;
    }
    g.add_output(conv(v, 1, 0.0f));
    infer_types(g);
    const std::vector<Tensor> in = random_inputs(g, 29);
    const Tensor want = reference::run(g, in)[0];
    const std::string what =
        cat("N", t.n, " C", t.c, " ", t.h, "x", t.w, " G", t.groups, " ", t.act);
    for (cpu::Isa isa : cpu::supported_isas()) {
      if (isa == cpu::Isa::kGeneric) continue;  // no channel block: nothing blocked
      cpu::IsaScope scope(isa);
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        Executable exe = compile(g, {.level = 3});
        int norms = 0;
        for (size_t i = 0; i < exe.graph().nodes().size(); ++i) {
          const Node& node = exe.graph().nodes()[i];
          EXPECT_TRUE(node.op != "Relu" && node.op != "Sigmoid") << what << ": into the norm";
          if (node.op != "GroupNormBlocked") continue;
          ++norms;
          EXPECT_EQ(exe.node_backend(i), "cpu") << what;
          EXPECT_EQ(node.attrs.get_string("activation", ""), t.act) << what;
        }
        EXPECT_EQ(norms, 1) << what;
        expect_close(exe.run(in)[0], want, cat(what, ", ", cpu::isa_name(isa), ", ", threads));
        if (threads == 1)  // the blocked node's reference kernel
          expect_close(reference::run(exe.graph(), in)[0], want, cat(what, ", reference"));
      }
    }
  }
}

// A grouped conv is blocked only where every group's channels fill whole blocks: groups of 8
// channels block in 8s, not in 16s (the conv then stays NCHW, without reorders).
TEST(LayoutKernels, GroupedConvBlocksOnlyOnWholeBlocks) {
  std::mt19937 rng(6);
  const Graph g = conv_graph(Case{1, 32, 8, 8, 32, 3, 1, 1, 1, false, true, 4}, false, rng);
  EXPECT_EQ(count_ops(assign(g, 8, nullptr, false), "ConvBlocked"), 1);
  const Graph b16 = assign(g, 16, nullptr, false);
  EXPECT_EQ(count_ops(b16, "ConvBlocked"), 0);
  EXPECT_EQ(count_ops(b16, "ReorderToBlocked"), 0);
  EXPECT_EQ(count_ops(b16, "Conv"), 1);
}

// At level 2 the blocked conv takes the residual Add and the Relu as its epilogue.
TEST(LayoutKernels, ConvBlockedTakesResidualAndActivationEpilogue) {
  std::mt19937 rng(4);
  for (const Case& t : {Case{1, 24, 9, 11, 40, 3, 1, 1}, Case{2, 32, 8, 8, 32, 3, 2, 1, 1, true},
                        Case{2, 48, 3, 3, 48, 1, 1, 0}}) {  // a 3x3 plane as one row
    const Graph g = conv_graph(t, true, rng);
    const Graph b = assign(g, 16, nullptr, false);
    const std::vector<Tensor> in = random_inputs(g, 23);
    const Tensor want = reference::run(g, in)[0];
    Executable exe = compile(b, {.level = 2});
    bool fused = false;
    for (size_t s = 0; s < exe.num_steps(); ++s)
      fused = fused || exe.step(s).rule == "ConvBlocked+Add+Relu";
    EXPECT_TRUE(fused) << describe(t);
    expect_close(exe.run(in)[0], want, describe(t) + " fused");
  }
}

// precision="bf16" (AutoMixedPrecision's convs): ConvBlocked keeps it and computes bf16 products,
// on VDPBF16PS pairs where the CPU has AVX512_BF16 and blocks are 16, else the fp32 kernel on
// operands rounded to bf16, against the reference Conv (which rounds X and W itself): every case
// of ConvBlockedMatchesReferenceConv (stems, odd channels, groups, strides, dilations, 1x1 rows)
// on every ISA, 1 and 2 threads, with the extension on and off, and a model compiled with it run
// after it is turned off; with a residual and Relu fused at level 2. A depthwise conv marked bf16
// (by hand: AutoMixedPrecision leaves them fp32) stays NCHW, where the Conv kernel rounds.
TEST(LayoutKernels, Bf16ConvBlockedMatchesReferenceConv) {
  std::mt19937 rng(6);
  const int saved = num_threads();
  const bool pairs = cpu::has_ext(cpu::Ext::kAvx512Bf16);
  for (const Case& t : random_cases()) {
    for (bool epilogue : {false, true}) {
      if (epilogue && t.depthwise) continue;
      Graph g = conv_graph(t, epilogue, rng);
      for (Node& n : g.mutable_nodes())
        if (n.op == "Conv") n.attrs.set("precision", std::string("bf16"));
      const std::vector<Tensor> in = random_inputs(g, 17);
      const Tensor want = reference::run(g, in)[0];
      const std::string what = cat(describe(t), epilogue ? " + residual, Relu" : "", ", bf16");
      // Winograd F(4x4, 3x3) (3x3 stride-1 convs, on the rounded operands) adds its own rounding.
      const double tol = t.k == 3 && t.stride == 1 && t.dilation == 1 ? 1e-4 : 1e-5;
      for (int block : {8, 16}) {
        const Graph b = assign(g, block, nullptr, false);
        ASSERT_EQ(count_ops(b, "ConvBlocked"), t.depthwise ? 0 : 1) << what;
        for (const Node& n : b.nodes())
          if (n.op == "ConvBlocked") {
            EXPECT_EQ(n.attrs.get_string("precision", ""), "bf16") << what;
          }
        if (t.depthwise) {  // stays NCHW: the Conv kernel's rounded copies of X and W
          Executable exe = compile(b, {.level = 0});
          expect_close(exe.run(in)[0], want, cat(what, ", block ", block), tol);
          continue;
        }
        if (!epilogue)
          expect_close(reference::run(b, in)[0], want, cat(what, " reference, block ", block));
        if (epilogue) {  // fused at level 2: the residual and Relu in registers
          Executable exe = compile(b, {.level = 2});
          expect_close(exe.run(in)[0], want, cat(what, ", fused, block ", block), tol);
          continue;
        }
        expect_cpu_matches(b, in, want, cat(what, ", block ", block), tol);
        if (!pairs) continue;
        set_num_threads(2);
        Executable exe = compile(b, {.level = 0});  // pairs prepared
        cpu::ExtScope off(cpu::Ext::kAvx512Bf16);
        expect_close(exe.run(in)[0], want, cat(what, ", block ", block, ", pairs turned off"), tol);
        expect_cpu_matches(b, in, want, cat(what, ", block ", block, ", no AVX512_BF16"), tol);
      }
    }
  }
  set_num_threads(saved);
}

// A bf16 3x3 stride-1 conv takes Winograd F(4x4, 3x3) (fp32 products of the rounded operands)
// only from 392 output pixels where the bf16 direct kernel runs, else from 49: on a 20x20 plane
// it is Winograd, on 14x14 the bf16 direct kernel.
TEST(LayoutKernels, Bf16ConvTakesWinogradOnlyOnLargePlanes) {
  std::mt19937 rng(7);
  for (int64_t side : {20, 14}) {
    Graph g = conv_graph(Case{1, 32, side, side, 48, 3, 1, 1}, false, rng);
    for (Node& n : g.mutable_nodes())
      if (n.op == "Conv") n.attrs.set("precision", std::string("bf16"));
    const std::vector<Tensor> in = random_inputs(g, 5);
    const Tensor want = reference::run(g, in)[0];
    Executable exe = compile(assign(g, 16, nullptr, false), {.level = 0});
    std::string kinds;
    for (size_t s = 0; s < exe.num_steps(); ++s) kinds += exe.describe_step(s) + "; ";
    const bool pairs = cpu::has_ext(cpu::Ext::kAvx512Bf16);
    const bool winograd = side == 20 || !pairs;
    EXPECT_EQ(kinds.find("winograd") != std::string::npos, winograd) << side << ": " << kinds;
    EXPECT_EQ(kinds.find("direct/bf16 pairs") != std::string::npos, !winograd)
        << side << ": " << kinds;
    expect_close(exe.run(in)[0], want, cat(side, "x", side), winograd ? 1e-4 : 1e-5);
  }
}

// At level 3 bf16 convs stay on the NCHW implicit GEMM where its products run on AMX tiles (the
// blocked direct kernel's VDPBF16PS pairs are several times slower there), and run blocked where
// they do not (no AMX, or AMX turned off): the cost rule asks the machine. Both match the
// reference.
TEST(LayoutPass, Bf16ConvsStayOnTheGemmWhereAmxTilesRunThem) {
  std::mt19937 rng(8);
  Graph g;
  const ValueId x = g.add_input("x", {DType::kF32, Shape{1, 32, 14, 14}});
  const ValueId w1 = g.add_constant("w1", random_tensor({48, 32, 3, 3}, rng));
  const ValueId w2 = g.add_constant("w2", random_tensor({64, 48, 1, 1}, rng));
  Attributes a;
  a.set("pads", Dims{1, 1, 1, 1});
  a.set("precision", std::string("bf16"));
  const ValueId y = g.add_value("y"), r = g.add_value("r"), z = g.add_value("z");
  g.add_node("Conv", {x, w1}, {y}, a, "conv3x3");
  g.add_node("Relu", {y}, {r});
  a.set("pads", Dims{0, 0, 0, 0});
  g.add_node("Conv", {r, w2}, {z}, a, "conv1x1");
  g.add_output(z);
  infer_types(g);
  const std::vector<Tensor> in = random_inputs(g, 10);
  const Tensor want = reference::run(g, in)[0];
  for (bool amx_off : {false, true}) {
    std::optional<cpu::ExtScope> off;
    if (amx_off) off.emplace(cpu::Ext::kAmxBf16);
    const bool amx = cpu::has_ext(cpu::Ext::kAmxBf16);
    Executable exe = compile(g, {.level = 3});
    const std::string what = cat(amx ? "AMX tiles" : "no AMX", ": ", print(exe.graph()));
    EXPECT_EQ(count_ops(exe.graph(), "ConvBlocked"), amx ? 0 : 2) << what;
    std::string kinds;
    for (size_t s = 0; s < exe.num_steps(); ++s) kinds += exe.describe_step(s) + "; ";
    EXPECT_EQ(kinds.find("bf16 pairs for AMX tiles") != std::string::npos, amx) << kinds;
    expect_close(exe.run(in)[0], want, what, 1e-4);
  }
}

// Blocked pooling on the CPU kernel (every ISA, 1 and 2 threads, blocks of 8 and 16) against the
// reference's MaxPool/AveragePool of the NCHW graph: odd channel counts, strides, pads, dilations,
// ceil_mode, count_include_pad, and a NaN that must win only where it is the window's first
// element.
TEST(LayoutKernels, BlockedPoolingMatchesReference) {
  const char* pools[] = {
      "MaxPool(%y) {kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]}",
      "MaxPool(%y) {kernel_shape=[2, 3], dilations=[2, 1], ceil_mode=1, strides=[2, 2]}",
      "AveragePool(%y) {kernel_shape=[3, 3], pads=[1, 0, 1, 2], count_include_pad=1}",
      "AveragePool(%y) {kernel_shape=[2, 2], strides=[3, 2], ceil_mode=1}",
      "MaxPool(%y) {kernel_shape=[3, 3], auto_pad=\"SAME_UPPER\", strides=[2, 2]}",
  };
  const int saved = num_threads();
  int index = 0;
  for (const char* pool : pools) {
    for (int64_t channels : {5, 20}) {
      const std::string c = std::to_string(channels);
      Graph g = parse("  input  %x: f32[2, " + c + ", 9, 11]\n  const  %w: f32[" + c + ", " + c +
                      ", 1, 1]\n  %y = Conv(%x, %w)\n  %p = " + pool + "\n  return %p\n");
      std::mt19937 rng(31 + index);
      g.set_initializer(*g.find_value("w"), random_tensor({channels, channels, 1, 1}, rng));
      std::vector<Tensor> in = random_inputs(g, 41 + index++);
      in[0].data<float>()[0] = std::nanf("");
      const Tensor want = reference::run(g, in)[0];
      for (int block : {8, 16}) {
        const Graph b = assign(g, block, nullptr, false);
        ASSERT_EQ(count_ops(b, "ReorderFromBlocked"), 1) << print(b);  // after the pool
        expect_cpu_matches(b, in, want, cat(pool, " C", channels, " block ", block));
      }
    }
  }
  set_num_threads(saved);
}

// The reorders alone round-trip any float bits, padded lanes read back as zeros; also on 1x1
// planes (a spatial mean's result), which copy each image's channels.
TEST(LayoutKernels, ReordersRoundTripOnTheCpu) {
  for (const Dims& shape : {Dims{2, 19, 3, 5}, Dims{3, 19, 1, 1}}) {
    const std::string dims = cat(shape[0], ", 19, ", shape[2], ", ", shape[3]);
    const Graph g = parse(cat("  input  %x: f32[", dims,
                              "]\n"
                              "  %b = pto.ReorderToBlocked(%x) {block=8}\n"
                              "  %y = pto.ReorderFromBlocked(%b) {channels=19}\n"
                              "  return %y, %b\n"));
    std::mt19937 rng(9);
    Tensor x = random_tensor(shape, rng);
    x.data<float>()[7] = std::nanf("");
    Executable exe = compile(g, {.level = 0});
    ASSERT_EQ(exe.node_backend(0), "cpu");
    ASSERT_EQ(exe.node_backend(1), "cpu");
    const std::vector<Tensor> got = exe.run({x});
    const std::vector<Tensor> want = reference::run(g, {x});
    ASSERT_EQ(got[0].shape(), x.shape());
    EXPECT_EQ(std::memcmp(got[0].raw_data(), x.raw_data(), x.nbytes()), 0) << dims;
    ASSERT_EQ(got[1].shape(), (Dims{shape[0], 3, shape[2], shape[3], 8}));
    EXPECT_EQ(std::memcmp(got[1].raw_data(), want[1].raw_data(), want[1].nbytes()), 0) << dims;
    const int64_t hw = shape[2] * shape[3];  // channel 19 of image 0 (block 2, lane 3): padding
    EXPECT_EQ(got[1].data<float>()[(2 * hw + 0) * 8 + 3], 0.0f) << dims;
  }
}

}  // namespace
}  // namespace pto
