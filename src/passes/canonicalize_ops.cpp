// CanonicalizeOps: rewrites ops into the one form kernels and later passes look for. A rule
// table applied until nothing changes; every rule keeps each value's bits unless it says so and
// is then only used at level >= 3 (ctx.level), where a last-place difference is allowed.
//   Pow(x, 1)            -> Identity(x)                          exact
//   Pow(x, 2)            -> Mul(x, x)                            exact (see pow_chain)
//   Pow(x, 3 | 4)        -> Mul chains                           level >= 3 (1 ulp)
//   Pow(x, -1..-4)       -> Reciprocal(chain)                    level >= 3 (1 ulp)
//   Pow(x, 0.5)          -> Sqrt(x)                              level >= 3 (-0 and -inf differ)
//   Sub(x, c)            -> Add(x, -c)                           exact (IEEE: x - c == x + -c)
//   Sum(a, b) | Sum(a)   -> Add(a, b) | Identity(a)              exact (ONNX function bodies)
//   Div(x, c), c = ±2^k  -> Mul(x, 1/c)                          exact (both are x * 2^-k rounded)
//   Clip{min, max}       -> Clip(x, min, max)                    exact (f32/f64; attrs before 11)
//   Squeeze/Unsqueeze/Reduce*{axes} -> axes as a constant input  exact
//   MatMul(Expand(a), b) -> MatMul(a, b) when the Expand only grows batch dimensions that
//                           MatMul broadcasts itself (what the torch frontend does for bmm)
//   Conv(Pad(x))         -> Conv(x){pads + the Pad's}: zeros on spatial axes    exact
//   Conv(x[N,C,H,1], w[O,I,k,1]) -> Unsqueeze(Conv(Squeeze(x), Squeeze(w)))    level >= 2 (the
//                           1-D conv kernel's summation order): a 1-D conv written as a 2-D one
//                           along H (jax2tf, tf2onnx) on the 1-D kernel, which vectorizes along
//                           the one spatial axis instead of the width of 1
//   Squeeze(Conv(Unsqueeze(x)), 2) with a 1 x k kernel -> the 1-D Conv(x)       exact
// Floating types only for the arithmetic rules; constants are scalars unless stated.
#include <cmath>
#include <limits>

#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

const Node& node_at(Rewrite& rw, size_t i) {
  return rw.graph().nodes()[i];
}

// A new value of the given type for an intermediate result.
ValueId temp(Graph& g, const std::string& base, const TensorType& type) {
  return g.add_value(g.unique_name(base), type);
}

// Pow(x, c) with a small integer or 0.5 exponent. Why 2 is exact: the reference computes pow in
// double and rounds to the dtype; for f32 and the half types x*x is exact in double, so both give
// x*x correctly rounded. For f64 glibc's pow is within one ulp of the exact square and in practice
// returns the correctly rounded x*x; we accept that.
bool pow_chain(Rewrite& rw, size_t i, const PassContext& ctx) {
  const Node& n = node_at(rw, i);
  if (n.op != "Pow" || n.inputs.size() != 2 || n.outputs.size() != 1) return false;
  Graph& g = rw.graph();
  const ValueId x = n.inputs[0], y = n.outputs[0];
  if (!is_floating(dtype_of_value(g, x))) return false;
  auto c = scalar_constant(g, n.inputs[1]);
  // A [1, 1] exponent would broadcast x up; Mul(x, x) would not.
  if (!c || !same_shape(g, x, y)) return false;
  const double e = *c;
  const bool fast = ctx.level >= 3;
  const std::string name = n.name;
  const TensorType type = g.value(y).type;
  if (e == 1) {
    retarget(g.mutable_nodes()[i], "Identity", {x});
    ctx.note("CanonicalizeOps/Pow1");
    return true;
  }
  if (e == 0.5 && fast) {
    retarget(g.mutable_nodes()[i], "Sqrt", {x});
    ctx.note("CanonicalizeOps/PowHalf");
    return true;
  }
  const double k = std::fabs(e);
  if (e != std::trunc(e) || k < 1 || k > 4 || (e != 2 && !fast)) return false;
  // x^2 = x*x; x^3 = (x*x)*x; x^4 = (x*x)*(x*x); a negative exponent takes the reciprocal. The
  // Muls before the last are inserted ahead of the node, which becomes the last step.
  size_t at = i;
  auto mul = [&](ValueId a, ValueId b) {
    ValueId t = temp(g, name + "_pow", type);
    rw.insert(at++, "Mul", {a, b}, {t}, {}, name + "_mul");
    return t;
  };
  ValueId a = x, b = x;  // the last product is a * b
  if (k == 3) a = mul(x, x);
  if (k == 4) a = b = mul(x, x);
  if (e > 0) {
    retarget(g.mutable_nodes()[at], "Mul", {a, b});
  } else {
    const ValueId p = k == 1 ? x : mul(a, b);  // before indexing: mul() inserts a node
    retarget(g.mutable_nodes()[at], "Reciprocal", {p});
  }
  ctx.note(e > 0 ? "CanonicalizeOps/PowMul" : "CanonicalizeOps/PowReciprocal");
  return true;
}

// A constant operand of a floating dtype with every element transformed by f; f returns nullopt
// to refuse.
template <class F>
std::optional<ValueId> mapped_constant(Graph& g, ValueId c, const std::string& base, F f) {
  const Tensor* t = constant(g, c);
  if (!t || !is_floating(t->dtype())) return {};
  std::vector<double> v = to_doubles(*t);
  for (double& d : v) {
    auto m = f(d);
    if (!m) return {};
    d = *m;
  }
  auto out = float_tensor(t->dtype(), t->shape(), v);
  if (!out) return {};
  // Every value is exactly representable (the callers make sure), so rounding changes nothing.
  return g.add_constant(base, std::move(*out));
}

bool sub_constant(Rewrite& rw, size_t i, const PassContext&) {
  const Node& n = node_at(rw, i);
  if (n.op != "Sub" || n.inputs.size() != 2) return false;
  Graph& g = rw.graph();
  if (!is_floating(dtype_of_value(g, n.inputs[0]))) return false;
  auto neg = mapped_constant(g, n.inputs[1], g.value(n.inputs[1]).name + "_neg",
                             [](double d) { return std::optional<double>(-d); });
  if (!neg) return false;
  Node& m = g.mutable_nodes()[i];
  retarget(m, "Add", {m.inputs[0], *neg}, m.attrs, m.opset);
  return true;
}

bool sum_of_two(Rewrite& rw, size_t i, const PassContext&) {
  const Node& n = node_at(rw, i);
  if (n.op != "Sum" || n.inputs.empty() || n.inputs.size() > 2) return false;
  if (!is_floating(dtype_of_value(rw.graph(), n.outputs[0]))) return false;
  Node& m = rw.graph().mutable_nodes()[i];
  retarget(m, m.inputs.size() == 2 ? "Add" : "Identity", m.inputs);
  return true;
}

bool div_power_of_two(Rewrite& rw, size_t i, const PassContext&) {
  const Node& n = node_at(rw, i);
  if (n.op != "Div" || n.inputs.size() != 2) return false;
  Graph& g = rw.graph();
  const DType dt = dtype_of_value(g, n.inputs[1]);
  if (!is_floating(dtype_of_value(g, n.inputs[0])) || !is_floating(dt)) return false;
  // The reciprocal must be exact in the constant's dtype: check by a round trip through it.
  auto recip = [dt](double d) -> std::optional<double> {
    int exp = 0;
    if (!std::isfinite(d) || std::fabs(std::frexp(d, &exp)) != 0.5) return std::nullopt;
    const double r = 1.0 / d;
    auto t = float_tensor(dt, {}, {r});
    if (!t || t->item_as_double(0) != r) return std::nullopt;
    return r;
  };
  auto inv = mapped_constant(g, n.inputs[1], g.value(n.inputs[1]).name + "_recip", recip);
  if (!inv) return false;
  Node& m = g.mutable_nodes()[i];
  retarget(m, "Mul", {m.inputs[0], *inv}, m.attrs, m.opset);
  return true;
}

// Clip before opset 11 kept min and max as attributes (absent: -inf and +inf).
bool clip_attributes(Rewrite& rw, size_t i, const PassContext&) {
  const Node& n = node_at(rw, i);
  if (n.op != "Clip" || n.opset <= 0 || n.opset >= 11 || n.inputs.size() != 1) return false;
  Graph& g = rw.graph();
  const DType dt = dtype_of_value(g, n.inputs[0]);
  // Half types compare against the attribute in float but against an input in their own dtype.
  if (dt != DType::kF32 && dt != DType::kF64) return false;
  const double inf = std::numeric_limits<double>::infinity();
  const double lo = n.attrs.get_float("min", -inf), hi = n.attrs.get_float("max", inf);
  auto tlo = float_tensor(dt, {}, {lo}), thi = float_tensor(dt, {}, {hi});
  if (!tlo || !thi) return false;
  const std::string name = n.name;
  ValueId vlo = g.add_constant(name + "_min", std::move(*tlo));
  ValueId vhi = g.add_constant(name + "_max", std::move(*thi));
  Node& m = g.mutable_nodes()[i];
  retarget(m, "Clip", {m.inputs[0], vlo, vhi}, without(without(m.attrs, "min"), "max"));
  return true;
}

// Squeeze, Unsqueeze and the Reduce* ops took `axes` as an attribute in older opsets and as an
// optional second input later; the kernels read either, and the input is the form kept. This is
// an op-name test: no OpDef property says "input 1 is the axes" (Slice-1 also has an `axes`
// attribute but its input 1 is `starts`).
bool axes_attribute(Rewrite& rw, size_t i, const PassContext&) {
  const Node& n = node_at(rw, i);
  const bool axes_op = n.op == "Squeeze" || n.op == "Unsqueeze" || n.op.starts_with("Reduce");
  if (!axes_op || n.inputs.size() != 1 || !n.attrs.has("axes") || !n.def ||
      (n.def->max_inputs != -1 && n.def->max_inputs < 2))
    return false;
  const std::vector<int64_t> axes = n.attrs.get_ints("axes");
  if (axes.empty()) return false;
  Graph& g = rw.graph();
  ValueId a = g.add_constant(n.name + "_axes",
                             Tensor::from_vector(axes, {static_cast<int64_t>(axes.size())}));
  Node& m = g.mutable_nodes()[i];
  retarget(m, m.op, {m.inputs[0], a}, without(m.attrs, "axes"));
  return true;
}

// MatMul(Expand(a, shape), b): when the Expand leaves a's last two dimensions alone and MatMul's
// own broadcasting of a and b gives the same output shape, the copy is never needed.
bool matmul_expand(Rewrite& rw, size_t i, const PassContext&) {
  const Node& n = node_at(rw, i);
  if (n.op != "MatMul" || n.inputs.size() != 2) return false;
  Graph& g = rw.graph();
  const auto& out = g.value(n.outputs[0]).type.shape;
  if (!out || out->size() < 2) return false;
  for (size_t side = 0; side < 2; ++side) {
    const Node* e = producer(g, n.inputs[side]);
    if (!e || e->op != "Expand" || e->inputs.empty()) continue;
    const ValueId a = e->inputs[0], other = n.inputs[1 - side];
    const auto& as = g.value(a).type.shape;
    const auto& es = g.value(n.inputs[side]).type.shape;
    const auto& os = g.value(other).type.shape;
    if (!as || !es || !os || as->size() < 2 || os->size() < 2 || as->size() > es->size()) continue;
    if ((*as)[as->size() - 1] != (*es)[es->size() - 1] ||
        (*as)[as->size() - 2] != (*es)[es->size() - 2])
      continue;
    // The batch dimensions MatMul would produce from (a, other) must be the output's own, each a
    // known size or the same symbol: the other operand alone must already carry them.
    if (os->size() != out->size()) continue;
    bool same = true;
    for (size_t d = 0; d + 2 < out->size(); ++d) {
      const Dim& od = (*os)[d];
      const size_t k = d + as->size() >= out->size() ? d + as->size() - out->size() : SIZE_MAX;
      const bool a_one = k == SIZE_MAX || (*as)[k] == Dim(1) || (*as)[k] == od;
      same = same && od == (*out)[d] && (od.is_known() || od.is_symbolic()) && a_one;
    }
    if (!same) continue;
    const ValueId expanded = n.inputs[side];
    const size_t expand_at = static_cast<size_t>(g.value(expanded).producer);
    g.mutable_nodes()[i].inputs[side] = a;
    if (g.use_counts()[expanded] == 0) rw.remove(expand_at);
    return true;
  }
  return false;
}

// Conv(Pad(x)): a constant-mode Pad by zeros on the spatial axes only (tf2onnx writes one before
// each stride-2 conv, as TensorFlow pads "SAME" asymmetrically) becomes the conv's own padding,
// which the conv kernels apply without a copy of the input. The Pad must have no other reader and
// the conv no auto_pad. A negative pad (a crop) does not combine: it drops the input's edge,
// which the conv's zeros would then replace, where lowering the conv's padding keeps the edge.
bool pad_into_conv(Rewrite& rw, size_t i, const PassContext&) {
  const Node& n = node_at(rw, i);
  if (n.op != "Conv" || n.inputs.empty() || n.attrs.get_string("auto_pad", "NOTSET") != "NOTSET")
    return false;
  Graph& g = rw.graph();
  const ValueId padded = n.inputs[0];
  const Node* p = producer(g, padded);
  if (!p || p->op != "Pad" || p->inputs.empty() || rw.uses()[padded] != 1 || g.is_output(padded))
    return false;
  if (p->attrs.get_string("mode", "constant") != "constant") return false;
  std::vector<int64_t> pads;
  const bool inputs = p->opset == 0 || p->opset >= 11;
  if (inputs) {
    if (p->inputs.size() < 2 || p->inputs.size() > 3) return false;  // no axes input (opset 18)
    const Tensor* t = constant(g, p->inputs[1]);
    if (!t || t->dtype() != DType::kI64 || t->rank() != 1) return false;
    pads.assign(t->data<int64_t>(), t->data<int64_t>() + t->numel());
    if (p->inputs.size() == 3 && p->inputs[2] != kNoValue) {
      const std::optional<double> v = scalar_constant(g, p->inputs[2]);
      if (!v || *v != 0.0) return false;
    }
  } else {
    pads = p->attrs.get_ints("pads", {});
    if (p->attrs.get_float("value", 0.0) != 0.0) return false;
  }
  const auto& shape = g.value(p->inputs[0]).type.shape;
  if (!shape || shape->size() < 3 || pads.size() != 2 * shape->size()) return false;
  const size_t rank = shape->size(), spatial = rank - 2;
  if (pads[0] || pads[1] || pads[rank] || pads[rank + 1]) return false;  // batch and channels
  for (int64_t q : pads)
    if (q < 0) return false;
  std::vector<int64_t> conv = n.attrs.get_ints("pads", std::vector<int64_t>(2 * spatial, 0));
  if (conv.size() != 2 * spatial) return false;
  for (size_t k = 0; k < spatial; ++k) {
    conv[k] += pads[2 + k];
    conv[spatial + k] += pads[rank + 2 + k];
  }
  const size_t pad_at = static_cast<size_t>(g.value(padded).producer);
  Node& m = g.mutable_nodes()[i];
  m.inputs[0] = p->inputs[0];
  m.attrs.set("pads", conv);
  rw.remove(pad_at);
  return true;
}

// Conv on [N, C, H, 1] (H not 1) with a [O, I, k, 1] filter and no padding of the width: the
// same numbers as the 1-D conv on [N, C, H] (the width axis drops out of every index), which the
// CPU kernels run with the spatial axis in the vector lanes. Layouts are identical, so the
// Squeezes and the Unsqueeze are views. An auto_pad carries over: it pads the width of 1 by 0.
bool conv_unit_width(Rewrite& rw, size_t i, const PassContext& ctx) {
  const Node& n = node_at(rw, i);
  if (ctx.level < 2 || n.op != "Conv" || n.inputs.size() < 2 || n.outputs.size() != 1) return false;
  Graph& g = rw.graph();
  const ValueId x = n.inputs[0], w = n.inputs[1], y = n.outputs[0];
  const auto& xs = g.value(x).type.shape;
  const auto& ws = g.value(w).type.shape;
  const auto& ys = g.value(y).type.shape;
  const Dim one(1);
  if (!xs || !ws || !ys || xs->size() != 4 || ws->size() != 4 || ys->size() != 4 ||
      (*xs)[3] != one || (*ws)[3] != one || (*ys)[3] != one)
    return false;
  // A 1x1 plane (a squeeze-excite conv after global pooling) is a matrix product either way, and
  // stays in the 2-D form that level 3's blocked layouts carry through.
  if ((*xs)[2] == one) return false;
  auto two = [&](const char* name, int64_t dflt) {
    return n.attrs.get_ints(name, std::vector<int64_t>{dflt, dflt});
  };
  const std::vector<int64_t> pads = n.attrs.get_ints("pads", std::vector<int64_t>(4, 0));
  const std::vector<int64_t> strides = two("strides", 1), dilations = two("dilations", 1);
  const std::vector<int64_t> kernel = two("kernel_shape", 1);
  if (pads.size() != 4 || pads[1] || pads[3] || strides.size() != 2 || dilations.size() != 2 ||
      (n.attrs.has("kernel_shape") && (kernel.size() != 2 || kernel[1] != 1)))
    return false;
  Attributes attrs = n.attrs;
  if (n.attrs.has("pads")) attrs.set("pads", std::vector<int64_t>{pads[0], pads[2]});
  attrs.set("strides", std::vector<int64_t>{strides[0]});
  attrs.set("dilations", std::vector<int64_t>{dilations[0]});
  if (n.attrs.has("kernel_shape")) attrs.set("kernel_shape", std::vector<int64_t>{kernel[0]});
  const std::string name = n.name;
  const int opset = n.opset;
  std::vector<ValueId> inputs = n.inputs;
  const DType dt = dtype_of_value(g, y);
  // Copies: add_value may move the values.
  const Shape x3(xs->begin(), xs->end() - 1), w3s(ws->begin(), ws->end() - 1),
      y3s(ys->begin(), ys->end() - 1);
  const ValueId axis = g.add_constant(g.unique_name(name + "_width"),
                                      Tensor::from_vector(std::vector<int64_t>{3}, {1}));
  const ValueId xv = temp(g, name + "_rows", TensorType{dtype_of_value(g, x), x3});
  const ValueId wv = temp(g, name + "_filter", TensorType{dtype_of_value(g, w), w3s});
  const ValueId yv = temp(g, name + "_1d", TensorType{dt, y3s});
  size_t at = i;
  rw.insert(at++, "Squeeze", {x, axis}, {xv}, {}, name + "_rows");
  rw.insert(at++, "Squeeze", {w, axis}, {wv}, {}, name + "_filter");
  inputs[0] = xv;
  inputs[1] = wv;
  rw.insert(at++, "Conv", std::move(inputs), {yv}, std::move(attrs), name + "_1d", opset);
  retarget(g.mutable_nodes()[at], "Unsqueeze", {yv, axis});
  return true;
}

// The rank-3 value [a, b, c] that `v` = [a, b, 1, c] relabels through reshape-like nodes
// (Unsqueeze, Reshape, Squeeze, Flatten: row-major order kept) each read by its successor alone,
// or kNoValue; those nodes in `chain`.
ValueId unsqueezed_from(Rewrite& rw, ValueId v, std::vector<size_t>& chain) {
  Graph& g = rw.graph();
  const auto& s4 = g.value(v).type.shape;
  if (!s4 || s4->size() != 4 || (*s4)[2].value != 1) return kNoValue;
  for (int hops = 0; hops < 4; ++hops) {
    const Node* p = producer(g, v);
    if (!p || p->inputs.empty() || !p->domain.empty() || !OpRegistry::global().find(p->op) ||
        !(p->op == "Unsqueeze" || p->op == "Reshape" || p->op == "Squeeze" || p->op == "Flatten"))
      return kNoValue;
    if (rw.uses()[v] != 1 || g.is_output(v)) return kNoValue;
    chain.push_back(static_cast<size_t>(g.value(v).producer));
    v = p->inputs[0];
    const auto& s3 = g.value(v).type.shape;
    if (s3 && s3->size() == 3 && same_dim((*s3)[0], (*s4)[0]) && same_dim((*s3)[1], (*s4)[1]) &&
        same_dim((*s3)[2], (*s4)[3]))
      return v;
  }
  return kNoValue;
}

// Squeeze(Conv(Unsqueeze(x, 2)), 2) with a [M, C/g, 1, k] kernel: how TensorFlow (and so tf2onnx)
// writes a Conv1D, as a 2-D conv on a height-1 image. With the height axis gone the conv's
// batch-norm Mul/Add and activation follow it directly, so FoldBatchNorm folds them into its
// weights and fusion makes the activation its epilogue (with the Squeeze between they were
// separate kernels), and a Pad before the Unsqueeze (Keras' causal padding) becomes its padding.
// The height axis must be a no-op: kernel height 1, no height padding (any stride or dilation
// along a size-1 axis gives one row). The weight must be a constant (it is viewed as 3-D);
// "reshape-like" ops on either side (a Reshape to [a, b, 1, c]) count as the Unsqueeze/Squeeze.
bool conv_1d(Rewrite& rw, size_t i, const PassContext&) {
  const Node& n = node_at(rw, i);
  if (n.op != "Conv" || !n.domain.empty() || n.inputs.size() < 2 || n.outputs.size() != 1)
    return false;
  Graph& g = rw.graph();
  const Tensor* w = constant(g, n.inputs[1]);
  if (!w || w->rank() != 4 || w->shape()[2] != 1) return false;
  const ValueId y4 = n.outputs[0];
  if (y4 == kNoValue || rw.uses()[y4] != 1 || g.is_output(y4)) return false;
  const int32_t reader = rw.readers().single_reader(y4);
  if (reader < 0) return false;
  const auto sq = static_cast<size_t>(reader);
  const Node& s = g.nodes()[sq];
  if (!(s.op == "Squeeze" || s.op == "Reshape" || s.op == "Flatten") || !s.domain.empty() ||
      s.outputs.size() != 1 || s.inputs.empty() || s.inputs[0] != y4)
    return false;
  const ValueId y3 = s.outputs[0];
  const auto& t4 = g.value(y4).type.shape;
  const auto& t3 = g.value(y3).type.shape;
  if (!t4 || t4->size() != 4 || !t3 || t3->size() != 3 || !same_dim((*t3)[0], (*t4)[0]) ||
      !same_dim((*t3)[1], (*t4)[1]) || !same_dim((*t3)[2], (*t4)[3]) || (*t4)[2].value != 1 ||
      !can_replace(g, y3, y4))
    return false;
  std::vector<size_t> chain;
  const ValueId x4 = n.inputs[0];
  ValueId x3 = unsqueezed_from(rw, x4, chain);
  const auto& s4 = g.value(x4).type.shape;
  if (x3 == kNoValue && (!s4 || s4->size() != 4 || (*s4)[2].value != 1)) return false;
  // The attributes along width only.
  Attributes attrs = n.attrs;
  auto width = [&](const char* name, size_t count) -> bool {
    if (!n.attrs.has(name)) return true;
    const std::vector<int64_t> v = n.attrs.get_ints(name);
    if (v.size() != 2 * count) return false;
    attrs.set(name, count == 1 ? std::vector<int64_t>{v[1]} : std::vector<int64_t>{v[1], v[3]});
    return true;
  };
  if (!width("kernel_shape", 1) || !width("strides", 1) || !width("dilations", 1) ||
      !width("pads", 2))
    return false;
  if (n.attrs.has("kernel_shape") && n.attrs.get_ints("kernel_shape")[0] != 1) return false;
  if (n.attrs.has("pads")) {
    const std::vector<int64_t> p = n.attrs.get_ints("pads");
    if (p[0] != 0 || p[2] != 0) return false;
  }
  const ValueId w3 =
      g.add_constant(g.value(n.inputs[1]).name + "_1d",
                     w->contiguous().reshape({w->shape()[0], w->shape()[1], w->shape()[3]}));
  // No rank-3 value of the right shape before it (tf2onnx's NWC input of one channel, Unsqueeze
  // and Reshape): a Reshape of the 4-D input to [a, b, c], which SimplifyTransposes merges with
  // the reshapes before it.
  ValueId shape = kNoValue;
  if (x3 == kNoValue) {
    chain.clear();  // x4 and the nodes before it stay
    TensorType t = g.value(x4).type;
    t.shape = Shape{(*t.shape)[0], (*t.shape)[1], (*t.shape)[3]};
    x3 = temp(g, g.value(x4).name + "_1d", t);
    shape = g.add_constant("conv_1d_shape", Tensor::from_vector<int64_t>({0, 0, -1}, {3}));
  }
  Node& m = g.mutable_nodes()[i];
  m.inputs[0] = x3;
  m.inputs[1] = w3;
  m.attrs = std::move(attrs);
  g.value(y4).type = g.value(y3).type;  // rank 3 now, before the types are inferred again
  g.replace_uses(y3, y4);
  rw.remove(sq);
  for (size_t c : chain) rw.remove(c);  // unread now (a Pad before them then folds)
  if (shape != kNoValue) rw.insert(i, "Reshape", {x4, shape}, {x3});
  return true;
}

Graph canonicalize_ops(Graph g, const PassContext& ctx) {
  apply_rules(g,
              {{nullptr, pow_chain},
               {"CanonicalizeOps/SubConstant", sub_constant},
               {"CanonicalizeOps/SumOfTwo", sum_of_two},
               {"CanonicalizeOps/DivPowerOfTwo", div_power_of_two},
               {"CanonicalizeOps/ClipAttributes", clip_attributes},
               {"CanonicalizeOps/AxesAttribute", axes_attribute},
               {"CanonicalizeOps/MatMulExpand", matmul_expand},
               {"CanonicalizeOps/Conv1D", conv_1d},
               {"CanonicalizeOps/PadIntoConv", pad_into_conv},
               {"CanonicalizeOps/ConvUnitWidth", conv_unit_width}},
              ctx);
  return g;
}

}  // namespace

void register_canonicalize_ops(PassRegistry& r) {
  r.add({"CanonicalizeOps", canonicalize_ops,
         "one form per computation: Pow by small integers as Mul, Sub/Div by constants as "
         "Add/Mul, attribute operands as inputs, broadcasts MatMul does itself removed, zero "
         "Pads before a Conv made its padding, 1 x k convs between Unsqueeze and Squeeze made "
         "1-D, 2-D convs over a width of 1 as 1-D ones"});
}

}  // namespace pto::passes
