// The vector pieces of the CPU RNN, GRU and LSTM (recurrent.cpp), compiled once per ISA
// (recurrent_impl.h): the per-step product of the hidden state with R and the gate math of one
// batch row over a range of hidden units. Gate orders as ONNX: GRU z r h, LSTM i o f c. Also one
// token of LinearAttention and one row of CausalConvWithState (linear_attention.cpp).
#pragma once

#include <cstdint>

#include "backend/cpu/isa/isa.h"

namespace pto::cpu {

// The gate math of one batch row over hidden units [j0, j1), H per gate: gx is the row's
// X W^T + biases, gh its h R^T (+ the GRU's Rb_h when linear_before_reset), G * H each. The
// activations' inputs are clamped to [-clip, clip] when `clip` (not the cell state's tanh).
struct CellRow {
  const float* gx = nullptr;
  const float* gh = nullptr;
  const float* h_prev = nullptr;  // GRU: the previous hidden state
  float* h = nullptr;             // the new hidden state
  float* c = nullptr;             // LSTM: the cell state, updated in place
  const float* peep = nullptr;    // LSTM: P (i o f, H each), or null
  int64_t hidden = 0;
  bool clip = false;
  float clip_value = 0.0f;
  bool input_forget = false;   // LSTM: f = 1 - i
  bool reset_applied = false;  // GRU: gh's h part is already R_h (r . h) (linear_before_reset 0)
};

// One token of LinearAttention for one KV head: the state s [dk, dv] (row-major, updated in
// place) is decayed by decay[d] per key row (already exp(g); null: no decay), then updated by
// k (x) v, or with the delta rule by k (x) beta (v - s^T k); then each of the `group` query rows
// q + j dk reads out[j dv + m] = scale sum_d q[j dk + d] s[d, m].
struct LinearAttentionToken {
  float* s = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* q = nullptr;
  const float* decay = nullptr;
  float* out = nullptr;
  float beta = 1.0f;
  bool delta = false;
  float scale = 1.0f;
  int64_t dk = 0, dv = 0, group = 1;
};

// R^T packed in panels of kRecurrentPanel columns (one gate's hidden units, zero-padded to whole
// panels), each k x kRecurrentPanel row-major, so the per-step product streams through memory.
inline constexpr int64_t kRecurrentPanel = 32;

PTO_ISA_DECLARE(
    // out[r, j] = bias[j] + sum_k h[r, k] P[k, j] for r < rows, j < n, P the consecutive panels
    // at `panels` (rows of h: ldh, of out: ldo; bias may be null). Each column is summed over k in
    // order, whatever rows and whole panels a caller cuts, so results do not depend on the split.
    void recurrent_matvec(const float* h, int64_t ldh, int64_t rows, int64_t k, const float* panels,
                          const float* bias, float* out, int64_t ldo, int64_t n);

    void rnn_cell(const CellRow& r, int64_t j0, int64_t j1);
    void gru_cell(const CellRow& r, int64_t j0, int64_t j1);
    void lstm_cell(const CellRow& r, int64_t j0, int64_t j1);
    // GRU with linear_before_reset 0: rh[j] = r_j h_prev[j], the state R_h multiplies.
    void gru_reset(const CellRow& r, float* rh, int64_t j0, int64_t j1);

    // One token of LinearAttention for one KV head (linear_attention.cpp).
    void linear_attention_token(const LinearAttentionToken& t);

    // out[i] = act(bias + sum_j w[j] row[i + j]) for i < n; act x sigmoid(x) when silu.
    void causal_conv_row(const float* row, int64_t n, const float* w, int64_t k, float bias,
                         bool silu, float* out);)

}  // namespace pto::cpu
