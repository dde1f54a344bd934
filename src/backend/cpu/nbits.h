// The per-ISA loops of MatMulNBits's 4-bit kernel (nbits_kernels.cpp; the op: ir/ops/nbits.h),
// compiled once per ISA (nbits_impl.h).
//
// The weight is repacked once, at compile time, into panels of 16 output columns: a panel holds,
// for each pair of k, 16 bytes whose byte j is code(k, j) | code(k + 1, j) << 4, K padded with
// zero codes to whole blocks; then each block's 16 scales (float) and 16 zero points (uint8). A
// row of A times a panel is then, per block b,
//
//   y[j] += scale[b, j] * (sum_{k in b} a[k] code(k, j) - zero[b, j] * sum_{k in b} a[k])
//
// so the codes become floats once (two VPERMPS from a table of 0..15 under AVX-512) and each is
// one FMA per row of A; the sums of A per block are taken once per call.
//
// The int8 form, for a node whose accuracy_level is 4 (the file allows A rounded to int8, as
// onnxruntime then computes it) on a CPU with AVX512_VNNI: A is quantized per row and block,
// a_q = round(a * 127 / max|a|) in [-127, 127], and the block's dot products are integers,
// VPDPBUSD's four products a lane:
//
//   y[j] += scale[b, j] * a_scale[b] * (sum_{k in b} code(k, j) a_q[k] - zero[b, j] sum a_q)
//
// Its codes are laid out per group of 8 k: 64 bytes, byte 4 j + i = code(k + i, j) |
// code(k + 4 + i, j) << 4, so one load and two masks give the bytes of k..k+3 and k+4..k+7 of
// the 16 columns.
#pragma once

#include <cstdint>

#include "backend/cpu/isa/isa.h"

namespace pto::cpu {

inline constexpr int kNBitsPanel = 16;  // output columns of a panel

// A 4- or 8-bit weight repacked (see above): panel p's codes at codes + p * kp * 16 * bits / 8,
// its scales and zero points at scales / zeros + p * blocks * 16. 8-bit codes take the same
// layouts a byte each: a pair of k is k's 16 bytes then k + 1's; in the int8 form a group of 4 k
// is 64 bytes, byte 4 j + i = code(k + i, j).
struct NBitsPanels {
  bool int8 = false;  // the int8 form's layout of codes (above)
  int bits = 4;       // 4, or 8: one code a byte, a pair of k 32 bytes, a group of 4 k 64 bytes
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  const uint8_t* zeros = nullptr;
  const float* float_zeros = nullptr;  // in place of zeros when the file's zero points are floats
  // Neither (the file has no zero points): every block's is this one, 2^(bits - 1), and the panels
  // stream no zero points.
  float zero = 0.0f;
  int64_t kp = 0;  // K rounded up to whole blocks
  int64_t block = 0, blocks = 0;
};

PTO_ISA_DECLARE(
    // Rows [0, rows) of A (lda floats apart, kp values each, zeros after K) times panel p:
    // y[r * ldy + j] = bias[j] (0 when null) + sum_k a[r, k] W[k, j] for j < cols (<= 16).
    // asum[r * blocks + b] is the sum of row r's values in block b.
    void nbits_gemv(const NBitsPanels& w, int64_t p, const float* a, int64_t lda, const float* asum,
                    int64_t rows, const float* bias, float* y, int64_t ldy, int cols);
    // The int8 form of nbits_gemv: rows of A quantized (aq: kp int8 each, ldq apart; zeros past
    // K), with per row and block a_scale[r * blocks + b] and qsum[r * blocks + b] (the sum of the
    // block's a_q). VPDPBUSD under AVX-512 (the caller checks AVX512_VNNI), else scalar.
    void nbits_gemv_i8(const NBitsPanels& w, int64_t p, const int8_t* aq, int64_t ldq,
                       const float* a_scale, const float* qsum, int64_t rows, const float* bias,
                       float* y, int64_t ldy, int cols);
    // One row of A (k floats) quantized for nbits_gemv_i8, per block of `block` values:
    // q[b * block + i] = round(a * 127 / max|a|) (nearest even; zeros past k), a_scale[b] =
    // max|a| / 127 and qsum[b] the sum of the block's q.
    void nbits_quantize_row(const float* a, int64_t k, int64_t block, int64_t blocks, int8_t* q,
                            float* a_scale, float* qsum);)

}  // namespace pto::cpu
