// Elementwise op definitions: unary math and activations, binary arithmetic with broadcasting,
// comparisons and logic, variadic Sum/Mean/Max/Min and Where.
#include "infer_util.h"

namespace pto {
namespace {

// One input, output of the input's type.
void unary(OpRegistry& r, const std::string& name) {
  r.add({.name = name,
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kElementwise | kInPlace,
         .infer = [](InferContext& c) { infer::same_as_input(c); }});
}

// One input, bool output of the input's shape (IsNaN, IsInf).
void predicate(OpRegistry& r, const std::string& name) {
  r.add({.name = name,
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kElementwise,
         .infer = [](InferContext& c) {
           if (c.has_input(0)) infer::set(c, 0, DType::kBool, c.inputs[0].shape);
         }});
}

// Two inputs broadcast numpy-style; output of input 0's dtype.
void binary(OpRegistry& r, const std::string& name, uint32_t extra = 0) {
  r.add({.name = name,
         .min_inputs = 2,
         .max_inputs = 2,
         .properties = kElementwise | kBroadcast | kInPlace | extra,
         .infer = [](InferContext& c) { infer::broadcast(c); }});
}

// Two inputs broadcast numpy-style; bool output.
void comparison(OpRegistry& r, const std::string& name, uint32_t extra = 0) {
  r.add({.name = name,
         .min_inputs = 2,
         .max_inputs = 2,
         .properties = kElementwise | kBroadcast | extra,
         .infer = [](InferContext& c) { infer::broadcast(c, DType::kBool); }});
}

// One or more inputs broadcast numpy-style; output of input 0's dtype.
void variadic(OpRegistry& r, const std::string& name, uint32_t extra = 0) {
  r.add({.name = name,
         .min_inputs = 1,
         .max_inputs = -1,
         .properties = kElementwise | kBroadcast | kInPlace | extra,
         .infer = [](InferContext& c) { infer::broadcast(c); }});
}

}  // namespace

void register_elementwise_ops(OpRegistry& r) {
  // Unary math, logic and activations: output has the input's dtype and shape.
  for (const char* op : {"Abs",        "Neg",     "Exp",  "Log",        "Sqrt",
                         "Reciprocal", "Floor",   "Ceil", "Round",      "Sign",
                         "Sin",        "Cos",     "Tan",  "Asin",       "Acos",
                         "Atan",       "Sinh",    "Cosh", "Asinh",      "Acosh",
                         "Atanh",      "Erf",     "Not",  "BitwiseNot", "Identity",
                         "Relu",       "Sigmoid", "Tanh", "Softplus",   "Softsign",
                         "Elu",        "Selu",    "Celu", "LeakyRelu",  "HardSigmoid",
                         "HardSwish",  "Mish",    "Gelu", "Swish",      "ThresholdedRelu",
                         "Shrink"})
    unary(r, op);
  predicate(r, "IsNaN");
  predicate(r, "IsInf");

  // PRelu: slope broadcasts unidirectionally to X, so the output is X's type.
  r.add({.name = "PRelu",
         .min_inputs = 2,
         .max_inputs = 2,
         .properties = kElementwise | kBroadcast | kInPlace,
         .infer = [](InferContext& c) { infer::same_as_input(c); }});
  // Clip: min and max are attributes before opset 11, optional scalar inputs from 11.
  r.add({.name = "Clip",
         .min_inputs = 1,
         .max_inputs = 3,
         .properties = kElementwise | kBroadcast | kInPlace,
         .infer = [](InferContext& c) { infer::same_as_input(c); }});

  for (const char* op : {"Add", "Mul", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "And", "Or", "Xor"})
    binary(r, op, kCommutative);
  for (const char* op : {"Sub", "Div", "Pow", "Mod", "BitShift"}) binary(r, op);

  comparison(r, "Equal", kCommutative);
  for (const char* op : {"Less", "Greater", "LessOrEqual", "GreaterOrEqual"}) comparison(r, op);

  variadic(r, "Sum", kCommutative);
  variadic(r, "Max", kCommutative);
  variadic(r, "Min", kCommutative);
  variadic(r, "Mean", kCommutative);

  // SwiGLU(a, b) = a * sigmoid(alpha * a) * b on two tensors of one shape (no broadcasting).
  r.add({.name = "SwiGLU",
         .min_inputs = 2,
         .max_inputs = 2,
         .properties = kElementwise | kInPlace,
         .infer = [](InferContext& c) { infer::same_as_input(c); }});

  // Where(cond, x, y): three-way broadcast; output has x's dtype.
  r.add({.name = "Where",
         .min_inputs = 3,
         .max_inputs = 3,
         .properties = kElementwise | kBroadcast,
         .infer = [](InferContext& c) {
           infer::broadcast(c, c.has_input(1) ? c.inputs[1].dtype : DType::kUndefined);
         }});
}

}  // namespace pto
