// Mean/variance and the normalizing affine maps for one ISA (included by norm_avx512.cpp,
// norm_avx2.cpp, norm_generic.cpp). Statistics are taken of x - x[0], exact for data clustered
// far from 0, and the mean is kept as that shift plus a small float so (x - shift) - mean loses
// nothing to the mean's rounding; variance takes a second pass over the centred values, as the
// reference does, rather than E[x^2] - E[x]^2, which cancels when the mean is large.
#pragma once

#include "backend/cpu/reduce_kernels.h"
#include "backend/cpu/reduce_simd.h"

namespace pto::cpu::PTO_ISA_NS {

// Sum of term(x[j]) over j < n: vectors summed in blocks of 4096 elements whose sums are added at
// the end of each block (so the error grows with n / 4096, not n, even with one lane); the lanes
// of the last partial vector past n are masked out.
template <class Term>
float block_sum(const float* x, int64_t n, Term term) {
  constexpr int64_t L = Vec::kLanes, kBlock = 4096;
  Vec total = Vec::zero();
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = b + kBlock < n ? b + kBlock : n;
    Vec s0 = Vec::zero(), s1 = Vec::zero();
    int64_t j = b;
    for (; j + 2 * L <= e; j += 2 * L) {
      s0 = s0 + term(Vec::load(x + j));
      s1 = s1 + term(Vec::load(x + j + L));
    }
    for (; j < e; j += L) {
      const int k = lanes_left(e, j);
      const Vec t = term(Vec::load(x + j, k));
      s1 = s1 + select(first_lanes(k), t, Vec::zero());
    }
    total = total + (s0 + s1);
  }
  return sum_lanes(total);
}

void moments(const float* x, int64_t n, float* shift, float* mean, float* var) {
  const float x0 = x[0];
  const Vec sh = Vec::set1(x0);
  const float m = block_sum(x, n, [&](Vec v) { return v - sh; }) / static_cast<float>(n);
  const Vec mv = Vec::set1(m);
  const float q = block_sum(x, n, [&](Vec v) {
    const Vec d = v - sh - mv;
    return d * d;
  });
  *shift = x0;
  *mean = m;
  *var = q / static_cast<float>(n);
}

float mean_square(const float* x, int64_t n) {
  return block_sum(x, n, [](Vec v) { return v * v; }) / static_cast<float>(n);
}

void normalize(const float* x, float* y, int64_t n, float shift, float mean, float a, float b) {
  const Vec sh = Vec::set1(shift), m = Vec::set1(mean), av = Vec::set1(a), bv = Vec::set1(b);
  for (int64_t j = 0; j < n; j += Vec::kLanes) {
    const int k = lanes_left(n, j);
    fma(Vec::load(x + j, k) - sh - m, av, bv).store(y + j, k);
  }
}

void normalize_affine(const float* x, float* y, int64_t n, float shift, float mean, float inv_std,
                      const float* scale, const float* bias, bool stream, bool fence,
                      const float* next) {
  const Vec sh = Vec::set1(shift), m = Vec::set1(mean), inv = Vec::set1(inv_std);
  store_vectors(y, n, stream, [&](int64_t j, int k) {
    if (next) __builtin_prefetch(next + j, 0, 2);  // a line per vector (two under AVX2)
    const Vec t = (Vec::load(x + j, k) - sh - m) * inv;
    const Vec b = bias ? Vec::load(bias + j, k) : Vec::zero();
    return fma(t, Vec::load(scale + j, k), b);
  });
  if (stream && fence) stream_fence();
}

}  // namespace pto::cpu::PTO_ISA_NS
