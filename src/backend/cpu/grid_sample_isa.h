// What grid_sample.cpp calls in the per-ISA files (grid_sample_{avx512,avx2,generic}.cpp): the
// fast path of 2-D float32 GridSample, bilinear or nearest with zeros or border padding. Plain
// structs and declarations only (isa.h).
#pragma once

#include <cstdint>

#include "backend/cpu/isa/isa.h"

namespace pto::cpu {

// The input plane and the sampling rule.
struct GridSample2d {
  int64_t h = 1, w = 1;  // input plane (h * w < 2^24: plane offsets are exact in float)
  bool nearest = false, border = false, align_corners = false;
};

// Taps per point of the fast path: 4 (bilinear) or 1 (nearest).
inline int grid_taps(const GridSample2d& s) {
  return s.nearest ? 1 : 4;
}

// The taps of `len` output points (grid entries (x, y) at grid[2 j], grid[2 j + 1]), as the
// reference computes them (reference/ops/grid_sample_plan.h) in float: tap k of point j reads
// plane offset idx[k * stride + j] (a whole number as a float; -1: zero padding, reads 0) with
// weight w[k * stride + j]; a point whose coordinate is not finite gets offsets -1 and weights
// NaN (its sample is NaN). Bilinear taps are (y0, x0), (y0, x1), (y1, x0), (y1, x1).
PTO_ISA_DECLARE(void grid_sample_taps(const GridSample2d& s, const float* grid, int64_t len,
                                      float* idx, float* w, int64_t stride);
                // dst[j] = sum over the taps k of w[k][j] * plane[idx[k][j]] for j < len.
                void grid_sample_apply(const float* idx, const float* w, int taps, int64_t stride,
                                       int64_t len, const float* plane, float* dst);)

}  // namespace pto::cpu
