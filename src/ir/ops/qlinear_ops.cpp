// ONNX Runtime's QOperator ops (qlinear_ops.h): their input layouts, and inference that asks the
// float op's own inference for the shape.
#include "ir/ops/qlinear_ops.h"

#include <algorithm>
#include <array>

#include "infer_util.h"

namespace pto {
namespace qlinear {
namespace {

// The QLinear ops with a fixed layout; QLinearConcat's is built from its input count.
struct FixedForm {
  std::string_view op, float_op;
  enum Layout { kUnary, kBinary, kWhere } layout;
};

constexpr std::array<FixedForm, 8> kFixed = {{
    {"QLinearAdd", "Add", FixedForm::kBinary},
    {"QLinearMul", "Mul", FixedForm::kBinary},
    {"QLinearSigmoid", "Sigmoid", FixedForm::kUnary},
    {"QLinearLeakyRelu", "LeakyRelu", FixedForm::kUnary},
    {"QLinearSoftmax", "Softmax", FixedForm::kUnary},
    {"QLinearGlobalAveragePool", "GlobalAveragePool", FixedForm::kUnary},
    {"QLinearAveragePool", "AveragePool", FixedForm::kUnary},
    {"QLinearWhere", "Where", FixedForm::kWhere},
}};

}  // namespace

std::optional<Form> form_of(const Node& n) {
  if (n.op == "QLinearConcat") {
    Form f{"Concat", {}, 0};
    for (size_t i = 2; i + 2 < n.inputs.size(); i += 3) f.operands.push_back({i, true});
    return f;
  }
  for (const FixedForm& k : kFixed) {
    if (n.op != k.op) continue;
    switch (k.layout) {
      case FixedForm::kUnary:
        return Form{std::string(k.float_op), {{0, true}}, 3};
      case FixedForm::kBinary:
        return Form{std::string(k.float_op), {{0, true}, {3, true}}, 6};
      case FixedForm::kWhere:
        return Form{std::string(k.float_op), {{0, false}, {1, true}, {4, true}}, 7};
    }
  }
  return std::nullopt;
}

std::vector<std::string> form_ops() {
  std::vector<std::string> ops = {"QLinearConcat"};
  for (const FixedForm& k : kFixed) ops.emplace_back(k.op);
  return ops;
}

bool is_contrib_op(std::string_view op) {
  const std::vector<std::string> ops = form_ops();
  return op == "QGemm" || std::find(ops.begin(), ops.end(), op) != ops.end();
}

}  // namespace qlinear

namespace {

// The float op's inference on the operands (the quantized ones as they are: only their shapes
// matter), with the output dtype the output zero point's, else input `x`'s.
void infer_via_float_op(InferContext& c, const std::string& float_op,
                        const std::vector<size_t>& operands, size_t y_zp, size_t x) {
  const OpDef* def = OpRegistry::global().find(float_op);
  Node n = c.node;
  n.op = float_op;
  n.def = def;
  InferContext inner{n, {}, {}, {TensorType{}}, {}};
  for (size_t i : operands) {
    inner.inputs.push_back(i < c.inputs.size() ? c.inputs[i] : TensorType{});
    inner.constants.push_back(i < c.constants.size() ? c.constants[i] : nullptr);
  }
  def->infer(inner);
  const DType dt = c.has_input(y_zp) ? c.inputs[y_zp].dtype : c.inputs[x].dtype;
  infer::set(c, 0, dt, inner.outputs[0].shape);
}

void infer_qlinear(InferContext& c) {
  if (c.node.attrs.has("channels_last") && c.node.attrs.get_int("channels_last") != 0)
    throw UnsupportedError(cat(c.where(), ": channels_last=1 (NHWC) is not supported"));
  if (c.node.op == "QLinearConcat" && (c.num_inputs() - 2) % 3 != 0)
    throw ValueError(cat(c.where(), ": inputs must be Y_scale, Y_zero_point, then (X, X_scale, ",
                         "X_zero_point) per input; got ", c.num_inputs()));
  const std::optional<qlinear::Form> f = qlinear::form_of(c.node);
  std::vector<size_t> operands;
  for (const qlinear::Operand& o : f->operands) {
    if (!c.has_input(o.input)) return;
    operands.push_back(o.input);
  }
  // The first quantized operand's type when there is no output zero point (Where's first
  // operand is its bool condition).
  const auto x = std::find_if(f->operands.begin(), f->operands.end(),
                              [](const qlinear::Operand& o) { return o.quantized; });
  infer_via_float_op(c, f->float_op, operands, f->y_scale + 1, x->input);
}

// QGemm: Gemm's shape of A, B and C; 8-bit with y_scale (y_zp's type, uint8 without one), float
// without.
void infer_qgemm(InferContext& c) {
  if (!c.has_input(0) || !c.has_input(3)) return;
  infer_via_float_op(c, "Gemm", {0, 3, 6}, 8, 0);
  if (!c.has_input(7))
    c.outputs[0].dtype = DType::kF32;
  else if (!c.has_input(8))
    c.outputs[0].dtype = DType::kU8;
}

AttrSchema attrs_of(const OpRegistry& r, std::string_view float_op) {
  return r.find(float_op)->attrs;
}

}  // namespace

// Registered after the float ops, whose attribute schemas the QLinear ops extend.
void register_qlinear_ops(OpRegistry& r) {
  const std::string kLowered = "LowerQLinearOps at level >= 2 (per-tensor scales)";
  const std::string doc = "com.microsoft: dequantized inputs, the float op, quantized output";
  const AttrDef channels_last{"channels_last", int64_t{0}, "1: NHWC (not supported)"};
  auto add = [&](const char* name, int inputs, int max_inputs, AttrSchema attrs) {
    r.add({.name = name,
           .min_inputs = inputs,
           .max_inputs = max_inputs,
           .properties = kOpaque,
           .attrs = std::move(attrs),
           .infer = infer_qlinear,
           .doc = doc,
           .lowered_by = kLowered});
  };
  add("QLinearAdd", 7, 8, AttrSchema::none());
  add("QLinearMul", 7, 8, AttrSchema::none());
  add("QLinearSigmoid", 4, 5, AttrSchema::none());
  add("QLinearLeakyRelu", 4, 5, attrs_of(r, "LeakyRelu"));
  add("QLinearSoftmax", 4, 5,
      {{"axis", int64_t{-1}}, required_attr("opset", AttrKind::kInt, "the Softmax's opset")});
  add("QLinearGlobalAveragePool", 4, 5, AttrSchema{channels_last});
  add("QLinearAveragePool", 4, 5, attrs_of(r, "AveragePool").with({channels_last}));
  add("QLinearConcat", 5, -1, attrs_of(r, "Concat"));
  add("QLinearWhere", 9, 9, AttrSchema::none());
  r.add({.name = "QGemm",
         .min_inputs = 6,
         .max_inputs = 9,
         .properties = kOpaque,
         .attrs = {{"alpha", 1.0}, bool_attr("transA", false), bool_attr("transB", false)},
         .infer = infer_qgemm,
         .doc = "com.microsoft: (A - a_zp)' (B - b_zp)' + C in int32, scaled by alpha * a_scale "
                "* b_scale; requantized with y_scale, else float",
         .lowered_by = kLowered});
}

}  // namespace pto
