// LowerQdqToInteger: the QDQ form of a quantized model (what onnxruntime.quantization.
// quantize_static writes by default, and PyTorch's pt2e export), where a float MatMul or Conv
// reads dequantized 8-bit tensors,
//
//   y = MatMul(DequantizeLinear(xq, xs, xz), DequantizeLinear(W, ws, wz))        (W constant)
//   y = Conv(DequantizeLinear(xq, xs, xz), DequantizeLinear(W, ws, wz), bias)
//   y = Gemm(DequantizeLinear(xq, xs, xz), DequantizeLinear(W, ws, wz), C)   (alpha = beta = 1)
//
// becomes the integer product it stands for, on the int8 kernels:
//
//   y = Cast<float>(MatMulInteger(xq, W, xz, wz)) * (xs * ws)      (ConvInteger for Conv)
//   y = Cast<float>(ConvInteger(xq, W, xz, wz)) * (xs * ws[c]) + bias[c]
//   y = Cast<float>(MatMulInteger(xq, W', xz, wz)) * (xs * ws) + C        (W' = W^T if transB)
//
// with xs * ws formed once in float32 (one value, or one per output channel). Mathematically the
// same: both compute sum (xq - xz)(W - wz) xs ws; the integer form sums exactly and rounds once,
// where the float form rounds each dequantized operand and the running sum, so results move by
// float rounding (a few ulps of the output), never by a quantization step. x's scale and zero
// point must be one value (per tensor); W's one value or one per output channel (MatMul: W's
// column, axis 1; Conv: axis 0). Other forms, and DequantizeLinear of a weight with other
// readers, are left alone (the DequantizeLinear nodes stay for their other readers, or go with
// dead code).
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

struct Dequantized {
  ValueId q = kNoValue, zp = kNoValue;
  const Tensor* scale = nullptr;
  int64_t axis = 0;
};

// v = DequantizeLinear(q, scale, zp) of 8-bit q with a constant float32 scale, not blocked.
std::optional<Dequantized> dequantized(const Graph& g, ValueId v) {
  const Node* n = producer(g, v);
  if (!n || n->op != "DequantizeLinear" || n->inputs.size() < 2 || n->outputs[0] != v)
    return std::nullopt;
  if (n->attrs.get_int("block_size", 0) != 0 || n->attrs.get_int("output_dtype", 0) != 0)
    return std::nullopt;
  const DType qt = dtype_of_value(g, n->inputs[0]);
  if (qt != DType::kU8 && qt != DType::kI8) return std::nullopt;
  Dequantized d;
  d.q = n->inputs[0];
  d.scale = constant(g, n->inputs[1]);
  if (!d.scale || d.scale->dtype() != DType::kF32 || d.scale->rank() > 1) return std::nullopt;
  d.axis = n->attrs.get_int("axis", 1);
  if (n->inputs.size() > 2 && n->inputs[2] != kNoValue) {
    const Tensor* z = constant(g, n->inputs[2]);
    if (!z || z->dtype() != qt || z->numel() != d.scale->numel()) return std::nullopt;
    d.zp = n->inputs[2];
  }
  return d;
}

// Whether d's scale is one value, or one per entry of W's axis `want` (of rank `rank`).
bool per_tensor_or_axis(const Dequantized& d, int64_t want, int64_t rank, int64_t extent) {
  if (d.scale->numel() == 1) return true;
  const int64_t axis = d.axis < 0 ? d.axis + rank : d.axis;
  return axis == want && d.scale->numel() == extent;
}

bool lower(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const Node& n = g.nodes()[i];
  const bool conv = n.op == "Conv", gemm = n.op == "Gemm";
  if ((n.op != "MatMul" && !conv && !gemm) || n.inputs.size() < 2 || n.outputs.size() != 1 ||
      dtype_of_value(g, n.outputs[0]) != DType::kF32 || !n.domain.empty())
    return false;
  // Gemm as a plain product: alpha = beta = 1, A not transposed.
  const bool trans_b = gemm && n.attrs.get_int("transB", 0) != 0;
  if (gemm && (n.attrs.get_int("transA", 0) != 0 || n.attrs.get_float("alpha", 1.0) != 1.0 ||
               n.attrs.get_float("beta", 1.0) != 1.0))
    return false;
  const auto x = dequantized(g, n.inputs[0]), w = dequantized(g, n.inputs[1]);
  if (!x || !w || x->scale->numel() != 1) return false;
  const Tensor* wt = constant(g, w->q);
  if (!wt || (conv ? wt->rank() < 3 : wt->rank() != 2)) return false;
  const int64_t out_axis = conv || trans_b ? 0 : 1, channels = wt->dim(out_axis);
  if (!per_tensor_or_axis(*w, out_axis, wt->rank(), channels)) return false;
  // The bias: Conv's, any float32 [M] (onnxruntime writes DequantizeLinear of an int32 bias);
  // Gemm's C, one value or [N].
  const ValueId bias = (conv || gemm) && n.inputs.size() > 2 ? n.inputs[2] : kNoValue;
  if (bias != kNoValue) {
    const TensorType& bt = g.value(bias).type;
    if (bt.dtype != DType::kF32 || !bt.shape || bt.shape->size() > 1 ||
        (bt.shape->size() == 1 && !same_dim((*bt.shape)[0], Dim(channels))) ||
        (conv && bt.shape->size() != 1))
      return false;
  }

  // The combined scale, per output channel where W's is, shaped to broadcast over the output
  // ([N] for MatMul, [M, 1, 1...] for Conv's [N, M, spatial...]).
  const float xs = x->scale->data<float>()[0];
  const int64_t count = w->scale->numel();
  Dims shape = {count};
  if (conv && count > 1)
    for (int64_t d = 2; d < wt->rank(); ++d) shape.push_back(1);
  Tensor scale = Tensor::empty(DType::kF32, count == 1 ? Dims{} : shape);
  for (int64_t c = 0; c < count; ++c) scale.data<float>()[c] = xs * w->scale->data<float>()[c];

  const std::string name = n.name;
  const ValueId y = n.outputs[0];
  const std::optional<Shape> yshape = g.value(y).type.shape;
  const std::string op = conv ? "ConvInteger" : "MatMulInteger";
  Attributes attrs = conv ? n.attrs : Attributes{};
  // MatMulInteger takes W as [K, N]: a transposed Gemm weight is stored transposed.
  ValueId wq = w->q;
  if (trans_b) {
    const int64_t rows = wt->dim(0), cols = wt->dim(1);
    Tensor t = Tensor::empty(wt->dtype(), {cols, rows});
    const Tensor src = wt->contiguous();
    const auto* s8 = static_cast<const uint8_t*>(src.raw_data());
    auto* d8 = static_cast<uint8_t*>(t.raw_data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) d8[c * rows + r] = s8[r * cols + c];
    wq = g.add_constant(g.value(w->q).name + "_t", std::move(t));
  }
  std::vector<ValueId> inputs = {x->q, wq, x->zp, w->zp};
  if (w->zp == kNoValue) inputs.pop_back();
  if (inputs.back() == kNoValue) inputs.pop_back();
  size_t at = i;
  const ValueId acc = g.add_value(g.unique_name(name + "_acc"), {DType::kI32, yshape});
  rw.insert(at++, op, std::move(inputs), {acc}, std::move(attrs), name + "_int");
  const ValueId f = g.add_value(g.unique_name(name + "_float"), {DType::kF32, yshape});
  Attributes to_float;
  to_float.set("to", int64_t{1});
  rw.insert(at++, "Cast", {acc}, {f}, std::move(to_float), name + "_cast");
  const ValueId s = g.add_constant(name + "_scale", std::move(scale));
  if (bias != kNoValue && !conv) {
    const ValueId scaled = g.add_value(g.unique_name(name + "_scaled"), {DType::kF32, yshape});
    rw.insert(at++, "Mul", {f, s}, {scaled}, {}, name + "_scale");
    retarget(g.mutable_nodes()[at], "Add", {scaled, bias});
  } else if (bias != kNoValue) {
    std::vector<int64_t> bshape = {channels};
    for (int64_t d = 2; d < wt->rank(); ++d) bshape.push_back(1);
    Tensor dims = Tensor::empty(DType::kI64, {static_cast<int64_t>(bshape.size())});
    std::copy(bshape.begin(), bshape.end(), dims.data<int64_t>());
    const ValueId shape = g.add_constant(name + "_bias_shape", std::move(dims));
    const ValueId bv = g.add_value(g.unique_name(name + "_bias"), {DType::kF32, std::nullopt});
    rw.insert(at++, "Reshape", {bias, shape}, {bv}, {}, name + "_bias");
    const ValueId scaled = g.add_value(g.unique_name(name + "_scaled"), {DType::kF32, yshape});
    rw.insert(at++, "Mul", {f, s}, {scaled}, {}, name + "_scale");
    retarget(g.mutable_nodes()[at], "Add", {scaled, bv});
  } else {
    retarget(g.mutable_nodes()[at], "Mul", {f, s});
  }
  ctx.note(conv   ? "LowerQdqToInteger/Conv"
           : gemm ? "LowerQdqToInteger/Gemm"
                  : "LowerQdqToInteger/MatMul");
  return true;
}

Graph lower_qdq_to_integer(Graph g, const PassContext& ctx) {
  apply_rules(g, {{nullptr, lower}}, ctx);
  return g;
}

}  // namespace

void register_lower_qdq_to_integer(PassRegistry& r) {
  r.add({"LowerQdqToInteger", lower_qdq_to_integer,
         "runs a MatMul or Conv of DequantizeLinear'd 8-bit tensors (the QDQ form of "
         "onnxruntime's quantize_static) as MatMulInteger / ConvInteger, scaled once"});
}

}  // namespace pto::passes
