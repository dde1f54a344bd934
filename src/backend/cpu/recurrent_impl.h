// The per-step vector code of the CPU RNN, GRU and LSTM for one ISA (included by
// recurrent_avx512.cpp, recurrent_avx2.cpp, recurrent_generic.cpp; see recurrent_kernels.h).
#pragma once

#include <algorithm>

#include "backend/cpu/isa/vmath.h"
#include "backend/cpu/recurrent_kernels.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

constexpr int64_t L = Vec::kLanes;

inline int tail(int64_t n, int64_t j) {
  return n - j < L ? static_cast<int>(n - j) : static_cast<int>(L);
}

// n lanes at p: whole vectors without a mask (masked moves are slow on AMD, and a masked store
// does not forward to the next load).
inline Vec load(const float* p, int n) {
  return n == L ? Vec::load(p) : Vec::load(p, n);
}
inline void store(Vec v, float* p, int n) {
  if (n == L)
    v.store(p);
  else
    v.store(p, n);
}

// Rows of `R` at once, columns two vectors at a time within a panel: each k loads two vectors
// of the panel and broadcasts one h per row, so the panel is read once for all the rows.
template <int R>
void matvec_rows(const float* h, int64_t ldh, int64_t k, const float* panels, const float* bias,
                 float* out, int64_t ldo, int64_t n) {
  constexpr int64_t W = kRecurrentPanel;
  for (int64_t j = 0; j < n; j += 2 * L) {
    const float* panel = panels + j / W * k * W + j % W;
    const int n0 = tail(n, j), n1 = j + L < n ? tail(n, j + L) : 0;
    Vec acc[R][2];
    const Vec b0 = bias ? load(bias + j, n0) : Vec::zero();
    const Vec b1 = bias && n1 ? load(bias + j + L, n1) : Vec::zero();
    for (int r = 0; r < R; ++r) acc[r][0] = b0, acc[r][1] = b1;
    for (int64_t q = 0; q < k; ++q) {  // panels are zero-padded: whole vectors are safe
      const Vec w0 = Vec::load(panel + q * W), w1 = Vec::load(panel + q * W + L);
      for (int r = 0; r < R; ++r) {
        const Vec x = Vec::set1(h[r * ldh + q]);
        acc[r][0] = fma(x, w0, acc[r][0]);
        acc[r][1] = fma(x, w1, acc[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) {
      store(acc[r][0], out + r * ldo + j, n0);
      if (n1) store(acc[r][1], out + r * ldo + j + L, n1);
    }
  }
}

// The last `rows` (< R + 1) rows: matvec_rows<rows>.
template <int R>
void matvec_tail(int rows, const float* h, int64_t ldh, int64_t k, const float* panels,
                 const float* bias, float* out, int64_t ldo, int64_t n) {
  if constexpr (R > 0) {
    if (rows == R) return matvec_rows<R>(h, ldh, k, panels, bias, out, ldo, n);
    matvec_tail<R - 1>(rows, h, ldh, k, panels, bias, out, ldo, n);
  }
}

// The activation's input clamped to [-clip, clip], NaN kept (as std::clamp in the reference).
inline Vec clamp(const CellRow& c, Vec v) {
  if (!c.clip) return v;
  const Vec lim = Vec::set1(c.clip_value);
  return select(is_nan(v), v, min(max(v, -lim), lim));
}

inline Vec gate(const CellRow& c, int g, int64_t j, int n) {
  const int64_t at = g * c.hidden + j;
  return clamp(c, load(c.gx + at, n) + load(c.gh + at, n));
}

}  // namespace

void recurrent_matvec(const float* h, int64_t ldh, int64_t rows, int64_t k, const float* panels,
                      const float* bias, float* out, int64_t ldo, int64_t n) {
  // As many rows as the registers hold accumulators for (2 per row, 32 AVX-512 registers, 16
  // AVX2): more rows per pass of the panels, fewer passes.
  constexpr int kRows = L >= 16 ? 8 : 4;
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows)
    matvec_rows<kRows>(h + r * ldh, ldh, k, panels, bias, out + r * ldo, ldo, n);
  if (r < rows)
    matvec_tail<kRows - 1>(static_cast<int>(rows - r), h + r * ldh, ldh, k, panels, bias,
                           out + r * ldo, ldo, n);
}

void rnn_cell(const CellRow& c, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; j += L) {
    const int n = tail(j1, j);
    store(tanh(gate(c, 0, j, n)), c.h + j, n);
  }
}

void gru_cell(const CellRow& c, int64_t j0, int64_t j1) {
  const int64_t H = c.hidden;
  for (int64_t j = j0; j < j1; j += L) {
    const int n = tail(j1, j);
    const Vec z = sigmoid(gate(c, 0, j, n));
    const Vec gh = load(c.gh + 2 * H + j, n);
    const Vec hh = c.reset_applied ? gh : sigmoid(gate(c, 1, j, n)) * gh;
    const Vec cand = tanh(clamp(c, load(c.gx + 2 * H + j, n) + hh));
    const Vec hp = load(c.h_prev + j, n);
    store((Vec::set1(1.0f) - z) * cand + z * hp, c.h + j, n);
  }
}

void gru_reset(const CellRow& c, float* rh, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; j += L) {
    const int n = tail(j1, j);
    store(sigmoid(gate(c, 1, j, n)) * load(c.h_prev + j, n), rh + j, n);
  }
}

void lstm_cell(const CellRow& c, int64_t j0, int64_t j1) {
  const int64_t H = c.hidden;
  for (int64_t j = j0; j < j1; j += L) {
    const int n = tail(j1, j);
    const Vec cs = load(c.c + j, n);
    Vec pi = Vec::zero(), pf = Vec::zero(), po = Vec::zero();
    if (c.peep) {
      pi = load(c.peep + j, n) * cs;
      po = load(c.peep + H + j, n);
      pf = load(c.peep + 2 * H + j, n) * cs;
    }
    const Vec i = sigmoid(clamp(c, load(c.gx + j, n) + load(c.gh + j, n) + pi));
    const Vec f =
        c.input_forget
            ? Vec::set1(1.0f) - i
            : sigmoid(clamp(c, load(c.gx + 2 * H + j, n) + load(c.gh + 2 * H + j, n) + pf));
    const Vec g = tanh(gate(c, 3, j, n));
    const Vec c_new = f * cs + i * g;
    const Vec o = sigmoid(clamp(c, load(c.gx + H + j, n) + load(c.gh + H + j, n) + po * c_new));
    store(c_new, c.c + j, n);
    store(o * tanh(c_new), c.h + j, n);
  }
}

namespace {

// Columns [m, m + n) of one LinearAttention token: the state's columns are independent, so a
// strip of one vector goes through the whole token while it is in L1: decay and retrieve (delta
// rule), then update, reading the first G query rows on the way.
template <int G>
void linear_attention_update(const LinearAttentionToken& t, int64_t m, int n) {
  const int64_t dk = t.dk, dv = t.dv;
  float* s = t.s + m;
  Vec u = load(t.v + m, n);
  if (t.delta) {
    Vec r = Vec::zero();
    for (int64_t d = 0; d < dk; ++d) {
      Vec x = load(s + d * dv, n);
      if (t.decay) {
        x = x * Vec::set1(t.decay[d]);
        store(x, s + d * dv, n);
      }
      r = fma(Vec::set1(t.k[d]), x, r);
    }
    u = Vec::set1(t.beta) * (u - r);
  }
  const bool decay_here = t.decay && !t.delta;
  Vec acc[G];
  for (int j = 0; j < G; ++j) acc[j] = Vec::zero();
  for (int64_t d = 0; d < dk; ++d) {
    Vec x = load(s + d * dv, n);
    if (decay_here) x = x * Vec::set1(t.decay[d]);
    x = fma(Vec::set1(t.k[d]), u, x);
    store(x, s + d * dv, n);
    for (int j = 0; j < G; ++j) acc[j] = fma(Vec::set1(t.q[j * dk + d]), x, acc[j]);
  }
  for (int j = 0; j < G; ++j) store(acc[j] * Vec::set1(t.scale), t.out + j * dv + m, n);
}

// Query rows [j0, j0 + G) of the strip, reading the updated state.
template <int G>
void linear_attention_read(const LinearAttentionToken& t, int64_t j0, int64_t m, int n) {
  const int64_t dk = t.dk, dv = t.dv;
  const float* q = t.q + j0 * dk;
  Vec acc[G];
  for (int j = 0; j < G; ++j) acc[j] = Vec::zero();
  for (int64_t d = 0; d < dk; ++d) {
    const Vec x = load(t.s + d * dv + m, n);
    for (int j = 0; j < G; ++j) acc[j] = fma(Vec::set1(q[j * dk + d]), x, acc[j]);
  }
  for (int j = 0; j < G; ++j) store(acc[j] * Vec::set1(t.scale), t.out + (j0 + j) * dv + m, n);
}

}  // namespace

void linear_attention_token(const LinearAttentionToken& t) {
  const int64_t first = std::min<int64_t>(t.group, 4);
  for (int64_t m = 0; m < t.dv; m += L) {
    const int n = tail(t.dv, m);
    switch (first) {
      case 1:
        linear_attention_update<1>(t, m, n);
        break;
      case 2:
        linear_attention_update<2>(t, m, n);
        break;
      case 3:
        linear_attention_update<3>(t, m, n);
        break;
      default:
        linear_attention_update<4>(t, m, n);
        break;
    }
    for (int64_t j = first; j < t.group; j += 4) {  // more query heads share the KV head
      switch (std::min<int64_t>(t.group - j, 4)) {
        case 1:
          linear_attention_read<1>(t, j, m, n);
          break;
        case 2:
          linear_attention_read<2>(t, j, m, n);
          break;
        case 3:
          linear_attention_read<3>(t, j, m, n);
          break;
        default:
          linear_attention_read<4>(t, j, m, n);
          break;
      }
    }
  }
}

void causal_conv_row(const float* row, int64_t n, const float* w, int64_t k, float bias, bool silu,
                     float* out) {
  for (int64_t i = 0; i < n; i += L) {
    const int c = tail(n, i);
    Vec acc = Vec::set1(bias);
    for (int64_t j = 0; j < k; ++j) acc = fma(Vec::set1(w[j]), load(row + i + j, c), acc);
    if (silu) acc = acc * sigmoid(acc);
    store(acc, out + i, c);
  }
}

}  // namespace pto::cpu::PTO_ISA_NS
