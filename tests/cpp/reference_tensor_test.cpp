// The tensor (shape and layout) family: reference kernels on tricky cases with hand-computed (or
// numpy-computed) values, shape inference with constant and symbolic inputs, and bad input that
// must raise an error rather than crash.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "pto/op_registry.h"
#include "pto/reference.h"
#include "reference/ops/cast.h"

namespace pto {
namespace {

// One argument of a one-node test graph.
struct Arg {
  Tensor value;                // undefined: a missing optional input
  bool constant = false;       // an initializer (visible to shape inference)
  std::optional<Shape> shape;  // declared shape of a graph input; default: the value's
};
Arg in(Tensor t) {
  return {std::move(t)};
}
Arg konst(Tensor t) {
  return {std::move(t), true};
}
Arg sym(Tensor t, Shape s) {
  return {std::move(t), false, std::move(s)};
}
Arg none() {
  return {};
}

Attributes attrs(std::initializer_list<std::pair<std::string, Attribute>> list) {
  Attributes a;
  for (const auto& [k, v] : list) a.set(k, v);
  return a;
}

struct OpRun {
  std::vector<Tensor> out;
  std::vector<TensorType> types;  // inferred
};

// Builds a graph with one `op` node, infers types and runs the reference interpreter.
OpRun run_op(const std::string& op, const std::vector<Arg>& args, Attributes a = {}, int opset = 0,
             int outputs = 1) {
  Graph g;
  std::vector<ValueId> ins;
  std::vector<Tensor> feed;
  for (size_t i = 0; i < args.size(); ++i) {
    const Arg& arg = args[i];
    if (!arg.value.defined()) {
      ins.push_back(kNoValue);
    } else if (arg.constant) {
      ValueId v = g.add_value(cat("c", i));
      g.set_initializer(v, arg.value);
      ins.push_back(v);
    } else {
      ins.push_back(g.add_input(
          cat("x", i), {arg.value.dtype(), arg.shape ? *arg.shape : to_shape(arg.value.shape())}));
      feed.push_back(arg.value);
    }
  }
  std::vector<ValueId> outs;
  for (int i = 0; i < outputs; ++i) outs.push_back(g.add_value(cat("y", i)));
  g.add_node(op, ins, outs, std::move(a), "n", opset);
  for (ValueId v : outs) g.add_output(v);
  verify(g);
  infer_types(g);
  OpRun r;
  for (ValueId v : outs) r.types.push_back(g.value(v).type);
  r.out = reference::run(g, feed);
  for (size_t i = 0; i < r.out.size(); ++i) {  // what inference claims must hold
    const TensorType& t = r.types[i];
    EXPECT_EQ(t.dtype, r.out[i].dtype()) << op << " output " << i;
    if (!t.shape) continue;
    EXPECT_EQ(t.shape->size(), r.out[i].shape().size()) << op << ": " << t.str();
    for (size_t k = 0; k < t.shape->size() && k < r.out[i].shape().size(); ++k)
      if ((*t.shape)[k].is_known()) {
        EXPECT_EQ((*t.shape)[k].value, r.out[i].shape()[k]) << op << ": " << t.str();
      }
  }
  return r;
}

template <class T>
Tensor vec(std::vector<T> v, Dims shape = {}) {
  if (shape.empty() && v.size() != 1) shape = {static_cast<int64_t>(v.size())};
  return Tensor::from_vector(v, shape);
}
Tensor ints(std::vector<int64_t> v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}
Tensor iota(DType dt, Dims shape) {
  Tensor t = Tensor::empty(dt, shape);
  dispatch(dt, kAllTypes, "iota", [&]<class T>() {
    for (int64_t i = 0; i < t.numel(); ++i)
      t.data<T>()[i] = reference::cast_value<T>(static_cast<int64_t>(i));
  });
  return t;
}

void expect_tensor(const Tensor& t, const Dims& shape, const std::vector<double>& want,
                   double tol = 0) {
  ASSERT_EQ(t.shape(), shape);
  ASSERT_EQ(t.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(t.item_as_double(static_cast<int64_t>(i)), want[i], tol) << "element " << i;
}

// ---- Cast ----

TEST(TensorOps, CastFloatToIntSaturatesAndMapsNanToZero) {
  float inf = std::numeric_limits<float>::infinity();
  Tensor x = vec<float>({NAN, inf, -inf, 1e10f, -1e10f, -2.7f, 2.7f});
  Tensor y = reference::cast(x, DType::kI32);
  expect_tensor(y, {7}, {0, 2147483647.0, -2147483648.0, 2147483647.0, -2147483648.0, -2, 2});
  Tensor u = reference::cast(vec<float>({-1.5f, 300.f, 254.9f}), DType::kU8);
  expect_tensor(u, {3}, {0, 255, 254});
  Tensor big = reference::cast(vec<double>({1e300, -1e300}), DType::kI64);
  EXPECT_EQ(big.data<int64_t>()[0], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(big.data<int64_t>()[1], std::numeric_limits<int64_t>::min());
  Tensor u64 = reference::cast(vec<double>({1e300, -5}), DType::kU64);
  EXPECT_EQ(u64.data<uint64_t>()[0], std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(u64.data<uint64_t>()[1], 0u);
}

TEST(TensorOps, CastIntegersWrapAndBoolIsNonZero) {
  expect_tensor(reference::cast(vec<int32_t>({300, -1, 256}), DType::kU8), {3}, {44, 255, 0});
  expect_tensor(reference::cast(vec<float>({NAN, 0.f, -0.f, 0.5f}), DType::kBool), {4},
                {1, 0, 0, 1});
  expect_tensor(reference::cast(vec<bool>({true, false}), DType::kBF16), {2}, {1, 0});
  expect_tensor(reference::cast(vec<uint64_t>({~uint64_t{0}}), DType::kF32), {},
                {18446744073709551616.0});
}

TEST(TensorOps, CastToHalfRoundsOnce) {
  // 1 + 2^-11 + 2^-40: through float it becomes the tie 1 + 2^-11 and rounds to 1; once, up.
  double d = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  Tensor h = reference::cast(vec<double>({d}), DType::kF16);
  EXPECT_EQ(h.item_as_double(), 1.0 + std::ldexp(1.0, -10));
  // 2^60 + 2^52 + 1 as int64 to bf16: through double it is the tie 2^60 + 2^52.
  int64_t v = (int64_t{1} << 60) + (int64_t{1} << 52) + 1;
  Tensor b = reference::cast(vec<int64_t>({v}), DType::kBF16);
  EXPECT_EQ(b.item_as_double(), std::ldexp(1.0, 60) + std::ldexp(1.0, 53));
  // Overflow to infinity, NaN stays NaN.
  Tensor o = reference::cast(vec<float>({70000.f, NAN}), DType::kF16);
  EXPECT_TRUE(std::isinf(o.item_as_double(0)));
  EXPECT_TRUE(std::isnan(o.item_as_double(1)));
}

TEST(TensorOps, CastAndCastLikeNodes) {
  auto r = run_op("Cast", {sym(vec<float>({1.5f, -2.5f}), Shape{Dim::sym("n")})},
                  attrs({{"to", int64_t{7}}}));
  EXPECT_EQ(r.types[0].str(), "i64[n]");
  expect_tensor(r.out[0], {2}, {1, -2});
  auto l = run_op("CastLike", {in(vec<int32_t>({3, 4})), in(vec<double>({0}))});
  EXPECT_EQ(l.out[0].dtype(), DType::kF64);
  EXPECT_THROW(run_op("Cast", {in(vec<float>({1}))}, attrs({{"to", int64_t{8}}})),
               UnsupportedError);  // string
}

// ---- Reshape, Flatten, Squeeze, Unsqueeze ----

TEST(TensorOps, ReshapeZeroMinusOneAndAllowzero) {
  Tensor x = iota(DType::kF32, {2, 3, 4});
  auto r = run_op("Reshape", {in(x), konst(ints({0, -1}))});
  EXPECT_EQ(r.types[0].str(), "f32[2, 12]");
  EXPECT_EQ(r.out[0].shape(), (Dims{2, 12}));
  EXPECT_EQ(r.out[0].item_as_double(13), 13);
  // allowzero: 0 is a real zero-size dim.
  auto z = run_op("Reshape", {in(Tensor::zeros(DType::kF32, {0, 3})), konst(ints({3, 0}))},
                  attrs({{"allowzero", int64_t{1}}}));
  EXPECT_EQ(z.out[0].shape(), (Dims{3, 0}));
  EXPECT_THROW(run_op("Reshape", {in(x), konst(ints({-1, -1}))}), ValueError);
  EXPECT_THROW(run_op("Reshape", {in(x), in(ints({5, -1}))}), ValueError);
  EXPECT_THROW(run_op("Reshape", {in(x), in(ints({2, 3, 4, 0, 0}))}), ValueError);
}

TEST(TensorOps, ReshapeInfersSymbolicDims) {
  Tensor x = iota(DType::kF32, {2, 3, 4});
  Shape s{Dim::sym("batch"), 3, 4};
  EXPECT_EQ(run_op("Reshape", {sym(x, s), konst(ints({0, -1}))}).types[0].str(), "f32[batch, 12]");
  EXPECT_EQ(run_op("Reshape", {sym(x, s), konst(ints({-1, 4}))}).types[0].str(), "f32[3*batch, 4]");
  EXPECT_EQ(run_op("Reshape", {sym(x, s), konst(ints({0, 2, -1}))}).types[0].str(),
            "f32[batch, 2, 6]");
  // The shape is not a constant, but its length is known.
  EXPECT_EQ(run_op("Reshape", {sym(x, s), in(ints({2, 12}))}).types[0].str(), "f32[?, ?]");
}

TEST(TensorOps, FlattenSqueezeUnsqueeze) {
  Tensor x = iota(DType::kI8, {2, 1, 3});
  Shape s{Dim::sym("b"), 1, 3};
  auto f = run_op("Flatten", {sym(x, s)}, attrs({{"axis", int64_t{-2}}}));
  EXPECT_EQ(f.types[0].str(), "i8[b, 3]");
  EXPECT_EQ(f.out[0].shape(), (Dims{2, 3}));
  EXPECT_EQ(run_op("Flatten", {sym(x, s)}, attrs({{"axis", int64_t{0}}})).out[0].shape(),
            (Dims{1, 6}));
  // Squeeze: axes as input (13+) and as attribute (11).
  auto q = run_op("Squeeze", {sym(x, s), konst(ints({-2}))});
  EXPECT_EQ(q.types[0].str(), "i8[b, 3]");
  EXPECT_EQ(
      run_op("Squeeze", {in(x)}, attrs({{"axes", std::vector<int64_t>{1}}}), 11).out[0].shape(),
      (Dims{2, 3}));
  EXPECT_EQ(run_op("Squeeze", {in(x)}).out[0].shape(), (Dims{2, 3}));
  EXPECT_THROW(run_op("Squeeze", {in(x), in(ints({0}))}), ValueError);
  auto u = run_op("Unsqueeze", {sym(x, s), konst(ints({0, -1}))});
  EXPECT_EQ(u.types[0].str(), "i8[1, b, 1, 3, 1]");
  EXPECT_EQ(u.out[0].shape(), (Dims{1, 2, 1, 3, 1}));
  EXPECT_THROW(run_op("Unsqueeze", {in(x), in(ints({1, 1}))}), ValueError);
  EXPECT_THROW(run_op("Unsqueeze", {in(x), in(ints({9}))}), ValueError);
}

// ---- Transpose, Expand, Tile, Concat ----

TEST(TensorOps, TransposeAndExpand) {
  Tensor x = iota(DType::kBool, {2, 3});  // 0 1 1 1 1 1
  Tensor x2 = iota(DType::kF16, {2, 3});
  auto t = run_op("Transpose", {sym(x2, Shape{Dim::sym("n"), 3})});
  EXPECT_EQ(t.types[0].str(), "f16[3, n]");
  expect_tensor(t.out[0], {3, 2}, {0, 3, 1, 4, 2, 5});
  auto p = run_op("Transpose", {in(x)}, attrs({{"perm", std::vector<int64_t>{1, 0}}}));
  expect_tensor(p.out[0], {3, 2}, {0, 1, 1, 1, 1, 1});
  EXPECT_THROW(run_op("Transpose", {in(x)}, attrs({{"perm", std::vector<int64_t>{0, 0}}})),
               ValueError);
  auto e = run_op("Expand", {in(vec<int32_t>({7, 8, 9}, {3, 1})), konst(ints({2, 1, 2}))});
  EXPECT_EQ(e.types[0].str(), "i32[2, 3, 2]");
  expect_tensor(e.out[0], {2, 3, 2}, {7, 7, 8, 8, 9, 9, 7, 7, 8, 8, 9, 9});
  EXPECT_THROW(run_op("Expand", {in(x), in(ints({4, 3}))}), ValueError);
  EXPECT_THROW(run_op("Expand", {in(x), in(ints({-1, 3}))}), ValueError);
}

TEST(TensorOps, TileAndConcat) {
  Tensor x = iota(DType::kU16, {2, 2});
  auto t = run_op("Tile", {in(x), konst(ints({1, 3}))});
  EXPECT_EQ(t.types[0].str(), "u16[2, 6]");
  expect_tensor(t.out[0], {2, 6}, {0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3});
  EXPECT_EQ(run_op("Tile", {in(x), in(ints({0, 2}))}).out[0].shape(), (Dims{0, 4}));
  EXPECT_THROW(run_op("Tile", {in(x), in(ints({-1, 2}))}), ValueError);

  Shape sa{Dim::sym("b"), 2}, sb{Dim::sym("b"), 1};
  auto c = run_op("Concat",
                  {sym(iota(DType::kI64, {2, 2}), sa), sym(vec<int64_t>({9, 9}, {2, 1}), sb),
                   sym(Tensor::zeros(DType::kI64, {2, 0}), Shape{Dim::sym("b"), 0})},
                  attrs({{"axis", int64_t{-1}}}));
  EXPECT_EQ(c.types[0].str(), "i64[b, 3]");
  expect_tensor(c.out[0], {2, 3}, {0, 1, 9, 2, 3, 9});
  EXPECT_THROW(run_op("Concat", {in(iota(DType::kF32, {2, 2})), in(iota(DType::kF32, {3, 3}))},
                      attrs({{"axis", int64_t{0}}})),
               ValueError);
}

// ---- Split and Slice ----

TEST(TensorOps, SplitForms) {
  Tensor x = iota(DType::kF64, {7});
  // num_outputs (18): chunks of ceil(7 / 3) = 3, the last smaller.
  auto a = run_op("Split", {in(x)}, attrs({{"num_outputs", int64_t{3}}}), 18, 3);
  EXPECT_EQ(a.types[2].str(), "f64[1]");
  expect_tensor(a.out[0], {3}, {0, 1, 2});
  expect_tensor(a.out[2], {1}, {6});
  // split as an input (13+), with a zero-size part.
  auto b = run_op("Split", {in(x), konst(ints({2, 0, 5}))}, {}, 13, 3);
  EXPECT_EQ(b.types[1].str(), "f64[0]");
  expect_tensor(b.out[2], {5}, {2, 3, 4, 5, 6});
  // split as an attribute (2-11); equal parts without either.
  auto c = run_op("Split", {in(x)}, attrs({{"split", std::vector<int64_t>{6, 1}}}), 11, 2);
  EXPECT_EQ(c.out[1].shape(), (Dims{1}));
  EXPECT_THROW(run_op("Split", {in(x)}, {}, 13, 2), ValueError);  // 7 is odd
  EXPECT_THROW(run_op("Split", {in(x), in(ints({3, 3}))}, {}, 13, 2), ValueError);
  EXPECT_THROW(run_op("Split", {in(x), in(ints({8, -1}))}, {}, 13, 2), ValueError);
}

TEST(TensorOps, SliceClampsAndSteps) {
  Tensor x = iota(DType::kI32, {10});
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t kMin = std::numeric_limits<int64_t>::min();
  // Reverse the whole axis.
  auto r = run_op("Slice", {in(x), konst(ints({-1})), konst(ints({kMin})), konst(ints({0})),
                            konst(ints({-1}))});
  EXPECT_EQ(r.types[0].str(), "i32[10]");
  expect_tensor(r.out[0], {10}, {9, 8, 7, 6, 5, 4, 3, 2, 1, 0});
  // Step 3 from 1, end far out of range.
  expect_tensor(
      run_op("Slice", {in(x), in(ints({1})), in(ints({kMax})), none(), in(ints({3}))}).out[0], {3},
      {1, 4, 7});
  // Huge negative step: only the start.
  expect_tensor(
      run_op("Slice", {in(x), in(ints({5})), in(ints({kMin})), none(), in(ints({kMin}))}).out[0],
      {1}, {5});
  // Empty: start past end.
  EXPECT_EQ(run_op("Slice", {in(x), in(ints({8})), in(ints({2}))}).out[0].numel(), 0);
  EXPECT_THROW(run_op("Slice", {in(x), in(ints({0})), in(ints({5})), none(), in(ints({0}))}),
               ValueError);
  // Slice-1: attributes; a symbolic dim survives a whole-axis slice.
  Tensor m = iota(DType::kF32, {3, 4});
  auto a = run_op("Slice", {sym(m, Shape{Dim::sym("n"), 4})},
                  attrs({{"starts", std::vector<int64_t>{1}},
                         {"ends", std::vector<int64_t>{3}},
                         {"axes", std::vector<int64_t>{1}}}),
                  9);
  EXPECT_EQ(a.types[0].str(), "f32[n, 2]");
  expect_tensor(a.out[0], {3, 2}, {1, 2, 5, 6, 9, 10});
}

// ---- Pad ----

TEST(TensorOps, PadModesMatchNumpy) {
  Tensor x = vec<int32_t>({1, 2, 3});
  auto pad = [&](const std::string& mode, std::vector<int64_t> pads) {
    return run_op("Pad", {in(x), konst(ints(pads))}, attrs({{"mode", mode}})).out[0];
  };
  // numpy.pad([1, 2, 3], (4, 4), 'reflect') and friends.
  expect_tensor(pad("reflect", {4, 4}), {11}, {1, 2, 3, 2, 1, 2, 3, 2, 1, 2, 3});
  expect_tensor(pad("wrap", {4, 2}), {9}, {3, 1, 2, 3, 1, 2, 3, 1, 2});
  expect_tensor(pad("edge", {2, 1}), {6}, {1, 1, 1, 2, 3, 3});
  expect_tensor(pad("constant", {-1, 1}), {3}, {2, 3, 0});
  // Constant value input, axes input, and Pad-2's attributes.
  Tensor m = iota(DType::kF32, {2, 2});
  auto c = run_op("Pad", {in(m), konst(ints({1, 0})), in(vec<float>({9.f})), konst(ints({-1}))});
  EXPECT_EQ(c.types[0].str(), "f32[2, 3]");
  expect_tensor(c.out[0], {2, 3}, {9, 0, 1, 9, 2, 3});
  auto old = run_op("Pad", {in(m)},
                    attrs({{"pads", std::vector<int64_t>{0, 0, 1, 0}}, {"value", 1.5}}), 2);
  expect_tensor(old.out[0], {3, 2}, {0, 1, 2, 3, 1.5, 1.5});
  EXPECT_THROW(pad("constant", {-2, -2}), ValueError);
  EXPECT_THROW(pad("reflect", {1}), ValueError);
  EXPECT_THROW(run_op("Pad", {in(Tensor::zeros(DType::kF32, {0})), in(ints({1, 1}))},
                      attrs({{"mode", std::string("edge")}})),
               ValueError);
}

// ---- DepthToSpace, SpaceToDepth, Trilu, EyeLike ----

TEST(TensorOps, DepthToSpaceModesAndInverse) {
  Tensor x = iota(DType::kF32, {1, 8, 1, 1});
  auto dcr = run_op("DepthToSpace", {in(x)}, attrs({{"blocksize", int64_t{2}}}));
  EXPECT_EQ(dcr.types[0].str(), "f32[1, 2, 2, 2]");
  // DCR: out[c][i][j] = in[(i * 2 + j) * 2 + c]
  expect_tensor(dcr.out[0], {1, 2, 2, 2}, {0, 2, 4, 6, 1, 3, 5, 7});
  auto crd = run_op("DepthToSpace", {in(x)},
                    attrs({{"blocksize", int64_t{2}}, {"mode", std::string("CRD")}}));
  expect_tensor(crd.out[0], {1, 2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  auto back = run_op("SpaceToDepth", {in(dcr.out[0])}, attrs({{"blocksize", int64_t{2}}}));
  expect_tensor(back.out[0], {1, 8, 1, 1}, {0, 1, 2, 3, 4, 5, 6, 7});
  EXPECT_THROW(run_op("DepthToSpace", {in(x)}, attrs({{"blocksize", int64_t{3}}})), ValueError);
  EXPECT_THROW(run_op("SpaceToDepth", {in(x)}, attrs({{"blocksize", int64_t{2}}})), ValueError);
}

TEST(TensorOps, TriluAndEyeLike) {
  Tensor x = iota(DType::kI64, {2, 3});
  expect_tensor(run_op("Trilu", {in(x)}).out[0], {2, 3}, {0, 1, 2, 0, 4, 5});
  expect_tensor(
      run_op("Trilu", {in(x), in(vec<int64_t>({-1}))}, attrs({{"upper", int64_t{0}}})).out[0],
      {2, 3}, {0, 0, 0, 3, 0, 0});
  expect_tensor(
      run_op("Trilu", {in(x), in(vec<int64_t>({std::numeric_limits<int64_t>::max()}))}).out[0],
      {2, 3}, {0, 0, 0, 0, 0, 0});
  expect_tensor(run_op("Trilu", {in(x), in(vec<int64_t>({std::numeric_limits<int64_t>::min()}))},
                       attrs({{"upper", int64_t{0}}}))
                    .out[0],
                {2, 3}, {0, 0, 0, 0, 0, 0});
  auto e = run_op("EyeLike", {in(x)}, attrs({{"k", int64_t{1}}, {"dtype", int64_t{9}}}));
  EXPECT_EQ(e.types[0].str(), "bool[2, 3]");
  expect_tensor(e.out[0], {2, 3}, {0, 1, 0, 0, 0, 1});
}

// ---- Shape, Size, Constant, ConstantOfShape, Range ----

TEST(TensorOps, ShapeSizeAndConstants) {
  Tensor x = iota(DType::kF32, {2, 3, 4});
  auto s = run_op("Shape", {sym(x, Shape{Dim::sym("b"), 3, 4})},
                  attrs({{"start", int64_t{-2}}, {"end", int64_t{100}}}));
  EXPECT_EQ(s.types[0].str(), "i64[2]");
  expect_tensor(s.out[0], {2}, {3, 4});
  expect_tensor(run_op("Size", {in(x)}).out[0], {}, {24});
  auto c = run_op("Constant", {}, attrs({{"value_ints", std::vector<int64_t>{4, 5}}}));
  EXPECT_EQ(c.types[0].str(), "i64[2]");
  expect_tensor(c.out[0], {2}, {4, 5});
  expect_tensor(run_op("Constant", {}, attrs({{"value_float", 0.25}})).out[0], {}, {0.25});
  auto k =
      run_op("ConstantOfShape", {konst(ints({2, 1}))}, attrs({{"value", vec<int32_t>({7}, {1})}}));
  EXPECT_EQ(k.types[0].str(), "i32[2, 1]");
  expect_tensor(k.out[0], {2, 1}, {7, 7});
  expect_tensor(run_op("ConstantOfShape", {in(Tensor::zeros(DType::kI64, {0}))}).out[0], {}, {0});
  EXPECT_THROW(run_op("ConstantOfShape", {in(ints({-1}))}), ValueError);
}

TEST(TensorOps, RangeCountsAndNeverOverflows) {
  auto r = run_op("Range",
                  {konst(vec<int32_t>({10})), konst(vec<int32_t>({4})), konst(vec<int32_t>({-2}))});
  EXPECT_EQ(r.types[0].str(), "i32[3]");
  expect_tensor(r.out[0], {3}, {10, 8, 6});
  expect_tensor(
      run_op("Range", {in(vec<float>({1.f})), in(vec<float>({2.f})), in(vec<float>({0.3f}))})
          .out[0],
      {4}, {1, 1.3, 1.6, 1.9}, 1e-6);
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t kMin = std::numeric_limits<int64_t>::min();
  auto w = run_op("Range",
                  {in(vec<int64_t>({kMin})), in(vec<int64_t>({kMax})), in(vec<int64_t>({kMax}))});
  ASSERT_EQ(w.out[0].numel(), 3);
  EXPECT_EQ(w.out[0].data<int64_t>()[2], kMax - 1);
  EXPECT_THROW(
      run_op("Range", {in(vec<int64_t>({0})), in(vec<int64_t>({5})), in(vec<int64_t>({0}))}),
      ValueError);
  EXPECT_THROW(
      run_op("Range", {in(vec<float>({0})), in(vec<float>({INFINITY})), in(vec<float>({1}))}),
      ValueError);  // too long to allocate
}

// ---- Resize and Upsample (expected values from onnx.reference's op_resize) ----

TEST(TensorOps, ResizeLinearModes) {
  Tensor x = vec<float>({1, 2, 3, 4}, {2, 2});
  auto ac = run_op("Resize", {in(x), none(), konst(vec<float>({2.f, 2.f}))},
                   attrs({{"mode", std::string("linear")},
                          {"coordinate_transformation_mode", std::string("align_corners")}}));
  EXPECT_EQ(ac.types[0].str(), "f32[4, 4]");
  double t = 1.0 / 3;
  expect_tensor(ac.out[0], {4, 4},
                {1, 1 + t, 2 - t, 2, 1 + 2 * t, 2, 2 + t, 3 - t, 3 - 2 * t, 3 - t, 3, 3 + t, 3,
                 3 + t, 4 - t, 4},
                1e-6);
  auto hp = run_op("Resize", {in(x), none(), in(vec<float>({2.f, 2.f}))},
                   attrs({{"mode", std::string("linear")}}));
  expect_tensor(hp.out[0], {4, 4},
                {1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3, 3.25, 3.75, 4},
                1e-6);
  // Integer data rounds half to even and saturates: [0, 0, 85, 170, 255, 255].
  Tensor u = vec<uint8_t>({0, 255, 10, 20}, {2, 2});
  auto ru = run_op("Resize", {in(u), none(), none(), konst(ints({2, 6}))},
                   attrs({{"mode", std::string("linear")}}));
  EXPECT_EQ(ru.types[0].str(), "u8[2, 6]");
  expect_tensor(ru.out[0], {2, 6}, {0, 0, 85, 170, 255, 255, 10, 10, 13, 17, 20, 20});
}

TEST(TensorOps, ResizeCubicNearestAndCrop) {
  Tensor x = vec<float>({1, 2, 3, 4, 5});
  auto c = run_op("Resize", {in(x), none(), none(), in(ints({3}))},
                  attrs({{"mode", std::string("cubic")}}));
  expect_tensor(c.out[0], {3}, {1.2592592592592573, 3.0, 4.740740740740746}, 1e-5);
  auto e = run_op("Resize", {in(x), none(), in(vec<float>({0.6f}))},
                  attrs({{"mode", std::string("cubic")},
                         {"cubic_coeff_a", -0.5},
                         {"exclude_outside", int64_t{1}},
                         {"coordinate_transformation_mode", std::string("asymmetric")}}));
  expect_tensor(e.out[0], {3}, {1.0, 2.6666666666666674, 4.392857142857143}, 1e-5);
  // nearest, asymmetric + floor: [1 1 1 2 2 2 ...] like Upsample.
  auto n = run_op("Resize", {in(vec<float>({1, 2})), none(), in(vec<float>({3.f}))},
                  attrs({{"coordinate_transformation_mode", std::string("asymmetric")},
                         {"nearest_mode", std::string("floor")}}));
  expect_tensor(n.out[0], {6}, {1, 1, 1, 2, 2, 2});
  // Nearest copies its one source: an inf beside it is not multiplied by a weight of 0 (NaN).
  auto ni =
      run_op("Resize", {in(vec<float>({1, INFINITY, -INFINITY, 4})), none(), in(vec<float>({2.f}))},
             attrs({{"coordinate_transformation_mode", std::string("half_pixel")},
                    {"nearest_mode", std::string("round_prefer_ceil")}}));
  const std::vector<float> want_ni = {1, 1, INFINITY, INFINITY, -INFINITY, -INFINITY, 4, 4};
  ASSERT_EQ(ni.out[0].shape(), Dims{8});
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(ni.out[0].data<float>()[i], want_ni[i]) << i;
  // tf_crop_and_resize: positions outside the roi get extrapolation_value.
  auto cr = run_op("Resize", {in(x), in(vec<float>({0.5f, 1.5f})), none(), in(ints({3}))},
                   attrs({{"mode", std::string("linear")},
                          {"coordinate_transformation_mode", std::string("tf_crop_and_resize")},
                          {"extrapolation_value", 10.0}}));
  expect_tensor(cr.out[0], {3}, {3, 5, 10}, 1e-6);
  auto up =
      run_op("Upsample", {in(vec<float>({1, 2}, {1, 2})), konst(vec<float>({2.f, 2.f}))}, {}, 9);
  EXPECT_EQ(up.types[0].str(), "f32[2, 4]");
  expect_tensor(up.out[0], {2, 4}, {1, 1, 2, 2, 1, 1, 2, 2});
}

TEST(TensorOps, ResizeKeepsAspectRatioAndRejectsBadInput) {
  Tensor x = iota(DType::kF32, {1, 1, 2, 2});
  auto r = run_op("Resize", {in(x), none(), none(), konst(ints({7, 8}))},
                  attrs({{"axes", std::vector<int64_t>{2, 3}},
                         {"keep_aspect_ratio_policy", std::string("not_larger")}}));
  EXPECT_EQ(r.types[0].str(), "f32[1, 1, 7, 7]");
  EXPECT_EQ(r.out[0].shape(), (Dims{1, 1, 7, 7}));
  EXPECT_THROW(
      run_op("Resize", {in(x), none(), in(vec<float>({1, 1, 2, 2})), in(ints({1, 1, 4, 4}))}),
      ValueError);
  EXPECT_THROW(run_op("Resize", {in(x), none(), in(vec<float>({1, 1, -2, 2}))}), ValueError);
  EXPECT_THROW(run_op("Resize", {in(x), none(), in(vec<float>({1, 1, NAN, 2}))}), ValueError);
  EXPECT_THROW(run_op("Resize", {in(x), none(), in(vec<float>({2, 2}))}), ValueError);
  EXPECT_THROW(run_op("Resize", {in(x), none(), in(vec<float>({1, 1, 2, 2}))},
                      attrs({{"mode", std::string("area")}})),
               ValueError);
}

// A zero-size dim next to a huge one: no allocation or loop may scale with the huge dim.
TEST(TensorOps, EmptyOutputsWithHugeDimsReturnAtOnce) {
  const int64_t kHuge = int64_t{1} << 40;
  Tensor e = Tensor::zeros(DType::kF32, {0, 2});
  auto p = run_op("Pad", {in(e), in(ints({0, kHuge, 0, kHuge}))});
  EXPECT_EQ(p.out[0].shape(), (Dims{0, 2 + 2 * kHuge}));
  auto r = run_op("Resize", {in(e), none(), none(), in(ints({0, kHuge}))});
  EXPECT_EQ(r.out[0].shape(), (Dims{0, kHuge}));
  auto t = run_op("Tile", {in(e), in(ints({kHuge, kHuge}))});
  EXPECT_EQ(t.out[0].shape(), (Dims{0, 2 * kHuge}));
  auto i = run_op("EyeLike", {in(Tensor::zeros(DType::kF32, {kHuge, 0}))});
  EXPECT_EQ(i.out[0].numel(), 0);
  EXPECT_THROW(run_op("Pad", {in(e), in(ints({0, kHuge << 22, 0, kHuge << 22}))}), ValueError);
  EXPECT_THROW(run_op("ConstantOfShape", {in(ints({kHuge, kHuge}))}), ValueError);
  // Empty, but with strides that would overflow.
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_THROW(run_op("Expand", {in(e), in(ints({0, kMax, 100}))}), ValueError);
  EXPECT_THROW(run_op("ConstantOfShape", {in(ints({kMax, 0, kMax}))}), ValueError);
}

}  // namespace
}  // namespace pto
