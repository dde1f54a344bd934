// A Conv followed by an elementwise chain the bias/residual/activation epilogue cannot express
// runs as one kernel, the chain a tile program applied to each output block (Conv+Elementwise),
// on every conv path (implicit GEMM, 1x1 with the input as B, shifted, depthwise, grouped, 1-D,
// batch > 1) with per-channel, scalar, full, per-position and per-image-per-channel operands.
// Each result is compared with the reference interpreter on the graph as built, and the fused
// kernel is run again on its own to show that it computed the result (did not decline).
#include <gtest/gtest.h>

#include <cmath>

#include "env_guard.h"
#include "pto/backend.h"
#include "pto/executable.h"
#include "pto/parallel.h"
#include "pto/reference.h"
#include "random_tensor.h"

namespace pto {
namespace {

using testing::random_tensor;

struct ConvCase {
  std::string name;
  Dims x, w;  // [n, c, (h,) w] and [m, c / group, (kh,) kw]
  Dims strides, pads;
  int64_t group = 1;
  bool bias = false;
  Dims per_position;  // the shape of the per-position operand (broadcast to the output)
  bool stem = false;  // x goes through Conv(3x3, c -> c) and Relu first
  bool bf16 = false;  // the conv has bf16 products (precision="bf16")
};

void expect_near(const Tensor& a, const Tensor& b, const std::string& what, double tol = 1e-5) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  for (int64_t i = 0; i < a.numel(); ++i)
    ASSERT_NEAR(a.item_as_double(i), b.item_as_double(i),
                tol * std::max(1.0, std::abs(b.item_as_double(i))))
        << what << " element " << i;
}

// x -> Conv -> *pc[m,1,1] (constant) -> +r (full) -> *sp (per position) -> -s[1] -> +ic[n,m,1,1]
//   -> v * Sigmoid(v): seven elementwise nodes after the conv.
struct Built {
  Graph g;
  std::vector<Tensor> inputs;
};

Built conv_with_chain(const ConvCase& c) {
  Graph probe;  // the conv alone, for its output shape
  ValueId px = probe.add_input("x", {DType::kF32, to_shape(c.x)});
  ValueId pw = probe.add_value("w");
  probe.set_initializer(pw, random_tensor(c.w, 1));
  ValueId py = probe.add_value("y");
  Attributes a;
  if (!c.strides.empty()) a.set("strides", c.strides);
  if (!c.pads.empty()) a.set("pads", c.pads);
  a.set("group", c.group);
  probe.add_node("Conv", {px, pw}, {py}, a, "conv");
  probe.add_output(py);
  infer_types(probe);
  Dims y;
  for (const Dim& d : *probe.value(py).type.shape) y.push_back(d.value);
  const int64_t n = y[0], m = y[1];

  Built b;
  Graph& g = b.g;
  ValueId x = g.add_input("x", {DType::kF32, to_shape(c.x)});
  ValueId r = g.add_input("r", {DType::kF32, to_shape(y)});
  ValueId sp = g.add_input("sp", {DType::kF32, to_shape(c.per_position)});
  ValueId s = g.add_input("s", {DType::kF32, to_shape({1})});
  ValueId ic = g.add_input("ic", {DType::kF32, to_shape({n, m, 1, 1})});
  b.inputs = {random_tensor(c.x, 2), random_tensor(y, 3), random_tensor(c.per_position, 4),
              random_tensor({1}, 5), random_tensor({n, m, 1, 1}, 6)};
  if (y.size() == 3) {  // a 1-D conv: the per-image-per-channel operand is [n, m, 1]
    g.value(ic).type.shape = to_shape({n, m, 1});
    b.inputs[4] = random_tensor({n, m, 1}, 6);
  }
  ValueId w = g.add_value("w");
  g.set_initializer(w, random_tensor(c.w, 1));
  if (c.stem) {
    ValueId sw = g.add_value("stem_w"), sc = g.add_value("stem"), sr = g.add_value("stem_relu");
    g.set_initializer(sw, random_tensor({c.x[1], c.x[1], 3, 3}, 9));
    Attributes pad;
    pad.set("pads", Dims{1, 1, 1, 1});
    g.add_node("Conv", {x, sw}, {sc}, pad, "stem");
    g.add_node("Relu", {sc}, {sr}, {}, "stem_relu");
    x = sr;
  }
  std::vector<ValueId> conv_in = {x, w};
  if (c.bias) {
    ValueId bv = g.add_value("b");
    g.set_initializer(bv, random_tensor({m}, 7));
    conv_in.push_back(bv);
  }
  ValueId pc = g.add_value("pc");
  g.set_initializer(pc, random_tensor(y.size() == 3 ? Dims{m, 1} : Dims{m, 1, 1}, 8));
  std::vector<ValueId> v;
  for (const char* name : {"c", "a1", "a2", "a3", "a4", "a5", "a6", "out"})
    v.push_back(g.add_value(name));
  if (c.bf16) a.set("precision", std::string("bf16"));
  g.add_node("Conv", conv_in, {v[0]}, a, "conv");
  g.add_node("Mul", {v[0], pc}, {v[1]}, {}, "per_channel");
  g.add_node("Add", {r, v[1]}, {v[2]}, {}, "residual");
  g.add_node("Mul", {v[2], sp}, {v[3]}, {}, "per_position");
  g.add_node("Sub", {v[3], s}, {v[4]}, {}, "scalar");
  g.add_node("Add", {v[4], ic}, {v[5]}, {}, "per_image_channel");
  g.add_node("Sigmoid", {v[5]}, {v[6]}, {}, "sigmoid");
  g.add_node("Mul", {v[5], v[6]}, {v[7]}, {}, "times_sigmoid");
  g.add_output(v[7]);
  return b;
}

std::vector<Tensor> reference_of(const Graph& g, const std::vector<Tensor>& inputs) {
  Graph typed = g;
  infer_types(typed);
  return reference::run(typed, inputs);
}

// Step `s` of `exe` compiled again by the CPU backend and run on its own: a KernelDeclined (the
// runtime's fallback to the unfused nodes) fails the test.
Tensor run_step_alone(const Executable& exe, size_t s, const std::vector<Tensor>& graph_inputs) {
  const Graph g = exe.graph_with_weights();  // weights a pass made are released once packed
  const StepInfo& st = exe.step(s);
  KernelGroup k;
  k.nodes = st.nodes;
  k.rule = st.rule;
  k.inputs = st.inputs;
  k.outputs = st.outputs;
  k.anchor = st.nodes.front();
  std::vector<Tensor> args;
  for (ValueId v : k.inputs) {
    if (const Tensor* t = g.initializer(v)) {
      args.push_back(*t);
      continue;
    }
    auto it = std::find(g.inputs().begin(), g.inputs().end(), v);
    EXPECT_NE(it, g.inputs().end());
    args.push_back(graph_inputs[it - g.inputs().begin()]);
  }
  const Backend* cpu = BackendRegistry::global().find("cpu");
  EXPECT_TRUE(cpu->supports(g, k));
  return cpu->compile(g, k)->run(args).at(0);
}

void check_fused(const ConvCase& c) {
  SCOPED_TRACE(c.name);
  Built b = conv_with_chain(c);
  const Tensor want = reference_of(b.g, b.inputs)[0];
  Executable exe = compile(b.g, {.level = 2});
  ASSERT_EQ(exe.num_steps(), 1u);
  EXPECT_EQ(exe.step(0).rule, "Conv+Elementwise");
  EXPECT_EQ(exe.step(0).backend, "cpu");
  // the per-channel constant Mul folds into the conv's weights, but not into bf16 products
  EXPECT_EQ(exe.step(0).nodes.size(), c.bf16 ? 8u : 7u);
  EXPECT_NE(exe.describe_step(0).find("in0"), std::string::npos);  // pto compile --dump-tiles
  // One thread runs every GEMM serially; three split the few GEMMs of these sizes over the pool
  // (the epilogue too), or run them one a task.
  const int saved = num_threads();
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    for (int round = 0; round < 2; ++round)
      expect_near(exe.run(b.inputs)[0], want, cat(threads, " threads, round ", round));
    expect_near(run_step_alone(exe, 0, b.inputs), want, cat(threads, " threads, the step alone"));
  }
  set_num_threads(saved);
}

TEST(ConvEpilogue, GemmPath3x3Stride2) {
  check_fused({"3x3 s2 p1", {1, 6, 11, 13}, {10, 6, 3, 3}, {2, 2}, {1, 1, 1, 1}, 1, true, {6, 7}});
}

TEST(ConvEpilogue, GemmPathBatch2) {
  check_fused(
      {"batch 2", {2, 5, 9, 8}, {7, 5, 3, 3}, {2, 1}, {1, 0, 1, 2}, 1, false, {1, 1, 5, 8}});
}

TEST(ConvEpilogue, PointwiseInputAsB) {
  check_fused({"1x1", {2, 8, 7, 9}, {12, 8, 1, 1}, {}, {}, 1, true, {7, 9}});
}

TEST(ConvEpilogue, ShiftedPath) {
  testing::EnvGuard no_stem("PTO_CONV_STEM", "0");  // 4 input channels: a stem otherwise
  check_fused({"shifted", {2, 4, 20, 20}, {8, 4, 3, 3}, {}, {1, 1, 1, 1}, 1, true, {20, 20}});
}

TEST(ConvEpilogue, StemPath) {
  check_fused({"stem", {2, 3, 40, 36}, {10, 3, 3, 3}, {2, 2}, {1, 1, 1, 1}, 1, true, {20, 18}});
  check_fused({"stem 7x7", {1, 3, 44, 64}, {8, 3, 7, 7}, {2, 2}, {3, 3, 3, 3}, 1, false, {22, 32}});
}

TEST(ConvEpilogue, Depthwise) {
  check_fused(
      {"depthwise x2", {2, 8, 9, 11}, {16, 1, 3, 3}, {2, 2}, {1, 1, 1, 1}, 8, true, {1, 1, 5, 6}});
}

TEST(ConvEpilogue, Grouped) {
  check_fused({"group 2", {2, 8, 9, 9}, {12, 4, 3, 3}, {}, {1, 1, 1, 1}, 2, false, {9, 9}});
  check_fused(
      {"group 2 shifted", {2, 8, 20, 18}, {6, 4, 3, 3}, {}, {1, 1, 1, 1}, 2, true, {20, 18}});
}

// bf16 products (the implicit GEMM on bf16 operands on every geometry, the reference rounding X
// and W): the chain still runs on each output block.
TEST(ConvEpilogue, Bf16Products) {
  for (ConvCase c :
       {ConvCase{
            "bf16 3x3 s2", {1, 6, 11, 13}, {10, 6, 3, 3}, {2, 2}, {1, 1, 1, 1}, 1, true, {6, 7}},
        ConvCase{"bf16 1x1", {2, 8, 7, 9}, {12, 8, 1, 1}, {}, {}, 1, true, {7, 9}},
        ConvCase{"bf16 20x20 shifted",
                 {2, 4, 20, 20},
                 {8, 4, 3, 3},
                 {},
                 {1, 1, 1, 1},
                 1,
                 true,
                 {20, 20}},
        ConvCase{"bf16 small plane (blocked in fp32)",
                 {2, 20, 9, 8},
                 {24, 20, 3, 3},
                 {},
                 {1, 1, 1, 1},
                 1,
                 true,
                 {9, 8}}}) {
    c.bf16 = true;
    check_fused(c);
  }
}

// Convs on small planes with at least a block of input channels run on the blocked kernel inside
// the NCHW Conv kernel (conv_kernels.cpp): the chain runs on the reordered NCHW output.
TEST(ConvEpilogue, SmallPlaneBlockedPath) {
  check_fused({"blocked 3x3", {2, 20, 9, 8}, {24, 20, 3, 3}, {}, {1, 1, 1, 1}, 1, true, {9, 8}});
  check_fused({"blocked depthwise s2",
               {2, 32, 9, 11},
               {32, 1, 3, 3},
               {2, 2},
               {1, 1, 1, 1},
               32,
               true,
               {1, 1, 5, 6}});
}

TEST(ConvEpilogue, OneDimensional) {
  check_fused({"1-D", {2, 4, 30}, {6, 4, 5}, {1}, {2, 2}, 1, true, {30}});
}

// An operand per output row ([oh, 1]) is not a column pattern the conv's C can index: the conv
// does not take the chain as a tile epilogue, and the answer is still the reference's.
TEST(ConvEpilogue, AnOperandPerOutputRowIsRefused) {
  Built b =
      conv_with_chain({"per row", {1, 4, 8, 8}, {6, 4, 3, 3}, {}, {1, 1, 1, 1}, 1, false, {8, 1}});
  b.inputs[2] = random_tensor({8, 1}, 4);
  const Tensor want = reference_of(b.g, b.inputs)[0];
  Executable exe = compile(b.g, {.level = 2});
  for (size_t s = 0; s < exe.num_steps(); ++s) EXPECT_NE(exe.step(s).rule, "Conv+Elementwise");
  expect_near(exe.run(b.inputs)[0], want, "per row");
}

// A symbolic batch (as torch captures): the operands are judged on the known dimensions, so a
// per-row operand is still refused at compile time and the others still fuse.
TEST(ConvEpilogue, SymbolicBatch) {
  for (bool per_row : {false, true}) {
    SCOPED_TRACE(per_row);
    const Dims pos = per_row ? Dims{8, 1} : Dims{8, 8};
    Built b =
        conv_with_chain({"symbolic", {2, 4, 8, 8}, {6, 4, 3, 3}, {}, {1, 1, 1, 1}, 1, true, pos});
    b.g.value(b.g.inputs()[0]).type.shape = Shape{Dim::sym("n"), Dim(4), Dim(8), Dim(8)};
    b.g.value(b.g.inputs()[1]).type.shape = Shape{Dim::sym("n"), Dim(6), Dim(8), Dim(8)};
    b.g.value(b.g.inputs()[4]).type.shape = Shape{Dim::sym("n"), Dim(6), Dim(1), Dim(1)};
    Executable exe = compile(b.g, {.level = 2});
    bool fused = false;
    for (size_t s = 0; s < exe.num_steps(); ++s)
      fused = fused || exe.step(s).rule == "Conv+Elementwise";
    EXPECT_EQ(fused, !per_row);
    for (int64_t n : {1, 3}) {
      std::vector<Tensor> in = {random_tensor({n, 4, 8, 8}, 2), random_tensor({n, 6, 8, 8}, 3),
                                random_tensor(pos, 4), random_tensor({1}, 5),
                                random_tensor({n, 6, 1, 1}, 6)};
      Graph typed = b.g;
      for (size_t i = 0; i < in.size(); ++i)
        typed.value(typed.inputs()[i]).type.shape = to_shape(in[i].shape());
      expect_near(exe.run(in)[0], reference_of(typed, in)[0], cat("batch ", n));
      if (!per_row) expect_near(run_step_alone(exe, 0, in), reference_of(typed, in)[0], "alone");
    }
  }
}

// An operand whose shape is only known at run time: [8, 8] fuses; [8, 1] (per output row) makes
// the kernel decline before it writes anything, and the runtime runs the nodes one by one.
TEST(ConvEpilogue, AnOperandItCannotIndexAtRunTimeDeclines) {
  Built b =
      conv_with_chain({"declines", {2, 4, 8, 8}, {6, 4, 3, 3}, {}, {1, 1, 1, 1}, 1, true, {8, 8}});
  b.g.value(b.g.inputs()[2]).type.shape = Shape{Dim::sym("a"), Dim::sym("b")};
  Executable exe = compile(b.g, {.level = 2});
  ASSERT_EQ(exe.num_steps(), 1u);
  EXPECT_EQ(exe.step(0).rule, "Conv+Elementwise");
  for (const Dims& pos : {Dims{8, 8}, Dims{8, 1}, Dims{8, 8}}) {
    SCOPED_TRACE(dims_str(pos));
    b.inputs[2] = random_tensor(pos, 4);
    Graph typed = b.g;
    typed.value(typed.inputs()[2]).type.shape = to_shape(pos);
    const Tensor want = reference_of(typed, b.inputs)[0];
    expect_near(exe.run(b.inputs)[0], want, "run");
    if (pos[1] == 8)
      expect_near(run_step_alone(exe, 0, b.inputs), want, "alone");
    else
      EXPECT_THROW(run_step_alone(exe, 0, b.inputs), KernelDeclined);
  }
}

// One step of a chain after the conv: `op` on the running value and, for a binary op, the
// residual input or a constant.
struct ChainStep {
  std::string op;
  bool residual = false;
  Tensor constant;  // undefined: none
};

// x [2, 4, 8, 8] -> Conv(3x3, 6 channels, pad 1, a bias B when `bias`) -> the steps; inputs x and
// the residual r [2, 6, 8, 8]. Compiled at level 2, it must be one kernel of `rule` whose result,
// in the executable and alone, is the reference's.
void expect_one_kernel(const std::vector<ChainStep>& steps, bool bias, const std::string& rule) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, to_shape({2, 4, 8, 8})});
  ValueId r = g.add_input("r", {DType::kF32, to_shape({2, 6, 8, 8})});
  ValueId w = g.add_value("w");
  g.set_initializer(w, random_tensor({6, 4, 3, 3}, 1));
  std::vector<ValueId> conv_in = {x, w};
  if (bias) {
    conv_in.push_back(g.add_value("b"));
    g.set_initializer(conv_in.back(), random_tensor({6}, 2));
  }
  ValueId v = g.add_value("c");
  Attributes pads;
  pads.set("pads", Dims{1, 1, 1, 1});
  g.add_node("Conv", conv_in, {v}, pads, "conv");
  for (size_t i = 0; i < steps.size(); ++i) {
    std::vector<ValueId> in = {v};
    if (steps[i].residual) in.push_back(r);
    if (steps[i].constant.defined()) {
      in.push_back(g.add_value(cat("k", i)));
      g.set_initializer(in.back(), steps[i].constant);
    }
    v = g.add_value(cat("v", i));
    g.add_node(steps[i].op, in, {v}, {}, cat(steps[i].op, i));
  }
  g.add_output(v);
  const std::vector<Tensor> in = {random_tensor({2, 4, 8, 8}, 3), random_tensor({2, 6, 8, 8}, 4)};
  Executable exe = compile(g, {.level = 2});
  ASSERT_EQ(exe.num_steps(), 1u);
  EXPECT_EQ(exe.step(0).rule, rule);
  const Tensor want = reference_of(g, in)[0];
  expect_near(exe.run(in)[0], want, "fused");
  expect_near(run_step_alone(exe, 0, in), want, "alone");
}

// The bias/residual/activation epilogue is faster: it stays chosen when it takes as many nodes.
TEST(ConvEpilogue, TheClosedEpilogueStaysWhenItCoversTheChain) {
  expect_one_kernel({{"Add", true}, {"Relu"}}, true, "Conv+Add+Relu");
  // a constant per-channel Add folds into the conv's bias (FoldBatchNorm) before fusion
  expect_one_kernel({{"Add", false, random_tensor({6, 1, 1}, 5)}, {"Sigmoid"}}, false,
                    "Conv+Sigmoid");
}

// The tile program where it takes more nodes than bias/residual/activation would: Conv + Add
// (residual) + Mul (a scalar constant) + Relu, and Conv + Add + Mul (per channel, after the
// residual: it cannot fold into the conv) + Sigmoid.
TEST(ConvEpilogue, TheTileProgramWhenItTakesMore) {
  expect_one_kernel({{"Add", true}, {"Mul", false, Tensor::scalar(0.5f)}, {"Relu"}}, false,
                    "Conv+Elementwise");
  expect_one_kernel({{"Add", true}, {"Mul", false, random_tensor({6, 1, 1}, 6)}, {"Sigmoid"}}, true,
                    "Conv+Elementwise");
}

// Level 3: convs AssignLayouts makes blocked (ConvBlocked, NCHWc output) never take a tile
// epilogue; the chain runs on its own kernels and the answer is the reference's.
TEST(ConvEpilogue, Level3StaysCorrect) {
  Built b = conv_with_chain(
      {"level 3", {2, 16, 10, 10}, {32, 16, 3, 3}, {}, {1, 1, 1, 1}, 1, true, {10, 10}, true});
  const Tensor want = reference_of(b.g, b.inputs)[0];
  Executable exe = compile(b.g, {.level = 3});
  // The 3x3 stride-1 convs run Winograd F(4x4, 3x3) at level 3, whose rounding is stated as
  // 1e-4 of the output's scale (docs/backend/conv.md); the direct kernels' 1e-5 is too tight.
  for (int round = 0; round < 2; ++round)
    expect_near(exe.run(b.inputs)[0], want, cat("level 3 round ", round), 1e-4);
  int blocked = 0;
  for (const Node& n : exe.graph().nodes()) blocked += n.op == "ConvBlocked";
  EXPECT_EQ(blocked, 2);
  for (size_t s = 0; s < exe.num_steps(); ++s) EXPECT_NE(exe.step(s).rule, "Conv+Elementwise");
}

}  // namespace
}  // namespace pto
