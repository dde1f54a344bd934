// Sliding-window geometry shared by Conv, ConvTranspose and the pooling ops: reading the
// kernel/stride/dilation/pad/auto_pad attributes and computing output sizes and effective pads.
// Both shape inference (src/ir/ops/nn.cpp) and the reference kernels use it, so they agree.
#pragma once

#include <cstdint>
#include <string>

#include "pto/graph.h"
#include "pto/op_registry.h"

namespace pto::window {

enum class AutoPad { kNotSet, kSameUpper, kSameLower, kValid };

// What a window op reads from its attributes, with the defaults filled in and validated.
struct Params {
  Dims kernel;     // one per spatial axis, >= 1
  Dims strides;    // >= 1
  Dims dilations;  // >= 1
  Dims pads;       // begins then ends (2 * rank), >= 0; ignored unless auto_pad is NOTSET
  AutoPad auto_pad = AutoPad::kNotSet;
  bool ceil_mode = false;  // pooling only
  bool pooling = false;    // a window that does not fit gives an empty output, not an error

  size_t rank() const { return kernel.size(); }
  int64_t extent(size_t i) const { return (kernel[i] - 1) * dilations[i] + 1; }  // dilated kernel
};

// The attributes read_params reads (auto_pad, dilations, pads, strides) and kernel_shape, optional
// (from the weights when absent): the schema shared by Conv, ConvTranspose, ConvInteger,
// QLinearConv and ConvBlocked (each adds its own, e.g. group).
AttrSchema window_attrs();
// Pooling's: window_attrs with kernel_shape required, and ceil_mode.
AttrSchema pool_attrs();

// Reads strides, dilations, pads, auto_pad and (when `pooling`) ceil_mode for a window of the given
// kernel. Throws ValueError on lengths that do not match the kernel's rank or values out of range.
Params read_params(const Attributes& a, Dims kernel, bool pooling, const std::string& where);

// One spatial axis after resolving auto_pad: the output size and the pads actually applied.
struct Axis {
  int64_t out = 0;
  int64_t pad_begin = 0;
  int64_t pad_end = 0;
};

// Conv and pooling: output size of axis i for an input of size `in` (ONNX's formulas, with the
// ceil_mode rule that the last window must start inside the input or its leading pad). When the
// window does not fit, Conv throws ValueError and pooling gives size 0 (as ONNX's reference and
// ONNX Runtime do).
Axis forward_axis(const Params& p, size_t i, int64_t in, const std::string& where);

// ConvTranspose: output size and pads of axis i. `output_padding` and `output_shape` (-1: not
// given) are that axis's entries of the attributes of the same names.
Axis transpose_axis(const Params& p, size_t i, int64_t in, int64_t output_padding,
                    int64_t output_shape, const std::string& where);

// Python-style integer division rounding toward -inf and +inf (b > 0).
inline int64_t floor_div(int64_t a, int64_t b) {
  return a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
}
inline int64_t ceil_div(int64_t a, int64_t b) {
  return -floor_div(-a, b);
}

}  // namespace pto::window
