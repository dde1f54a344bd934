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
    for (int64_t i = 0; i < n; ++i) d[i] = s[i * stride];
  }
}

}  // namespace
}  // namespace pto::cpu::PTO_ISA_NS
