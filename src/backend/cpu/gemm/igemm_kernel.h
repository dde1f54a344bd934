// What the int8 GEMM driver (igemm.cpp) asks of each ISA's kernels (igemm_impl.h, compiled once
// per ISA): the register block and the macro-kernel that runs the micro-kernel over one block.
#pragma once

#include <cstdint>

#include "backend/cpu/isa/isa.h"

namespace pto::cpu {

// One block of C: m rows of packed A against n columns of packed B over one slice of K (k4 groups
// of 4). A panel i (rows i*MR..) at a + i * a_panel_stride bytes, [k4][MR][4] uint8. B starts at a
// 16-column panel boundary, panels b_stride bytes apart, [k4][16][4] int8 each. The epilogue
// corrections (igemm.h): rowsum and alpha per row (MR-padded), beta and cs2 per column (padded to
// a multiple of NR); C is int32, ldc elements per row.
struct IgemmBlock {
  int64_t m = 0, n = 0, k4 = 0;
  const uint8_t* a = nullptr;
  int64_t a_panel_stride = 0;  // bytes between A panels (k4 * MR * 4 when 0: a K slice's own)
  const int32_t* rowsum = nullptr;
  const int32_t* alpha = nullptr;
  const int8_t* b = nullptr;
  int64_t b_stride = 0;
  const int32_t* beta = nullptr;
  const int32_t* cs2 = nullptr;
  int32_t* c = nullptr;
  int64_t ldc = 0;
  bool vnni = false;  // VPDPBUSD (the ISA's VNNI extension is on) or the widening fallback
  // A later K slice: C += the slice's product (the corrections were added by the first slice).
  bool accumulate = false;
  // Columns of B right after the block's (the next block's, 0: none): the macro-kernel fetches
  // each next panel of B ahead, these too.
  int64_t next_cols = 0;
};

// The requantizing epilogue of one row of C (igemm.h, Out::kQuantized): y[j] = saturate(
// round_half_even(double(acc[j] + bias[j]) * mult[j or 0] + y_zp)) to uint8 or int8, NaN to 0.
struct IgemmRequant {
  const int32_t* bias = nullptr;  // per column, or null
  const double* mult = nullptr;
  bool mult_per_col = false;
  double y_zp = 0.0;
  bool c_signed = false;
};

PTO_ISA_DECLARE(
    // The micro-kernel's register block: MR rows by NR columns of C (NR a multiple of 16).
    void igemm_block(int64_t* mr, int64_t* nr); void igemm_macro(const IgemmBlock& blk);
    // m rows of n columns, acc's rows lda int32s apart, y's ldy bytes apart (the parameters'
    // pointers at the first column).
    void igemm_requantize(const IgemmRequant& r, const int32_t* acc, int64_t lda, int64_t m,
                          int64_t n, void* y, int64_t ldy);)

// int8 products on AMX tiles (TDPBUSD, gemm_amx_avx512.cpp), where cpu::has_ext(Ext::kAmxInt8):
// B in the panels above; A in panels of kAmxRows rows, [k4 / 16][kAmxRows][16][4] bytes with K
// padded with zeros to whole chunks of 16 quads (a panel is chunks * 16 * kAmxRows * 4 bytes);
// a K slice starts at a whole chunk. The block's C (blk.c) holds whole 16 x 16 tiles: its rows
// padded to kAmxRows, its columns to 16 (igemm's scratch block), and the B panels past blk.n
// that a tile reads exist or are zero.
namespace avx512 {
inline constexpr int kAmxRows = 32, kAmxQuadsPerTile = 16;
// Rows [0, m) of A (k bytes each, lda apart) as a' (int8 moved to uint8), rowsum[i] their sums
// (rowsum padded to whole panels, the padding 0).
void igemm_pack_a_amx(const uint8_t* a, int64_t lda, bool a_signed, int64_t m, int64_t k,
                      uint8_t* dst, int32_t* rowsum);
void igemm_macro_amx(const IgemmBlock& blk);
}  // namespace avx512

}  // namespace pto::cpu
