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
  } else if (stride == 2) {  // a constant stride the compiler vectorises with permutes
    for (int64_t i = 0; i < n; ++i) d[i] = s[2 * i];
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = s[i * stride];
  }
}

}  // namespace
}  // namespace pto::cpu::PTO_ISA_NS
