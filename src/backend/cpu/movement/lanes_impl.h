// gather_lanes_4 for one ISA (see lanes.h). Permutes move bits untouched: any 4-byte type is exact.
#pragma once

#include <cstdint>

#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
#include <immintrin.h>
#endif

#include "lanes.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

void gather_lanes_scalar(const LaneSource* parts, int64_t num_parts, uint32_t* dst, int64_t block,
                         int64_t pixels) {
  for (int64_t p = 0; p < pixels; ++p) {
    uint32_t* out = dst + p * block;
    for (int64_t l = 0; l < block; ++l) out[l] = 0;
    for (int64_t k = 0; k < num_parts; ++k) {
      const LaneSource& s = parts[k];
      const uint32_t* in = s.src + p * block;
      for (int64_t l = 0; l < block; ++l)
        if (s.mask >> l & 1u) out[l] = in[s.lane[l]];
    }
  }
}

}  // namespace

void gather_lanes_4(const LaneSource* parts, int64_t num_parts, uint32_t* dst, int64_t block,
                    int64_t pixels) {
#if defined(PTO_ISA_AVX512)
  if (block == 16 && num_parts <= 16) {
    __m512i index[16];
    for (int64_t k = 0; k < num_parts; ++k) index[k] = _mm512_loadu_si512(parts[k].lane);
    for (int64_t p = 0; p < pixels; ++p) {
      __m512i acc = _mm512_setzero_si512();
      for (int64_t k = 0; k < num_parts; ++k)
        acc = _mm512_mask_permutexvar_epi32(acc, static_cast<__mmask16>(parts[k].mask), index[k],
                                            _mm512_loadu_si512(parts[k].src + p * 16));
      _mm512_storeu_si512(dst + p * 16, acc);
    }
    return;
  }
#endif
#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
  if (block == 8 && num_parts <= 8) {
    __m256i index[8], select[8];
    for (int64_t k = 0; k < num_parts; ++k) {
      index[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(parts[k].lane));
      alignas(32) int32_t m[8];
      for (int l = 0; l < 8; ++l) m[l] = (parts[k].mask >> l & 1u) ? -1 : 0;
      select[k] = _mm256_load_si256(reinterpret_cast<const __m256i*>(m));
    }
    for (int64_t p = 0; p < pixels; ++p) {
      __m256i acc = _mm256_setzero_si256();
      for (int64_t k = 0; k < num_parts; ++k) {
        const __m256i v = _mm256_permutevar8x32_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(parts[k].src + p * 8)), index[k]);
        acc = _mm256_blendv_epi8(acc, v, select[k]);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + p * 8), acc);
    }
    return;
  }
#endif
  gather_lanes_scalar(parts, num_parts, dst, block, pixels);
}

}  // namespace pto::cpu::PTO_ISA_NS
