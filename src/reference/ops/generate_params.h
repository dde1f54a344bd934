// The parameters of the generator ops (Range, ConstantOfShape, Shape) read and checked once, for
// the reference kernels (generate.cpp, tensor.cpp) and the CPU backend's
// (backend/cpu/generate.cpp): same attributes, same errors, same element values.
#pragma once

#include <type_traits>
#include <vector>

#include "cast.h"
#include "pto/reference.h"

namespace pto::reference {

// Range: the output's length, max(ceil((limit - start) / delta), 0), after checking that start,
// limit and delta are scalars of one dtype (float or signed integer) and delta is not 0.
int64_t range_length(const KernelContext& c);

// Range's element i: start + i * delta, for integers wrapping modulo 2^bits, for floats computed
// in double and rounded once.
template <class T>
T range_value(T start, T delta, int64_t i) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(static_cast<uint64_t>(start) +
                          static_cast<uint64_t>(i) * static_cast<uint64_t>(delta));
  else
    return cast_value<T>(cast_value<double>(start) +
                         static_cast<double>(i) * cast_value<double>(delta));
}

// ConstantOfShape: the output shape (input 0, checked) and the one-element value (attribute
// `value`, float32 0 when absent).
Dims constant_of_shape_dims(const KernelContext& c);
Tensor constant_of_shape_value(const KernelContext& c);

// Shape: the dims of input 0 that the output lists, [start, end) after clamping (opset 15).
std::vector<int64_t> shape_output(const KernelContext& c);

}  // namespace pto::reference
