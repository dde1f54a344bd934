// The tensor (shape and layout) family's kernels live in several files; register_tensor_kernels
// (tensor.cpp) calls each file's registration function.
#pragma once

#include "kernel_util.h"

namespace pto::reference {

void register_layout_kernels(KernelRegistry& r);     // tensor.cpp: Reshape, Transpose, Slice, ...
void register_cast_kernels(KernelRegistry& r);       // cast.cpp: Cast, CastLike
void register_generator_kernels(KernelRegistry& r);  // generate.cpp: Constant, Range, EyeLike, ...
void register_pad_kernels(KernelRegistry& r);        // pad.cpp: Pad
void register_resize_kernels(KernelRegistry& r);     // resize.cpp: Resize, Upsample

}  // namespace pto::reference
