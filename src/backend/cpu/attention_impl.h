// The vector loops of the CPU Attention kernel for one ISA (included by attention_avx512.cpp,
// attention_avx2.cpp, attention_generic.cpp): the online-softmax step on one chunk of scores, the
// row rescaling of the output accumulator, and the decode kernel's chunk (scores, softmax, P V for
// a few rows without packing).
#pragma once

#include <algorithm>
#include <cmath>

#include "backend/cpu/attention_kernels.h"
#include "backend/cpu/isa/vmath.h"
#include "backend/cpu/reduce_simd.h"
#include "pto/error.h"

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

namespace {

// Accumulator registers the decode kernel's P V tile may hold (of 32 on AVX-512, 16 on AVX2).
constexpr int kDecodeAccumulators = Vec::kLanes == 8 ? 8 : 16;

// The first n lanes of p (all of them without a masked load when n is a whole vector).
inline Vec load_lanes(const float* p, int n) {
  return n == Vec::kLanes ? Vec::load(p) : Vec::load(p, n);
}

// s[t, j] = scale * q[t] . k[j] for T rows: each K row is loaded once for all T rows.
template <int T>
void decode_scores(const DecodeChunk& c) {
  constexpr int64_t L = Vec::kLanes;
  for (int64_t j = 0; j < c.sm.n; ++j) {
    const float* k = c.k + j * c.ldk;
    Vec acc[T];
    for (int t = 0; t < T; ++t) acc[t] = Vec::zero();
    for (int64_t x = 0; x < c.d; x += L) {
      const int n = lanes_left(c.d, x);
      const Vec kv = load_lanes(k + x, n);
      for (int t = 0; t < T; ++t) acc[t] = fma(load_lanes(c.q + t * c.d + x, n), kv, acc[t]);
    }
    for (int t = 0; t < T; ++t) c.sm.s[t * c.sm.ld + j] = reduce_add(acc[t]) * c.scale;
  }
}

// o[t, x0 .. x0 + lanes) = o[t, ..] * corr[t] + sum_j s[t, j] v[j, ..] for T rows, in registers
// (NV vectors per row; `nv` <= NV of them used, the last one `last` lanes wide).
template <int T, int NV>
void decode_accumulate_tile(const DecodeChunk& c, int64_t x0, int nv, int last) {
  constexpr int64_t L = Vec::kLanes;
  const auto lanes = [&](int u) { return u == nv - 1 ? last : static_cast<int>(L); };
  Vec acc[T][NV];
  for (int t = 0; t < T; ++t) {
    const Vec corr = Vec::set1(c.sm.corr[t]);
    for (int u = 0; u < NV; ++u)
      if (u < nv) acc[t][u] = load_lanes(c.o + t * c.dv + x0 + u * L, lanes(u)) * corr;
  }
  for (int64_t j = 0; j < c.sm.n; ++j) {
    const float* v = c.v + j * c.ldv + x0;
    Vec vv[NV];
    for (int u = 0; u < NV; ++u)
      if (u < nv) vv[u] = load_lanes(v + u * L, lanes(u));
    for (int t = 0; t < T; ++t) {
      const Vec p = Vec::set1(c.sm.s[t * c.sm.ld + j]);
      for (int u = 0; u < NV; ++u)
        if (u < nv) acc[t][u] = fma(p, vv[u], acc[t][u]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int u = 0; u < NV; ++u)
      if (u < nv) acc[t][u].store(c.o + t * c.dv + x0 + u * L, lanes(u));
}

template <int T>
void decode_chunk(const DecodeChunk& c) {
  constexpr int64_t L = Vec::kLanes;
  constexpr int NV = std::max(1, kDecodeAccumulators / T);
  decode_scores<T>(c);
  attention_softmax_chunk(c.sm);
  for (int64_t x0 = 0; x0 < c.dv; x0 += NV * L) {
    const int64_t left = c.dv - x0;
    const int nv = static_cast<int>(std::min<int64_t>(NV, (left + L - 1) / L));
    decode_accumulate_tile<T, NV>(c, x0, nv, lanes_left(left, (nv - 1) * L));
  }
}

}  // namespace

void attention_decode_chunk(const DecodeChunk& c) {
  static_assert(kDecodeRows == 8);
  switch (c.sm.rows) {
    case 1:
      return decode_chunk<1>(c);
    case 2:
      return decode_chunk<2>(c);
    case 3:
      return decode_chunk<3>(c);
    case 4:
      return decode_chunk<4>(c);
    case 5:
      return decode_chunk<5>(c);
    case 6:
      return decode_chunk<6>(c);
    case 7:
      return decode_chunk<7>(c);
    case 8:
      return decode_chunk<8>(c);
    default:
      PTO_CHECK(false) << "attention decode: " << c.sm.rows << " rows";
  }
}

}  // namespace pto::cpu::PTO_ISA_NS
