// transpose_strip_4 for one ISA (see transpose.h): 8x8 register transposes with AVX2 shuffles
// (also under AVX-512, where 16x16 gains nothing on a copy bound by memory), scalar elsewhere and
// on the edges. Shuffles move bits untouched, so any 4-byte type (NaN payloads too) is exact.
#pragma once

#include <cstdint>

#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
#include <immintrin.h>
#endif

#include "transpose.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

// The scalar loop for a rows x cols corner (a block, or the edge of the strip).
inline void transpose_scalar(const uint32_t* src, int64_t src_ld, uint32_t* dst, int64_t dst_ld,
                             int64_t rows, int64_t cols) {
  for (int64_t b = 0; b < cols; ++b)
    for (int64_t a = 0; a < rows; ++a) dst[a * dst_ld + b] = src[a + b * src_ld];
}

#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
constexpr int64_t kBlock = 8;

inline void transpose_8x8(const uint32_t* src, int64_t src_ld, uint32_t* dst, int64_t dst_ld) {
  const auto* s = reinterpret_cast<const float*>(src);
  auto* d = reinterpret_cast<float*>(dst);
  __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + src_ld);
  __m256 r2 = _mm256_loadu_ps(s + 2 * src_ld), r3 = _mm256_loadu_ps(s + 3 * src_ld);
  __m256 r4 = _mm256_loadu_ps(s + 4 * src_ld), r5 = _mm256_loadu_ps(s + 5 * src_ld);
  __m256 r6 = _mm256_loadu_ps(s + 6 * src_ld), r7 = _mm256_loadu_ps(s + 7 * src_ld);
  __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(d + dst_ld, _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(d + 2 * dst_ld, _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(d + 3 * dst_ld, _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(d + 4 * dst_ld, _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(d + 5 * dst_ld, _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(d + 6 * dst_ld, _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(d + 7 * dst_ld, _mm256_permute2f128_ps(u3, u7, 0x31));
}
#else
constexpr int64_t kBlock = 16;
#endif

}  // namespace

void transpose_strip_4(const uint32_t* src, int64_t src_ld, uint32_t* dst, int64_t dst_ld,
                       int64_t rows, int64_t cols) {
  for (int64_t b = 0; b < cols; b += kBlock) {
    const int64_t nb = cols - b < kBlock ? cols - b : kBlock;
    for (int64_t a = 0; a < rows; a += kBlock) {
      const int64_t na = rows - a < kBlock ? rows - a : kBlock;
      const uint32_t* s = src + a + b * src_ld;
      uint32_t* d = dst + a * dst_ld + b;
#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
      if (na == kBlock && nb == kBlock) {
        transpose_8x8(s, src_ld, d, dst_ld);
        continue;
      }
#endif
      transpose_scalar(s, src_ld, d, dst_ld, na, nb);
    }
  }
}

}  // namespace pto::cpu::PTO_ISA_NS
