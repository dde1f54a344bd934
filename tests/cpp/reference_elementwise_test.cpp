// Elementwise reference kernels: the tricky cases (integer division and Mod signs, wrapping,
// shifts out of range, half-to-even rounding, NaN handling, opset-dependent Clip) against values
// computed by hand, plus the OpDef properties passes rely on.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "pto/op_registry.h"
#include "pto/reference.h"

namespace pto {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Runs one node of `op` on the given inputs (an undefined tensor is a missing optional input) and
// returns its outputs; also checks that inference agrees with the kernel's dtype and shape.
std::vector<Tensor> run_op(const std::string& op, const std::vector<Tensor>& inputs,
                           Attributes attrs = {}, int opset = 0) {
  Graph g;
  std::vector<ValueId> ins;
  std::vector<Tensor> feeds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      ins.push_back(kNoValue);
      continue;
    }
    ins.push_back(g.add_input(cat("in", i), {inputs[i].dtype(), to_shape(inputs[i].shape())}));
    feeds.push_back(inputs[i]);
  }
  ValueId out = g.add_value("out");
  g.add_node(op, ins, {out}, std::move(attrs), "n", opset);
  g.add_output(out);
  verify(g);
  infer_types(g);
  std::vector<Tensor> result = reference::run(g, feeds);
  const TensorType& t = g.value(out).type;
  EXPECT_EQ(t.dtype, result[0].dtype()) << op;
  if (t.shape) {
    EXPECT_EQ(to_dims(*t.shape), result[0].shape()) << op;
  }
  return result;
}

Tensor run1(const std::string& op, const std::vector<Tensor>& inputs, Attributes attrs = {},
            int opset = 0) {
  return run_op(op, inputs, std::move(attrs), opset)[0];
}

Attributes attrs(std::initializer_list<std::pair<const char*, Attribute>> kv) {
  Attributes a;
  for (auto& [k, v] : kv) a.set(k, v);
  return a;
}

template <class T>
Tensor vec(std::vector<T> v) {
  int64_t n = static_cast<int64_t>(v.size());
  return Tensor::from_vector<T>(v, {n});
}

// Element values as doubles, compared exactly (NaN equals NaN; -0 equals +0 unless asked).
void expect_values(const Tensor& t, const std::vector<double>& want, const char* what = "") {
  ASSERT_EQ(t.numel(), static_cast<int64_t>(want.size())) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    double g = t.item_as_double(static_cast<int64_t>(i));
    if (std::isnan(want[i]))
      EXPECT_TRUE(std::isnan(g)) << what << " element " << i << " is " << g;
    else
      EXPECT_EQ(g, want[i]) << what << " element " << i;
  }
}

void expect_near(const Tensor& t, const std::vector<double>& want, double tol) {
  ASSERT_EQ(t.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(t.item_as_double(static_cast<int64_t>(i)), want[i], tol) << "element " << i;
}

constexpr int32_t kIntMin = std::numeric_limits<int32_t>::min();

TEST(Elementwise, RoundIsHalfToEven) {
  Tensor y =
      run1("Round", {vec<float>({-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f, 2.4f, 2.6f, -3.5f})});
  expect_values(y, {-2, -2, 0, 0, 2, 2, 2, 3, -4});
  EXPECT_TRUE(std::signbit(y.data<float>()[2]));  // -0.5 rounds to -0
}

TEST(Elementwise, IntegerDivisionTruncatesAndNeverTraps) {
  Tensor y = run1(
      "Div", {vec<int32_t>({7, -7, 7, -7, kIntMin, 5, 0}), vec<int32_t>({2, 2, -2, -2, -1, 0, 3})});
  expect_values(y, {3, -3, -3, 3, kIntMin, 0, 0});
  expect_values(run1("Div", {vec<uint8_t>({200, 7}), vec<uint8_t>({3, 0})}), {66, 0});
}

TEST(Elementwise, ModSignRules) {
  auto a = vec<int32_t>({5, -5, 5, -5, kIntMin, 9, 0});
  auto b = vec<int32_t>({3, 3, -3, -3, -1, 0, -4});
  expect_values(run1("Mod", {a, b}), {2, 1, -1, -2, 0, 0, 0}, "fmod=0");
  expect_values(run1("Mod", {a, b}, attrs({{"fmod", int64_t{1}}})), {2, -2, 2, -2, 0, 0, 0},
                "fmod=1");
  auto x = vec<double>({5.5, -5.5, 5.5, 1.0, 3.0, -3.0, kInf, 2.0});
  auto y = vec<double>({2.0, 2.0, -2.0, 0.0, -kInf, -kInf, 2.0, kNaN});
  expect_values(run1("Mod", {x, y}), {1.5, 0.5, -0.5, kNaN, -kInf, -3.0, kNaN, kNaN}, "float");
  expect_values(run1("Mod", {x, y}, attrs({{"fmod", int64_t{1}}})),
                {1.5, -1.5, 1.5, kNaN, 3.0, -3.0, kNaN, kNaN}, "float fmod=1");
  Tensor z = run1("Mod", {vec<float>({4.0f, -0.0f}), vec<float>({-2.0f, 3.0f})});
  EXPECT_TRUE(std::signbit(z.data<float>()[0]));  // zero takes the divisor's sign
  EXPECT_FALSE(std::signbit(z.data<float>()[1]));
  EXPECT_THROW(run1("Mod", {x, y}, attrs({{"fmod", int64_t{2}}})), ValueError);
}

TEST(Elementwise, IntegerArithmeticWraps) {
  expect_values(run1("Add", {vec<int8_t>({127, -128}), vec<int8_t>({1, -1})}), {-128, 127});
  expect_values(run1("Mul", {vec<uint16_t>({65535}), vec<uint16_t>({65535})}), {1});
  expect_values(run1("Sub", {vec<uint32_t>({0}), vec<uint32_t>({1})}), {4294967295.0});
  expect_values(run1("Abs", {vec<int32_t>({kIntMin, -3, 3})}), {kIntMin, 3, 3});
  expect_values(run1("Neg", {vec<int32_t>({kIntMin, -3, 0})}), {kIntMin, 3, 0});
}

TEST(Elementwise, PowMixesDtypes) {
  // Integer base and exponent: exact, wrapping; negative exponents truncate toward zero.
  expect_values(run1("Pow", {vec<int64_t>({2, 3, -2, 1, -1, -1, 5}),
                             vec<int64_t>({10, 0, 3, -5, -3, -2, -1})}),
                {1024, 1, -8, 1, -1, 1, 0});
  // Integer base, float exponent: computed in floating point, truncated to the base's dtype.
  Tensor y = run1("Pow", {vec<int32_t>({2, 4, 9}), vec<float>({0.5f, 0.5f, 2.0f})});
  EXPECT_EQ(y.dtype(), DType::kI32);
  expect_values(y, {1, 2, 81});
  // Float base, integer exponent.
  Tensor z = run1("Pow", {vec<float>({1.5f, -2.0f}), vec<int64_t>({2, 3})});
  EXPECT_EQ(z.dtype(), DType::kF32);
  expect_values(z, {2.25, -8});
  // A NaN result does not become an out-of-range integer conversion.
  expect_values(run1("Pow", {vec<int32_t>({-8}), vec<double>({0.5})}), {0});
}

TEST(Elementwise, BitShiftOutOfRange) {
  Attributes left = attrs({{"direction", std::string("LEFT")}});
  Attributes right = attrs({{"direction", std::string("RIGHT")}});
  expect_values(
      run1("BitShift", {vec<uint8_t>({1, 2, 255, 255}), vec<uint8_t>({1, 2, 8, 1})}, left),
      {2, 8, 0, 254});
  expect_values(
      run1("BitShift", {vec<int32_t>({-8, -8, -8, 8, 1, 1}), vec<int32_t>({1, 40, -1, 40, 31, -1})},
           right),
      {-4, -1, -1, 0, 0, 0});
  expect_values(run1("BitShift", {vec<int32_t>({1, -1, 3}), vec<int32_t>({31, 40, -2})}, left),
                {kIntMin, 0, 0});
  EXPECT_THROW(run1("BitShift", {vec<uint8_t>({1}), vec<uint8_t>({1})},
                    attrs({{"direction", std::string("UP")}})),
               ValueError);
}

TEST(Elementwise, ClipAttributesBeforeOpset11AndInputsAfter) {
  auto x = vec<float>({-3, -1, 0, 1, 3, static_cast<float>(kNaN)});
  expect_values(run1("Clip", {x}, attrs({{"min", -1.5}, {"max", 2.0}}), 6),
                {-1.5, -1, 0, 1, 2, kNaN});
  expect_values(
      run1("Clip", {x, Tensor::scalar<float>(-1.5f), Tensor::scalar<float>(2.0f)}, {}, 13),
      {-1.5, -1, 0, 1, 2, kNaN});
  expect_values(run1("Clip", {x, Tensor(), Tensor::scalar<float>(0.5f)}, {}, 13),
                {-3, -1, 0, 0.5, 0.5, kNaN});
  // min > max: everything becomes max.
  expect_values(run1("Clip", {x, Tensor::scalar<float>(2.0f), Tensor::scalar<float>(1.0f)}, {}, 13),
                {1, 1, 1, 1, 1, kNaN});
  expect_values(run1("Clip", {vec<int8_t>({-128, 0, 127}), Tensor::scalar<int8_t>(-5)}, {}, 13),
                {-5, 0, 127});
  EXPECT_THROW(run1("Clip", {x, vec<float>({0, 1})}, {}, 13), ValueError);
  EXPECT_THROW(run1("Clip", {x, Tensor::scalar<double>(0)}, {}, 13), TypeError);
}

TEST(Elementwise, PReluSlopeBroadcastsToX) {
  Tensor x = Tensor::from_vector<float>({-1, 2, -3, 4, -5, 6}, {2, 3});
  expect_values(run1("PRelu", {x, vec<float>({0.5f, 1.0f, 2.0f})}), {-0.5, 2, -6, 4, -5, 6});
  expect_values(run1("PRelu", {vec<int32_t>({-3, 3}), vec<int32_t>({2})}), {-6, 3});
  EXPECT_THROW(run1("PRelu", {vec<float>({1, 2}), Tensor::zeros(DType::kF32, {3, 2})}), ValueError);
}

TEST(Elementwise, ActivationValues) {
  auto x = vec<double>({-2.0, -0.5, 0.0, 0.5, 2.0});
  expect_near(
      run1("Gelu", {x}),
      {-0.04550026389635842, -0.15426876936299347, 0, 0.34573123063700656, 1.9544997361036416},
      1e-12);
  expect_near(run1("Gelu", {x}, attrs({{"approximate", std::string("tanh")}})),
              {-0.04540230591222, -0.15428599017299, 0, 0.34571400982701, 1.95459769408778}, 1e-10);
  expect_near(run1("Selu", {x}),
              {-1.5201664733475926, -0.6917581899652426, 0, 0.5253505110740662, 2.1014020442962646},
              1e-12);  // ONNX's float32 alpha and gamma
  expect_near(run1("Celu", {x}, attrs({{"alpha", 2.0}})),
              {-1.2642411176571153, -0.44239843385719024, 0, 0.5, 2}, 1e-12);
  expect_near(run1("HardSwish", {x}),
              {-1.0 / 3, -0.20833333333333334, 0, 0.2916666666666667, 1.6666666666666667}, 1e-12);
  expect_near(run1("Mish", {x}),
              {-0.2525014826957089, -0.22074377465173, 0, 0.3752452113048951, 1.9439589595339946},
              1e-12);
  expect_values(run1("Shrink", {x}, attrs({{"lambd", 1.0}, {"bias", 0.5}})), {-1.5, 0, 0, 0, 1.5});
  expect_values(run1("Shrink", {vec<int8_t>({-5, 0, 5})}, attrs({{"lambd", 1.5}, {"bias", 1.5}})),
                {-3, 0, 3});
  expect_values(run1("ThresholdedRelu", {x}, attrs({{"alpha", 0.5}})), {0, 0, 0, 0, 2});
  expect_values(run1("Relu", {vec<float>({-1, static_cast<float>(kNaN), 2})}), {0, kNaN, 2});
  expect_values(run1("Relu", {vec<int8_t>({-128, 5})}), {0, 5});
}

TEST(Elementwise, ExtremeInputsStayFinite) {
  expect_near(run1("Softplus", {vec<float>({100.0f, -100.0f})}), {100, 3.7200760e-44},
              2e-45);  // a float denormal
  Tensor s = run1("Sigmoid", {vec<float>({-100.0f, 100.0f})});
  EXPECT_FALSE(std::isnan(s.item_as_double(0)));
  EXPECT_EQ(s.item_as_double(1), 1.0);
  expect_values(run1("Mish", {vec<float>({-200.0f})}), {0});
  EXPECT_NEAR(run1("Mish", {vec<float>({200.0f})}).item_as_double(0), 200.0, 0);
}

TEST(Elementwise, PredicatesAndSign) {
  auto x = vec<float>(
      {1, -static_cast<float>(kInf), static_cast<float>(kInf), static_cast<float>(kNaN), 0});
  Tensor inf = run1("IsInf", {x});
  EXPECT_EQ(inf.dtype(), DType::kBool);
  expect_values(inf, {0, 1, 1, 0, 0});
  expect_values(run1("IsInf", {x}, attrs({{"detect_positive", int64_t{0}}})), {0, 1, 0, 0, 0});
  expect_values(run1("IsInf", {x}, attrs({{"detect_negative", int64_t{0}}})), {0, 0, 1, 0, 0});
  expect_values(run1("IsNaN", {x}), {0, 0, 0, 1, 0});
  expect_values(run1("Sign", {x}), {1, -1, 1, kNaN, 0});
  expect_values(run1("Sign", {vec<uint8_t>({0, 7})}), {0, 1});
  expect_values(run1("BitwiseNot", {vec<uint8_t>({0, 0xf0})}), {255, 0x0f});
  expect_values(run1("Not", {vec<bool>({true, false})}), {0, 1});
}

TEST(Elementwise, HalfTypesComputeInFloat) {
  Tensor h = Tensor::from_vector<Float16>({Float16(1.0f), Float16(-2.5f)}, {2});
  Tensor y = run1("Exp", {h});
  EXPECT_EQ(y.dtype(), DType::kF16);
  expect_values(y, {static_cast<float>(Float16(std::exp(1.0f))),
                    static_cast<float>(Float16(std::exp(-2.5f)))});
  Tensor b = Tensor::from_vector<BFloat16>({BFloat16(3.0f), BFloat16(-3.0f)}, {2});
  expect_values(run1("Mod", {b, Tensor::from_vector<BFloat16>({BFloat16(2.0f)}, {1})}), {1, 1});
}

TEST(Elementwise, ComparisonsGiveBoolAndHandleNaN) {
  auto a = Tensor::from_vector<float>({1, 2, 3, static_cast<float>(kNaN)}, {2, 2});
  auto b = vec<float>({2, static_cast<float>(kNaN)});
  Tensor eq = run1("Equal", {a, b});
  EXPECT_EQ(eq.dtype(), DType::kBool);
  EXPECT_EQ(eq.shape(), (Dims{2, 2}));
  expect_values(eq, {0, 0, 0, 0});
  expect_values(run1("Less", {a, b}), {1, 0, 0, 0});
  expect_values(run1("GreaterOrEqual", {a, b}), {0, 0, 1, 0});
  expect_values(run1("LessOrEqual", {vec<uint64_t>({0, ~uint64_t{0}}), vec<uint64_t>({1, 1})}),
                {1, 0});
  expect_values(run1("Equal", {vec<bool>({true, false}), vec<bool>({true, true})}), {1, 0});
  expect_values(run1("Xor", {vec<bool>({true, false, true}), vec<bool>({true})}), {0, 1, 0});
}

TEST(Elementwise, VariadicBroadcastAndNaN) {
  Tensor a = Tensor::from_vector<float>({1, 5, 3, 4}, {2, 2});
  Tensor b = vec<float>({2, static_cast<float>(kNaN)});
  Tensor c = Tensor::scalar<float>(3);
  expect_values(run1("Max", {a, b, c}), {3, kNaN, 3, kNaN});
  expect_values(run1("Min", {a, b, c}), {1, kNaN, 2, kNaN});
  expect_values(run1("Sum", {a, vec<float>({1, 2}), c}), {5, 10, 7, 9});
  expect_values(run1("Mean", {a, vec<float>({1, 2}), c}), {5.0f / 3, 10.0f / 3, 7.0f / 3, 3});
  expect_values(run1("Max", {vec<int64_t>({-5, 7})}), {-5, 7});
  EXPECT_THROW(run1("Sum", {a, vec<float>({1, 2, 3})}), ValueError);
}

TEST(Elementwise, WhereBroadcastsThreeWays) {
  Tensor cond = Tensor::from_vector<bool>({true, false}, {2, 1});
  Tensor x = vec<int64_t>({1, 2, 3});
  Tensor y = Tensor::scalar<int64_t>(-1);
  Tensor out = run1("Where", {cond, x, y});
  EXPECT_EQ(out.shape(), (Dims{2, 3}));
  expect_values(out, {1, 2, 3, -1, -1, -1});
  EXPECT_THROW(run1("Where", {x, x, x}), TypeError);
}

TEST(Elementwise, BadInputsThrow) {
  EXPECT_THROW(run1("Add", {vec<float>({1}), vec<double>({1})}), TypeError);
  EXPECT_THROW(run1("Exp", {vec<int32_t>({1})}), UnsupportedError);
  EXPECT_THROW(run1("And", {vec<int32_t>({1}), vec<int32_t>({1})}), UnsupportedError);
  EXPECT_THROW(run1("Gelu", {vec<float>({1})}, attrs({{"approximate", std::string("x")}})),
               ValueError);
  EXPECT_THROW(run1("Celu", {vec<float>({1})}, attrs({{"alpha", 0.0}})), ValueError);
  EXPECT_THROW(run1("Mul", {vec<float>({1, 2}), vec<float>({1, 2, 3})}), ValueError);
}

TEST(Elementwise, EmptyTensors) {
  Tensor e = Tensor::zeros(DType::kF32, {0, 3});
  Tensor y = run1("Add", {e, vec<float>({1, 2, 3})});
  EXPECT_EQ(y.shape(), (Dims{0, 3}));
  EXPECT_EQ(run1("Sigmoid", {e}).shape(), (Dims{0, 3}));
}

TEST(Elementwise, OpDefProperties) {
  const OpRegistry& r = OpRegistry::global();
  for (const char* op : {"Add", "Mul", "And", "Or", "Xor", "Equal", "Max", "Min", "Sum",
                         "BitwiseAnd", "BitwiseOr", "BitwiseXor"}) {
    ASSERT_NE(r.find(op), nullptr) << op;
    EXPECT_TRUE(r.find(op)->is_commutative()) << op;
    EXPECT_TRUE(r.find(op)->is_broadcast()) << op;
    EXPECT_TRUE(r.find(op)->is_elementwise()) << op;
  }
  for (const char* op : {"Sub", "Div", "Pow", "Mod", "Less", "BitShift"})
    EXPECT_FALSE(r.find(op)->is_commutative()) << op;
  for (const char* op : {"Exp", "Relu", "Gelu", "IsNaN", "Clip", "Where", "PRelu"})
    EXPECT_TRUE(r.find(op)->is_elementwise()) << op;
  EXPECT_FALSE(r.find("Exp")->is_broadcast());
  EXPECT_TRUE(r.find("Where")->is_broadcast());
  EXPECT_EQ(r.find("Sum")->max_inputs, -1);
}

TEST(Elementwise, InferenceOfBoolOutputsAndUnknownShapes) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::sym("n"), 3}});
  ValueId u = g.add_input("u", {DType::kF32, std::nullopt});
  ValueId c = g.add_value("c"), nan = g.add_value("nan"), s = g.add_value("s");
  g.add_node("Less", {x, u}, {c});
  g.add_node("IsNaN", {x}, {nan});
  g.add_node("Add", {x, u}, {s});
  g.add_output(c);
  g.add_output(nan);
  g.add_output(s);
  infer_types(g);
  EXPECT_EQ(g.value(c).type.str(), "bool[*]");
  EXPECT_EQ(g.value(nan).type.str(), "bool[n, 3]");
  EXPECT_EQ(g.value(s).type.str(), "f32[*]");
}

}  // namespace
}  // namespace pto
