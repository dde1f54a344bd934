// What GridSample computes, apart from the arithmetic: the inputs and attributes read and checked
// into a plan, and for one output point the input taps (plane offsets and weights: the tensor
// product of each axis's taps after padding_mode and align_corners). The reference kernel
// (image.cpp) and the CPU kernel (backend/cpu/grid_sample.cpp) both sample from these, so they
// agree on every tap, weight and error.
#pragma once

#include <vector>

#include "pto/reference.h"

namespace pto::reference {

enum class SampleMode { kNearest, kLinear, kCubic };
enum class PadMode { kZeros, kBorder, kReflection };

// One input element a sample reads: its offset in the input plane and its weight.
struct Tap {
  int64_t index;
  double weight;
};

struct AxisSampler {
  int64_t size;  // the input's extent on this axis (> 0)
  SampleMode mode;
  PadMode pad;
  bool align_corners;
  bool single;  // the grid is not f64: denormalize in float steps, as the ONNX reference does

  // Maps an integer pixel index to an in-range one, or -1 where zero padding reads 0.
  int64_t pixel(int64_t i) const;
  // Appends the taps for normalized coordinate `n` in [-1, 1]; returns false when n is not
  // finite (the sample is then NaN).
  bool taps(double n, std::vector<Tap>& out) const;
};

struct GridSamplePlan {
  SampleMode mode = SampleMode::kLinear;
  int64_t n = 0, c = 0, rank = 0;  // batch, channels, spatial axes
  int64_t points = 0, plane = 0;   // output points and input elements per image and channel
  Dims out_shape, in_strides;      // in_strides: of the input's spatial axes
  std::vector<AxisSampler> axes;   // per spatial axis, in the input's order
};

// Checks X and grid and reads mode, padding_mode and align_corners (ValueError / TypeError as
// the reference raises them, including for an empty input plane when the output is not empty).
GridSamplePlan grid_sample_plan(const KernelContext& c);

// The taps of one output point whose grid entry is `coords` (rank values, the last spatial axis
// first, as the grid holds them) into `combined` (the product over the axes, in a fixed order);
// false when a coordinate is not finite. `per_axis` and `next` are workspace.
bool grid_point_taps(const GridSamplePlan& p, const double* coords, std::vector<Tap>& combined,
                     std::vector<std::vector<Tap>>& per_axis, std::vector<Tap>& next);

}  // namespace pto::reference
