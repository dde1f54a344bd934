// Mean/variance and the normalizing affine maps for one ISA (included by norm_avx512.cpp,
// norm_avx2.cpp, norm_generic.cpp). Variance takes a second pass over (x - mean), as the
// reference does, rather than E[x^2] - E[x]^2, which cancels when the mean is large.
#pragma once

#include "backend/cpu/reduce_kernels.h"
#include "backend/cpu/reduce_simd.h"

namespace pto::cpu::PTO_ISA_NS {

void moments(const float* x, int64_t n, float* mean, float* var) {
  constexpr int64_t L = Vec::kLanes;
  Vec s0 = Vec::zero(), s1 = Vec::zero();
  int64_t j = 0;
  for (; j + 2 * L <= n; j += 2 * L) {
    s0 = s0 + Vec::load(x + j);
    s1 = s1 + Vec::load(x + j + L);
  }
  for (; j < n; j += L) s0 = s0 + Vec::load(x + j, lanes_left(n, j));  // zeros past the end
  const float m = sum_lanes(s0 + s1) / static_cast<float>(n);
  const Vec mv = Vec::set1(m);
  Vec q0 = Vec::zero(), q1 = Vec::zero();
  for (j = 0; j + 2 * L <= n; j += 2 * L) {
    const Vec d0 = Vec::load(x + j) - mv, d1 = Vec::load(x + j + L) - mv;
    q0 = fma(d0, d0, q0);
    q1 = fma(d1, d1, q1);
  }
  for (; j < n; j += L) {
    const Vec d = load_padded(x + j, n - j, m) - mv;  // the mean adds nothing
    q0 = fma(d, d, q0);
  }
  *mean = m;
  *var = sum_lanes(q0 + q1) / static_cast<float>(n);
}

void normalize(const float* x, float* y, int64_t n, float mean, float a, float b) {
  const Vec m = Vec::set1(mean), av = Vec::set1(a), bv = Vec::set1(b);
  for (int64_t j = 0; j < n; j += Vec::kLanes) {
    const int k = lanes_left(n, j);
    fma(Vec::load(x + j, k) - m, av, bv).store(y + j, k);
  }
}

void normalize_affine(const float* x, float* y, int64_t n, float mean, float inv_std,
                      const float* scale, const float* bias) {
  const Vec m = Vec::set1(mean), inv = Vec::set1(inv_std);
  for (int64_t j = 0; j < n; j += Vec::kLanes) {
    const int k = lanes_left(n, j);
    const Vec t = (Vec::load(x + j, k) - m) * inv;
    const Vec b = bias ? Vec::load(bias + j, k) : Vec::zero();
    fma(t, Vec::load(scale + j, k), b).store(y + j, k);
  }
}

}  // namespace pto::cpu::PTO_ISA_NS
