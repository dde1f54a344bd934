// A thin vector type for kernels compiled per ISA (see isa.h): Vec is 16 floats under AVX-512,
// 8 under AVX2 and 1 in the generic build, with the same operations on each, so one kernel source
// serves all three. Include it only from a per-ISA translation unit (PTO_ISA_AVX512, PTO_ISA_AVX2
// or PTO_ISA_GENERIC is defined there); everything it defines lives in that ISA's namespace.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
#include <immintrin.h>
#endif
#if defined(PTO_ISA_AVX512) && defined(__GNUC__) && !defined(__clang__)
// GCC 12 reports the _mm512_undefined_* pass-through operands of AVX-512 intrinsics inlined into
// larger functions as (maybe-)uninitialized, a false positive (GCC bug 105593); it has to stay off
// for the whole translation unit because the warning is raised where the intrinsics are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#if !defined(PTO_ISA_NS)
#error "simd.h is for per-ISA translation units (*_avx512.cpp, *_avx2.cpp, *_generic.cpp)"
#endif

namespace pto::cpu::PTO_ISA_NS {

#if defined(PTO_ISA_AVX512)

struct Mask {
  __mmask16 m;
};
struct VecI {
  __m512i v;
};
struct Vec {
  static constexpr int kLanes = 16;
  __m512 v;
  static Vec load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static Vec load(const float* p, int n) {  // first n lanes, zeros after
    return {_mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p)};
  }
  static Vec set1(float x) { return {_mm512_set1_ps(x)}; }
  static Vec zero() { return {_mm512_setzero_ps()}; }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  void store(float* p, int n) const {
    _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1), v);
  }
  void stream(float* p) const { _mm512_stream_ps(p, v); }  // p 64-byte aligned
};
inline Vec operator+(Vec a, Vec b) {
  return {_mm512_add_ps(a.v, b.v)};
}
inline Vec operator-(Vec a, Vec b) {
  return {_mm512_sub_ps(a.v, b.v)};
}
inline Vec operator*(Vec a, Vec b) {
  return {_mm512_mul_ps(a.v, b.v)};
}
inline Vec operator/(Vec a, Vec b) {
  return {_mm512_div_ps(a.v, b.v)};
}
inline Vec fma(Vec a, Vec b, Vec c) {
  return {_mm512_fmadd_ps(a.v, b.v, c.v)};
}  // a*b+c
inline Vec fnma(Vec a, Vec b, Vec c) {
  return {_mm512_fnmadd_ps(a.v, b.v, c.v)};
}  // c-a*b
inline Vec fms(Vec a, Vec b, Vec c) {
  return {_mm512_fmsub_ps(a.v, b.v, c.v)};
}  // a*b-c
inline Vec min(Vec a, Vec b) {
  return {_mm512_min_ps(a.v, b.v)};
}
inline Vec max(Vec a, Vec b) {
  return {_mm512_max_ps(a.v, b.v)};
}
inline Vec sqrt(Vec a) {
  return {_mm512_sqrt_ps(a.v)};
}
inline Vec abs(Vec a) {
  return {_mm512_abs_ps(a.v)};
}
inline Vec round(Vec a) {  // to nearest, ties to even
  return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
inline Vec floor(Vec a) {
  return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)};
}
inline Mask operator<(Vec a, Vec b) {
  return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ)};
}
inline Mask operator<=(Vec a, Vec b) {
  return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_LE_OQ)};
}
inline Mask operator>(Vec a, Vec b) {
  return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ)};
}
inline Mask operator>=(Vec a, Vec b) {
  return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_GE_OQ)};
}
inline Mask operator==(Vec a, Vec b) {
  return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_EQ_OQ)};
}
inline Mask is_nan(Vec a) {
  return {_mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q)};
}
inline Vec select(Mask m, Vec if_true, Vec if_false) {
  return {_mm512_mask_blend_ps(m.m, if_false.v, if_true.v)};
}
inline VecI to_int(Vec a) {
  return {_mm512_cvtps_epi32(a.v)};
}  // rounds to nearest
inline Vec to_float(VecI a) {
  return {_mm512_cvtepi32_ps(a.v)};
}
inline VecI bits(Vec a) {
  return {_mm512_castps_si512(a.v)};
}
inline Vec from_bits(VecI a) {
  return {_mm512_castsi512_ps(a.v)};
}
inline VecI operator+(VecI a, VecI b) {
  return {_mm512_add_epi32(a.v, b.v)};
}
inline VecI operator-(VecI a, VecI b) {
  return {_mm512_sub_epi32(a.v, b.v)};
}
inline VecI operator&(VecI a, VecI b) {
  return {_mm512_and_si512(a.v, b.v)};
}
inline VecI operator|(VecI a, VecI b) {
  return {_mm512_or_si512(a.v, b.v)};
}
inline VecI operator^(VecI a, VecI b) {
  return {_mm512_xor_si512(a.v, b.v)};
}
inline VecI set1_int(int32_t x) {
  return {_mm512_set1_epi32(x)};
}
template <int S>
inline VecI shift_left(VecI a) {
  return {_mm512_slli_epi32(a.v, S)};
}
template <int S>
inline VecI shift_right(VecI a) {
  return {_mm512_srli_epi32(a.v, S)};
}  // logical
template <int S>
inline VecI shift_right_arith(VecI a) {
  return {_mm512_srai_epi32(a.v, S)};
}
inline float reduce_add(Vec a) {
  return _mm512_reduce_add_ps(a.v);
}
inline float reduce_max(Vec a) {
  return _mm512_reduce_max_ps(a.v);
}
inline float reduce_min(Vec a) {
  return _mm512_reduce_min_ps(a.v);
}
// Lane i of the result is table's lane idx[i] mod kLanes (the index's low bits): one VPERMPS.
inline Vec permute(Vec table, VecI idx) {
  return {_mm512_permutexvar_ps(idx.v, table.v)};
}
// Lane i of the result is lane idx[i] of the 2 * kLanes lanes of a then b (idx[i] < 2 * kLanes).
inline Vec permute2(Vec a, Vec b, VecI idx) {
  return {_mm512_permutex2var_ps(a.v, idx.v, b.v)};
}
inline Vec ceil(Vec a) {
  return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC)};
}
inline Mask operator!=(Vec a, Vec b) {
  return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_NEQ_UQ)};
}
inline Mask operator&(Mask a, Mask b) {
  return {static_cast<__mmask16>(a.m & b.m)};
}
inline Mask operator|(Mask a, Mask b) {
  return {static_cast<__mmask16>(a.m | b.m)};
}
inline bool any(Mask m) {  // some lane is true
  return m.m != 0;
}
// n (<= kLanes) bools <-> a mask; a bool is a byte, 0 or 1.
inline Mask load_bool(const bool* p, int n) {
  __m128i b = _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << n) - 1), p);
  return {_mm_test_epi8_mask(b, b)};
}
inline void store_bool(Mask m, bool* p, int n) {
  _mm_mask_storeu_epi8(p, static_cast<__mmask16>((1u << n) - 1), _mm_maskz_set1_epi8(m.m, 1));
}

#elif defined(PTO_ISA_AVX2)

struct Mask {
  __m256 m;  // all-ones lanes where true
};
struct VecI {
  __m256i v;
};
inline __m256i tail_mask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
struct Vec {
  static constexpr int kLanes = 8;
  __m256 v;
  static Vec load(const float* p) { return {_mm256_loadu_ps(p)}; }
  static Vec load(const float* p, int n) { return {_mm256_maskload_ps(p, tail_mask(n))}; }
  static Vec set1(float x) { return {_mm256_set1_ps(x)}; }
  static Vec zero() { return {_mm256_setzero_ps()}; }
  void store(float* p) const { _mm256_storeu_ps(p, v); }
  void store(float* p, int n) const { _mm256_maskstore_ps(p, tail_mask(n), v); }
  void stream(float* p) const { _mm256_stream_ps(p, v); }  // p 32-byte aligned
};
inline Vec operator+(Vec a, Vec b) {
  return {_mm256_add_ps(a.v, b.v)};
}
inline Vec operator-(Vec a, Vec b) {
  return {_mm256_sub_ps(a.v, b.v)};
}
inline Vec operator*(Vec a, Vec b) {
  return {_mm256_mul_ps(a.v, b.v)};
}
inline Vec operator/(Vec a, Vec b) {
  return {_mm256_div_ps(a.v, b.v)};
}
inline Vec fma(Vec a, Vec b, Vec c) {
  return {_mm256_fmadd_ps(a.v, b.v, c.v)};
}
inline Vec fnma(Vec a, Vec b, Vec c) {
  return {_mm256_fnmadd_ps(a.v, b.v, c.v)};
}
inline Vec fms(Vec a, Vec b, Vec c) {
  return {_mm256_fmsub_ps(a.v, b.v, c.v)};
}
inline Vec min(Vec a, Vec b) {
  return {_mm256_min_ps(a.v, b.v)};
}
inline Vec max(Vec a, Vec b) {
  return {_mm256_max_ps(a.v, b.v)};
}
inline Vec sqrt(Vec a) {
  return {_mm256_sqrt_ps(a.v)};
}
inline Vec abs(Vec a) {
  return {_mm256_and_ps(a.v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)))};
}
inline Vec round(Vec a) {
  return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
inline Vec floor(Vec a) {
  return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)};
}
inline Mask operator<(Vec a, Vec b) {
  return {_mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ)};
}
inline Mask operator<=(Vec a, Vec b) {
  return {_mm256_cmp_ps(a.v, b.v, _CMP_LE_OQ)};
}
inline Mask operator>(Vec a, Vec b) {
  return {_mm256_cmp_ps(a.v, b.v, _CMP_GT_OQ)};
}
inline Mask operator>=(Vec a, Vec b) {
  return {_mm256_cmp_ps(a.v, b.v, _CMP_GE_OQ)};
}
inline Mask operator==(Vec a, Vec b) {
  return {_mm256_cmp_ps(a.v, b.v, _CMP_EQ_OQ)};
}
inline Mask is_nan(Vec a) {
  return {_mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q)};
}
inline Vec select(Mask m, Vec if_true, Vec if_false) {
  return {_mm256_blendv_ps(if_false.v, if_true.v, m.m)};
}
inline VecI to_int(Vec a) {
  return {_mm256_cvtps_epi32(a.v)};
}
inline Vec to_float(VecI a) {
  return {_mm256_cvtepi32_ps(a.v)};
}
inline VecI bits(Vec a) {
  return {_mm256_castps_si256(a.v)};
}
inline Vec from_bits(VecI a) {
  return {_mm256_castsi256_ps(a.v)};
}
inline VecI operator+(VecI a, VecI b) {
  return {_mm256_add_epi32(a.v, b.v)};
}
inline VecI operator-(VecI a, VecI b) {
  return {_mm256_sub_epi32(a.v, b.v)};
}
inline VecI operator&(VecI a, VecI b) {
  return {_mm256_and_si256(a.v, b.v)};
}
inline VecI operator|(VecI a, VecI b) {
  return {_mm256_or_si256(a.v, b.v)};
}
inline VecI operator^(VecI a, VecI b) {
  return {_mm256_xor_si256(a.v, b.v)};
}
inline VecI set1_int(int32_t x) {
  return {_mm256_set1_epi32(x)};
}
template <int S>
inline VecI shift_left(VecI a) {
  return {_mm256_slli_epi32(a.v, S)};
}
template <int S>
inline VecI shift_right(VecI a) {
  return {_mm256_srli_epi32(a.v, S)};
}
template <int S>
inline VecI shift_right_arith(VecI a) {
  return {_mm256_srai_epi32(a.v, S)};
}
// The op is a lambda, not an intrinsic's address: intrinsics are always-inline functions with no
// out-of-line copy, so taking their address fails to link where the call is not inlined (-O1).
template <class Op>
inline __m128 fold(__m256 a, Op op) {
  __m128 x = op(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  x = op(x, _mm_movehl_ps(x, x));
  return op(x, _mm_shuffle_ps(x, x, 1));
}
inline float reduce_add(Vec a) {
  return _mm_cvtss_f32(fold(a.v, [](__m128 x, __m128 y) { return _mm_add_ps(x, y); }));
}
inline float reduce_max(Vec a) {
  return _mm_cvtss_f32(fold(a.v, [](__m128 x, __m128 y) { return _mm_max_ps(x, y); }));
}
inline float reduce_min(Vec a) {
  return _mm_cvtss_f32(fold(a.v, [](__m128 x, __m128 y) { return _mm_min_ps(x, y); }));
}
// Lane i of the result is table's lane idx[i] mod kLanes.
inline Vec permute(Vec table, VecI idx) {
  return {_mm256_permutevar8x32_ps(table.v, idx.v)};
}
// Lane i of the result is lane idx[i] of the 2 * kLanes lanes of a then b (idx[i] < 2 * kLanes).
inline Vec permute2(Vec a, Vec b, VecI idx) {
  const __m256 from_b = _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx.v, _mm256_set1_epi32(7)));
  return {_mm256_blendv_ps(_mm256_permutevar8x32_ps(a.v, idx.v),
                           _mm256_permutevar8x32_ps(b.v, idx.v), from_b)};
}
inline Vec ceil(Vec a) {
  return {_mm256_round_ps(a.v, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC)};
}
inline Mask operator!=(Vec a, Vec b) {
  return {_mm256_cmp_ps(a.v, b.v, _CMP_NEQ_UQ)};
}
inline Mask operator&(Mask a, Mask b) {
  return {_mm256_and_ps(a.m, b.m)};
}
inline Mask operator|(Mask a, Mask b) {
  return {_mm256_or_ps(a.m, b.m)};
}
inline bool any(Mask m) {  // some lane is true
  return _mm256_movemask_ps(m.m) != 0;
}
inline Mask load_bool(const bool* p, int n) {
  int64_t b = 0;
  std::memcpy(&b, p, static_cast<size_t>(n));
  __m256i w = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(b));
  return {_mm256_castsi256_ps(_mm256_cmpgt_epi32(w, _mm256_setzero_si256()))};
}
inline void store_bool(Mask m, bool* p, int n) {
  __m256i w = _mm256_srli_epi32(_mm256_castps_si256(m.m), 31);  // 0 or 1 per lane
  __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
  int64_t b = _mm_cvtsi128_si64(_mm_packus_epi16(h, h));
  std::memcpy(p, &b, static_cast<size_t>(n));
}

#elif defined(PTO_ISA_GENERIC)

struct Mask {
  bool m;
};
struct VecI {
  int32_t v;
};
struct Vec {
  static constexpr int kLanes = 1;
  float v;
  static Vec load(const float* p) { return {*p}; }
  static Vec load(const float* p, int n) { return {n > 0 ? *p : 0.0f}; }
  static Vec set1(float x) { return {x}; }
  static Vec zero() { return {0.0f}; }
  void store(float* p) const { *p = v; }
  void store(float* p, int n) const {
    if (n > 0) *p = v;
  }
  void stream(float* p) const { *p = v; }
};
inline Vec operator+(Vec a, Vec b) {
  return {a.v + b.v};
}
inline Vec operator-(Vec a, Vec b) {
  return {a.v - b.v};
}
inline Vec operator*(Vec a, Vec b) {
  return {a.v * b.v};
}
inline Vec operator/(Vec a, Vec b) {
  return {a.v / b.v};
}
inline Vec fma(Vec a, Vec b, Vec c) {
  return {std::fma(a.v, b.v, c.v)};
}
inline Vec fnma(Vec a, Vec b, Vec c) {
  return {std::fma(-a.v, b.v, c.v)};
}
inline Vec fms(Vec a, Vec b, Vec c) {
  return {std::fma(a.v, b.v, -c.v)};
}
inline Vec min(Vec a, Vec b) {
  return {b.v < a.v ? b.v : a.v};
}  // as minps: b when unordered
inline Vec max(Vec a, Vec b) {
  return {b.v > a.v ? b.v : a.v};
}
inline Vec sqrt(Vec a) {
  return {std::sqrt(a.v)};
}
inline Vec abs(Vec a) {
  return {std::fabs(a.v)};
}
inline Vec round(Vec a) {
  return {std::nearbyint(a.v)};
}
inline Vec floor(Vec a) {
  return {std::floor(a.v)};
}
inline Mask operator<(Vec a, Vec b) {
  return {a.v < b.v};
}
inline Mask operator<=(Vec a, Vec b) {
  return {a.v <= b.v};
}
inline Mask operator>(Vec a, Vec b) {
  return {a.v > b.v};
}
inline Mask operator>=(Vec a, Vec b) {
  return {a.v >= b.v};
}
inline Mask operator==(Vec a, Vec b) {
  return {a.v == b.v};
}
inline Mask is_nan(Vec a) {
  return {a.v != a.v};
}
inline Vec select(Mask m, Vec if_true, Vec if_false) {
  return m.m ? if_true : if_false;
}
inline VecI to_int(Vec a) {
  return {static_cast<int32_t>(std::nearbyint(a.v))};
}
inline Vec to_float(VecI a) {
  return {static_cast<float>(a.v)};
}
inline VecI bits(Vec a) {
  int32_t i;
  std::memcpy(&i, &a.v, 4);
  return {i};
}
inline Vec from_bits(VecI a) {
  float f;
  std::memcpy(&f, &a.v, 4);
  return {f};
}
inline VecI operator+(VecI a, VecI b) {
  return {static_cast<int32_t>(static_cast<uint32_t>(a.v) + static_cast<uint32_t>(b.v))};
}
inline VecI operator-(VecI a, VecI b) {
  return {static_cast<int32_t>(static_cast<uint32_t>(a.v) - static_cast<uint32_t>(b.v))};
}
inline VecI operator&(VecI a, VecI b) {
  return {a.v & b.v};
}
inline VecI operator|(VecI a, VecI b) {
  return {a.v | b.v};
}
inline VecI operator^(VecI a, VecI b) {
  return {a.v ^ b.v};
}
inline VecI set1_int(int32_t x) {
  return {x};
}
template <int S>
inline VecI shift_left(VecI a) {
  return {static_cast<int32_t>(static_cast<uint32_t>(a.v) << S)};
}
template <int S>
inline VecI shift_right(VecI a) {
  return {static_cast<int32_t>(static_cast<uint32_t>(a.v) >> S)};
}
template <int S>
inline VecI shift_right_arith(VecI a) {
  return {a.v >> S};
}
inline float reduce_add(Vec a) {
  return a.v;
}
inline float reduce_max(Vec a) {
  return a.v;
}
inline float reduce_min(Vec a) {
  return a.v;
}
// Lane i of the result is table's lane idx[i] mod kLanes.
inline Vec permute(Vec table, VecI idx) {
  (void)idx;
  return table;
}
// Lane i of the result is lane idx[i] of the 2 * kLanes lanes of a then b (idx[i] < 2 * kLanes).
inline Vec permute2(Vec a, Vec b, VecI idx) {
  return idx.v == 0 ? a : b;
}
inline Vec ceil(Vec a) {
  return {std::ceil(a.v)};
}
inline Mask operator!=(Vec a, Vec b) {
  return {a.v != b.v};
}
inline Mask operator&(Mask a, Mask b) {
  return {a.m && b.m};
}
inline Mask operator|(Mask a, Mask b) {
  return {a.m || b.m};
}
inline bool any(Mask m) {  // some lane is true
  return m.m;
}
inline Mask load_bool(const bool* p, int n) {
  return {n > 0 && *p};
}
inline void store_bool(Mask m, bool* p, int n) {
  if (n > 0) *p = m.m;
}

#else
#error "define PTO_ISA_AVX512, PTO_ISA_AVX2 or PTO_ISA_GENERIC"
#endif

inline Vec operator-(Vec a) {
  return from_bits(bits(a) ^ set1_int(INT32_MIN));
}  // -(+0) is -0

// p 2^n for integral n in [-252, 254] where the result is a normal float or an overflow: one
// VSCALEFPS under AVX-512, else 2^n built in the exponent bits as two factors (each a normal
// float), both exact on those arguments, so every ISA gives the same bits.
inline Vec scale_pow2(Vec p, Vec n) {
#if defined(PTO_ISA_AVX512)
  return {_mm512_scalef_ps(p.v, n.v)};
#else
  VecI ni = to_int(n);
  VecI n1 = shift_right_arith<1>(ni), n2 = ni - n1;
  return p * from_bits(shift_left<23>(n1 + set1_int(127))) *
         from_bits(shift_left<23>(n2 + set1_int(127)));
#endif
}

// Orders the streaming stores (Vec::stream) before the stores that follow, such as the thread
// pool's "task done": a task that streamed calls it before it ends.
inline void stream_fence() {
#if !defined(PTO_ISA_GENERIC)
  _mm_sfence();
#endif
}

// y[j, j + k) = f(j, k) for vectors of k lanes covering [0, n) (f loads k lanes at j). With
// `stream`, the full vectors at aligned addresses go past the cache (Vec::stream: the lines are
// not read before they are written), an unaligned head and the tail store normally; the caller
// calls stream_fence() once it is done.
template <class F>
inline void store_vectors(float* y, int64_t n, bool stream, F f) {
  constexpr int64_t L = Vec::kLanes;
  int64_t j = 0;
  if (stream) {
    const auto lane = static_cast<int64_t>(reinterpret_cast<uintptr_t>(y) / sizeof(float) % L);
    if (lane != 0) {
      j = n < L - lane ? n : L - lane;
      f(0, static_cast<int>(j)).store(y, static_cast<int>(j));
    }
    for (; j + L <= n; j += L) f(j, static_cast<int>(L)).stream(y + j);
  }
  // Whole vectors apart from the tail: f inlined with k = L loads and stores without masks
  // (computing a mask per vector cost a third of Softmax's scaling pass).
  for (; j + L <= n; j += L) f(j, static_cast<int>(L)).store(y + j);
  for (; j < n; j += L) {
    const int k = static_cast<int>(n - j < L ? n - j : L);
    f(j, k).store(y + j, k);
  }
}

// a, but opaque to the optimizer: GCC contracts a * b + c on vectors into one fma even in ISO mode,
// which changes the rounding of formulas that must match a reference exactly (HardSigmoid).
inline Vec rounded(Vec a) {
#if defined(__GNUC__) && !defined(PTO_ISA_GENERIC)
  __asm__("" : "+v"(a.v));
#endif
  return a;
}

}  // namespace pto::cpu::PTO_ISA_NS
