// One element-wise function per UnaryOp on a Vec, for per-ISA translation units (the elementwise
// loops and the GEMM epilogue). Each mirrors the reference kernel's formula, comparisons included,
// so that NaN, -0 and out-of-order bounds come out the same.
#pragma once

#include "backend/cpu/elementwise.h"
#include "backend/cpu/isa/vmath.h"

namespace pto::cpu::PTO_ISA_NS {

// x rounded to the nearest bf16, kept in float: pto::BFloat16's rounding (to nearest even, a NaN
// stays a quiet NaN) in integer arithmetic.
inline Vec round_bf16(Vec x) {
  const VecI u = bits(x), hi = set1_int(static_cast<int32_t>(0xffff0000u));
  const VecI r = (u + set1_int(0x7fff) + (shift_right<16>(u) & set1_int(1))) & hi;
  return select(is_nan(x), from_bits((u | set1_int(0x00400000)) & hi), from_bits(r));
}

#if defined(PTO_ISA_AVX512)
// The first k lanes of v rounded to bf16 (round_bf16: f32_to_bf16's bits) stored at y: a kernel
// that rounds its own float results while they are in registers.
inline void store_bf16_lanes(Vec v, uint16_t* y, int k) {
  const __m512i b = _mm512_srli_epi32(bits(round_bf16(v)).v, 16);
  _mm512_mask_cvtepi32_storeu_epi16(y, static_cast<__mmask16>((1u << k) - 1), b);
}
#endif

template <UnaryOp Op>
inline Vec unary(Vec x, const UnaryParams& p) {
  const Vec zero = Vec::zero(), one = Vec::set1(1.0f);
  const Vec a = Vec::set1(p.a), b = Vec::set1(p.b);
  using enum UnaryOp;
  if constexpr (Op == kIdentity) return x;
  if constexpr (Op == kRelu) {
#if defined(PTO_ISA_GENERIC)
    return select((x > zero) | is_nan(x), x, zero);
#else
    // MAXPS returns its second operand when either is NaN or both are zeros: x's NaN stays, and
    // + 0 turns the -0 it keeps into +0. Two instructions instead of the compares, OR and blend.
    return max(zero, x) + zero;
#endif
  }
  if constexpr (Op == kLeakyRelu) return select(x < zero, a * x, x);
  if constexpr (Op == kClip) {  // std::min(std::max(x, lo), hi): lo > hi gives hi, NaN stays
    Vec r = select(x < a, a, x);
    return select(b < r, b, r);
  }
  if constexpr (Op == kThresholdedRelu) return select(x > a, x, zero);
  if constexpr (Op == kSigmoid) return sigmoid(x);
  if constexpr (Op == kHardSigmoid || Op == kHardSwish) {
    Vec g = Op == kHardSigmoid ? rounded(a * x) + b : x / Vec::set1(6.0f) + Vec::set1(0.5f);
    g = select(g < one, g, one);  // NaN -> 1, as std::min(1, g)
    g = select(zero < g, g, zero);
    if constexpr (Op == kHardSigmoid) return g;
    if constexpr (Op == kHardSwish) return x * g;
  }
  if constexpr (Op == kTanh) return tanh(x);
  if constexpr (Op == kExp) return exp(x);
  if constexpr (Op == kExpm1) return expm1(x);
  if constexpr (Op == kLog) return log(x);
  if constexpr (Op == kLog1p) return log1p(x);
  if constexpr (Op == kErf) return erf(x);
  if constexpr (Op == kSin) return sin_cos<false>(x);
  if constexpr (Op == kCos) return sin_cos<true>(x);
  if constexpr (Op == kAtan) return atan(x);
  if constexpr (Op == kSqrt) return sqrt(x);
  if constexpr (Op == kPowHalf) return select(x == Vec::set1(-INFINITY), -x, sqrt(x) + zero);
  if constexpr (Op == kReciprocal) return one / x;
  if constexpr (Op == kNeg) return -x;
  if constexpr (Op == kAbs) return abs(x);
  if constexpr (Op == kSign) {  // +-1, 0 for +-0, NaN kept
    Vec s = select(x > zero, one, select(x < zero, Vec::set1(-1.0f), zero));
    return select(is_nan(x), x, s);
  }
  if constexpr (Op == kFloor) return floor(x);
  if constexpr (Op == kCeil) return ceil(x);
  if constexpr (Op == kRound) return round(x);
  if constexpr (Op == kSquare) return x * x;
  if constexpr (Op == kGelu) return gelu_erf(x);
  if constexpr (Op == kGeluTanh) return gelu_tanh(x);
  if constexpr (Op == kSilu) return silu(x);
  if constexpr (Op == kSwish) return swish(x, a);
  if constexpr (Op == kSoftplus) return softplus(x);
  if constexpr (Op == kSoftsign) return x / (one + abs(x));
  if constexpr (Op == kMish) return mish(x);
  if constexpr (Op == kElu) return select(x < zero, a * expm1(x), x);
  if constexpr (Op == kSelu) return select(x > zero, b * x, b * (a * expm1(x)));
  if constexpr (Op == kShrink)  // x < -lambd ? x + bias : x > lambd ? x - bias : 0 (NaN -> 0)
    return select(x < Vec::set1(-p.a), x + b, select(x > a, x - b, zero));
  if constexpr (Op == kCelu) {  // max(0, x) + min(0, a expm1(x / a)), NaN -> 0 as in std::max/min
    Vec w = a * expm1(x / a);
    return select(zero < x, x, zero) + select(w < zero, w, zero);
  }
}

}  // namespace pto::cpu::PTO_ISA_NS
