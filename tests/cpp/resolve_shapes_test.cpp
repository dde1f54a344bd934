// ResolveShapes: Reshape and Expand targets computed from Shape() on a symbolic batch become
// constants (0 copies a dimension, -1 infers one); results equal the reference interpreter's on
// the original graph for several batch sizes.
#include <gtest/gtest.h>

#include <random>

#include "pto/passes.h"
#include "pto/reference.h"

namespace pto {
namespace {

Tensor random_tensor(Dims shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tensor t = Tensor::empty(DType::kF32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

const Tensor& target_of(const Graph& g, const std::string& op) {
  for (const Node& n : g.nodes())
    if (n.op == op) {
      const Tensor* t = g.initializer(n.inputs[1]);
      EXPECT_NE(t, nullptr) << op << " target is not a constant:\n" << print(g);
      if (t) return *t;
    }
  ADD_FAILURE() << "no " << op << " in\n" << print(g);
  static Tensor none;
  return none;
}

std::vector<int64_t> ints(const Tensor& t) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(static_cast<int64_t>(t.item_as_double(i)));
  return out;
}

// x: [batch, 6, 4] -> Reshape(x, Concat(Shape(x)[0:1], [3, 8])) and a head split as BERT's
// exporters write it: Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), Gather(Shape(x), 1), [2, 2])).
Graph symbolic_graph() {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::sym("batch"), 6, 4}});
  auto constant = [&](const std::string& name, std::vector<int64_t> v, Dims shape) {
    ValueId c = g.add_value(name);
    g.set_initializer(c, Tensor::from_vector<int64_t>(v, std::move(shape)));
    return c;
  };
  ValueId s = g.add_value("s"), b = g.add_value("b"), t1 = g.add_value("t1"), y = g.add_value("y");
  Attributes shape_attrs;
  g.add_node("Shape", {x}, {s}, {}, "shape");
  Attributes slice;
  g.add_node("Slice", {s, constant("st", {0}, {1}), constant("en", {1}, {1})}, {b}, {}, "slice");
  g.add_node("Concat", {b, constant("rest", {3, 8}, {2})}, {t1}, [] {
    Attributes a;
    a.set("axis", int64_t{0});
    return a;
  }(), "concat");
  g.add_node("Reshape", {x, t1}, {y}, {}, "reshape");
  // Expand x to its own shape: the batch it already has becomes 1. (A [1, 6, 4] constant expanded
  // to [batch, 6, 4] has no constant target: that stays computed.)
  ValueId e = g.add_value("e"), sum = g.add_value("sum");
  g.add_node("Expand", {x, s}, {e}, {}, "expand");
  g.add_node("Add", {x, e}, {sum}, {}, "add");
  g.add_output(y);
  g.add_output(sum);
  return g;
}

TEST(PassResolveShapes, SymbolicBatchTargetsBecomeConstants) {
  Graph g = symbolic_graph();
  infer_types(g);
  std::vector<PassReport> report;
  Graph out = run_passes(g, {.only = {"ResolveShapes", "EliminateDeadCode"}}, &report);
  EXPECT_EQ(ints(target_of(out, "Reshape")), (std::vector<int64_t>{0, 3, 8}));
  EXPECT_EQ(ints(target_of(out, "Expand")), (std::vector<int64_t>{1, 6, 4}));
  EXPECT_EQ(report[0].fired["ResolveShapes/Reshape"], 1);
  for (const Node& n : out.nodes()) EXPECT_NE(n.op, "Shape") << print(out);
  EXPECT_EQ(out.value(out.outputs()[0]).type.str(), "f32[batch, 3, 8]");
  for (int64_t batch : {1, 3}) {
    Tensor x = random_tensor({batch, 6, 4}, 10 + static_cast<uint32_t>(batch));
    std::vector<Tensor> want = reference::run(g, {x}), got = reference::run(out, {x});
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].shape(), want[i].shape());
      for (int64_t k = 0; k < want[i].numel(); ++k)
        ASSERT_EQ(got[i].item_as_double(k), want[i].item_as_double(k));
    }
  }
}

TEST(PassResolveShapes, TwoUnknownsStayComputed) {
  // Both dims of the target come from an input of unknown rank: nothing to resolve.
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::sym("a"), Dim::sym("b")}});
  ValueId z = g.add_input("z", {DType::kF32, Shape{Dim::sym("c"), Dim::sym("d")}});
  ValueId s = g.add_value("s"), y = g.add_value("y");
  g.add_node("Shape", {z}, {s}, {}, "shape");
  g.add_node("Reshape", {x, s}, {y}, {}, "reshape");
  g.add_output(y);
  infer_types(g);
  Graph out = run_passes(g, {.only = {"ResolveShapes"}});
  EXPECT_EQ(out.initializer(out.nodes()[1].inputs[1]), nullptr) << print(out);
}

}  // namespace
}  // namespace pto

namespace pto {
namespace {

// The form torch.export writes for BERT's head split: the batch from Shape(ids) with start/end,
// the input of the Reshape itself of unknown batch (it came out of a Gemm on [-1, 768]).
TEST(PassResolveShapes, HeadSplitFromAnotherInputsBatch) {
  Graph g;
  ValueId ids = g.add_input("ids", {DType::kI64, Shape{Dim::sym("batch"), 8}});
  ValueId h = g.add_input("h", {DType::kF32, Shape{Dim::unknown(), 8, 6}});
  auto constant = [&](const std::string& name, std::vector<int64_t> v) {
    ValueId c = g.add_value(name);
    const auto n = static_cast<int64_t>(v.size());
    g.set_initializer(c, Tensor::from_vector<int64_t>(v, {n}));
    return c;
  };
  ValueId s = g.add_value("s"), t = g.add_value("t"), y = g.add_value("y");
  Attributes sa;
  sa.set("start", int64_t{0});
  sa.set("end", int64_t{1});
  g.add_node("Shape", {ids}, {s}, sa, "shape");
  Attributes ca;
  ca.set("axis", int64_t{0});
  g.add_node("Concat", {s, constant("c8", {8}), constant("c2", {2}), constant("c3", {3})}, {t}, ca,
             "concat");
  g.add_node("Reshape", {h, t}, {y}, {}, "reshape");
  g.add_output(y);
  infer_types(g);
  Graph out = run_passes(g, {.only = {"ResolveShapes"}});
  EXPECT_EQ(ints(target_of(out, "Reshape")), (std::vector<int64_t>{-1, 8, 2, 3}));
}

}  // namespace
}  // namespace pto
