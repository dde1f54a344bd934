// The per-ISA inner loops of the CPU Attention kernel (attention_impl.h, compiled once per ISA),
// which attention.cpp drives.
#pragma once

#include <cstdint>

#include "backend/cpu/isa/isa.h"

namespace pto::cpu {

// One chunk of n keys, from key0, of the online softmax for `rows` rows of scores (row r at
// s + r * ld, already scaled). For each row: the scores are soft-capped (s = softcap
// tanh(s / softcap), when softcap > 0), the mask row is added (mask[r] + key0 is the chunk's
// first key; no mask when null), keys from limit[r] on are hidden (causal; none when null),
// then with m_new = max(m, the visible scores): s becomes exp(s - m_new) (0 for hidden keys),
// corr = exp(m - m_new) the factor that rescales what the row summed so far, l = l * corr +
// sum(s), m = m_new. A row with no visible key so far (m_new = -inf) gets s = 0 and corr = 1.
struct SoftmaxChunk {
  float* s = nullptr;
  int64_t ld = 0, rows = 0, n = 0, key0 = 0;
  const float* const* mask = nullptr;
  const int64_t* limit = nullptr;
  float *m = nullptr, *l = nullptr, *corr = nullptr;
  float softcap = 0.0f;
};

// The most rows of Q a decode task holds (query positions x heads of the group): the decode
// kernel keeps one accumulator register per row.
constexpr int64_t kDecodeRows = 8;

// One chunk of the decode kernel (no packing, for at most kDecodeRows rows): the scores of the
// chunk's keys, s[r * sm.ld + j] = scale * q[r] . k[j] (q rows d floats apart, K rows ldk apart,
// every K row read once for all rows), then the online softmax of `sm` on them (sm.s is the
// score buffer, sm.n keys from sm.key0), then o[r] = o[r] * corr[r] + sum_j s[r, j] v[j] (o rows
// dv apart, V rows ldv apart).
struct DecodeChunk {
  SoftmaxChunk sm;
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t d = 0, dv = 0, ldk = 0, ldv = 0;
  float scale = 1.0f;
  float* o = nullptr;
};

PTO_ISA_DECLARE(void attention_softmax_chunk(const SoftmaxChunk& c);
                void attention_decode_chunk(const DecodeChunk& c);
                // y[r] = a[r] * scale[r] + b[r] for `rows` rows of n (b may be null; y may be a).
                void attention_scale_rows(float* y, int64_t ldy, const float* a, int64_t lda,
                                          const float* scale, const float* b, int64_t ldb,
                                          int64_t rows, int64_t n);)

}  // namespace pto::cpu
