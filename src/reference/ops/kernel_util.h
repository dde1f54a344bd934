// Helpers shared by reference kernels: broadcasting index maps and small conveniences. Everything
// here favours being obviously right over being fast.
#pragma once

#include <utility>
#include <vector>

#include "pto/reference.h"

namespace pto::reference {

// For an output of shape `out` and an input of shape `in` (broadcastable to `out`), returns the
// input's element offset for every output element, in row-major order.
std::vector<int64_t> broadcast_offsets(const Dims& in, const Dims& out);

// Calls f(out_index, in_offsets...) for every element of the broadcast of the inputs' shapes.
// Returns the broadcast shape through `out_shape`.
Dims broadcast_all(const std::vector<Dims>& shapes, const std::string& where,
                   std::vector<std::vector<int64_t>>* offsets);

// The int64 values of a 0-D or 1-D integer tensor (shape inputs like Reshape's).
std::vector<int64_t> to_int64s(const Tensor& t, const std::string& where);

// All elements of a float or integer tensor as doubles, and back: for kernels whose math is
// easiest to state once in double precision (attention, normalizations, losses).
std::vector<double> to_doubles(const Tensor& t, const std::string& where);
Tensor from_doubles(DType dtype, Dims shape, const std::vector<double>& v,
                    const std::string& where);

// The elements before `axis` (outer) and the bytes of those after it (inner), for copying
// slices along `axis` of a contiguous tensor with memcpy.
inline std::pair<int64_t, size_t> split_at(const Dims& shape, int64_t axis, size_t itemsize) {
  int64_t outer = 1;
  size_t inner = itemsize;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d < axis) outer *= shape[d];
    if (d > axis) inner *= static_cast<size_t>(shape[d]);
  }
  return {outer, inner};
}

// Row-major multi-index of a flat index.
inline void unravel(int64_t flat, const Dims& shape, Dims& idx) {
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = shape[k] ? flat % shape[k] : 0;
    flat = shape[k] ? flat / shape[k] : 0;
  }
}

}  // namespace pto::reference
