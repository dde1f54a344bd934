// Pieces shared by the tensor (shape and layout) family's op definitions, which are spread over
// tensor.cpp, generate.cpp and resize.cpp; register_tensor_ops (tensor.cpp) calls each file.
#pragma once

#include <optional>
#include <vector>

#include "infer_util.h"

namespace pto::infer {

// The constant data of input i as doubles, when it is an initializer of a float type.
std::optional<std::vector<double>> constant_floats(const InferContext& c, size_t i);

// An int list given as constant input i (later opsets) or as attribute `name` (earlier ones);
// nullopt when the input is present but not constant, or neither is given.
std::optional<std::vector<int64_t>> ints_input_or_attr(const InferContext& c, size_t i,
                                                       const std::string& name);

// The product of dims: known when all are, the symbol when it is the only non-1 dim, else
// unknown.
Dim product(const Shape& s, size_t begin, size_t end);

// A shape of `rank` unknown dims.
Shape unknown_dims(size_t rank);

}  // namespace pto::infer

namespace pto {

void register_generate_ops(OpRegistry& r);  // generate.cpp: Cast, Constant, Range, EyeLike, ...
void register_resize_ops(OpRegistry& r);    // resize.cpp: Resize, Upsample

}  // namespace pto
