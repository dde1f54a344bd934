// The per-ISA half of the int8 GEMM (see igemm_kernel.h for the interface, igemm.cpp for the
// packing and threading): an MR x NR register-blocked micro-kernel over packed uint8 A and int8 B
// panels, four k per 32-bit lane. Included once by each of igemm_avx512.cpp, igemm_avx2.cpp and
// igemm_generic.cpp.
//
// Register blocks:
//   AVX-512 (32 zmm): 6 x 64 — 24 accumulators, 4 B vectors (one per 16-column panel), 1 broadcast;
//   AVX2    (16 ymm): 6 x 16 — 12 accumulators, 2 B vectors, 1 broadcast;
//   generic:          4 x 16 — scalar.
// The dot step is VPDPBUSD (AVX512_VNNI on zmm, AVX-VNNI on ymm), issued with inline assembly so
// that the files keep their ISA's flags (a CPU with AVX-512 and no VNNI still runs the rest), or,
// when the extension is off, its exact emulation: bytes widened to int16 (A zero-extended, B
// sign-extended, even and odd bytes apart) and VPMADDWD, which cannot saturate here (|a*b| <=
// 255 * 128, two of them per int32). Not VPMADDUBSW: its int16 sums of two products saturate.
#include <cstring>

#include "backend/cpu/gemm/igemm_kernel.h"

#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
#include <immintrin.h>
#endif
#if defined(PTO_ISA_AVX512) && defined(__GNUC__) && !defined(__clang__)
// GCC bug 105593 (the _mm512_undefined_* pass-through of inlined intrinsics reported as
// uninitialized), off for the translation unit as in isa/simd.h.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace pto::cpu::PTO_ISA_NS {
namespace {

// rowsum, alpha, beta, cs2: the zero-point corrections to add (igemm.h), all null for a later K
// slice, which adds its product to C instead (accumulate). next: where the next columns' panels
// start (same K slice), next_panels of them fetched into L2 alongside (0: none).
using MicroFn = void (*)(int64_t k4, const uint8_t* a, const int8_t* b, int64_t bs,
                         const int32_t* rowsum, const int32_t* alpha, const int32_t* beta,
                         const int32_t* cs2, int32_t* c, int64_t ldc, int n_last, bool accumulate,
                         const int8_t* next, int next_panels);

inline int32_t load_i32(const uint8_t* p) {
  int32_t x;
  std::memcpy(&x, p, 4);
  return x;
}

#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)

#if defined(PTO_ISA_AVX512)
constexpr int kMR = 6, kNV = 4, kL = 16;
using V = __m512i;
inline V vload(const void* p) {
  return _mm512_loadu_si512(p);
}
inline V vset1(int32_t x) {
  return _mm512_set1_epi32(x);
}
inline V vzero() {
  return _mm512_setzero_si512();
}
inline V vadd(V a, V b) {
  return _mm512_add_epi32(a, b);
}
inline V vmul(V a, V b) {
  return _mm512_mullo_epi32(a, b);
}
inline void vstore(int32_t* p, V x) {
  _mm512_storeu_si512(p, x);
}
inline void vstore(int32_t* p, V x, int n) {
  _mm512_mask_storeu_epi32(p, static_cast<__mmask16>((1u << n) - 1), x);
}
inline V vload_n(const int32_t* p, int n) {
  return _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << n) - 1), p);
}
inline V dot_vnni(V acc, V a, V b) {
  asm("vpdpbusd %[b], %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a), [b] "v"(b));
  return acc;
}
inline V dot_emul(V acc, V a, V b) {
  const V lo = _mm512_set1_epi16(0xff);
  const V be = _mm512_srai_epi16(_mm512_slli_epi16(b, 8), 8), bo = _mm512_srai_epi16(b, 8);
  const V ae = _mm512_and_si512(a, lo), ao = _mm512_srli_epi16(a, 8);
  return _mm512_add_epi32(acc,
                          _mm512_add_epi32(_mm512_madd_epi16(ae, be), _mm512_madd_epi16(ao, bo)));
}
#else
constexpr int kMR = 6, kNV = 2, kL = 8;
using V = __m256i;
inline V vload(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
inline V vset1(int32_t x) {
  return _mm256_set1_epi32(x);
}
inline V vzero() {
  return _mm256_setzero_si256();
}
inline V vadd(V a, V b) {
  return _mm256_add_epi32(a, b);
}
inline V vmul(V a, V b) {
  return _mm256_mullo_epi32(a, b);
}
inline void vstore(int32_t* p, V x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x);
}
inline V tail(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline void vstore(int32_t* p, V x, int n) {
  _mm256_maskstore_epi32(p, tail(n), x);
}
inline V vload_n(const int32_t* p, int n) {
  return _mm256_maskload_epi32(p, tail(n));
}
inline V dot_vnni(V acc, V a, V b) {
  asm("%{vex%} vpdpbusd %[b], %[a], %[acc]" : [acc] "+x"(acc) : [a] "x"(a), [b] "x"(b));
  return acc;
}
inline V dot_emul(V acc, V a, V b) {
  const V lo = _mm256_set1_epi16(0xff);
  const V be = _mm256_srai_epi16(_mm256_slli_epi16(b, 8), 8), bo = _mm256_srai_epi16(b, 8);
  const V ae = _mm256_and_si256(a, lo), ao = _mm256_srli_epi16(a, 8);
  return _mm256_add_epi32(acc,
                          _mm256_add_epi32(_mm256_madd_epi16(ae, be), _mm256_madd_epi16(ao, bo)));
}
#endif
constexpr int kNR = kNV * kL;
static_assert(kNR % 16 == 0, "B panels are 16 columns wide");

// Where vector v of the block reads its 16 columns x 4 k at k group 0: panel v * kL / 16, at byte
// (v * kL % 16) * 4 within the panel's 64-byte group.
inline int64_t b_offset(int v, int64_t bs) {
  return (v * kL / 16) * bs + (v * kL % 16) * 4;
}

// C[R x NV vectors] = A_panel * B_panels over k4 groups, plus the zero-point corrections
// rowsum * beta + alpha * cs2. n_last: valid lanes of the last vector (1..kL).
template <bool kVnni, bool kFetch, int R, int NV>
void micro(int64_t k4, const uint8_t* a, const int8_t* b, int64_t bs, const int32_t* rowsum,
           const int32_t* alpha, const int32_t* beta, const int32_t* cs2, int32_t* c, int64_t ldc,
           int n_last, bool accumulate, const int8_t* next, int next_panels) {
  V s[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) s[r][v] = vzero();
  const int8_t* bp[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) bp[v] = b + b_offset(v, bs);
  for (int64_t p = 0; p < k4; ++p) {
    if constexpr (kFetch)
      for (int q = 0; q < next_panels; ++q) __builtin_prefetch(next + q * bs + p * 64, 0, 2);
    V bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = vload(bp[v] + p * 64);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const V av = vset1(load_i32(a + r * 4));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        s[r][v] = kVnni ? dot_vnni(s[r][v], av, bv[v]) : dot_emul(s[r][v], av, bv[v]);
    }
    a += kMR * 4;
  }
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const bool full = v < NV - 1 || n_last == kL;
    if (accumulate) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        int32_t* p = c + r * ldc + v * kL;
        const V x = vadd(s[r][v], full ? vload(p) : vload_n(p, n_last));
        full ? vstore(p, x) : vstore(p, x, n_last);
      }
      continue;
    }
    const V be = vload(beta + v * kL), cs = vload(cs2 + v * kL);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const V x = vadd(s[r][v], vadd(vmul(vset1(rowsum[r]), be), vmul(vset1(alpha[r]), cs)));
      full ? vstore(c + r * ldc + v * kL, x) : vstore(c + r * ldc + v * kL, x, n_last);
    }
  }
}

#else  // generic: scalar, one 16-column panel

constexpr int kMR = 4, kNV = 1, kL = 16;
constexpr int kNR = 16;

template <bool kVnni, bool, int R, int NV>
void micro(int64_t k4, const uint8_t* a, const int8_t* b, int64_t, const int32_t* rowsum,
           const int32_t* alpha, const int32_t* beta, const int32_t* cs2, int32_t* c, int64_t ldc,
           int n_last, bool accumulate, const int8_t*, int) {
  static_assert(NV == 1);
  // uint32: the sums wrap modulo 2^32 as VPDPBUSD's do, without signed overflow.
  uint32_t s[R][16] = {};
  for (int64_t p = 0; p < k4; ++p) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* ar = a + p * kMR * 4 + r * 4;
      for (int j = 0; j < 16; ++j) {
        const int8_t* bj = b + p * 64 + j * 4;
        int32_t d = 0;
        for (int q = 0; q < 4; ++q) d += static_cast<int32_t>(ar[q]) * bj[q];
        s[r][j] += static_cast<uint32_t>(d);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < n_last; ++j) {
      int32_t* p = c + r * ldc + j;
      *p = static_cast<int32_t>(
          s[r][j] + (accumulate
                         ? static_cast<uint32_t>(*p)
                         : static_cast<uint32_t>(rowsum[r]) * static_cast<uint32_t>(beta[j]) +
                               static_cast<uint32_t>(alpha[r]) * static_cast<uint32_t>(cs2[j])));
    }
}

#endif

// table[R - 1][NV - 1] = micro<kVnni, kFetch, R, NV>
template <bool kVnni, bool kFetch, int R, int NV>
void fill_table(MicroFn (*table)[kNV]) {
  table[R - 1][NV - 1] = &micro<kVnni, kFetch, R, NV>;
  if constexpr (NV > 1)
    fill_table<kVnni, kFetch, R, NV - 1>(table);
  else if constexpr (R > 1)
    fill_table<kVnni, kFetch, R - 1, kNV>(table);
}

struct MicroTable {
  MicroFn fn[2][2][kMR][kNV];  // [vnni][fetches the next panels][R - 1][NV - 1]
  MicroTable() {
    fill_table<false, false, kMR, kNV>(fn[0][0]);
    fill_table<false, true, kMR, kNV>(fn[0][1]);
    fill_table<true, false, kMR, kNV>(fn[1][0]);
    fill_table<true, true, kMR, kNV>(fn[1][1]);
  }
};

// One requantized row as a loop the compiler vectorizes with the file's ISA: the rounding is
// (v + 1.5 * 2^52) - 1.5 * 2^52, which is round half to even (the default rounding mode) for
// |v| < 2^51, and v is clamped to the integer range first (clamping before or after rounding to
// integer bounds is the same); NaN, which passes the clamp, becomes 0. The product and the zero
// point's sum round apart, as the reference's do: GCC would fuse them into an FMA (its default
// -ffp-contract=fast in C++) and move ties, so contraction is off here; Clang fuses only within
// one expression.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
template <class T, bool kPerCol, bool kBias>
void requantize_loop(const IgemmRequant& r, const int32_t* acc, int64_t n, T* y) {
  constexpr double kLo = sizeof(T) == 1 && static_cast<T>(-1) < 0 ? -128.0 : 0.0;
  constexpr double kHi = kLo < 0 ? 127.0 : 255.0;
  constexpr double kRound = 6755399441055744.0;
  const double m0 = r.mult[0], zp = r.y_zp;
  const int32_t* bias = r.bias;
  const double* mult = r.mult;
  for (int64_t j = 0; j < n; ++j) {
    double v = static_cast<double>(acc[j]);
    if constexpr (kBias) v += static_cast<double>(bias[j]);
    v = v * (kPerCol ? mult[j] : m0);
    v = v + zp;
    v = v < kLo ? kLo : v;
    v = v > kHi ? kHi : v;
    v = (v + kRound) - kRound;
    v = v == v ? v : 0.0;
    y[j] = static_cast<T>(static_cast<int32_t>(v));
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

#if defined(PTO_ISA_AVX512)
// AVX-512: 16 columns a step as two halves of 8 (the last ones masked), the same arithmetic in
// registers: the sum and the product in double (exact / as the reference rounds it), then the
// clamp and NaN -> 0 folded into fewer instructions than requantize_loop's (every step below is
// exact on integers):
//   uint8: max(v, 0) (a NaN v gives the second operand, 0), converted with the default rounding
//          (half to even; above 2^31 the conversion gives INT32_MIN, 0x80000000), narrowed with
//          unsigned saturation (both to 255);
//   int8:  min(v, 127), converted under the mask v == v (a NaN lane gives 0; below -2^31
//          INT32_MIN), narrowed with signed saturation (to -128).
template <class T, bool kPerCol, bool kBias>
void requantize_vec(const IgemmRequant& r, const int32_t* acc, int64_t n, T* y) {
  constexpr bool kSigned = static_cast<T>(-1) < 0;
  const __m512d bound = _mm512_set1_pd(kSigned ? 127.0 : 0.0), zp = _mm512_set1_pd(r.y_zp);
  const __m512d m0 = _mm512_set1_pd(r.mult[0]);
  // The parameters in locals: stores through y (bytes) may alias r, so its fields would be
  // loaded again every step.
  const int32_t* bias = r.bias;
  const double* mult = r.mult;
  // Columns j.. under mask k (8 lanes): masked-off lanes read zeros.
  auto half = [&](int64_t j, __mmask8 k) {
    __m512d v = _mm512_cvtepi32_pd(_mm256_maskz_loadu_epi32(k, acc + j));
    if constexpr (kBias)
      v = _mm512_add_pd(v, _mm512_cvtepi32_pd(_mm256_maskz_loadu_epi32(k, bias + j)));
    v = _mm512_mul_pd(v, kPerCol ? _mm512_maskz_loadu_pd(k, mult + j) : m0);
    asm("" : "+v"(v));  // no FMA: the product rounds before the sum (requantize_loop)
    v = _mm512_add_pd(v, zp);
    if constexpr (kSigned)
      return _mm512_maskz_cvtpd_epi32(_mm512_cmp_pd_mask(v, v, _CMP_ORD_Q),
                                      _mm512_min_pd(v, bound));
    return _mm512_cvtpd_epi32(_mm512_max_pd(v, bound));
  };
  auto sixteen = [&](int64_t j, __mmask8 k0, __mmask8 k1) {
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(half(j, k0)), half(j + 8, k1), 1);
    return kSigned ? _mm512_cvtsepi32_epi8(v) : _mm512_cvtusepi32_epi8(v);
  };
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + j), sixteen(j, 0xff, 0xff));
  // The last 1..15 columns under masks (no scalar tail: a row is often only 16-40 columns).
  if (const int rem = static_cast<int>(n - j); rem > 0) {
    const auto k0 = static_cast<__mmask8>(rem >= 8 ? 0xff : (1u << rem) - 1);
    const auto k1 = static_cast<__mmask8>(rem > 8 ? (1u << (rem - 8)) - 1 : 0);
    _mm_mask_storeu_epi8(y + j, static_cast<__mmask16>((1u << rem) - 1), sixteen(j, k0, k1));
  }
}
#endif

// m rows of n columns (acc rows lda apart, y rows ldy apart), the variant chosen once.
template <class T>
void requantize_typed(const IgemmRequant& r, const int32_t* acc, int64_t lda, int64_t m, int64_t n,
                      T* y, int64_t ldy) {
  auto run = [&]<bool kPerCol, bool kBias>() {
    for (int64_t i = 0; i < m; ++i) {
#if defined(PTO_ISA_AVX512)
      requantize_vec<T, kPerCol, kBias>(r, acc + i * lda, n, y + i * ldy);
#else
      requantize_loop<T, kPerCol, kBias>(r, acc + i * lda, n, y + i * ldy);
#endif
    }
  };
  if (r.mult_per_col)
    r.bias ? run.template operator()<true, true>() : run.template operator()<true, false>();
  else
    r.bias ? run.template operator()<false, true>() : run.template operator()<false, false>();
}

}  // namespace

void igemm_requantize(const IgemmRequant& r, const int32_t* acc, int64_t lda, int64_t m, int64_t n,
                      void* y, int64_t ldy) {
  if (r.c_signed)
    requantize_typed(r, acc, lda, m, n, static_cast<int8_t*>(y), ldy);
  else
    requantize_typed(r, acc, lda, m, n, static_cast<uint8_t*>(y), ldy);
}

void igemm_block(int64_t* mr, int64_t* nr) {
  *mr = kMR;
  *nr = kNR;
}

void igemm_macro(const IgemmBlock& blk) {
  static const MicroTable table;
  const auto& fn = table.fn[blk.vnni ? 1 : 0];
  const int64_t np = (blk.n + kNR - 1) / kNR, mp = (blk.m + kMR - 1) / kMR;
  const int64_t as = blk.a_panel_stride ? blk.a_panel_stride : blk.k4 * kMR * 4;
  for (int64_t j = 0; j < np; ++j) {
    const int nj = static_cast<int>(blk.n - j * kNR < kNR ? blk.n - j * kNR : kNR);
    const int nv = (nj + kL - 1) / kL;
    const int n_last = nj - (nv - 1) * kL;
    const int8_t* bp = blk.b + (j * kNR / 16) * blk.b_stride;
    // Row panel q < 4 fetches the next columns' 16-column panel q, read from memory otherwise (a
    // weight is used once per model run): the hardware prefetcher follows a panel only once it is
    // read. Not below 4 row panels, where the fetches would add to the loads of a kernel bound by
    // them (M = 1 with B in cache, all from the first row panel: 285 -> 175 GOPS).
    auto panels = [](int64_t cols) {
      return static_cast<int>((cols < kNR ? cols : kNR) + 15) / 16;
    };
    const int next_panels = mp < 4       ? 0
                            : j + 1 < np ? panels(blk.n - (j + 1) * kNR)
                                         : panels(blk.next_cols);
    const int8_t* next = next_panels ? bp + kNR / 16 * blk.b_stride : bp;
    for (int64_t i = 0; i < mp; ++i) {
      const int mi = static_cast<int>(blk.m - i * kMR < kMR ? blk.m - i * kMR : kMR);
      const bool acc = blk.accumulate;
      const bool fetch = i < next_panels;
      fn[fetch][mi - 1][nv - 1](
          blk.k4, blk.a + i * as, bp, blk.b_stride, acc ? nullptr : blk.rowsum + i * kMR,
          acc ? nullptr : blk.alpha + i * kMR, acc ? nullptr : blk.beta + j * kNR,
          acc ? nullptr : blk.cs2 + j * kNR, blk.c + i * kMR * blk.ldc + j * kNR, blk.ldc, n_last,
          blk.accumulate, next + (fetch ? i * blk.b_stride : 0), fetch ? 1 : 0);
    }
  }
}

}  // namespace pto::cpu::PTO_ISA_NS
