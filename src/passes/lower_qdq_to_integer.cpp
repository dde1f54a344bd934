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
// with xs * ws formed once in float32 (one value, or one per output channel).
// Mathematically the same: both compute sum (xq - xz)(W - wz) xs ws; the integer form sums exactly
// and rounds once, where the float form rounds each dequantized operand and the running sum, so
// results move by float rounding (a few ulps of the output), never by a quantization step. x's
// scale and zero point must be one value (per tensor); W's one value or one per output channel
// (MatMul: W's column, axis 1; Conv: axis 0). Other forms, and DequantizeLinear of a weight with
// other readers, are left alone (the DequantizeLinear nodes stay for their other readers, or go
// with dead code).
//
// When the result is only requantized (QuantizeLinear(y, ys, yz) reads it, directly or through a
// Relu / Clip that the 8-bit range makes a no-op), the whole chain is one op whose epilogue
// requantizes the sums (what onnxruntime runs for this pattern too):
//
//   Q(Conv(DQ(xq), DQ(W), DQ(bq, xs ws)), ys, yz) -> QLinearConv(xq, xs, xz, W, ws, wz, ys, yz, bq)
//   Q(MatMul(DQ(xq), DQ(W)), ys, yz)             -> QLinearMatMul(xq, xs, xz, W, ws, wz, ys, yz)
//
// so an int8 network passes 8-bit tensors from conv to conv, no int32 or float result in between.
// It rounds once, (sum + bq) * (xs ws / ys), where the float form rounds y first: an output may
// move by one step of the 8-bit grid at a tie. A float bias is rounded to the sums' grid
// (integer_bias).
#include <cmath>
#include <cstring>
#include <limits>

#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

struct Dequantized {
  ValueId q = kNoValue, scale_v = kNoValue, zp = kNoValue;
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
  d.scale_v = n->inputs[1];
  d.scale = constant(g, d.scale_v);
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

// The QuantizeLinear that is the only reader of the product's result y, directly or through a
// Relu or Clip that its range makes a no-op: y' = QuantizeLinear(Clip(y, lo, hi), ys, yz) equals
// QuantizeLinear(y, ys, yz) for every y when lo quantizes to the bottom of the 8-bit range and hi
// to the top (Q is monotonic, so values past a bound saturate there anyway). onnxruntime's
// quantize_static removes such activations itself; PyTorch's pt2e keeps them. Per-tensor ys and yz
// only (QLinearConv's y scale is one value).
struct Requantized {
  size_t node = 0;   // the QuantizeLinear
  size_t clamp = 0;  // the absorbed Relu / Clip, or == node when there is none
  ValueId ys = kNoValue, yz = kNoValue;
};

std::optional<Requantized> requantized(Rewrite& rw, ValueId y) {
  const Graph& g = rw.graph();
  const ReaderIndex& readers = rw.readers();
  int32_t r = readers.single_reader(y);
  if (r < 0) return std::nullopt;
  std::optional<std::pair<double, double>> bounds;
  Requantized out;
  if (const Node& a = g.nodes()[static_cast<size_t>(r)]; a.op != "QuantizeLinear") {
    bounds = clamp_bounds(g, a);
    if (!bounds || a.inputs[0] != y || a.outputs.size() != 1) return std::nullopt;
    out.clamp = static_cast<size_t>(r);
    r = readers.single_reader(a.outputs[0]);
    if (r < 0) return std::nullopt;
  }
  out.node = static_cast<size_t>(r);
  if (!bounds) out.clamp = out.node;
  const Node& q = g.nodes()[out.node];
  if (q.op != "QuantizeLinear" || !q.domain.empty() || q.inputs.size() < 2 ||
      q.attrs.get_int("block_size", 0) != 0)
    return std::nullopt;
  const DType qt = dtype_of_value(g, q.outputs[0]);
  const Tensor* ys = constant(g, q.inputs[1]);
  if ((qt != DType::kU8 && qt != DType::kI8) || !ys || ys->dtype() != DType::kF32 ||
      ys->numel() != 1)
    return std::nullopt;
  out.ys = q.inputs[1];
  int64_t zp = 0;
  if (q.inputs.size() > 2 && q.inputs[2] != kNoValue) {
    const Tensor* z = constant(g, q.inputs[2]);
    if (!z || z->dtype() != qt || z->numel() != 1) return std::nullopt;
    zp = static_cast<int64_t>(z->item_as_double());
    out.yz = q.inputs[2];
  }
  if (bounds) {
    // QuantizeLinear's own arithmetic: round half to even of the float quotient, plus yz.
    const float s = ys->data<float>()[0];
    auto quantized = [&](double v) {
      return std::nearbyint(static_cast<double>(static_cast<float>(v) / s)) + zp;
    };
    const double qmin = qt == DType::kI8 ? -128 : 0, qmax = qmin + 255;
    if (!(bounds->first == -std::numeric_limits<double>::infinity() ||
          quantized(bounds->first) <= qmin) ||
        !(bounds->second == std::numeric_limits<double>::infinity() ||
          quantized(bounds->second) >= qmax))
      return std::nullopt;
  }
  return out;
}

// The int32 bias of a QLinearConv for the float bias b of a Conv whose sums scale by
// scale[c] = xs * ws[c], so that (sum + bq[c]) * scale[c] is the Conv's float result. Exact when b
// is DequantizeLinear(bq, scale) of a constant int32 bq with a zero offset (how onnxruntime's
// quantizer writes it). A constant float b, or a DequantizeLinear at another scale (a bias that
// the exporter shared between convs), is rounded to the sums' grid, bq[c] = round(b[c] /
// scale[c]), which moves y by at most half of xs * ws[c] (ORT's quantizer does the same), far
// below a step of the output. nullopt otherwise, and when a quotient leaves int32's range.
std::optional<ValueId> integer_bias(Graph& g, ValueId b, int64_t channels, const Tensor& scale,
                                    const std::string& name) {
  // Exporters share equal biases through Identity nodes (this pass runs before EliminateNoOps).
  for (const Node* n = producer(g, b); n && n->op == "Identity" && n->domain.empty();
       n = producer(g, b))
    b = n->inputs[0];
  auto scale_of = [&](int64_t c) { return scale.data<float>()[scale.numel() == 1 ? 0 : c]; };
  // b's values as float32 (a DequantizeLinear of constants dequantized as it would be).
  std::vector<double> v;
  if (const Node* n = producer(g, b); n && n->op == "DequantizeLinear" && n->inputs.size() >= 2 &&
                                      n->attrs.get_int("block_size", 0) == 0) {
    const Tensor* bq = constant(g, n->inputs[0]);
    const Tensor* bs = constant(g, n->inputs[1]);
    if (!bq || bq->dtype() != DType::kI32 || bq->rank() != 1 || bq->numel() != channels || !bs ||
        bs->dtype() != DType::kF32 || (bs->numel() != 1 && bs->numel() != channels))
      return std::nullopt;
    const Tensor* z = n->inputs.size() > 2 ? constant(g, n->inputs[2]) : nullptr;
    if (n->inputs.size() > 2 && n->inputs[2] != kNoValue && !z) return std::nullopt;
    const std::vector<double> q = to_doubles(*bq), sc = to_doubles(*bs),
                              zp = z ? to_doubles(*z) : std::vector<double>{0.0};
    bool exact = true;
    for (int64_t c = 0; c < channels; ++c) {
      const auto at = [c](const std::vector<double>& x) { return x[x.size() == 1 ? 0 : c]; };
      exact = exact && at(zp) == 0 && static_cast<float>(at(sc)) == scale_of(c);
      v.push_back(static_cast<float>((at(q) - at(zp)) * static_cast<float>(at(sc))));
    }
    if (exact) return n->inputs[0];
  } else if (const Tensor* bf = constant(g, b);
             bf && bf->dtype() == DType::kF32 && bf->rank() == 1 && bf->numel() == channels) {
    v = to_doubles(*bf);
  } else {
    return std::nullopt;
  }
  Tensor bq = Tensor::empty(DType::kI32, {channels});
  for (int64_t c = 0; c < channels; ++c) {
    const double q = std::nearbyint(v[static_cast<size_t>(c)] / static_cast<double>(scale_of(c)));
    if (!(std::abs(q) < 2147483647.0)) return std::nullopt;
    bq.data<int32_t>()[c] = static_cast<int32_t>(q);
  }
  return g.add_constant(name + "_bias_quantized", std::move(bq));
}

// A zero point, or a new zero of dtype dt where the DequantizeLinear / QuantizeLinear had none.
ValueId zero_point_or_zero(Graph& g, ValueId zp, DType dt, const std::string& name) {
  if (zp != kNoValue) return zp;
  Tensor z = Tensor::empty(dt, {});
  std::memset(z.raw_data(), 0, 1);
  return g.add_constant(name, std::move(z));
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

  // Requantized by a QuantizeLinear: one QLinearConv / QLinearMatMul (no bias) whose epilogue
  // requantizes the integer sums, the float result never formed.
  if (!gemm && !trans_b && !(bias != kNoValue && !conv)) {
    const auto rq = requantized(rw, n.outputs[0]);
    const std::optional<ValueId> bias_q = bias == kNoValue
                                              ? std::optional<ValueId>(kNoValue)
                                              : integer_bias(g, bias, channels, scale, n.name);
    if (rq && bias_q) {
      const std::string name = n.name;
      const DType qt = dtype_of_value(g, g.nodes()[rq->node].outputs[0]);
      std::vector<ValueId> inputs = {
          x->q,
          x->scale_v,
          zero_point_or_zero(g, x->zp, dtype_of_value(g, x->q), name + "_x_zero_point"),
          w->q,
          w->scale_v,
          zero_point_or_zero(g, w->zp, wt->dtype(), name + "_w_zero_point"),
          rq->ys,
          zero_point_or_zero(g, rq->yz, qt, name + "_y_zero_point")};
      if (*bias_q != kNoValue) inputs.push_back(*bias_q);
      Node& q = g.mutable_nodes()[rq->node];
      retarget(q, conv ? "QLinearConv" : "QLinearMatMul", std::move(inputs),
               conv ? n.attrs : Attributes{});
      q.name = name + "_quant";
      rw.remove(i);
      if (rq->clamp != rq->node) rw.remove(rq->clamp);
      ctx.note(conv ? "LowerQdqToInteger/QLinearConv" : "LowerQdqToInteger/QLinearMatMul");
      return true;
    }
  }

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
