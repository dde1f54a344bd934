// The per-ISA loops declared in elementwise.h; included once by each elementwise_<isa>.cpp.
#pragma once

#include "backend/cpu/elementwise_ops.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

constexpr int L = Vec::kLanes;

template <UnaryOp Op>
void unary_loop(const UnaryParams& p, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {  // two independent chains hide the polynomials' latency
    Vec u = unary<Op>(Vec::load(x + i), p), v = unary<Op>(Vec::load(x + i + L), p);
    u.store(y + i);
    v.store(y + i + L);
  }
  for (; i < n; i += L) {
    int k = static_cast<int>(n - i < L ? n - i : L);
    unary<Op>(Vec::load(x + i, k), p).store(y + i, k);
  }
}

template <BinaryOp Op>
inline Vec binary(Vec a, Vec b) {
  if constexpr (Op == BinaryOp::kAdd) return a + b;
  if constexpr (Op == BinaryOp::kSub) return a - b;
  if constexpr (Op == BinaryOp::kMul) return a * b;
  if constexpr (Op == BinaryOp::kDiv) return a / b;
  if constexpr (Op == BinaryOp::kMax) return select(is_nan(b), b, select(a < b, b, a));
  if constexpr (Op == BinaryOp::kMin) return select(is_nan(b), b, select(b < a, b, a));
}

template <CompareOp Op>
inline Mask compare(Vec a, Vec b) {
  if constexpr (Op == CompareOp::kEqual) return a == b;
  if constexpr (Op == CompareOp::kLess) return a < b;
  if constexpr (Op == CompareOp::kLessOrEqual) return a <= b;
  if constexpr (Op == CompareOp::kGreater) return a > b;
  if constexpr (Op == CompareOp::kGreaterOrEqual) return a >= b;
}

// Loads k lanes at p, or p[0] in every lane when the stride is 0.
template <bool Scalar>
inline Vec load_lanes(const float* p, int64_t i, int k) {
  if constexpr (Scalar)
    return Vec::set1(p[0]);
  else
    return k == L ? Vec::load(p + i) : Vec::load(p + i, k);
}

// Calls body(i, k) for each vector of k lanes covering [0, n).
template <class Body>
inline void for_lanes(int64_t n, Body body) {
  int64_t i = 0;
  for (; i + L <= n; i += L) body(i, L);
  if (i < n) body(i, static_cast<int>(n - i));
}

template <BinaryOp Op, bool SA, bool SB>
void binary_loop(const float* a, const float* b, float* y, int64_t n) {
  for_lanes(n, [&](int64_t i, int k) {
    Vec r = binary<Op>(load_lanes<SA>(a, i, k), load_lanes<SB>(b, i, k));
    if (k == L)
      r.store(y + i);
    else
      r.store(y + i, k);
  });
}

template <BinaryOp Op>
void binary_strided(const float* a, int64_t sa, const float* b, int64_t sb, float* y, int64_t n) {
  if (sa && sb) return binary_loop<Op, false, false>(a, b, y, n);
  if (sa) return binary_loop<Op, false, true>(a, b, y, n);
  if (sb) return binary_loop<Op, true, false>(a, b, y, n);
  return binary_loop<Op, true, true>(a, b, y, n);
}

template <CompareOp Op, bool SA, bool SB>
void compare_loop(const float* a, const float* b, bool* y, int64_t n) {
  for_lanes(n, [&](int64_t i, int k) {
    store_bool(compare<Op>(load_lanes<SA>(a, i, k), load_lanes<SB>(b, i, k)), y + i, k);
  });
}

template <CompareOp Op>
void compare_strided(const float* a, int64_t sa, const float* b, int64_t sb, bool* y, int64_t n) {
  if (sa && sb) return compare_loop<Op, false, false>(a, b, y, n);
  if (sa) return compare_loop<Op, false, true>(a, b, y, n);
  if (sb) return compare_loop<Op, true, false>(a, b, y, n);
  return compare_loop<Op, true, true>(a, b, y, n);
}

}  // namespace

void unary_f32(UnaryOp op, const UnaryParams& p, const float* x, float* y, int64_t n) {
  switch (op) {
#define PTO_CASE(name)   \
  case UnaryOp::k##name: \
    return unary_loop<UnaryOp::k##name>(p, x, y, n);
    PTO_UNARY_OPS(PTO_CASE)
#undef PTO_CASE
  }
}

void binary_f32(BinaryOp op, const float* a, int64_t sa, const float* b, int64_t sb, float* y,
                int64_t n) {
  switch (op) {
    case BinaryOp::kAdd:
      return binary_strided<BinaryOp::kAdd>(a, sa, b, sb, y, n);
    case BinaryOp::kSub:
      return binary_strided<BinaryOp::kSub>(a, sa, b, sb, y, n);
    case BinaryOp::kMul:
      return binary_strided<BinaryOp::kMul>(a, sa, b, sb, y, n);
    case BinaryOp::kDiv:
      return binary_strided<BinaryOp::kDiv>(a, sa, b, sb, y, n);
    case BinaryOp::kMax:
      return binary_strided<BinaryOp::kMax>(a, sa, b, sb, y, n);
    case BinaryOp::kMin:
      return binary_strided<BinaryOp::kMin>(a, sa, b, sb, y, n);
  }
}

void compare_f32(CompareOp op, const float* a, int64_t sa, const float* b, int64_t sb, bool* y,
                 int64_t n) {
  switch (op) {
    case CompareOp::kEqual:
      return compare_strided<CompareOp::kEqual>(a, sa, b, sb, y, n);
    case CompareOp::kLess:
      return compare_strided<CompareOp::kLess>(a, sa, b, sb, y, n);
    case CompareOp::kLessOrEqual:
      return compare_strided<CompareOp::kLessOrEqual>(a, sa, b, sb, y, n);
    case CompareOp::kGreater:
      return compare_strided<CompareOp::kGreater>(a, sa, b, sb, y, n);
    case CompareOp::kGreaterOrEqual:
      return compare_strided<CompareOp::kGreaterOrEqual>(a, sa, b, sb, y, n);
  }
}

void where_b32(const bool* c, int64_t sc, const float* a, int64_t sa, const float* b, int64_t sb,
               float* y, int64_t n) {
  // Bits move through loads, blends and stores only, so any 32-bit type is copied exactly.
  if (sc == 0) {  // one condition for the whole row: a copy or a fill
    const float* src = c[0] ? a : b;
    if ((c[0] ? sa : sb) == 0)
      for (int64_t i = 0; i < n; ++i) y[i] = src[0];
    else
      std::memcpy(y, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  auto run = [&]<bool SA, bool SB>() {
    for_lanes(n, [&](int64_t i, int k) {
      Vec r = select(load_bool(c + i, k), load_lanes<SA>(a, i, k), load_lanes<SB>(b, i, k));
      if (k == L)
        r.store(y + i);
      else
        r.store(y + i, k);
    });
  };
  if (sa && sb) return run.template operator()<false, false>();
  if (sa) return run.template operator()<false, true>();
  if (sb) return run.template operator()<true, false>();
  return run.template operator()<true, true>();
}

// The half <-> float conversions of elementwise.h on whole vectors (F16C; the caller checks that
// the CPU has it): they return how many leading elements they converted, the caller converts the
// rest (the generic build converts none).
#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
#if defined(PTO_ISA_AVX512)
using HalfBits = __m256i;  // kLanes halves
inline HalfBits to_half(Vec v) {
  return _mm512_cvtps_ph(v.v, _MM_FROUND_TO_NEAREST_INT);
}
inline Vec from_half(HalfBits h) {
  return {_mm512_cvtph_ps(h)};
}
#else
using HalfBits = __m128i;
inline HalfBits to_half(Vec v) {
  return _mm256_cvtps_ph(v.v, _MM_FROUND_TO_NEAREST_INT);
}
inline Vec from_half(HalfBits h) {
  return {_mm256_cvtph_ps(h)};
}
#endif
int64_t f16_to_f32_vec(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    HalfBits h;
    std::memcpy(&h, x + i, sizeof h);
    from_half(h).store(y + i);
  }
  return i;
}
int64_t f32_to_f16_vec(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const HalfBits h = to_half(Vec::load(x + i));
    std::memcpy(y + i, &h, sizeof h);
  }
  return i;
}
int64_t round_to_f16_vec(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + L <= n; i += L) from_half(to_half(Vec::load(x + i))).store(x + i);
  return i;
}
#endif

// bf16 <-> float on whole vectors, every ISA (round_bf16 is integer arithmetic, no extension).
int64_t round_to_bf16_vec(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + L <= n; i += L) round_bf16(Vec::load(x + i)).store(x + i);
  return i;
}
#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
// kLanes bf16 values (bits) <-> a vector: widened by a shift, narrowed after round_bf16.
#if defined(PTO_ISA_AVX512)
inline Vec load_bf16(const uint16_t* x) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return from_bits(shift_left<16>(VecI{_mm512_cvtepu16_epi32(h)}));
}
inline void store_bf16(Vec v, uint16_t* y) {
  const VecI b = shift_right<16>(bits(round_bf16(v)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), _mm512_cvtepi32_epi16(b.v));
}
#else
inline Vec load_bf16(const uint16_t* x) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  return from_bits(shift_left<16>(VecI{_mm256_cvtepu16_epi32(h)}));
}
inline void store_bf16(Vec v, uint16_t* y) {
  const __m256i b = shift_right<16>(bits(round_bf16(v))).v;
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(y), packed);
}
#endif
int64_t bf16_to_f32_vec(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + L <= n; i += L) load_bf16(x + i).store(y + i);
  return i;
}
int64_t f32_to_bf16_vec(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + L <= n; i += L) store_bf16(Vec::load(x + i), y + i);
  return i;
}
#else
int64_t bf16_to_f32_vec(const uint16_t*, float*, int64_t) {
  return 0;
}
int64_t f32_to_bf16_vec(const float*, uint16_t*, int64_t) {
  return 0;
}
#endif

#if !defined(PTO_ISA_AVX512) && !defined(PTO_ISA_AVX2)
int64_t f16_to_f32_vec(const uint16_t*, float*, int64_t) {
  return 0;
}
int64_t f32_to_f16_vec(const float*, uint16_t*, int64_t) {
  return 0;
}
int64_t round_to_f16_vec(float*, int64_t) {
  return 0;
}
#endif

}  // namespace pto::cpu::PTO_ISA_NS
