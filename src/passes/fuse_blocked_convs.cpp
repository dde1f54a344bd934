// FuseBlockedConvs (level 3, after AssignLayouts): a depthwise ConvBlocked whose output, through
// at most a Relu or a constant Clip, is read only by a 1x1, stride-1, unpadded, group-1
// ConvBlocked becomes one DwPwConvBlocked (src/ir/ops/blocked_layout.cpp). Its kernel computes
// the depthwise output a row at a time into a per-thread buffer that the 1x1 conv reads while it
// is in cache, so the widest tensor of a MobileNet block is never written out and read back.
//   %d = pto.ConvBlocked(%x, %wd, %bd) {depthwise}  %r = Clip(%d, 0, 6)
//   %y = pto.ConvBlocked(%r, %wp, %bp) {1x1}
// -> %y = pto.DwPwConvBlocked(%x, %wd, %bd, %wp, %bp) {activation="Clip", min=0, max=6}
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
    if (name != "group") attrs.set(name, value);
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

Graph fuse_blocked_convs(Graph g, const PassContext& ctx) {
  apply_rules(g, {{nullptr, fuse}}, ctx);
  return g;
}

}  // namespace

void register_fuse_blocked_convs(PassRegistry& r) {
  r.add({"FuseBlockedConvs", fuse_blocked_convs,
         "joins a depthwise ConvBlocked, a Relu or Clip, and the 1x1 ConvBlocked reading it into "
         "one DwPwConvBlocked (level 3)"});
}

}  // namespace pto::passes
