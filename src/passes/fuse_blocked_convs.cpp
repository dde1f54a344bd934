// FuseBlockedConvs (level 3, after AssignLayouts): a depthwise ConvBlocked whose output, through
// at most a Relu or a constant Clip, is read only by a 1x1, stride-1, unpadded, group-1
// ConvBlocked becomes one DwPwConvBlocked (src/ir/ops/blocked_layout.cpp). Its kernel computes
// the depthwise output a row at a time into a per-thread buffer that the 1x1 conv reads while it
// is in cache, so the widest tensor of a MobileNet block is never written out and read back.
//   %d = pto.ConvBlocked(%x, %wd, %bd) {depthwise}  %r = Clip(%d, 0, 6)
//   %y = pto.ConvBlocked(%r, %wp, %bp) {1x1}
// -> %y = pto.DwPwConvBlocked(%x, %wd, %bd, %wp, %bp) {activation="Clip", min=0, max=6}
// The 1x1 conv's precision="bf16" becomes the fused node's: its 1x1 convs' products are bf16.
// A GroupNormBlocked read only by a Relu, or by a SiLU (x * Sigmoid(x)), takes it as its
// activation.
#include <cmath>
#include <limits>

#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

size_t index_of(const Graph& g, const Node* n) {
  return static_cast<size_t>(n - g.nodes().data());
}

bool all_equal(const std::vector<int64_t>& v, int64_t x) {
  for (int64_t e : v)
    if (e != x) return false;
  return true;
}

// A 1x1 ConvBlocked with stride 1, no padding and one group.
bool pointwise(const Graph& g, const Node& n) {
  if (n.op != "ConvBlocked" || n.domain != "pto" || n.inputs.size() < 2 || n.outputs.size() != 1)
    return false;
  const Tensor* w = constant(g, n.inputs[1]);
  return w && w->rank() == 6 && w->dim(2) == 1 && w->dim(3) == 1 &&
         n.attrs.get_int("group", 1) == 1 && all_equal(n.attrs.get_ints("strides", {}), 1) &&
         all_equal(n.attrs.get_ints("pads", {}), 0) &&
         n.attrs.get_string("auto_pad", "NOTSET") != "SAME_UPPER" &&
         n.attrs.get_string("auto_pad", "NOTSET") != "SAME_LOWER";
}

// The bias input `i` of `n`, or a zero bias of `lanes` values added to the graph.
ValueId bias_or_zeros(Graph& g, const Node& n, size_t i, int64_t lanes) {
  if (n.inputs.size() > i && n.inputs[i] != kNoValue) return n.inputs[i];
  return g.add_constant(g.value(n.outputs[0]).name + "_zero_bias",
                        Tensor::zeros(DType::kF32, {lanes}));
}

bool fuse(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  if (!pointwise(g, g.nodes()[i])) return false;
  const std::vector<int>& uses = rw.uses();
  const ValueId x = g.nodes()[i].inputs[0];
  if (uses[x] != 1 || g.is_output(x)) return false;
  const Node* mid = producer(g, x);
  const Node* dw = mid;
  Attributes attrs;
  if (mid && (mid->op == "Relu" || mid->op == "Clip") && mid->domain.empty() &&
      !mid->inputs.empty()) {
    const auto bounds = clamp_bounds(g, *mid);
    if (!bounds ||
        (mid->op == "Clip" && !(std::isfinite(bounds->first) && std::isfinite(bounds->second))))
      return false;
    const auto [lo, hi] = *bounds;
    const ValueId d = mid->inputs[0];
    if (uses[d] != 1 || g.is_output(d)) return false;
    attrs.set("activation", mid->op);
    if (mid->op == "Clip") {
      attrs.set("min", lo);
      attrs.set("max", hi);
    }
    dw = producer(g, d);
  } else {
    mid = nullptr;
  }
  if (!dw || dw->op != "ConvBlocked" || dw->domain != "pto" || dw->inputs.size() < 2) return false;
  const Tensor* wd = constant(g, dw->inputs[1]);
  const Tensor* wp = constant(g, g.nodes()[i].inputs[1]);
  if (!wd || wd->rank() != 5 || wd->dim(0) != wp->dim(1) || wd->dim(4) != wp->dim(4)) return false;
  for (const auto& [name, value] : dw->attrs.all())
    if (name != "group" && name != "precision") attrs.set(name, value);
  // The 1x1 conv's products (a depthwise conv computes in fp32 whatever it says).
  if (g.nodes()[i].attrs.has("precision"))
    attrs.set("precision", g.nodes()[i].attrs.get_string("precision"));
  const int64_t lanes_dw = wd->dim(0) * wd->dim(4), lanes_pw = wp->dim(0) * wp->dim(4);
  // Copies: adding constants below may move the node vector.
  const Node dw_node = *dw, pw_node = g.nodes()[i];
  const size_t dw_index = index_of(g, dw), mid_index = mid ? index_of(g, mid) : 0;
  const std::string note = mid ? "FuseBlockedConvs/" + mid->op : "FuseBlockedConvs/Plain";
  const ValueId bd = bias_or_zeros(g, dw_node, 2, lanes_dw);
  const ValueId bp = bias_or_zeros(g, pw_node, 2, lanes_pw);
  retarget(g.mutable_nodes()[i], "DwPwConvBlocked",
           {dw_node.inputs[0], dw_node.inputs[1], bd, pw_node.inputs[1], bp}, std::move(attrs));
  g.mutable_nodes()[i].domain = "pto";
  rw.remove(dw_index);
  if (note != "FuseBlockedConvs/Plain") rw.remove(mid_index);
  ctx.note(note);
  return true;
}

// The activation node between two convs (a Relu, or a Clip with finite constant bounds) as
// attributes `prefix`activation / `prefix`min / `prefix`max; false when `mid` is not one.
bool activation_attrs(const Graph& g, const Node& mid, const std::string& prefix,
                      Attributes& attrs) {
  if ((mid.op != "Relu" && mid.op != "Clip") || !mid.domain.empty() || mid.inputs.empty())
    return false;
  const auto bounds = clamp_bounds(g, mid);
  if (!bounds ||
      (mid.op == "Clip" && !(std::isfinite(bounds->first) && std::isfinite(bounds->second))))
    return false;
  attrs.set(prefix + "activation", mid.op);
  if (mid.op == "Clip") {
    attrs.set(prefix + "min", bounds->first);
    attrs.set(prefix + "max", bounds->second);
  }
  return true;
}

// Expanded planes (one image's expanded tensor, bytes) from which the expansion joins the
// DwPwConvBlocked: MobileNetV2's at 112x112 and 56x56 (4.8 and 1.8 MB). Measured per block (1
// thread, min of 40 calls in the model, fused vs expansion + DwPw): 809 vs 905 us at 112, 684 vs
// 710 and 369 vs 402 at 56, but only 261-263 vs 274 at 28x28 (600 KB, which stays in L2 between
// the two kernels anyway), where on 2 threads each task's first rows are expanded twice.
constexpr int64_t kExpandMinBytes = 1024 * 1024;

// A DwPwConvBlocked whose X, through at most a Relu or constant Clip, is read only from a 1x1,
// stride-1 ConvBlocked on a blocked tensor (a MobileNetV2 block's expansion) takes that conv as
// its inputs We, Be and attributes expand_*:
//   %e = pto.ConvBlocked(%x, %we, %be) {1x1}  %r = Clip(%e, 0, 6)
//   %y = pto.DwPwConvBlocked(%r, ...)
// -> %y = pto.DwPwConvBlocked(%x, ..., %we, %be) {expand_activation="Clip", ...}
bool fuse_expand(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const Node& n = g.nodes()[i];
  if (n.op != "DwPwConvBlocked" || n.domain != "pto" || n.inputs.size() != 5) return false;
  const std::vector<int>& uses = rw.uses();
  const ValueId x = n.inputs[0];
  if (uses[x] != 1 || g.is_output(x)) return false;
  const Node* mid = producer(g, x);
  const Node* e = mid;
  Attributes attrs = n.attrs;
  if (mid && activation_attrs(g, *mid, "expand_", attrs)) {
    const ValueId d = mid->inputs[0];
    if (uses[d] != 1 || g.is_output(d)) return false;
    e = producer(g, d);
  } else {
    mid = nullptr;
  }
  if (!e || !pointwise(g, *e)) return false;
  // One precision for both 1x1 convs (AutoMixedPrecision marks both).
  if (e->attrs.get_string("precision", "") != n.attrs.get_string("precision", "")) return false;
  const auto& xt = g.value(e->inputs[0]).type;
  const auto& yt = g.value(e->outputs[0]).type;
  if (!xt.shape || xt.shape->size() != 5 || !yt.shape || yt.shape->size() != 5) return false;
  const Tensor* we = constant(g, e->inputs[1]);
  const Tensor* wd = constant(g, n.inputs[1]);
  if (!wd || we->dim(0) != wd->dim(0) || we->dim(4) != wd->dim(4)) return false;
  const Shape& ys = *yt.shape;
  if (!ys[2].is_known() || !ys[3].is_known() ||
      ys[2].value * ys[3].value * we->dim(0) * we->dim(4) * 4 < kExpandMinBytes)
    return false;
  attrs.set("expand_channels", e->attrs.get_int("channels"));
  const Node e_node = *e;
  const size_t e_index = index_of(g, e), mid_index = mid ? index_of(g, mid) : 0;
  const ValueId be = bias_or_zeros(g, e_node, 2, we->dim(0) * we->dim(4));
  Node& fused = g.mutable_nodes()[i];
  std::vector<ValueId> ins = fused.inputs;
  ins[0] = e_node.inputs[0];
  ins.push_back(e_node.inputs[1]);
  ins.push_back(be);
  fused.inputs = std::move(ins);
  fused.attrs = std::move(attrs);
  rw.remove(e_index);
  if (mid) rw.remove(mid_index);
  rw.changed();
  ctx.note("FuseBlockedConvs/Expand");
  return true;
}

// The activation that reads a GroupNormBlocked's output y and nothing else does becomes the norm's:
// Relu(y), or SiLU as Mul(y, Sigmoid(y)) (a UNet's GroupNorm + SiLU); the normalizing pass
// applies it instead of a second pass over the tensor.
bool fuse_norm_activation(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const Node& root = g.nodes()[i];
  if (!root.domain.empty() || root.outputs.size() != 1) return false;
  const std::vector<int>& uses = rw.uses();
  ValueId x = kNoValue;
  const Node* sigmoid = nullptr;
  if (root.op == "Relu" && root.inputs.size() == 1) {
    x = root.inputs[0];
    if (uses[x] != 1) return false;
  } else if (root.op == "Mul" && root.inputs.size() == 2) {
    for (int side = 0; side < 2 && !sigmoid; ++side) {
      const Node* s = producer(g, root.inputs[1 - side]);
      if (s && s->op == "Sigmoid" && s->domain.empty() && s->inputs.size() == 1 &&
          s->inputs[0] == root.inputs[side] && uses[s->outputs[0]] == 1 &&
          !g.is_output(s->outputs[0]))
        sigmoid = s, x = root.inputs[side];
    }
    if (!sigmoid || uses[x] != 2) return false;
  } else {
    return false;
  }
  const Node* norm = producer(g, x);
  if (!norm || norm->op != "GroupNormBlocked" || norm->domain != "pto" ||
      !norm->attrs.get_string("activation", "").empty() || g.is_output(x))
    return false;
  const Node copy = *norm;
  Attributes attrs = copy.attrs;
  attrs.set("activation", std::string(sigmoid ? "Silu" : "Relu"));
  if (sigmoid) rw.remove(index_of(g, sigmoid));
  rw.remove(index_of(g, norm));
  Node& fused = g.mutable_nodes()[i];
  retarget(fused, "GroupNormBlocked", copy.inputs, std::move(attrs));
  fused.domain = "pto";
  ctx.note(sigmoid ? "FuseBlockedConvs/GroupNormSilu" : "FuseBlockedConvs/GroupNormRelu");
  return true;
}

Graph fuse_blocked_convs(Graph g, const PassContext& ctx) {
  apply_rules(g, {{nullptr, fuse}, {nullptr, fuse_norm_activation}}, ctx);
  apply_rules(g, {{nullptr, fuse_expand}}, ctx);
  return g;
}

}  // namespace

void register_fuse_blocked_convs(PassRegistry& r) {
  r.add({"FuseBlockedConvs", fuse_blocked_convs,
         "joins a depthwise ConvBlocked, a Relu or Clip, and the 1x1 ConvBlocked reading it into "
         "one DwPwConvBlocked, and a GroupNormBlocked and its Relu or SiLU (level 3)"});
}

}  // namespace pto::passes
