// Vectorized transcendental functions on simd.h's Vec, for per-ISA translation units only.
// Each is a range reduction plus a minimax polynomial (coefficients fitted for float and rounded
// to it), accurate to a few ulp over float's whole range, with IEEE special values: NaN
// propagates, overflow gives inf, underflow is gradual. Measured errors:
// docs/backend/elementwise.md and tests/cpp/cpu_vmath_test.cpp.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cpu/isa/simd.h"

namespace pto::cpu::PTO_ISA_NS {

// For the functions an elementwise loop calls once a vector: GCC otherwise leaves exp and sigmoid
// out of line, called through the shared library's PLT with their constants loaded again on every
// call (sigmoid(a) b + 1 in L2 spent 61% of its time in sigmoid and 2.6% in its PLT stub; inlined,
// it ran 1.03-1.04x on a Xeon).
#define PTO_VMATH_INLINE [[gnu::always_inline]] inline

// c[0] + c[1] x + ... + c[N-1] x^(N-1), by Horner's rule with fma.
template <int N>
inline Vec poly(Vec x, const float (&c)[N]) {
  Vec p = Vec::set1(c[N - 1]);
  for (int i = N - 2; i >= 0; --i) p = fma(p, x, Vec::set1(c[i]));
  return p;
}

#if defined(PTO_ISA_GENERIC)
// e^x on arguments where the result is a normal float or an overflow (and, with kSubnormal, on
// [-104, -87], where it is subnormal): x = n ln2 + r with |r| <= ln2/2, e^r by a degree-6
// polynomial, times 2^n (scale_pow2).
template <bool kSubnormal = false>
inline Vec exp_reduced(Vec x) {
  Vec n = round(x * Vec::set1(1.44269504088896341f));
  Vec r = fnma(n, Vec::set1(0.693359375f), x);  // ln2 split in two for an exact product
  r = fnma(n, Vec::set1(-2.12194440e-4f), r);
  Vec p = Vec::set1(1.9875691500e-4f);
  p = fma(p, r, Vec::set1(1.3981999507e-3f));
  p = fma(p, r, Vec::set1(8.3334519073e-3f));
  p = fma(p, r, Vec::set1(4.1665795894e-2f));
  p = fma(p, r, Vec::set1(1.6666665459e-1f));
  p = fma(p, r, Vec::set1(5.0000001201e-1f));
  p = fma(p, r * r, r + Vec::set1(1.0f));
  return scale_pow2(p, n);
}
inline constexpr float kExpLoNormal = -87.0f;  // e^-87 > FLT_MIN
#else
// e^x by a table of 2^(j/N), N = 16 under AVX-512, 8 under AVX2: x = (k/N) ln2 + r with
// k = round(x N / ln2), so |r| <= ln2 / 2N, and e^x = 2^floor(k/N) 2^(j/N) e^r for j = k mod N.
// The shifter trick rounds: t = x / ln2 + 1.5 2^(23 - log2 N) has 1/N as its ulp, so t - shifter
// is k/N exactly and t's low mantissa bits are k (two's complement), whose low bits index the
// table in one VPERMPS. r = x - (k/N) ln2 with ln2 in two parts, the first of 15 bits so that
// the first fnma is exact.
//
// The entries are T_j = 2^(j/N + d), rounded to float, with d (-0.00029 for N = 16, -0.0037 for
// 8) searched so that every entry is within 0.22 ulp (N = 16) or 0.035 ulp (N = 8) of its exact
// value; 2^(j/16) itself is up to 0.45 ulp off, which left sigmoid and SiLU a few tenths of an
// ulp worse than the degree-6 polynomial this replaces. d < 0 keeps T_j (1 + q) in or above
// T_j's binade (above, T's error is half as many ulps); a d > 0 table (0.19 ulp) put results
// near x = 0 a binade below T_0 > 1 and measured worse. The polynomial takes the d back:
// T_j (1 + q(r)) with q(r) ~ e^(r - d ln2) - 1, minimax on |r| <= ln2 / 2N by degree 3 (AVX-512)
// or 4 (AVX2, |r| twice as large), coefficients rounded one by one and the rest refitted; 2^-28
// relative with its roundings. Measured on every float: 0.87 ulp (AVX-512), 0.79 (AVX2), against
// 1.26 (docs/backend/elementwise.md). 11 vector instructions a vector against 15: exp over a row
// in L1 ran 1.41x (AVX-512) and 1.67x (AVX2) on Zen 4.
//
// The power of two: AVX-512's VSCALEFPS multiplies by 2^floor(k/16) directly, exact into the
// subnormals and overflowing to inf. AVX2's table holds 2 2^(j/8 + d), so on the normal range
// (kSubnormal false: x in [kExpLoNormal, 88.72], k/8 in [-125, 128]) the factor 2^(floor(k/8) - 1)
// is a normal float made from t's bits in three integer instructions; on the subnormal band,
// scale_pow2's two factors.
#if defined(PTO_ISA_AVX512)
inline constexpr float kExp2Table[16] = {
    9.997979999e-01f, 1.044062853e+00f, 1.090287447e+00f, 1.138558626e+00f,
    1.188966870e+00f, 1.241606951e+00f, 1.296577573e+00f, 1.353981972e+00f,
    1.413927913e+00f, 1.476527810e+00f, 1.541899323e+00f, 1.610165000e+00f,
    1.681453109e+00f, 1.755897403e+00f, 1.833637595e+00f, 1.914819717e+00f};
inline constexpr float kExp2Poly[] = {2.0203867462e-04f, 1.0002020597e+00f, 5.0012058020e-01f,
                                      1.6665939987e-01f};
inline constexpr float kExpLoNormal = -87.0f;  // e^-87 > FLT_MIN
#else
inline constexpr float kExp2Table[8] = {1.994877934e+00f, 2.175429821e+00f, 2.372323036e+00f,
                                        2.587036610e+00f, 2.821183443e+00f, 3.076522350e+00f,
                                        3.354971409e+00f, 3.658622265e+00f};
inline constexpr float kExp2Poly[] = {2.5676067453e-03f, 1.0025676489e+00f, 5.0128400326e-01f,
                                      1.6707892716e-01f, 4.1681930423e-02f};
inline constexpr float kExpLoNormal = -86.5f;  // floor(k/8) - 1 >= -126
#endif

template <bool kSubnormal = false>
PTO_VMATH_INLINE Vec exp_reduced(Vec x) {
  const Vec shifter = Vec::set1(Vec::kLanes == 16 ? 786432.0f : 1572864.0f);  // 1.5 2^19, 2^20
  const Vec t = fma(x, Vec::set1(1.44269504088896341f), shifter);
  const Vec n = t - shifter;                          // k/N
  Vec r = fnma(n, Vec::set1(0.693145751953125f), x);  // 22713 / 2^15: exact
  r = fnma(n, Vec::set1(1.42860677e-6f), r);
  const Vec T = permute(Vec::load(kExp2Table), bits(t));
  const Vec y = fma(T, poly(r, kExp2Poly), T);
#if defined(PTO_ISA_AVX512)
  (void)kSubnormal;
  return {_mm512_scalef_ps(y.v, n.v)};  // times 2^floor(n)
#else
  if constexpr (kSubnormal) return scale_pow2(y, floor(n) - Vec::set1(1.0f));
  // ((k >> 3) - 1 + 127) << 23, k being t's low bits
  const VecI e =
      (shift_left<20>(bits(t)) & set1_int(static_cast<int32_t>(0xff800000u))) + set1_int(126 << 23);
  return y * from_bits(e);
#endif
}
#endif

// e^x on any argument (the clamps and special lanes of exp below).
template <bool kMayOverflow>
PTO_VMATH_INLINE Vec exp_any(Vec x) {
  const Vec hi = Vec::set1(88.7228391f), lo_normal = Vec::set1(kExpLoNormal),
            lo = Vec::set1(-103.972084f);
#if defined(PTO_ISA_AVX512)
  // VSCALEFPS is exact into the subnormals: one reduction on x held to [lo, hi] covers the band
  // (before, a second one ran for its lanes: the exp of vectors with a lane beyond +-87 1.1-1.2x
  // faster, Softmax over such rows 1.0x).
  (void)lo_normal;
  Vec y = exp_reduced(kMayOverflow ? min(hi, max(lo, x)) : max(lo, x));
  y = select(x < lo, Vec::zero(), y);
  if (kMayOverflow) y = select(x > hi, Vec::set1(INFINITY), y);
  return y;  // NaN where x is
#elif defined(PTO_ISA_GENERIC)
  Vec y = exp_reduced(kMayOverflow ? min(max(x, lo_normal), hi) : max(x, lo_normal));
#else
  Vec y = exp_reduced(kMayOverflow ? min(hi, max(lo_normal, x)) : max(lo_normal, x));
#endif
  Mask under = x < lo_normal;
  if (any(under)) {
    Mask band = under & (x >= lo);  // subnormal results
    if (any(band)) y = select(band, exp_reduced<true>(select(band, x, lo_normal)), y);
    y = select(x < lo, Vec::zero(), y);
  }
  if (kMayOverflow) y = select(x > hi, Vec::set1(INFINITY), y);
#if defined(PTO_ISA_GENERIC)
  return select(is_nan(x), x, y);
#else
  return y;  // NaN where x is (above)
#endif
}

// exp_any out of line, for the x86 exp's rare vectors: inlined, its third copy of exp_reduced
// made GCC leave silu and gelu_tanh out of their loops (called once a vector, 0.9x).
template <bool kMayOverflow>
[[gnu::noinline]] inline Vec exp_any_call(Vec x) {
  return exp_any<kMayOverflow>(x);
}

// e^x, below 1 ulp (generic build: 1.2), underflowing gradually through the subnormals. Lanes
// whose result is subnormal are computed apart, and only when a vector has one: a multiply that
// underflows costs a microcode assist of ~100 cycles on x86, and masked softmax rows (scores of
// -inf or -FLT_MAX) would otherwise pay it on every element. exp<false> is for arguments known to
// be <= 0 or NaN (Softmax's x - max): the same bits without the overflow checks.
//
// On x86 a vector whose lanes are all in [kExpLoNormal, hi] or NaN (compares false) goes straight
// through exp_reduced, NaN in, NaN out (the table lookup of a NaN's bits is some entry, times
// the NaN): no clamps and no selects, two compares and a branch. Other vectors call exp_any,
// whose clamps take x as their second operand, which VMAXPS/VMINPS return when it is NaN. The
// generic build's max and min keep their first operand instead, so it puts NaNs back at the end.
template <bool kMayOverflow = true>
PTO_VMATH_INLINE Vec exp(Vec x) {
#if defined(PTO_ISA_GENERIC)
  return exp_any<kMayOverflow>(x);
#elif defined(PTO_ISA_AVX512)
  if constexpr (!kMayOverflow) {
    return exp_any<false>(x);
  } else {
    if (any((x < Vec::set1(kExpLoNormal)) | (x > Vec::set1(88.7228391f)))) [[unlikely]]
      return exp_any<true>(x);
    return exp_reduced(x);
  }
#else
  Mask out = x < Vec::set1(kExpLoNormal);
  if constexpr (kMayOverflow) out = out | (x > Vec::set1(88.7228391f));
  if (any(out)) [[unlikely]]
    return exp_any_call<kMayOverflow>(x);
  return exp_reduced(x);
#endif
}

// min(x, c) and max(x, c) that keep a NaN x: VMINPS / VMAXPS return their second operand when
// either is NaN, the generic build's min and max their first.
inline Vec min_keep_nan(Vec x, Vec c) {
#if defined(PTO_ISA_GENERIC)
  return min(x, c);
#else
  return min(c, x);
#endif
}
inline Vec max_keep_nan(Vec x, Vec c) {
#if defined(PTO_ISA_GENERIC)
  return max(x, c);
#else
  return max(c, x);
#endif
}

// e^x for x in [kExpLoNormal, 88.72] or NaN, which a caller has made sure of (held its argument
// there): on x86 straight through exp_reduced, without exp's compares and branch.
PTO_VMATH_INLINE Vec exp_normal(Vec x) {
#if defined(PTO_ISA_GENERIC)
  return exp_any<false>(x);
#else
  return exp_reduced(x);
#endif
}

// e^x - 1 without cancellation near 0: x + x^2 q(x) on |x| < ln2, e^x - 1 beyond, where x is
// held to exp's normal range: below it e^x - 1 is -1 in float anyway (from x < -17.4), above it
// inf. Unheld, an argument past +-87 (Elu's, Selu's and Celu's lanes included, whose x > 0 they
// then drop) sent the vector to exp's out-of-line path and its subnormal results.
inline Vec expm1(Vec x) {
  static constexpr float kQ[] = {5.000000000e-01f, 1.666667014e-01f, 4.166666791e-02f,
                                 8.332772180e-03f, 1.388831530e-03f, 2.007380390e-04f,
                                 2.504845361e-05f};
  const Vec hi = Vec::set1(88.7228391f);
  Vec small = fma(x * x, poly(x, kQ), x);
  Vec big =
      exp_normal(min_keep_nan(max_keep_nan(x, Vec::set1(kExpLoNormal)), hi)) - Vec::set1(1.0f);
  big = select(x > hi, Vec::set1(INFINITY), big);
  Vec r = select(abs(x) < Vec::set1(0.693147f), small, big);
  return select(x == Vec::zero(), x, r);  // keeps -0
}

// ln x: x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln(m) = f - f^2/2 + f^3 P(f) for f = m - 1
// (Cephes' logf polynomial), plus e ln2 in two parts. Subnormals are scaled up first.
inline Vec log(Vec x) {
  Mask sub = x < Vec::set1(1.17549435e-38f);
  Vec xs = select(sub, x * Vec::set1(8388608.0f), x);  // 2^23
  Vec e_adj = select(sub, Vec::set1(-23.0f), Vec::zero());
  VecI b = bits(xs);
  Vec e = to_float(shift_right<23>(b) - set1_int(126)) + e_adj;
  Vec m = from_bits((b & set1_int(0x007fffff)) | set1_int(0x3f000000));  // [0.5, 1)
  Mask lo = m < Vec::set1(0.707106781186547524f);
  e = select(lo, e - Vec::set1(1.0f), e);
  Vec f = select(lo, m + m, m) - Vec::set1(1.0f);  // exact
  static constexpr float kP[] = {3.3333331174e-1f,  -2.4999993993e-1f, 2.0000714765e-1f,
                                 -1.6668057665e-1f, 1.4249322787e-1f,  -1.2420140846e-1f,
                                 1.1676998740e-1f,  -1.1514610310e-1f, 7.0376836292e-2f};
  Vec z = f * f;
  Vec y = poly(f, kP) * f * z;
  y = fma(e, Vec::set1(-2.12194440e-4f), y);
  y = fma(z, Vec::set1(-0.5f), y);
  Vec r = fma(e, Vec::set1(0.693359375f), f + y);
  r = select(x == Vec::set1(INFINITY), x, r);
  r = select(x == Vec::zero(), Vec::set1(-INFINITY), r);
  r = select(x < Vec::zero(), Vec::set1(NAN), r);
  return select(is_nan(x), x, r);
}

// ln(1 + x): the rounding of u = 1 + x corrected to first order, ln u + (x - (u - 1)) / u.
inline Vec log1p(Vec x) {
  Vec u = x + Vec::set1(1.0f);
  Vec r = log(u) + (x - (u - Vec::set1(1.0f))) / u;
  r = select(x == Vec::set1(INFINITY), x, r);
  r = select(u == Vec::zero(), Vec::set1(-INFINITY), r);
  return select(u == Vec::set1(1.0f), x, r);  // tiny x (and +-0): ln(1 + x) = x
}

// tanh: x + x^3 P(x^2) below 0.625 (Cephes' tanhf), 1 - 2 / (e^{2|x|} + 1) with x's sign above.
inline Vec tanh(Vec x) {
  Vec t = abs(x);
  // |x| held at 2^-40 for the square, where x + x^3 P(x^2) is x in float either way: a square
  // below FLT_MIN (|x| < 1.1e-19; mish's tanh of e^x for x < -43.7) is a microcode assist on x86.
  const Vec th0 = max_keep_nan(t, Vec::set1(9.09494702e-13f));
  Vec s = th0 * th0;
  static constexpr float kP[] = {-3.33332819422e-1f, 1.33314422036e-1f, -5.37397155531e-2f,
                                 2.06390887954e-2f, -5.70498872745e-3f};
  Vec small = fma(poly(s, kP) * s, x, x);
  // t held at 10, where 1 - 2 / (e^20 + 1) is 1 in float as for every larger t (from 9.01): the
  // exp then never overflows (t > 44.4 took exp's out-of-line path).
  const Vec th = min_keep_nan(t, Vec::set1(10.0f));
  Vec big = Vec::set1(1.0f) - Vec::set1(2.0f) / (exp_normal(th + th) + Vec::set1(1.0f));
  big = select(x < Vec::zero(), -big, big);
  Vec r = select(t < Vec::set1(0.625f), small, big);
  return select(x == Vec::zero(), x, r);  // keeps -0
}

// a / b for b in [1, 2] and a in [0, 1]. Under AVX-512: the 14-bit reciprocal estimate r, q = a r,
// and one correction q + r (a - b q), whose error is r's squared (2^-28) plus q's rounding, so
// within an ulp of a / b (sigmoid's measured error did not move); 4 instructions in place of a
// VDIVPS, 1.01x on sigmoid(a) b + 1 in L2 (Xeon). Elsewhere the division.
inline Vec div_1_2(Vec a, Vec b) {
#if defined(PTO_ISA_AVX512)
  const Vec r{_mm512_rcp14_ps(b.v)}, q = a * r;
  return fma(r, fnma(b, q, a), q);
#else
  return a / b;
#endif
}

// sigmoid's vectors with a lane beyond exp's normal range (|x| > 87, 86.5 under AVX2), out of
// line: e^-|x| held at e^-87, so that no lane's division sees a subnormal (1 / (1 + e^-87) is 1 in
// float, as beyond), and e^x itself, subnormal or 0, for x below -87, where e^x / (1 + e^x) is e^x
// in float.
// e^t for t = -|x| <= 0 (or NaN) on the held paths of sigmoid and softplus: `tiny`, e^t itself
// (subnormal or 0 below kExpLoNormal), and `held`, e^t with t held at kExpLoNormal (no lane
// subnormal) where the lanes below it are only an addend that rounds away (1 + e^t) or are
// replaced. Under AVX-512 one reduction gives both (VSCALEFPS is exact into the subnormals; held
// lanes floor at FLT_MIN, below e^-87); elsewhere the two exps.
struct HeldExp {
  Vec tiny, held;
};
inline HeldExp held_exp(Vec t) {
#if defined(PTO_ISA_AVX512)
  const Vec lo = Vec::set1(-103.972084f);
  const Vec y = exp_reduced(max_keep_nan(t, lo));
  return {select(t < lo, Vec::zero(), y), max_keep_nan(y, Vec::set1(1.17549435e-38f))};
#else
  return {exp_any<false>(t), exp_normal(max_keep_nan(t, Vec::set1(kExpLoNormal)))};
#endif
}

[[gnu::noinline]] inline Vec sigmoid_held(Vec x) {
  const HeldExp e = held_exp(-abs(x));
  const Vec r = div_1_2(select(x < Vec::zero(), e.held, Vec::set1(1.0f)), e.held + Vec::set1(1.0f));
  return select(x < Vec::set1(kExpLoNormal), e.tiny, r);
}

// 1 / (1 + e^-x), as e^x / (1 + e^x) for x < 0 so that tiny results keep their precision. -|x|
// is <= 0 or NaN, so exp needs no overflow checks. A vector with a lane beyond exp's normal range
// takes sigmoid_held (the same compare and branch that exp would take, to its own out-of-line
// path): computed as it is, e^-|x| was subnormal there and the division's products underflowed.
PTO_VMATH_INLINE Vec sigmoid(Vec x) {
  const Vec t = -abs(x);
#if defined(PTO_ISA_AVX512)
  if (any(t < Vec::set1(kExpLoNormal))) [[unlikely]] {
    const HeldExp e = held_exp(t);
    const Vec r =
        div_1_2(select(x < Vec::zero(), e.held, Vec::set1(1.0f)), e.held + Vec::set1(1.0f));
    return select(x < Vec::set1(kExpLoNormal), e.tiny, r);
  }
#elif !defined(PTO_ISA_GENERIC)
  if (any(t < Vec::set1(kExpLoNormal))) [[unlikely]]
    return sigmoid_held(x);
#endif
  const Vec e = exp_normal(t);
  return div_1_2(select(x < Vec::zero(), e, Vec::set1(1.0f)), e + Vec::set1(1.0f));
}

// erfc(t) for t >= 1, for erf's 1 - erfc, as exp(-t^2 + h(t)), h (the slowly varying rest)
// fitted on [1, 4.5]. The argument, up to -20, is carried as a float plus a correction (t^2 split
// exactly, the sum's error by Fast2Sum) applied as a factor, since exp's relative error is its
// argument's absolute error. A few ulp up to 4.5 (erf is 1 in float from 3.92); beyond, h is held
// at h(4.5), and t at 6, where erfc is 2e-17 and 1 - erfc is 1 in float; held at 11 instead, t
// past 9.2 sent exp's argument below -87, to its out-of-line path and its subnormal results.
inline Vec erfc_tail(Vec t) {
  static constexpr float kH[] = {-1.641640425e+00f, -3.265359700e-01f, 4.871342704e-02f,
                                 -8.933230303e-03f, 1.704694703e-03f,  -3.206015681e-04f,
                                 5.779591811e-05f,  -9.678629795e-06f, 1.369013376e-06f,
                                 -1.192725989e-07f};
  t = min(t, Vec::set1(6.0f));
  const Vec sq_hi = t * t, sq_lo = fms(t, t, sq_hi);
  Vec u = min(max(t, Vec::set1(1.0f)), Vec::set1(4.5f)) - Vec::set1(2.75f);  // exact
  Vec h = poly(u, kH);
  Vec s = h - sq_hi;  // |sq_hi| >= |h|: Fast2Sum
  Vec err = h - (s + sq_hi);
  return exp_normal(s) * (Vec::set1(1.0f) + (err - sq_lo));
}

// erf(x) / x - 1 as a polynomial in x^2 on |x| < 1.
inline constexpr float kErfQ[] = {1.283791661e-01f,  -3.761262596e-01f, 1.128357872e-01f,
                                  -2.685334720e-02f, 5.187162198e-03f,  -7.997853099e-04f,
                                  7.806903159e-05f};

// erf: x (1 + q(x^2)) for |x| < 1 (q fitted), +-(1 - erfc_tail(|x|)) beyond.
inline Vec erf(Vec x) {
  Vec t = abs(x);
  Vec small = fma(x, poly(x * x, kErfQ), x);
  Vec big = Vec::set1(1.0f) - erfc_tail(t);
  big = select(x < Vec::zero(), -big, big);
  return select(is_nan(x), x, select(t < Vec::set1(1.0f), small, big));
}

// GELU, exact form: x Phi(x), Phi(x) = erfc(-z) / 2 with z = x / sqrt2, from one erfc for both
// signs: with a = |z| and h = 1 / (2 + a), erfc(a) / 2 = h exp(-a^2 + G(h)), G a degree-8
// polynomial in h fitted on a in [0, 4.5] (h in [1/6.5, 1/2]; 3.6e-8 absolute, so relative on
// the result), held at a = 4.5 beyond (where erfc(a) / 2 < 1e-10: a relative error there is far
// under the bound relative to x). Phi is that for x < 0 (no cancellation: relative accuracy all
// the way down) and 1 - it for x >= 0 (>= 1/2). The substitution makes log(erfcx) nearly a
// polynomial, so one evaluation serves every lane where a polynomial for |z| < 1 and a tail
// beyond were both computed and blended (about 40 vector instructions against 60; 7 ulp bound,
// cpu_vmath_test). a^2 is x^2 / 2 split exactly (hi + lo), since exp's relative error is its
// argument's absolute error, up to 20 here.
inline constexpr float kGeluG[] = {-4.617741108e-01f, 2.750874043e+00f,  1.794179343e-02f,
                                   -3.224363565e+00f, 1.000705004e+00f,  7.987785816e+00f,
                                   -9.322791100e+00f, -1.711592293e+01f, 4.050618744e+01f};
inline Vec gelu_erf(Vec x) {
  const Vec half = Vec::set1(0.5f), one = Vec::set1(1.0f);
  // x held to +-12.9, where the exp's argument (>= -84.1) is in its normal range; beyond, Phi is
  // 1 in float above and below -12.9 the result (|x| erfc(9.1) / 2 < 1e-36 |x|) is -0.
  const Vec lim = Vec::set1(12.9f);
  const Vec ax = min(abs(x), lim);  // NaN: lim (the final product is NaN)
  const Vec a = ax * Vec::set1(0.707106781186547524f);
  const Vec h = one / (Vec::set1(2.0f) + a);
  // G by Estrin's scheme: four levels of dependent operations where Horner's has eight (the
  // function is a long dependent chain, so its latency, not its operation count, sets the pace).
  const Vec u = max(h, Vec::set1(1.0f / 6.5f)) - Vec::set1(0.326923072f), u2 = u * u, u4 = u2 * u2;
  auto pair = [&](int i) { return fma(Vec::set1(kGeluG[i + 1]), u, Vec::set1(kGeluG[i])); };
  const Vec g =
      fma(fma(Vec::set1(kGeluG[8]), u4, fma(pair(6), u2, pair(4))), u4, fma(pair(2), u2, pair(0)));
  const Vec sq = ax * ax, sq_hi = sq * half, sq_lo = fms(ax, ax, sq) * half;
  const Vec s = g - sq_hi;
  const Vec err = g - (s + sq_hi);  // s's rounding error where |sq_hi| >= |g| (else below 6e-8)
  const Vec e = exp_normal(s) * h;
  Vec tail = fma(e, err - sq_lo, e);  // erfc(|z|) / 2
  tail = select(x < -lim, Vec::zero(), tail);
  return x * select(x < Vec::zero(), tail, one - tail);
}

// GELU for a result rounded to bf16 or f16 after it (Epilogue::half_store): x/2 (1 + erf(z)),
// z = x / sqrt2, erf(z) = z P(z^2) / Q(z^2) with P of degree 5 and Q of degree 4 (a rational
// minimax fit of erf(z) / z on [0, 3.92]) held to [-1, 1], z held to +-3.8, where the fit is past
// 1 in float (1 + 3.6e-7), so that erf is exactly +-1 there and GELU is x from x = 5.37 (as the
// exact GELU rounds) and -0 below -5.37: 19 vector instructions where gelu_erf takes about 45,
// 2.1x its speed (4.0 against 8.6 ns a vector, Xeon). Its error is absolute: 4.3e-7 max(1, |x|)
// measured (cpu_gemm_test bounds it at 1e-6), so relative for x >= 0 (5.1e-7, erf's own error
// halved) and growing in the negative tail, where GELU is x Phi(x) with Phi(x) tiny: 2e-5 at
// x = -2, 1e-2 at x = -4 (a value of -1.3e-4). Next to the rounding that follows (2^-9 relative
// for bf16, 2^-12 for f16) and to the products' own fp32 sums, only values below 4e-3 in
// magnitude see it, at about 1e-6 absolute; PyTorch's vectorized erf (Abramowitz-Stegun 7.1.26)
// is absolute the same way. NaN gives NaN (through x / 2), +inf +inf, -inf NaN (-inf times 0,
// as gelu_erf).
inline constexpr float kGeluHalfP[] = {1.1283822060e+00f, 3.5106620193e-01f, 7.0804774761e-02f,
                                       9.6261240542e-03f, 2.4075656256e-04f, -1.3772176999e-06f};
inline constexpr float kGeluHalfQ[] = {1.0f, 6.4447307587e-01f, 1.7756004632e-01f,
                                       2.7055718005e-02f, 2.2422850598e-03f};
inline Vec gelu_erf_half(Vec x) {
  const Vec one = Vec::set1(1.0f), zc = Vec::set1(3.8f);
  const Vec z = min(max(x * Vec::set1(0.707106781186547524f), -zc), zc);  // NaN: -zc
  const Vec s = z * z, s2 = s * s;
  auto p = [&](int i) { return fma(Vec::set1(kGeluHalfP[i + 1]), s, Vec::set1(kGeluHalfP[i])); };
  auto q = [&](int i) { return fma(Vec::set1(kGeluHalfQ[i + 1]), s, Vec::set1(kGeluHalfQ[i])); };
  const Vec num = fma(fma(p(4), s2, p(2)), s2, p(0));
  const Vec den = fma(fma(Vec::set1(kGeluHalfQ[4]), s2, q(2)), s2, q(0));
  const Vec e = min(max(z * num / den, -one), one);
  return x * Vec::set1(0.5f) * (one + e);  // 1 + e exact near e = -1: -0 for x << 0
}

// x sigmoid(v) with v held to [-87, 87] (sigmoid is 1 in float beyond 87 anyway) and -0 (x 0)
// where v < -87, where |x sigmoid(v)| < 1.7e-38 |x| (PyTorch's x / (1 + e^-x) gives -0 from
// -88.7): silu (v = x), swish (v = alpha x) and gelu_tanh (v = 2u). No lane's exp is subnormal
// and no product underflows (a microcode assist on x86).
//
// Under AVX-512 (exp's normal range is [-87, 88.7]) without a branch: -|v| held at -87 costs one
// VMAXPS and the -0 lanes a compare and a blend, about what a test for such lanes costs. Before,
// a vector with a lane beyond +-87 left the loop for an out-of-line held path: EfficientNet-B0's
// 7x7 expansion conv + SiLU on its real activations (3% below -87, 39% of the vectors) then ran
// 236-243 us against 255 unheld and 233 on random data; the call and its mispredicted branch still
// left silu 1.3-1.6x slower on rows with 5-40% of lanes beyond +-90 than on N(0, 1) ones
// (pto_bench --only vmath_large; now 1.0x, docs/backend/elementwise.md). The AVX2 fast exp stops
// at -86.5, so there (and in the generic build) such vectors still go out of line.
[[gnu::noinline]] inline Vec times_sigmoid_held(Vec x, Vec v) {
  const Vec lim = Vec::set1(87.0f);
  const Vec r = x * sigmoid(min_keep_nan(max_keep_nan(v, -lim), lim));
  return select(v < -lim, x * Vec::zero(), r);
}
PTO_VMATH_INLINE Vec times_sigmoid(Vec x, Vec v) {
  const Vec lim = Vec::set1(87.0f);
#if defined(PTO_ISA_AVX512)
  const Vec e = exp_reduced(max_keep_nan(-abs(v), -lim));
  const Vec r = x * div_1_2(select(v < Vec::zero(), e, Vec::set1(1.0f)), e + Vec::set1(1.0f));
  return select(v < -lim, x * Vec::zero(), r);
#else
  if (any(abs(v) > lim)) [[unlikely]]
    return times_sigmoid_held(x, v);
  return x * sigmoid(v);
#endif
}

// GELU, tanh form: x/2 (1 + tanh(u)) = x sigmoid(2u) with u = sqrt(2/pi) (x + 0.044715 x^3); 2u
// held as times_sigmoid holds it (below -87, x < -10, the result is -0).
inline Vec gelu_tanh(Vec x) {
  Vec u = x * fma(x * x, Vec::set1(0.0356774081f), Vec::set1(0.797884560802865f));  // 2u / 2
  return times_sigmoid(x, u + u);
}

// x sigmoid(x), held as times_sigmoid holds it.
inline Vec silu(Vec x) {
  return times_sigmoid(x, x);
}

// x sigmoid(alpha x), held as times_sigmoid holds it.
inline Vec swish(Vec x, Vec alpha) {
  return times_sigmoid(x, alpha * x);
}

// softplus's vectors with a lane beyond exp's normal range, out of line: e^-|x| held at e^-87
// (x + ln(1 + e^-x) is x in float from 87 on), and e^x itself, subnormal or 0, below -87, where
// ln(1 + e^x) is e^x in float; no lane's log1p sees a subnormal.
[[gnu::noinline]] inline Vec softplus_held(Vec x) {
  const Vec lo = Vec::set1(kExpLoNormal);
  const HeldExp e = held_exp(-abs(x));
  Vec r = max(x, Vec::zero()) + log1p(e.held);
  r = select(x > -lo, x, r);
  r = select(x < lo, e.tiny, r);
  return select(is_nan(x), x, r);
}

// ln(1 + e^x) = max(x, 0) + ln(1 + e^-|x|); a vector with a lane beyond exp's normal range takes
// softplus_held (exp's own compare and branch, to its own out-of-line path).
inline Vec softplus(Vec x) {
  const Vec t = -abs(x);
#if defined(PTO_ISA_AVX512)
  {
    const Vec lo = Vec::set1(kExpLoNormal);
    const HeldExp e = held_exp(t);
    Vec r = max(x, Vec::zero()) + log1p(e.held);
    r = select(x > -lo, x, r);
    r = select(x < lo, e.tiny, r);
    return select(is_nan(x), x, r);
  }
#elif !defined(PTO_ISA_GENERIC)
  if (any(t < Vec::set1(kExpLoNormal))) [[unlikely]]
    return softplus_held(x);
#endif
  Vec r = max(x, Vec::zero()) + log1p(exp_normal(t));
  return select(is_nan(x), x, r);
}

// x tanh(softplus(x)) with x held to [-87, 87] for softplus and tanh, so that neither sees a
// subnormal (tanh(softplus(87)) is 1, as beyond); without a branch (the clamp's two instructions
// on a function of ~130 cycles a vector). Below -87 tanh(softplus(x)) is e^x in float, and those
// lanes (a vector with one only) take x e^x as (x e^(x + 44) K) 2^-64, K = e^(64 ln2 - 44): the
// exp and the products normal, the last scaling into the subnormals by scale_pow2 (VSCALEFPS under
// AVX-512, which is no microcode assist); unheld, vectors with such lanes ran 1.4-2.5x slower.
inline Vec mish(Vec x) {
  const Vec lim = Vec::set1(87.0f);
  const Vec xc = min_keep_nan(max_keep_nan(x, -lim), lim);
  const Vec r = x * tanh(softplus(xc));
  const Mask tail = x < -lim;
  if (any(tail)) [[unlikely]] {
    const Vec e = exp_any<false>(x + Vec::set1(44.0f));  // exact sum; -inf: 0, so NaN as x 0
    return select(tail, scale_pow2(x * e * Vec::set1(1.4353655577f), Vec::set1(-64.0f)), r);
  }
  return r;
}

// atan x within 3 ulp (2.8 measured against the double atan on uniform samples up to 1e8;
// libm's atanf 0.8) by Cephes' atanf: |x| > tan(3 pi / 8) as pi/2 + atan(-1 / |x|), |x| >
// tan(pi / 8) as pi/4 + atan((|x| - 1) / (|x| + 1)), so the odd polynomial sees |z| <=
// tan(pi / 8); then x's sign (atan(-0) = -0, +-inf give +-pi/2, NaN stays NaN: its compares
// fail, z = NaN). 1M elements, 1 thread, Zen 4: 7.59 ms element by element -> 0.28 ms
// (onnxruntime 0.97).
inline Vec atan(Vec x) {
  static constexpr float kAtan[] = {-3.33329491539e-1f, 1.99777106478e-1f, -1.38776856032e-1f,
                                    8.05374449538e-2f};
  const Vec ax = abs(x), one = Vec::set1(1.0f);
  const Mask big = ax > Vec::set1(2.414213562373095f), mid = ax > Vec::set1(0.4142135623730950f);
  const Vec z = select(big, -one / ax, select(mid, (ax - one) / (ax + one), ax));
  const Vec base = select(big, Vec::set1(1.570796326794896f),
                          select(mid, Vec::set1(0.7853981633974483f), Vec::zero()));
  const Vec z2 = z * z;
  const Vec y = base + fma(z2 * z, poly(z2, kAtan), z);
  return from_bits(bits(y) | (bits(x) & set1_int(INT32_MIN)));
}

// x min(max(x / 6 + 1/2, 0), 1).
// sin x, or cos x (Cos), within 2 ulp for |x| <= 2^16: x = j pi/2 + r with |r| <~ pi/4 by
// Cody-Waite reduction (pi/2 in three float parts; the first step is exact because j pi/2 and x
// agree to within 1), then Cephes' sinf / cosf polynomials on r by the quadrant j mod 4 (cos x
// is sin x in the next quadrant). Lanes beyond 2^16, where r would lose bits, are the scalar
// std::sin / std::cos of the float, as the reference computes them; inf and NaN give NaN.
template <bool Cos>
inline Vec sin_cos(Vec x) {
  static constexpr float kSin[] = {-1.6666654611e-1f, 8.3321608736e-3f, -1.9515295891e-4f};
  static constexpr float kCos[] = {4.166664568298827e-2f, -1.388731625493765e-3f,
                                   2.443315711809948e-5f};
  const Vec j = round(x * Vec::set1(0.636619772f));
  Vec r = fnma(j, Vec::set1(1.57079637e+0f), x);
  r = fnma(j, Vec::set1(-4.37113883e-8f), r);
  r = fnma(j, Vec::set1(-1.71512451e-15f), r);
  const Vec z = r * r;
  const Vec s = fma(z * r, poly(z, kSin), r);
  const Vec c = fma(z * z, poly(z, kCos), fnma(z, Vec::set1(0.5f), Vec::set1(1.0f)));
  const VecI q = to_int(j) + set1_int(Cos ? 1 : 0);
  Vec y = select(to_float(q & set1_int(1)) == Vec::set1(1.0f), c, s);
  y = from_bits(bits(y) ^ (shift_left<30>(q) & set1_int(INT32_MIN)));  // quadrants 2, 3: -y
  if constexpr (!Cos) y = select(x == Vec::zero(), x, y);              // sin(-0) = -0
  const Mask big = abs(x) > Vec::set1(65536.0f);
  if (any(big)) {
    alignas(64) float xs[Vec::kLanes], ys[Vec::kLanes];
    bool lane[Vec::kLanes];
    x.store(xs);
    y.store(ys);
    store_bool(big, lane, Vec::kLanes);
    for (int i = 0; i < Vec::kLanes; ++i)
      if (lane[i]) ys[i] = Cos ? std::cos(xs[i]) : std::sin(xs[i]);
    y = Vec::load(ys);
  }
  return y;
}

inline Vec hardswish(Vec x) {
  Vec g = fma(x, Vec::set1(1.0f / 6.0f), Vec::set1(0.5f));
  return x * min(max(g, Vec::zero()), Vec::set1(1.0f));
}

}  // namespace pto::cpu::PTO_ISA_NS
