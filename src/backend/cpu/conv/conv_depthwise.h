// The depthwise kernel's interface, kept apart from conv.h so that the per-ISA files include
// nothing with inline code of its own (isa.h).
#pragma once

#include <cstdint>

#include "backend/cpu/isa/isa.h"

namespace pto::cpu {

// One depthwise output plane as the kernel sees it (plain data, shared with the per-ISA files).
struct DepthwisePlane {
  int64_t ih, iw, ph, pw;  // input plane and leading pads
  int64_t oh, ow, kh, kw, sh, sw, dh, dw;
  int64_t rows;       // padded input rows the plane reads: (oh - 1) * sh + (kh - 1) * dh + 1
  int64_t phase_len;  // elements per stride phase of a padded row
  int64_t row_len;    // sw * phase_len: one padded, phase-split row
};

// y[oy, ox] = bias + sum over (ky, kx) of w[ky, kx] * padded row (oy sh + ky dh), column
// (ox sw + kx dw), where `padded` is the input plane with its pads made explicit and each row
// split into sw phases (phase q holds columns q, q + sw, ...), so every tap is a contiguous load.
// Copies input plane x into `padded` as depthwise_plane reads it: padded row r is input row r - ph
// (zeros outside); within it, phase q holds padded columns q, q + sw, ... (column c is input
// column c - pw, zero outside).
PTO_ISA_DECLARE(void depthwise_pad(const DepthwisePlane& p, const float* x, float* padded);)

PTO_ISA_DECLARE(void depthwise_plane(const DepthwisePlane& p, const float* padded, const float* w,
                                     float bias, float* y);)

}  // namespace pto::cpu
