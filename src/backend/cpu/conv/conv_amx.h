// The bf16 conv on AMX tiles that reads B straight from padded planes of channel pairs
// (conv_amx_avx512.cpp says how): plain structs and declarations for conv.cpp.
#pragma once

#include <cstdint>

namespace pto::cpu {

// One image's geometry for the taps kernel (no dilation): c input channels as pair planes, each
// the sh x sw phase planes of the padded input (as the shifted path splits a strided conv's
// input: phase (py, px) row i, column j is padded input (i sh + py, j sw + px)) of rpp x wp pairs,
// `plane` = sh sw rpp wp pairs apart; chunks = channels padded to 32 / 32, and the pair offset of
// each of the taps ((ky % sh) sw + kx % sw) rpp wp + (ky / sh) wp + kx / sw.
struct TapsGeometry {
  int64_t c = 0, ih = 0, iw = 0, oh = 0, ow = 0, ph = 0, pw = 0, sh = 1, sw = 1;
  int64_t rpp = 0, wp = 0, plane = 0;
  int64_t chunks = 0, taps = 0;
  const int64_t* tap_offset = nullptr;
};

namespace avx512 {
// Channel pairs [pair0, pair1) of one image x [c, ih, iw] into `planes` (pair p at
// planes + p * plane), zero pairs where they read padding or channels past c; with `tails`, the
// pairs of what bf16 rounding leaves of each value (x - bf16(x): bf16x3's tails).
void taps_planes(const TapsGeometry& t, const float* x, int64_t pair0, int64_t pair1, bool tails,
                 uint32_t* planes);
// Output rows [oy0, oy1) of m output channels into y (the image's [m, oh, ow]): A is the
// weights packed for AMX tiles with K tap-major (pack_a of [m, taps * chunks * 32]), `planes`
// one image's pair planes (with at least 64 + kw pairs readable past the last). bf16x3:
// `a_tails` and `tails` the weights' and the planes' tails (else null), the products
// A B + At B + A Bt.
void taps_rows(const TapsGeometry& t, const float* a, const float* a_tails, int64_t m,
               const uint32_t* planes, const uint32_t* tails, int64_t oy0, int64_t oy1, float* y);
}  // namespace avx512

}  // namespace pto::cpu
