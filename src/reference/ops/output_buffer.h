// Scratch buffers sized from data (image and signal kernels): a shape read from an input
// tensor must not be able to exhaust memory, so the buffer is refused with a ValueError past the
// tensor size limit before anything is allocated.
#pragma once

#include <string>
#include <vector>

#include "kernel_util.h"

namespace pto::reference {

// A zeroed vector of `count` elements of T, or a ValueError naming `where` and `what`.
template <class T>
std::vector<T> bounded_buffer(int64_t count, const std::string& where, const char* what) {
  if (count < 0 || static_cast<uint64_t>(count) > max_tensor_bytes() / sizeof(T))
    throw ValueError(
        cat(where, ": ", what, " of ", count, " elements exceeds the tensor size limit"));
  return std::vector<T>(static_cast<size_t>(count), T{});
}

// The same for a kernel's output of `shape`, computed in double before the final cast.
inline std::vector<double> output_buffer(const Dims& shape, const std::string& where) {
  return bounded_buffer<double>(checked_numel(shape, "output"), where, "output");
}

}  // namespace pto::reference
