// The vector loops of the CPU Attention kernel for one ISA (included by attention_avx512.cpp,
// attention_avx2.cpp, attention_generic.cpp): the online-softmax step on one chunk of scores and
// the row rescaling of the output accumulator.
#pragma once

#include <algorithm>
#include <cmath>

#include "backend/cpu/attention_kernels.h"
#include "backend/cpu/isa/vmath.h"
#include "backend/cpu/reduce_simd.h"

namespace pto::cpu::PTO_ISA_NS {

void attention_softmax_chunk(const SoftmaxChunk& c) {
  constexpr int64_t L = Vec::kLanes;
  const Vec neg_inf = Vec::set1(-INFINITY);
  for (int64_t r = 0; r < c.rows; ++r) {
    float* s = c.s + r * c.ld;
    const float* mask = c.mask ? c.mask[r] + c.key0 : nullptr;
    const int64_t v = c.limit ? std::clamp<int64_t>(c.limit[r] - c.key0, 0, c.n) : c.n;
    // The masked scores and their max over the visible keys.
    Vec mx = neg_inf;
    for (int64_t j = 0; j < v; j += L) {
      const int n = lanes_left(v, j);
      Vec x = Vec::load(s + j, n);
      if (mask) {
        x = x + Vec::load(mask + j, n);
        x.store(s + j, n);
      }
      mx = max(mx, select(first_lanes(n), x, neg_inf));
    }
    float lanes[L];
    mx.store(lanes);
    float m_new = c.m[r];
    for (int64_t k = 0; k < L; ++k) m_new = std::max(m_new, lanes[k]);
    if (m_new == -INFINITY) {  // nothing visible yet: no contribution, nothing to rescale
      std::fill_n(s, c.n, 0.0f);
      c.corr[r] = 1.0f;
      continue;
    }
    const Vec m = Vec::set1(m_new);
    Vec sum = Vec::zero();
    for (int64_t j = 0; j < v; j += L) {
      const int n = lanes_left(v, j);
      const Vec e = exp(load_padded(s + j, n, -INFINITY) - m);
      e.store(s + j, n);
      sum = sum + e;
    }
    std::fill(s + v, s + c.n, 0.0f);
    // exp(-inf - m_new) = 0 on the first chunk that sees a key: O and l start from zero.
    const float corr = c.m[r] == m_new ? 1.0f : std::exp(c.m[r] - m_new);
    c.corr[r] = corr;
    c.l[r] = c.l[r] * corr + sum_lanes(sum);
    c.m[r] = m_new;
  }
}

void attention_scale_rows(float* y, int64_t ldy, const float* a, int64_t lda, const float* scale,
                          const float* b, int64_t ldb, int64_t rows, int64_t n) {
  constexpr int64_t L = Vec::kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    const Vec k = Vec::set1(scale[r]);
    for (int64_t j = 0; j < n; j += L) {
      const int w = lanes_left(n, j);
      const Vec x = Vec::load(a + r * lda + j, w) * k;
      (b ? x + Vec::load(b + r * ldb + j, w) : x).store(y + r * ldy + j, w);
    }
  }
}

}  // namespace pto::cpu::PTO_ISA_NS
