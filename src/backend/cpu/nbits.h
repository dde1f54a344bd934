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
#pragma once

#include <cstdint>

#include "backend/cpu/isa/isa.h"

namespace pto::cpu {

inline constexpr int kNBitsPanel = 16;  // output columns of a panel

// A 4-bit weight repacked (see above): panel p's codes at codes + p * kp * 8, its scales and zero
// points at scales / zeros + p * blocks * 16.
struct NBitsPanels {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  const uint8_t* zeros = nullptr;
  int64_t kp = 0;  // K rounded up to whole blocks
  int64_t block = 0, blocks = 0;
};

PTO_ISA_DECLARE(
    // Rows [0, rows) of A (lda floats apart, kp values each, zeros after K) times panel p:
    // y[r * ldy + j] = bias[j] (0 when null) + sum_k a[r, k] W[k, j] for j < cols (<= 16).
    // asum[r * blocks + b] is the sum of row r's values in block b.
    void nbits4_gemv(const NBitsPanels& w, int64_t p, const float* a, int64_t lda,
                     const float* asum, int64_t rows, const float* bias, float* y, int64_t ldy,
                     int cols);
    // Panel p's first k rows (k <= kp) dequantized: out[q * ldo + j] = W[q, j] for j < 16 (ldo >=
    // 16; columns past N come out 0 * scale).
    void nbits4_dequantize(const NBitsPanels& w, int64_t p, int64_t k, float* out, int64_t ldo);)

}  // namespace pto::cpu
