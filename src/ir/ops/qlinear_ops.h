// ONNX Runtime's QOperator ops (domain com.microsoft), as onnxruntime.quantization.quantize_static
// writes them with quant_format=QuantFormat.QOperator. Each applies a float op to dequantized
// inputs and quantizes the result with y's scale and zero point:
//
//   QLinearAdd(A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp)   = Q(Add(DQ(A), DQ(B)))
//   QLinearMul                                      (same inputs)   = Q(Mul(DQ(A), DQ(B)))
//   QLinearSigmoid | QLinearLeakyRelu{alpha} | QLinearSoftmax{axis, opset} |
//   QLinearGlobalAveragePool{channels_last} | QLinearAveragePool{AveragePool's, channels_last}
//       (X, X_scale, X_zp, Y_scale, Y_zp)                           = Q(op(DQ(X)))
//   QLinearConcat{axis}(Y_scale, Y_zp, X0, X0_scale, X0_zp, ...)    = Q(Concat(DQ(X0), ...))
//   QLinearWhere(cond, X, X_scale, X_zp, Y, Y_scale, Y_zp, Z_scale, Z_zp)
//                                                                   = Q(Where(cond, DQ(X), DQ(Y)))
//
// where DQ(q) = (q - zp) * scale and Q(y) = saturate(round_half_even(y / scale) + zp), every scale
// and zero point one value. QGemm (A, a_scale, a_zp, B, b_scale, b_zp, [C], [y_scale, y_zp])
// {alpha, transA, transB} is the integer Gemm: acc = (A - a_zp)' (B - b_zp)' + C in int32 (B's
// scale and zero point per tensor or per column), Y = Q(alpha * a_scale * b_scale * acc), or that
// float value itself without y_scale.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pto/graph.h"

namespace pto::qlinear {

// One input of the float op: node input `input` as it is, or (quantized) the dequantized value
// of inputs input, input + 1 (scale) and input + 2 (zero point).
struct Operand {
  size_t input = 0;
  bool quantized = true;
};

struct Form {
  std::string float_op;
  std::vector<Operand> operands;  // the float op's inputs, in order
  size_t y_scale = 0;             // the output's scale; its zero point is the next input
};

// The form of node n (its op and, for QLinearConcat, its input count); nullopt for other ops
// (QGemm included: it is an integer product, not a float op between Q and DQ).
std::optional<Form> form_of(const Node& n);

// The ops form_of knows (QLinearAdd, ..., QLinearConcat).
std::vector<std::string> form_ops();

// Whether the importer reads `op` of domain com.microsoft as the PyPTO op of that name.
bool is_contrib_op(std::string_view op);

}  // namespace pto::qlinear
