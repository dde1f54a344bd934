// What the GEMM driver (gemm.cpp) asks of each ISA's kernels (gemm_impl.h, compiled once per ISA):
// the register block, packing of A and B into panels, and the macro-kernel that runs the
// micro-kernel over one block of C.
#pragma once

#include <cstdint>

#include "backend/cpu/gemm/gemm.h"
#include "backend/cpu/isa/isa.h"

namespace pto::cpu {

// One (mc x nc) block of C over one KC slice of K. A is packed: panel i (rows i*MR..) at
// a + i * a_panel_stride (k * MR when 0), MR values per k. B panel j (columns j*NR..) is at b + j *
// b_panel_stride with b_row_stride floats between consecutive k; a partial last panel is read from
// b_edge instead (packed, row stride NR) when b_edge is set. With b_rows, row p of panel j is at
// b + j * b_panel_stride + b_rows[p] instead (b_row_stride unused).
struct MacroBlock {
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  int64_t a_panel_stride = 0;
  // A read in place instead (fp32, B packed or strided, no row table): a points at the block's
  // first element of A, rows a_row_stride floats apart (0: packed panels as above).
  int64_t a_row_stride = 0;
  const float* b = nullptr;
  int64_t b_panel_stride = 0, b_row_stride = 0;
  const int64_t* b_rows = nullptr;
  const float* b_edge = nullptr;
  float* c = nullptr;
  int64_t ldc = 0;
  float alpha = 1.0f;
  bool accumulate = false;  // C += alpha * AB (a later K slice) instead of C = alpha * AB
  const Epilogue* epilogue = nullptr;  // applied per micro-tile when set (the last K slice)
  int64_t m0 = 0, n0 = 0;              // this block's origin in the whole problem (epilogue)
  // kF16 / kBF16: B packed as half bits (NR halves per step; b, b_panel_stride and b_row_stride
  // count halves), widened in registers as the micro-kernel loads them (VCVTPH2PS for IEEE
  // half, a 16-bit shift for bf16). kF32: floats.
  Precision b_half = Precision::kF32;
  // bf16x3 (Precision::kBF16x3): the panels of A's and B's tails, laid out as a's and b's (the
  // values' heads); the block is then alpha (Ah Bh + Al Bh + Ah Bl). Null otherwise.
  const float* a_tail = nullptr;
  const float* b_tail = nullptr;
  // The B panel the caller multiplies right after this block (B packed ahead: the next K slice's
  // or next column block's first panel, at the same row stride), or null: fetched into L2 during
  // the last panel, as every panel fetches its successor, so no block starts on a cold panel.
  const float* b_after = nullptr;
  // The AMX macro-kernel, C wanted in half precision (GemmArgs::c_half) and this the only K slice:
  // each block goes through an L1 buffer (its epilogue applied there) straight into c_half (C's
  // row stride ldc, at the block's own offset from blk.c), and `c` is never written.
  uint16_t* c_half = nullptr;
  Precision c_half_type = Precision::kF32;
};

PTO_ISA_DECLARE(
    // The micro-kernel's register block: MR rows by NR columns of C.
    void gemm_block(int64_t* mr, int64_t* nr);
    // Packs rows [0, m) x k of op(A) (a points at its first element) into ceil(m/MR) panels.
    void gemm_pack_a(const float* a, int64_t lda, bool trans, int64_t m, int64_t k, float* dst);
    // Packs k x columns [0, n) of op(B) into ceil(n/NR) panels of k x NR, panel j at
    // dst + j * panel_stride (panel_stride >= k * NR), zero-padded to NR columns.
    void gemm_pack_b(const float* b, int64_t ldb, bool trans, int64_t k, int64_t n, float* dst,
                     int64_t panel_stride);
    void gemm_macro(const MacroBlock& blk);)

// bf16 products on AVX512_BF16 (VDPBF16PS), in the same panels with K counted in pairs: a step
// of an A panel holds MR pairs (A[r, 2p], A[r, 2p + 1]) rounded to bf16, one 32-bit word each,
// and a step of a B panel NR pairs (B[2p, j], B[2p + 1, j]); an odd K ends in a pair whose second
// half is 0. The driver then runs the fp32 blocking on ceil(K / 2) steps. Only the avx512
// kernels have them, and only when cpu::has_ext(Ext::kAvx512Bf16) may they run.
namespace avx512 {
// As gemm_pack_a / gemm_pack_b with `k` the real K (not steps), writing ceil(k / 2) steps. With
// `rows` (B not transposed), row q of B is at b + rows[q] instead (GemmArgs::b_rows); with
// `tails` (bf16x3), B's tails x - bf16(x) are packed instead of its values.
void gemm_pack_a_bf16(const float* a, int64_t lda, bool trans, int64_t m, int64_t k, float* dst);
void gemm_pack_b_bf16(const float* b, int64_t ldb, bool trans, int64_t k, int64_t n, float* dst,
                      int64_t panel_stride, const int64_t* rows = nullptr, bool tails = false);
// blk.k in steps; B packed (b_row_stride NR, no b_rows).
void gemm_macro_bf16(const MacroBlock& blk);

// bf16 products on AMX tiles (gemm_amx_avx512.cpp), where cpu::has_ext(Ext::kAmxBf16): B in the
// VDPBF16PS panels above; A in panels of kAmxMR rows whose steps are grouped by
// kAmxStepsPerTile (chunk c: the rows' pairs of its steps row after row), the same size and
// slice offsets as kAmxMR-row step-major panels. KC is a multiple of kAmxStepsPerTile but in
// the last slice.
inline constexpr int kAmxMR = 32, kAmxStepsPerTile = 16;
void gemm_pack_a_amx(const float* a, int64_t lda, bool trans, int64_t m, int64_t k, float* dst);
// The same panels from an A already in bf16 (not transposed, row stride lda halves): each row's
// pairs are its values as they lie, so a chunk's row is a copy of up to 64 bytes.
void gemm_pack_a_amx_bf16(const uint16_t* a, int64_t lda, int64_t m, int64_t k, float* dst);
void gemm_macro_amx(const MacroBlock& blk);
}  // namespace avx512

}  // namespace pto::cpu
