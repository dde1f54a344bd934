// pto::compile and Executable: option validation, the checks at the run boundary (input count,
// declared symbol ranges), the node observer. Values are compared with hand-computed results.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>

#include "pto/executable.h"
#include "pto/reference.h"
#include "random_tensor.h"

namespace pto {
namespace {

// y = relu(x * w), x: f32[batch, 3]
Graph small_graph() {
  Graph g;
  g.name = "small";
  ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::sym("batch"), 3}});
  ValueId w = g.add_value("w");
  g.set_initializer(w, Tensor::from_vector<float>({1, -2, 3}, {3}));
  ValueId y = g.add_value("y"), z = g.add_value("z");
  g.add_node("Mul", {x, w}, {y}, {}, "mul");
  g.add_node("Relu", {y}, {z}, {}, "relu");
  g.add_output(z);
  return g;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Executable, RunsAndTypesTheGraph) {
  Executable exe = compile(small_graph(), {.level = 2});
  EXPECT_EQ(exe.options().level, 2);
  EXPECT_EQ(exe.graph().value(exe.graph().outputs()[0]).type.str(), "f32[batch, 3]");
  auto out = exe.run({Tensor::from_vector<float>({1, 1, 1, -1, -1, -1}, {2, 3})});
  ASSERT_EQ(out.size(), 1u);
  const double expect[] = {1, 0, 3, 0, 2, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[0].item_as_double(i), expect[i]);
}

TEST(Executable, RejectsBadOptions) {
  EXPECT_THROW(compile(small_graph(), {.level = 4}), ValueError);
  EXPECT_THROW(compile(small_graph(), {.level = -1}), ValueError);
  Graph g = small_graph();
  g.symbol_ranges["batch"] = {5, 2};
  EXPECT_THROW(compile(g), ValueError);
}

TEST(Executable, ChecksInputCountAndDeclaredRanges) {
  Graph g = small_graph();
  g.symbol_ranges["batch"] = {1, 4};
  Executable exe = compile(g);
  EXPECT_EQ(exe.run({Tensor::zeros(DType::kF32, {4, 3})})[0].shape(), (Dims{4, 3}));
  EXPECT_EQ(message_of([&] {
              exe.run({Tensor::zeros(DType::kF32, {5, 3})});
            }),
            "input 'x': dimension 0 ('batch') is 5, outside the declared range [1, 4]");
  EXPECT_EQ(message_of([&] { exe.run({}); }), "graph 'small' takes 1 input(s), got 0");
  EXPECT_THROW(exe.run({Tensor::zeros(DType::kF32, {0, 3})}), ValueError);  // below min 1
  EXPECT_THROW(exe.run({Tensor::zeros(DType::kI32, {2, 3})}), TypeError);
}

TEST(Executable, ObserverSeesEveryNodeInOrder) {
  Executable exe = compile(small_graph(), {.level = 0});
  std::vector<std::string> seen;
  auto out = exe.run({Tensor::from_vector<float>({-1, 2, -3}, {1, 3})},
                     [&](const Node& n, const std::vector<Tensor>& outs) {
                       seen.push_back(n.name + ":" + outs[0].str());
                     });
  EXPECT_EQ(seen, (std::vector<std::string>{"mul:f32[1, 3]", "relu:f32[1, 3]"}));
  EXPECT_EQ(out[0].item_as_double(1), 0.0);  // 2 * -2 = -4 -> relu 0
}

// At level 2 Mul and Relu are one kernel: the observer sees the step once, as its last node.
TEST(Executable, ObserverSeesFusedStepsOnce) {
  Executable exe = compile(small_graph(), {.level = 2});
  ASSERT_EQ(exe.num_steps(), 1u);
  EXPECT_EQ(exe.step(0).rule, "Elementwise");
  std::vector<std::string> seen;
  exe.run({Tensor::from_vector<float>({-1, 2, -3}, {1, 3})},
          [&](const Node& n, const std::vector<Tensor>&) { seen.push_back(n.name); });
  EXPECT_EQ(seen, (std::vector<std::string>{"relu"}));
}

TEST(Executable, ConcurrentRunsAreIndependent) {
  Executable exe = compile(small_graph());
  std::vector<double> results(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      float v = static_cast<float>(t + 1);
      results[t] = exe.run({Tensor::from_vector<float>({v, v, v}, {1, 3})})[0].item_as_double(2);
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(results[t], 3.0 * (t + 1));
}

// A run moves its outputs out of its value table and a graph input's copy into the step that
// reads it last: an output listed twice, a graph input and a constant given back as outputs
// must still come back whole, run after run (the constant stays for the next run). The fused
// Sub reads its inputs in another order than the group lists them (the in-place permutation).
TEST(Executable, OutputsThatAreRepeatedInputsOrConstants) {
  Graph g;
  g.name = "outputs";
  const ValueId a = g.add_input("a", {DType::kF32, Shape{4}});
  const ValueId b = g.add_input("b", {DType::kF32, Shape{4}});
  const ValueId w = testing::constant(g, "w", {4}, 7);
  const ValueId c = g.add_value("c"), d = g.add_value("d");
  g.add_node("Sub", {b, a}, {c}, {}, "sub");
  g.add_node("Mul", {c, w}, {d}, {}, "mul");
  for (ValueId v : {c, d, c, a, w}) g.add_output(v);
  const Executable exe = compile(g);
  const std::vector<Tensor> in{testing::random_tensor({4}, 1), testing::random_tensor({4}, 2)};
  const std::vector<Tensor> want = reference::run(g, in);
  for (int run = 0; run < 3; ++run) {
    const std::vector<Tensor> got = exe.run(in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t o = 0; o < got.size(); ++o) {
      ASSERT_TRUE(got[o].defined()) << "run " << run << ", output " << o;
      ASSERT_EQ(got[o].shape(), want[o].shape()) << "run " << run << ", output " << o;
      for (int64_t i = 0; i < 4; ++i)
        EXPECT_EQ(got[o].item_as_double(i), want[o].item_as_double(i))
            << "run " << run << ", output " << o << ", element " << i;
    }
  }
  EXPECT_EQ(in[0].numel(), 4);  // the caller's inputs are left as they were
}

// run_into: each output comes back as the caller's destination (a row of one buffer) holding
// the reference's values: the kernels' outputs written there directly (the runs ask the pool
// for fewer blocks than run()), an input and a constant given back copied in. An output listed
// twice gets its own copy in each destination. A destination of the wrong shape is left alone.
TEST(Executable, RunIntoWritesTheCallersDestinations) {
  Graph g;
  g.name = "into";
  const ValueId a = g.add_input("a", {DType::kF32, Shape{4}});
  const ValueId b = g.add_input("b", {DType::kF32, Shape{4}});
  const ValueId w = testing::constant(g, "w", {4}, 7);
  const ValueId c = g.add_value("c"), d = g.add_value("d");
  g.add_node("Sub", {b, a}, {c}, {}, "sub");
  g.add_node("Exp", {c}, {d}, {}, "exp");
  for (ValueId v : {c, d, c, a, w}) g.add_output(v);
  for (int level : {0, 2}) {
    const Executable exe = compile(g, {.level = level});
    const std::vector<Tensor> in{testing::random_tensor({4}, 1), testing::random_tensor({4}, 2)};
    const std::vector<Tensor> want = reference::run(g, in);
    exe.run(in);  // warm: plans and pools
    MemoryPoolStats s0 = exe.memory_stats();
    exe.run(in);
    MemoryPoolStats s1 = exe.memory_stats();
    const Tensor buffer = Tensor::zeros(DType::kF32, {5, 4});
    std::vector<Tensor> dests;
    for (int64_t o = 0; o < 5; ++o) dests.push_back(buffer.view({4}, {1}, o * 4));
    const std::vector<Tensor> got = exe.run_into(in, dests);
    MemoryPoolStats s2 = exe.memory_stats();
    ASSERT_EQ(got.size(), want.size());
    for (size_t o = 0; o < got.size(); ++o) {
      EXPECT_EQ(got[o].raw_data(), dests[o].raw_data()) << "level " << level << ", output " << o;
      for (int64_t i = 0; i < 4; ++i)
        EXPECT_FLOAT_EQ(static_cast<float>(got[o].item_as_double(i)),
                        static_cast<float>(want[o].item_as_double(i)))
            << "level " << level << ", output " << o << ", element " << i;
    }
    const auto requests = [](const MemoryPoolStats& s) {
      return s.system_allocations + s.pool_hits;
    };
    EXPECT_LT(requests(s2) - requests(s1), requests(s1) - requests(s0)) << "level " << level;
    // A destination that does not fit: the output is run()'s, the destination untouched.
    const Tensor wrong = Tensor::zeros(DType::kF32, {2, 2});
    const std::vector<Tensor> other =
        exe.run_into(in, {Tensor(), wrong, Tensor(), Tensor(), Tensor()});
    EXPECT_NE(other[1].raw_data(), wrong.raw_data());
    EXPECT_FLOAT_EQ(static_cast<float>(other[1].item_as_double(3)),
                    static_cast<float>(want[1].item_as_double(3)));
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(wrong.item_as_double(i), 0.0);
    EXPECT_THROW(exe.run_into(in, {Tensor()}), ValueError);
  }
}

TEST(Executable, AGraphWithoutOutputsIsAnError) {
  EXPECT_EQ(message_of([] { compile(Graph()); }), "graph: has no outputs");
}

// A graph computing in bf16 or f16 (an ONNX model in bfloat16 or float16): PromoteHalf runs it on
// the CPU kernels in fp32 with bf16 (f16) products, bf16 (f16) in and out, within the type's
// resolution of the reference's own bf16 (f16) arithmetic.
template <class H>
void expect_half_graph_runs_on_the_cpu_kernels(double resolution) {
  auto half = [](const Tensor& f) {
    Tensor t = Tensor::empty(dtype_of<H>, f.shape());
    for (int64_t i = 0; i < f.numel(); ++i) t.data<H>()[i] = H(f.data<float>()[i]);
    return t;
  };
  Graph g;
  const ValueId x = g.add_input("x", {dtype_of<H>, Shape{Dim::sym("batch"), 48}});
  const ValueId w = g.add_value("w");
  g.set_initializer(w, half(testing::random_tensor({48, 20}, 5)));
  const ValueId h = g.add_value("h"), y = g.add_value("y");
  g.add_node("MatMul", {x, w}, {h}, {}, "mm");
  g.add_node("Relu", {h}, {y}, {}, "relu");
  g.add_output(y);
  for (int level : {0, 2}) {
    Executable exe = compile(g, {.level = level});
    for (size_t i = 0; i < exe.graph().nodes().size(); ++i)
      EXPECT_EQ(exe.node_backend(i), "cpu") << exe.graph().nodes()[i].op;
    const Tensor in = half(testing::random_tensor({5, 48}, 6));
    const Tensor got = exe.run({in})[0], want = reference::run(g, {in})[0];
    ASSERT_EQ(got.dtype(), dtype_of<H>);
    ASSERT_EQ(got.shape(), want.shape());
    double scale = 0;
    for (int64_t i = 0; i < want.numel(); ++i)
      scale = std::max(scale, std::fabs(want.item_as_double(i)));
    for (int64_t i = 0; i < want.numel(); ++i)
      EXPECT_NEAR(got.item_as_double(i), want.item_as_double(i), resolution * scale) << i;
  }
}

TEST(Executable, Bf16GraphRunsOnTheCpuKernels) {
  expect_half_graph_runs_on_the_cpu_kernels<BFloat16>(0.01);
}

TEST(Executable, F16GraphRunsOnTheCpuKernels) {
  expect_half_graph_runs_on_the_cpu_kernels<Float16>(0.002);
}

// auto_mixed_precision with mixed_precision f16 marks the products "f16" (bf16 by default), and
// the CPU kernels compute what the reference computes on the compiled graph.
TEST(Executable, AutoMixedPrecisionF16MarksTheProducts) {
  Graph g;
  const ValueId x = g.add_input("x", {DType::kF32, Shape{4, 40}});
  const ValueId w = g.add_value("w");
  g.set_initializer(w, testing::random_tensor({40, 24}, 7));
  const ValueId y = g.add_value("y");
  g.add_node("MatMul", {x, w}, {y}, {}, "mm");
  g.add_output(y);
  for (DType p : {DType::kBF16, DType::kF16}) {
    Executable exe = compile(g, {.auto_mixed_precision = true, .mixed_precision = p});
    const Graph with = exe.graph_with_weights();
    ASSERT_EQ(with.nodes().size(), 1u);
    EXPECT_EQ(with.nodes()[0].attrs.get_string("precision"), dtype_name(p));
    EXPECT_EQ(exe.node_backend(0), "cpu");
    const Tensor in = testing::random_tensor({4, 40}, 8);
    const Tensor got = exe.run({in})[0], want = reference::run(with, {in})[0],
                 f32 = reference::run(g, {in})[0];
    double diff = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      EXPECT_NEAR(got.item_as_double(i), want.item_as_double(i),
                  1e-5 * (1 + std::fabs(want.item_as_double(i))))
          << i;
      diff = std::max(diff, std::fabs(want.item_as_double(i) - f32.item_as_double(i)));
    }
    EXPECT_GT(diff, 1e-5) << dtype_name(p);  // the reference rounded the operands
  }
}

}  // namespace
}  // namespace pto
