// ResolveShapes: Reshape and Expand targets computed from Shape() on a symbolic batch become
// constants (0 copies a dimension, -1 infers one), and shape arithmetic whose every element is
// known becomes a constant; results equal the reference interpreter's on the original graph for
// several batch sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <tuple>

#include "pto/passes.h"
#include "pto/reference.h"
#include "random_tensor.h"

namespace pto {
namespace {

using testing::random_tensor;

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

// The reference's outputs of `before` and `after` on input x: the same shapes and bits (the
// passes further down compare within a tolerance, expect_same_outputs).
void expect_identical_outputs(const Graph& before, const Graph& after, const Tensor& x) {
  const std::vector<Tensor> want = reference::run(before, {x}), got = reference::run(after, {x});
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].shape(), want[i].shape());
    for (int64_t k = 0; k < want[i].numel(); ++k)
      ASSERT_EQ(got[i].item_as_double(k), want[i].item_as_double(k)) << "output " << i;
  }
}

// x: [batch, 6, 4] -> Reshape(x, Concat(Shape(x)[0:1], [3, 8])) and a head split as BERT's
// exporters write it: Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), Gather(Shape(x), 1), [2,
// 2])).
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
  g.add_node(
      "Concat", {b, constant("rest", {3, 8}, {2})}, {t1},
      [] {
        Attributes a;
        a.set("axis", int64_t{0});
        return a;
      }(),
      "concat");
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
  for (int64_t batch : {1, 3})
    expect_identical_outputs(g, out,
                             random_tensor({batch, 6, 4}, 10 + static_cast<uint32_t>(batch)));
}

// The TorchScript exporter's rotate_half on x = [batch, seq, 8]: Slice(x, 0, x.shape[-1] // 2),
// the bound Unsqueeze(Div(Gather(Shape(x), 2), 2)). Every element of that arithmetic is known
// (8 / 2), so the Slice reads a constant 4, whatever the batch and the sequence; the Shape, the
// Gather and the Div go with EliminateDeadCode. A value with a symbolic element (the batch)
// stays computed.
TEST(PassResolveShapes, KnownShapeArithmeticBecomesConstant) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::sym("batch"), Dim::sym("seq"), 8}});
  auto constant = [&](const std::string& name, std::vector<int64_t> v, Dims shape) {
    ValueId c = g.add_value(name);
    g.set_initializer(c, Tensor::from_vector<int64_t>(v, std::move(shape)));
    return c;
  };
  ValueId s = g.add_value("s"), d = g.add_value("d"), h = g.add_value("h"), u = g.add_value("u");
  ValueId y = g.add_value("y"), b = g.add_value("b");
  g.add_node("Shape", {x}, {s}, {}, "shape");
  g.add_node("Gather", {s, constant("two", {2}, {})}, {d}, {}, "gather");
  g.add_node("Div", {d, constant("half", {2}, {})}, {h}, {}, "div");
  g.add_node("Unsqueeze", {h, constant("ax", {0}, {1})}, {u}, {}, "unsqueeze");
  g.add_node("Slice", {x, constant("zero", {0}, {1}), u, constant("last", {-1}, {1})}, {y}, {},
             "slice");
  g.add_node("Gather", {s, constant("first", {0}, {})}, {b}, {}, "batch");
  g.add_output(y);
  g.add_output(b);  // the batch: symbolic, stays computed (and an output)
  infer_types(g);
  std::vector<PassReport> report;
  Graph out = run_passes(g, {.only = {"ResolveShapes", "EliminateDeadCode"}}, &report);
  EXPECT_GE(report[0].fired["ResolveShapes/Known"], 1);
  const Node* slice = nullptr;
  for (const Node& n : out.nodes()) {
    EXPECT_TRUE(n.op != "Div" && n.op != "Unsqueeze") << print(out);
    if (n.op == "Slice") slice = &n;
  }
  ASSERT_NE(slice, nullptr);
  const Tensor* end = out.initializer(slice->inputs[2]);
  ASSERT_NE(end, nullptr) << print(out);
  EXPECT_EQ(ints(*end), (std::vector<int64_t>{4}));
  EXPECT_EQ(out.value(out.outputs()[0]).type.str(), "f32[batch, seq, 4]");
  for (int64_t batch : {1, 3})
    expect_identical_outputs(g, out,
                             random_tensor({batch, 5, 8}, 20 + static_cast<uint32_t>(batch)));
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

// Shape(x)[0:1] as torch.export writes a batch: Shape with start and end.
ValueId leading_dim(Graph& g, ValueId x) {
  ValueId s = g.add_value(g.value(x).name + "_batch");
  Attributes a;
  a.set("start", int64_t{0});
  a.set("end", int64_t{1});
  g.add_node("Shape", {x}, {s}, a, g.value(x).name + "_shape");
  return s;
}

Attributes axis0() {
  Attributes a;
  a.set("axis", int64_t{0});
  return a;
}

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
  ValueId s = leading_dim(g, ids), t = g.add_value("t"), y = g.add_value("y");
  g.add_node("Concat", {s, constant("c8", {8}), constant("c2", {2}), constant("c3", {3})}, {t},
             axis0(), "concat");
  g.add_node("Reshape", {h, t}, {y}, {}, "reshape");
  g.add_output(y);
  infer_types(g);
  Graph out = run_passes(g, {.only = {"ResolveShapes"}});
  EXPECT_EQ(ints(target_of(out, "Reshape")), (std::vector<int64_t>{-1, 8, 2, 3}));
}

// Whisper's decoder positions, position_ids.repeat(batch, 1): Tile of a [1, 7] constant by
// Concat(Shape(ids)[0:1], [1]). The repeats are a shape value with the batch symbol, so the
// positions, the embeddings gathered with them and the head split after them keep [batch, ..]
// (unknown, the head count of the split stayed unknown and RecognizeAttention could not prove
// Q's heads equal to K's).
TEST(PassResolveShapes, TileBySymbolicRepeatsKeepsTheBatch) {
  Graph g;
  ValueId ids = g.add_input("ids", {DType::kI64, Shape{Dim::sym("batch"), 7}});
  ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::sym("batch"), 7, 4}});
  auto constant = [&](const std::string& name, Tensor t) {
    ValueId c = g.add_value(name);
    g.set_initializer(c, std::move(t));
    return c;
  };
  ValueId s = leading_dim(g, ids), rep = g.add_value("rep"), pos = g.add_value("pos"),
          emb = g.add_value("emb"), sum = g.add_value("sum"), to = g.add_value("to"),
          y = g.add_value("y");
  g.add_node("Concat", {s, constant("one", Tensor::from_vector<int64_t>({1}, {1}))}, {rep}, axis0(),
             "repeats");
  g.add_node(
      "Tile",
      {constant("positions", Tensor::from_vector<int64_t>({0, 1, 2, 3, 4, 5, 6}, {1, 7})), rep},
      {pos}, {}, "tile");
  g.add_node("Gather", {constant("table", random_tensor({7, 4}, 3)), pos}, {emb}, {}, "gather");
  g.add_node("Add", {x, emb}, {sum}, {}, "add");
  g.add_node("Concat", {s, constant("heads", Tensor::from_vector<int64_t>({7, 2, -1}, {3}))}, {to},
             axis0(), "split");
  g.add_node("Reshape", {sum, to}, {y}, {}, "reshape");
  g.add_output(pos);
  g.add_output(y);
  infer_types(g);
  EXPECT_EQ(g.value(pos).type.str(), "i64[batch, 7]");
  EXPECT_EQ(g.value(y).type.str(), "f32[batch, 7, 2, 2]");
  Graph out = run_passes(g, {.only = {"ResolveShapes"}});
  EXPECT_EQ(ints(target_of(out, "Reshape")), (std::vector<int64_t>{0, 7, 2, -1}));
  for (int64_t batch : {1, 3}) {
    std::vector<Tensor> got = reference::run(
        out, {Tensor::from_vector<int64_t>(std::vector<int64_t>(batch * 7, 0), {batch, 7}),
              random_tensor({batch, 7, 4}, 5)});
    EXPECT_EQ(got[0].shape(), (Dims{batch, 7}));
    EXPECT_EQ(got[1].shape(), (Dims{batch, 7, 2, 2}));
  }
}

}  // namespace
}  // namespace pto

namespace pto {
namespace {

std::vector<std::string> ops_of(const Graph& g) {
  std::vector<std::string> out;
  for (const Node& n : g.nodes()) out.push_back(n.op);
  return out;
}

void expect_same_outputs(const Graph& a, const Graph& b, const std::vector<Tensor>& in) {
  std::vector<Tensor> x = reference::run(a, in), y = reference::run(b, in);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i].shape(), y[i].shape());
    for (int64_t k = 0; k < x[i].numel(); ++k)
      ASSERT_NEAR(x[i].item_as_double(k), y[i].item_as_double(k), 1e-5) << k;
  }
}

// Reshape(x, [-1, K]) -> Gemm(W, C) -> Reshape([-1, 5, N]): MatMul on x, then Add C. With transB
// the Gemm stays (MatMul would need a transposed copy of W).
TEST(PassUnflattenMatMul, LinearOnThreeDimensions) {
  for (bool trans_b : {false, true})
    for (bool with_c : {true, false}) {
      Graph g;
      ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::sym("batch"), 5, 4}});
      ValueId w = g.add_value("w"), c = g.add_value("c"), t1 = g.add_value("t1"),
              t2 = g.add_value("t2");
      g.set_initializer(w, random_tensor(trans_b ? Dims{3, 4} : Dims{4, 3}, 90));
      g.set_initializer(c, random_tensor({3}, 91));
      g.set_initializer(t1, Tensor::from_vector<int64_t>({-1, 4}, {2}));
      g.set_initializer(t2, Tensor::from_vector<int64_t>({-1, 5, 3}, {3}));
      ValueId f = g.add_value("f"), p = g.add_value("p"), y = g.add_value("y");
      g.add_node("Reshape", {x, t1}, {f}, {}, "flat");
      Attributes a;
      a.set("transB", int64_t{trans_b});
      std::vector<ValueId> gemm_in = {f, w};
      if (with_c) gemm_in.push_back(c);
      g.add_node("Gemm", gemm_in, {p}, a, "gemm");
      g.add_node("Reshape", {p, t2}, {y}, {}, "unflat");
      g.add_output(y);
      infer_types(g);
      Graph out =
          run_passes(g, {.only = {"UnflattenMatMul", "EliminateNoOps", "EliminateDeadCode"}});
      if (trans_b) {
        EXPECT_EQ(ops_of(out), (std::vector<std::string>{"Reshape", "Gemm", "Reshape"}));
      } else {
        EXPECT_EQ(ops_of(out), with_c ? (std::vector<std::string>{"MatMul", "Add"})
                                      : (std::vector<std::string>{"MatMul"}))
            << print(out);
        EXPECT_EQ(out.value(out.outputs()[0]).type.str(), "f32[batch, 5, 3]");
      }
      EXPECT_EQ(out.value(out.outputs()[0]).name, "y");
      for (int64_t batch : {1, 3})
        expect_same_outputs(g, out,
                            {random_tensor({batch, 5, 4}, 92 + static_cast<uint32_t>(batch))});
    }
}

TEST(PassUnflattenMatMul, ADifferentUnflattenStays) {
  // [-1, 4] then back to [-1, 15]: not x's leading dimensions, so nothing changes.
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{2, 5, 4}});
  ValueId w = g.add_value("w"), t1 = g.add_value("t1"), t2 = g.add_value("t2");
  g.set_initializer(w, random_tensor({4, 3}, 93));
  g.set_initializer(t1, Tensor::from_vector<int64_t>({-1, 4}, {2}));
  g.set_initializer(t2, Tensor::from_vector<int64_t>({-1, 15}, {2}));
  ValueId f = g.add_value("f"), p = g.add_value("p"), y = g.add_value("y");
  g.add_node("Reshape", {x, t1}, {f}, {}, "flat");
  g.add_node("MatMul", {f, w}, {p}, {}, "mm");
  g.add_node("Reshape", {p, t2}, {y}, {}, "unflat");
  g.add_output(y);
  infer_types(g);
  Graph out = run_passes(g, {.only = {"UnflattenMatMul"}});
  EXPECT_EQ(ops_of(out), (std::vector<std::string>{"Reshape", "MatMul", "Reshape"}));
}

// torch's bmm form of a 4-D matmul: both operands flattened to [batch*heads, m, k], the product
// reshaped back. With a symbolic batch the flattened dims are the product 4*batch.
TEST(PassUnflattenMatMul, BatchedFourDimensionalMatMul) {
  for (bool put_back : {true, false}) {
    SCOPED_TRACE(put_back);
    Graph g;
    const Dim batch = Dim::sym("batch");
    ValueId a = g.add_input("a", {DType::kF32, Shape{batch, 4, 6, 8}});
    ValueId b = g.add_input("b", {DType::kF32, Shape{batch, 4, 8, 5}});
    ValueId ta = g.add_value("ta"), tb = g.add_value("tb"), ty = g.add_value("ty");
    g.set_initializer(ta, Tensor::from_vector<int64_t>({-1, 6, 8}, {3}));
    g.set_initializer(tb, Tensor::from_vector<int64_t>({-1, 8, 5}, {3}));
    // Put back into [batch, 4, 6, 5], or into [batch, 2, 12, 5]: not the operands' dims.
    g.set_initializer(ty, put_back ? Tensor::from_vector<int64_t>({-1, 4, 6, 5}, {4})
                                   : Tensor::from_vector<int64_t>({-1, 2, 12, 5}, {4}));
    ValueId fa = g.add_value("fa"), fb = g.add_value("fb"), p = g.add_value("p"),
            y = g.add_value("y");
    g.add_node("Reshape", {a, ta}, {fa}, {}, "flat_a");
    g.add_node("Reshape", {b, tb}, {fb}, {}, "flat_b");
    g.add_node("MatMul", {fa, fb}, {p}, {}, "bmm");
    g.add_node("Reshape", {p, ty}, {y}, {}, "unflat");
    g.add_output(y);
    infer_types(g);
    EXPECT_EQ(g.value(fa).type.str(), "f32[4*batch, 6, 8]");
    Graph out = run_passes(g, {.only = {"UnflattenMatMul"}});
    if (put_back) {
      EXPECT_EQ(ops_of(out), (std::vector<std::string>{"MatMul"})) << print(out);
      EXPECT_EQ(out.value(out.outputs()[0]).type.str(), "f32[batch, 4, 6, 5]");
    } else {
      EXPECT_EQ(ops_of(out), (std::vector<std::string>{"Reshape", "Reshape", "MatMul", "Reshape"}));
    }
    for (int64_t n : {1, 3})
      expect_same_outputs(g, out,
                          {random_tensor({n, 4, 6, 8}, 95), random_tensor({n, 4, 8, 5}, 96)});
  }
}

// x * Clip(x + 3, 0, 6) / 6, with the clamp as two Clips (torch.export's form) -> HardSwish.
TEST(PassRecognizeComposites, HardSwishFromTorchDecomposition) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{4, 7}});
  auto scalar = [&](const std::string& name, float v) {
    ValueId c = g.add_value(name);
    g.set_initializer(c, Tensor::scalar(v));
    return c;
  };
  ValueId three = scalar("three", 3), zero = scalar("zero", 0), six = scalar("six", 6);
  ValueId a = g.add_value("a"), c1 = g.add_value("c1"), c2 = g.add_value("c2"),
          m = g.add_value("m"), y = g.add_value("y");
  g.add_node("Add", {x, three}, {a}, {}, "add");
  g.add_node("Clip", {a, zero, kNoValue}, {c1}, {}, "clip_min");
  g.add_node("Clip", {c1, kNoValue, six}, {c2}, {}, "clip_max");
  g.add_node("Mul", {x, c2}, {m}, {}, "mul");
  g.add_node("Div", {m, six}, {y}, {}, "div");
  g.add_output(y);
  infer_types(g);
  Graph out = run_passes(g, {.only = {"RecognizeComposites", "EliminateDeadCode"}});
  EXPECT_EQ(ops_of(out), (std::vector<std::string>{"HardSwish"})) << print(out);
  Tensor in = random_tensor({4, 7}, 94);
  for (int64_t i = 0; i < in.numel(); ++i) in.data<float>()[i] *= 5;  // both sides of the kinks
  expect_same_outputs(g, out, {in});
}

}  // namespace
}  // namespace pto

namespace pto {
namespace {

// The dynamo ONNX exporter's slices of a shape run to INT64_MAX and from INT64_MIN (read through a
// double they became INT64_MIN: empty slices, a Reshape of the wrong rank); the legacy exporter's
// Expand target is Where(Equal(shape, -1), 1, shape). Both keep the symbolic dims.
TEST(ShapeValues, ExporterSliceBoundsAndExpandTargets) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::sym("b"), 4, Dim::sym("s"), 16}});
  auto constant = [&](const std::string& name, Tensor t) {
    ValueId c = g.add_value(name);
    g.set_initializer(c, std::move(t));
    return c;
  };
  auto ints1 = [&](const std::string& name, int64_t v) {
    return constant(name, Tensor::from_vector<int64_t>({v}, {1}));
  };
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  ValueId shape = g.add_value("shape"), last = g.add_value("last"), seq = g.add_value("seq"),
          lead = g.add_value("lead"), to = g.add_value("to"), r = g.add_value("r");
  g.add_node("Shape", {x}, {shape}, {}, "shape");
  g.add_node("Slice", {shape, ints1("m1", -1), ints1("max", kMax)}, {last}, {}, "last");
  g.add_node("Slice", {shape, ints1("m2", -2), ints1("m1b", -1)}, {seq}, {}, "seq");
  g.add_node("Slice", {shape, ints1("min", std::numeric_limits<int64_t>::min()), ints1("m2b", -2)},
             {lead}, {}, "lead");
  g.add_node("Concat", {ints1("all", -1), seq, last}, {to}, axis0(), "to");
  g.add_node("Reshape", {x, to}, {r}, {}, "reshape");
  // Expand a [1, 1, s, 1] ramp to Where(Equal([b, 1, s, s], -1), 1, [b, 1, s, s]).
  ValueId dims = g.add_value("dims"), eq = g.add_value("eq"), target = g.add_value("target"),
          ramp = g.add_input("ramp", {DType::kF32, Shape{1, 1, Dim::sym("s"), 1}}),
          e = g.add_value("e");
  g.add_node("Concat", {lead, seq, seq}, {dims}, axis0(), "dims");
  g.add_node("Equal",
             {dims, constant("minus", Tensor::from_vector<int64_t>({-1, -1, -1, -1}, {4}))}, {eq},
             {}, "eq");
  g.add_node("Where", {eq, constant("ones", Tensor::from_vector<int64_t>({1, 1, 1, 1}, {4})), dims},
             {target}, {}, "where");
  g.add_node("Expand", {ramp, target}, {e}, {}, "expand");
  g.add_output(r);
  g.add_output(e);
  infer_types(g);
  EXPECT_EQ(g.value(r).type.str(), "f32[4*b, s, 16]");
  EXPECT_EQ(g.value(e).type.str(), "f32[b, 4, s, s]");
}

}  // namespace
}  // namespace pto

namespace pto {
namespace {

// The TorchScript exporter's forms over a symbolic batch and sequence: an Expand target that mixes
// a literal -1 with symbols, Where(Equal(Concat(b, [-1], s, s), -1), 1, ...) (the -1 must compare
// equal, the symbols not), and BERT's position ids, a [1, 16] buffer sliced to the sequence
// length, min(16, s) long, added to a [b, s] value: the sum keeps [b, s]. The reference agrees at
// every size.
TEST(ShapeValues, LiteralMinusOneAmongSymbolsAndASliceToTheSequence) {
  Graph g;
  const Dim b = Dim::sym("b"), s = Dim::sym("s");
  ValueId ids = g.add_input("ids", {DType::kI64, Shape{b, s}});
  ValueId ramp = g.add_input("ramp", {DType::kF32, Shape{b, 1, 1, s}});
  auto constant = [&](const std::string& name, std::vector<int64_t> v) {
    ValueId c = g.add_value(name);
    const auto n = static_cast<int64_t>(v.size());
    g.set_initializer(c, Tensor::from_vector<int64_t>(v, {n}));
    return c;
  };
  std::vector<int64_t> buffer(16);
  for (int64_t i = 0; i < 16; ++i) buffer[i] = 100 + i;
  ValueId pos_buffer = g.add_value("pos_buffer");
  g.set_initializer(pos_buffer, Tensor::from_vector<int64_t>(buffer, {1, 16}));
  ValueId shape = g.add_value("shape"), bdim = g.add_value("bdim"), sdim = g.add_value("sdim");
  g.add_node("Shape", {ids}, {shape}, {}, "shape");
  g.add_node("Slice", {shape, constant("z", {0}), constant("o", {1})}, {bdim}, {}, "bdim");
  g.add_node("Slice", {shape, constant("o2", {1}), constant("t", {2})}, {sdim}, {}, "sdim");
  // Expand's target [b, 1, s, s] from [b, -1, s, s].
  ValueId dims = g.add_value("dims"), eq = g.add_value("eq"), target = g.add_value("target"),
          e = g.add_value("e");
  g.add_node("Concat", {bdim, constant("minus", {-1}), sdim, sdim}, {dims}, axis0(), "dims");
  g.add_node("Equal", {dims, constant("minus4", {-1, -1, -1, -1})}, {eq}, {}, "eq");
  g.add_node("Where", {eq, constant("ones", {1, 1, 1, 1}), dims}, {target}, {}, "where");
  g.add_node("Expand", {ramp, target}, {e}, {}, "expand");
  // Position ids: pos_buffer[:, :s] + ids.
  ValueId pos = g.add_value("pos"), sum = g.add_value("sum");
  g.add_node("Slice", {pos_buffer, constant("z2", {0}), sdim, constant("axis1", {1})}, {pos}, {},
             "pos");
  g.add_node("Add", {ids, pos}, {sum}, {}, "add");
  g.add_output(e);
  g.add_output(sum);
  infer_types(g);
  EXPECT_EQ(g.value(e).type.str(), "f32[b, 1, s, s]");
  EXPECT_EQ(g.value(pos).type.str(), "i64[1, min(16,s)]");
  EXPECT_EQ(g.value(sum).type.str(), "i64[b, s]");
  for (auto [batch, seq] : {std::pair<int64_t, int64_t>{1, 5}, {3, 16}}) {
    std::vector<int64_t> id(batch * seq, 7);
    std::vector<Tensor> got = reference::run(
        g, {Tensor::from_vector<int64_t>(id, {batch, seq}), random_tensor({batch, 1, 1, seq}, 3)});
    EXPECT_EQ(got[0].shape(), (Dims{batch, 1, seq, seq}));
    ASSERT_EQ(got[1].shape(), (Dims{batch, seq}));
    EXPECT_EQ(got[1].item_as_double(seq - 1), 107 + static_cast<double>(seq - 1));
  }
}

// A slice end that is a product of the sequence: x[:, :2*s] of a [b, 2*s] value keeps 2*s, and a
// [1, 64] buffer sliced to 2*s is min(64,2*s), which broadcasts with 2*s (a product factors
// the parenthesized min as one symbol). The reference agrees at two sizes.
TEST(ShapeValues, SliceToAProductOfTheSequence) {
  Graph g;
  const Dim b = Dim::sym("b"), s = Dim::sym("s"), s2 = dim_mul(Dim(2), s);
  ValueId ids = g.add_input("ids", {DType::kI64, Shape{b, s}});
  ValueId x = g.add_input("x", {DType::kF32, Shape{b, s2}});
  auto constant = [&](const std::string& name, std::vector<int64_t> v) {
    ValueId c = g.add_value(name);
    g.set_initializer(c, Tensor::from_vector<int64_t>(v, {static_cast<int64_t>(v.size())}));
    return c;
  };
  std::vector<float> buffer(64);
  for (int64_t i = 0; i < 64; ++i) buffer[i] = static_cast<float>(i);
  ValueId table = g.add_value("table");
  g.set_initializer(table, Tensor::from_vector<float>(buffer, {1, 64}));
  ValueId shape = g.add_value("shape"), sdim = g.add_value("sdim"), end = g.add_value("end");
  g.add_node("Shape", {ids}, {shape}, {}, "shape");
  g.add_node("Slice", {shape, constant("o", {1}), constant("t", {2})}, {sdim}, {}, "sdim");
  g.add_node("Mul", {sdim, constant("two", {2})}, {end}, {}, "end");
  ValueId head = g.add_value("head"), rows = g.add_value("rows"), sum = g.add_value("sum");
  g.add_node("Slice", {x, constant("z", {0}), end, constant("a", {1})}, {head}, {}, "head");
  g.add_node("Slice", {table, constant("z2", {0}), end, constant("a2", {1})}, {rows}, {}, "rows");
  g.add_node("Add", {head, rows}, {sum}, {}, "add");
  g.add_output(sum);
  infer_types(g);
  EXPECT_EQ(g.value(head).type.str(), "f32[b, 2*s]");
  EXPECT_EQ(g.value(rows).type.str(), "f32[1, min(64,2*s)]");
  EXPECT_EQ(g.value(sum).type.str(), "f32[b, 2*s]");
  EXPECT_EQ(dim_mul(g.value(rows).type.shape->at(1), b).symbol, "b*min(64,2*s)");
  for (auto [batch, seq] : {std::pair<int64_t, int64_t>{1, 3}, {2, 32}}) {
    std::vector<int64_t> id(batch * seq, 0);
    Tensor in = random_tensor({batch, 2 * seq}, 5);
    std::vector<Tensor> got =
        reference::run(g, {Tensor::from_vector<int64_t>(id, {batch, seq}), in});
    ASSERT_EQ(got[0].shape(), (Dims{batch, 2 * seq}));
    const int64_t last = batch * 2 * seq - 1;
    EXPECT_FLOAT_EQ(static_cast<float>(got[0].item_as_double(last)),
                    static_cast<float>(in.item_as_double(last)) + static_cast<float>(2 * seq - 1));
  }
}

// The TorchScript exporter's Linear on [b, s, K]: Reshape(x, [-1, K]) -> Gemm -> Reshape(.,
// Concat(Shape(x)[0], Shape(x)[1], [N])), a target computed at run time whose inferred shape is
// x's leading dims: MatMul on x. And the attention output's projection, [b, s, h, d] flattened
// to [b*s, h*d]: a Reshape to [0, 0, h*d] stays before the MatMul. Equal to the reference on the
// original graph at two sizes.
TEST(PassUnflattenMatMul, ComputedUnflattenTargetOnSymbolicDims) {
  for (bool heads : {false, true}) {
    SCOPED_TRACE(heads);
    Graph g;
    const Dim b = Dim::sym("b"), s = Dim::sym("s");
    ValueId x = g.add_input("x", {DType::kF32, heads ? Shape{b, s, 2, 3} : Shape{b, s, 6}});
    ValueId w = g.add_value("w"), c = g.add_value("c"), t1 = g.add_value("t1"),
            n = g.add_value("n"), i0 = g.add_value("i0"), i2 = g.add_value("i2");
    g.set_initializer(w, random_tensor({6, 5}, 97));
    g.set_initializer(c, random_tensor({5}, 98));
    g.set_initializer(t1, Tensor::from_vector<int64_t>({-1, 6}, {2}));
    g.set_initializer(n, Tensor::from_vector<int64_t>({5}, {1}));
    g.set_initializer(i0, Tensor::from_vector<int64_t>({0}, {1}));
    g.set_initializer(i2, Tensor::from_vector<int64_t>({2}, {1}));
    ValueId shape = g.add_value("shape"), lead = g.add_value("lead"), t2 = g.add_value("t2");
    g.add_node("Shape", {x}, {shape}, {}, "shape");
    g.add_node("Slice", {shape, i0, i2}, {lead}, {}, "lead");
    g.add_node("Concat", {lead, n}, {t2}, axis0(), "t2");
    ValueId f = g.add_value("f"), p = g.add_value("p"), y = g.add_value("y");
    g.add_node("Reshape", {x, t1}, {f}, {}, "flat");
    g.add_node("Gemm", {f, w, c}, {p}, {}, "gemm");
    g.add_node("Reshape", {p, t2}, {y}, {}, "unflat");
    g.add_output(y);
    infer_types(g);
    EXPECT_EQ(g.value(p).type.str(), "f32[b*s, 5]");
    Graph out = run_passes(g, {.only = {"UnflattenMatMul", "EliminateDeadCode"}});
    EXPECT_EQ(ops_of(out), heads ? (std::vector<std::string>{"Reshape", "MatMul", "Add"})
                                 : (std::vector<std::string>{"MatMul", "Add"}))
        << print(out);
    EXPECT_EQ(out.value(out.outputs()[0]).type.str(), "f32[b, s, 5]");
    for (auto [batch, seq] : {std::pair<int64_t, int64_t>{1, 7}, {3, 2}})
      expect_same_outputs(
          g, out, {random_tensor(heads ? Dims{batch, seq, 2, 3} : Dims{batch, seq, 6}, 99)});
  }
}

// The legacy ONNX exporter's repeat_kv over a decoder's cache: kv = Concat(past, new), past of a
// length the file leaves unnamed, so kv's has no name either, and the Expand target is
// Where(Equal(dims, -1), 1, dims) with dims = [Shape(kv)[0], 2, 3, Shape(kv)[2], 4]. A size is
// never -1 (unknown or not), so the Where picks dims; Shape(kv)[2] is the length
// Unsqueeze(kv, 2) has on axis 3, so the target is the constant [1, 2, 3, 1, 4]. The head
// merge's Reshape copies the batch (0) and infers the length (-1). The same element read against
// another tensor's axis proves nothing: that Expand stays computed. The shape arithmetic left
// unread goes in the same pass.
TEST(PassResolveShapes, RepeatedCacheOfUnnamedLength) {
  Graph g;
  const Dim b = Dim::sym("b");
  ValueId past = g.add_input("past", {DType::kF32, Shape{b, 2, Dim::unknown(), 4}});
  ValueId fresh = g.add_input("new", {DType::kF32, Shape{b, 2, Dim::sym("s"), 4}});
  auto ints1 = [&](const std::string& name, std::vector<int64_t> v) {
    ValueId c = g.add_value(name);
    const auto n = static_cast<int64_t>(v.size());
    g.set_initializer(c, Tensor::from_vector<int64_t>(v, {n}));
    return c;
  };
  Attributes on_length;
  on_length.set("axis", int64_t{2});
  ValueId kv = g.add_value("kv"), other = g.add_value("other");
  g.add_node("Concat", {past, fresh}, {kv}, on_length, "cache");
  g.add_node("Concat", {fresh, past}, {other}, on_length, "other_order");
  ValueId shape = g.add_value("shape"), batch = g.add_value("batch"), len = g.add_value("len");
  g.add_node("Shape", {kv}, {shape}, {}, "shape");
  g.add_node("Gather", {shape, ints1("i0", {0})}, {batch}, axis0(), "batch");
  g.add_node("Gather", {shape, ints1("i2", {2})}, {len}, axis0(), "len");
  ValueId dims = g.add_value("dims"), eq = g.add_value("eq"), target = g.add_value("target");
  g.add_node("Concat", {batch, ints1("kv_heads", {2}), ints1("groups", {3}), len, ints1("d", {4})},
             {dims}, axis0(), "dims");
  g.add_node("Equal", {dims, ints1("minus", {-1, -1, -1, -1, -1})}, {eq}, {}, "eq");
  g.add_node("Where", {eq, ints1("ones", {1, 1, 1, 1, 1}), dims}, {target}, {}, "where");
  ValueId merged = g.add_value("merged");
  g.add_node("Concat", {batch, ints1("heads", {6}), len, ints1("d2", {4})}, {merged}, axis0(),
             "merged");
  ValueId y = g.add_value("y");
  for (ValueId source : {kv, other}) {
    const std::string name = g.value(source).name;
    ValueId u = g.add_value(name + "_u"), e = g.add_value(name + "_e");
    g.add_node("Unsqueeze", {source, ints1(name + "_axis", {2})}, {u}, {}, name + "_unsqueeze");
    g.add_node("Expand", {u, target}, {e}, {}, name + "_expand");
    if (source == kv) {
      g.add_node("Reshape", {e, merged}, {y}, {}, "merge");
      g.add_output(y);
    } else {
      g.add_output(e);
    }
  }
  infer_types(g);
  EXPECT_EQ(g.value(y).type.str(), "f32[b, 6, ?, 4]");
  Graph out = run_passes(g, {.only = {"ResolveShapes"}});
  const Node* expand = nullptr;
  for (const Node& n : out.nodes())
    if (n.op == "Expand" && n.name == "kv_expand") expand = &n;
  ASSERT_NE(expand, nullptr);
  ASSERT_NE(out.initializer(expand->inputs[1]), nullptr) << print(out);
  EXPECT_EQ(ints(*out.initializer(expand->inputs[1])), (std::vector<int64_t>{1, 2, 3, 1, 4}));
  EXPECT_EQ(ints(target_of(out, "Reshape")), (std::vector<int64_t>{0, 6, -1, 4}));
  for (const Node& n : out.nodes()) {
    if (n.name == "other_expand") {
      EXPECT_EQ(out.initializer(n.inputs[1]), nullptr) << print(out);
    }
  }
  // What is left: the two caches, their Unsqueezes and Expands, the Reshape, and the shape
  // arithmetic only the computed Expand still reads.
  const std::vector<std::string> ops = ops_of(out);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "Shape"), 1) << print(out);
  EXPECT_LT(ops.size(), ops_of(g).size());
  for (auto [n, p, s] : {std::tuple<int64_t, int64_t, int64_t>{1, 0, 3}, {2, 5, 1}, {3, 9, 2}})
    expect_same_outputs(g, out, {random_tensor({n, 2, p, 4}, 11), random_tensor({n, 2, s, 4}, 12)});
}

// The same repeat_kv as the dynamo exporter writes it: the length in the targets is
// Reshape(Add(Shape(past)[2], Shape(ids)[1]), [-1]), torch's sym_size past + seq, and kv's length
// is the same sum, "(p+s)", by Concat's shape inference: the Expand target is [1, 2, 3, 1, 4], the
// merge's Reshape [0, 6, -1, 4] (its input's axis 2 is the groups'), and the shape arithmetic
// goes.
TEST(PassResolveShapes, RepeatedCacheOfASymbolicSum) {
  Graph g;
  const Dim b = Dim::sym("b"), p = Dim::sym("p"), s = Dim::sym("s");
  ValueId past = g.add_input("past", {DType::kF32, Shape{b, 2, p, 4}});
  ValueId fresh = g.add_input("new", {DType::kF32, Shape{b, 2, s, 4}});
  ValueId ids = g.add_input("ids", {DType::kI64, Shape{b, s}});
  auto constant = [&](const std::string& name, std::vector<int64_t> v, Dims shape) {
    ValueId c = g.add_value(name);
    g.set_initializer(c, Tensor::from_vector<int64_t>(v, std::move(shape)));
    return c;
  };
  Attributes on_length;
  on_length.set("axis", int64_t{2});
  ValueId kv = g.add_value("kv");
  g.add_node("Concat", {past, fresh}, {kv}, on_length, "cache");
  ValueId past_shape = g.add_value("past_shape"), ids_shape = g.add_value("ids_shape"),
          p_len = g.add_value("p_len"), s_len = g.add_value("s_len"), sum = g.add_value("sum"),
          sum1 = g.add_value("sum1"), batch = g.add_value("batch");
  g.add_node("Shape", {past}, {past_shape}, {}, "past_shape");
  g.add_node("Shape", {ids}, {ids_shape}, {}, "ids_shape");
  g.add_node("Gather", {past_shape, constant("two", {2}, {})}, {p_len}, axis0(), "p_len");
  g.add_node("Gather", {ids_shape, constant("one", {1}, {})}, {s_len}, axis0(), "s_len");
  g.add_node("Add", {p_len, s_len}, {sum}, {}, "sum");
  g.add_node("Reshape", {sum, constant("flat", {-1}, {1})}, {sum1}, {}, "sum1");
  g.add_node("Gather", {past_shape, constant("zero", {0}, {1})}, {batch}, axis0(), "batch");
  ValueId target = g.add_value("target"), merged = g.add_value("merged");
  g.add_node("Concat",
             {batch, constant("kv_heads", {2}, {1}), constant("groups", {3}, {1}), sum1,
              constant("d", {4}, {1})},
             {target}, axis0(), "target");
  g.add_node("Concat", {batch, constant("heads", {6}, {1}), sum1, constant("d2", {4}, {1})},
             {merged}, axis0(), "merged");
  ValueId u = g.add_value("u"), e = g.add_value("e"), y = g.add_value("y");
  g.add_node("Unsqueeze", {kv, constant("axis", {2}, {1})}, {u}, {}, "unsqueeze");
  g.add_node("Expand", {u, target}, {e}, {}, "expand");
  g.add_node("Reshape", {e, merged}, {y}, {}, "merge");
  g.add_output(y);
  infer_types(g);
  EXPECT_EQ(g.value(kv).type.str(), "f32[b, 2, (p+s), 4]");
  EXPECT_EQ(g.value(y).type.str(), "f32[b, 6, (p+s), 4]");
  Graph out = run_passes(g, {.only = {"ResolveShapes"}});
  EXPECT_EQ(ints(target_of(out, "Expand")), (std::vector<int64_t>{1, 2, 3, 1, 4}));
  EXPECT_EQ(ints(target_of(out, "Reshape")), (std::vector<int64_t>{0, 6, -1, 4}));
  EXPECT_EQ(ops_of(out), (std::vector<std::string>{"Concat", "Unsqueeze", "Expand", "Reshape"}))
      << print(out);
  for (auto [n, pl, sl] : {std::tuple<int64_t, int64_t, int64_t>{1, 0, 3}, {2, 5, 1}}) {
    std::vector<Tensor> in = {
        random_tensor({n, 2, pl, 4}, 11), random_tensor({n, 2, sl, 4}, 12),
        Tensor::from_vector<int64_t>(std::vector<int64_t>(n * sl, 0), {n, sl})};
    expect_same_outputs(g, out, in);
  }
}

// Phi-3 as the TorchScript exporter writes it: q_rot = q[..., :Shape(q)[3]] (an end only the
// sweep proves 16), then rotate_half's q_rot.shape[-1] // 2. That second value is known only once
// q_rot's type has its last dim, after the first sweep: ResolveShapes sweeps again with the types
// inferred anew, so both Slice ends are constants.
TEST(PassResolveShapes, ASecondSweepSeesTheTypesTheFirstSharpened) {
  Graph g;
  ValueId q = g.add_input("q", {DType::kF32, Shape{Dim::sym("b"), 4, Dim::sym("s"), 16}});
  auto constant = [&](const std::string& name, std::vector<int64_t> v, Dims shape) {
    ValueId c = g.add_value(name);
    g.set_initializer(c, Tensor::from_vector<int64_t>(v, std::move(shape)));
    return c;
  };
  const ValueId zero = constant("zero", {0}, {1}), last = constant("last", {3}, {1}),
                three = constant("three", {3}, {}), two = constant("two", {2}, {}),
                axis = constant("axis", {0}, {1});
  // end = Unsqueeze(Gather(Shape(q), 3)); rot = Slice(q, 0, end, 3)
  ValueId sq = g.add_value("sq"), d = g.add_value("d"), end = g.add_value("end"),
          rot = g.add_value("rot");
  g.add_node("Shape", {q}, {sq}, {}, "shape_q");
  g.add_node("Gather", {sq, three}, {d}, axis0(), "d");
  g.add_node("Unsqueeze", {d, axis}, {end}, {}, "end");
  g.add_node("Slice", {q, zero, end, last}, {rot}, {}, "rot");
  // half = Unsqueeze(Div(Gather(Shape(rot), 3), 2)); first = Slice(rot, 0, half, 3)
  ValueId sr = g.add_value("sr"), dr = g.add_value("dr"), div = g.add_value("div"),
          half = g.add_value("half"), first = g.add_value("first");
  g.add_node("Shape", {rot}, {sr}, {}, "shape_rot");
  g.add_node("Gather", {sr, three}, {dr}, axis0(), "dr");
  g.add_node("Div", {dr, two}, {div}, {}, "div");
  g.add_node("Unsqueeze", {div, axis}, {half}, {}, "half");
  g.add_node("Slice", {rot, zero, half, last}, {first}, {}, "first");
  g.add_output(first);
  infer_types(g);
  Graph out = run_passes(g, {.only = {"ResolveShapes"}});
  for (const Node& n : out.nodes()) {
    if (n.op != "Slice") continue;
    const Tensor* e = out.initializer(n.inputs[2]);
    ASSERT_NE(e, nullptr) << n.name << " end is computed:\n" << print(out);
    EXPECT_EQ(ints(*e), (std::vector<int64_t>{n.name == "rot" ? 16 : 8})) << n.name;
  }
  EXPECT_EQ(out.value(out.outputs()[0]).type.str(), "f32[b, 4, s, 8]");
  EXPECT_EQ(ops_of(out), (std::vector<std::string>{"Slice", "Slice"})) << print(out);
  for (int64_t b : {1, 2}) expect_same_outputs(g, out, {random_tensor({b, 4, 3, 16}, 21)});
}

}  // namespace
}  // namespace pto
