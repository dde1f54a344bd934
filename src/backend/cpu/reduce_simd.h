// Small vector helpers shared by reduce_impl.h, norm_impl.h and pool_impl.h (per-ISA units only).
#pragma once

#include "backend/cpu/isa/simd.h"

// GCC 12 reports the self-initialized `__Y` inside its AVX-512 intrinsics (_mm512_max_ps,
// _mm512_reduce_add_ps, ...) as possibly uninitialized once they are inlined into our loops; the
// warning is spurious. This header is included only by the per-ISA units of this kernel family.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace pto::cpu::PTO_ISA_NS {

// Lanes left from j to n, at most one vector: the `n` of a masked load or store.
inline int lanes_left(int64_t n, int64_t j) {
  return static_cast<int>(n - j < Vec::kLanes ? n - j : Vec::kLanes);
}

// Lane i holds i.
inline Vec lane_index() {
  static const float kLane[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return Vec::load(kLane);
}

// A mask of the first n lanes (0 <= n <= kLanes).
inline Mask first_lanes(int64_t n) {
  return lane_index() < Vec::set1(static_cast<float>(n));
}

// The first n elements of p in a vector, the other lanes `fill`.
inline Vec load_padded(const float* p, int64_t n, float fill) {
  return select(first_lanes(n), Vec::load(p, static_cast<int>(n)), Vec::set1(fill));
}

// The sum of the lanes, in lane order.
inline float sum_lanes(Vec v) {
  float lanes[Vec::kLanes];
  v.store(lanes);
  float s = 0;
  for (int k = 0; k < Vec::kLanes; ++k) s += lanes[k];
  return s;
}

}  // namespace pto::cpu::PTO_ISA_NS
