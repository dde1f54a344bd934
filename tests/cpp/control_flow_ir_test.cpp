// Control flow in the Tensor Graph: If / Loop / Scan nodes with subgraph attributes and explicit
// captures. The text form round-trips, the verifier checks subgraphs against their node, type
// inference types the subgraphs, saved models keep them, and compiled graphs (every level, and
// reloaded from a saved model) compute what the reference interpreter computes.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <thread>

#include "control_flow_models.h"
#include "env_guard.h"
#include "pto/executable.h"
#include "pto/graph_dot.h"
#include "pto/reference.h"
#include "pto/serialize.h"
#include "random_tensor.h"

namespace pto {
namespace {

using testing::random_tensor;

// acc, scans = Loop(m) { even = i % 2 == 0; acc = If(even) acc + x else acc - x; scan = -acc }:
// the If captures the body's input acc and the body's capture x.
const char* kLoopIf = R"(graph main (opset 17)
  input  %m: i64[]
  input  %a0: f32[3]
  input  %x: f32[3]
  %a: f32[3], %s: f32[?, 3] = Loop(%m, _, %a0, %x) {body=graph}  # loop
    body: graph body (opset 17)
      input  %i: i64[]
      input  %c: bool[]
      input  %acc: f32[3]
      capture %x_in: f32[3]
      const  %two: i64[] = [2]
      const  %zero: i64[] = [0]
      %r: i64[] = Mod(%i, %two)  # mod
      %even: bool[] = Equal(%r, %zero)  # eq
      %acc_out: f32[3] = If(%even, %acc, %x_in) {else_branch=graph, then_branch=graph}  # if
        else_branch: graph else (opset 17)
          capture %acc_e: f32[3]
          capture %x_e: f32[3]
          %e: f32[3] = Sub(%acc_e, %x_e)  # sub
          return %e
        then_branch: graph then (opset 17)
          capture %acc_t: f32[3]
          capture %x_t: f32[3]
          %t: f32[3] = Add(%acc_t, %x_t)  # add
          return %t
      %scan: f32[3] = Neg(%acc_out)  # neg
      return %c, %acc_out, %scan
  return %a, %s
)";

std::vector<Tensor> loop_inputs(int64_t trips) {
  return {Tensor::scalar<int64_t>(trips), random_tensor({3}, 1), random_tensor({3}, 2)};
}

void expect_same(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].shape(), want[i].shape()) << i;
    const Tensor a = got[i].contiguous(), b = want[i].contiguous();
    for (int64_t k = 0; k < a.numel(); ++k)
      EXPECT_NEAR(a.data<float>()[k], b.data<float>()[k], 1e-5) << i << " " << k;
  }
}

TEST(ControlFlowIr, TextRoundTrips) {
  Graph g = parse_graph(kLoopIf);
  EXPECT_EQ(print(g), kLoopIf);
  verify(g);
  const Graph& body = g.nodes()[0].attrs.get_graph("body");
  EXPECT_EQ(body.num_captures, 1);
  EXPECT_EQ(body.nodes()[2].attrs.get_graph("then_branch").num_captures, 2);
  EXPECT_TRUE(structurally_equal(g, parse_graph(print(g))));
  // A different branch is a different graph.
  std::string other = kLoopIf;
  other.replace(other.find("Add(%acc_t"), 3, "Mul");
  std::string why;
  EXPECT_FALSE(structurally_equal(g, parse_graph(other), &why));
  EXPECT_NE(why.find("attributes"), std::string::npos) << why;
}

TEST(ControlFlowIr, InferenceTypesTheSubgraphs) {
  // The loop's outputs and two subgraph node outputs without types: inferred from the inputs.
  std::string untyped = kLoopIf;
  for (auto [from, to] :
       {std::pair{"%a: f32[3], %s: f32[?, 3] =", "%a, %s ="}, std::pair{"%e: f32[3] =", "%e ="},
        std::pair{"%scan: f32[3] =", "%scan ="}})
    untyped.replace(untyped.find(from), std::strlen(from), to);
  Graph g = parse_graph(untyped);
  EXPECT_EQ(print(g), kLoopIf);
  // A constant trip count gives the scan output its length.
  Graph c = parse_graph(kLoopIf);
  c.set_initializer(c.inputs()[0], Tensor::scalar<int64_t>(4));
  infer_types(c);
  EXPECT_EQ(c.value(c.outputs()[1]).type.str(), "f32[4, 3]");
}

TEST(ControlFlowIr, VerifierChecksSubgraphsAgainstTheNode) {
  auto error = [](const std::string& text) {
    try {
      verify(parse_graph(text));
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(error(kLoopIf), "(no error)");
  // The If passes one capture fewer than its branches read.
  std::string fewer = kLoopIf;
  fewer.replace(fewer.find("If(%even, %acc, %x_in)"), 22, "If(%even, %acc)");
  EXPECT_NE(error(fewer).find("[If] node 'if'"), std::string::npos) << error(fewer);
  // A body node reads a value its body does not define.
  std::string undefined = kLoopIf;
  undefined.replace(undefined.find("Neg(%acc_out)"), 13, "Neg(%a0)");
  EXPECT_NE(error(undefined).find("not defined"), std::string::npos) << error(undefined);
  // A Loop body with a missing output.
  std::string outputs = kLoopIf;
  outputs.replace(outputs.find("return %c, %acc_out, %scan"), 26, "return %c, %acc_out");
  EXPECT_NE(error(outputs).find("the body has 2 outputs"), std::string::npos) << error(outputs);
}

TEST(ControlFlowIr, ReferenceRunsLoopAndIf) {
  const Graph g = parse_graph(kLoopIf);
  for (int64_t trips : {0, 1, 4}) {
    const std::vector<Tensor> in = loop_inputs(trips);
    const std::vector<Tensor> out = reference::run(g, in);
    ASSERT_EQ(out[1].shape(), (Dims{trips, 3}));
    // acc + x, - x, + x, - x, ...: alternately a0 + x and a0.
    for (int64_t k = 0; k < 3; ++k) {
      const float a0 = in[1].data<float>()[k], x = in[2].data<float>()[k];
      EXPECT_FLOAT_EQ(out[0].data<float>()[k], trips % 2 ? a0 + x : a0);
      if (trips) {
        EXPECT_FLOAT_EQ(out[1].data<float>()[k], -(a0 + x));
      }
    }
  }
}

TEST(ControlFlowIr, CompiledAndSavedModelsMatchTheReference) {
  for (int level : {0, 1, 2, 3}) {
    SCOPED_TRACE(cat("level ", level));
    Executable exe = compile(parse_graph(kLoopIf), {.level = level});
    const std::string bytes = serialize_executable(exe, "");
    LoadedExecutable m = deserialize_executable(bytes, "m.pto");
    EXPECT_EQ(print(m.exe.graph()), print(exe.graph()));
    for (int64_t trips : {0, 3}) {
      const std::vector<Tensor> in = loop_inputs(trips);
      const std::vector<Tensor> want = reference::run(parse_graph(kLoopIf), in);
      expect_same(exe.run(in), want);
      expect_same(m.exe.run(in), want);
    }
  }
}

// Compiled, a control-flow node runs each subgraph on an Executable of its own, compiled with the
// model: node_backends lists the subgraphs' nodes under the node's name, recursively, with the
// backend that runs each; four threads may run the model at once.
TEST(ControlFlowIr, CompiledSubgraphsRunOnCpuKernels) {
  Executable exe = compile(parse_graph(kLoopIf), {.level = 2});
  ASSERT_EQ(exe.graph().nodes()[0].op, "Loop");
  EXPECT_EQ(exe.node_backend(0), "cpu");
  const auto subs = exe.subgraphs(0);
  ASSERT_EQ(subs.size(), 1u);
  EXPECT_EQ(subs[0].first, "body");
  std::map<std::string, std::string> backends;
  for (const auto& [op, b] : exe.node_backends()) backends[op] = b;
  EXPECT_EQ(backends["Loop"], "cpu");
  EXPECT_EQ(backends["loop/body/If"], "cpu");
  EXPECT_EQ(backends["loop/body/if/then_branch/Add"], "cpu");
  EXPECT_EQ(backends["loop/body/if/else_branch/Sub"], "cpu");
  EXPECT_EQ(backends["loop/body/Neg"], "cpu");
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 5; ++rep) {
        const std::vector<Tensor> in = loop_inputs(3 + t);
        const std::vector<Tensor> got = exe.run(in), want = reference::run(exe.graph(), in);
        bool same = got[1].shape() == want[1].shape();
        for (size_t o = 0; same && o < 2; ++o)
          same = std::memcmp(got[o].raw_data(), want[o].raw_data(), got[o].nbytes()) == 0;
        ok[t] += same;
      }
    });
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(ok, (std::vector<int>{5, 5, 5, 5}));
}

// A subgraph that does not compile leaves its node on the reference backend, whole: here
// PTO_TEST_PERTURB_VALUE names an outer value, which the body's compile cannot find (a
// ValueError). The result is still the reference's (plus the test fault on that value).
TEST(ControlFlowIr, SubgraphThatDoesNotCompileFallsBackToTheReference) {
  testing::EnvGuard env("PTO_TEST_PERTURB_VALUE", "a");
  Executable exe = compile(parse_graph(kLoopIf), {.level = 2});
  EXPECT_EQ(exe.node_backend(0), "reference");
  EXPECT_TRUE(exe.subgraphs(0).empty());
  EXPECT_EQ(exe.node_backends().size(), 1u);
  const std::vector<Tensor> in = loop_inputs(3);
  const std::vector<Tensor> got = exe.run(in), want = reference::run(parse_graph(kLoopIf), in);
  for (int64_t k = 0; k < 3; ++k)
    EXPECT_FLOAT_EQ(got[0].data<float>()[k], want[0].data<float>()[k] + 1.0f);
  expect_same({got[1]}, {want[1]});
}

// The picture of a compiled model draws each compiled subgraph in a dashed frame beside its
// node, nested ones inside, with ids of their own.
TEST(ControlFlowIr, GraphDotDrawsSubgraphsAsClusters) {
  Executable exe = compile(parse_graph(kLoopIf), {.level = 2});
  const std::string dot = to_dot(exe);
  EXPECT_NE(dot.find("subgraph cluster_s0_ {"), std::string::npos) << dot;
  EXPECT_NE(dot.find("label=\"loop: body\""), std::string::npos) << dot;
  EXPECT_NE(dot.find("subgraph cluster_s0_s0_ {"), std::string::npos) << dot;
  EXPECT_NE(dot.find("label=\"if: else_branch\""), std::string::npos) << dot;
  EXPECT_NE(dot.find("label=\"if: then_branch\""), std::string::npos) << dot;
  EXPECT_NE(dot.find("n0 -> s0_v"), std::string::npos) << dot;  // the Loop feeds its body
  EXPECT_NE(dot.find("Add\\nadd"), std::string::npos) << dot;   // a then_branch node
  // Each DOT id is declared once: the body's n0 is s0_n0, not the outer n0.
  EXPECT_EQ(dot.find("  n0 ["), dot.rfind("  n0 ["));
}

// A Loop whose body multiplies by an outer constant it captures: the body's Executable reads the
// capture as a constant of its own, so its GEMM packs the weight once, at compile time.
TEST(ControlFlowIr, CapturedConstantIsAWeightOfTheBody) {
  const std::string text = testing::matmul_relu_loop(2, 2, "[0.5, -1, 2, 0.25]");
  Executable exe = compile(parse_graph(text), {.level = 2});
  const auto subs = exe.subgraphs(0);
  ASSERT_EQ(subs.size(), 1u);
  EXPECT_GT(subs[0].second->stats().packed_weight_bytes, 0u);
  const std::vector<Tensor> in{random_tensor({2, 2}, 9)};
  expect_same(exe.run(in), reference::run(parse_graph(text), in));
}

// The model's stats count its subgraphs' kernels (recursively: the If branches inside the Loop
// body), their packed weights and their planned memory; a body compiled as a model of its own
// (the capture a constant, as the nested compile makes it) has the same kernels and weights.
TEST(ControlFlowIr, StatsCountTheSubgraphsKernels) {
  Executable exe = compile(parse_graph(kLoopIf), {.level = 2});
  const Executable& body = *exe.subgraphs(0)[0].second;
  size_t nested = body.num_steps();
  for (size_t i = 0; i < body.graph().nodes().size(); ++i)
    for (const auto& [attr, branch] : body.subgraphs(i)) nested += branch->num_steps();
  EXPECT_EQ(exe.stats().kernels, 1u);
  EXPECT_EQ(exe.stats().subgraph_kernels, nested);
  EXPECT_GE(nested, 4u);  // the body's If, Neg, ... and one kernel per branch

  std::string w = "[";  // 256 weights
  for (int k = 0; k < 256; ++k) w += cat(k ? ", " : "", (k % 7 - 3) * 0.125);
  w += "]";
  const std::string loop = testing::matmul_relu_loop(8, 16, w);
  const std::string alone = R"(graph body (opset 17)
  input  %i: i64[]
  input  %c: bool[]
  input  %x_in: f32[8, 16]
  const  %w: f32[16, 16] = )" +
                            w + R"(
  %p: f32[8, 16] = MatMul(%x_in, %w)  # mm
  %x_out: f32[8, 16] = Relu(%p)  # relu
  return %c, %x_out
)";
  const ExecutableStats s = compile(parse_graph(loop), {.level = 2}).stats();
  const ExecutableStats b = compile(parse_graph(alone), {.level = 2}).stats();
  EXPECT_EQ(s.kernels, 1u);
  EXPECT_EQ(s.subgraph_kernels, b.kernels);
  EXPECT_EQ(s.subgraph_fused_kernels, b.fused_kernels);
  EXPECT_GE(b.fused_kernels, 1u);  // MatMul+Relu
  EXPECT_EQ(s.packed_weight_bytes, b.packed_weight_bytes);
  EXPECT_GT(s.packed_weight_bytes, 0u);
  EXPECT_EQ(s.subgraph_peak_bytes, b.peak_bytes);
}

// Tile pins reach a subgraph's kernels by their path ("loop/body/y"): the body's tile kernel is
// compiled with the pinned tile and still computes the reference's result. "*" names the
// model's own kernels only; a name the subgraph does not have is a ValueError naming both.
TEST(ControlFlowIr, TilePinsReachSubgraphKernelsByPath) {
  const std::string text = testing::kLoopSigmoidAdd;
  auto body_tiles = [](const Executable& exe) {
    const Executable& body = *exe.subgraphs(0)[0].second;
    std::string d;
    for (size_t i = 0; i < body.num_steps(); ++i) d += body.describe_step(i);
    return d;
  };
  const std::vector<Tensor> in{random_tensor({7, 100}, 3), random_tensor({100}, 4)};
  const std::vector<Tensor> want = reference::run(parse_graph(text), in);
  EXPECT_EQ(body_tiles(compile(parse_graph(text))).find("(pinned)"), std::string::npos);
  for (const char* name : {"loop/body/x_out", "loop/body/sig", "loop/body/*"}) {
    SCOPED_TRACE(name);
    CompileOptions o;
    o.tiles[name] = {3, 32};
    Executable exe = compile(parse_graph(text), o);
    const std::string d = body_tiles(exe);
    EXPECT_NE(d.find("of 3x32 (pinned)"), std::string::npos) << d;
    expect_same(exe.run(in), want);
  }
  auto message = [&](const char* name) {
    CompileOptions o;
    o.tiles[name] = {3, 32};
    try {
      compile(parse_graph(text), o);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message("loop/body/nope");
  EXPECT_NE(m.find("subgraph 'body'"), std::string::npos) << m;
  EXPECT_NE(m.find("'nope'"), std::string::npos) << m;
  m = message("*");  // the outer graph has no tile kernel of its own
  EXPECT_NE(m.find("no tile kernel"), std::string::npos) << m;
}

// If with a constant cond is inlined by FoldConstants: no If is left, and the result is the
// branch's.
TEST(ControlFlowIr, FoldConstantsInlinesAnIfWithAConstantCond) {
  const std::string text = R"(graph main (opset 17)
  input  %x: f32[2]
  const  %c: bool[] = [false]
  %y: f32[2] = If(%c, %x) {else_branch=graph, then_branch=graph}  # if
    else_branch: graph else (opset 17)
      capture %xe: f32[2]
      const  %k: f32[2] = [3, 4]
      %e: f32[2] = Mul(%xe, %k)  # mul
      return %e
    then_branch: graph then (opset 17)
      capture %xt: f32[2]
      return %xt
  return %y
)";
  EXPECT_EQ(print(parse_graph(text)), text);
  Executable exe = compile(parse_graph(text), {.level = 1});
  for (const Node& n : exe.graph().nodes()) EXPECT_NE(n.op, "If");
  const std::vector<Tensor> in{random_tensor({2}, 5)};
  expect_same(exe.run(in), reference::run(parse_graph(text), in));
}

// Silero VAD's pattern on a shape that only becomes static inside FoldConstants: the Pad widths
// are computed (Concat, Reshape, Transpose: not shape arithmetic inference follows), so the Pad's
// output, and the cond of the If on its last dim, are known only after a first sweep and a new
// inference. The then_branch squeezes a last dim that is 6: it cannot run on these shapes and is
// not taken. Inference must keep it (not fail), and FoldConstants' next sweep inlines the
// else_branch: no If is left, and the result is the reference's.
TEST(ControlFlowIr, FoldConstantsSweepsUntilAShapeIfFolds) {
  const std::string text = R"(graph main (opset 17)
  input  %x: f32[1, 4]
  const  %c1: i64[2] = [0, 0]
  const  %c2: i64[2] = [1, 1]
  const  %two_by_two: i64[2] = [2, 2]
  const  %flat: i64[1] = [-1]
  const  %one: i64[1] = [1]
  %cat = Concat(%c1, %c2) {axis=0}  # cat
  %r = Reshape(%cat, %two_by_two)  # r
  %t = Transpose(%r) {perm=[1, 0]}  # t
  %pads = Reshape(%t, %flat)  # pads
  %p = Pad(%x, %pads) {mode="reflect"}  # pad
  %s = Shape(%p)  # shape
  %last = Gather(%s, %flat) {axis=0}  # last
  %is1 = Equal(%last, %one)  # is1
  %u: f32[*] = If(%is1, %p) {else_branch=graph, then_branch=graph}  # if
    else_branch: graph keep (opset 17)
      capture %pe: f32[?, ?]
      %e = Identity(%pe)  # id
      return %e
    then_branch: graph squeeze (opset 17)
      capture %pt: f32[?, ?]
      const  %ft: i64[1] = [-1]
      %q = Squeeze(%pt, %ft)  # sq
      return %q
  %y = Relu(%u)  # relu
  return %y
)";
  Graph g = parse_graph(text);
  EXPECT_FALSE(g.value(g.outputs()[0]).type.shape.has_value());  // rank unknown before folding
  Executable exe = compile(parse_graph(text), {.level = 1});
  for (const Node& n : exe.graph().nodes()) {
    EXPECT_NE(n.op, "If");
    EXPECT_NE(n.op, "Shape");
  }
  EXPECT_EQ(exe.graph().value(exe.graph().outputs()[0]).type.str(), "f32[1, 6]");
  const std::vector<Tensor> in{random_tensor({1, 4}, 7)};
  expect_same(exe.run(in), reference::run(parse_graph(text), in));
}

// An If whose cond inference knows (a constant here) is typed from the branch it takes; the other
// branch may not fit the shapes (it never runs), and is kept as it was.
TEST(ControlFlowIr, KnownCondTypesTheTakenBranchOnly) {
  const std::string text = R"(graph main (opset 17)
  input  %x: f32[2, 3]
  const  %c: bool[] = [false]
  %u = If(%c, %x) {else_branch=graph, then_branch=graph}  # if
    else_branch: graph keep (opset 17)
      capture %xe: f32[?, ?]
      %e = Neg(%xe)  # neg
      return %e
    then_branch: graph squeeze (opset 17)
      capture %xt: f32[?, ?]
      const  %at: i64[1] = [-1]
      %q = Squeeze(%xt, %at)  # sq
      return %q
  return %u
)";
  Graph g = parse_graph(text);
  EXPECT_EQ(g.value(g.outputs()[0]).type.str(), "f32[2, 3]");  // the else_branch's type
  const std::vector<Tensor> in{random_tensor({2, 3}, 8)};
  expect_same(compile(parse_graph(text), {.level = 2}).run(in), reference::run(g, in));
  // With the cond true, the squeeze of a last dim of 3 is an error, as before.
  std::string taken = text;
  taken.replace(taken.find("[false]"), 7, "[true]");
  EXPECT_THROW(parse_graph(taken), ValueError);
}

// A Loop body whose inputs have the model's symbolic dims runs every iteration on the shapes of
// the first: it is compiled for them (its kernels then take their static-shape paths) even
// though no node changes backend; a body whose carried value changes shape (an unknown dim, a
// new signature every iteration) keeps its generic compile. Both match the reference.
TEST(ControlFlowIr, LoopBodyWithSymbolicDimsIsCompiledForTheRunShapes) {
  const std::string fixed = R"(graph main (opset 17)
  input  %m: i64[]
  input  %h0: f32[N, 8]
  %h, %s = Loop(%m, _, %h0) {body=graph}  # loop
    body: graph body (opset 17)
      input  %i: i64[]
      input  %c: bool[]
      input  %h_in: f32[N, 8]
      const  %st: i64[1] = [4]
      const  %en: i64[1] = [8]
      const  %ax: i64[1] = [1]
      %hi = Slice(%h_in, %st, %en, %ax)  # slice
      %a, %b = Split(%h_in) {axis=1}  # split
      %g = Sigmoid(%a)  # sig
      %t = Tanh(%hi)  # tanh
      %u = Mul(%g, %t)  # mul
      %v = Add(%u, %b)  # add
      %h_out = Concat(%v, %u) {axis=1}  # cat
      return %c, %h_out, %v
  return %h, %s
)";
  const std::string grows = R"(graph main (opset 17)
  input  %m: i64[]
  input  %h0: f32[N, 8]
  %h = Loop(%m, _, %h0) {body=graph}  # loop
    body: graph body (opset 17)
      input  %i: i64[]
      input  %c: bool[]
      input  %h_in: f32[N, ?]
      %t = Tanh(%h_in)  # tanh
      %h_out = Concat(%h_in, %t) {axis=1}  # cat
      return %c, %h_out
  return %h
)";
  for (const std::string* text : {&fixed, &grows}) {
    Executable exe = compile(parse_graph(*text), {.level = 2});
    ASSERT_EQ(exe.graph().nodes()[0].op, "Loop");
    const Executable* generic = exe.subgraphs(0)[0].second;
    for (int64_t n : {3, 1}) {
      const std::vector<Tensor> in{Tensor::scalar<int64_t>(3), random_tensor({n, 8}, 9)};
      expect_same(exe.run(in), reference::run(parse_graph(*text), in));
      const Executable& ran = *exe.subgraphs(0)[0].second;
      const TensorType& h_in = ran.graph().value(ran.graph().inputs()[2]).type;
      if (text == &fixed) {
        EXPECT_NE(&ran, generic);
        EXPECT_EQ(h_in.str(), cat("f32[", n, ", 8]"));
      } else {
        EXPECT_EQ(&ran, generic);
        EXPECT_EQ(h_in.str(), "f32[N, ?]");
      }
    }
  }
}

}  // namespace
}  // namespace pto
