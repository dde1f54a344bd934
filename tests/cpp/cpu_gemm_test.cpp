// SGEMM (src/backend/cpu/gemm) against a double-precision loop, on every ISA this machine runs and
// on 1 and 2 threads: sizes with 0 and 1 in each dimension, odd sizes, both transposes, leading
// dimensions wider than the matrix, every epilogue, batches with broadcast operands, pre-packed B
// (also across ISAs); and the MatMul / Gemm CPU kernels against the reference interpreter.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/gemm/gemm.h"
#include "backend/cpu/isa/ceiling.h"
#include "backend/cpu/isa/isa.h"
#include "backend/cpu/kernel.h"
#include "env_guard.h"
#include "pto/device_info.h"
#include "pto/error.h"
#include "pto/executable.h"
#include "pto/parallel.h"
#include "pto/reference.h"

namespace pto::cpu {
namespace {

std::vector<float> random_vector(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(std::max<int64_t>(n, 1)));
  for (float& x : v) x = d(rng);
  return v;
}

double activate(const Epilogue& ep, double x) {
  switch (ep.act) {
    case Activation::kNone:
      return x;
    case Activation::kRelu:
      return x > 0 ? x : 0;
    case Activation::kClip:
      return std::min<double>(std::max<double>(x, ep.lo), ep.hi);
    case Activation::kLeakyRelu:
      return x < 0 ? ep.lo * x : x;
    case Activation::kSigmoid:
      return 1 / (1 + std::exp(-x));
    case Activation::kTanh:
      return std::tanh(x);
    case Activation::kGelu:
      return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case Activation::kGeluTanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::kSilu:
      return x / (1 + std::exp(-x));
    case Activation::kHardSwish:
      return x * std::min(std::max(x / 6 + 0.5, 0.0), 1.0);
  }
  return x;
}

// x to the nearest value of the products' precision, ties to even, by arithmetic rather than bits:
// bf16 keeps 8 significant bits; IEEE half 11, with subnormals below 2^-14 (a quantum of 2^-24)
// and infinity from 65520 up.
double to_precision(double x, Precision p) {
  if (p == Precision::kF32 || p == Precision::kBF16x3 || x == 0 || !std::isfinite(x)) return x;
  const int bits = p == Precision::kBF16 ? 8 : 11;
  if (p == Precision::kF16 && std::fabs(x) >= 65520) return std::copysign(INFINITY, x);
  if (p == Precision::kF16 && std::fabs(x) < std::ldexp(1.0, -14))
    return std::ldexp(std::nearbyint(std::ldexp(x, 24)), -24);
  int e = 0;
  const double m = std::frexp(x, &e);  // |m| in [0.5, 1): `bits` significant bits
  return std::ldexp(std::nearbyint(std::ldexp(m, bits)), e - bits);
}

// bf16x3's parts of an fp32 value: its bf16 head and the bf16 tail of what the head leaves.
double head_of(double x) {
  return to_precision(x, Precision::kBF16);
}
double tail_of(double x) {
  return to_precision(static_cast<float>(x) - static_cast<float>(head_of(x)), Precision::kBF16);
}

// Checks C (as sgemm left it) against the definition in double precision (with A and B rounded
// to bf16 or f16 first when g.precision says so, or split for bf16x3); the tolerance grows with
// sqrt(K) and the magnitude of the terms, except bf16x3's: fp32 accumulation only (a few 1e-8 of
// the terms' magnitude; plain bf16 products are 1e-3 of each term off, fp32 ones 1e-5).
void expect_matches(const GemmArgs& g, const std::string& what) {
  int bad = 0;
  // op(A) as M x K and op(B) as K x N in double, rounded for reduced-precision products.
  std::vector<double> am(static_cast<size_t>(g.m * g.k)), bm(static_cast<size_t>(g.k * g.n));
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t p = 0; p < g.k; ++p) {
      const double a = g.trans_a ? g.a[p * g.lda + i] : g.a[i * g.lda + p];
      am[i * g.k + p] = to_precision(a, g.precision);
    }
  for (int64_t p = 0; p < g.k; ++p)
    for (int64_t j = 0; j < g.n; ++j) {
      const double b = g.trans_b ? g.b[j * g.ldb + p] : g.b[p * g.ldb + j];
      bm[p * g.n + j] = to_precision(b, g.precision);
    }
  // bf16x3: each term the sum of three products of heads and tails.
  const bool split = g.precision == Precision::kBF16x3;
  std::vector<double> ah, al, bh, bl;
  if (split) {
    for (double x : am) ah.push_back(head_of(x)), al.push_back(tail_of(x));
    for (double x : bm) bh.push_back(head_of(x)), bl.push_back(tail_of(x));
  }
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = 0; j < g.n; ++j) {
      double s = 0, mag = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        const int64_t x = i * g.k + p, y = p * g.n + j;
        const double a = am[x], b = bm[y];
        s += split ? ah[x] * bh[y] + al[x] * bh[y] + ah[x] * bl[y] : a * b;
        mag += std::fabs(a * b);
      }
      double x = g.alpha * s;
      mag *= std::fabs(g.alpha);
      const Epilogue& ep = g.epilogue;
      double bias = 0;
      if (ep.bias_kind == Epilogue::Bias::kPerRow) bias = ep.bias[i];
      if (ep.bias_kind == Epilogue::Bias::kPerCol) bias = ep.bias[j];
      if (ep.bias_kind == Epilogue::Bias::kScalar) bias = ep.bias[0];
      x += bias;
      mag += std::fabs(bias);
      if (ep.residual) {
        const double r = ep.residual_scale * ep.residual[i * ep.ldr + j];
        x += r;
        mag += std::fabs(r);
      }
      const double want = activate(ep, x), got = g.c[i * g.ldc + j];
      const double tol =
          g.precision == Precision::kBF16x3
              ? 1e-6 * (mag + 1.0)
              : 1e-5 * std::sqrt(static_cast<double>(std::max<int64_t>(g.k, 1))) * (mag + 1.0) +
                    1e-6;
      if (!(std::fabs(got - want) <= tol) && bad++ < 3)
        ADD_FAILURE() << what << " at (" << i << ", " << j << "): got " << got << ", want " << want;
    }
}

struct Case {
  int64_t m, n, k;
};
const Case kShapes[] = {{0, 5, 3},
                        {5, 0, 3},
                        {5, 3, 0},
                        {1, 1, 1},
                        {7, 13, 5},
                        {33, 65, 17},
                        {129, 31, 257},
                        {1, 70, 600},
                        {3, 1, 70},
                        {16, 33, 8},
                        {70, 45, 450},
                        {200, 100, 40},
                        {40, 1023, 30},
                        {700, 9, 5},
                        {5, 13, 9000},   // few rows and columns, long
                                         // K: split by K on 2 threads
                        {600, 70, 300},  // every thread has rows: B packed once for all
                        {13, 20, 64},    // K whole 32-value blocks of the bf16 packing
                        {6, 17, 33}};    // one value past them

std::string isa_and_threads(Isa isa, int threads) {
  return std::string(isa_name(isa)) + ", " + std::to_string(threads) + " thread(s)";
}

// Runs `body` on every ISA and on 1 and 2 threads.
template <class F>
void for_each_config(F body) {
  for (Isa isa : supported_isas()) {
    IsaScope scope(isa);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      body(isa_and_threads(isa, threads));
    }
  }
  set_num_threads(0);
}

// An sgemm problem with operands stored at leading dimensions wider than the matrices.
struct Problem {
  std::vector<float> a, b, c;
  GemmArgs g;
  Problem(Case s, bool ta, bool tb, uint32_t seed) {
    const int64_t ar = ta ? s.k : s.m, ac = ta ? s.m : s.k;
    const int64_t br = tb ? s.n : s.k, bc = tb ? s.k : s.n;
    g.m = s.m;
    g.n = s.n;
    g.k = s.k;
    g.lda = ac + 3;
    g.ldb = bc + 1;
    g.ldc = s.n + 2;
    a = random_vector(ar * g.lda, seed);
    b = random_vector(br * g.ldb, seed + 1);
    c.assign(static_cast<size_t>(std::max<int64_t>(s.m * g.ldc, 1)), NAN);
    g.a = a.data();
    g.b = b.data();
    g.c = c.data();
    g.trans_a = ta;
    g.trans_b = tb;
  }
};

TEST(CpuGemm, MatchesDoubleLoopForEveryShapeAndTranspose) {
  for_each_config([](const std::string& cfg) {
    for (const Case& s : kShapes)
      for (int t = 0; t < 4; ++t) {
        Problem p(s, t & 1, t & 2, static_cast<uint32_t>(s.m * 31 + s.n * 7 + s.k + t));
        p.g.alpha = t == 3 ? -0.5f : 1.0f;
        sgemm(p.g);
        expect_matches(p.g, cfg + ", " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                                std::to_string(s.k) + " transA " + std::to_string(t & 1) +
                                " transB " + std::to_string((t >> 1) & 1));
      }
  });
}

// The ways a product in `precision` runs on this machine, as the extensions each turns off: all
// on; for bf16 AMX off (VDPBF16PS for every shape) where the CPU has it; and the extension of
// the precision off (the fp32 kernels on rounded values for bf16, scalar rounding for f16).
std::vector<std::vector<Ext>> ways_to_run(Precision precision) {
  std::vector<std::vector<Ext>> ways = {{}};
  const bool bf16 = precision == Precision::kBF16 || precision == Precision::kBF16x3;
  if (bf16 && has_ext(Ext::kAmxBf16)) ways.push_back({Ext::kAmxBf16});
  ways.push_back({bf16 ? Ext::kAvx512Bf16 : Ext::kF16c});
  return ways;
}

// The extensions `off` turned off while alive.
struct ExtsOff {
  std::vector<std::unique_ptr<ExtScope>> scopes;
  explicit ExtsOff(const std::vector<Ext>& off) {
    for (Ext e : off) scopes.push_back(std::make_unique<ExtScope>(e));
  }
  static std::string name(const std::vector<Ext>& off) {
    std::string s;
    for (Ext e : off) s += cat(" without ", ext_name(e));
    return s;
  }
};

// Reduced-precision products: every shape and transpose, on every ISA, 1 and 2 threads, in each
// of ways_to_run(precision) (AMX tiles, VDPBF16PS or the fp32 kernels on rounded values for
// bf16; F16C or scalar rounding for f16), against the double loop on rounded operands; and the
// result is not the fp32 one (the rounding happened).
void expect_rounded_products(Precision precision) {
  for (const std::vector<Ext>& way : ways_to_run(precision)) {
    const ExtsOff off(way);
    const bool ext = way.empty() || way[0] == Ext::kAmxBf16;
    for_each_config([&](const std::string& cfg) {
      if (!ext && active_isa() == Isa::kGeneric) return;  // it never has them
      for (const Case& s : kShapes)
        for (int t = 0; t < 4; ++t) {
          Problem p(s, t & 1, t & 2, static_cast<uint32_t>(s.m * 31 + s.n * 7 + s.k + t));
          p.g.alpha = t == 3 ? -0.5f : 1.0f;
          p.g.precision = precision;
          const float bias = 0.25f;
          if (t == 2) {  // an epilogue on the bf16 accumulators
            p.g.epilogue.bias_kind = Epilogue::Bias::kScalar;
            p.g.epilogue.bias = &bias;
            p.g.epilogue.act = Activation::kRelu;
          }
          sgemm(p.g);
          const std::string what =
              cat(cfg, ", ", precision_name(precision), ExtsOff::name(way), ", ",
                  plan_gemm(p.g).str(), ", ", s.m, "x", s.n, "x", s.k, " t", t);
          expect_matches(p.g, what);
          if (s.m * s.n * s.k >= 1000 && t == 0) {  // and it differs from fp32 (bf16) products
            std::vector<float> bf = p.c;
            const bool split = precision == Precision::kBF16x3;
            p.g.precision = split ? Precision::kBF16 : Precision::kF32;
            sgemm(p.g);
            double diff = 0;
            for (int64_t i = 0; i < s.m * p.g.ldc; ++i)
              if (std::isfinite(p.c[i])) diff = std::max<double>(diff, std::fabs(p.c[i] - bf[i]));
            EXPECT_GT(diff, precision == Precision::kF16 ? 1e-6 : 1e-4) << what;
          }
        }
    });
  }
}

TEST(CpuGemmBf16, MatchesRoundedDoubleLoopWithAndWithoutAmxAndVdpbf16ps) {
  expect_rounded_products(Precision::kBF16);
}

TEST(CpuGemmF16, MatchesRoundedDoubleLoopWithAndWithoutF16c) {
  expect_rounded_products(Precision::kF16);
}

// A bf16x3 product of row-major A, B and C of shape s, packed tightly.
GemmArgs split_args(const Case& s, const float* a, const float* b, float* c) {
  GemmArgs g;
  g.m = s.m, g.n = s.n, g.k = s.k;
  g.a = a, g.lda = s.k;
  g.b = b, g.ldb = s.n;
  g.c = c, g.ldc = s.n;
  g.precision = Precision::kBF16x3;
  return g;
}

TEST(CpuGemmBf16x3, MatchesTheSplitProductsWithAndWithoutAmxAndVdpbf16ps) {
  expect_rounded_products(Precision::kBF16x3);
}

// bf16x3 keeps 16 significant bits of each operand, no more: with every a = 1 + 2^-9 + 2^-20
// (head 1, tail 2^-9, the 2^-20 past the tail) and b = 1 + 2^-10 + 2^-21 (head 1, tail 2^-10),
// each term is 1 + 2^-9 + 2^-10 exactly, where fp32 products give 1 + 2^-9 + 2^-10 + 2^-19 + ...
// and bf16 ones 1; a part multiplied twice or left out gives another value. On AMX tiles (16 rows
// and more), VDPBF16PS and the fp32 kernels on rounded values, every ISA, B packed or not.
TEST(CpuGemmBf16x3, KeepsSixteenBitsOfEachOperand) {
  const float a_value = 1.0f + std::ldexp(1.0f, -9) + std::ldexp(1.0f, -20);
  const float b_value = 1.0f + std::ldexp(1.0f, -10) + std::ldexp(1.0f, -21);
  for (const std::vector<Ext>& way : ways_to_run(Precision::kBF16x3)) {
    const ExtsOff off(way);
    for_each_config([&](const std::string& cfg) {
      for (const Case& s : {Case{1, 3, 5}, Case{32, 40, 7}, Case{17, 64, 40}})
        for (bool packed : {false, true}) {
          std::vector<float> a(static_cast<size_t>(s.m * s.k), a_value);
          std::vector<float> b(static_cast<size_t>(s.k * s.n), b_value), c(s.m * s.n, NAN);
          GemmArgs g = split_args(s, a.data(), b.data(), c.data());
          if (packed)
            sgemm_packed(g, pack_b(s.k, s.n, b.data(), s.n, false, Precision::kBF16x3));
          else
            sgemm(g);
          const float want =
              static_cast<float>(s.k * (1.0 + std::ldexp(1.0, -9) + std::ldexp(1.0, -10)));
          int bad = 0;
          for (float x : c)
            if (x != want && bad++ < 2)
              ADD_FAILURE() << cfg << ExtsOff::name(way) << ", " << s.m << "x" << s.n << "x" << s.k
                            << (packed ? " packed" : "") << ": got " << x << ", want " << want
                            << " (" << plan_gemm(g, 1, packed).str() << ")";
        }
    });
  }
}

// Half-precision storage (GemmArgs::a_half, c_half): A read from bf16 / f16 bits and C stored
// rounded give exactly the float path's results on the same values (A rounded in floats, C
// rounded afterwards), which match the double loop; with K in several slices, transposed A, an
// epilogue, a batch, every ISA and 1 and 2 threads, VDPBF16PS / F16C on and off.
TEST(CpuGemmHalf, HalfStoredAAndCMatchTheFloatPath) {
  const Case shapes[] = {{1, 70, 600}, {33, 65, 17}, {129, 31, 2100}, {200, 100, 40}, {7, 13, 5}};
  for (Precision precision : {Precision::kBF16, Precision::kF16})
    for (bool ext : {true, false}) {
      std::optional<ExtScope> off;
      if (!ext) off.emplace(precision == Precision::kBF16 ? Ext::kAvx512Bf16 : Ext::kF16c);
      for_each_config([&](const std::string& cfg) {
        for (const Case& s : shapes)
          for (int t = 0; t < 3; ++t) {
            const int64_t batch = t == 2 ? 3 : 1;
            Problem p(s, t == 1, false, static_cast<uint32_t>(s.m + s.n + s.k + t));
            const int64_t a_len = (t == 1 ? s.k : s.m) * p.g.lda, c_len = s.m * p.g.ldc;
            p.a = random_vector(batch * a_len, 7 + t);
            p.c.assign(static_cast<size_t>(batch * c_len), 0.0f);
            p.g.a = p.a.data();
            p.g.c = p.c.data();
            p.g.precision = precision;
            const float bias = 0.125f;
            p.g.epilogue.bias_kind = Epilogue::Bias::kScalar;
            p.g.epilogue.bias = &bias;
            p.g.epilogue.act = Activation::kGelu;
            round_to_precision(precision, p.a.data(), static_cast<int64_t>(p.a.size()));
            std::vector<uint16_t> a16(p.a.size()), want(p.c.size()), got(p.c.size(), 0);
            const bool bf = precision == Precision::kBF16;
            bf ? f32_to_bf16(p.a.data(), a16.data(), static_cast<int64_t>(a16.size()))
               : f32_to_f16(p.a.data(), a16.data(), static_cast<int64_t>(a16.size()));
            sgemm_batched(p.g, batch, a_len, 0, c_len, 0);
            const std::string what =
                cat(cfg, ", ", precision_name(precision), ext ? "" : " (ext off)", ", ", s.m, "x",
                    s.n, "x", s.k, " t", t);
            expect_matches(p.g, what);  // item 0 against the double loop
            bf ? f32_to_bf16(p.c.data(), want.data(), static_cast<int64_t>(want.size()))
               : f32_to_f16(p.c.data(), want.data(), static_cast<int64_t>(want.size()));
            GemmArgs h = p.g;
            std::vector<float> scratch(p.c.size(), NAN);
            h.a = nullptr;
            h.a_half = a16.data();
            h.a_half_type = precision;
            h.c = scratch.data();
            h.c_half = got.data();
            h.c_half_type = precision;
            sgemm_batched(h, batch, a_len, 0, c_len, 0);
            int bad = 0;
            for (int64_t b = 0; b < batch; ++b)
              for (int64_t i = 0; i < s.m; ++i)
                for (int64_t j = 0; j < s.n; ++j) {
                  const size_t at = static_cast<size_t>(b * c_len + i * p.g.ldc + j);
                  if (got[at] != want[at] && bad++ < 3)
                    ADD_FAILURE() << what << ": item " << b << " (" << i << ", " << j << ") is 0x"
                                  << std::hex << got[at] << ", want 0x" << want[at] << std::dec;
                }
          }
      });
    }
}

// An epilogue whose result is rounded to bf16 or f16 right after (Epilogue::half_store, which
// apply_fused sets from the fused group's store) takes GELU's rational erf on every ISA: error
// below 1e-6 max(1, |x|) absolute (relative for x >= 0) against the double GELU, the special
// values right, and after rounding to bf16 the same value as the exact GELU's in all but about
// 0.05% of the elements from x = -3 on (one bf16 ulp off there). Without the flag, the accurate one
// (7 ulp) still runs: its error in the negative tail, where the rational erf is only absolute,
// stays relative.
TEST(CpuGemmHalf, GeluBeforeAHalfStoreTakesTheRationalErf) {
  std::vector<float> x;
  for (int i = -200000; i <= 200000; ++i) x.push_back(static_cast<float>(i) * 5e-5f);  // +-10
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  const size_t random_from = x.size();
  for (int i = 0; i < 100000; ++i) x.push_back(normal(rng));
  const float specials[] = {0.0f,     -0.0f,   1e-30f,   -1e-30f,   1e-40f, -1e-40f,
                            6.0f,     -6.0f,   -100.0f,  100.0f,    -1e30f, 1e30f,
                            -FLT_MAX, FLT_MAX, INFINITY, -INFINITY, NAN};
  const size_t specials_from = x.size();
  x.insert(x.end(), std::begin(specials), std::end(specials));
  const auto n = static_cast<int64_t>(x.size());
  auto truth = [](double v) { return 0.5 * v * std::erfc(-v / std::sqrt(2.0)); };
  for (Isa isa : supported_isas()) {
    IsaScope scope(isa);
    Epilogue ep;
    ep.act = Activation::kGelu;
    ep.half_store = true;
    std::vector<float> y = x;
    apply_epilogue(ep, y.data(), n, 0, 1, 0, n);
    double worst_abs = 0, worst_rel = 0;
    for (size_t i = 0; i < specials_from; ++i) {
      const double t = truth(x[i]), err = std::fabs(y[i] - t);
      worst_abs = std::max(worst_abs, err / std::max(1.0, std::fabs(double{x[i]})));
      if (x[i] > 0) worst_rel = std::max(worst_rel, err / t);
    }
    EXPECT_LT(worst_abs, 1e-6) << isa_name(isa);
    EXPECT_LT(worst_rel, 1e-6) << isa_name(isa);
    std::printf("[gelu half store] %s: max abs err %.3g max(1, |x|), x >= 0 relative %.3g\n",
                isa_name(isa), worst_abs, worst_rel);
    // Rounded to bf16 as c_half is: against the exact GELU's bf16, on the N(0, 1.5) values.
    std::vector<float> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = static_cast<float>(truth(x[i]));
    std::vector<uint16_t> yb(x.size()), wb(x.size());
    f32_to_bf16(y.data(), yb.data(), n);
    f32_to_bf16(want.data(), wb.data(), n);
    // From x = -3 on (|GELU| >= 4e-3) at most one bf16 ulp apart; below, where GELU is x Phi(x)
    // with Phi tiny, the absolute bound above is the contract (PyTorch's own vectorized erf is
    // absolute there too).
    int differ = 0, tail = 0;
    for (size_t i = random_from; i < specials_from; ++i) {
      if (yb[i] == wb[i]) continue;
      ++(x[i] < -3.0f ? tail : differ);
      if (x[i] >= -3.0f) {
        EXPECT_EQ(std::abs(int{yb[i]} - int{wb[i]}), 1) << "x = " << x[i] << " " << isa_name(isa);
      }
    }
    EXPECT_LE(differ, 100) << isa_name(isa);  // of 100000 (52 measured)
    std::printf(
        "[gelu half store] %s: bf16 results not the exact GELU's: %d of 10^5 from x = -3 on "
        "(one ulp each), %d below\n",
        isa_name(isa), differ, tail);
    const float* sy = y.data() + specials_from;
    for (size_t i = 0; i < 6; ++i)  // +-0 and tiny values: x / 2 to within the error bound
      EXPECT_NEAR(sy[i], specials[i] * 0.5f, 1e-6) << specials[i] << " " << isa_name(isa);
    EXPECT_NEAR(sy[6], 6.0f, 1e-5);
    EXPECT_NEAR(sy[7], 0.0f, 1e-5);
    for (size_t i = 8; i <= 13; i += 2) {  // the negative tail is -0, the positive x
      EXPECT_EQ(sy[i], 0.0f) << specials[i];
      EXPECT_TRUE(std::signbit(sy[i])) << specials[i];
      EXPECT_EQ(sy[i + 1], specials[i + 1]);
    }
    EXPECT_EQ(sy[14], INFINITY);
    EXPECT_TRUE(std::isnan(sy[15]));  // -inf times 0, as the accurate GELU and x Phi(x) give
    EXPECT_TRUE(std::isnan(sy[16]));
    // Without the flag: the accurate GELU, relative in the tail where the rational one is not.
    ep.half_store = false;
    std::vector<float> acc = x;
    apply_epilogue(ep, acc.data(), n, 0, 1, 0, n);
    double tail_fast = 0, tail_accurate = 0;
    for (size_t i = 0; i < random_from; ++i)
      if (x[i] > -5.0f && x[i] < -3.0f) {
        const double t = truth(x[i]);
        tail_fast = std::max(tail_fast, std::fabs(y[i] - t) / std::fabs(t));
        tail_accurate = std::max(tail_accurate, std::fabs(acc[i] - t) / std::fabs(t));
      }
    EXPECT_LT(tail_accurate, 1e-6) << isa_name(isa);
    EXPECT_GT(tail_fast, 1e-4) << isa_name(isa);
  }
  // The fused group's store sets the flag.
  FusedEpilogue f;
  f.act = Activation::kGelu;
  for (DType store : {DType::kF32, DType::kBF16, DType::kF16}) {
    f.store = store;
    Epilogue ep;
    apply_fused(f, Tensor::empty(DType::kF32, {2, 3}), 3, "test", ep);
    EXPECT_EQ(ep.half_store, store != DType::kF32) << dtype_name(store);
  }
  // PTO_GELU_HALF=0 turns it off; anything but 0 or 1 is refused.
  f.store = DType::kBF16;
  for (const char* value : {"0", "1", "yes"}) {
    pto::testing::EnvGuard env("PTO_GELU_HALF", value);
    Epilogue ep;
    const Tensor y = Tensor::empty(DType::kF32, {2, 3});
    if (std::string(value) == "yes") {
      EXPECT_THROW(apply_fused(f, y, 3, "test", ep), ValueError);
    } else {
      apply_fused(f, y, 3, "test", ep);
      EXPECT_EQ(ep.half_store, std::string(value) == "1");
    }
  }
}

// Operands beyond fp16's range become inf, below it subnormal or zero, ties go to even: C to
// a few ulp of the double loop on operands rounded by to_precision, F16C on and off.
TEST(CpuGemmF16, RoundsLikeIeeeHalfAtTheEdges) {
  for (bool ext : {true, false}) {
    std::optional<ExtScope> off;
    if (!ext) off.emplace(Ext::kF16c);
    const int64_t m = 3, n = 37, k = 19;
    std::vector<float> a(m * k), b(k * n), c(m * n);
    for (int64_t i = 0; i < m * k; ++i)  // ties between fp16 neighbours: 1 + (2j + 1) 2^-11
      a[i] = 1.0f + std::ldexp(static_cast<float>(2 * (i % 5) + 1), -11);
    for (int64_t i = 0; i < k * n; ++i)  // 2^-27 .. 2^-12: subnormal and tiny in fp16
      b[i] = std::ldexp(1.0f + 0.1f * static_cast<float>(i % 7), -27 + static_cast<int>(i % 16));
    a[0] = 70000.0f;  // inf in fp16: row 0 of C is inf
    GemmArgs g{.m = m,
               .n = n,
               .k = k,
               .a = a.data(),
               .lda = k,
               .b = b.data(),
               .ldb = n,
               .c = c.data(),
               .ldc = n,
               .precision = Precision::kF16};
    sgemm(g);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double want = 0;
        for (int64_t p = 0; p < k; ++p)
          want += to_precision(a[i * k + p], Precision::kF16) *
                  to_precision(b[p * n + j], Precision::kF16);
        const double got = c[i * n + j];
        const std::string at = cat(ext ? "f16c " : "scalar ", i, ", ", j);
        if (std::isfinite(want)) {
          EXPECT_NEAR(got, want, 4e-6 * std::fabs(want)) << at;  // positive terms: k ulp at most
        } else {
          EXPECT_EQ(std::isnan(got), std::isnan(want)) << at;
          if (!std::isnan(want)) {
            EXPECT_EQ(got, want) << at;
          }
        }
      }
  }
}

// Runs `multiply` (an sgemm_packed or sgemm_packed_a of an operand packed for bf16) where
// VDPBF16PS runs, where it is turned off and on every ISA (the pairs are unpacked), and checks
// the rounded products each time; args.precision is fp32, which the packing's overrides.
template <class F>
void expect_packed_runs_anywhere(Problem& p, const std::string& what, F multiply,
                                 Precision precision = Precision::kBF16) {
  p.g.precision = precision;  // what expect_matches checks against
  for (const std::vector<Ext>& way : ways_to_run(precision)) {
    const ExtsOff off(way);
    for (Isa run_isa : supported_isas()) {
      IsaScope scope(run_isa);
      std::fill(p.c.begin(), p.c.end(), NAN);
      GemmArgs g = p.g;
      g.precision = Precision::kF32;  // ignored: the packing's precision rules
      multiply(g);
      expect_matches(p.g, cat(what, ", run on ", isa_name(run_isa), ExtsOff::name(way)));
    }
  }
}

// B packed for bf16: half the bytes where VDPBF16PS runs; runs anywhere, always the rounded
// products.
TEST(CpuGemmBf16, PackedBHalvesTheBytesAndRunsAnywhere) {
  for (const Case& s : {Case{1, 70, 600}, Case{33, 65, 17}, Case{129, 31, 257}, Case{6, 64, 2}})
    for (bool tb : {false, true}) {
      Problem p(s, false, tb, 5);
      const PackedB packed = pack_b(s.k, s.n, p.g.b, p.g.ldb, tb, Precision::kBF16);
      const PackedB f32 = pack_b(s.k, s.n, p.g.b, p.g.ldb, tb);
      EXPECT_EQ(packed.precision(), Precision::kBF16);
      if (has_ext(Ext::kAvx512Bf16)) {
        EXPECT_EQ(packed.k_per_step(), 2);
        EXPECT_LE(packed.bytes(), f32.bytes() * ((s.k + 1) / 2) / s.k + 128);
      }
      expect_packed_runs_anywhere(p, tb ? "packed B bf16 transB" : "packed B bf16",
                                  [&](const GemmArgs& g) { sgemm_packed(g, packed); });
      // Packed where VDPBF16PS does not run (another CPU, AVX2): bf16 halves in K order, widened
      // in registers, half the bytes too.
      for (Isa isa : supported_isas()) {
        if (isa == Isa::kGeneric) continue;
        IsaScope scope(isa);
        ExtScope no_pairs(Ext::kAvx512Bf16);
        const PackedB halves = pack_b(s.k, s.n, p.g.b, p.g.ldb, tb, Precision::kBF16);
        EXPECT_EQ(halves.half_panels(), Precision::kBF16);
        EXPECT_EQ(halves.k_per_step(), 1);
        EXPECT_LE(halves.bytes(), pack_b(s.k, s.n, p.g.b, p.g.ldb, tb).bytes() / 2 + 64);
        expect_packed_runs_anywhere(p, cat("bf16 halves packed on ", isa_name(isa)),
                                    [&](const GemmArgs& g) { sgemm_packed(g, halves); });
      }
    }
}

// B packed for f16 products: IEEE half panels (half the bytes) where the CPU has F16C, widened
// in the micro-kernel; runs anywhere (unpacked where F16C is off or on another ISA), always the
// products of operands rounded to half.
TEST(CpuGemmF16, PackedBHalvesTheBytesAndRunsAnywhere) {
  for (const Case& s : {Case{1, 70, 600}, Case{33, 65, 17}, Case{129, 31, 257}, Case{6, 64, 2},
                        Case{200, 130, 1100}})
    for (bool tb : {false, true}) {
      Problem p(s, false, tb, 6);
      const PackedB packed = pack_b(s.k, s.n, p.g.b, p.g.ldb, tb, Precision::kF16);
      const PackedB f32 = pack_b(s.k, s.n, p.g.b, p.g.ldb, tb);
      EXPECT_EQ(packed.precision(), Precision::kF16);
      EXPECT_EQ(packed.half_panels() == Precision::kF16,
                active_isa() != Isa::kGeneric && has_ext(Ext::kF16c));
      if (packed.half_panels() == Precision::kF16) {
        EXPECT_LE(packed.bytes(), f32.bytes() / 2 + 64);
      }
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        expect_packed_runs_anywhere(
            p, cat(tb ? "packed B f16 transB" : "packed B f16", " x", threads),
            [&](const GemmArgs& g) { sgemm_packed(g, packed); }, Precision::kF16);
      }
      set_num_threads(0);
    }
}

// A packed for bf16 (a conv's weights): pairs where VDPBF16PS runs, with tails in M and K and a
// transposed A; runs anywhere, on one thread and two (256 rows: the threads pack B together and
// split the rows, run_shared_b with A packed ahead).
TEST(CpuGemmBf16, PackedARunsAnywhere) {
  for (const Case& s : {Case{1, 70, 600}, Case{33, 65, 17}, Case{129, 31, 257}, Case{13, 40, 64},
                        Case{7, 20, 33}, Case{256, 100, 150}})
    for (bool ta : {false, true}) {
      Problem p(s, ta, false, 9);
      const PackedA packed = pack_a(s.m, s.k, p.g.a, p.g.lda, ta, Precision::kBF16);
      EXPECT_EQ(packed.precision(), Precision::kBF16);
      if (has_ext(Ext::kAvx512Bf16)) {
        EXPECT_EQ(packed.k_per_step(), 2);
      }
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        expect_packed_runs_anywhere(
            p, cat(ta ? "packed A bf16 transA" : "packed A bf16", " x", threads),
            [&](const GemmArgs& g) { sgemm_packed_a(g, packed); });
      }
      set_num_threads(0);
    }
}

// B and A packed for bf16x3 hold the panels of their heads and of their tails, run anywhere
// (unpacked to head + tail and split again where the ISA or extensions differ), give back head +
// tail, and compute the split products.
TEST(CpuGemmBf16x3, PackedOperandsRunAnywhere) {
  for (const Case& s : {Case{1, 70, 600}, Case{33, 65, 17}, Case{129, 31, 257}, Case{6, 64, 2}})
    for (bool t : {false, true}) {
      Problem p(s, t, t, 11);
      const PackedB b = pack_b(s.k, s.n, p.g.b, p.g.ldb, t, Precision::kBF16x3);
      EXPECT_EQ(b.precision(), Precision::kBF16x3);
      EXPECT_EQ(b.k(), s.k);
      EXPECT_EQ(b.parts(), 2);
      const std::vector<float> back = b.unpack();  // N x K: values that split the same way
      for (int64_t j = 0; j < s.n; ++j)
        for (int64_t q = 0; q < s.k; ++q) {
          const double x = t ? p.g.b[j * p.g.ldb + q] : p.g.b[q * p.g.ldb + j];
          const double y = back[j * s.k + q];
          ASSERT_EQ(head_of(y), head_of(x)) << j << "," << q;
          ASSERT_EQ(tail_of(y), tail_of(x)) << j << "," << q;
          ASSERT_NEAR(y, x, std::ldexp(std::fabs(x), -15)) << j << "," << q;
        }
      expect_packed_runs_anywhere(
          p, cat("packed B bf16x3", t ? " transB" : ""),
          [&](const GemmArgs& g) { sgemm_packed(g, b); }, Precision::kBF16x3);
      // Into caller memory (pack_b_into, sgemm_prepacked), heads then tails.
      std::vector<float> into(static_cast<size_t>(packed_b_floats(s.k, s.n, Precision::kBF16x3)) +
                              16);
      auto* aligned =
          reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(into.data()) + 63) / 64 * 64);
      pack_b_into(aligned, s.k, s.n, p.g.b, p.g.ldb, t, Precision::kBF16x3);
      std::fill(p.c.begin(), p.c.end(), NAN);
      GemmArgs g = p.g;
      g.precision = Precision::kBF16x3;
      sgemm_prepacked(g, aligned);
      expect_matches(g, cat("pack_b_into bf16x3", t ? " transB" : ""));
      const PackedA a = pack_a(s.m, s.k, p.g.a, p.g.lda, t, Precision::kBF16x3);
      EXPECT_EQ(a.k(), s.k);
      expect_packed_runs_anywhere(
          p, cat("packed A bf16x3", t ? " transA" : ""),
          [&](const GemmArgs& g) { sgemm_packed_a(g, a); }, Precision::kBF16x3);
    }
  // A packed ahead on two threads that pack B's heads and tails together (run_shared_b).
  {
    const Case s{256, 100, 150};
    Problem p(s, false, false, 12);
    const PackedA a = pack_a(s.m, s.k, p.g.a, p.g.lda, false, Precision::kBF16x3);
    set_num_threads(2);
    expect_packed_runs_anywhere(
        p, "packed A bf16x3 x2", [&](const GemmArgs& g) { sgemm_packed_a(g, a); },
        Precision::kBF16x3);
    set_num_threads(0);
  }
  // Batched with a broadcast A and B, each item's B split.
  for_each_config([](const std::string& cfg) {
    const Case s{20, 30, 50};
    for (int64_t stride_a : {int64_t{0}, s.m * s.k}) {
      std::vector<float> a = random_vector(3 * s.m * s.k, 1), b = random_vector(3 * s.k * s.n, 2);
      std::vector<float> c(3 * s.m * s.n, NAN);
      GemmArgs g = split_args(s, a.data(), b.data(), c.data());
      sgemm_batched(g, 3, stride_a, s.k * s.n, s.m * s.n);
      for (int64_t i = 0; i < 3; ++i) {
        GemmArgs item = g;
        item.a += i * stride_a;
        item.b += i * s.k * s.n;
        item.c += i * s.m * s.n;
        expect_matches(item, cat(cfg, ", batched bf16x3 item ", i, stride_a ? "" : " (A shared)"));
      }
    }
  });
}

// bf16 products of 16 rows or more run on AMX tiles where the CPU has AMX-BF16 (fewer rows, or
// AMX turned off: VDPBF16PS), and the plan says which. On the tiles: K in several slices (the
// "gemm.blocks" knob) with a last chunk of fewer than 16 pair steps, rows and columns that fill
// no whole tile, alpha 1 and not, a per-row bias and a residual, A transposed, and A packed ahead
// with AMX on and off and run either way: all against the double loop on rounded operands.
TEST(CpuGemmBf16, AmxTilesWhereTheCpuHasThem) {
  GemmArgs g;
  g.m = 16;
  g.n = g.k = 256;
  g.precision = Precision::kBF16;
  const bool amx = active_isa() == Isa::kAvx512 && has_ext(Ext::kAmxBf16);
  EXPECT_EQ(plan_gemm(g).amx, amx);
  EXPECT_EQ(plan_gemm(g).mr, amx ? 32 : plan_gemm(GemmArgs{.m = 16, .n = 256, .k = 256}).mr);
  if (amx) {
    EXPECT_NE(plan_gemm(g).str().find("AMX tiles"), std::string::npos) << plan_gemm(g).str();
  }
  g.m = 15;
  EXPECT_FALSE(plan_gemm(g).amx);
  g.m = 64;
  {
    ExtScope off(Ext::kAmxBf16);
    EXPECT_FALSE(plan_gemm(g).amx);
  }
  g.precision = Precision::kF32;
  EXPECT_FALSE(plan_gemm(g).amx);

  for (const Case& s : {Case{45, 77, 301}, Case{16, 16, 32}, Case{97, 130, 64}, Case{31, 33, 1}})
    for (bool ta : {false, true})
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        Problem p(s, ta, false, static_cast<uint32_t>(s.m + s.k));
        p.g.precision = Precision::kBF16;
        p.g.alpha = threads == 1 ? 1.0f : -0.5f;  // tiles stored in place, or scaled
        p.g.block_kc = 48;                        // 3 tiles of pair steps a slice
        std::vector<float> bias = random_vector(s.m, 3), residual = random_vector(s.m * s.n, 4);
        p.g.epilogue.bias_kind = Epilogue::Bias::kPerRow;
        p.g.epilogue.bias = bias.data();
        p.g.epilogue.residual = residual.data();
        p.g.epilogue.ldr = s.n;
        const std::string what = cat(s.m, "x", s.n, "x", s.k, ta ? " transA" : "", " x", threads,
                                     ", ", plan_gemm(p.g).str());
        sgemm(p.g);
        expect_matches(p.g, what);
        for (bool amx_packed : {true, false}) {
          std::optional<ExtScope> off;
          if (!amx_packed) off.emplace(Ext::kAmxBf16);
          const PackedA a = pack_a(s.m, s.k, p.g.a, p.g.lda, ta, Precision::kBF16);
          off.reset();
          EXPECT_EQ(a.chunk_steps() > 0, amx && amx_packed) << what;
          for (bool amx_run : {true, false}) {
            std::optional<ExtScope> run_off;
            if (!amx_run) run_off.emplace(Ext::kAmxBf16);
            std::fill(p.c.begin(), p.c.end(), NAN);
            sgemm_packed_a(p.g, a);
            expect_matches(p.g, cat(what, ", A packed ", amx_packed ? "with" : "without",
                                    " AMX, run ", amx_run ? "with" : "without"));
          }
        }
      }
  set_num_threads(0);
}

TEST(CpuGemm, AppliesEveryEpilogue) {
  struct Ep {
    Epilogue::Bias bias;
    bool residual;
    Activation act;
    float lo, hi;
  };
  const Ep eps[] = {{Epilogue::Bias::kPerRow, false, Activation::kNone, 0, 0},
                    {Epilogue::Bias::kPerCol, true, Activation::kRelu, 0, 0},
                    {Epilogue::Bias::kScalar, false, Activation::kClip, -0.3f, 0.4f},
                    {Epilogue::Bias::kNone, true, Activation::kLeakyRelu, 0.1f, 0},
                    {Epilogue::Bias::kPerCol, false, Activation::kSigmoid, 0, 0},
                    {Epilogue::Bias::kPerRow, true, Activation::kTanh, 0, 0},
                    {Epilogue::Bias::kPerCol, false, Activation::kGelu, 0, 0},
                    {Epilogue::Bias::kPerCol, true, Activation::kGeluTanh, 0, 0},
                    {Epilogue::Bias::kScalar, true, Activation::kSilu, 0, 0},
                    {Epilogue::Bias::kPerRow, false, Activation::kHardSwish, 0, 0}};
  // fp32, bf16 and bf16x3 products on every configuration (AMX tiles where the CPU has them:
  // with K of 128 or more the epilogue runs on each finished 32 x 32 block, so on the second
  // half of a 64-column panel too).
  for_each_config([&](const std::string& cfg) {
    for (const Case& s : {Case{33, 65, 17}, Case{70, 45, 450}, Case{1, 9, 3}})
      for (const Ep& e : eps)
        for (const Precision precision : {Precision::kF32, Precision::kBF16, Precision::kBF16x3}) {
          Problem p(s, false, true, 5);
          p.g.precision = precision;
          const std::vector<float> bias = random_vector(std::max(s.m, s.n), 9);
          const std::vector<float> res = random_vector(s.m * (s.n + 4), 10);
          p.g.alpha = 0.75f;
          p.g.epilogue.bias_kind = e.bias;
          p.g.epilogue.bias = e.bias == Epilogue::Bias::kNone ? nullptr : bias.data();
          if (e.residual) {
            p.g.epilogue.residual = res.data();
            p.g.epilogue.ldr = s.n + 4;
            p.g.epilogue.residual_scale = -1.5f;
          }
          p.g.epilogue.act = e.act;
          p.g.epilogue.lo = e.lo;
          p.g.epilogue.hi = e.hi;
          sgemm(p.g);
          expect_matches(p.g, cfg + ", activation " + std::to_string(static_cast<int>(e.act)) +
                                  ", " + std::to_string(s.m) + "x" + std::to_string(s.n) + " " +
                                  precision_name(precision));
        }
  });
}

// Blocks at most 128 columns wide read A in place (gemm.cpp, reads_a_in_place): several MC
// blocks of rows and K slices (C accumulated across them), rows past a multiple of MR, A wider
// than K, an epilogue with a residual, one column, exactly 128 and one past it (packed again);
// and the plan says which.
TEST(CpuGemm, NarrowBlocksReadAInPlace) {
  for_each_config([](const std::string& cfg) {
    for (const Case& s : {Case{260, 128, 1100}, Case{130, 129, 900}, Case{601, 16, 50},
                          Case{49, 1, 800}, Case{7, 70, 2000}})
      for (bool epilogue : {false, true}) {
        Problem p(s, false, false, static_cast<uint32_t>(s.m + s.n + s.k));
        const std::vector<float> bias = random_vector(s.n, 3);
        const std::vector<float> res = random_vector(s.m * (s.n + 5), 4);
        if (epilogue) {
          p.g.epilogue.bias_kind = Epilogue::Bias::kPerCol;
          p.g.epilogue.bias = bias.data();
          p.g.epilogue.residual = res.data();
          p.g.epilogue.ldr = s.n + 5;
          p.g.epilogue.residual_scale = 0.5f;
          p.g.epilogue.act = Activation::kSilu;
        }
        sgemm(p.g);
        expect_matches(p.g, cfg + ", " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                                std::to_string(s.k) + (epilogue ? " with epilogue" : ""));
      }
  });
  GemmArgs g;
  g.m = 3136;
  g.k = 784;
  g.n = g.ldb = 16;
  g.lda = 784;
  EXPECT_TRUE(plan_gemm(g, 1, false, 1).a_in_place);
  EXPECT_NE(plan_gemm(g, 1, false, 2).str().find("A read in place"), std::string::npos);
  g.n = g.ldb = 129;
  EXPECT_FALSE(plan_gemm(g, 1, false, 1).a_in_place);
  g.n = g.ldb = 16;
  g.trans_a = true;  // columns of A: packed
  EXPECT_FALSE(plan_gemm(g, 1, false, 1).a_in_place);
  g.trans_a = false;
  g.precision = Precision::kBF16;  // A rounded as it is packed
  EXPECT_FALSE(plan_gemm(g, 1, false, 1).a_in_place);
}

TEST(CpuGemm, BatchedBroadcastsAStrideOfZero) {
  for_each_config([](const std::string& cfg) {
    const int64_t batch = 3, m = 9, n = 21, k = 13;
    for (int which = 0; which < 3; ++which) {  // 0: all strided, 1: A shared, 2: B shared
      const std::vector<float> a = random_vector(batch * m * k, 1),
                               b = random_vector(batch * k * n, 2);
      const std::vector<float> res = random_vector(batch * m * n, 3);
      std::vector<float> c(static_cast<size_t>(batch * m * n), NAN);
      GemmArgs g;
      g.m = m;
      g.n = n;
      g.k = k;
      g.a = a.data();
      g.lda = k;
      g.b = b.data();
      g.ldb = n;
      g.c = c.data();
      g.ldc = n;
      g.epilogue.residual = res.data();
      g.epilogue.ldr = n;
      const int64_t sa = which == 1 ? 0 : m * k, sb = which == 2 ? 0 : k * n;
      sgemm_batched(g, batch, sa, sb, m * n, m * n);
      for (int64_t i = 0; i < batch; ++i) {
        GemmArgs one = g;
        one.a += i * sa;
        one.b += i * sb;
        one.c += i * m * n;
        one.epilogue.residual += i * m * n;
        expect_matches(one,
                       cfg + ", batch " + std::to_string(i) + " mode " + std::to_string(which));
      }
    }
  });
}

TEST(CpuGemm, PackedBMatchesAndCrossesIsas) {
  for_each_config([](const std::string& cfg) {
    for (const Case& s :
         {Case{1, 70, 600}, Case{33, 65, 17}, Case{129, 31, 257}, Case{4, 0, 3}, Case{4, 5, 0}})
      for (bool tb : {false, true}) {
        Problem p(s, false, tb, 3);
        const PackedB packed = pack_b(s.k, s.n, p.g.b, p.g.ldb, tb);
        for (Isa run_isa : supported_isas()) {
          IsaScope scope(run_isa);  // the ISA of the run may differ from the packing's
          std::fill(p.c.begin(), p.c.end(), NAN);
          p.g.epilogue.bias_kind = Epilogue::Bias::kScalar;
          const float one = 1.0f;
          p.g.epilogue.bias = &one;
          sgemm_packed(p.g, packed);
          expect_matches(p.g, cfg + ", packed, run on " + isa_name(run_isa));
        }
      }
  });
}

// B packed ahead (a MatMul's weight) and few rows, on 2 threads: the threads pack A once together
// and split the columns into several tasks (run_shared_a). Rows under one register block, odd
// column counts (partial panels at task edges), K across slices, a transposed A, an epilogue
// with a residual, bf16 and f16 products: the double loop's result, and the bits of one thread.
TEST(CpuGemm, PackedBFewRowsShareTheirPackedA) {
  const Case shapes[] = {
      {4, 833, 600}, {5, 70, 3000}, {13, 777, 450}, {127, 1000, 600}, {6, 200, 1100}};
  for (Isa isa : supported_isas()) {
    IsaScope scope(isa);
    int shared = 0;
    for (const Case& s : shapes)
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1;
        const Precision precision = t == 2   ? Precision::kBF16
                                    : t == 3 ? Precision::kF16
                                             : Precision::kF32;
        Problem p(s, ta, false, static_cast<uint32_t>(s.m + s.n + t));
        p.g.precision = precision;
        const std::vector<float> bias = random_vector(s.n, 7), res = random_vector(s.m * s.n, 8);
        if (ta) {
          p.g.epilogue.bias_kind = Epilogue::Bias::kPerCol;
          p.g.epilogue.bias = bias.data();
          p.g.epilogue.residual = res.data();
          p.g.epilogue.ldr = s.n;
          p.g.epilogue.act = Activation::kGelu;
        }
        const PackedB packed = pack_b(s.k, s.n, p.g.b, p.g.ldb, false, precision);
        const GemmPlan plan = plan_gemm(p.g, 1, true, 2);
        EXPECT_EQ(plan.a_shared, plan.tm == 1 && plan.tn > 1) << plan.str();
        shared += plan.a_shared;
        const std::string what =
            cat(isa_name(isa), ", ", s.m, "x", s.n, "x", s.k, " t", t, ", ", plan.str());
        set_num_threads(1);
        sgemm_packed(p.g, packed);
        const std::vector<float> one = p.c;
        set_num_threads(2);
        std::fill(p.c.begin(), p.c.end(), NAN);
        sgemm_packed(p.g, packed);
        EXPECT_EQ(std::memcmp(one.data(), p.c.data(), one.size() * 4), 0) << what;
        expect_matches(p.g, what);
      }
    EXPECT_GT(shared, 0) << isa_name(isa);
  }
  set_num_threads(0);
}

// A packed once (as Conv packs its weights), run on every ISA; 700 rows and K = 450 cross the MC
// and KC block edges of the packed panels.
TEST(CpuGemm, PackedAMatchesAndCrossesIsas) {
  for_each_config([](const std::string& cfg) {
    for (const Case& s : {Case{1, 70, 600}, Case{33, 65, 17}, Case{129, 31, 257}, Case{700, 9, 450},
                          Case{4, 0, 3}, Case{4, 5, 0}, Case{0, 5, 3}})
      for (bool ta : {false, true}) {
        Problem p(s, ta, false, 5);
        const PackedA packed = pack_a(s.m, s.k, p.g.a, p.g.lda, ta);
        for (Isa run_isa : supported_isas()) {
          IsaScope scope(run_isa);  // the ISA of the run may differ from the packing's
          std::fill(p.c.begin(), p.c.end(), NAN);
          p.g.epilogue.bias_kind = Epilogue::Bias::kPerRow;
          const std::vector<float> bias = random_vector(s.m, 9);
          p.g.epilogue.bias = bias.data();
          sgemm_packed_a(p.g, packed);
          expect_matches(p.g, cfg + ", packed A, run on " + isa_name(run_isa));
        }
      }
  });
}

// B given as a table of row offsets into one buffer (Conv's shifted rows), against the same rows
// gathered into an ordinary B; K = 450 crosses a KC slice, odd N leaves partial panels.
TEST(CpuGemm, RowTableB) {
  for_each_config([](const std::string& cfg) {
    for (const Case& s : {Case{7, 13, 5}, Case{33, 150, 450}, Case{70, 65, 17}, Case{1, 200, 9}}) {
      const std::vector<float> buf = random_vector(4 * s.n + 500, 11),
                               a = random_vector(s.m * s.k, 12);
      std::mt19937 rng(13);
      std::vector<int64_t> rows(static_cast<size_t>(s.k + kGemmRowsSlack));
      std::vector<float> gathered(static_cast<size_t>(s.k * s.n));
      for (int64_t p = 0; p < s.k; ++p) {
        rows[p] = static_cast<int64_t>(rng() % 500);
        for (int64_t j = 0; j < s.n; ++j) gathered[p * s.n + j] = buf[rows[p] + j];
      }
      std::vector<float> c(static_cast<size_t>(s.m * s.n), NAN);
      GemmArgs g;
      g.m = s.m;
      g.n = s.n;
      g.k = s.k;
      g.a = a.data();
      g.lda = s.k;
      g.b = buf.data();
      g.b_rows = rows.data();
      g.c = c.data();
      g.ldc = s.n;
      sgemm(g);
      g.b = gathered.data();
      g.b_rows = nullptr;
      g.ldb = s.n;
      expect_matches(g, cfg + ", row table");
    }
  });
}

// The thread count changes how the work is split (tiles, shared B panels), never the bits: every
// element sums the same K slices in the same order.
TEST(CpuGemm, SameBitsOnOneAndTwoThreads) {
  const Case shapes[] = {{5, 13, 9000},    {6, 60, 2000},  {600, 70, 300},
                         {1030, 200, 700}, {64, 196, 384}, {36, 100, 500}};
  for (const Case& s : shapes)
    for (bool tb : {false, true}) {
      Problem p(s, false, tb, 11);
      p.g.epilogue.act = Activation::kRelu;
      set_num_threads(1);
      sgemm(p.g);
      const std::vector<float> one = p.c;
      set_num_threads(2);
      sgemm(p.g);
      EXPECT_EQ(std::memcmp(one.data(), p.c.data(), one.size() * 4), 0)
          << s.m << "x" << s.n << "x" << s.k << " transB " << tb;
      expect_matches(p.g, "2 threads");
    }
  set_num_threads(0);
}

// The plan says how a call is split: one thread runs one task; on two, a large GEMM that packs B
// packs it once for both (rows split), a small one splits the columns, and a packed-ahead B is
// never packed again. Its block sizes come from the cache model.
TEST(CpuGemm, PlanFollowsShapeAndThreads) {
  GemmArgs g;
  g.m = g.k = g.n = 1024;
  g.ldb = 1024;  // rows 4 KiB apart: packed
  GemmPlan p = plan_gemm(g, 1, false, 1);
  EXPECT_EQ(p.tm * p.tn, 1);
  EXPECT_EQ(p.b, GemmPlan::B::kPackedPerTask);
  EXPECT_EQ(p.k_slices * p.kc, 1024);
  EXPECT_LE(p.mc * p.kc * 4, static_cast<int64_t>(cache_model().l2));
  p = plan_gemm(g, 1, false, 2);
  EXPECT_EQ(p.b, GemmPlan::B::kPackedShared) << p.str();
  EXPECT_EQ(plan_gemm(g, 1, true, 2).b, GemmPlan::B::kPackedAhead);
  g.m = 1;
  g.n = 768;
  g.k = 768;
  g.ldb = 770;
  p = plan_gemm(g, 1, false, 2);
  EXPECT_EQ(p.tm, 1);
  EXPECT_EQ(p.tn, 2) << p.str();
  EXPECT_EQ(p.b, GemmPlan::B::kInPlace);
  EXPECT_NE(p.str().find("2 task(s)"), std::string::npos) << p.str();
  // Columns split in vectors where B is not packed ahead (a partial panel costs the vectors it
  // holds), in whole panels where it is (its panels start at multiples of NR).
  g.m = 64;
  g.n = 196;
  g.k = 384;
  g.ldb = 196;
  p = plan_gemm(g, 1, false, 2);
  EXPECT_EQ(p.col_unit, std::min<int64_t>(p.nr, 16)) << p.str();
  EXPECT_EQ(plan_gemm(g, 1, true, 2).col_unit, p.nr);
}

TEST(CpuGemm, SameBitsOnEveryRun) {
  Problem p({130, 90, 500}, false, false, 4);
  sgemm(p.g);
  const std::vector<float> first = p.c;
  for (int r = 0; r < 3; ++r) {
    sgemm(p.g);
    EXPECT_EQ(std::memcmp(first.data(), p.c.data(), first.size() * 4), 0);
  }
}

// One MatMul or Gemm node; the inputs listed in `constant` become initializers. Runs it compiled
// (level 0: op by op on the CPU kernels) and on the reference interpreter, and checks that the
// CPU kernel ran and the results agree.
void expect_node_matches(const std::string& op, const std::vector<Dims>& shapes,
                         const Attributes& attrs, const std::vector<bool>& constant,
                         const std::string& what) {
  Graph g;
  std::vector<ValueId> ins;
  std::vector<Tensor> feeds;
  for (size_t i = 0; i < shapes.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : shapes[i]) n *= d;
    std::vector<float> values = random_vector(n, static_cast<uint32_t>(i + 7));
    values.resize(static_cast<size_t>(n));
    const Tensor t = Tensor::from_vector<float>(values, shapes[i]);
    if (i < constant.size() && constant[i]) {
      ins.push_back(g.add_value(cat("c", i)));
      g.set_initializer(ins.back(), t);
    } else {
      ins.push_back(g.add_input(cat("x", i), {DType::kF32, to_shape(shapes[i])}));
      feeds.push_back(t);
    }
  }
  ValueId y = g.add_value("y");
  g.add_node(op, ins, {y}, attrs, "node");
  g.add_output(y);
  Executable exe = compile(g, {.level = 0});
  EXPECT_EQ(exe.node_backend(0), "cpu") << what;
  const Tensor got = exe.run(feeds)[0], want = reference::run(g, feeds)[0];
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const int64_t k = shapes[0].empty() ? 1 : shapes[0].back();
  int bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = got.item_as_double(i), b = want.item_as_double(i);
    if (!(std::fabs(a - b) <= 1e-5 * std::sqrt(static_cast<double>(k)) * (std::fabs(b) + 4.0)) &&
        bad++ < 3)
      ADD_FAILURE() << what << " element " << i << ": got " << a << ", want " << b;
  }
}

TEST(CpuGemmKernels, MatMulMatchesTheReference) {
  const std::vector<std::vector<Dims>> cases = {
      {{7, 13}, {13, 5}},       {{13}, {13, 5}},
      {{7, 13}, {13}},          {{13}, {13}},
      {{2, 3, 7, 13}, {13, 5}}, {{2, 1, 7, 13}, {3, 13, 5}},
      {{3, 7, 13}, {3, 13, 5}}, {{7, 13}, {4, 13, 5}},
      {{1, 33, 65}, {65, 17}},  {{0, 4, 3}, {3, 2}},
      {{4, 0}, {0, 3}},         {{2, 1, 4, 6}, {1, 5, 6, 3}}};
  for_each_config([&](const std::string& cfg) {
    for (const auto& shapes : cases)
      for (bool constant_b : {false, true})
        expect_node_matches("MatMul", shapes, {}, {false, constant_b},
                            cfg + ", MatMul " + dims_str(shapes[0]) + " x " + dims_str(shapes[1]) +
                                (constant_b ? " (constant B)" : ""));
  });
}

TEST(CpuGemmKernels, GemmMatchesTheReference) {
  const int64_t M = 9, K = 17, N = 11;
  const std::vector<Dims> cs = {{}, {N}, {1, N}, {M, 1}, {M, N}, {1}, {1, 1}};
  for_each_config([&](const std::string& cfg) {
    for (int t = 0; t < 4; ++t)
      for (size_t ci = 0; ci <= cs.size(); ++ci)
        for (bool constant_b : {false, true}) {
          const bool ta = t & 1, tb = t & 2;
          std::vector<Dims> shapes = {ta ? Dims{K, M} : Dims{M, K}, tb ? Dims{N, K} : Dims{K, N}};
          if (ci < cs.size()) shapes.push_back(cs[ci]);
          Attributes attrs;
          attrs.set("transA", int64_t{ta});
          attrs.set("transB", int64_t{tb});
          attrs.set("alpha", 0.5);
          attrs.set("beta", -2.0);
          expect_node_matches("Gemm", shapes, attrs, {false, constant_b},
                              cfg + ", Gemm trans " + std::to_string(t) + " C " +
                                  (ci < cs.size() ? dims_str(cs[ci]) : "none") +
                                  (constant_b ? " (constant B)" : ""));
        }
  });
}

// precision="bf16" or "f16" (AutoMixedPrecision), or "bf16x3" (MatMulPrecision), on the CPU
// kernels, with `ext` (VDPBF16PS, F16C, AMX-BF16) on and off, against the reference interpreter,
// which rounds (splits) the operands itself; and the reference's rounding changes the result.
void expect_precision_matches_reference(const std::string& precision, Ext ext_used) {
  Attributes reduced;
  reduced.set("precision", precision);
  Attributes gemm = reduced;
  gemm.set("transB", int64_t{1});
  gemm.set("alpha", 0.5);
  for (bool ext : {true, false}) {
    std::optional<ExtScope> off;
    if (!ext) off.emplace(ext_used);
    for_each_config([&](const std::string& cfg) {
      for (const auto& shapes : std::vector<std::vector<Dims>>{
               {{7, 13}, {13, 5}}, {{2, 3, 7, 33}, {33, 70}}, {{1, 33, 65}, {65, 17}}})
        for (bool constant_b : {false, true})
          expect_node_matches("MatMul", shapes, reduced, {false, constant_b},
                              cat(cfg, ", ", precision, " MatMul ", dims_str(shapes[0]),
                                  ext ? "" : cat(" without ", ext_name(ext_used)),
                                  constant_b ? " (constant B)" : ""));
      for (bool constant_b : {false, true})
        expect_node_matches("Gemm", {{9, 37}, {11, 37}, {11}}, gemm, {false, constant_b},
                            cat(cfg, ", ", precision, " Gemm", constant_b ? " (constant B)" : ""));
    });
  }
  // The reference rounds: the same MatMul without the attribute gives other values.
  Graph g;
  const ValueId a = g.add_input("a", {DType::kF32, to_shape({4, 64})});
  const ValueId b = g.add_input("b", {DType::kF32, to_shape({64, 4})});
  const ValueId y = g.add_value("y"), z = g.add_value("z");
  g.add_node("MatMul", {a, b}, {y}, reduced, "reduced");
  g.add_node("MatMul", {a, b}, {z}, {}, "f32");
  g.add_output(y);
  g.add_output(z);
  const std::vector<Tensor> feeds = {Tensor::from_vector<float>(random_vector(256, 1), {4, 64}),
                                     Tensor::from_vector<float>(random_vector(256, 2), {64, 4})};
  const std::vector<Tensor> out = reference::run(g, feeds);
  double diff = 0;
  for (int64_t i = 0; i < 16; ++i)
    diff = std::max(diff, std::fabs(out[0].item_as_double(i) - out[1].item_as_double(i)));
  EXPECT_GT(diff, precision == "bf16" ? 1e-4 : precision == "f16" ? 1e-6 : 1e-7) << precision;
  EXPECT_LT(diff, precision == "bf16" ? 0.1 : precision == "f16" ? 1e-2 : 1e-4) << precision;
}

TEST(CpuGemmKernels, Bf16PrecisionMatchesTheReference) {
  expect_precision_matches_reference("bf16", Ext::kAvx512Bf16);
}

TEST(CpuGemmKernels, F16PrecisionMatchesTheReference) {
  expect_precision_matches_reference("f16", Ext::kF16c);
}

TEST(CpuGemmKernels, Bf16x3PrecisionMatchesTheReference) {
  expect_precision_matches_reference("bf16x3", Ext::kAmxBf16);
}

TEST(CpuGemmKernels, OtherDtypesFallBackToTheReference) {
  Graph g;
  ValueId a = g.add_input("a", {DType::kF64, Shape{2, 3}});
  ValueId b = g.add_input("b", {DType::kF64, Shape{3, 2}});
  ValueId y = g.add_value("y");
  g.add_node("MatMul", {a, b}, {y}, {}, "mm");
  g.add_output(y);
  EXPECT_EQ(compile(g, {.level = 0}).node_backend(0), "reference");
}

// pto_bench's amx_stores ceiling computes what it says: every 32 x 32 block of C is the K/32
// chunks of products of pairs (0, 1) by pairs (0, 1) (the bits of 1.0f as bf16 pairs), 16 per
// chunk, stored as fp32 rows n floats apart or as bf16 rows n halves apart; nothing else is
// written.
TEST(AmxCeiling, StoresEveryBlockOfC) {
  if (!has_ext(Ext::kAmxBf16)) GTEST_SKIP() << "no AMX-BF16 on this CPU";
  constexpr int64_t m = 64, n = 96, chunks = 3;
  std::vector<float> c(m * n + 64, -1.0f);
  float* aligned = c.data() + (64 - reinterpret_cast<uintptr_t>(c.data()) % 64) % 64 / 4;
  EXPECT_EQ(avx512::tdpbf16_stores(chunks, aligned, m, n, false), 16.0f * chunks);
  for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(aligned[i], 16.0f * chunks) << i;
  std::fill(c.begin(), c.end(), -1.0f);
  avx512::tdpbf16_stores(chunks, aligned, m, n, true);
  const auto* half = reinterpret_cast<const uint16_t*>(aligned);
  for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(half[i], 0x4240) << i;  // bf16 48.0
  for (int64_t i = m * n / 2; i < m * n; ++i) ASSERT_EQ(aligned[i], -1.0f) << i;
}

}  // namespace
}  // namespace pto::cpu
