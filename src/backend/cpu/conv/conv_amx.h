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
//
// Folded (fold > 0: fewer than 32 input channels, a network's stem): K per tap is the values
// v = (f, ci, kx) of `fold` kernel rows f, every channel ci and kernel column kx (v = (f c + ci) kw
// + kx), paired as channels are (pair p: values 2p and 2p + 1, chunks of 32 values); a tap is a
// group of `fold` kernel rows. The planes then split the rows only by phase (`phases` of them,
// one where there is one tap) and have no junk columns (wp = ow): value v of pair plane p at
// phase py, row i, column q is x[ci][i sh + py - ph + f dh][q sw + kx dw - pw], and tap t reads
// output row oy at padded row oy sh + t fold dh. A one-chunk conv's B tiles hold only k_pairs
// rows (its A tiles as many pairs a row), and it has only that many planes.
//
// Grouped (conv.h TapsLayout): a panel of 32 output channels reads panel_chunks chunks from
// first_chunk[its index] on (null: from chunk 0; `chunks` is all the planes' chunks).
struct TapsGeometry : ShiftedPlane {
  int64_t c = 0, plane = 0, chunks = 0, taps = 0, panel_chunks = 0;
  const int64_t* first_chunk = nullptr;
  int64_t fold = 0, phases = 1;  // kernel rows a tap folds (0: not folded); its planes' phases
  int64_t k_pairs = 16;          // pairs of K a step's tiles hold (one chunk folded: fewer)
  const int64_t* tap_offset = nullptr;
};

namespace avx512 {
// Channel pairs [pair0, pair1) of one image x [c, ih, iw] into `planes` (pair p at
// planes + p * plane; folded: pairs of values), zero pairs where they read padding or channels
// past c; with `tails`, the pairs of what bf16 rounding leaves of each value (x - bf16(x):
// bf16x3's tails).
void taps_planes(const TapsGeometry& t, const float* x, int64_t pair0, int64_t pair1, bool tails,
                 uint32_t* planes);
// The outputs at padded columns [q0, q1) (column q is output q / wp, q % wp, where q % wp < ow) of
// m output channels into y (the image's [m, oh, ow]): A is the weights packed for AMX tiles with
// K chunk-major (pack_a of [m, panel_chunks * taps * 32], conv.h TapsLayout), `planes` one image's
// pair planes (with at least 64 + kw pairs readable past the last). bf16x3: `a_tails` and
// `tails` the weights' and the planes' tails (else null), the products A B + At B + A Bt. With
// `e`, each output gets bias[channel] (bias: the m channels' values, or null) and e's scaled
// residual (laid out as y) and clamp as it is written.
void taps_rows(const TapsGeometry& t, const float* a, const float* a_tails, int64_t m,
               const uint32_t* planes, const uint32_t* tails, int64_t q0, int64_t q1, float* y,
               const float* bias = nullptr, const RowEpilogue* e = nullptr);
}  // namespace avx512

}  // namespace pto::cpu
