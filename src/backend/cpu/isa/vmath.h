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

// e^x on arguments where the result is a normal float or an overflow: x = n ln2 + r with
// |r| <= ln2/2, e^r by a degree-6 polynomial, times 2^n (scale_pow2).
inline Vec exp_normal_range(Vec x) {
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
  return scale_pow2(p, n);  // one instruction under AVX-512 (a third of exp's)
}

// e^x, about 1 ulp, underflowing gradually through the subnormals. Lanes whose result is
// subnormal are computed apart, and only when a vector has one: a multiply that underflows costs
// a microcode assist of ~100 cycles on x86, and masked softmax rows (scores of -inf or -FLT_MAX)
// would otherwise pay it on every element. exp<false> is for arguments known to be <= 0 or NaN
// (Softmax's x - max): the same bits without the overflow checks.
//
// On x86 the clamps take x as their second operand, which VMAXPS/VMINPS return when it is NaN, so
// a NaN goes through the clamps and the polynomial (every step of it NaN in, NaN out) without the
// compare and blend that would put it back at the end: 4 of 18 cycles a vector on Zen 4 (exp
// over a row in L1, AVX-512). The generic build's max and min keep their first operand instead.
template <bool kMayOverflow = true>
PTO_VMATH_INLINE Vec exp(Vec x) {
  const Vec hi = Vec::set1(88.7228391f), lo_normal = Vec::set1(-87.0f),  // e^-87 > FLT_MIN
      lo = Vec::set1(-103.972084f);
#if defined(PTO_ISA_GENERIC)
  Vec y = exp_normal_range(kMayOverflow ? min(max(x, lo_normal), hi) : max(x, lo_normal));
#else
  Vec y = exp_normal_range(kMayOverflow ? min(hi, max(lo_normal, x)) : max(lo_normal, x));
#endif
  Mask under = x < lo_normal;
  if (any(under)) {
    Mask band = under & (x >= lo);  // subnormal results
    if (any(band)) y = select(band, exp_normal_range(select(band, x, lo_normal)), y);
    y = select(x < lo, Vec::zero(), y);
  }
  if (kMayOverflow) y = select(x > hi, Vec::set1(INFINITY), y);
#if defined(PTO_ISA_GENERIC)
  return select(is_nan(x), x, y);
#else
  return y;  // NaN where x is (above)
#endif
}

// e^x - 1 without cancellation near 0: x + x^2 q(x) on |x| < ln2, e^x - 1 beyond.
inline Vec expm1(Vec x) {
  static constexpr float kQ[] = {5.000000000e-01f, 1.666667014e-01f, 4.166666791e-02f,
                                 8.332772180e-03f, 1.388831530e-03f, 2.007380390e-04f,
                                 2.504845361e-05f};
  Vec small = fma(x * x, poly(x, kQ), x);
  Vec big = exp(x) - Vec::set1(1.0f);
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
  Vec s = x * x;
  static constexpr float kP[] = {-3.33332819422e-1f, 1.33314422036e-1f, -5.37397155531e-2f,
                                 2.06390887954e-2f, -5.70498872745e-3f};
  Vec small = fma(poly(s, kP) * s, x, x);
  Vec big = Vec::set1(1.0f) - Vec::set1(2.0f) / (exp(t + t) + Vec::set1(1.0f));
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

// 1 / (1 + e^-x), as e^x / (1 + e^x) for x < 0 so that tiny results keep their precision. -|x|
// is <= 0 or NaN, so exp needs no overflow checks.
PTO_VMATH_INLINE Vec sigmoid(Vec x) {
  Vec e = exp<false>(-abs(x));
  return div_1_2(select(x < Vec::zero(), e, Vec::set1(1.0f)), e + Vec::set1(1.0f));
}

// erfc(t) for t >= 1 as exp(-t^2 + h(t)), h (the slowly varying rest) fitted on [1, 4.5], given
// t and t^2 = sq_hi + sq_lo exactly. The argument, up to -20, is carried as a float plus a
// correction (the sum's error by Fast2Sum) applied as a factor, since exp's relative error is its
// argument's absolute error. A few ulp up to 4.5 (erf is 1 in float from 3.92); beyond, h is held
// at h(4.5): a relative error growing to ~20% at t = 6, where erfc < 3e-17.
inline Vec erfc_tail(Vec t, Vec sq_hi, Vec sq_lo) {
  static constexpr float kH[] = {-1.641640425e+00f, -3.265359700e-01f, 4.871342704e-02f,
                                 -8.933230303e-03f, 1.704694703e-03f,  -3.206015681e-04f,
                                 5.779591811e-05f,  -9.678629795e-06f, 1.369013376e-06f,
                                 -1.192725989e-07f};
  Vec u = min(max(t, Vec::set1(1.0f)), Vec::set1(4.5f)) - Vec::set1(2.75f);  // exact
  Vec h = poly(u, kH);
  Vec s = h - sq_hi;  // |sq_hi| >= |h|: Fast2Sum
  Vec err = h - (s + sq_hi);
  return exp(s) * (Vec::set1(1.0f) + (err - sq_lo));
}

// erfc_tail(t) with t^2 split here; t is held at 11 (erfc(11) is 0 in float) to keep it finite.
inline Vec erfc_tail(Vec t) {
  t = min(t, Vec::set1(11.0f));
  Vec hi = t * t;
  return erfc_tail(t, hi, fms(t, t, hi));
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

// GELU, exact form: x/2 (1 + erf(z)), z = x / sqrt2: 1 + erf's polynomial for |z| < 1, else
// erfc(|z|) (or 2 - it) straight from erfc_tail, so negative x has no cancellation. z^2 is taken
// as x^2 / 2 exactly (z itself is rounded, an error that would grow with z^2).
inline Vec gelu_erf(Vec x) {
  const Vec half = Vec::set1(0.5f), one = Vec::set1(1.0f), c = Vec::set1(0.707106781186547524f);
  Vec z = x * c;
  Vec small = one + fma(z, poly(z * z, kErfQ), z);
  Vec xc = min(max(x, Vec::set1(-15.0f)), Vec::set1(15.0f)), hi = xc * xc;
  Vec tail = erfc_tail(abs(xc * c), hi * half, fms(xc, xc, hi) * half);
  Vec big = select(z < Vec::zero(), tail, Vec::set1(2.0f) - tail);
  return half * x * select(abs(z) < one, small, big);
}

// GELU, tanh form: x/2 (1 + tanh(u)) = x sigmoid(2u) with u = sqrt(2/pi) (x + 0.044715 x^3).
inline Vec gelu_tanh(Vec x) {
  Vec u = x * fma(x * x, Vec::set1(0.0356774081f), Vec::set1(0.797884560802865f));  // 2u / 2
  return x * sigmoid(u + u);
}

// x sigmoid(x).
inline Vec silu(Vec x) {
  return x * sigmoid(x);
}

// ln(1 + e^x) = max(x, 0) + ln(1 + e^-|x|).
inline Vec softplus(Vec x) {
  Vec r = max(x, Vec::zero()) + log1p(exp(-abs(x)));
  return select(is_nan(x), x, r);
}

// x tanh(softplus(x)).
inline Vec mish(Vec x) {
  return x * tanh(softplus(x));
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
