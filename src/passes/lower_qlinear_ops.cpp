// LowerQLinearOps: ONNX Runtime's QOperator ops (domain com.microsoft, src/ir/ops/qlinear_ops.h),
// which onnxruntime.quantization.quantize_static writes with QuantFormat.QOperator, become the
// QDQ form they stand for, so that the float kernels and the elementwise fusion run them:
//
//   QLinearAdd(a, as, az, b, bs, bz, ys, yz)
//       ->  QuantizeLinear(Add(DQ(a, as, az), DQ(b, bs, bz)), ys, yz)
//   (Mul, Sigmoid, LeakyRelu, Softmax, GlobalAveragePool, AveragePool, Concat, Where alike)
//   QGemm(a, as, az, b, bs, bz, c, ys, yz){alpha, transA, transB}
//       ->  QuantizeLinear(Gemm{alpha, transA, transB}(DQ(a), DQ(b), DQ(c, alpha*as*bs)), ys, yz)
//
// QGemm without ys: the Gemm is the output. LowerQdqToInteger, which runs next, makes the Gemm
// of dequantized operands MatMulInteger plus a float epilogue. Also:
//   - a QLinearMatMul with a batched B (rank > 2, which the int8 kernels do not take: attention's
//     Q K^T and P V) becomes DQ -> MatMul -> Q;
//   - a MaxPool of 8-bit values runs in float between DQ and Q with scale 1 (exact);
//   - a QLinearConcat whose inputs all have the output's scale and zero point is a Concat of the
//     8-bit values (exact).
// Not bit-exact otherwise: ONNX Runtime rounds once from its float32 (or lookup-table) result,
// the QDQ form after float32 arithmetic, so an output can differ by one step of its grid where
// the exact value lies near a rounding edge. Nodes whose scales are not single values, or whose
// QGemm scales are not constants, are left to the reference kernels.
#include "ir/ops/qlinear_ops.h"
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

// Whether v is one value (a scale or zero point per tensor), or absent.
bool one_value(const Graph& g, ValueId v) {
  if (v == kNoValue) return true;
  const std::optional<Dims> d = static_dims(g, v);
  return d && checked_numel(*d) == 1;
}

ValueId input_or_none(const Node& n, size_t i) {
  return i < n.inputs.size() ? n.inputs[i] : kNoValue;
}

// Whether two scale (or zero point) inputs hold the same constant value.
bool same_constant(const Graph& g, ValueId a, ValueId b) {
  if (a == b) return true;
  const Tensor *x = constant(g, a), *y = constant(g, b);
  return x && y && x->dtype() == y->dtype() && x->numel() == 1 && y->numel() == 1 &&
         to_doubles(*x) == to_doubles(*y);
}

// DequantizeLinear(q, scale, zp) inserted at `at`, as a new float32 value; `axis` for a per-axis
// scale.
ValueId dequantize(Rewrite& rw, size_t& at, ValueId q, ValueId scale, ValueId zp,
                   const std::string& name, int64_t axis = 1) {
  Graph& g = rw.graph();
  const ValueId f =
      g.add_value(g.unique_name(g.value(q).name + "_dq"), {DType::kF32, g.value(q).type.shape});
  std::vector<ValueId> inputs = {q, scale};
  if (zp != kNoValue) inputs.push_back(zp);
  Attributes attrs;
  if (axis != 1) attrs.set("axis", axis);
  rw.insert(at++, "DequantizeLinear", std::move(inputs), {f}, std::move(attrs), name + "_dq");
  return f;
}

// The matched node `n`, now at `at`, becomes `op` of the default domain on `inputs`, followed by
// QuantizeLinear(., ys, yz) unless ys is kNoValue.
void become(Rewrite& rw, size_t at, const Node& n, const std::string& op,
            std::vector<ValueId> inputs, Attributes attrs, int opset, ValueId ys, ValueId yz) {
  Graph& g = rw.graph();
  std::string last = op;
  if (ys != kNoValue) {
    const ValueId y = g.add_value(g.unique_name(n.name + "_float"),
                                  {DType::kF32, g.value(n.outputs[0]).type.shape});
    rw.insert(at++, op, std::move(inputs), {y}, std::move(attrs), n.name + "_float", opset);
    last = "QuantizeLinear";
    inputs = {y, ys};
    if (yz != kNoValue) inputs.push_back(yz);
    attrs = {};
    opset = 0;
  }
  Node& m = g.mutable_nodes()[at];
  retarget(m, last, std::move(inputs), std::move(attrs), opset);
  m.domain.clear();
}

bool lower_form(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const Node n = g.nodes()[i];  // a copy: inserting nodes moves it
  std::optional<qlinear::Form> f = qlinear::form_of(n);
  // QLinearMatMul (default domain) has the binary layout; the int8 kernels take a B of rank 2,
  // so one of a batched B (attention's Q K^T and P V) goes the float way too.
  if (n.op == "QLinearMatMul" && n.inputs.size() == 8 && g.value(n.inputs[3]).type.shape &&
      g.value(n.inputs[3]).type.shape->size() > 2)
    f = qlinear::Form{"MatMul", {{0, true}, {3, true}}, 6};
  if (!f || n.outputs.size() != 1 || n.attrs.get_int("channels_last", 0) != 0) return false;
  const ValueId ys = input_or_none(n, f->y_scale), yz = input_or_none(n, f->y_scale + 1);
  const DType out = dtype_of_value(g, n.outputs[0]);
  // QuantizeLinear without a zero point gives uint8.
  if (ys == kNoValue || (yz == kNoValue && out != DType::kU8) || !one_value(g, ys) ||
      !one_value(g, yz))
    return false;
  for (const qlinear::Operand& o : f->operands)
    if (o.quantized && (!one_value(g, input_or_none(n, o.input + 1)) ||
                        !one_value(g, input_or_none(n, o.input + 2))))
      return false;

  // A Concat of inputs all on the output's grid moves values and needs no detour through float.
  const bool on_output_grid =
      f->float_op == "Concat" &&
      std::all_of(f->operands.begin(), f->operands.end(), [&](const qlinear::Operand& o) {
        const ValueId s = n.inputs[o.input], z = input_or_none(n, o.input + 2);
        return same_constant(g, s, ys) &&
               (z == yz || (z != kNoValue && yz != kNoValue && same_constant(g, z, yz)));
      });
  Attributes attrs = without(without(n.attrs, "channels_last"), "opset");
  int opset = 0;
  if (n.op == "QLinearSoftmax") {  // its axis defaults to -1 whatever the opset says
    attrs.set("axis", n.attr_int("axis"));
    opset = static_cast<int>(n.attr_int("opset"));
  }
  size_t at = i;
  std::vector<ValueId> operands;
  for (const qlinear::Operand& o : f->operands)
    operands.push_back(!o.quantized || on_output_grid
                           ? n.inputs[o.input]
                           : dequantize(rw, at, n.inputs[o.input], n.inputs[o.input + 1],
                                        input_or_none(n, o.input + 2), n.name));
  become(rw, at, n, f->float_op, std::move(operands), std::move(attrs), opset,
         on_output_grid ? kNoValue : ys, yz);
  ctx.note(cat("LowerQLinearOps/", n.op));
  return true;
}

// alpha * a_scale * b_scale as a float32 constant (one value, or one per column of b_scale's).
std::optional<Tensor> bias_scale(const Graph& g, const Node& n) {
  const Tensor *as = constant(g, n.inputs[1]), *bs = constant(g, n.inputs[4]);
  if (!as || !bs || as->dtype() != DType::kF32 || bs->dtype() != DType::kF32 || as->numel() != 1 ||
      bs->rank() > 1)
    return std::nullopt;
  const float alpha = static_cast<float>(n.attr_float("alpha"));
  const float a = alpha * as->contiguous().data<float>()[0];
  Tensor s = Tensor::empty(DType::kF32, bs->shape());
  const Tensor b = bs->contiguous();
  for (int64_t k = 0; k < b.numel(); ++k) s.data<float>()[k] = a * b.data<float>()[k];
  return s;
}

bool lower_qgemm(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const Node n = g.nodes()[i];
  if (n.op != "QGemm" || n.outputs.size() != 1 || n.inputs.size() < 6) return false;
  const ValueId c = input_or_none(n, 6), ys = input_or_none(n, 7), yz = input_or_none(n, 8);
  std::optional<Tensor> cs = bias_scale(g, n);
  const DType out = dtype_of_value(g, n.outputs[0]);
  if (!cs || !one_value(g, n.inputs[2]) || !one_value(g, ys) || !one_value(g, yz) ||
      (ys != kNoValue && yz == kNoValue && out != DType::kU8))
    return false;
  const bool trans_b = n.attr_int("transB") != 0;
  const int64_t columns = cs->numel();
  // A per-column scale dequantizes C along its last axis, which must then be the columns.
  std::optional<Dims> cdims = c == kNoValue ? std::nullopt : static_dims(g, c);
  if (c != kNoValue && (!cdims || (columns > 1 && (cdims->empty() || cdims->back() != columns))))
    return false;

  size_t at = i;
  const ValueId a = dequantize(rw, at, n.inputs[0], n.inputs[1], input_or_none(n, 2), n.name);
  const ValueId b = dequantize(rw, at, n.inputs[3], n.inputs[4], input_or_none(n, 5), n.name + "_b",
                               trans_b ? 0 : 1);
  std::vector<ValueId> inputs = {a, b};
  if (c != kNoValue) {
    const ValueId s = g.add_constant(n.name + "_bias_scale", std::move(*cs));
    const int64_t axis = cdims->empty() ? 1 : static_cast<int64_t>(cdims->size()) - 1;
    inputs.push_back(dequantize(rw, at, c, s, kNoValue, n.name + "_bias", axis));
  }
  // alpha, transA and transB, as Gemm's
  become(rw, at, n, "Gemm", std::move(inputs), n.attrs, 0, ys, yz);
  ctx.note("LowerQLinearOps/QGemm");
  return true;
}

// MaxPool of 8-bit values (QuantFormat.QOperator keeps MaxPool on the quantized tensor):
// DequantizeLinear with scale 1, float MaxPool, QuantizeLinear with scale 1 (the CPU kernels'
// conversions); exact, as every 8-bit value is a float32.
bool max_pool_in_float(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const Node n = g.nodes()[i];
  const DType dt =
      n.op == "MaxPool" && !n.inputs.empty() ? dtype_of_value(g, n.inputs[0]) : DType::kUndefined;
  if ((dt != DType::kU8 && dt != DType::kI8) || !n.domain.empty() || n.outputs.size() != 1)
    return false;
  const ValueId one = g.add_constant(n.name + "_unit_scale", Tensor::scalar<float>(1.0f));
  const ValueId zero = g.add_constant(n.name + "_zero", Tensor::zeros(dt, {}));
  size_t at = i;
  const ValueId x = dequantize(rw, at, n.inputs[0], one, zero, n.name);
  become(rw, at, n, "MaxPool", {x}, n.attrs, n.opset, one, zero);
  ctx.note("LowerQLinearOps/MaxPool");
  return true;
}

Graph lower_qlinear_ops(Graph g, const PassContext& ctx) {
  apply_rules(g, {{nullptr, lower_form}, {nullptr, lower_qgemm}, {nullptr, max_pool_in_float}},
              ctx);
  return g;
}

}  // namespace

void register_lower_qlinear_ops(PassRegistry& r) {
  r.add({"LowerQLinearOps", lower_qlinear_ops,
         "rewrites onnxruntime's QOperator ops (QLinearAdd, QGemm, ...; domain com.microsoft) "
         "into DequantizeLinear -> float op -> QuantizeLinear, which the float kernels run"});
}

}  // namespace pto::passes
