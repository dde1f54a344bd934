// What Resize and Upsample compute, apart from the arithmetic: the attributes and inputs read and
// checked into a plan (output shape, per-axis scales, roi, the axes in processing order), and for
// one axis the source taps of every output index. The reference kernel (resize.cpp) and the CPU
// kernel (backend/cpu/resize.cpp) both interpolate from these, so they agree on every index,
// weight and error.
#pragma once

#include <string>
#include <vector>

#include "pto/reference.h"

namespace pto::reference {

struct ResizeParams {
  std::string mode = "nearest";                // nearest | linear | cubic
  std::string coord = "half_pixel";            // coordinate_transformation_mode
  std::string nearest = "round_prefer_floor";  // nearest_mode, or "simple" (opset 10)
  double cubic_a = -0.75;
  bool exclude_outside = false;
  bool antialias = false;
  double extrapolation = 0.0;
};

struct ResizePlan {
  ResizeParams params;
  Dims out;                    // the output shape
  std::vector<double> scales;  // per axis (1 for axes not resized)
  std::vector<double> roi;     // [starts..., ends...] over all axes, for tf_crop_and_resize
  std::vector<int64_t> order;  // the resized axes, in the order they are processed
  double roi_start(int64_t axis) const { return roi.empty() ? 0.0 : roi[axis]; }
  double roi_end(int64_t axis) const {
    return roi.empty() ? 1.0 : roi[static_cast<int64_t>(out.size()) + axis];
  }
};

// Resize (opsets 10-19+) and Upsample (opsets 7-9): the plan, or the node's ValueError.
ResizePlan resize_plan(const KernelContext& c);
ResizePlan upsample_plan(const KernelContext& c);

// Along one axis of `in` pixels resized to `out`: output index o reads the n source indices
// index[o * n, o * n + n) (clamped to the input) with weights weight[o * n, ...), or is the
// extrapolation value where extrapolate[o].
struct ResizeTaps {
  int64_t in = 0, out = 0, n = 0;
  std::vector<int64_t> index;
  std::vector<double> weight;
  std::vector<bool> extrapolate;
};
ResizeTaps resize_taps(const ResizeParams& p, int64_t in, int64_t out, double scale,
                       double roi_start, double roi_end, const std::string& where);

// Whether resizing an axis of `in` to `out` with this scale and roi leaves it as it is (skipped).
bool is_identity_axis(const ResizeParams& p, int64_t in, int64_t out, double scale,
                      double roi_start, double roi_end);

}  // namespace pto::reference
