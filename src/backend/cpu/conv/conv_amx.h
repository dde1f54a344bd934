// The bf16 conv on AMX tiles that reads B straight from padded planes of channel pairs
// (conv_amx_avx512.cpp says how): plain structs and declarations for conv.cpp.
#pragma once

#include <cstdint>

#include "backend/cpu/conv/conv_isa.h"

namespace pto::cpu {

// One image's geometry for the taps kernel (no dilation): the shifted path's phase-split padded
// input (ShiftedPlane: phase (py, px) row i, column j is padded input (i sh + py, j sw + px), rpp
// x wp of them), its c channels as pair planes `plane` = sh sw rpp wp pairs apart; chunks =
// channels padded to 32 / 32, and each of the taps' pair offset into a plane
// (shifted_tap_offset).
struct TapsGeometry : ShiftedPlane {
  int64_t c = 0, plane = 0, chunks = 0, taps = 0;
  const int64_t* tap_offset = nullptr;
};

namespace avx512 {
// Channel pairs [pair0, pair1) of one image x [c, ih, iw] into `planes` (pair p at
// planes + p * plane), zero pairs where they read padding or channels past c; with `tails`, the
// pairs of what bf16 rounding leaves of each value (x - bf16(x): bf16x3's tails).
void taps_planes(const TapsGeometry& t, const float* x, int64_t pair0, int64_t pair1, bool tails,
                 uint32_t* planes);
// Output rows [oy0, oy1) of m output channels into y (the image's [m, oh, ow]): A is the
// weights packed for AMX tiles with K chunk-major (pack_a of [m, chunks * taps * 32],
// taps_weight_column), `planes`
// one image's pair planes (with at least 64 + kw pairs readable past the last). bf16x3:
// `a_tails` and `tails` the weights' and the planes' tails (else null), the products
// A B + At B + A Bt.
void taps_rows(const TapsGeometry& t, const float* a, const float* a_tails, int64_t m,
               const uint32_t* planes, const uint32_t* tails, int64_t oy0, int64_t oy1, float* y);
}  // namespace avx512

}  // namespace pto::cpu
