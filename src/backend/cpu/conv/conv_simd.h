// Row helpers shared by the per-ISA conv kernels (conv_depthwise_impl.h, conv_im2col_impl.h):
// vector copies and zero fills with masked tails, and the valid range of a strided window.
#pragma once

#include <cstdint>

#include "backend/cpu/isa/simd.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

// The indices i in [lo, hi) for which i * stride + offset lies in [0, limit), as [*vlo, *vhi).
inline void valid_span(int64_t lo, int64_t hi, int64_t limit, int64_t stride, int64_t offset,
                       int64_t* vlo, int64_t* vhi) {
  const int64_t a = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t b = limit - offset <= 0 ? 0 : (limit - 1 - offset) / stride + 1;
  *vlo = a < lo ? lo : (a > hi ? hi : a);
  *vhi = b < *vlo ? *vlo : (b > hi ? hi : b);
}

inline void fill_zero(float* d, int64_t n) {
  constexpr int V = Vec::kLanes;
  int64_t i = 0;
  for (; i + V <= n; i += V) Vec::zero().store(d + i);
  if (i < n) Vec::zero().store(d + i, static_cast<int>(n - i));
}

#if defined(PTO_ISA_AVX512)
// n floats from p as a vector (n <= 0: zeros; n >= 16: a plain load).
inline __m512 load_first(const float* p, int64_t n) {
  if (n >= 16) return _mm512_loadu_ps(p);
  if (n <= 0) return _mm512_setzero_ps();
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
}

// d[i] = s[i * S] for 3 <= S <= 8, 16 outputs a step: output lane l reads input l * S, which
// lies in pair q = l * S / 32 of input vectors (32 floats from 32 q); one two-source permute a
// pair brings its lanes into place and a masked move keeps them. The loads stop at the last
// input a step uses, the stores at n.
template <int S>
void copy_stride(float* d, const float* s, int64_t n) {
  constexpr int kPairs = 15 * S / 32 + 1;
  struct Lanes {
    alignas(64) int32_t idx[kPairs][16] = {};
    uint16_t take[kPairs] = {};
    constexpr Lanes() {
      for (int l = 0; l < 16; ++l) {
        idx[l * S / 32][l] = l * S % 32;
        take[l * S / 32] = static_cast<uint16_t>(take[l * S / 32] | (1u << l));
      }
    }
  };
  static constexpr Lanes kLanes{};
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t m = n - i < 16 ? n - i : 16, span = (m - 1) * S + 1;
    const float* src = s + i * S;
    __m512 out = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int q = 0; q < kPairs; ++q) {
      const __m512 lo = load_first(src + 32 * q, span - 32 * q);
      const __m512 hi = load_first(src + 32 * q + 16, span - 32 * q - 16);
      out = _mm512_mask_mov_ps(out, kLanes.take[q],
                               _mm512_permutex2var_ps(lo, _mm512_load_si512(kLanes.idx[q]), hi));
    }
    if (m == 16)
      _mm512_storeu_ps(d + i, out);
    else
      _mm512_mask_storeu_ps(d + i, static_cast<__mmask16>((1u << m) - 1), out);
  }
}
#endif

// d[i] = s[i * stride] for i in [0, n).
inline void copy_strided(float* d, const float* s, int64_t n, int64_t stride) {
  constexpr int V = Vec::kLanes;
  if (stride == 1) {
    int64_t i = 0;
    for (; i + V <= n; i += V) Vec::load(s + i).store(d + i);
    if (i < n) Vec::load(s + i, static_cast<int>(n - i)).store(d + i, static_cast<int>(n - i));
  } else if (stride == 2) {
    // V outputs from 2V inputs: the even lanes of each half moved into place by one permute
    // (lane k reads lane 2k mod V) and the halves blended. GCC left the plain loop scalar for
    // the short rows depthwise convs pad (24 columns: 6 instructions an element). The second
    // load stops one float short: the odd element past the last one read may not exist.
    static const float kLane[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    static const float kEven[16] = {0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14};
    const VecI idx = to_int(Vec::load(kEven));  // 2k, read mod V
    const Mask low = Vec::load(kLane) < Vec::set1(static_cast<float>(V / 2));
    int64_t i = 0;
    if constexpr (V > 1)
      for (; i + V <= n; i += V) {
        const Vec lo = Vec::load(s + 2 * i), hi = Vec::load(s + 2 * i + V, V - 1);
        select(low, permute(lo, idx), permute(hi, idx)).store(d + i);
      }
    for (; i < n; ++i) d[i] = s[2 * i];
  } else {
#if defined(PTO_ISA_AVX512)
    // Stride 3..8 (patch-embedding and stem convs: 4x4/4, 7x7/4): two-source permutes
    // instead of 16 scalar copies: Conv 3 -> 16, 7x7/4 at 224 324 -> 281 us, 3 -> 64, 4x4/4
    // 262 -> 250 us (1 thread, Zen 4; onnxruntime 148 and 205: the im2col is still half).
    switch (stride) {
      case 3:
        return copy_stride<3>(d, s, n);
      case 4:
        return copy_stride<4>(d, s, n);
      case 5:
        return copy_stride<5>(d, s, n);
      case 6:
        return copy_stride<6>(d, s, n);
      case 7:
        return copy_stride<7>(d, s, n);
      case 8:
        return copy_stride<8>(d, s, n);
      default:
        break;
    }
#endif
    for (int64_t i = 0; i < n; ++i) d[i] = s[i * stride];
  }
}

}  // namespace
}  // namespace pto::cpu::PTO_ISA_NS
