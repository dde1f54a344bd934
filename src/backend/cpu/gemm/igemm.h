// Integer (8-bit) GEMM for ONNX's quantized ops (MatMulInteger, QLinearMatMul):
//
//   acc[m, n] = sum_k (A[m, k] - za[m]) * (B[k, n] - zb[n])          (int32, wrapping)
//
// A (M x K, row-major, lda) and B (K x N) hold uint8 or int8 each. The product runs as VPDPBUSD
// computes it, unsigned A times signed B: an int8 A is moved to uint8 by adding 128 (a' = a ^ 0x80)
// and a uint8 B to int8 by subtracting 128; the zero points and those offsets are taken out in the
// epilogue with the row sums of A and the column sums of B:
//
//   A = a' + alpha[m] (alpha = offset_a - za), B = b' + beta[n] (beta = offset_b - zb),
//   acc = sum a'b' + beta[n] * rowsum(a')[m] + alpha[m] * (colsum(b')[n] + K * beta[n]).
//
// B is packed once (a weight) into panels of 16 columns by groups of 4 k, `[n/16][k/4][16][4]`
// bytes with K padded with zeros, the same layout for every ISA (AVX-512 reads four panels at
// once, AVX2 one, the generic kernel one), with its column sums. The epilogue adds an optional
// int32 bias per column (QLinearConv's B) and writes int32, float (scale_a * scale_b[n] * acc +
// bias[n]) or requantized uint8/int8 (QLinearMatMul, QLinearConv). Without VNNI (an older CPU,
// PTO_DISABLE_EXT, ExtScope) the same panels run on a widening VPMADDWD kernel; with AMX-INT8
// a product of 16 rows or more runs on AMX tiles (TDPBUSD), the panels being its B tiles.
// docs/backend/gemm.md has the measurements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace pto::cpu {

struct Epilogue;  // gemm.h

// B (K x N, row-major with row stride ldb, or N x K with trans) packed for igemm.
class PackedI8B {
 public:
  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  bool is_signed() const { return signed_; }  // the original's dtype: int8 (true) or uint8
  const int8_t* data() const { return data_.get(); }
  const int32_t* colsum() const { return colsum_.data(); }  // of b' (uint8 shifted to int8)
  size_t bytes() const { return bytes_; }
  // The original byte B[q, j] (uint8 or int8 by is_signed()) read back from the panels.
  uint8_t original(int64_t q, int64_t j) const {
    const int64_t at = (j / 16) * ((k_ + 3) / 4 * 64) + (q / 4) * 64 + (j % 16) * 4 + q % 4;
    return static_cast<uint8_t>(data_[at] ^ (signed_ ? 0 : 0x80));
  }

 private:
  friend PackedI8B pack_i8_b(int64_t k, int64_t n, const void* b, int64_t ldb, bool trans,
                             bool b_signed);
  int64_t k_ = 0, n_ = 0;
  bool signed_ = true;
  size_t bytes_ = 0;
  std::shared_ptr<int8_t[]> data_;
  std::vector<int32_t> colsum_;
};

PackedI8B pack_i8_b(int64_t k, int64_t n, const void* b, int64_t ldb, bool trans, bool b_signed);

// Bytes between consecutive 16-column panels of a packing of depth k.
inline int64_t i8_panel_stride(int64_t k) {
  return (k + 3) / 4 * 64;
}

struct IgemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;  // uint8 or int8 (a_signed)
  int64_t lda = 0;
  bool a_signed = false;
  // Zero points, as int32: a_zp one value (or per row when a_zp_per_row), b_zp one value (or
  // per column when b_zp_per_col); null: zero.
  const int32_t* a_zp = nullptr;
  bool a_zp_per_row = false;
  const int32_t* b_zp = nullptr;
  bool b_zp_per_col = false;

  // Added to acc (as int64, before any conversion) per column; null: none. QLinearConv's B, which
  // must be in the sum before the requantization rounds.
  const int32_t* bias_s32 = nullptr;

  enum class Out { kS32, kF32, kQuantized } out = Out::kS32;
  void* c = nullptr;  // int32, float, or uint8/int8 (c_signed), by `out`
  int64_t ldc = 0;    // in elements
  // Below, acc includes bias_s32. kS32: c = acc, wrapping to int32.
  // kF32: c = scale_a * scale_b[n] * acc + bias[n] (scale_b per column when scale_b_per_col;
  // bias may be null), rounded as float(acc) * float(scale_a * scale_b[n]) + bias[n].
  float scale_a = 1.0f;
  const float* scale_a_row = nullptr;  // per row of A instead of scale_a (DynamicQuantizeMatMul)
  const float* scale_b = nullptr;
  bool scale_b_per_col = false;
  const float* bias = nullptr;
  const Epilogue* epilogue = nullptr;  // then applied to each finished block of C (gemm.h)
  // kQuantized: c = saturate(round_half_even(double(acc) * mult[n] + y_zp)) (QLinearMatMul's
  // requantization; mult per column when mult_per_col).
  const double* mult = nullptr;
  bool mult_per_col = false;
  double y_zp = 0.0;
  bool c_signed = false;

  // Optional: writes rows [i0, i1) of A, with their a_zp and scale_a_row entries, just before
  // igemm reads them (DynamicQuantizeMatMul quantizes A here, each block of rows on the thread
  // that multiplies it, while it stays in cache). Called exactly once for every row: by the task
  // that owns the rows when one task spans all of N, else for all rows before the tasks start.
  std::function<void(int64_t i0, int64_t i1)> fill_a;
};

// acc (or its float / requantized form) for every row of A against the packed B; parallel over
// the thread pool unless called from inside a parallel region. args.k and args.n must match b.
void igemm(const IgemmArgs& args, const PackedI8B& b);

// The epilogue of igemm on its own: converts an m x n block of int32 accumulators (acc, lda
// elements per row) into args.c at rows i0.., columns j0.. (the per-column parameters read at
// j0 + j), as igemm does. For accumulators computed elsewhere (a direct depthwise convolution) that
// must round exactly as the GEMM's.
void igemm_epilogue(const IgemmArgs& args, const int32_t* acc, int64_t lda, int64_t i0, int64_t m,
                    int64_t j0, int64_t n);

// Whether igemm on the active ISA uses VNNI (VPDPBUSD) or its widening fallback.
bool igemm_uses_vnni();
// Whether igemm on the active ISA runs products of 16 rows or more on AMX tiles (TDPBUSD).
bool igemm_uses_amx();

}  // namespace pto::cpu
