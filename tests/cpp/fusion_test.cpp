// Level 2 end to end: the fusion rules form the kernels they should (and no others), the CPU
// backend runs them, and every result equals the reference interpreter's on the unfused graph.
// Also the memory plan: the arena is smaller than the sum of intermediates, steady-state runs
// reuse it, and concurrent runs do not interfere.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <thread>

#include "pto/executable.h"
#include "pto/reference.h"
#include "random_tensor.h"

namespace pto {
namespace {

using testing::constant;
using testing::random_tensor;

void expect_near(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  double scale = 1;  // errors of a deep stack grow with the values: relative to the largest
  for (int64_t i = 0; i < b.numel(); ++i) scale = std::max(scale, std::abs(b.item_as_double(i)));
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.item_as_double(i), y = b.item_as_double(i);
    ASSERT_NEAR(x, y, tol * scale) << what << " element " << i;
  }
}

// Compiles at `level`, runs on `inputs` twice (the second run reuses the arena) and compares with
// the reference interpreter on the graph as built.
Executable check_against_reference(const Graph& g, const std::vector<Tensor>& inputs, int level) {
  Graph typed = g;
  infer_types(typed);
  const std::vector<Tensor> want = reference::run(typed, inputs);
  Executable exe = compile(g, {.level = level});
  for (int round = 0; round < 2; ++round) {
    std::vector<Tensor> got = exe.run(inputs);
    EXPECT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size() && i < want.size(); ++i)
      expect_near(got[i], want[i], 1e-5, cat("level ", level, " round ", round, " output ", i));
  }
  return exe;
}

// x -> Conv(w) -> Add(bias [C,1,1]) -> Add(residual r) -> Relu
Graph conv_chain(int64_t n) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, to_shape({n, 8, 9, 9})});
  ValueId r = g.add_input("r", {DType::kF32, to_shape({n, 16, 9, 9})});
  ValueId w = constant(g, "w", {16, 8, 3, 3}, 1);
  ValueId b = constant(g, "b", {16, 1, 1}, 2);
  ValueId c = g.add_value("c"), cb = g.add_value("cb"), cr = g.add_value("cr"),
          y = g.add_value("y");
  Attributes a;
  a.set("pads", std::vector<int64_t>{1, 1, 1, 1});
  g.add_node("Conv", {x, w}, {c}, a, "conv");
  g.add_node("Add", {c, b}, {cb}, {}, "bias");
  g.add_node("Add", {r, cb}, {cr}, {}, "residual");
  g.add_node("Relu", {cr}, {y}, {}, "relu");
  g.add_output(y);
  return g;
}

TEST(Fusion, ConvBiasResidualReluIsOneKernel) {
  Graph g = conv_chain(2);
  std::vector<Tensor> in = {random_tensor({2, 8, 9, 9}, 3), random_tensor({2, 16, 9, 9}, 4)};
  Executable exe = check_against_reference(g, in, 2);
  ASSERT_EQ(exe.num_steps(), 1u);
  // the constant bias Add folds into the conv's bias (FoldBatchNorm) before fusion
  EXPECT_EQ(exe.step(0).rule, "Conv+Add+Relu");
  EXPECT_EQ(exe.step(0).backend, "cpu");
  EXPECT_EQ(exe.step(0).nodes.size(), 3u);
  // Level 0 runs the same graph op by op.
  EXPECT_EQ(check_against_reference(g, in, 0).num_steps(), 4u);
}

TEST(Fusion, SharedIntermediateStaysUnfused) {
  Graph g = conv_chain(1);
  // A second reader of the conv output: the epilogue cannot swallow it.
  ValueId c = *g.find_value("c");
  ValueId z = g.add_value("z");
  g.add_node("Sigmoid", {c}, {z}, {}, "other_reader");
  g.add_output(z);
  std::vector<Tensor> in = {random_tensor({1, 8, 9, 9}, 5), random_tensor({1, 16, 9, 9}, 6)};
  Executable exe = check_against_reference(g, in, 2);
  for (size_t s = 0; s < exe.num_steps(); ++s)
    if (exe.step(s).rule.rfind("Conv", 0) == 0) ADD_FAILURE() << "conv fused: " << exe.step(s).rule;
}

TEST(Fusion, MatMulBiasActivations) {
  for (const char* act : {"Gelu", "Tanh", "Sigmoid", "Relu", "Silu"}) {
    Graph g;
    ValueId x = g.add_input("x", {DType::kF32, to_shape({3, 5, 32})});
    ValueId w = constant(g, "w", {32, 24}, 7);
    ValueId b = constant(g, "b", {24}, 8);
    ValueId m = g.add_value("m"), mb = g.add_value("mb"), y = g.add_value("y");
    g.add_node("MatMul", {x, w}, {m}, {}, "mm");
    g.add_node("Add", {m, b}, {mb}, {}, "bias");
    if (std::string(act) == "Silu") {
      ValueId s = g.add_value("s");
      g.add_node("Sigmoid", {mb}, {s}, {}, "sig");
      g.add_node("Mul", {mb, s}, {y}, {}, "mul");
    } else {
      g.add_node(act, {mb}, {y}, {}, "act", 20);
    }
    g.add_output(y);
    Executable exe = check_against_reference(g, {random_tensor({3, 5, 32}, 9)}, 2);
    ASSERT_EQ(exe.num_steps(), 1u) << act;
    EXPECT_EQ(exe.step(0).rule, cat("MatMul+Bias+", act)) << act;
  }
}

TEST(Fusion, GemmWithCAndClip) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, to_shape({4, 16})});
  ValueId w = constant(g, "w", {8, 16}, 10);
  ValueId c = constant(g, "c", {8}, 11);
  ValueId lo = g.add_value("lo"), hi = g.add_value("hi");
  g.set_initializer(lo, Tensor::scalar(0.0f));
  g.set_initializer(hi, Tensor::scalar(0.5f));
  ValueId m = g.add_value("m"), y = g.add_value("y");
  Attributes a;
  a.set("transB", int64_t{1});
  g.add_node("Gemm", {x, w, c}, {m}, a, "gemm");
  g.add_node("Clip", {m, lo, hi}, {y}, {}, "clip");
  g.add_output(y);
  Executable exe = check_against_reference(g, {random_tensor({4, 16}, 12)}, 2);
  ASSERT_EQ(exe.num_steps(), 1u);
  EXPECT_EQ(exe.step(0).rule, "Gemm+Clip");
}

// A chain of convs: each intermediate is dead two steps later, so the arena holds two buffers.
Graph conv_stack(int depth, const Shape& xshape) {
  Graph g;
  ValueId cur = g.add_input("x", {DType::kF32, xshape});
  for (int i = 0; i < depth; ++i) {
    ValueId w = constant(g, cat("w", i), {8, 8, 3, 3}, 20 + i);
    ValueId y = g.add_value(cat("y", i));
    Attributes a;
    a.set("pads", std::vector<int64_t>{1, 1, 1, 1});
    g.add_node("Conv", {cur, w}, {y}, a, cat("conv", i));
    ValueId r = g.add_value(cat("r", i));
    g.add_node("Relu", {y}, {r}, {}, cat("relu", i));
    cur = r;
  }
  g.add_output(cur);
  return g;
}

TEST(MemoryPlan, ChainReusesTwoBuffers) {
  Graph g = conv_stack(8, to_shape({1, 8, 16, 16}));
  Executable exe = check_against_reference(g, {random_tensor({1, 8, 16, 16}, 30)}, 2);
  const ExecutableStats s = exe.stats();
  EXPECT_EQ(s.kernels, 8u);
  EXPECT_TRUE(s.memory_planned);
  const size_t one = 8 * 16 * 16 * sizeof(float);
  EXPECT_EQ(s.unplanned_peak_bytes, 7 * one);  // the last conv's output is the graph output
  EXPECT_EQ(s.peak_bytes, 2 * one);
  // Steady state: the arena and the pool serve everything.
  Tensor x = random_tensor({1, 8, 16, 16}, 31);
  exe.run({x});
  const size_t before = exe.memory_stats().system_allocations;
  exe.run({x});
  EXPECT_EQ(exe.memory_stats().system_allocations, before);
}

TEST(MemoryPlan, OptionOffRunsUnplanned) {
  Graph g = conv_stack(4, to_shape({1, 8, 8, 8}));
  CompileOptions o;
  o.memory_optimization = false;
  Executable exe = compile(g, o);
  EXPECT_FALSE(exe.stats().memory_planned);
  EXPECT_EQ(exe.stats().peak_bytes, exe.stats().unplanned_peak_bytes);
}

TEST(MemoryPlan, SymbolicBatchPlansPerShapeAndRunsConcurrently) {
  Graph g = conv_stack(6, Shape{Dim::sym("batch"), Dim(8), Dim(12), Dim(12)});
  Executable exe = compile(g, {.level = 2});
  EXPECT_FALSE(exe.stats().memory_planned);  // no shapes yet
  for (int64_t n : {1, 3, 2}) {
    Tensor x = random_tensor({n, 8, 12, 12}, 40 + static_cast<uint32_t>(n));
    Graph typed = g;
    infer_types(typed);
    const Tensor want = reference::run(typed, {x})[0];
    expect_near(exe.run({x})[0], want, 1e-5, cat("batch ", n));
    EXPECT_EQ(exe.stats({{n, 8, 12, 12}}).peak_bytes, 2 * static_cast<size_t>(n) * 8 * 144 * 4);
  }
  // Two threads running different batch sizes at once get their own arenas.
  Tensor a = random_tensor({2, 8, 12, 12}, 50), b = random_tensor({3, 8, 12, 12}, 51);
  const Tensor ya = exe.run({a})[0], yb = exe.run({b})[0];
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const Tensor& x = t ? b : a;
        const Tensor& want = t ? yb : ya;
        Tensor got = exe.run({x})[0];
        for (int64_t k = 0; k < got.numel(); ++k)
          if (got.data<float>()[k] != want.data<float>()[k]) {
            ++mismatches;
            break;
          }
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(MemoryPlan, ViewsKeepTheirRootAlive) {
  // conv -> Reshape (a view) -> ... the reshaped value is read after the conv's other uses end.
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, to_shape({1, 8, 6, 6})});
  ValueId w = constant(g, "w", {8, 8, 3, 3}, 60);
  ValueId y = g.add_value("y"), flat = g.add_value("flat"), shape = g.add_value("shape");
  g.set_initializer(shape, Tensor::from_vector<int64_t>({1, 288}, {2}));
  Attributes a;
  a.set("pads", std::vector<int64_t>{1, 1, 1, 1});
  g.add_node("Conv", {x, w}, {y}, a, "conv");
  g.add_node("Reshape", {y, shape}, {flat}, {}, "reshape");
  ValueId cur = flat;
  for (int i = 0; i < 4; ++i) {  // a chain that would reuse y's bytes if the view were ignored
    ValueId s = g.add_value(cat("s", i));
    g.add_node(i % 2 ? "Relu" : "Sigmoid", {i == 0 ? flat : cur}, {s}, {}, cat("f", i));
    cur = s;
  }
  ValueId sum = g.add_value("sum");
  g.add_node("Add", {cur, flat}, {sum}, {}, "add");
  g.add_output(sum);
  check_against_reference(g, {random_tensor({1, 8, 6, 6}, 61)}, 2);
}

// A step with two outputs of one size, one of them a graph output (left to the pool) and the
// other planned: the step's allocator hands out slots by size in the kernel's order, so the graph
// output took the other's slot and the later steps wrote over it (the ONNX attention tests with a
// softcapped qk_matmul_output). A planned output now shares no size with a pool one of its step.
TEST(MemoryPlan, AGraphOutputBesideAPlannedOutputOfItsSize) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, to_shape({2, 3, 4, 6})});
  ValueId mask = g.add_input("mask", {DType::kF32, to_shape({4, 6})});
  ValueId s = g.add_value("s"), a = g.add_value("a"), p = g.add_value("p"), m = g.add_value("m"),
          y = g.add_value("y");
  ValueId w = constant(g, "w", {6, 6}, 62);
  g.add_node("Tanh", {x}, {s}, {}, "tanh");
  g.add_node("Add", {s, mask}, {a}, {}, "mask");
  g.add_node("Softmax", {a}, {p}, {}, "softmax", 13);
  g.add_node("MatMul", {p, w}, {m}, {}, "mm1");  // later steps that reuse a's bytes
  g.add_node("MatMul", {m, w}, {y}, {}, "mm2");
  g.add_output(s);
  g.add_output(y);
  Executable exe =
      check_against_reference(g, {random_tensor({2, 3, 4, 6}, 63), random_tensor({4, 6}, 64)}, 2);
  ASSERT_EQ(exe.step(0).rule, "Elementwise");  // Tanh and Add: outputs s and a
}

}  // namespace
}  // namespace pto

namespace pto {
namespace {

// Gemm with a row C, then a Reshape (a view), then a residual Add: the transformer's output
// projection. M = 1 is the case where a [1, N] C could be mistaken for a full residual.
TEST(Fusion, GemmRowBiasThroughReshapeThenResidual) {
  // [M, 8] viewed as [M, 1, 8] keeps rows of N = 8 and fuses; as [M, 2, 4] it does not (the
  // epilogue works on rows of N) and runs as two kernels, with the same numbers.
  for (auto [view, steps] : {std::pair<Dims, size_t>{{1, 8}, 1}, {{2, 4}, 2}}) {
    for (int64_t m : {1, 6}) {
      Graph g;
      ValueId x = g.add_input("x", {DType::kF32, to_shape({m, 16})});
      ValueId r = g.add_input("r", {DType::kF32, to_shape({m, view[0], view[1]})});
      ValueId w = constant(g, "w", {8, 16}, 70);
      ValueId c = constant(g, "c", {8}, 71);
      ValueId shape = g.add_value("shape");
      g.set_initializer(shape, Tensor::from_vector<int64_t>({-1, view[0], view[1]}, {3}));
      ValueId p = g.add_value("p"), v = g.add_value("v"), y = g.add_value("y");
      Attributes a;
      a.set("transB", int64_t{1});
      g.add_node("Gemm", {x, w, c}, {p}, a, "gemm");
      g.add_node("Reshape", {p, shape}, {v}, {}, "view");
      g.add_node("Add", {v, r}, {y}, {}, "residual");
      g.add_output(y);
      std::vector<Tensor> in = {random_tensor({m, 16}, 72),
                                random_tensor({m, view[0], view[1]}, 73)};
      Executable exe = check_against_reference(g, in, 2);
      ASSERT_EQ(exe.num_steps(), steps) << m << " " << view[1];
      if (steps == 1) {
        EXPECT_EQ(exe.step(0).rule, "Gemm+Add");
      }
    }
  }
}

// A residual that only broadcasts at run time (the unknown batch is 1 on one side): the fused
// kernel declines and the runtime runs the group node by node, with the reference's answer.
TEST(Fusion, UnknownDimThatBroadcastsRunsUnfused) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::unknown(), 16}});
  ValueId r = g.add_input("r", {DType::kF32, Shape{Dim::unknown(), 8}});
  ValueId w = constant(g, "w", {16, 8}, 80);
  ValueId p = g.add_value("p"), y = g.add_value("y"), z = g.add_value("z");
  g.add_node("MatMul", {x, w}, {p}, {}, "mm");
  g.add_node("Add", {p, r}, {y}, {}, "residual");
  g.add_node("Relu", {y}, {z}, {}, "relu");
  g.add_output(z);
  Executable exe = compile(g, {.level = 2});
  ASSERT_EQ(exe.num_steps(), 1u);
  for (auto [mx, mr] : {std::pair<int64_t, int64_t>{4, 4}, {4, 1}, {1, 5}}) {
    std::vector<Tensor> in = {random_tensor({mx, 16}, 81), random_tensor({mr, 8}, 82)};
    Graph typed = g;
    infer_types(typed);
    expect_near(exe.run(in)[0], reference::run(typed, in)[0], 1e-5, cat(mx, " x ", mr));
  }
}

}  // namespace
}  // namespace pto

namespace pto {
namespace {

// Group A = {Mul, Sqrt, Reciprocal} over [3, 1] spans group B = {Div, Relu} over [3, 4], which
// reads Sqrt's output: A must run first although its last node comes after B's (kernels are
// ordered by their dependencies, not by their last nodes). The conformance run found this on
// the expanded LayerNormalization tests.
TEST(Fusion, AGroupSpanningItsReaderRunsFirst) {
  Graph g;
  ValueId p = g.add_input("p", {DType::kF32, to_shape({3, 1})});
  ValueId x = g.add_input("x", {DType::kF32, to_shape({3, 4})});
  ValueId a = g.add_value("a"), s = g.add_value("s"), y = g.add_value("y"), r = g.add_value("r"),
          z = g.add_value("z");
  g.add_node("Mul", {p, p}, {a}, {}, "square");
  g.add_node("Sqrt", {a}, {s}, {}, "sqrt");
  g.add_node("Div", {x, s}, {y}, {}, "div");
  g.add_node("Relu", {y}, {r}, {}, "relu");
  g.add_node("Reciprocal", {s}, {z}, {}, "reciprocal");
  g.add_output(r);
  g.add_output(z);
  Executable exe =
      check_against_reference(g, {random_tensor({3, 1}, 100), random_tensor({3, 4}, 101)}, 2);
  EXPECT_EQ(exe.num_steps(), 2u);
}

}  // namespace
}  // namespace pto

namespace pto {
namespace {

// MatMul + bias + a chain the bias/residual/activation epilogue cannot express: the chain runs
// as a tile program on each C block (per-column, scalar, per-row and full operands). An operand
// the GEMM cannot index ([5, 8], broadcast over the batch) makes the kernel decline: same numbers.
TEST(Fusion, MatMulWithAnElementwiseChainAsTileEpilogue) {
  for (bool broadcast_operand : {false, true}) {
    Graph g;
    ValueId x = g.add_input("x", {DType::kF32, to_shape({2, 5, 16})});
    ValueId r = g.add_input("r", {DType::kF32, to_shape({2, 5, 8})});
    ValueId p = g.add_input("p", {DType::kF32, to_shape({2, 5, 1})});
    ValueId q =
        g.add_input("q", {DType::kF32, broadcast_operand ? to_shape({5, 8}) : to_shape({1, 8})});
    ValueId w = constant(g, "w", {16, 8}, 110);
    ValueId b = constant(g, "b", {8}, 111);
    ValueId half = g.add_value("half");
    g.set_initializer(half, Tensor::scalar(0.5f));
    ValueId m = g.add_value("m"), mb = g.add_value("mb"), h = g.add_value("h"),
            d = g.add_value("d"), e = g.add_value("e"), f = g.add_value("f"), y = g.add_value("y");
    g.add_node("MatMul", {x, w}, {m}, {}, "mm");
    g.add_node("Add", {m, b}, {mb}, {}, "bias");
    g.add_node("Mul", {mb, half}, {h}, {}, "half");
    g.add_node("Sub", {h, r}, {d}, {}, "minus_full");
    g.add_node("Add", {d, p}, {e}, {}, "plus_row");
    g.add_node("Mul", {e, q}, {f}, {}, "times_q");
    g.add_node("Abs", {f}, {y}, {}, "abs");
    g.add_output(y);
    std::vector<Tensor> in = {random_tensor({2, 5, 16}, 112), random_tensor({2, 5, 8}, 113),
                              random_tensor({2, 5, 1}, 114),
                              random_tensor(broadcast_operand ? Dims{5, 8} : Dims{1, 8}, 115)};
    Executable exe = check_against_reference(g, in, 2);
    ASSERT_EQ(exe.num_steps(), 1u) << broadcast_operand;
    EXPECT_EQ(exe.step(0).rule, "MatMul+Elementwise");
    EXPECT_NE(exe.describe_step(0).find("in0"), std::string::npos);  // the program is printable
  }
}

// Cast(int32 -> float) joins an elementwise group (the tile program loads the int32 input and
// converts it, rounding to nearest as Cast does): an integer product's accumulators scaled, biased
// and rectified in one pass. Values beyond 2^24 round; the extremes convert exactly.
TEST(Fusion, CastFromInt32JoinsAnElementwiseGroup) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kI32, to_shape({3, 37})});
  ValueId s = g.add_value("s"), b = g.add_value("b");
  g.set_initializer(s, Tensor::scalar(0.001f));
  g.set_initializer(b, random_tensor({37}, 130));
  ValueId f = g.add_value("f"), m = g.add_value("m"), a = g.add_value("a"), y = g.add_value("y");
  Attributes to_float;
  to_float.set("to", int64_t{1});
  g.add_node("Cast", {x}, {f}, to_float, "cast");
  g.add_node("Mul", {f, s}, {m}, {}, "scale");
  g.add_node("Add", {m, b}, {a}, {}, "bias");
  g.add_node("Relu", {a}, {y}, {}, "relu");
  g.add_output(y);
  Tensor in = Tensor::empty(DType::kI32, {3, 37});
  const int32_t edges[] = {0, 1, -1, (1 << 24) + 1, -(1 << 24) - 3, 2147483647, -2147483647 - 1};
  for (int64_t i = 0; i < in.numel(); ++i)
    in.data<int32_t>()[i] = i < 7 ? edges[i] : static_cast<int32_t>((i * 2654435761u) >> 3);
  Executable exe = check_against_reference(g, {in}, 2);
  ASSERT_EQ(exe.num_steps(), 1u);
  EXPECT_EQ(exe.step(0).rule, "Elementwise");
}

// An LSTM cell's gates: c' = sigmoid(b) c + sigmoid(a) tanh(c~), h = sigmoid(d) tanh(c'). Grown
// forward from the first gate alone, the group would leave the other gates' branches (their
// readers taken) as kernels of their own; grown backward too, the four branches are one kernel
// with two outputs. A gate also read outside the group (a graph output) stays out of it.
TEST(Fusion, SiblingBranchesJoinTheirReadersGroup) {
  for (bool gate_out : {false, true}) {
    Graph g;
    std::vector<ValueId> in;
    for (const char* name : {"a", "b", "cand", "d", "c"})
      in.push_back(g.add_input(name, {DType::kF32, to_shape({3, 37})}));
    auto node = [&](const char* op, std::vector<ValueId> args, const char* out) {
      const ValueId v = g.add_value(out);
      g.add_node(op, args, {v}, {}, out);
      return v;
    };
    const ValueId i = node("Sigmoid", {in[0]}, "i"), f = node("Sigmoid", {in[1]}, "f");
    const ValueId t = node("Tanh", {in[2]}, "t"), o = node("Sigmoid", {in[3]}, "o");
    const ValueId fc = node("Mul", {f, in[4]}, "fc"), it = node("Mul", {i, t}, "it");
    const ValueId c2 = node("Add", {fc, it}, "c2");
    const ValueId h = node("Mul", {o, node("Tanh", {c2}, "tc")}, "h");
    g.add_output(c2);
    g.add_output(h);
    if (gate_out) g.add_output(f);
    std::vector<Tensor> x;
    for (uint64_t k = 0; k < 5; ++k) x.push_back(random_tensor({3, 37}, 140 + k));
    Executable exe = check_against_reference(g, x, 2);
    ASSERT_EQ(exe.num_steps(), gate_out ? 2u : 1u);
    EXPECT_EQ(exe.step(gate_out ? 1 : 0).rule, "Elementwise");
    EXPECT_EQ(exe.step(gate_out ? 1 : 0).nodes.size(), gate_out ? 8u : 9u);
  }
}

// Shrink is a tile op: Add, Shrink and Mul run as one elementwise kernel.
TEST(Fusion, ShrinkJoinsAnElementwiseGroup) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, to_shape({5, 67})});
  ValueId b = g.add_value("b"), s = g.add_value("s");
  g.set_initializer(b, random_tensor({67}, 140));
  g.set_initializer(s, Tensor::scalar(1.5f));
  ValueId a = g.add_value("a"), h = g.add_value("h"), y = g.add_value("y");
  Attributes shrink;
  shrink.set("lambd", 0.3);
  shrink.set("bias", 0.25);
  g.add_node("Add", {x, b}, {a}, {}, "bias");
  g.add_node("Shrink", {a}, {h}, shrink, "shrink");
  g.add_node("Mul", {h, s}, {y}, {}, "scale");
  g.add_output(y);
  Tensor in = random_tensor({5, 67}, 141);
  in.data<float>()[3] = NAN;
  Executable exe = check_against_reference(g, {in}, 2);
  ASSERT_EQ(exe.num_steps(), 1u);
  EXPECT_EQ(exe.step(0).rule, "Elementwise");
}

// SwiGLU is a tile op on operands of one static shape: Add, SwiGLU and Mul run as one kernel.
TEST(Fusion, SwiGLUJoinsAnElementwiseGroup) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, to_shape({4, 96})});
  ValueId gate = g.add_input("gate", {DType::kF32, to_shape({4, 96})});
  ValueId b = g.add_value("b"), s = g.add_value("s");
  g.set_initializer(b, random_tensor({96}, 150));
  g.set_initializer(s, Tensor::scalar(0.5f));
  ValueId a = g.add_value("a"), h = g.add_value("h"), y = g.add_value("y");
  Attributes alpha;
  alpha.set("alpha", 1.702);
  g.add_node("Add", {x, b}, {a}, {}, "bias");
  g.add_node("SwiGLU", {a, gate}, {h}, alpha, "swiglu");
  g.add_node("Mul", {h, s}, {y}, {}, "scale");
  g.add_output(y);
  Executable exe =
      check_against_reference(g, {random_tensor({4, 96}, 151), random_tensor({4, 96}, 152)}, 2);
  ASSERT_EQ(exe.num_steps(), 1u);
  EXPECT_EQ(exe.step(0).rule, "Elementwise");
}

// The rules of each step of `exe`, in order ("" for a single node's).
std::vector<std::string> step_rules(const Executable& exe) {
  std::vector<std::string> r;
  for (size_t i = 0; i < exe.num_steps(); ++i) r.push_back(exe.step(i).rule);
  return r;
}

// A norm with the Casts around it runs on its own kernel (rule Cast+LayerNormalization+Cast,
// fusion/node_casts.h) where they are all its Casts; a norm with more elementwise work after it,
// or whose output something else also reads, runs alone on its kernel, the rest after it (a norm
// in a tile program is several passes over each tile: fuse_kernels.cpp, row_op).
TEST(Fusion, ANormTakesItsCastsOnlyWhenTheyAreAllThereIs) {
  const std::vector<std::vector<std::string>> want = {
      {"LayerNormalization+Cast"}, {"", ""}, {"", ""}};
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    Graph g;
    ValueId x = g.add_input("x", {DType::kF32, to_shape({5, 37})});
    ValueId y = g.add_value("y"), z = g.add_value("z");
    Attributes to_bf16;
    to_bf16.set("to", int64_t{16});
    g.add_node("LayerNormalization", {x, constant(g, "scale", {37}, 140)}, {y}, {}, "norm", 17);
    if (variant == 2) {
      g.add_node("Mul", {y, y}, {z}, {}, "square");
    } else {
      g.add_node("Cast", {y}, {z}, to_bf16, "narrow");
      if (variant == 1) g.add_output(y);
    }
    g.add_output(z);
    Executable exe = compile(g, {.level = 2});
    EXPECT_EQ(step_rules(exe), want[variant]);
    const std::vector<Tensor> in = {random_tensor({5, 37}, 141)};
    const std::vector<Tensor> got = exe.run(in), ref = reference::run(exe.graph(), in);
    for (size_t o = 0; o < got.size(); ++o)  // a bf16 output may round the other way: 1 unit
      expect_near(got[o], ref[o], 0x1p-7, cat("output ", o));
  }
}

// Adds feeding a LayerNormalization's input run on the norm's kernel (fusion/sum_norm.h), which
// also writes a sum something else reads; a Mul among the Adds, or an elementwise reader of the
// norm's output, is a kernel of its own (no tile program takes the norm); every variant matches
// the reference.
TEST(Fusion, AddsIntoANormOnlyWhenTheyAreAllThereIs) {
  const std::vector<std::vector<std::string>> want = {{"Add+LayerNormalization"},
                                                      {"Elementwise", ""},
                                                      {"Add+LayerNormalization", ""},
                                                      {"Add+LayerNormalization", ""}};
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE(variant);
    Graph g;
    ValueId x = g.add_input("x", {DType::kF32, to_shape({6, 40})});
    ValueId r = g.add_input("r", {DType::kF32, to_shape({6, 40})});
    ValueId s = g.add_value("s"), y = g.add_value("y"), z = g.add_value("z");
    g.add_node("Add", {x, r}, {s}, {}, "add", 17);
    ValueId in = s;
    if (variant == 1) {
      in = g.add_value("s2");
      g.add_node("Mul", {s, r}, {in}, {}, "mul", 17);
    }
    g.add_node("LayerNormalization", {in, constant(g, "scale", {40}, 150)}, {y}, {}, "norm", 17);
    g.add_output(y);
    if (variant == 2) {
      g.add_node("Relu", {s}, {z}, {}, "relu", 17);
      g.add_output(z);
    }
    if (variant == 3) {
      g.add_node("Add", {y, x}, {z}, {}, "after", 17);
      g.add_output(z);
    }
    const std::vector<Tensor> inputs = {random_tensor({6, 40}, 151), random_tensor({6, 40}, 152)};
    Executable exe = check_against_reference(g, inputs, 2);
    EXPECT_EQ(step_rules(exe), want[variant]);
  }
}

// A sum into a norm whose output a Cast stores in bf16 or f16 (a half model's pre-norm: the
// LayerNorm's output read only by products): one kernel, the norm's, adding the operands as it
// loads each row and storing the half output (rule "Add+LayerNormalization+Cast"); with the norm's
// float output read elsewhere too, the Cast is a kernel of its own. LayerNorm and RMSNorm, bf16
// and f16, against the reference.
TEST(Fusion, AddsIntoANormThatACastStores) {
  for (const char* op : {"LayerNormalization", "RMSNormalization"})
    for (int64_t to : {int64_t{16}, int64_t{10}})  // bf16, f16
      for (bool y_read_too : {false, true}) {
        SCOPED_TRACE(cat(op, " to ", to, y_read_too ? ", Y read too" : ""));
        Graph g;
        ValueId x = g.add_input("x", {DType::kF32, to_shape({7, 48})});
        ValueId r = g.add_input("r", {DType::kF32, to_shape({7, 48})});
        ValueId s = g.add_value("s"), y = g.add_value("y"), z = g.add_value("z");
        g.add_node("Add", {x, r}, {s}, {}, "add", 17);
        g.add_node(op, {s, constant(g, "scale", {48}, 160)}, {y}, {}, "norm", 23);
        Attributes cast;
        cast.set("to", to);
        g.add_node("Cast", {y}, {z}, cast, "store", 17);
        g.add_output(z);
        if (y_read_too) g.add_output(y);
        const std::vector<Tensor> in = {random_tensor({7, 48}, 161), random_tensor({7, 48}, 162)};
        Executable exe = compile(g, {.level = 2});
        const std::string norm = cat("Add+", op);
        const std::vector<std::string> want = y_read_too ? std::vector<std::string>{norm, ""}
                                                         : std::vector<std::string>{norm + "+Cast"};
        EXPECT_EQ(step_rules(exe), want);
        const std::vector<Tensor> got = exe.run(in), ref = reference::run(exe.graph(), in);
        ASSERT_EQ(got.size(), ref.size());
        for (size_t o = 0; o < got.size(); ++o) {  // a half output may round the other way
          EXPECT_EQ(got[o].dtype(), ref[o].dtype()) << "output " << o;
          expect_near(got[o], ref[o], to == 16 ? 0x1p-7 : 0x1p-10, cat("output ", o));
        }
      }
}

// A quantized residual add (what a QOperator QLinearAdd lowers to): both DequantizeLinears join
// the add's group backward, so it reads the bytes; the next block's DequantizeLinear of its
// output stays out (in its own reader's group), so no float copy is stored.
TEST(Fusion, DequantizedAddReadsAndWritesBytes) {
  Graph g;
  const Shape s = to_shape({2, 8, 5, 7});
  ValueId a = g.add_input("a", {DType::kU8, s}), b = g.add_input("b", {DType::kU8, s});
  ValueId c = g.add_input("c", {DType::kF32, s});
  auto scalar = [&](const char* name, Tensor t) {
    ValueId v = g.add_value(name);
    g.set_initializer(v, std::move(t));
    return v;
  };
  ValueId sa = scalar("sa", Tensor::scalar(0.02f)), sb = scalar("sb", Tensor::scalar(0.03f));
  ValueId za = scalar("za", Tensor::from_vector<uint8_t>({120}, {}));
  ValueId sy = scalar("sy", Tensor::scalar(0.04f));
  ValueId fa = g.add_value("fa"), fb = g.add_value("fb"), sum = g.add_value("sum"),
          q = g.add_value("q"), fq = g.add_value("fq"), y = g.add_value("y");
  g.add_node("DequantizeLinear", {a, sa, za}, {fa}, {}, "dq_a");
  g.add_node("DequantizeLinear", {b, sb}, {fb}, {}, "dq_b");
  g.add_node("Add", {fa, fb}, {sum}, {}, "add");
  g.add_node("QuantizeLinear", {sum, sy}, {q}, {}, "q");
  g.add_node("DequantizeLinear", {q, sy}, {fq}, {}, "dq_next");
  g.add_node("Mul", {fq, c}, {y}, {}, "next");
  g.add_output(q);
  g.add_output(y);
  Tensor ta = Tensor::empty(DType::kU8, {2, 8, 5, 7}), tb = Tensor::empty(DType::kU8, {2, 8, 5, 7});
  for (int64_t i = 0; i < ta.numel(); ++i) {
    ta.data<uint8_t>()[i] = static_cast<uint8_t>(i * 37 + 11);
    tb.data<uint8_t>()[i] = static_cast<uint8_t>(i * 91 + 3);
  }
  Executable exe = check_against_reference(g, {ta, tb, random_tensor({2, 8, 5, 7}, 140)}, 2);
  ASSERT_EQ(exe.num_steps(), 2u);
  auto names = [&](size_t step) {
    std::vector<std::string> out;
    for (int32_t n : exe.step(step).nodes) out.push_back(exe.graph().nodes()[n].name);
    return out;
  };
  EXPECT_EQ(names(0), (std::vector<std::string>{"dq_a", "dq_b", "add", "q"}));
  EXPECT_EQ(names(1), (std::vector<std::string>{"dq_next", "next"}));
}

// The int8 product (DynamicQuantizeMatMul) takes an elementwise chain as its epilogue the same
// way, on each block of its float output.
TEST(Fusion, DynamicQuantizeMatMulWithAnElementwiseChain) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, to_shape({2, 5, 16})});
  ValueId r = g.add_input("r", {DType::kF32, to_shape({2, 5, 40})});
  Tensor wq = Tensor::empty(DType::kI8, {16, 40});
  for (int64_t i = 0; i < wq.numel(); ++i) wq.data<int8_t>()[i] = static_cast<int8_t>(i * 37 % 255);
  ValueId w = g.add_value("w"), s = g.add_value("s"), half = g.add_value("half");
  g.set_initializer(w, wq);
  g.set_initializer(s, Tensor::scalar(0.01f));
  g.set_initializer(half, Tensor::scalar(0.5f));
  ValueId m = g.add_value("m"), h = g.add_value("h"), d = g.add_value("d"), y = g.add_value("y");
  Attributes per_row;
  per_row.set("per_row", int64_t{1});
  g.add_node("DynamicQuantizeMatMul", {x, w, s}, {m}, per_row, "qmm");
  g.add_node("Mul", {m, half}, {h}, {}, "half");
  g.add_node("Sub", {h, r}, {d}, {}, "minus_full");
  g.add_node("Tanh", {d}, {y}, {}, "tanh");
  g.add_output(y);
  Executable exe = check_against_reference(
      g, {random_tensor({2, 5, 16}, 120), random_tensor({2, 5, 40}, 121)}, 2);
  ASSERT_EQ(exe.num_steps(), 1u);
  EXPECT_EQ(exe.step(0).rule, "DynamicQuantizeMatMul+Elementwise");
}

// Through a view, as GPT-2's Conv1D layers write it (x viewed as rows, the product viewed back):
// DynamicQuantizeMatMul takes the bias and activation epilogue (bias + Relu, a residual Add).
TEST(Fusion, DynamicQuantizeMatMulEpilogueThroughAView) {
  for (bool residual : {false, true}) {
    SCOPED_TRACE(residual);
    Graph g;
    ValueId x = g.add_input("x", {DType::kF32, to_shape({10, 16})});
    ValueId r = g.add_input("r", {DType::kF32, to_shape({2, 5, 40})});
    Tensor wq = Tensor::empty(DType::kI8, {16, 40});
    for (int64_t i = 0; i < wq.numel(); ++i)
      wq.data<int8_t>()[i] = static_cast<int8_t>(i * 37 % 255);
    ValueId w = g.add_value("w"), s = g.add_value("s"), shape = g.add_value("shape");
    g.set_initializer(w, wq);
    g.set_initializer(s, Tensor::scalar(0.01f));
    Tensor dims = Tensor::empty(DType::kI64, {3});
    dims.data<int64_t>()[0] = 2;
    dims.data<int64_t>()[1] = 5;
    dims.data<int64_t>()[2] = 40;
    g.set_initializer(shape, dims);
    ValueId bias = constant(g, "bias", {40}, 122);
    ValueId m = g.add_value("m"), v = g.add_value("v"), b = g.add_value("b"), y = g.add_value("y");
    g.add_node("DynamicQuantizeMatMul", {x, w, s}, {m}, {}, "qmm");
    g.add_node("Reshape", {m, shape}, {v}, {}, "view");
    g.add_node("Add", {v, residual ? r : bias}, {b}, {}, "add");
    g.add_node("Relu", {b}, {y}, {}, "relu");
    g.add_output(y);
    Executable exe = check_against_reference(
        g, {random_tensor({10, 16}, 123), random_tensor({2, 5, 40}, 124)}, 2);
    ASSERT_EQ(exe.num_steps(), 1u);
    EXPECT_EQ(exe.step(0).rule,
              residual ? "DynamicQuantizeMatMul+Add+Relu" : "DynamicQuantizeMatMul+Bias+Relu");
  }
}

}  // namespace

TEST(MemoryPlan, ElementwiseStepsRunInPlace) {
  // Transpose -> (Exp, Neg, Add of a constant: one elementwise kernel) -> Transpose: the
  // elementwise kernel writes over the first transpose's output, which dies there, so the arena
  // holds one buffer where it would need two; not when the transpose's output is read later.
  for (bool still_read : {false, true}) {
    SCOPED_TRACE(still_read);
    Graph g;
    ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::sym("n"), Dim(64)}});
    ValueId c = constant(g, "c", {64, 1}, 70);
    ValueId t = g.add_value("t"), e = g.add_value("e"), ne = g.add_value("ne"),
            a = g.add_value("a"), y = g.add_value("y");
    g.add_node("Transpose", {x}, {t}, {}, "t1");
    g.add_node("Exp", {t}, {e}, {}, "exp");
    g.add_node("Neg", {e}, {ne}, {}, "neg");
    g.add_node("Add", {ne, c}, {a}, {}, "add");
    g.add_node("Transpose", {a}, {y}, {}, "t2");
    g.add_output(y);
    if (still_read) {
      ValueId z = g.add_value("z");
      g.add_node("Transpose", {t}, {z}, {}, "late");  // t is read after the elementwise kernel
      g.add_output(z);
    }
    Executable exe = compile(g, {.level = 2});
    for (int64_t n : {3, 64}) {
      Tensor in = random_tensor({n, 64}, 71);
      Graph typed = g;
      typed.value(x).type.shape = to_shape({n, 64});
      infer_types(typed);
      const std::vector<Tensor> want = reference::run(typed, {in});
      const std::vector<Tensor> got = exe.run({in});
      for (size_t k = 0; k < want.size(); ++k) expect_near(got[k], want[k], 1e-6, cat("n ", n));
      const size_t one = static_cast<size_t>(n) * 64 * sizeof(float);
      const ExecutableStats st = exe.stats({{n, 64}});
      EXPECT_EQ(st.unplanned_peak_bytes, 2 * one);
      EXPECT_EQ(st.peak_bytes, still_read ? 2 * one : one);
    }
  }
}

}  // namespace pto
