// FoldBatchNorm: an inference BatchNormalization whose input is the single-use output of a layer
// with constant weights becomes part of that layer's weights; so does a Mul or Add of that output
// of a Conv or ConvTranspose by a constant that varies only along the channel axis (tf2onnx's
// depthwise batch norms, biases left as Adds), read as the BN with that scale or shift. With s =
// gamma / sqrt(var + eps) per channel c, BN(y) = s * (y - mean) + beta, and y is linear in the
// weight, so
//   Conv          W[c, ...] *= s[c]                      (W: [Cout, Cin/g, k...])
//   ConvTranspose W[ic, j, ...] *= s[c(ic, j)]           (W: [Cin, Cout/g, k...], c = group of ic
//                                                         * Cout/g + j)
//   Gemm/MatMul   the output column n of op(B) *= s[n]   (2-D [N, C] products only: BN's channel
//                                                         axis must be the product's last axis;
//                                                         or a 2-D view of a MatMul's output
//                                                         that keeps its last axis: the shift an
//                                                         Add after the product, LeViT's
//                                                         Flatten(MatMul) into BatchNorm1d)
// and the bias becomes (b - mean) * s + beta (b = 0 when the layer has none; Gemm's beta * C is
// taken in). The layer then produces BN's output and the BN node goes. New weights are computed
// in double and stored in the weight's dtype. Training-mode BNs (batch statistics), BNs whose
// parameters are not constant or not one per channel, and layers whose weight is not constant or
// whose output has other readers are left as they are.
//
// Arithmetic on tensor data outside src/reference is against DESIGN habit 6; folding constants
// into weights is the one thing this pass is for, so it does it here, in double.
#include <algorithm>
#include <cmath>

#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

// The folded bias: (b - mean) * s + beta for each channel.
std::vector<double> folded_bias(const BnAffine& a, const std::vector<double>& b) {
  std::vector<double> out(a.scale.size());
  for (size_t c = 0; c < out.size(); ++c) out[c] = (b[c] - a.mean[c]) * a.scale[c] + a.shift[c];
  return out;
}

// A conv's optional bias as one value per channel (zeros when absent); nullopt if not constant.
std::optional<std::vector<double>> conv_bias(const Graph& g, const Node& n, size_t channels) {
  if (n.inputs.size() < 3 || n.inputs[2] == kNoValue) return std::vector<double>(channels, 0.0);
  const Tensor* b = constant(g, n.inputs[2]);
  if (!b || b->rank() != 1 || static_cast<size_t>(b->numel()) != channels) return {};
  return to_doubles(*b);
}

// Folds into a Conv (transpose = false) or ConvTranspose: new constant W and B.
bool fold_into_conv(Rewrite& rw, size_t layer, const BnAffine& a, bool transpose) {
  Graph& g = rw.graph();
  const Node& n = g.nodes()[layer];
  const Tensor* w = n.inputs.size() >= 2 ? constant(g, n.inputs[1]) : nullptr;
  if (!w || !is_floating(w->dtype()) || w->rank() < 3) return false;
  const int64_t C = static_cast<int64_t>(a.scale.size());
  const int64_t group = n.attrs.get_int("group", 1);
  if (group < 1) return false;
  const int64_t d0 = w->dim(0), d1 = w->dim(1);
  if (transpose ? (d1 * group != C || d0 % group != 0) : d0 != C) return false;
  auto bias = conv_bias(g, n, static_cast<size_t>(C));
  if (!bias) return false;

  std::vector<double> wv = to_doubles(*w);
  const int64_t inner = d0 * d1 != 0 ? w->numel() / (d0 * d1) : 0;
  for (int64_t i = 0; i < d0; ++i)
    for (int64_t j = 0; j < d1; ++j) {
      const int64_t c = transpose ? (i / (d0 / group)) * d1 + j : i;
      for (int64_t k = 0; k < inner; ++k)
        wv[static_cast<size_t>((i * d1 + j) * inner + k)] *= a.scale[c];
    }
  auto w2 = float_tensor(w->dtype(), w->shape(), wv);
  auto b2 = float_tensor(w->dtype(), {C}, folded_bias(a, *bias));
  if (!w2 || !b2) return false;
  ValueId wid = g.add_constant(g.value(n.inputs[1]).name + "_bn", std::move(*w2));
  ValueId bid = g.add_constant(n.name + "_bias_bn", std::move(*b2));
  Node& m = g.mutable_nodes()[layer];
  m.inputs.resize(3);
  m.inputs[1] = wid;
  m.inputs[2] = bid;
  return true;
}

// Folds into Gemm(A, B, C) or MatMul(A, B) with a constant 2-D B and a 2-D product.
bool fold_into_gemm(Rewrite& rw, size_t layer, const BnAffine& a) {
  Graph& g = rw.graph();
  const Node& n = g.nodes()[layer];
  const bool gemm = n.op == "Gemm";
  if (n.inputs.size() < 2) return false;
  const auto& out_shape = g.value(n.outputs[0]).type.shape;
  if (!out_shape || out_shape->size() != 2) return false;
  const auto& a_shape = g.value(n.inputs[0]).type.shape;
  if (!a_shape || a_shape->size() != 2) return false;
  const Tensor* b = constant(g, n.inputs[1]);
  if (!b || !is_floating(b->dtype()) || b->rank() != 2) return false;
  const bool trans_b = gemm && n.attrs.get_int("transB", 0) != 0;
  const size_t N = a.scale.size();
  if (static_cast<size_t>(trans_b ? b->dim(0) : b->dim(1)) != N) return false;

  // The bias the product had: beta * C, broadcast to one value per output column.
  std::vector<double> bias(N, 0.0);
  if (gemm && n.inputs.size() > 2 && n.inputs[2] != kNoValue) {
    const Tensor* c = constant(g, n.inputs[2]);
    if (!c) return false;
    const bool per_column =
        c->rank() >= 1 && static_cast<size_t>(c->numel()) == N && c->dim(-1) == c->numel();
    if (c->numel() != 1 && !per_column) return false;
    const double beta = n.attrs.get_float("beta", 1.0);
    for (size_t j = 0; j < N && beta != 0.0; ++j)  // beta = 0: C unread, as the reference
      bias[j] = beta * c->item_as_double(c->numel() == 1 ? 0 : static_cast<int64_t>(j));
  }
  std::vector<double> bv = to_doubles(*b);
  const int64_t rows = b->dim(0), cols = b->dim(1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k)
      bv[static_cast<size_t>(r * cols + k)] *= a.scale[static_cast<size_t>(trans_b ? r : k)];
  auto b2 = float_tensor(b->dtype(), b->shape(), bv);
  auto c2 = float_tensor(b->dtype(), {static_cast<int64_t>(N)}, folded_bias(a, bias));
  if (!b2 || !c2) return false;
  ValueId bid = g.add_constant(g.value(n.inputs[1]).name + "_bn", std::move(*b2));
  ValueId cid = g.add_constant(n.name + "_bias_bn", std::move(*c2));
  Node& m = g.mutable_nodes()[layer];
  Attributes attrs = gemm ? without(m.attrs, "beta") : with_precision_of(m);
  attrs.set("beta", 1.0);
  retarget(m, "Gemm", {m.inputs[0], bid, cid}, std::move(attrs), gemm ? m.opset : 0);
  return true;
}

// A BatchNormalization of 2-D [R, C] values that a view (Flatten, Reshape, Squeeze, Unsqueeze)
// made of a MatMul's [..., C] output, the product by a constant 2-D B: LeViT's Linear + BatchNorm1d
// (`Flatten(MatMul(x, W), 2)` into the BN, reshaped back after). The view keeps the last axis, so
// BN's channel c is the product's column c: B's columns are scaled, the shift becomes an Add after
// the product (its GEMM epilogue at level 2), and the view produces BN's output. `i` is the BN.
bool fold_through_view(Rewrite& rw, size_t i, const BnAffine& a) {
  Graph& g = rw.graph();
  const ValueId x = g.nodes()[i].inputs[0];
  const Node* view = producer(g, x);
  static const char* const kViews[] = {"Flatten", "Reshape", "Squeeze", "Unsqueeze"};
  if (!view || !view->domain.empty() || view->outputs.size() != 1 || view->inputs.empty() ||
      std::none_of(std::begin(kViews), std::end(kViews),
                   [&](const char* op) { return view->op == op; }))
    return false;
  const ValueId y = view->inputs[0];
  const Node* mm = producer(g, y);
  if (!mm || mm->op != "MatMul" || !mm->domain.empty() || mm->inputs.size() != 2 ||
      rw.uses()[y] != 1 || g.is_output(y))
    return false;
  // x is [R, C] and the product [..., C] (B's columns): a view between shapes of one last axis
  // only regroups the leading ones, so x's column c is the product's column c.
  const auto& xs = g.value(x).type.shape;
  const Tensor* b = constant(g, mm->inputs[1]);
  const auto C = static_cast<int64_t>(a.scale.size());
  if (!xs || xs->size() != 2 || !(*xs)[1].is_known() || (*xs)[1].value != C || !b ||
      !is_floating(b->dtype()) || b->rank() != 2 || b->dim(1) != C)
    return false;
  std::vector<double> bv = to_doubles(*b);
  for (int64_t r = 0; r < b->dim(0); ++r)
    for (int64_t k = 0; k < C; ++k) bv[static_cast<size_t>(r * C + k)] *= a.scale[k];
  auto b2 = float_tensor(b->dtype(), b->shape(), bv);
  auto t = float_tensor(g.value(y).type.dtype, {C}, folded_bias(a, std::vector<double>(C, 0.0)));
  if (!b2 || !t) return false;
  const size_t layer = static_cast<size_t>(g.value(y).producer);
  const size_t at_view = static_cast<size_t>(g.value(x).producer);
  const ValueId bid = g.add_constant(g.value(mm->inputs[1]).name + "_bn", std::move(*b2));
  const ValueId tid = g.add_constant(mm->name + "_bias_bn", std::move(*t));
  const ValueId shifted = g.add_value(g.unique_name(g.value(y).name + "_bn"), g.value(y).type);
  g.mutable_nodes()[layer].inputs[1] = bid;
  rw.insert(layer + 1, "Add", {y, tid}, {shifted}, {}, g.nodes()[layer].name + "_bn_shift");
  // Everything from layer + 1 on moved one place down: the view and the BN included.
  g.mutable_nodes()[at_view + 1].inputs[0] = shifted;
  rw.remove(i + 1);
  rw.move_output(at_view + 1, 0, g.nodes()[i + 1].outputs[0]);
  return true;
}

// A Mul or Add of a conv's output x ([N, C, ...]) and a constant that varies at most along the
// channel axis, as the per-channel affine map BN folding applies: Mul scales (scale c, shift 0),
// Add shifts (scale 1, shift c). tf2onnx writes a depthwise conv's batch norm as such a Mul, and
// exporters leave biases as Adds.
std::optional<BnAffine> channel_affine(const Graph& g, const Node& n, ValueId x, bool conv) {
  if (n.inputs.size() != 2 || n.outputs.size() != 1) return {};
  const ValueId other = n.inputs[0] == x ? n.inputs[1] : n.inputs[0];
  const Tensor* c = constant(g, other);
  const auto& shape = g.value(x).type.shape;
  if (!c || !is_floating(c->dtype()) || !shape || shape->size() < 2) return {};
  const int64_t rank = static_cast<int64_t>(shape->size()), axis = conv ? 1 : rank - 1;
  const Dim& channels = (*shape)[static_cast<size_t>(axis)];
  if (!channels.is_known() || c->rank() > rank || !conv) return {};
  const int64_t C = channels.value;
  int64_t per_channel = 1;  // the constant's size along the channel axis (1 or C)
  for (int64_t k = 0; k < c->rank(); ++k) {
    const int64_t at = rank - c->rank() + k, d = c->dim(k);
    if (at == axis && (d == C || d == 1))
      per_channel = d;
    else if (d != 1)
      return {};
  }
  const std::vector<double> v = to_doubles(*c);
  BnAffine a;
  a.scale.assign(static_cast<size_t>(C), 1.0);
  a.shift.assign(static_cast<size_t>(C), 0.0);
  a.mean.assign(static_cast<size_t>(C), 0.0);
  for (int64_t k = 0; k < C; ++k)
    (n.op == "Mul" ? a.scale : a.shift)[static_cast<size_t>(k)] =
        v[static_cast<size_t>(per_channel == 1 ? 0 : k)];
  return a;
}

bool fold(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const Node& bn = g.nodes()[i];
  const bool affine = bn.op == "Mul" || bn.op == "Add";
  if (bn.op != "BatchNormalization" && !affine) return false;
  auto is_conv = [&](ValueId v) {
    const Node* q = producer(g, v);
    return q && (q->op == "Conv" || q->op == "ConvTranspose");
  };
  ValueId x = bn.inputs.empty() ? kNoValue : bn.inputs[0];
  if (affine) {  // Mul and Add fold into convolutions only (a MatMul + Add is a GEMM epilogue)
    if (bn.inputs.size() != 2) return false;
    if (!is_conv(x)) x = bn.inputs[1];
    if (!is_conv(x)) return false;
  }
  const Node* p = producer(g, x);
  if (!p || p->outputs.empty() || p->outputs[0] != x) return false;
  if (rw.uses()[x] != 1 || g.is_output(x)) return false;
  if (!affine && p->op != "MatMul" && p->op != "Gemm" && p->op != "Conv" &&
      p->op != "ConvTranspose") {
    const std::optional<BnAffine> a = bn_affine(g, bn);
    if (!a || !fold_through_view(rw, i, *a)) return false;
    ctx.note("FoldBatchNorm/MatMulThroughView");
    return true;
  }
  const bool conv = p->op == "Conv" || p->op == "ConvTranspose";
  // A conv with reduced products (precision="bf16") rounds its weights: scaled first, they
  // would round differently from the graph's order (scale after the rounded product).
  if (affine && p->attrs.has("precision")) return false;
  auto a = affine ? channel_affine(g, bn, x, conv) : bn_affine(g, bn);
  if (!a) return false;
  const size_t layer = static_cast<size_t>(g.value(x).producer);
  const std::string op = p->op;
  bool done = false;
  if (op == "Conv" || op == "ConvTranspose")
    done = fold_into_conv(rw, layer, *a, op == "ConvTranspose");
  else if (op == "Gemm" || op == "MatMul")
    done = fold_into_gemm(rw, layer, *a);
  if (!done) return false;
  rw.move_output(layer, 0, g.nodes()[i].outputs[0]);
  rw.remove(i);
  ctx.note(cat("FoldBatchNorm/", affine ? g.nodes()[i].op + "Into" : "", op));
  return true;
}

Graph fold_batch_norm(Graph g, const PassContext& ctx) {
  apply_rules(g, {{nullptr, fold}}, ctx);  // fold() notes the layer it folded into
  return g;
}

}  // namespace

void register_fold_batch_norm(PassRegistry& r) {
  r.add({"FoldBatchNorm", fold_batch_norm,
         "folds an inference BatchNormalization, or a Mul or Add by a per-channel constant, into "
         "the constant weights of the Conv, ConvTranspose, Gemm or MatMul before it"});
}

}  // namespace pto::passes
