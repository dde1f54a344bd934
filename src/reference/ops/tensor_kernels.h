// The tensor (shape and layout) family's kernels live in several files; register_tensor_kernels
// (tensor.cpp) calls each file's registration function.
#pragma once

#include <algorithm>

#include "kernel_util.h"

namespace pto::reference {

// Checks an output shape computed from data (Reshape's target, Expand's shape, pads, sizes):
// no negative dim, and the product of the non-zero dims fits in int64, so that even an empty
// tensor of this shape has representable strides. Returns the element count.
inline int64_t check_output_dims(const Dims& d, const std::string& where) {
  int64_t n = 1, strided = 1;
  for (int64_t x : d) {
    if (x < 0) throw ValueError(cat(where, ": negative dimension in output shape ", dims_str(d)));
    if (__builtin_mul_overflow(strided, std::max<int64_t>(x, 1), &strided))
      throw ValueError(cat(where, ": output shape ", dims_str(d), " is too large"));
    n *= x;
  }
  return n;
}

// The same, naming c's node: its where() is built only for the error, not on every run.
inline int64_t check_output_dims(const Dims& d, const KernelContext& c) {
  int64_t n = 1, strided = 1;
  bool bad = false;
  for (int64_t x : d) {
    bad |= x < 0 || __builtin_mul_overflow(strided, std::max<int64_t>(x, 1), &strided);
    n *= x;
  }
  return bad ? check_output_dims(d, c.where()) : n;  // the string form throws
}

void register_layout_kernels(KernelRegistry& r);     // tensor.cpp: Reshape, Transpose, Slice, ...
void register_cast_kernels(KernelRegistry& r);       // cast.cpp: Cast, CastLike
void register_generator_kernels(KernelRegistry& r);  // generate.cpp: Constant, Range, EyeLike, ...
void register_pad_kernels(KernelRegistry& r);        // pad.cpp: Pad
void register_resize_kernels(KernelRegistry& r);     // resize.cpp: Resize, Upsample

}  // namespace pto::reference
