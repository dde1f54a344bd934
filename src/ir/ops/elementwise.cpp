// Elementwise op definitions: unary math and activations, binary arithmetic with broadcasting,
// comparisons and logic, variadic Sum/Mean/Max/Min and Where.
#include "infer_util.h"

namespace pto {
namespace {

// Opset 1's buffer-reuse hint on many ops; accepted and ignored.
AttrDef consumed_inputs() {
  return optional_attr("consumed_inputs", AttrKind::kInts, "opset 1 only; ignored");
}

// Arithmetic and comparisons before opset 7: explicit broadcasting of B from `axis`.
AttrSchema legacy_broadcast() {
  return {{"broadcast", int64_t{0}, "opset < 7: 1 to broadcast B"},
          optional_attr("axis", AttrKind::kInt, "opset < 7: where B's dims start in A")};
}

// One input, output of the input's type.
void unary(OpRegistry& r, const std::string& name, AttrSchema attrs = AttrSchema::none()) {
  r.add({.name = name,
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kElementwise | kInPlace,
         .attrs = std::move(attrs),
         .infer = [](InferContext& c) { infer::same_as_input(c); }});
}

// One input, bool output of the input's shape (IsNaN, IsInf).
void predicate(OpRegistry& r, const std::string& name, AttrSchema attrs) {
  r.add({.name = name,
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kElementwise,
         .attrs = std::move(attrs),
         .infer = [](InferContext& c) {
           if (c.has_input(0)) infer::set(c, 0, DType::kBool, c.inputs[0].shape);
         }});
}

// Two inputs broadcast numpy-style; output of input 0's dtype.
void binary(OpRegistry& r, const std::string& name, uint32_t extra, AttrSchema attrs) {
  r.add({.name = name,
         .min_inputs = 2,
         .max_inputs = 2,
         .properties = kElementwise | kBroadcast | kInPlace | extra,
         .attrs = std::move(attrs),
         .infer = [](InferContext& c) { infer::broadcast(c); }});
}

// Two inputs broadcast numpy-style; bool output.
void comparison(OpRegistry& r, const std::string& name, uint32_t extra, AttrSchema attrs) {
  r.add({.name = name,
         .min_inputs = 2,
         .max_inputs = 2,
         .properties = kElementwise | kBroadcast | extra,
         .attrs = std::move(attrs),
         .infer = [](InferContext& c) { infer::broadcast(c, DType::kBool); }});
}

// One or more inputs broadcast numpy-style; output of input 0's dtype.
void variadic(OpRegistry& r, const std::string& name) {
  r.add({.name = name,
         .min_inputs = 1,
         .max_inputs = -1,
         .properties = kElementwise | kBroadcast | kInPlace | kCommutative,
         .attrs = {consumed_inputs()},
         .infer = [](InferContext& c) { infer::broadcast(c); }});
}

}  // namespace

void register_elementwise_ops(OpRegistry& r) {
  // Unary math, logic and activations: output has the input's dtype and shape.
  for (const char* op :
       {"Sin",   "Cos",   "Tan",      "Asin",     "Acos",      "Atan", "Sinh",
        "Cosh",  "Asinh", "Acosh",    "Atanh",    "Erf",       "Not",  "BitwiseNot",
        "Round", "Sign",  "Softplus", "Softsign", "HardSwish", "Mish"})
    unary(r, op);
  // Identity also passes sequences and optionals on (its reference kernel; the CPU one sees
  // tensors only, as the runtime gives every node with such a value to the reference backend).
  r.add({.name = "Identity",
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kElementwise | kInPlace | kNonTensorValues,
         .attrs = AttrSchema::none(),
         .infer = [](InferContext& c) { infer::same_as_input(c); }});
  // These took opset 1's consumed_inputs.
  for (const char* op : {"Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Relu",
                         "Sigmoid", "Tanh"})
    unary(r, op, {consumed_inputs()});
  unary(r, "Elu", {{"alpha", 1.0}, consumed_inputs()});
  unary(r, "Selu",
        {{"alpha", 1.67326319217681884765625},
         {"gamma", 1.05070102214813232421875},
         consumed_inputs()});
  unary(r, "Celu", {{"alpha", 1.0}});
  unary(r, "LeakyRelu", {{"alpha", 0.01}, consumed_inputs()});
  unary(r, "HardSigmoid", {{"alpha", 0.2}, {"beta", 0.5}, consumed_inputs()});
  unary(r, "ThresholdedRelu", {{"alpha", 1.0}});
  unary(r, "Shrink", {{"bias", 0.0}, {"lambd", 0.5}});
  unary(r, "Gelu", {{"approximate", "none", "\"none\" (erf) or \"tanh\""}});
  unary(r, "Swish", {{"alpha", 1.0, "x * sigmoid(alpha * x)"}});
  predicate(r, "IsNaN", AttrSchema::none());
  predicate(r, "IsInf", {bool_attr("detect_negative", true), bool_attr("detect_positive", true)});

  // PRelu: slope broadcasts unidirectionally to X, so the output is X's type.
  r.add({.name = "PRelu",
         .min_inputs = 2,
         .max_inputs = 2,
         .properties = kElementwise | kBroadcast | kInPlace,
         .attrs = {consumed_inputs()},
         .infer = [](InferContext& c) { infer::same_as_input(c); }});
  // Clip: min and max are attributes before opset 11, optional scalar inputs from 11.
  r.add({.name = "Clip",
         .min_inputs = 1,
         .max_inputs = 3,
         .properties = kElementwise | kBroadcast | kInPlace,
         .attrs = {optional_attr("min", AttrKind::kFloat, "opset < 11; absent: no lower bound"),
                   optional_attr("max", AttrKind::kFloat, "opset < 11; absent: no upper bound"),
                   consumed_inputs()},
         .infer = [](InferContext& c) { infer::same_as_input(c); }});

  // Add, Sub, Mul, Div (opset 1 also consumed_inputs), And, Or, Xor, Pow and the comparisons took
  // legacy broadcasting attributes before opset 7; the newer ops none.
  const AttrSchema arith = legacy_broadcast().with({consumed_inputs()});
  for (const char* op : {"Add", "Mul"}) binary(r, op, kCommutative, arith);
  for (const char* op : {"Sub", "Div"}) binary(r, op, 0, arith);
  for (const char* op : {"And", "Or", "Xor"}) binary(r, op, kCommutative, legacy_broadcast());
  for (const char* op : {"BitwiseAnd", "BitwiseOr", "BitwiseXor"})
    binary(r, op, kCommutative, AttrSchema::none());
  binary(r, "Pow", 0, legacy_broadcast());
  binary(r, "Mod", 0, {bool_attr("fmod", false, "1: C fmod (sign of the dividend)")});
  binary(r, "BitShift", 0, {required_attr("direction", AttrKind::kString, "LEFT or RIGHT")});

  comparison(r, "Equal", kCommutative, legacy_broadcast());
  for (const char* op : {"Less", "Greater"}) comparison(r, op, 0, legacy_broadcast());
  for (const char* op : {"LessOrEqual", "GreaterOrEqual"}) comparison(r, op, 0, AttrSchema::none());

  for (const char* op : {"Sum", "Max", "Min", "Mean"}) variadic(r, op);

  // SwiGLU(a, b) = a * sigmoid(alpha * a) * b on two tensors of one shape (no broadcasting).
  r.add({.name = "SwiGLU",
         .min_inputs = 2,
         .max_inputs = 2,
         .properties = kElementwise | kInPlace,
         .attrs = {{"alpha", 1.0}},
         .infer = [](InferContext& c) { infer::same_as_input(c); }});

  // Where(cond, x, y): three-way broadcast; output has x's dtype.
  r.add({.name = "Where",
         .min_inputs = 3,
         .max_inputs = 3,
         .properties = kElementwise | kBroadcast,
         .attrs = AttrSchema::none(),
         .infer = [](InferContext& c) {
           infer::broadcast(c, c.has_input(1) ? c.inputs[1].dtype : DType::kUndefined);
         }});
}

}  // namespace pto
