// The elementwise CPU kernels (src/backend/cpu/elementwise.cpp) and the GEMM epilogue
// (epilogue_impl.h): each op as a one-node graph compiled at level 0 must run on "cpu" and match
// the reference interpreter — exactly for exact ops, within a few ulp for transcendentals — on
// every ISA, with 1 and 2 threads, for empty, scalar, odd and broadcast shapes. The epilogue is
// checked against a double-precision loop.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/gemm/gemm.h"
#include "backend/cpu/isa/isa.h"
#include "pto/executable.h"
#include "pto/parallel.h"
#include "pto/reference.h"

namespace pto {
namespace {

using cpu::Isa;

Tensor random_f32(const Dims& shape, uint32_t seed, float lo = -4, float hi = 4,
                  bool specials = true) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  float* p = t.data<float>();
  const float special[] = {0.0f, -0.0f, NAN, INFINITY, -INFINITY, 1.0f, -1.0f, 2.0f, 0.5f};
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = specials && rng() % 16 == 0 ? special[rng() % 9] : d(rng);
  return t;
}

// Integers in [-20, 20] with 0, +-1 and the type's extremes mixed in (division by 0 and -1,
// INT_MIN / -1, wrapping).
template <class T>
Tensor random_int(const Dims& shape, uint32_t seed) {
  Tensor t = Tensor::empty(dtype_of<T>, shape);
  std::mt19937 rng(seed);
  const T special[] = {0, 1, T(-1), std::numeric_limits<T>::min(), std::numeric_limits<T>::max()};
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<T>()[i] = rng() % 8 == 0 ? special[rng() % 5] : static_cast<T>(int(rng() % 41) - 20);
  return t;
}

Tensor random_bool(const Dims& shape, uint32_t seed) {
  Tensor t = Tensor::empty(DType::kBool, shape);
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<bool>()[i] = rng() % 2;
  return t;
}

double ulp_of(double t) {
  t = std::fabs(t);
  if (t < FLT_MIN) return std::ldexp(1.0, -149);
  int e;
  std::frexp(t, &e);
  return std::ldexp(1.0, e - 24);
}

// How close a result must be to the reference: exact (bits, any NaN equal to any NaN), or within
// `ulps` of the reference's value plus `abs` (for formulas the reference evaluates with
// cancellation, such as GELU's 1 + erf).
struct Tol {
  double ulps = 0, abs = 0;
};

void expect_close(const Tensor& got, const Tensor& want, Tol tol, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  int reported = 0;
  if (!is_floating(got.dtype())) {  // integers and bools: every byte
    for (int64_t i = 0; i < got.numel() && reported < 5; ++i) {
      const size_t at = static_cast<size_t>(i) * got.itemsize();
      if (std::memcmp(static_cast<const std::byte*>(got.raw_data()) + at,
                      static_cast<const std::byte*>(want.raw_data()) + at, got.itemsize()) != 0) {
        ADD_FAILURE() << what << ": element " << i << " is " << got.item_as_double(i)
                      << ", reference " << want.item_as_double(i);
        ++reported;
      }
    }
    return;
  }
  for (int64_t i = 0; i < got.numel() && reported < 5; ++i) {
    double g = got.item_as_double(i), w = want.item_as_double(i);
    bool ok;
    if (std::isnan(w) || std::isnan(g))
      ok = std::isnan(w) && std::isnan(g);
    else if (tol.ulps == 0 && tol.abs == 0)
      ok = g == w && std::signbit(g) == std::signbit(w);
    else
      ok = g == w || std::fabs(g - w) <= tol.ulps * ulp_of(w) + tol.abs;
    if (!ok) {
      ADD_FAILURE() << what << ": element " << i << " is " << g << ", reference " << w;
      ++reported;
    }
  }
}

struct Call {
  std::string op;
  std::vector<Tensor> inputs;  // undefined: a missing optional input
  Attributes attrs;
  int opset = 18;
};

// Runs `call` as a one-node graph on the CPU backend (asserting that it did not fall back) for
// every ISA and 1 and 2 threads, and compares with the reference interpreter.
void check(const Call& call, Tol tol = {}, bool expect_cpu = true) {
  Graph g;
  std::vector<ValueId> ins;
  std::vector<Tensor> feeds;
  for (size_t i = 0; i < call.inputs.size(); ++i) {
    if (!call.inputs[i].defined()) {
      ins.push_back(kNoValue);
      continue;
    }
    ins.push_back(g.add_input("in" + std::to_string(i),
                              {call.inputs[i].dtype(), to_shape(call.inputs[i].shape())}));
    feeds.push_back(call.inputs[i]);
  }
  ValueId out = g.add_value("out");
  g.add_node(call.op, ins, {out}, call.attrs, "node", call.opset);
  g.add_output(out);
  std::string what = call.op + "(";
  for (const Tensor& t : call.inputs) what += (t.defined() ? t.str() : "-") + " ";
  what += ")";
  Executable exe = compile(g, {.level = 0});
  EXPECT_EQ(exe.node_backend(0), expect_cpu ? "cpu" : "reference") << what;
  Tensor want = reference::run(g, feeds)[0];
  int saved = num_threads();
  for (Isa isa : cpu::supported_isas()) {
    cpu::IsaScope scope(isa);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      expect_close(exe.run(feeds)[0], want, tol,
                   what + " " + cpu::isa_name(isa) + " x" + std::to_string(threads));
    }
  }
  set_num_threads(saved);
}

const std::vector<Dims> kUnaryShapes = {{}, {0}, {1}, {7}, {3, 17}, {2, 3, 33}, {40000}};

Attributes attrs(std::initializer_list<std::pair<const char*, Attribute>> list) {
  Attributes a;
  for (const auto& [k, v] : list) a.set(k, v);
  return a;
}

TEST(CpuElementwise, ExactUnaryOps) {
  for (const char* op : {"Relu", "Neg", "Abs", "Sign", "Floor", "Ceil", "Round", "Sqrt",
                         "Reciprocal", "HardSwish", "Softsign"}) {
    uint32_t seed = 1;
    for (const Dims& s : kUnaryShapes) check({op, {random_f32(s, seed++)}});
  }
  for (const Dims& s : kUnaryShapes) {
    check({"LeakyRelu", {random_f32(s, 3)}, attrs({{"alpha", 0.1}})});
    check({"LeakyRelu", {random_f32(s, 3)}});
    check({"ThresholdedRelu", {random_f32(s, 4)}, attrs({{"alpha", 0.5}})});
    check({"HardSigmoid", {random_f32(s, 5)}, attrs({{"alpha", 0.3}, {"beta", 0.4}})});
    check({"HardSigmoid", {random_f32(s, 5)}});
  }
}

TEST(CpuElementwise, TranscendentalUnaryOps) {
  for (const char* op :
       {"Exp", "Log", "Tanh", "Sigmoid", "Erf", "Softplus", "Mish", "Sin", "Cos"}) {
    uint32_t seed = 10;
    for (const Dims& s : kUnaryShapes) check({op, {random_f32(s, seed++, -12, 12)}}, {8, 0});
  }
  for (const char* op : {"Sin", "Cos"})  // large arguments, some past the scalar fallback's 2^16
    check({op, {random_f32({3, 999}, 30, -1e5f, 1e5f)}}, {8, 0});
  // The reference evaluates these with cancellation (1 + erf, alpha e^x - alpha): an absolute
  // allowance of a few float32 ulp of 1 covers its own error.
  for (const Dims& s : kUnaryShapes) {
    Tensor x = random_f32(s, 20);
    check({"Gelu", {x}}, {8, 1e-6});
    check({"Gelu", {x}, attrs({{"approximate", std::string("tanh")}})}, {8, 1e-6});
    check({"Elu", {x}, attrs({{"alpha", 0.7}})}, {8, 1e-6});
    check({"Selu", {x}}, {8, 1e-6});
    check({"Celu", {x}, attrs({{"alpha", 1.5}})}, {8, 1e-6});
    check({"Swish", {x}, attrs({{"alpha", 1.3}})}, {8, 1e-6});
  }
  // An unknown GELU form is left to the reference (which reports it).
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{3}}), y = g.add_value("y");
  g.add_node("Gelu", {x}, {y}, attrs({{"approximate", std::string("erf")}}), "n");
  g.add_output(y);
  EXPECT_EQ(compile(g, {.level = 0}).node_backend(0), "reference");
}

// Shrink: x < -lambd ? x + bias : x > lambd ? x - bias : 0, NaN to 0 (onnxruntime too), on the
// vector op; bias not representable in float moves a result by at most one ulp.
TEST(CpuElementwise, Shrink) {
  for (const Dims& s : kUnaryShapes) {
    Tensor x = random_f32(s, 25, -3, 3);
    for (int64_t i = 0; i < x.numel(); i += 5) x.data<float>()[i] = 0.5f;  // == lambd: 0
    if (x.numel() > 9) {
      x.data<float>()[1] = NAN;
      x.data<float>()[2] = INFINITY;
      x.data<float>()[3] = -INFINITY;
      x.data<float>()[4] = -0.5f;
    }
    check({"Shrink", {x}});
    check({"Shrink", {x}, attrs({{"lambd", 1.5}, {"bias", 1.5}})});
    check({"Shrink", {x}, attrs({{"lambd", 0.25}, {"bias", 0.1}})}, {1, 0});
  }
}

// SwiGLU(a, b) = a * sigmoid(alpha a) * b on one shape; a shape mismatch is the reference's
// error, from the CPU kernel too.
TEST(CpuElementwise, SwiGLU) {
  for (const Dims& s : kUnaryShapes) {
    Tensor a = random_f32(s, 30, -12, 12), b = random_f32(s, 31, -2, 2);
    if (a.numel() > 9) {
      a.data<float>()[1] = NAN;
      a.data<float>()[2] = INFINITY;
      a.data<float>()[3] = -INFINITY;
      b.data<float>()[4] = INFINITY;
    }
    check({"SwiGLU", {a, b}}, {8, 1e-6});
    check({"SwiGLU", {a, b}, attrs({{"alpha", 1.702}})}, {8, 1e-6});
  }
  Graph g;
  ValueId a = g.add_input("a", {DType::kF32, Shape{3, 4}}), b = g.add_input("b", {DType::kF32});
  ValueId y = g.add_value("y");
  g.add_node("SwiGLU", {a, b}, {y}, {}, "n");
  g.add_output(y);
  Executable exe = compile(g, {.level = 0});
  EXPECT_EQ(exe.node_backend(0), "cpu");
  const std::vector<Tensor> in = {random_f32({3, 4}, 1), random_f32({4}, 2)};
  std::string want, got;
  try {
    reference::run(g, in);
  } catch (const ValueError& e) {
    want = e.what();
  }
  try {
    exe.run(in);
  } catch (const ValueError& e) {
    got = e.what();
  }
  EXPECT_FALSE(want.empty());
  EXPECT_EQ(got, want);
}

// The trigonometric and hyperbolic functions without a vector form (libm's float functions):
// within 4 ulp of the reference's double ones; outside their domains NaN, like the reference.
TEST(CpuElementwise, InverseAndHyperbolicTrigonometry) {
  struct Range {
    const char* op;
    float lo, hi;
  };
  for (const Range& r :
       {Range{"Tan", -1.5f, 1.5f}, Range{"Asin", -1.2f, 1.2f}, Range{"Acos", -1.2f, 1.2f},
        Range{"Atan", -50, 50}, Range{"Sinh", -20, 20}, Range{"Cosh", -20, 20},
        Range{"Asinh", -1e3f, 1e3f}, Range{"Acosh", 0.5f, 100}, Range{"Atanh", -1.2f, 1.2f}}) {
    uint32_t seed = 40;
    for (const Dims& s : kUnaryShapes) check({r.op, {random_f32(s, seed++, r.lo, r.hi)}}, {4, 0});
    Tensor x = random_f32({3, 7}, 49, r.lo, r.hi);
    const float specials[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1.0f, -1.0f, 100.0f};
    std::copy(std::begin(specials), std::end(specials), x.data<float>());
    check({r.op, {x}}, {4, 0});
  }
}

TEST(CpuElementwise, Clip) {
  Tensor x = random_f32({5, 9}, 30);
  auto scalar = [](float v) { return Tensor::scalar<float>(v); };
  check({"Clip", {x, scalar(-1), scalar(2)}});
  check({"Clip", {x, scalar(-1)}});
  check({"Clip", {x, Tensor(), scalar(0.5f)}});
  check({"Clip", {x}});
  check({"Clip", {x, scalar(3), scalar(1)}});  // lo > hi: hi everywhere
  check({"Clip", {x}, attrs({{"min", -0.5}, {"max", 0.5}}), 6});
  check({"Clip", {x}, attrs({{"min", -0.5}}), 6});
  check({"Clip", {random_f32({0}, 1), scalar(0), scalar(1)}});
}

TEST(CpuElementwise, ClipIntegers) {  // LayoutLMv3's clamped box differences (int64)
  Tensor i64 = Tensor::from_vector<int64_t>({-5, 0, 7, 1LL << 40, -(1LL << 40), 1023, 1024}, {7});
  auto s64 = [](int64_t v) { return Tensor::scalar<int64_t>(v); };
  check({"Clip", {i64, s64(0), s64(1023)}});
  check({"Clip", {i64, s64(-3)}});
  check({"Clip", {i64, Tensor(), s64(5)}});
  check({"Clip", {i64, s64(9), s64(2)}});  // lo > hi: hi everywhere
  check({"Clip", {i64}});
  Tensor i32 = Tensor::from_vector<int32_t>({-9, 4, 12, 3, 100, -100}, {2, 3});
  check({"Clip", {i32, Tensor::scalar<int32_t>(-1), Tensor::scalar<int32_t>(10)}});
}

// Pairs of shapes covering every kind of broadcasting.
const std::vector<std::pair<Dims, Dims>> kPairs = {{{5, 7}, {5, 7}},
                                                   {{5, 7}, {}},
                                                   {{}, {5, 7}},
                                                   {{5, 7}, {7}},
                                                   {{5, 7}, {5, 1}},
                                                   {{5, 1}, {5, 7}},
                                                   {{4, 5, 6}, {1, 5, 1}},
                                                   {{2, 1, 6}, {3, 1}},
                                                   {{3, 1, 5}, {1, 4, 1}},
                                                   {{0, 3}, {3}},
                                                   {{1}, {1}},
                                                   {{33}, {1}},
                                                   {{1, 33}, {17, 1}},
                                                   {{2, 3, 4, 5}, {3, 1, 5}},
                                                   {{300, 70}, {70}},
                                                   {{70, 300}, {70, 1}},
                                                   // A per-channel vector against channel-blocked
                                                   // planes (short rows folded k at a time), on
                                                   // either side; a prime plane (k = m); rows too
                                                   // many to fold (k = 1).
                                                   {{1, 6, 14, 14, 16}, {1, 6, 1, 1, 16}},
                                                   {{2, 3, 1, 1, 16}, {2, 3, 7, 5, 16}},
                                                   {{13, 5}, {1, 5}},
                                                   {{1031, 3}, {1, 3}},
                                                   {{}, {}}};

TEST(CpuElementwise, BinaryOpsBroadcast) {
  uint32_t seed = 40;
  for (const auto& [sa, sb] : kPairs) {
    Tensor a = random_f32(sa, seed++), b = random_f32(sb, seed++);
    for (const char* op : {"Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less", "LessOrEqual",
                           "Greater", "GreaterOrEqual"})
      check({op, {a, b}});
    check({"Sum", {a, b}});
    check({"Mean", {a, b}});
    check({"Pow", {a, b}});
    check({"Where", {random_bool(sa, seed++), a, b}});
    check({"Where", {random_bool(sb, seed++), a, b}});
    check({"And", {random_bool(sa, seed), random_bool(sb, seed + 1)}});
    check({"Or", {random_bool(sa, seed), random_bool(sb, seed + 1)}});
    check({"Xor", {random_bool(sa, seed), random_bool(sb, seed + 1)}});
  }
}

TEST(CpuElementwise, VariadicAndWhereKinds) {
  Tensor a = random_f32({4, 1, 6}, 60), b = random_f32({5, 1}, 61), c = random_f32({6}, 62);
  for (const char* op : {"Max", "Min", "Sum", "Mean"}) {
    check({op, {a}});
    check({op, {a, b, c}});
    check({op, {c, b, a, c}});
  }
  Tensor cond = random_bool({5, 6}, 63);
  check({"Where", {cond, a, c}});
  check({"Where", {random_bool({}, 64), a, b}});
  // Where on other element sizes: int64, int32 and bool.
  Tensor i64 = Tensor::from_vector<int64_t>({1, -2, 3, 1LL << 40, 5, 6}, {2, 3});
  Tensor j64 = Tensor::from_vector<int64_t>({7, 8, 9}, {3});
  check({"Where", {random_bool({2, 3}, 65), i64, j64}});
  Tensor i32 = Tensor::from_vector<int32_t>({1, -2, 3, 4, 5, 6}, {2, 3});
  check({"Where", {random_bool({4, 2, 3}, 66), i32, Tensor::scalar<int32_t>(-7)}});
  check({"Where", {random_bool({3}, 67), random_bool({2, 3}, 68), random_bool({1}, 69)}});
  // uint8 Add stays with the reference.
  check({"Add", {Tensor::from_vector<uint8_t>({1, 2}, {2}), Tensor::scalar<uint8_t>(255)}}, {},
        false);
}

TEST(CpuElementwise, IntegerOpsBroadcast) {
  uint32_t seed = 400;
  auto each = [&]<class T>() {
    for (const auto& [sa, sb] : kPairs) {
      Tensor a = random_int<T>(sa, seed++), b = random_int<T>(sb, seed++);
      for (const char* op : {"Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less",
                             "LessOrEqual", "Greater", "GreaterOrEqual"})
        check({op, {a, b}});
      for (int64_t fmod : {0, 1}) check({"Mod", {a, b}, attrs({{"fmod", fmod}})});
      check({"Neg", {a}});
      check({"Abs", {b}});
    }
    Tensor a = random_int<T>({4, 1, 6}, seed++), b = random_int<T>({5, 1}, seed++),
           c = random_int<T>({6}, seed++);
    for (const char* op : {"Max", "Min"}) {
      check({op, {a}});
      check({op, {a, b, c}});
    }
  };
  each.template operator()<int64_t>();
  each.template operator()<int32_t>();
  for (const auto& [sa, sb] : kPairs) {
    Tensor a = random_f32(sa, seed++), b = random_f32(sb, seed++);
    for (int64_t fmod : {0, 1}) check({"Mod", {a, b}, attrs({{"fmod", fmod}})});
    check({"Equal", {random_bool(sa, seed), random_bool(sb, seed + 1)}});
    check({"Not", {random_bool(sa, seed + 2)}});
  }
  // Forms the ONNX schemas do not allow, or these kernels do not take, stay on the reference.
  check({"Div", {random_int<int16_t>({3}, 1), random_int<int16_t>({3}, 2)}}, {}, false);
  check({"Neg", {random_int<int8_t>({3}, 3)}}, {}, false);
}

TEST(CpuElementwise, PowIntegerExponent) {
  Tensor x = random_f32({3, 41}, 80);
  for (int64_t e : {2, 3, 1, 0, -1, -2, 5, 31}) {
    check({"Pow", {x, Tensor::scalar<int64_t>(e)}});
    check({"Pow", {x, Tensor::scalar<int32_t>(static_cast<int32_t>(e))}});
  }
  Tensor e64 = Tensor::from_vector<int64_t>({-3, -1, 0, 1, 2, 3, 7, 40}, {8});
  check({"Pow", {random_f32({5, 8}, 81), e64}});
  check({"Pow", {random_f32({}, 82), e64}});
  check({"Pow", {random_f32({8}, 83), random_int<int32_t>({3, 8}, 84)}});
}

TEST(CpuGenerate, RangeConstantOfShapeShapeSize) {
  check({"Range",
         {Tensor::scalar<int64_t>(0), Tensor::scalar<int64_t>(7), Tensor::scalar<int64_t>(1)}});
  check({"Range",
         {Tensor::scalar<int64_t>(10), Tensor::scalar<int64_t>(-7), Tensor::scalar<int64_t>(-3)}});
  check({"Range",
         {Tensor::scalar<int64_t>(5), Tensor::scalar<int64_t>(5), Tensor::scalar<int64_t>(2)}});
  check(
      {"Range",
       {Tensor::scalar<int32_t>(-4), Tensor::scalar<int32_t>(50000), Tensor::scalar<int32_t>(1)}});
  check({"Range",
         {Tensor::scalar<float>(0.1f), Tensor::scalar<float>(3.3f), Tensor::scalar<float>(0.3f)}});
  check(
      {"Range",
       {Tensor::scalar<double>(1.0), Tensor::scalar<double>(-2.0), Tensor::scalar<double>(-0.7)}});
  check({"Range",
         {Tensor::scalar<float>(0), Tensor::scalar<float>(40000.5f), Tensor::scalar<float>(1)}});
  for (const Dims& dims : std::vector<Dims>{{2, 3}, {0, 4}, {}, {40000}}) {
    Tensor shape = Tensor::from_vector<int64_t>(dims, {static_cast<int64_t>(dims.size())});
    check({"ConstantOfShape", {shape}});
    check(
        {"ConstantOfShape", {shape}, attrs({{"value", Tensor::from_vector<int64_t>({-5}, {1})}})});
    check(
        {"ConstantOfShape", {shape}, attrs({{"value", Tensor::from_vector<float>({2.5f}, {1})}})});
    check({"ConstantOfShape", {shape}, attrs({{"value", Tensor::from_vector<bool>({true}, {1})}})});
  }
  Tensor x = random_f32({2, 3, 5, 7}, 90);
  check({"Shape", {x}});
  check({"Shape", {x}, attrs({{"start", int64_t{1}}})});
  check({"Shape", {x}, attrs({{"start", int64_t{-3}}, {"end", int64_t{-1}}})});
  check({"Shape", {x}, attrs({{"start", int64_t{3}}, {"end", int64_t{1}}})});
  check({"Shape", {random_f32({}, 91)}});
  check({"Size", {x}});
  check({"Size", {random_int<int64_t>({0, 3}, 92)}});
}

TEST(CpuGenerate, CumSum) {
  auto each = [&](const Tensor& x) {
    for (int64_t axis = -x.rank(); axis < std::max<int64_t>(x.rank(), 1); ++axis)
      for (int64_t exclusive : {0, 1})
        for (int64_t reverse : {0, 1})
          check({"CumSum",
                 {x, Tensor::scalar<int64_t>(axis)},
                 attrs({{"exclusive", exclusive}, {"reverse", reverse}})});
  };
  each(random_f32({3, 4, 5}, 95, -4, 4, false));
  each(random_f32({600, 70}, 96, -4, 4, false));
  each(random_int<int64_t>({2, 300, 3}, 97));
  each(random_int<int32_t>({7, 9}, 98));
  each(random_f32({0, 5}, 99));
  Tensor d = Tensor::empty(DType::kF64, {4, 33});
  for (int64_t i = 0; i < d.numel(); ++i) d.data<double>()[i] = std::sin(i * 1.7) * 1e3;
  each(d);
  check({"CumSum", {random_f32({5, 6}, 100), Tensor::scalar<int32_t>(1)}});
  check({"CumSum", {random_f32({5, 6}, 100), Tensor::from_vector<int64_t>({-1}, {1})}});
}

TEST(CpuElementwise, PowFastPaths) {
  Tensor x = random_f32({3, 41}, 70);
  for (float e : {2.0f, 0.5f, 1.0f, 3.0f, -1.0f, 0.0f, 1.7f})
    check({"Pow", {x, Tensor::scalar<float>(e)}});
  check({"Pow", {x, Tensor::from_vector<float>({2.0f}, {1, 1, 1})}});
  check({"Pow", {random_f32({0}, 71), Tensor::scalar<float>(2)}});
}

TEST(CpuElementwise, Cast) {
  Tensor f = random_f32({3, 37}, 80, -3e9f, 3e9f);
  Tensor small = random_f32({3, 37}, 81, -300, 300);
  Tensor i64 =
      Tensor::from_vector<int64_t>({0, -1, 1LL << 40, (1LL << 53) + 1, -(1LL << 62), 7}, {6});
  Tensor i32 = Tensor::from_vector<int32_t>({0, -1, 1 << 30, -7, 16777217, 3}, {2, 3});
  auto to = [](DType d) { return attrs({{"to", static_cast<int64_t>(onnx_code(d))}}); };
  for (DType d : {DType::kF32, DType::kI64, DType::kI32, DType::kBool, DType::kF16, DType::kF64,
                  DType::kBF16}) {
    check({"Cast", {f}, to(d)});
    check({"Cast", {small}, to(d)});
    check({"Cast", {i64}, to(d)});
    check({"Cast", {i32}, to(d)});
    check({"Cast", {random_bool({5}, 82)}, to(d)});
    check({"Cast", {random_f32({0, 2}, 83)}, to(d)});
  }
  // From bf16 (the inputs of a bf16 graph), to every dtype above.
  Tensor bf = Tensor::empty(DType::kBF16, {3, 37});
  for (int64_t i = 0; i < bf.numel(); ++i)
    bf.data<BFloat16>()[i] = BFloat16(small.data<float>()[i]);
  for (DType d : {DType::kF32, DType::kI64, DType::kI32, DType::kBool, DType::kF16, DType::kF64})
    check({"Cast", {bf}, to(d)});
  check({"Cast", {i64}, to(DType::kU16)}, {}, false);  // other dtypes: the reference
}

// f16 <-> f32 (and bf16) on F16C's conversions, and with f16c turned off: every f16 bit pattern
// (subnormals, inf, NaN) to float and back, and floats at and next to the ties between f16
// neighbours (to nearest even), beyond 65504 and in the subnormal range, against the reference.
TEST(CpuElementwise, CastF16EveryValueWithAndWithoutF16c) {
  Tensor h = Tensor::empty(DType::kF16, {65536 + 13});
  for (int64_t i = 0; i < h.numel(); ++i) h.data<Float16>()[i].bits = static_cast<uint16_t>(i);
  std::vector<float> edge;
  for (int64_t i = 0; i < 65536; i += 7) {  // ties and their neighbours, f16 pattern i and i + 1
    const float lo = Float16::to_float(static_cast<uint16_t>(i)),
                hi = Float16::to_float(static_cast<uint16_t>(i + 1));
    if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
    edge.insert(edge.end(), {mid, std::nextafter(mid, lo), std::nextafter(mid, hi)});
  }
  for (float x : {65504.0f, 65519.0f, 65520.0f, 1e6f, -65520.0f, 5.9604645e-8f, 2.9802322e-8f,
                  2.9802326e-8f, 1e-10f, -1e-10f, 0.0f, -0.0f, INFINITY, -INFINITY, NAN})
    edge.push_back(x);
  const Tensor f = Tensor::from_vector<float>(edge, {static_cast<int64_t>(edge.size())});
  auto to = [](DType d) { return attrs({{"to", static_cast<int64_t>(onnx_code(d))}}); };
  for (bool ext : {true, false}) {
    std::optional<cpu::ExtScope> off;
    if (!ext) off.emplace(cpu::Ext::kF16c);
    check({"Cast", {h}, to(DType::kF32)});
    check({"Cast", {h}, to(DType::kBF16)});
    check({"Cast", {f}, to(DType::kF16)});
    Tensor bf = Tensor::empty(DType::kBF16, f.shape());
    for (int64_t i = 0; i < bf.numel(); ++i) bf.data<BFloat16>()[i] = BFloat16(edge[i]);
    check({"Cast", {bf}, to(DType::kF16)});
  }
}

// bf16 <-> f32 on the vectorized conversions (every ISA: integer arithmetic, no extension):
// every bf16 bit pattern (NaN, inf, subnormals) to float, and floats at and next to the ties
// between bf16 neighbours (to nearest even), against the reference's pto::BFloat16.
TEST(CpuElementwise, CastBf16EveryValue) {
  Tensor b = Tensor::empty(DType::kBF16, {65536 + 13});
  for (int64_t i = 0; i < b.numel(); ++i) b.data<BFloat16>()[i].bits = static_cast<uint16_t>(i);
  std::vector<float> edge;
  for (uint32_t i = 0; i < 65535; i += 5) {
    const float lo = std::bit_cast<float>(i << 16), hi = std::bit_cast<float>((i + 1) << 16);
    if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
    const float mid = std::bit_cast<float>((std::bit_cast<uint32_t>(lo) + 0x8000u));
    edge.insert(edge.end(), {mid, std::nextafter(mid, lo), std::nextafter(mid, hi)});
  }
  for (float x : {3.4e38f, -3.4e38f, 1e-40f, 0.0f, -0.0f, INFINITY, -INFINITY, NAN})
    edge.push_back(x);
  const Tensor f = Tensor::from_vector<float>(edge, {static_cast<int64_t>(edge.size())});
  auto to = [](DType d) { return attrs({{"to", static_cast<int64_t>(onnx_code(d))}}); };
  check({"Cast", {b}, to(DType::kF32)});
  check({"Cast", {f}, to(DType::kBF16)});
}

// ---- the epilogue, against a double-precision loop ----

double activate(cpu::Activation act, double x, double lo, double hi) {
  using cpu::Activation;
  switch (act) {
    case Activation::kNone:
      return x;
    case Activation::kRelu:
      return x > 0 ? x : 0;
    case Activation::kClip:
      return std::min(std::max(x, lo), hi);
    case Activation::kLeakyRelu:
      return x < 0 ? lo * x : x;
    case Activation::kSigmoid:
      return 1 / (1 + std::exp(-x));
    case Activation::kTanh:
      return std::tanh(x);
    case Activation::kGelu:
      return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    case Activation::kGeluTanh:
      return x / (1 + std::exp(-2 * std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::kSilu:
      return x / (1 + std::exp(-x));
    case Activation::kHardSwish:
      return x * std::min(std::max(x / 6 + 0.5, 0.0), 1.0);
  }
  return x;
}

TEST(CpuElementwise, EpilogueMatchesDoubleLoop) {
  using cpu::Activation;
  using Bias = cpu::Epilogue::Bias;
  const int64_t M = 9, N = 37, ldc = 41, ldr = 39;  // a block at (m0, n0) of a larger problem
  const int64_t m0 = 2, n0 = 3, m = 6, n = 33;
  Tensor c0 = random_f32({M, ldc}, 90, -5, 5, false), res = random_f32({M, ldr}, 91, -2, 2, false);
  Tensor row_bias = random_f32({M}, 92, -1, 1, false), col_bias = random_f32({N}, 93, -1, 1, false);
  for (Isa isa : cpu::supported_isas()) {
    cpu::IsaScope scope(isa);
    for (int a = 0; a <= static_cast<int>(Activation::kHardSwish); ++a) {
      for (Bias bias : {Bias::kNone, Bias::kPerRow, Bias::kPerCol, Bias::kScalar}) {
        for (bool with_res : {false, true}) {
          cpu::Epilogue ep;
          ep.act = static_cast<Activation>(a);
          ep.bias_kind = bias;
          ep.bias = bias == Bias::kPerCol ? col_bias.data<float>() : row_bias.data<float>();
          ep.residual = with_res ? res.data<float>() : nullptr;
          ep.ldr = ldr;
          ep.residual_scale = 0.75f;
          ep.lo = ep.act == Activation::kLeakyRelu ? 0.1f : -0.5f;
          ep.hi = 1.5f;
          Tensor c = c0.clone();
          float* block = c.data<float>() + m0 * ldc + n0;
          cpu::apply_epilogue(ep, block, ldc, m0, m, n0, n);
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t j = 0; j < ldc; ++j) {
              double before = c0.data<float>()[i * ldc + j], got = c.data<float>()[i * ldc + j];
              bool inside = i >= m0 && i < m0 + m && j >= n0 && j < n0 + n;
              if (!inside) {
                ASSERT_EQ(got, before) << "wrote outside the block at " << i << ", " << j;
                continue;
              }
              double x = before;
              int64_t gi = i, gj = j - n0 + n0;  // block (i - m0, j - n0) is problem (i, j)
              if (bias == Bias::kPerRow) x += row_bias.data<float>()[gi];
              if (bias == Bias::kPerCol) x += col_bias.data<float>()[gj];
              if (bias == Bias::kScalar) x += row_bias.data<float>()[0];
              if (with_res) x += 0.75 * res.data<float>()[gi * ldr + gj];
              double want = activate(ep.act, x, ep.lo, ep.hi);
              // The float sums round at the operands' scale: allow for that cancellation.
              double scale = std::fabs(before) + 1 + (with_res ? 2 : 0);
              ASSERT_NEAR(got, want, 8 * ulp_of(want) + 2 * ulp_of(scale))
                  << "act " << a << " bias " << static_cast<int>(bias) << " res " << with_res
                  << " at " << i << ", " << j << " " << cpu::isa_name(isa);
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace pto
