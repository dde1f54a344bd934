// Which ops of domain ai.onnx.ml (classical ML: scikit-learn, LightGBM, XGBoost exports) PyPTO
// reads, from which opset of that domain, and what to do about the others (ZipMap above all).
#pragma once

#include <cstdint>
#include <string>

namespace pto::onnx {

inline constexpr const char* kMlDomain = "ai.onnx.ml";

// Whether PyPTO reads op `op` of ai.onnx.ml (ir/ops/ml.cpp defines them).
bool is_ml_op(const std::string& op);

// Checks that op `op` exists at ai.onnx.ml opset `opset` as PyPTO reads it: ValueError or
// UnsupportedError naming `where` otherwise.
void check_ml_opset(const std::string& op, int64_t opset, const std::string& where);

// " (...)": what to do about an ai.onnx.ml op PyPTO does not read.
std::string ml_unsupported_hint(const std::string& op);

}  // namespace pto::onnx
