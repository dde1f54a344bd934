// Shared pieces of shape and dtype inference for the op families in src/ir/ops.
#pragma once

#include <optional>
#include <vector>

#include "pto/op_registry.h"
#include "pto/shape_value.h"

namespace pto::infer {

// Output i has input j's type (dtype and shape).
void same_as_input(InferContext& c, size_t out = 0, size_t in = 0);

// All present inputs broadcast numpy-style; output dtype is `dtype`, or input 0's when undefined.
void broadcast(InferContext& c, DType dtype = DType::kUndefined);

// The constant data of input i as int64s, when it is an initializer of an integer type.
std::optional<std::vector<int64_t>> constant_ints(const InferContext& c, size_t i);

// The shape value (symbolic contents) of integer input i, when type inference knows it.
const ShapeValue* shape_value(const InferContext& c, size_t i);

// Sets output `out` to dtype with the given shape (nullopt: unknown rank).
void set(InferContext& c, size_t out, DType dtype, std::optional<Shape> shape);

// A convolution's output (Conv, ConvInteger, QLinearConv; nn.cpp): `dtype`, shape [N, M, out...]
// with M from W (input w_input) and the spatial sizes from the window attributes.
void conv_output(InferContext& c, size_t w_input, DType dtype);

// Registers a single-output kOpaque op (heavy or irregular: GridSample, DFT, ...).
void add_opaque(OpRegistry& r, const std::string& name, int min_inputs, int max_inputs,
                AttrSchema attrs, InferFn infer, std::string doc);

}  // namespace pto::infer
