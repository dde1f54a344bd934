// Accuracy of the vector math (src/backend/cpu/isa/vmath.h) through the float32 unary loops, on
// every ISA, against double-precision std:: functions: a sweep over every 4096th float bit
// pattern of both signs (the whole range, subnormals to huge), random values where the functions
// vary, and the special values. Max errors in ulp of the double result rounded to float are
// printed and bounded; docs/backend/elementwise.md quotes them.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/isa/isa.h"

namespace pto::cpu {
namespace {

// The spacing of floats at |t|; 2^-149 among the subnormals.
double ulp_of(double t) {
  t = std::fabs(t);
  if (t < FLT_MIN) return std::ldexp(1.0, -149);
  if (t >= FLT_MAX) return std::ldexp(1.0, 104);
  int e;
  std::frexp(t, &e);
  return std::ldexp(1.0, e - 24);
}

double gelu_erf(double x) {
  return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
}
double sigmoid(double x) {
  return 1 / (1 + std::exp(-x));
}
double softplus(double x) {
  return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

struct Case {
  const char* name;
  UnaryOp op;
  std::function<double(double)> truth;
  double max_ulp;
  // Where the function is too ill-conditioned for float (an exponent of -x^2 or -x^3 scale, or a
  // product with a subnormal factor), the error is bounded relative to x instead: |err| / |x|.
  std::function<bool(double)> absolute = nullptr;
  double max_abs = 1e-12;
  double max_ulp_simd = 0;  // the bound on avx2 and avx512 where it is tighter (0: max_ulp)
};

std::vector<Case> cases() {
  return {
      // avx2 / avx512: the 2^(j/N) table reduction (vmath.h exp_reduced), 0.79 ulp measured on
      // every float; generic: the degree-6 polynomial, 1.16.
      {"exp", UnaryOp::kExp, [](double x) { return std::exp(x); }, 2, nullptr, 1e-12, 1.0},
      {"expm1", UnaryOp::kExpm1, [](double x) { return std::expm1(x); }, 3},
      {"log", UnaryOp::kLog, [](double x) { return std::log(x); }, 2},
      {"log1p", UnaryOp::kLog1p, [](double x) { return std::log1p(x); }, 3},
      {"tanh", UnaryOp::kTanh, [](double x) { return std::tanh(x); }, 3},
      {"sigmoid", UnaryOp::kSigmoid, sigmoid, 3},
      {"erf", UnaryOp::kErf, [](double x) { return std::erf(x); }, 3},
      {"gelu", UnaryOp::kGelu, gelu_erf, 7, [](double x) { return x < -6.36; }},
      {"gelu_tanh", UnaryOp::kGeluTanh,
       [](double x) {
         double u = std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x);
         return x / (1 + std::exp(-2 * u));
       },
       12, [](double x) { return x < -3; }, 1e-8},
      {"silu", UnaryOp::kSilu, [](double x) { return x * sigmoid(x); }, 4,
       [](double x) { return x < -87; }},
      {"softplus", UnaryOp::kSoftplus, softplus, 3},
      // Beyond 2^16 the scalar std::sin / std::cos of the float (the reference's own values).
      {"sin", UnaryOp::kSin, [](double x) { return std::sin(x); }, 2},
      {"cos", UnaryOp::kCos, [](double x) { return std::cos(x); }, 2},
      {"mish", UnaryOp::kMish, [](double x) { return x * std::tanh(softplus(x)); }, 5,
       [](double x) { return x < -87; }},
  };
}

std::vector<float> inputs() {
  std::vector<float> x;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4096 + 1) {  // odd step: varied low bits
    float f = std::bit_cast<float>(static_cast<uint32_t>(b));
    if (!std::isnan(f)) x.push_back(f);
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> near(-12.0f, 12.0f), unit(-1.5f, 1.5f),
      wide(-70000.0f, 70000.0f);
  for (int i = 0; i < 300000; ++i) x.push_back(i % 2 ? near(rng) : unit(rng));
  for (int i = 0; i < 100000; ++i) x.push_back(wide(rng));  // sin / cos: every quadrant, large j
  for (int k = 1; k < 40000; k += 7) {  // the floats next to multiples of pi/2, where r is tiny
    const float f = static_cast<float>(k * M_PI_2);
    x.insert(x.end(), {f, std::nextafter(f, 0.0f), std::nextafter(f, INFINITY), -f});
  }
  return x;
}

TEST(CpuVmath, MaxUlpErrorPerIsa) {
  const std::vector<float> x = inputs();
  std::vector<float> y(x.size());
  for (const Case& c : cases()) {
    std::vector<double> truth(x.size());
    for (size_t i = 0; i < x.size(); ++i) truth[i] = c.truth(x[i]);
    for (Isa isa : supported_isas()) {
      IsaScope scope(isa);
      unary_f32(c.op, {}, x.data(), y.data(), static_cast<int64_t>(x.size()));
      double worst = 0, worst_abs = 0;
      float at = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        double t = truth[i];
        if (std::isnan(t)) {
          EXPECT_TRUE(std::isnan(y[i])) << c.name << "(" << x[i] << ") " << isa_name(isa);
          continue;
        }
        double tf = static_cast<float>(t);  // overflow to inf is the correct float answer
        if (std::isinf(tf)) {
          EXPECT_EQ(y[i], tf) << c.name << "(" << x[i] << ") " << isa_name(isa);
          continue;
        }
        double err = std::fabs(y[i] - t);
        if (c.absolute && c.absolute(x[i])) {
          worst_abs = std::max(worst_abs, err / std::fabs(x[i]));
          continue;
        }
        double u = err / ulp_of(t);
        if (!(u <= worst)) {
          worst = u;
          at = x[i];
        }
      }
      std::printf("  %-10s %-8s max %.2f ulp (at %.9g)", c.name, isa_name(isa), worst, at);
      if (c.absolute) std::printf(", tail |err|/|x| %.3g", worst_abs);
      std::printf("\n");
      const double bound = c.max_ulp_simd > 0 && isa != Isa::kGeneric ? c.max_ulp_simd : c.max_ulp;
      EXPECT_LE(worst, bound) << c.name << " on " << isa_name(isa) << " at x = " << at;
      EXPECT_LE(worst_abs, c.max_abs) << c.name << " on " << isa_name(isa);
    }
  }
}

// Vectors mixing ordinary lanes (N(0, 1) and [-12, 12]) with lanes beyond +-87 (exp's normal
// range: e^-|x| subnormal or 0, e^|x| overflowing), near it and at +-20..40 (where the tanh
// forms saturate), at random positions and every offset: the functions that send such vectors
// down a held or out-of-line path must give every lane, the ordinary ones beside them too, the
// accuracy the sweep above asks of it, and Elu / Selu / Celu (expm1 on x < 0) theirs.
TEST(CpuVmath, LargeLanesMixedWithOrdinaryOnes) {
  std::mt19937 rng(23);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> near(-12.0f, 12.0f), big(87.0f, 120.0f), mid(20.0f, 40.0f),
      edge(86.0f, 89.0f), band(1.0f, 16.0f);
  std::uniform_int_distribution<int> kind(0, 9);
  std::vector<float> x;
  for (int i = 0; i < 6000; ++i) {
    const int k = kind(rng);
    const float sign = i % 2 ? -1.0f : 1.0f;
    x.push_back(k < 4   ? normal(rng)
                : k < 5 ? near(rng)
                : k < 7 ? sign * big(rng)
                : k < 8 ? sign * mid(rng)
                : k < 9 ? sign * edge(rng)
                        : sign * band(rng));
  }
  std::vector<Case> all = cases();
  const auto elu = [](double a) { return [a](double v) { return v > 0 ? v : a * std::expm1(v); }; };
  all.push_back({"elu", UnaryOp::kElu, elu(1.0), 3});
  all.push_back({"celu", UnaryOp::kCelu, elu(1.0), 3});
  const double sa = 1.67326324, sg = 1.05070098;
  all.push_back({"selu", UnaryOp::kSelu,
                 [=](double v) { return v > 0 ? sg * v : sg * sa * std::expm1(v); }, 4});
  // Swish's argument is the float product alpha x, as the kernel forms it.
  const auto ax = [](double v) { return static_cast<double>(1.702f * static_cast<float>(v)); };
  all.push_back({"swish", UnaryOp::kSwish, [=](double v) { return v * sigmoid(ax(v)); }, 4,
                 [=](double v) { return ax(v) < -87; }});
  std::vector<float> y(x.size());
  for (const Case& c : all) {
    if (c.op == UnaryOp::kSin || c.op == UnaryOp::kCos) continue;
    UnaryParams p;
    if (c.op == UnaryOp::kElu || c.op == UnaryOp::kCelu) p = {1.0f, 0.0f};
    if (c.op == UnaryOp::kSelu) p = {1.67326324f, 1.05070098f};
    if (c.op == UnaryOp::kSwish) p = {1.702f, 0.0f};
    for (Isa isa : supported_isas()) {
      IsaScope scope(isa);
      const double bound = c.max_ulp_simd > 0 && isa != Isa::kGeneric ? c.max_ulp_simd : c.max_ulp;
      for (size_t off = 0; off < 17; off += 4) {
        const int64_t n = static_cast<int64_t>(x.size() - off);
        unary_f32(c.op, p, x.data() + off, y.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          const double xi = x[off + i], t = c.truth(xi);
          if (std::isnan(t)) {  // log and log1p below 0
            EXPECT_TRUE(std::isnan(y[i])) << c.name << "(" << xi << ") " << isa_name(isa);
            continue;
          }
          const double tf = static_cast<float>(t);
          if (std::isinf(tf)) {
            EXPECT_EQ(y[i], tf) << c.name << "(" << xi << ") " << isa_name(isa);
            continue;
          }
          const double err = std::fabs(y[i] - t);
          if (c.absolute && c.absolute(xi))
            EXPECT_LE(err / std::fabs(xi), c.max_abs)
                << c.name << "(" << xi << ") " << isa_name(isa);
          else
            EXPECT_LE(err / ulp_of(t), bound) << c.name << "(" << xi << ") = " << y[i]
                                              << " against " << t << " " << isa_name(isa);
        }
      }
    }
  }
}

TEST(CpuVmath, SpecialValues) {
  const float inf = INFINITY, nan = NAN;
  struct Expect {
    UnaryOp op;
    float x, y;
  };
  const Expect table[] = {
      {UnaryOp::kExp, -inf, 0},        {UnaryOp::kExp, inf, inf},
      {UnaryOp::kExp, 0, 1},           {UnaryOp::kExp, -0.0f, 1},
      {UnaryOp::kExp, 89, inf},        {UnaryOp::kExp, -104, 0},
      {UnaryOp::kExp, nan, nan},       {UnaryOp::kLog, 0, -inf},
      {UnaryOp::kLog, -0.0f, -inf},    {UnaryOp::kLog, -1, nan},
      {UnaryOp::kLog, -inf, nan},      {UnaryOp::kLog, inf, inf},
      {UnaryOp::kLog, 1, 0},           {UnaryOp::kLog, nan, nan},
      {UnaryOp::kLog1p, -1, -inf},     {UnaryOp::kLog1p, -2, nan},
      {UnaryOp::kLog1p, inf, inf},     {UnaryOp::kLog1p, -0.0f, -0.0f},
      {UnaryOp::kExpm1, -inf, -1},     {UnaryOp::kExpm1, inf, inf},
      {UnaryOp::kExpm1, -0.0f, -0.0f}, {UnaryOp::kTanh, inf, 1},
      {UnaryOp::kTanh, -inf, -1},      {UnaryOp::kTanh, -0.0f, -0.0f},
      {UnaryOp::kTanh, nan, nan},      {UnaryOp::kErf, inf, 1},
      {UnaryOp::kErf, -inf, -1},       {UnaryOp::kErf, -0.0f, -0.0f},
      {UnaryOp::kErf, nan, nan},       {UnaryOp::kSigmoid, inf, 1},
      {UnaryOp::kSigmoid, -inf, 0},    {UnaryOp::kSigmoid, nan, nan},
      {UnaryOp::kGelu, inf, inf},      {UnaryOp::kGelu, nan, nan},
      {UnaryOp::kGeluTanh, inf, inf},  {UnaryOp::kSoftplus, inf, inf},
      {UnaryOp::kSoftplus, -inf, 0},   {UnaryOp::kSoftplus, nan, nan},
      {UnaryOp::kSilu, inf, inf},      {UnaryOp::kSilu, -inf, nan},
      {UnaryOp::kSin, 0, 0},           {UnaryOp::kSin, -0.0f, -0.0f},
      {UnaryOp::kSin, inf, nan},       {UnaryOp::kSin, -inf, nan},
      {UnaryOp::kSin, nan, nan},       {UnaryOp::kCos, 0, 1},
      {UnaryOp::kCos, -0.0f, 1},       {UnaryOp::kCos, inf, nan},
      {UnaryOp::kCos, nan, nan},       {UnaryOp::kSin, 1e-40f, 1e-40f},
      {UnaryOp::kCos, 1e-40f, 1},
  };
  for (Isa isa : supported_isas()) {
    IsaScope scope(isa);
    for (const Expect& e : table) {
      float y;
      unary_f32(e.op, {}, &e.x, &y, 1);
      if (std::isnan(e.y))
        EXPECT_TRUE(std::isnan(y)) << static_cast<int>(e.op) << "(" << e.x << ") " << isa_name(isa);
      else
        EXPECT_EQ(std::bit_cast<uint32_t>(y), std::bit_cast<uint32_t>(e.y))
            << static_cast<int>(e.op) << "(" << e.x << ") = " << y << ", expected " << e.y << " "
            << isa_name(isa);
    }
  }
}

// exp's x86 fast path takes a vector whose lanes are all in [-87 (-86.5 on avx2), 88.72] or NaN;
// any other lane sends the whole vector through the clamped path. Lanes of every kind mixed in
// the same vectors, at every offset: NaNs with any payload stay NaN (the table lookup indexes by
// a NaN's bits), the edges of both paths and of overflow, the subnormal band, and ordinary values
// next to them, each within an ulp of double exp (generic: 1.2) and the special values exact.
TEST(CpuVmath, ExpMixedLanes) {
  const float hi = 88.7228391f;
  std::vector<float> special = {std::bit_cast<float>(0x7fc00000u),
                                std::bit_cast<float>(0xffc00000u),
                                std::bit_cast<float>(0x7f800001u),
                                std::bit_cast<float>(0x7fbffff8u),
                                std::bit_cast<float>(0xfff00ff8u),
                                std::bit_cast<float>(0x7fc7fff8u),
                                INFINITY,
                                -INFINITY,
                                hi,
                                std::nextafter(hi, 0.0f),
                                std::nextafter(hi, INFINITY),
                                88.72f,
                                88.0f,
                                -86.4f,
                                -86.5f,
                                std::nextafter(-86.5f, -INFINITY),
                                -86.7f,
                                -87.0f,
                                std::nextafter(-87.0f, -INFINITY),
                                -87.5f,
                                -95.0f,
                                -103.9f,
                                -103.972084f,
                                -104.0f,
                                -FLT_MAX,
                                FLT_MAX,
                                -0.0f,
                                0.0f,
                                1e-30f,
                                -1e-30f,
                                0.5f,
                                -3.25f,
                                10.0f,
                                -10.0f};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> normal(-80.0f, 80.0f);
  std::uniform_int_distribution<size_t> pick(0, special.size() - 1);
  std::vector<float> x;
  for (int i = 0; i < 4096; ++i) x.push_back(i % 3 == 0 ? special[pick(rng)] : normal(rng));
  x.insert(x.end(), special.begin(), special.end());
  std::vector<float> y(x.size());
  for (Isa isa : supported_isas()) {
    IsaScope scope(isa);
    for (size_t off = 0; off < 17; ++off) {  // each special value at every lane of a vector
      const int64_t n = static_cast<int64_t>(x.size() - off);
      unary_f32(UnaryOp::kExp, {}, x.data() + off, y.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const float xi = x[off + i];
        const double t = std::exp(static_cast<double>(xi));
        const float tf = static_cast<float>(t);
        if (std::isnan(xi) || std::isinf(tf) || tf == 0 || std::isinf(xi)) {
          if (std::isnan(xi))
            EXPECT_TRUE(std::isnan(y[i])) << std::bit_cast<uint32_t>(xi) << " " << isa_name(isa);
          else
            EXPECT_EQ(y[i], tf) << "exp(" << xi << ") " << isa_name(isa);
          continue;
        }
        EXPECT_LE(std::fabs(y[i] - t), (isa == Isa::kGeneric ? 1.2 : 1.0) * ulp_of(t))
            << "exp(" << xi << ") " << isa_name(isa);
      }
    }
  }
}

}  // namespace
}  // namespace pto::cpu
