// MatMulNBits (onnxruntime's com.microsoft contrib op, what onnxruntime's MatMulNBitsQuantizer
// and onnxruntime-genai's model builder write for 2/4/8-bit weight-only LLMs): one reading of its
// weight layout for shape inference, the reference kernel and the CPU kernel.
//
//   Y [..., N] = A [..., K] x W [K, N] (+ bias [N]),  W[k, n] = (code(n, k) - zero(n, b)) *
//   scale(n, b)
//
// with b = k / block_size (or g_idx[k]). B is uint8 [N, blocks, blob]: row n's codes along K,
// `bits` each, packed low bits first, blob = block_size * bits / 8 bytes a block (the last block
// of a K that is not a multiple of block_size padded). Scales are [N * blocks] (or [N, blocks]);
// zero points are packed the same way per row of blocks, ceil(blocks * bits / 8) uint8 a row, or
// floats shaped as the scales; without them 2^(bits - 1).
#pragma once

#include <cstdint>
#include <string>

#include "pto/graph.h"
#include "pto/tensor.h"

namespace pto::nbits {

struct Layout {
  int64_t k = 0, n = 0, bits = 4, block = 0;
  int64_t blocks = 0;  // ceil(k / block)
  int64_t blob = 0;    // bytes of one block's codes
  int64_t zp_row = 0;  // bytes of one row's packed zero points
  int32_t code_mask() const { return (1 << bits) - 1; }
  double mid() const { return static_cast<double>(1 << (bits - 1)); }  // the default zero point
};

// The node's K, N, bits and block_size, checked (ValueError / UnsupportedError naming `where`):
// bits 2, 4 or 8; block_size a power of 2 of at least 16.
Layout layout(const Node& n, const std::string& where);

// Checks the operands against the layout: B uint8 of N * blocks * blob bytes, scales N * blocks
// floats, zero points packed uint8 (N * zp_row) or floats (N * blocks), g_idx K int32 block
// indices in [0, blocks). Null for an absent optional one.
void check_operands(const Layout& w, const Tensor& b, const Tensor& scales, const Tensor* zp,
                    const Tensor* g_idx, const std::string& where);

// The j-th `bits`-wide code of a packed row.
inline int32_t code(const uint8_t* row, int64_t j, int64_t bits, int32_t mask) {
  return (row[j * bits / 8] >> (j * bits % 8)) & mask;
}

// W's columns [n0, n1) dequantized in float32 ((code - zero) * scale, as onnxruntime computes it),
// row-major into w (ldw floats a row of K rows). Operands as check_operands accepted them.
void dequantize(const Layout& w, const Tensor& b, const Tensor& scales, const Tensor* zp,
                const Tensor* g_idx, int64_t n0, int64_t n1, float* out, int64_t ldw);

}  // namespace pto::nbits
