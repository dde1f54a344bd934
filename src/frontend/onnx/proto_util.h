// Internal to the ONNX frontend: TensorProto and type conversions.
#pragma once

#include <string>

#include "onnx.pb.h"
#include "pto/tensor.h"

namespace pto::onnx {

// ONNX TensorProto.data_type -> DType; throws UnsupportedError naming `where` for types PyPTO does
// not have (string, complex, float8, int4).
DType dtype_from_onnx(int32_t elem_type, const std::string& where);

// Converts a TensorProto (typed fields, raw_data or external data under `base_dir`) to a Tensor.
// Validates that the data matches the shape exactly; `where` prefixes error messages.
Tensor tensor_from_proto(const ::onnx::TensorProto& t, const std::string& base_dir,
                         const std::string& where);

}  // namespace pto::onnx
