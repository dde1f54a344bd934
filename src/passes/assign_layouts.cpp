// AssignLayouts (level 3): gives every 4-D float activation a layout, NCHW or channel-blocked
// NCHWc (the ops of src/ir/ops/blocked_layout.cpp), and inserts reorders only where a reader needs
// the other one. A blocked tensor is an explicit 5-D value [N, ceil(C/c), H, W, c]; c is the float
// lanes of the machine's vectors (machine_channel_block).
//
//   1. Choose, in node order. A Conv the CPU backend runs blocked (float32, 2-D, constant weights,
//      group 1 or depthwise, and `blocked_pays`, the cost rule) yields a blocked value. A
//      layout-agnostic node yields one when its inputs allow (`propagates`): an elementwise op
//      with a blocked input whose other inputs are values of its output's shape, scalars, or
//      constants per channel (reordered here; an NCHW operand costs one reorder, as reordering
//      the blocked one back would); a Concat on channels of blocked values whose channel counts are
//      multiples of c; a mean over H and W (GlobalAveragePool, ReduceMean over {2, 3}; one that
//      drops H and W first keeps them and is followed by a Flatten) of a blocked value, as
//      ReduceMean over {2, 3} of the 5-D value; MaxPool and
//      AveragePool (2-D windows) of a blocked value, as the same pool with a unit window on the
//      5-D value's channel lanes; GroupNormalization (per-channel scale and bias) of a blocked
//      value, as GroupNormBlocked; an inference BatchNormalization of a blocked value (after an
//      activation, ConvMixer's Conv -> GELU -> BN, or on a Concat, DenseNet's pre-activation
//      BN -> ReLU -> Conv: one FoldBatchNorm could not fold into a conv), as a depthwise 1x1
//      ConvBlocked with weights and bias per channel; a GatherChannels (FuseChannelMoves: a channel
//      shuffle; or, made here first, a Concat, Split or Slice on channels whose parts are not whole
//      blocks, GhostNet's halves) with a blocked input, its lanes permuted into place. An
//      elementwise op may also read [N, C, 1, 1] values (squeeze-excitation's scale), blocked or
//      reordered. Everything else (Flatten, Gemm, other reductions, unknown ops) reads NCHW. Then a
//      conv that starts a region (NCHW input) reaching no other blocked conv is left NCHW, and the
//      walk is redone, until nothing changes (`demote_isolated`).
//   2. Rewrite. A chosen Conv becomes ConvBlocked, its weights and bias reordered now (weights
//      [OC/c, IC/c, KH, KW, c, c], depthwise [C/c, 1, KH, KW, c], zero-padded). A blocked value v
//      gets a new 5-D value; v itself survives as ReorderFromBlocked of it, placed right after the
//      producer, only when something reads v in NCHW (a graph output keeps its name this way). An
//      NCHW value a blocked node reads is reordered once, before its first such reader. Each value
//      thus has at most one reorder whatever its number of readers.
// Padded lanes (channels past C in the last block) hold unspecified values that no reader uses.
//
// Moving constant data (the weight reorder) outside src/reference is against DESIGN habit 6; it
// is pure data movement, done once at compile time, as FoldBatchNorm folds weights.
#include "passes/assign_layouts.h"

#include <algorithm>
#include <numeric>

#include "ir/ops/blocked_layout.h"
#include "ir/ops/op_params.h"
#include "passes/rewrite_util.h"
#include "pto/device_info.h"

namespace pto::passes {
namespace {

enum Kind : int8_t { kKeep, kConv, kPropagate };

// The shape of a 4-D float32 value with a known channel count, else nullopt (N, H and W may be
// symbolic).
std::optional<Shape> nchw_f32(const Graph& g, ValueId v) {
  if (v == kNoValue || g.value(v).type.dtype != DType::kF32) return std::nullopt;
  const std::optional<Shape>& s = g.value(v).type.shape;
  if (!s || s->size() != 4 || !(*s)[1].is_known()) return std::nullopt;
  return s;
}

// The channel count of a value nchw_f32 accepts.
int64_t channels_of(const Graph& g, ValueId v) {
  return (*g.value(v).type.shape)[1].value;
}

int64_t blocks_of(int64_t c, int block) {
  return (c + block - 1) / block;
}

// The cost rule: where the blocked direct convolution is expected to beat the NCHW Conv kernel
// (docs/passes.md has the measurements behind it). The blocked kernel computes every padded
// output lane, so a channel count that leaves much of its last block empty (24 channels in two
// blocks of 16) loses up to 1.4x; input lanes past C are skipped, so only their loop overhead
// counts, and a stem with fewer input channels than one block pays nothing for them. Where the
// input is blocked already, the conv stays blocked anyway: the reorders around an NCHW conv in a
// blocked region cost more than the padding (MobileNetV2's 24-channel stage, measured).
bool blocked_pays(int64_t in_channels, int64_t out_channels, int block, bool input_blocked) {
  if (input_blocked) return true;
  auto filled = [&](int64_t c) { return blocks_of(c, block) * block * 8 <= c * 9; };
  return filled(out_channels) && (in_channels < block || filled(in_channels));
}

// Whether Conv `n` runs blocked: float32, 2-D, fp32 or bf16 products (ConvBlocked keeps
// precision="bf16"; bf16x3 ones stay the NCHW kernel's implicit GEMM), constant weights (and bias),
// group 1, groups whose channels fill whole blocks, or depthwise with one output per input channel
// and fp32 products (AutoMixedPrecision never marks one; the NCHW kernel honours a hand-written
// marking on rounded copies), and the cost rule says it pays (never for bf16 products where they
// run on AMX tiles).
bool conv_blockable(const Graph& g, const Node& n, int block, bool input_blocked, bool cost_rule) {
  if (n.op != "Conv" || !n.domain.empty() || n.inputs.size() < 2 || n.outputs.size() != 1)
    return false;
  if (const std::optional<DType> p = params::product_precision(n);
      (p != DType::kF32 && p != DType::kBF16) || params::split_bf16_products(n))
    return false;
  const std::optional<Shape> x = nchw_f32(g, n.inputs[0]);
  const Tensor* w = constant(g, n.inputs[1]);
  if (!x || !w || w->dtype() != DType::kF32 || w->rank() != 4 || !nchw_f32(g, n.outputs[0]))
    return false;
  if (n.inputs.size() > 2 && n.inputs[2] != kNoValue) {
    const Tensor* b = constant(g, n.inputs[2]);
    if (!b || b->dtype() != DType::kF32 || b->numel() != w->dim(0)) return false;
  }
  const int64_t group = n.attrs.get_int("group", 1), C = (*x)[1].value;
  const bool depthwise = group > 1 && group == C && w->dim(0) == C && w->dim(1) == 1;
  // Groups of whole blocks: each group's input and output channels fill whole blocks.
  const bool grouped = group > 1 && !depthwise && w->dim(1) * group == C &&
                       C % (group * block) == 0 && w->dim(0) % (group * block) == 0;
  if (!(group == 1 && w->dim(1) == C) && !depthwise && !grouped) return false;
  if (depthwise && n.attrs.has("precision")) return false;
  // On AMX tiles the NCHW Conv's implicit GEMM beats the blocked direct kernel's VDPBF16PS pairs
  // by far (ResNet-50 bf16, 2-core Xeon with AMX, one thread: 26.1 ms NCHW at level 2 against
  // 81.1 ms blocked at level 3, whose fp32 run is 57.1).
  if (cost_rule && params::product_precision(n) == DType::kBF16 && machine_has_amx_bf16())
    return false;
  return !cost_rule || blocked_pays(C, w->dim(0), block, input_blocked);
}

// A constant that varies along the channel axis of a [N, C, H, W] output only: its shape,
// right-aligned to 4 dims, is 1 everywhere but (optionally) C at axis 1.
bool per_channel(const Tensor& t, int64_t C) {
  if (t.rank() > 4 || t.dtype() != DType::kF32) return false;
  for (int64_t d = 0; d < t.rank(); ++d) {
    const int64_t axis = d + 4 - t.rank();
    if (t.dim(d) != 1 && !(axis == 1 && t.dim(d) == C)) return false;
  }
  return true;
}

// Which 4-D values the graph's structure proves to have the same N, H and W where their shapes
// cannot: a conv's output size on a symbolic input is unknown ("?"), so `same_shape` fails on
// every elementwise op of a model exported with dynamic height and width (YOLOv8's SiLU
// x * sigmoid(x) and C2f's residual adds), and none of its convs would be blocked. Union-find
// over values, in node order: a unary elementwise op's output is its input's size; a binary
// one's is its operands' when they are of one class (operands [N, C, 1, 1] broadcast and do not
// count); a Split or Concat on channels, or a GatherChannels, keeps every part's N, H and W (a
// Concat's inputs must agree for the graph to run at all); a Conv, MaxPool or AveragePool with unit
// strides whose pads add up to the dilated window keeps its input's.
class SpatialClasses {
 public:
  explicit SpatialClasses(const Graph& g) : parent_(g.values().size()) {
    std::iota(parent_.begin(), parent_.end(), ValueId{0});
    for (const Node& n : g.nodes()) visit(g, n);
  }
  bool same(ValueId a, ValueId b) { return find(a) == find(b); }

 private:
  ValueId find(ValueId v) {
    while (parent_[v] != v) v = parent_[v] = parent_[parent_[v]];
    return v;
  }
  void join(ValueId a, ValueId b) { parent_[find(a)] = find(b); }

  static const Shape* shape4(const Graph& g, ValueId v) {
    if (v == kNoValue) return nullptr;
    const std::optional<Shape>& s = g.value(v).type.shape;
    return s && s->size() == 4 ? &*s : nullptr;
  }

  // Unit strides and pads that add up to the dilated window on both axes (or SAME padding).
  static bool keeps_plane(const Graph& g, const Node& n) {
    Dims k = n.attrs.get_ints("kernel_shape", {});
    if (k.empty() && n.op == "Conv" && n.inputs.size() > 1)
      if (const Tensor* w = constant(g, n.inputs[1]); w && w->rank() == 4)
        k = {w->dim(2), w->dim(3)};
    if (k.size() != 2) return false;
    const Dims s = n.attrs.get_ints("strides", {1, 1}), d = n.attrs.get_ints("dilations", {1, 1});
    if (s != Dims{1, 1} || d.size() != 2) return false;
    const std::string pad = n.attrs.get_string("auto_pad", "NOTSET");
    if (pad == "SAME_UPPER" || pad == "SAME_LOWER") return true;
    const Dims p = n.attrs.get_ints("pads", {0, 0, 0, 0});
    if (pad != "NOTSET" || p.size() != 4) return pad == "VALID" && k == Dims{1, 1};
    return p[0] + p[2] == d[0] * (k[0] - 1) && p[1] + p[3] == d[1] * (k[1] - 1);
  }

  void visit(const Graph& g, const Node& n) {
    if (n.op == "GatherChannels" && n.domain == "pto" && n.outputs.size() == 1) {
      for (ValueId in : n.inputs)  // channel planes: every input has the output's N, H and W
        if (shape4(g, in) && shape4(g, n.outputs[0])) join(in, n.outputs[0]);
      return;
    }
    if (!n.domain.empty() || n.outputs.empty()) return;
    const Shape* out = shape4(g, n.outputs[0]);
    if (!out) return;
    const int64_t axis = n.attrs.get_int("axis", 0);
    if (n.op == "Split" || n.op == "Concat") {
      if (axis != 1 && axis != -3) return;
      for (ValueId v : n.op == "Split" ? n.outputs : n.inputs)
        if (shape4(g, v)) join(v, n.op == "Split" ? n.inputs[0] : n.outputs[0]);
      return;
    }
    if (n.op == "Conv" || n.op == "MaxPool" || n.op == "AveragePool") {
      if (n.outputs.size() == 1 && shape4(g, n.inputs[0]) && keeps_plane(g, n))
        join(n.outputs[0], n.inputs[0]);
      return;
    }
    if (!n.def || !n.def->is_elementwise() || n.outputs.size() != 1 || n.attrs.has("axis")) return;
    ValueId first = kNoValue;
    for (ValueId in : n.inputs) {
      if (in == kNoValue || constant(g, in)) continue;
      const Shape* s = shape4(g, in);
      if (!s) return;  // a lower rank that is not constant: leave it
      if ((*s)[2] == Dim(1) && (*s)[3] == Dim(1) && !((*out)[2] == Dim(1) && (*out)[3] == Dim(1))) {
        if (!((*s)[0] == Dim(1)) && !((*s)[0].is_symbolic() && (*s)[0] == (*out)[0])) return;
        continue;  // [N, C, 1, 1] broadcasts onto the others
      }
      if (first == kNoValue)
        first = in;
      else if (!same(first, in))
        return;
    }
    if (first != kNoValue) join(n.outputs[0], first);
  }

  std::vector<ValueId> parent_;
};

// A value [N', C, 1, 1] (N' the output's N or 1) that broadcasts onto `out` per channel: its
// blocked form [N', C/c, 1, 1, c] broadcasts onto the blocked output the same way.
bool per_channel_value(const Graph& g, ValueId v, const Shape& out) {
  const std::optional<Shape> s = nchw_f32(g, v);
  if (!s || !((*s)[1] == out[1]) || !((*s)[2] == Dim(1)) || !((*s)[3] == Dim(1))) return false;
  const Dim& n = (*s)[0];
  return n == Dim(1) || (n == out[0] && (n.is_known() || n.is_symbolic()));
}

// A mean over H and W that keeps them, [N, C, H, W] -> [N, C, 1, 1]: GlobalAveragePool, or
// ReduceMean over axes {2, 3} with keepdims. On the blocked value it is ReduceMean over axes
// {2, 3} of the 5-D value, whose result is the blocked form of the mean.
bool spatial_mean_axes(const Graph& g, const Node& n) {
  if (n.op != "ReduceMean" || !n.domain.empty() || n.inputs.empty() || !nchw_f32(g, n.inputs[0]))
    return false;
  std::optional<std::vector<int64_t>> axes =
      n.attrs.has("axes") ? std::optional(n.attrs.get_ints("axes")) : constant_ints(g, n, 1);
  if (!axes || axes->size() != 2) return false;
  for (int64_t& a : *axes) a = a < 0 ? a + 4 : a;
  std::sort(axes->begin(), axes->end());
  return *axes == std::vector<int64_t>{2, 3};
}

bool spatial_mean(const Graph& g, const Node& n) {
  if (n.op == "GlobalAveragePool") return true;
  return spatial_mean_axes(g, n) && n.attrs.get_int("keepdims", 1) != 0;
}

// A mean over H and W that drops them, [N, C, H, W] -> [N, C] (x.mean([2, 3]): torchvision's
// MNASNet, timm heads), becomes the mean that keeps them and a Flatten (a view), so that the mean
// reads a blocked value as spatial_mean does, rather than a reorder of the whole last feature map
// and a mean over it on one thread (MNASNet: 1280 x 7 x 7, 10 + 15 us a call).
void keep_spatial_mean_dims(Graph& g) {
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (!spatial_mean_axes(g, n) || n.attrs.get_int("keepdims", 1) != 0 || n.outputs.size() != 1)
      continue;
    const Shape& in = *g.value(n.inputs[0]).type.shape;
    const ValueId y = n.outputs[0];
    const ValueId kept = g.add_value(g.unique_name(g.value(y).name + "_kept"),
                                     {DType::kF32, Shape{in[0], in[1], Dim(1), Dim(1)}});
    Node& mean = g.mutable_nodes()[i];
    mean.attrs.set("keepdims", int64_t{1});
    mean.outputs[0] = kept;
    g.value(kept).producer = static_cast<int32_t>(i);
    g.value(y).producer = -1;  // the Flatten's now
    Attributes attrs;
    attrs.set("axis", int64_t{1});
    g.insert_node(i + 1, "Flatten", {kept}, {y}, std::move(attrs), mean.name + "_flatten");
  }
}

// The channels [begin, end) a Slice takes of its 4-D input of C channels: one axis, 1 (or -3),
// step 1, constant bounds (inputs from opset 10, attributes before); nullopt otherwise.
std::optional<std::pair<int64_t, int64_t>> channel_slice(const Graph& g, const Node& n, int64_t C) {
  std::optional<std::vector<int64_t>> starts, ends, axes = std::vector<int64_t>{0}, steps;
  if (n.attrs.has("starts")) {
    starts = n.attrs.get_ints("starts");
    ends = n.attrs.get_ints("ends");
    if (n.attrs.has("axes")) axes = n.attrs.get_ints("axes");
  } else if (n.inputs.size() >= 3) {
    starts = constant_ints(g, n, 1);
    ends = constant_ints(g, n, 2);
    if (n.inputs.size() > 3 && n.inputs[3] != kNoValue) axes = constant_ints(g, n, 3);
    if (n.inputs.size() > 4 && n.inputs[4] != kNoValue) steps = constant_ints(g, n, 4);
  }
  if (!starts || !ends || !axes || starts->size() != 1 || ends->size() != 1 || axes->size() != 1 ||
      ((*axes)[0] != 1 && (*axes)[0] != -3) || (steps && *steps != std::vector<int64_t>{1}))
    return std::nullopt;
  auto at = [&](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + C : i, 0, C); };
  const int64_t begin = at((*starts)[0]), end = at((*ends)[0]);
  if (end <= begin) return std::nullopt;
  return std::make_pair(begin, end);
}

// Channel moves that do not keep to whole blocks — a Concat of parts, a Split into parts, or a
// Slice, on channels of 4-D float32 values, where a part's channel count (or a Slice's first
// channel) is not a multiple of c (GhostNet's modules concatenate two halves of 8, 12, 20, ...
// channels) — become GatherChannels nodes (a Split one per output): the same copies on NCHW
// values, and a lane permute on blocked ones, where the op itself would need its input in NCHW
// (a reorder out and one back in). Returns the number rewritten.
int channel_moves_as_gathers(Graph& g, int block) {
  int rewritten = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (!n.domain.empty() || (n.op != "Concat" && n.op != "Split" && n.op != "Slice") ||
        n.inputs.empty() || !nchw_f32(g, n.inputs[0]))
      continue;
    const int64_t axis = n.attrs.get_int("axis", n.op == "Concat" ? 1 : 0);
    std::vector<std::pair<ValueId, std::pair<Dims, Dims>>> parts;  // output, (index, channel)
    std::vector<ValueId> sources = {n.inputs[0]};
    bool aligned = true;
    if (n.op == "Concat") {
      if (axis != 1 && axis != -3) continue;
      Dims index, channel;
      sources = n.inputs;
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        if (!nchw_f32(g, n.inputs[k])) {
          sources.clear();
          break;
        }
        const int64_t C = channels_of(g, n.inputs[k]);
        aligned = aligned && C % block == 0;
        for (int64_t c = 0; c < C; ++c) {
          index.push_back(static_cast<int64_t>(k));
          channel.push_back(c);
        }
      }
      if (sources.empty() || n.outputs.size() != 1) continue;
      parts.push_back({n.outputs[0], {index, channel}});
    } else if (n.op == "Split") {
      if ((axis != 1 && axis != -3) || n.outputs.empty()) continue;
      int64_t at = 0;
      for (ValueId y : n.outputs) {
        if (y == kNoValue || !nchw_f32(g, y)) {
          parts.clear();
          break;
        }
        const int64_t C = channels_of(g, y);
        aligned = aligned && C % block == 0;
        Dims channel(static_cast<size_t>(C));
        std::iota(channel.begin(), channel.end(), at);
        parts.push_back({y, {Dims(static_cast<size_t>(C), 0), channel}});
        at += C;
      }
      if (parts.empty() || at != channels_of(g, n.inputs[0])) continue;
    } else {
      const std::optional<std::pair<int64_t, int64_t>> r =
          channel_slice(g, n, channels_of(g, n.inputs[0]));
      if (!r || n.outputs.size() != 1 || !nchw_f32(g, n.outputs[0]) ||
          channels_of(g, n.outputs[0]) != r->second - r->first)
        continue;
      Dims channel(static_cast<size_t>(r->second - r->first));
      std::iota(channel.begin(), channel.end(), r->first);
      parts.push_back({n.outputs[0], {Dims(channel.size(), 0), channel}});
      aligned = false;
    }
    if (aligned) continue;  // Concat and Split of whole blocks run blocked as they are
    const std::string name = n.name;
    for (size_t k = 0; k < parts.size(); ++k) {
      Attributes attrs;
      attrs.set("input_index", parts[k].second.first);
      attrs.set("input_channel", parts[k].second.second);
      const ValueId y = parts[k].first;
      if (k == 0) {
        Node& m = g.mutable_nodes()[i];
        retarget(m, "GatherChannels", sources, std::move(attrs));
        m.domain = "pto";
        m.outputs = {y};
        continue;
      }
      g.value(y).producer = -1;  // the new node's
      g.insert_node(i + k, "GatherChannels", sources, {y}, std::move(attrs), cat(name, "_part", k))
          .domain = "pto";
    }
    i += parts.size() - 1;
    ++rewritten;
  }
  return rewritten;
}

// A Resize of H and W only (no roi crop, no axes attribute, opset 13 and later), by constant
// scales [1, 1, sh, sw] or constant sizes [N, C, OH, OW] of an input of that N and C (the
// stretching policy): the same Resize of the blocked value with scales [1, 1, sh, sw, 1] or sizes
// [N, C/c, OH, OW, c] (the lane axis, scale 1, is an identity axis in every mode; from sizes each
// axis's scale is its own ratio, so H's and W's are unchanged). YOLO's and U-Net's 2x nearest
// upsampling between blocked convs, and GhostNetV2's gate, resized to its branch's size.
struct PlaneResize {
  std::vector<float> scales;  // [1, 1, sh, sw]; empty when the sizes are given
  Dims sizes;                 // [N, C, OH, OW]
};

std::optional<PlaneResize> plane_resize_params(const Graph& g, const Node& n) {
  if (n.op != "Resize" || !n.domain.empty() || n.inputs.size() < 3 || n.inputs.size() > 4 ||
      n.attrs.has("axes") || (n.opset != 0 && n.opset < 13) ||  // roi optional from opset 13
      n.attrs.get_string("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize" ||
      n.attrs.get_int("antialias", 0) != 0)
    return std::nullopt;
  PlaneResize r;
  if (n.inputs.size() == 4 && n.inputs[3] != kNoValue) {
    const Tensor* sizes = constant(g, n.inputs[3]);
    const std::optional<Shape> x = nchw_f32(g, n.inputs[0]);
    if (!sizes || !x || sizes->numel() != 4 || !(*x)[0].is_known() ||
        (n.inputs[2] != kNoValue &&
         !(constant(g, n.inputs[2]) && constant(g, n.inputs[2])->numel() == 0)) ||
        n.attrs.get_string("keep_aspect_ratio_policy", "stretch") != "stretch")
      return std::nullopt;
    for (int64_t i = 0; i < 4; ++i)
      r.sizes.push_back(static_cast<int64_t>(sizes->item_as_double(i)));
    if (r.sizes[0] != (*x)[0].value || r.sizes[1] != (*x)[1].value) return std::nullopt;
    return r;
  }
  const Tensor* scales = n.inputs[2] == kNoValue ? nullptr : constant(g, n.inputs[2]);
  if (!scales || scales->dtype() != DType::kF32 || scales->numel() != 4) return std::nullopt;
  r.scales.resize(4);
  for (int64_t i = 0; i < 4; ++i) r.scales[i] = static_cast<float>(scales->item_as_double(i));
  if (r.scales[0] != 1.0f || r.scales[1] != 1.0f) return std::nullopt;
  return r;
}

bool plane_resize(const Graph& g, const Node& n) {
  return plane_resize_params(g, n).has_value();
}

// A GroupNormalization of a 4-D float32 value with constant scale and bias per channel (opset
// 21's meaning; before, per group, the same where each group is one channel): GroupNormBlocked.
bool group_norm_blockable(const Graph& g, const Node& n) {
  if (n.inputs.size() != 3 || !nchw_f32(g, n.inputs[0])) return false;
  const int64_t C = channels_of(g, n.inputs[0]), groups = n.attrs.get_int("num_groups", 0);
  if (groups < 1 || C % groups != 0 || (n.opset != 0 && n.opset < 21 && groups != C)) return false;
  for (size_t i = 1; i < 3; ++i) {
    const Tensor* t = constant(g, n.inputs[i]);
    if (!t || t->dtype() != DType::kF32 || t->rank() != 1 || t->numel() != C) return false;
  }
  return true;
}

// Whether node `n` can read and write blocked values given which values are blocked.
bool propagates(const Graph& g, const Node& n, const std::vector<bool>& blocked, int block,
                SpatialClasses& classes) {
  if (n.op == "Split" && n.domain.empty()) {
    // On channels, into parts of whole blocks: a Split of the blocked value's block axis.
    const int64_t axis = n.attrs.get_int("axis", 0);
    if (n.inputs.empty() || !blocked[n.inputs[0]] || (axis != 1 && axis != -3)) return false;
    for (ValueId out : n.outputs)
      if (out == kNoValue || !nchw_f32(g, out) || channels_of(g, out) % block != 0) return false;
    return !n.outputs.empty();
  }
  if (n.op == "GatherChannels" && n.domain == "pto") {
    // Channel planes of blocked values (ShuffleNet's shuffle, FuseChannelMoves): lanes permuted
    // into the blocked output; an NCHW input costs one reorder, as reordering the result would.
    if (n.outputs.size() != 1 || !nchw_f32(g, n.outputs[0])) return false;
    bool any = false;
    for (ValueId in : n.inputs) {
      if (!nchw_f32(g, in)) return false;
      any = any || blocked[in];
    }
    return any;
  }
  if (n.outputs.size() != 1 || !n.domain.empty() || !n.def) return false;
  const std::optional<Shape> out = nchw_f32(g, n.outputs[0]);
  if (!out) return false;
  if (n.op == "Concat") {
    const int64_t axis = n.attrs.get_int("axis", 1);
    if (axis != 1 && axis != -3) return false;
    for (ValueId in : n.inputs) {
      if (!blocked[in] || !nchw_f32(g, in) || channels_of(g, in) % block != 0) return false;
    }
    return !n.inputs.empty();
  }
  if (n.op == "GlobalAveragePool" || n.op == "ReduceMean")
    return !n.inputs.empty() && blocked[n.inputs[0]] && spatial_mean(g, n);
  if (n.op == "Resize") return !n.inputs.empty() && blocked[n.inputs[0]] && plane_resize(g, n);
  if (n.op == "GroupNormalization")
    return !n.inputs.empty() && blocked[n.inputs[0]] && group_norm_blockable(g, n);
  if (n.op == "BatchNormalization") {
    const std::optional<BnAffine> a = bn_affine(g, n);  // five inputs, constant parameters
    return a && blocked[n.inputs[0]] && static_cast<int64_t>(a->scale.size()) == (*out)[1].value;
  }
  if (n.op == "MaxPool" || n.op == "AveragePool")
    return !n.inputs.empty() && blocked[n.inputs[0]] && n.attrs.has("kernel_shape") &&
           n.attrs.get_ints("kernel_shape").size() == 2 && n.attrs.get_int("storage_order", 0) == 0;
  if (!n.def->is_elementwise() || n.def->has(kNondeterministic) || n.attrs.has("axis"))
    return false;
  bool any = false;
  for (ValueId in : n.inputs) {
    if (in == kNoValue) continue;
    if (const Tensor* t = constant(g, in)) {
      if (t->numel() != 1 && !per_channel(*t, (*out)[1].value)) return false;
    } else if (nchw_f32(g, in) &&
               (same_shape(g, in, n.outputs[0]) ||
                (channels_of(g, in) == (*out)[1].value && classes.same(in, n.outputs[0])))) {
      any = any || blocked[in];  // an NCHW operand is reordered (once): one reorder either way
    } else if (!per_channel_value(g, in, *out)) {
      return false;  // a per-channel value (squeeze-excitation's scale) is blocked or cheap
    }
  }
  return any;
}

// ---- constant data in the blocked layout ----

// A bias [M] zero-padded to [ceil(M/c) * c].
Tensor padded_bias(const Tensor& bias, int block) {
  const Tensor src = bias.contiguous();
  Tensor t = Tensor::zeros(DType::kF32, {blocks_of(bias.numel(), block) * block});
  std::copy_n(src.data<float>(), bias.numel(), t.data<float>());
  return t;
}

// A per-channel constant (per_channel) as [1, C/c, 1, 1, c]; a constant without a channel axis
// is returned as it is (it broadcasts onto the blocked value unchanged).
Tensor blocked_constant(const Tensor& t, int64_t C, int block) {
  if (t.numel() == 1 || t.numel() != C) return t;
  const Tensor src = t.contiguous();
  Tensor out = Tensor::zeros(DType::kF32, {1, blocks_of(C, block), 1, 1, block});
  std::copy_n(src.data<float>(), C, out.data<float>());  // channel k is element k either way
  return out;
}

class Rewriter {
 public:
  Rewriter(Graph& g, const std::vector<int8_t>& kind, int block, const PassContext& ctx)
      : g_(g), kind_(kind), block_(block), ctx_(ctx), blocked_of_(g.values().size(), kNoValue) {}

  void run() {
    const size_t count = g_.nodes().size();
    std::vector<bool> nchw_readers = nchw_needed();
    for (size_t i = 0; i < count; ++i) {
      if (kind_[i] == kKeep) {
        order_.push_back(i);
        continue;
      }
      const std::vector<ValueId> ys = g_.nodes()[i].outputs;
      if (kind_[i] == kConv)
        to_conv_blocked(i);
      else if (g_.nodes()[i].op == "Split")
        to_blocked_split(i);
      else
        to_blocked_reader(i);
      order_.push_back(i);
      for (ValueId y : ys) {
        if (!nchw_readers[y]) continue;
        g_.value(y).producer = -1;
        Attributes attrs;
        attrs.set("channels", channels_of(g_, y));
        order_.push_back(add("ReorderFromBlocked", blocked_of_[y], y, std::move(attrs), "_nchw"));
        ctx_.note("AssignLayouts/ReorderFromBlocked");
      }
    }
    std::vector<Node> nodes;
    for (size_t i : order_) nodes.push_back(std::move(g_.mutable_nodes()[i]));
    g_.mutable_nodes() = std::move(nodes);
    g_.remove_nodes({});  // renumbers every value's producer
  }

 private:
  // Which blocked values something still reads in NCHW.
  std::vector<bool> nchw_needed() const {
    std::vector<bool> need(g_.values().size(), false);
    for (ValueId v : g_.outputs()) need[v] = true;
    for (size_t i = 0; i < g_.nodes().size(); ++i) {
      const Node& n = g_.nodes()[i];
      for (size_t k = 0; k < n.inputs.size(); ++k)
        if (n.inputs[k] != kNoValue && !(kind_[i] == kPropagate || (kind_[i] == kConv && k == 0)))
          need[n.inputs[k]] = true;
    }
    return need;
  }

  // Appends node `op`(in) -> out in the pto domain; returns its index.
  size_t add(const std::string& op, ValueId in, ValueId out, Attributes attrs,
             const std::string& suffix) {
    Node& n =
        g_.add_node(op, {in}, {out}, std::move(attrs), g_.unique_name(g_.value(out).name + suffix));
    n.domain = "pto";
    return g_.nodes().size() - 1;
  }

  // A new 5-D value for the blocked form of NCHW value v.
  ValueId new_blocked_value(ValueId v) {
    const Shape& d = *g_.value(v).type.shape;
    Shape s = {d[0], blocks_of(d[1].value, block_), d[2], d[3], block_};
    return blocked_of_[v] = g_.add_value(g_.unique_name(g_.value(v).name + "_blocked"),
                                         TensorType{DType::kF32, s});
  }

  // The blocked form of v, reordering it (once) when it is an NCHW value.
  ValueId blocked(ValueId v) {
    if (blocked_of_[v] != kNoValue) return blocked_of_[v];
    const ValueId b = new_blocked_value(v);
    Attributes attrs;
    attrs.set("block", int64_t{block_});
    order_.push_back(add("ReorderToBlocked", v, b, std::move(attrs), "_reorder"));
    ctx_.note("AssignLayouts/ReorderToBlocked");
    return b;
  }

  void to_conv_blocked(size_t i) {
    const Node n = g_.nodes()[i];  // a copy: blocked() may add nodes
    const Tensor& w = *constant(g_, n.inputs[1]);
    const int64_t group = n.attrs.get_int("group", 1);
    const bool depthwise = group > 1 && w.dim(1) == 1 && w.dim(0) == group;
    // A group-1 conv with fewer input channels than a block reads an NCHW input as it is (a
    // network's first conv): no reorder of the image.
    const bool reads_nchw = group == 1 && w.dim(1) < block_ && blocked_of_[n.inputs[0]] == kNoValue;
    std::vector<ValueId> inputs = {reads_nchw ? n.inputs[0] : blocked(n.inputs[0])};
    inputs.push_back(g_.add_constant(g_.value(n.inputs[1]).name + "_blocked",
                                     blocked_conv_weights(w, depthwise, block_)));
    if (n.inputs.size() > 2 && n.inputs[2] != kNoValue)
      inputs.push_back(g_.add_constant(g_.value(n.inputs[2]).name + "_blocked",
                                       padded_bias(*constant(g_, n.inputs[2]), block_)));
    Attributes attrs = n.attrs;
    attrs.set("kernel_shape", Dims{w.dim(2), w.dim(3)});
    attrs.set("channels", w.dim(1) * group);
    const ValueId y = n.outputs[0];
    Node& m = g_.mutable_nodes()[i];
    retarget(m, "ConvBlocked", std::move(inputs), std::move(attrs));
    m.domain = "pto";
    m.outputs[0] = new_blocked_value(y);
    g_.value(m.outputs[0]).producer = static_cast<int32_t>(i);
    g_.value(y).producer = -1;
    ctx_.note(depthwise   ? "AssignLayouts/ConvBlocked(depthwise)"
              : group > 1 ? "AssignLayouts/ConvBlocked(grouped)"
                          : "AssignLayouts/ConvBlocked");
  }

  // A Split on channels into parts of whole blocks: the same Split of the blocked value's axis 1,
  // in blocks (the split sizes as an input, opset 13).
  void to_blocked_split(size_t i) {
    const std::vector<ValueId> ys = g_.nodes()[i].outputs;
    Dims sizes;
    for (ValueId y : ys) sizes.push_back(channels_of(g_, y) / block_);
    const ValueId parts =
        g_.add_constant(g_.value(ys[0]).name + "_blocks",
                        Tensor::from_vector<int64_t>(sizes, {static_cast<int64_t>(sizes.size())}));
    const ValueId xb = blocked_of_[g_.nodes()[i].inputs[0]];
    Attributes attrs;
    attrs.set("axis", int64_t{1});
    Node& n = g_.mutable_nodes()[i];
    retarget(n, "Split", {xb, parts}, std::move(attrs), 13);
    for (size_t k = 0; k < ys.size(); ++k) {
      const ValueId yb = new_blocked_value(ys[k]);
      Node& m = g_.mutable_nodes()[i];
      m.outputs[k] = yb;
      g_.value(yb).producer = static_cast<int32_t>(i);
      g_.value(ys[k]).producer = -1;
    }
    ctx_.note("AssignLayouts/Propagate/Split");
  }

  void to_blocked_reader(size_t i) {
    const ValueId y = g_.nodes()[i].outputs[0];
    const int64_t C = channels_of(g_, y);
    std::vector<ValueId> inputs = g_.nodes()[i].inputs;  // blocked() may add nodes
    if (g_.nodes()[i].op == "GlobalAveragePool" || g_.nodes()[i].op == "ReduceMean") {
      const ValueId axes =
          g_.add_constant(g_.value(y).name + "_axes", Tensor::from_vector<int64_t>({2, 3}, {2}));
      Attributes attrs;
      attrs.set("keepdims", int64_t{1});
      retarget(g_.mutable_nodes()[i], "ReduceMean", {blocked_of_[inputs[0]], axes},
               std::move(attrs), 18);  // opset 18: axes as an input
    } else if (g_.nodes()[i].op == "Resize") {
      PlaneResize r = *plane_resize_params(g_, g_.nodes()[i]);
      std::vector<ValueId> ins = {blocked_of_[inputs[0]], kNoValue};  // roi unused: no crop
      if (r.scales.empty()) {
        const Dims sizes = {r.sizes[0], blocks_of(r.sizes[1], block_), r.sizes[2], r.sizes[3],
                            block_};
        ins.push_back(kNoValue);
        ins.push_back(
            g_.add_constant(g_.value(y).name + "_sizes", Tensor::from_vector<int64_t>(sizes, {5})));
      } else {
        r.scales.push_back(1.0f);  // the lanes: an identity axis
        ins.push_back(g_.add_constant(g_.value(y).name + "_scales",
                                      Tensor::from_vector<float>(r.scales, {5})));
      }
      g_.mutable_nodes()[i].inputs = std::move(ins);
    } else if (g_.nodes()[i].op == "GroupNormalization") {
      const Node& n = g_.nodes()[i];
      Attributes attrs;
      attrs.set("channels", C);
      attrs.set("num_groups", n.attrs.get_int("num_groups"));
      attrs.set("epsilon", n.attrs.get_float("epsilon", 1e-5));
      std::vector<ValueId> ins = {blocked_of_[inputs[0]]};
      for (size_t k = 1; k < 3; ++k)
        ins.push_back(g_.add_constant(g_.value(inputs[k]).name + "_blocked",
                                      padded_bias(*constant(g_, inputs[k]), block_)));
      Node& m = g_.mutable_nodes()[i];
      retarget(m, "GroupNormBlocked", std::move(ins), std::move(attrs));
      m.domain = "pto";
    } else if (g_.nodes()[i].op == "BatchNormalization") {
      // x * s + t per channel (s = gamma / sqrt(var + eps), t = beta - mean * s) as a depthwise
      // 1x1 ConvBlocked with weights s and bias t: the blocked conv kernel, which also takes a
      // residual Add and an activation after it (MobileOne's identity-branch BatchNorm, summed
      // with the conv branches and ReLU'd, as onnxruntime's NCHWc transformer does).
      const BnAffine a = *bn_affine(g_, g_.nodes()[i]);
      std::vector<float> scale(static_cast<size_t>(C)), shift(scale.size());
      for (size_t c = 0; c < scale.size(); ++c) {
        scale[c] = static_cast<float>(a.scale[c]);
        shift[c] = static_cast<float>(a.shift[c] - a.mean[c] * a.scale[c]);
      }
      const std::string& name = g_.value(y).name;
      const ValueId w = g_.add_constant(
          name + "_bn_weights",
          blocked_conv_weights(Tensor::from_vector<float>(scale, {C, 1, 1, 1}), true, block_));
      const ValueId b = g_.add_constant(
          name + "_bn_bias", padded_bias(Tensor::from_vector<float>(shift, {C}), block_));
      Attributes attrs;
      attrs.set("group", C);
      attrs.set("kernel_shape", Dims{1, 1});
      attrs.set("channels", C);
      Node& n = g_.mutable_nodes()[i];
      retarget(n, "ConvBlocked", {blocked_of_[inputs[0]], w, b}, std::move(attrs));
      n.domain = "pto";
    } else if (g_.nodes()[i].op == "MaxPool" || g_.nodes()[i].op == "AveragePool") {
      // Pooling over H and W of [N, C/c, H, W, c]: a 3-D window with a unit last axis.
      const ValueId xb = blocked(inputs[0]);  // may add nodes: take the reference after
      Node& n = g_.mutable_nodes()[i];
      auto extend = [&](const char* name, int64_t unit, bool pads) {
        if (!n.attrs.has(name)) return;
        Dims v = n.attrs.get_ints(name);
        if (pads && v.size() == 4) v = {v[0], v[1], 0, v[2], v[3], 0};
        if (!pads && v.size() == 2) v.push_back(unit);
        n.attrs.set(name, v);
      };
      extend("kernel_shape", 1, false);
      extend("strides", 1, false);
      extend("dilations", 1, false);
      extend("pads", 0, true);
      n.inputs[0] = xb;
    } else {
      // An elementwise op's constants broadcast (scalars, values per channel); a GatherChannels
      // reads a constant as the channel planes it is, reordered like any NCHW input.
      const bool gather = g_.nodes()[i].op == "GatherChannels";
      for (ValueId& in : inputs) {
        if (in == kNoValue) continue;
        if (const Tensor* t = gather ? nullptr : constant(g_, in)) {
          if (t->numel() == C && C > 1)
            in = g_.add_constant(g_.value(in).name + "_blocked", blocked_constant(*t, C, block_));
        } else {
          in = blocked(in);
        }
      }
      g_.mutable_nodes()[i].inputs = std::move(inputs);
    }
    const ValueId yb = new_blocked_value(y);
    Node& n = g_.mutable_nodes()[i];
    if (n.op == "Concat") n.attrs.set("axis", int64_t{1});
    n.outputs[0] = yb;
    g_.value(yb).producer = static_cast<int32_t>(i);
    g_.value(y).producer = -1;
    ctx_.note("AssignLayouts/Propagate/" + n.op);
  }

  Graph& g_;
  const std::vector<int8_t>& kind_;
  const int block_;
  const PassContext& ctx_;
  std::vector<ValueId> blocked_of_;  // the blocked form of an NCHW value, kNoValue if none
  std::vector<size_t> order_;        // the new node order, as indices into g_.nodes()
};

// Which nodes run blocked (kind) and which values are blocked, in one walk in node order.
struct Choice {
  std::vector<int8_t> kind;
  std::vector<bool> blocked;
};

Choice choose(const Graph& g, int block, bool cost_rule, const std::vector<bool>& demoted,
              SpatialClasses& classes) {
  Choice c{std::vector<int8_t>(g.nodes().size(), kKeep),
           std::vector<bool>(g.values().size(), false)};
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const bool input_blocked =
        !n.inputs.empty() && n.inputs[0] != kNoValue && c.blocked[n.inputs[0]];
    if (!demoted[i] && conv_blockable(g, n, block, input_blocked, cost_rule))
      c.kind[i] = kConv;
    else if (propagates(g, n, c.blocked, block, classes))
      c.kind[i] = kPropagate;
    else
      continue;
    for (ValueId y : n.outputs) c.blocked[y] = true;
  }
  return c;
}

// Marks the convs with an NCHW input whose output reaches no blocked conv (through blocked
// readers); returns whether it marked one.
bool demote_isolated(const Graph& g, const Choice& c, std::vector<bool>& demoted) {
  std::vector<bool> feeds(g.values().size(), false);  // reaches a blocked conv's input
  for (size_t i = g.nodes().size(); i-- > 0;) {
    const Node& n = g.nodes()[i];
    if (c.kind[i] == kConv) feeds[n.inputs[0]] = true;
    if (c.kind[i] == kPropagate &&
        std::any_of(n.outputs.begin(), n.outputs.end(), [&](ValueId y) { return feeds[y]; }))
      for (ValueId in : n.inputs)
        if (in != kNoValue) feeds[in] = true;
  }
  bool any = false;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (c.kind[i] == kConv && !c.blocked[n.inputs[0]] && !feeds[n.outputs[0]]) {
      demoted[i] = true;
      any = true;
    }
  }
  return any;
}

Graph run_assign_layouts(Graph g, const PassContext& ctx) {
  return assign_layouts(std::move(g), ctx, machine_channel_block());
}

}  // namespace

int machine_channel_block() {
  const std::string& isa = device_info().isa;
  return isa == "avx512" ? 16 : (isa == "avx2" ? 8 : 0);
}

Graph assign_layouts(Graph g, const PassContext& ctx, int block, bool cost_rule) {
  if (block < 2) return g;
  Graph original = g;  // what is returned when no conv runs blocked (initializers are shared)
  keep_spatial_mean_dims(g);
  for (int n = channel_moves_as_gathers(g, block); n > 0; --n)
    ctx.note("AssignLayouts/ChannelMoveAsGather");
  std::vector<bool> demoted(g.nodes().size(), false);
  SpatialClasses classes(g);
  Choice c = choose(g, block, cost_rule, demoted, classes);
  // A conv that starts a region (NCHW input) whose blocked values reach no other blocked conv
  // pays two reorders for one conv (ResNet's stem, read by MaxPool): it stays NCHW. Demoting it
  // may end a region that fed another such conv, so repeat until nothing changes.
  while (cost_rule && demote_isolated(g, c, demoted))
    c = choose(g, block, cost_rule, demoted, classes);
  if (std::find(c.kind.begin(), c.kind.end(), kConv) == c.kind.end()) return original;
  Rewriter(g, c.kind, block, ctx).run();
  return g;
}

void register_assign_layouts(PassRegistry& r) {
  r.add({"AssignLayouts", run_assign_layouts,
         "level 3: channel-blocked (NCHWc) layout for the convolutions the CPU runs blocked and "
         "the elementwise ops and concats between them, with reorders only at the boundaries"});
}

}  // namespace pto::passes
