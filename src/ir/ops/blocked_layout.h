// Constant data in the blocked-channel layout (blocked_layout.cpp has the ops): shared by the
// AssignLayouts pass, which reorders constant weights at compile time, and the CPU Conv kernel,
// which runs small-plane convolutions on the blocked kernel internally.
#pragma once

#include "pto/tensor.h"

namespace pto {

// Conv weights W [M, C, KH, KW] as ConvBlocked reads them, [ceil(M/c), ceil(C/c), KH, KW, c(in),
// c(out)], or for a depthwise conv [C, 1, KH, KW] -> [ceil(C/c), 1, KH, KW, c]; zeros where a
// channel is past M or C. c = `block`.
Tensor blocked_conv_weights(const Tensor& w, bool depthwise, int block);

}  // namespace pto
