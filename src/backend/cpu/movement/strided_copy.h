// The engine under the CPU data-movement kernels: copy a strided view into another strided view
// (usually contiguous), for any dtype of 1, 2, 4 or 8 bytes. Transpose, Slice, Expand, Tile,
// Split and Concat are each a view of their input (or output) handed to it.
//
// The copy first drops size-1 dimensions and merges dimensions that stay adjacent in both views,
// then picks one of three inner loops:
//   rows       — the innermost dimension is contiguous in both: one memcpy per row;
//   transpose  — the destination's innermost dimension is strided in the source but another
//                dimension is contiguous there: cache-blocked 2-D transposes (per ISA for 4 bytes);
//   elements   — anything else (steps, broadcast): an element loop.
// Work is split over rows or transpose strips with pto::parallel_for; small copies stay on the
// calling thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pto/tensor.h"

namespace pto::cpu {

// Copies every element of the view `shape` from src (element strides src_strides) to dst (element
// strides dst_strides). The two views must not overlap.
void copy_strided(std::byte* dst, const Dims& dst_strides, const std::byte* src,
                  const Dims& src_strides, const Dims& shape, size_t itemsize);

// A contiguous copy of any view (Tensor::view), like Tensor::clone but fast.
Tensor pack(const Tensor& view);

// Copies contiguous `src` into the region of `dst` that `region` (a view of dst) describes.
void unpack_into(const Tensor& region, const Tensor& src);

// Bytes of work below which a copy does not go parallel (and the grain of parallel chunks).
inline constexpr int64_t kCopyGrainBytes = 64 * 1024;
// Copies of at most this many bytes over at most two (simplified) dimensions run on the calling
// thread, row by row, without the general path's set-up (copy_strided).
inline constexpr int64_t kSmallCopyBytes = 16 * 1024;

}  // namespace pto::cpu
