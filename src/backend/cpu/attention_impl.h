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
  const bool cap = c.softcap > 0.0f;
  const Vec cap_v = Vec::set1(c.softcap), inv_cap = Vec::set1(1.0f / c.softcap);
  for (int64_t r = 0; r < c.rows; ++r) {
    float* s = c.s + r * c.ld;
    const float* mask = c.mask ? c.mask[r] + c.key0 : nullptr;
    const int64_t v = c.limit ? std::clamp<int64_t>(c.limit[r] - c.key0, 0, c.n) : c.n;
    // The capped and masked scores and their max over the visible keys: whole vectors first
    // (plain loads, four running maxima), then the last part vector.
    Vec mx = neg_inf, mx1 = neg_inf, mx2 = neg_inf, mx3 = neg_inf;
    int64_t j = 0;
    if (!cap && !mask) {
      for (; j + 4 * L <= v; j += 4 * L) {
        mx = max(mx, Vec::load(s + j));
        mx1 = max(mx1, Vec::load(s + j + L));
        mx2 = max(mx2, Vec::load(s + j + 2 * L));
        mx3 = max(mx3, Vec::load(s + j + 3 * L));
      }
    }
    for (; j < v; j += L) {
      const int n = lanes_left(v, j);
      Vec x = n == L ? Vec::load(s + j) : Vec::load(s + j, n);
      if (cap) x = cap_v * tanh(x * inv_cap);
      if (mask) x = x + (n == L ? Vec::load(mask + j) : Vec::load(mask + j, n));
      if (cap || mask) x.store(s + j, n);
      mx = max(mx, n == L ? x : select(first_lanes(n), x, neg_inf));
    }
    float lanes[L];
    max(max(mx, mx1), max(mx2, mx3)).store(lanes);
    float m_new = c.m[r];  // NaN lanes skipped: their exps make the row's output NaN
    for (int64_t k = 0; k < L; ++k) m_new = std::max(m_new, lanes[k]);
    // Nothing visible yet: no contribution, nothing to rescale. Unless a score is NaN (a NaN
    // in the query, say: every score of the row is), which makes the row NaN as softmax does;
    // the max above may have dropped it (VMAXPS returns its second operand on NaN).
    if (m_new == -INFINITY && std::none_of(s, s + v, [](float x) { return std::isnan(x); })) {
      std::fill_n(s, c.n, 0.0f);
      c.corr[r] = 1.0f;
      continue;
    }
    // exp(s - m) <= 1 (or NaN), in place, and its sum.
    const Vec m = Vec::set1(m_new);
    Vec sum = Vec::zero(), sum1 = Vec::zero();
    for (j = 0; j + 2 * L <= v; j += 2 * L) {
      const Vec e0 = exp<false>(Vec::load(s + j) - m), e1 = exp<false>(Vec::load(s + j + L) - m);
      e0.store(s + j);
      e1.store(s + j + L);
      sum = sum + e0;
      sum1 = sum1 + e1;
    }
    for (; j < v; j += L) {
      const int n = lanes_left(v, j);
      const Vec e = exp<false>(load_padded(s + j, n, -INFINITY) - m);
      e.store(s + j, n);
      sum = sum + e;
    }
    sum = sum + sum1;
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

// Vector registers of the ISA (the decode kernel's register tiles stay within them).
constexpr int kRegisters = Vec::kLanes == 16 ? 32 : 16;
// Rows of Q the score loop takes at once: their accumulators for 4 keys, the 4 K vectors and a
// Q vector fit the registers.
// Software prefetch in the score loop (the hardware prefetchers alone left one thread at 25-30
// GB/s): the K rows this many keys ahead, and the V rows of the keys being scored, which the
// chunk's P V pass then finds in L2. Measured with `pto bench` on one thread (12 heads of 64 and
// 32 on 8 heads of 128, one query, 4096 keys): 1.9x and 2.4x faster than without; 8, 16, 32 or 64
// keys ahead within noise of each other.
constexpr int64_t kPrefetchKeys = 32;
constexpr int64_t kLineFloats = 16;  // a 64-byte cache line
constexpr int kScoreRows = Vec::kLanes == 16 ? 4 : 2;

// The first n lanes of p (all of them without a masked load when n is a whole vector).
inline Vec load_lanes(const float* p, int n) {
  return n == Vec::kLanes ? Vec::load(p) : Vec::load(p, n);
}

// out[i] = scale * (the sum of the lanes of a[i]) for 4 vectors: a transposing add tree, 3 ops
// a key instead of a whole reduction each.
inline void sum4(const Vec a[4], float scale, float* out) {
#if defined(PTO_ISA_AVX512)
  const __m512 t0 =
      _mm512_add_ps(_mm512_unpacklo_ps(a[0].v, a[1].v), _mm512_unpackhi_ps(a[0].v, a[1].v));
  const __m512 t1 =
      _mm512_add_ps(_mm512_unpacklo_ps(a[2].v, a[3].v), _mm512_unpackhi_ps(a[2].v, a[3].v));
  // Each 128-bit lane: partial sums of a[0..3] in order.
  const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  _mm_storeu_ps(out, _mm_mul_ps(q, _mm_set1_ps(scale)));
#elif defined(PTO_ISA_AVX2)
  const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a[0].v, a[1].v), _mm256_hadd_ps(a[2].v, a[3].v));
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
  _mm_storeu_ps(out, _mm_mul_ps(q, _mm_set1_ps(scale)));
#else
  for (int i = 0; i < 4; ++i) out[i] = reduce_add(a[i]) * scale;
#endif
}

// Scores of R rows from row t0: s[t, j] = scale * q[t] . k[j], 4 keys at a time (independent
// accumulators), each K vector loaded once for the R rows.
template <int R>
void decode_scores_rows(const DecodeChunk& c, int t0) {
  constexpr int64_t L = Vec::kLanes;
  const float* q = c.q + t0 * c.d;
  float* s = c.sm.s + t0 * c.sm.ld;
  int64_t j = 0;
  for (; j + 4 <= c.sm.n; j += 4) {
    const float* k = c.k + j * c.ldk;
    if (t0 == 0) {  // once per key: the K rows ahead, and the V rows the P V pass reads next
      for (int64_t x = 0; x < 4 * c.ldk; x += kLineFloats)
        __builtin_prefetch(k + kPrefetchKeys * c.ldk + x);
      for (int64_t x = 0; x < 4 * c.ldv; x += kLineFloats) __builtin_prefetch(c.v + j * c.ldv + x);
    }
    Vec acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 4; ++i) acc[r][i] = Vec::zero();
    for (int64_t x = 0; x < c.d; x += L) {
      const int n = lanes_left(c.d, x);
      Vec kv[4];
      for (int i = 0; i < 4; ++i) kv[i] = load_lanes(k + i * c.ldk + x, n);
      for (int r = 0; r < R; ++r) {
        const Vec qv = load_lanes(q + r * c.d + x, n);
        for (int i = 0; i < 4; ++i) acc[r][i] = fma(qv, kv[i], acc[r][i]);
      }
    }
    for (int r = 0; r < R; ++r) sum4(acc[r], c.scale, s + r * c.sm.ld + j);
  }
  for (; j < c.sm.n; ++j) {
    const float* k = c.k + j * c.ldk;
    Vec acc[R];
    for (int r = 0; r < R; ++r) acc[r] = Vec::zero();
    for (int64_t x = 0; x < c.d; x += L) {
      const int n = lanes_left(c.d, x);
      const Vec kv = load_lanes(k + x, n);
      for (int r = 0; r < R; ++r) acc[r] = fma(load_lanes(q + r * c.d + x, n), kv, acc[r]);
    }
    for (int r = 0; r < R; ++r) s[r * c.sm.ld + j] = reduce_add(acc[r]) * c.scale;
  }
}

template <int T>
void decode_scores(const DecodeChunk& c) {
  constexpr int R = std::min(T, kScoreRows);
  int t0 = 0;
  for (; t0 + R <= T; t0 += R) decode_scores_rows<R>(c, t0);
  if constexpr (T % R != 0) decode_scores_rows<T % R>(c, t0);
}

// o[t, x0 ..] = o[t, ..] * corr[t] + sum_j s[t, j] v[j, ..] for T rows and NV vectors of the
// row, in registers; the last vector `last` lanes wide. With few accumulators (T x NV < 8) the
// keys go in KU interleaved sets summed at the end, so that enough FMA chains are in flight.
template <int T, int NV>
void decode_accumulate_tile(const DecodeChunk& c, int64_t x0, int last) {
  constexpr int64_t L = Vec::kLanes;
  constexpr int KU = std::clamp(8 / (T * NV), 1, 4);
  constexpr auto lanes = [](int u, int last_lanes) {
    return u == NV - 1 ? last_lanes : static_cast<int>(L);
  };
  Vec acc[KU][T][NV];
  for (int t = 0; t < T; ++t) {
    const Vec corr = Vec::set1(c.sm.corr[t]);
    for (int u = 0; u < NV; ++u) {
      acc[0][t][u] = load_lanes(c.o + t * c.dv + x0 + u * L, lanes(u, last)) * corr;
      for (int k = 1; k < KU; ++k) acc[k][t][u] = Vec::zero();
    }
  }
  const auto step = [&](int k, int64_t j) {
    const float* v = c.v + j * c.ldv + x0;
    Vec vv[NV];
    for (int u = 0; u < NV; ++u) vv[u] = load_lanes(v + u * L, lanes(u, last));
    for (int t = 0; t < T; ++t) {
      const Vec p = Vec::set1(c.sm.s[t * c.sm.ld + j]);
      for (int u = 0; u < NV; ++u) acc[k][t][u] = fma(p, vv[u], acc[k][t][u]);
    }
  };
  int64_t j = 0;
  for (; j + KU <= c.sm.n; j += KU)
    for (int k = 0; k < KU; ++k) step(k, j + k);
  for (; j < c.sm.n; ++j) step(0, j);
  for (int t = 0; t < T; ++t)
    for (int u = 0; u < NV; ++u) {
      for (int k = 1; k < KU; ++k) acc[0][t][u] = acc[0][t][u] + acc[k][t][u];
      acc[0][t][u].store(c.o + t * c.dv + x0 + u * L, lanes(u, last));
    }
}

// The row's vectors from x0 in tiles of NV whole vectors, then NV / 2, ..., 1, then the tail.
template <int T, int NV>
void decode_accumulate(const DecodeChunk& c, int64_t x0) {
  constexpr int64_t L = Vec::kLanes;
  for (; x0 + NV * L <= c.dv; x0 += NV * L) decode_accumulate_tile<T, NV>(c, x0, L);
  if constexpr (NV > 1)
    decode_accumulate<T, NV / 2>(c, x0);
  else if (x0 < c.dv)
    decode_accumulate_tile<T, 1>(c, x0, lanes_left(c.dv, x0));
}

// The largest power of two <= n (n >= 1).
constexpr int floor_pow2(int n) {
  return n < 2 ? 1 : 2 * floor_pow2(n / 2);
}

template <int T>
void decode_chunk(const DecodeChunk& c) {
  // T x NV accumulators and NV vectors of a V row, a broadcast and a spare register.
  constexpr int NV = std::min(8, floor_pow2(std::max(1, (kRegisters - 2) / (T + 1))));
  decode_scores<T>(c);
  attention_softmax_chunk(c.sm);
  decode_accumulate<T, NV>(c, 0);
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
