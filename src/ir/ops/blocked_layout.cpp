// The blocked-channel layout (NCHWc) as ops of the "pto" domain, made by the AssignLayouts pass
// (src/passes/assign_layouts.cpp, docs/passes.md). A blocked tensor is an ordinary 5-D value
// [N, ceil(C/c), H, W, c]: channel k of the NCHW tensor is lane k % c of channel block k / c.
// The lanes past C in the last block ("padded lanes") hold unspecified values; every op on
// blocked tensors ignores them, so no op has to keep them zero.
//
//   ReorderToBlocked(X) {block=c}          [N, C, H, W] -> [N, ceil(C/c), H, W, c] (padded lanes 0)
//   ReorderFromBlocked(X) {channels=C}     [N, Cb, H, W, c] -> [N, C, H, W]
//   ConvBlocked(X, W[, B]) {Conv's attrs, kernel_shape required, channels=C}
//       2-D convolution on blocked X [N, ICb, H, W, c] -> [N, OCb, OH, OW, c], with
//       W [OCb, ICb / group, KH, KW, c(in), c(out)] (group 1, or groups of whole blocks: C and
//       OC multiples of group * c) or [Cb, 1, KH, KW, c] (depthwise: group == C, one output
//       channel per input channel) and B [OCb * c]; `channels` is the real input channel count C
//       (the lanes it reads). A group-1 conv whose C fits one block may read X as it is,
//       [N, C, H, W] (a network's first conv: no reorder of the input), W [OCb, 1, KH, KW, c, c].
//   DwPwConvBlocked(X, Wdw, Bdw, Wpw, Bpw) {window attrs of the depthwise conv, kernel_shape
//       required, channels=C, activation="" | "Relu" | "Clip" with min and max}
//       A depthwise ConvBlocked (Wdw [Cb, 1, KH, KW, c], Bdw [Cb * c]), the activation, and a
//       1x1, stride-1 ConvBlocked (Wpw [OCb, Cb, 1, 1, c, c], Bpw [OCb * c]) as one node: the
//       FuseBlockedConvs pass makes it so that the depthwise output, a row at a time, never
//       leaves the cache. X [N, Cb, H, W, c] -> [N, OCb, OH, OW, c].
//   DwPwConvBlocked(X, Wdw, Bdw, Wpw, Bpw, We, Be) {the above, expand_channels=IC,
//       expand_activation="" | "Relu" | "Clip" with expand_min and expand_max}
//       The same after a 1x1, stride-1 ConvBlocked expansion (We [Cb, ICb, 1, 1, c, c], Be
//       [Cb * c]) and its activation on X [N, ICb, H, W, c] (IC real channels): a MobileNetV2
//       inverted residual block, whose expanded tensor is computed a few rows at a time.
//   GroupNormBlocked(X, scale, bias) {channels=C, num_groups=G, epsilon,
//                                     activation="" | "Relu" | "Silu"}
//       GroupNormalization (opset 21: scale and bias per channel, here [Cb * c], padded) of
//       blocked X [N, Cb, H, W, c] with C real channels in G groups of C / G, then the
//       activation: the same shape. AssignLayouts makes it of a GroupNormalization whose input is
//       blocked, FuseBlockedConvs gives it the Relu or SiLU (x * Sigmoid(x)) that reads it.
//   GatherChannels(X0, X1, ...) {input_index=[i...], input_channel=[k...]}
//       Y[n, j, h, w] = X{input_index[j]}[n, input_channel[j], h, w]: whole channel planes picked
//       from inputs of one N, H and W, in any order. The FuseChannelMoves pass makes it of a chain
//       of Concat, Slice, Split, Reshape and Transpose nodes that only moves channels (ShuffleNet's
//       channel shuffle and the chunk after it), AssignLayouts of a Concat, Split or Slice whose
//       channel parts are not whole blocks. On NCHW inputs [N, C_i, H, W] Y is
//       [N, J, H, W] (J = len(input_index)); on blocked inputs [N, Cb_i, H, W, c] (AssignLayouts)
//       Y is blocked, [N, ceil(J/c), H, W, c], with the padded lanes 0.
#include "ir/ops/blocked_layout.h"

#include "infer_util.h"
#include "op_params.h"
#include "window.h"

namespace pto {
namespace {

void infer_to_blocked(InferContext& c) {
  if (!c.has_input(0)) return;
  const int64_t block = c.attrs().get_int("block");
  if (block < 1) throw ValueError(cat(c.where(), ": block must be >= 1, got ", block));
  const std::optional<Shape>& x = c.inputs[0].shape;
  std::optional<Shape> y;
  if (x) {
    if (x->size() != 4)
      throw ValueError(cat(c.where(), ": X must be [N, C, H, W], got ", shape_str(*x)));
    const Dim& ch = (*x)[1];
    y = Shape{(*x)[0], ch.is_known() ? Dim((ch.value + block - 1) / block) : Dim::unknown(),
              (*x)[2], (*x)[3], block};
  }
  infer::set(c, 0, c.inputs[0].dtype, y);
}

void infer_from_blocked(InferContext& c) {
  if (!c.has_input(0)) return;
  const int64_t channels = c.attrs().get_int("channels");
  const std::optional<Shape>& x = c.inputs[0].shape;
  std::optional<Shape> y;
  if (x) {
    if (x->size() != 5)
      throw ValueError(cat(c.where(), ": X must be [N, Cb, H, W, c], got ", shape_str(*x)));
    const Dim &cb = (*x)[1], &block = (*x)[4];
    if (cb.is_known() && block.is_known() &&
        (channels > cb.value * block.value || channels <= (cb.value - 1) * block.value))
      throw ValueError(cat(c.where(), ": ", channels, " channels do not fill ", shape_str(*x)));
    y = Shape{(*x)[0], channels, (*x)[2], (*x)[3]};
  }
  infer::set(c, 0, c.inputs[0].dtype, y);
}

// [N, w[0], OH, OW, c] of a 2-D window of `kernel_shape` over the H and W of X (dims 2 and 3).
Shape blocked_conv_output(const InferContext& c, const Shape& x, const Shape& w, const Dim& c_out) {
  const window::Params p =
      window::read_params(c.attrs(), c.attrs().get_ints("kernel_shape"), false, c.where());
  if (p.rank() != 2)
    throw ValueError(cat(c.where(), ": kernel_shape must have 2 values (a 2-D convolution)"));
  Shape y{x[0], w[0]};
  for (size_t i = 0; i < 2; ++i) {
    const Dim& d = x[i + 2];
    y.push_back(d.is_known() ? Dim(window::forward_axis(p, i, d.value, c.where()).out)
                             : Dim::unknown());
  }
  y.push_back(c_out);
  return y;
}

void infer_conv_blocked(InferContext& c) {
  if (!c.has_input(0)) return;
  const std::optional<Shape>& x = c.inputs[0].shape;
  std::optional<Shape> y;
  if (x && c.has_input(1) && c.inputs[1].shape) {
    const Shape& w = *c.inputs[1].shape;
    const bool nchw = x->size() == 4 && w.size() == 6;  // a first conv on NCHW X (C <= c)
    if (!(nchw || (x->size() == 5 && (w.size() == 5 || w.size() == 6))))
      throw ValueError(cat(c.where(),
                           ": X must be [N, Cb, H, W, c] (or [N, C, H, W] with 6-D W) and W 5-D "
                           "or 6-D, got ",
                           shape_str(*x), " and ", shape_str(w)));
    y = blocked_conv_output(c, *x, w, nchw ? w[5] : (*x)[4]);
  }
  infer::set(c, 0, c.inputs[0].dtype, y);
}

void infer_dw_pw_conv_blocked(InferContext& c) {
  if (!c.has_input(0)) return;
  const std::optional<Shape>& x = c.inputs[0].shape;
  std::optional<Shape> y;
  if (x && c.has_input(3) && c.inputs[3].shape) {
    const Shape& w = *c.inputs[3].shape;
    if (x->size() != 5 || w.size() != 6)
      throw ValueError(cat(c.where(), ": X must be [N, Cb, H, W, c] and Wpw 6-D, got ",
                           shape_str(*x), " and ", shape_str(w)));
    y = blocked_conv_output(c, *x, w, (*x)[4]);
  }
  infer::set(c, 0, c.inputs[0].dtype, y);
}

void infer_group_norm_blocked(InferContext& c) {
  if (!c.has_input(0)) return;
  const std::optional<Shape>& x = c.inputs[0].shape;
  if (x && x->size() != 5)
    throw ValueError(cat(c.where(), ": X must be [N, Cb, H, W, c], got ", shape_str(*x)));
  const int64_t channels = c.attrs().get_int("channels"), groups = c.attrs().get_int("num_groups");
  if (groups < 1 || channels < 1 || channels % groups != 0)
    throw ValueError(
        cat(c.where(), ": ", channels, " channels do not split into ", groups, " groups"));
  const std::string act = c.attrs().get_string("activation", "");
  if (!act.empty() && act != "Relu" && act != "Silu")
    throw ValueError(
        cat(c.where(), ": activation must be \"\", \"Relu\" or \"Silu\", got \"", act, "\""));
  infer::set(c, 0, c.inputs[0].dtype, x);
}

void infer_gather_channels(InferContext& c) {
  const Dims index = c.attrs().get_ints("input_index");
  const Dims channel = c.attrs().get_ints("input_channel");
  if (index.empty() || index.size() != channel.size())
    throw ValueError(cat(c.where(),
                         ": input_index and input_channel must have the same, non-zero "
                         "length, got ",
                         index.size(), " and ", channel.size()));
  const auto inputs = static_cast<int64_t>(c.inputs.size());
  std::optional<Shape> first;
  for (int64_t i = 0; i < inputs; ++i) {
    if (!c.has_input(static_cast<size_t>(i))) return;
    const std::optional<Shape>& s = c.inputs[static_cast<size_t>(i)].shape;
    if (!s) continue;
    if (s->size() != 4 && s->size() != 5)
      throw ValueError(cat(c.where(),
                           ": inputs must be [N, C, H, W] or blocked [N, Cb, H, W, c], "
                           "got ",
                           shape_str(*s)));
    if (!first) first = s;
    if (s->size() != first->size())
      throw ValueError(cat(c.where(), ": inputs of ranks ", first->size(), " and ", s->size()));
    for (size_t d : {size_t{0}, size_t{2}, size_t{3}, size_t{4}}) {
      if (d >= s->size()) continue;
      const Dim &a = (*first)[d], &b = (*s)[d];
      if (a.is_known() && b.is_known() && a.value != b.value)
        throw ValueError(cat(c.where(), ": inputs ", shape_str(*first), " and ", shape_str(*s),
                             " differ in more than their channels"));
    }
  }
  for (size_t j = 0; j < index.size(); ++j) {
    if (index[j] < 0 || index[j] >= inputs || channel[j] < 0)
      throw ValueError(cat(c.where(), ": output channel ", j, " reads channel ", channel[j],
                           " of input ", index[j], " (", inputs, " inputs)"));
    const std::optional<Shape>& s = c.inputs[static_cast<size_t>(index[j])].shape;
    if (!s) continue;
    const bool blocked = s->size() == 5;
    const Dim& cb = (*s)[1];
    const int64_t lanes = blocked && (*s)[4].is_known() ? (*s)[4].value : 1;
    if (cb.is_known() && (!blocked || (*s)[4].is_known()) && channel[j] >= cb.value * lanes)
      throw ValueError(cat(c.where(), ": output channel ", j, " reads channel ", channel[j],
                           " of input ", index[j], ", which is ", shape_str(*s)));
  }
  std::optional<Shape> y;
  if (first) {
    const auto J = static_cast<int64_t>(index.size());
    if (first->size() == 4) {
      y = Shape{(*first)[0], J, (*first)[2], (*first)[3]};
    } else {
      const Dim& b = (*first)[4];
      y = Shape{(*first)[0], b.is_known() ? Dim((J + b.value - 1) / b.value) : Dim::unknown(),
                (*first)[2], (*first)[3], b};
    }
  }
  infer::set(c, 0, c.inputs[0].dtype, y);
}

}  // namespace

void register_blocked_layout_ops(OpRegistry& r) {
  r.add({.name = "ReorderToBlocked",
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kInjective,
         .attrs = {required_attr("block", AttrKind::kInt, "channels per block")},
         .infer = infer_to_blocked,
         .doc = "[N, C, H, W] -> channel-blocked [N, ceil(C/block), H, W, block], padded lanes 0"});
  r.add({.name = "ReorderFromBlocked",
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kInjective,
         .attrs = {required_attr("channels", AttrKind::kInt, "the NCHW channel count")},
         .infer = infer_from_blocked,
         .doc = "channel-blocked [N, Cb, H, W, c] -> [N, channels, H, W]"});
  r.add({.name = "ConvBlocked",
         .min_inputs = 2,
         .max_inputs = 3,
         .properties = kOpaque,
         .attrs = window::window_attrs().with(
             {{"group", int64_t{1}},
              required_attr("channels", AttrKind::kInt, "the real input channel count"),
              params::precision_attr()}),
         .infer = infer_conv_blocked,
         .doc =
             "2-D Conv (group 1, groups of whole blocks, or depthwise) on channel-blocked tensors "
             "and weights"});
  r.add({.name = "DwPwConvBlocked",
         .min_inputs = 5,
         .max_inputs = 7,
         .properties = kOpaque,
         .attrs = window::window_attrs().with(
             {required_attr("channels", AttrKind::kInt, "the real channel count"),
              {"activation", "", "between the two convs: \"\", \"Relu\" or \"Clip\""},
              {"min", 0.0, "Clip's lower bound"},
              {"max", 0.0, "Clip's upper bound"},
              {"expand_channels", int64_t{0}, "with We: X's real channel count"},
              {"expand_activation", "", "after the expansion: \"\", \"Relu\" or \"Clip\""},
              {"expand_min", 0.0, "the expansion's Clip lower bound"},
              {"expand_max", 0.0, "the expansion's Clip upper bound"},
              params::precision_attr()}),
         .infer = infer_dw_pw_conv_blocked,
         .doc = "[1x1 ConvBlocked expansion and activation,] depthwise ConvBlocked, an "
                "activation and a 1x1 ConvBlocked as one node"});
  r.add({.name = "GroupNormBlocked",
         .min_inputs = 3,
         .max_inputs = 3,
         .properties = kOpaque,
         .attrs = {required_attr("channels", AttrKind::kInt, "the real channel count"),
                   required_attr("num_groups", AttrKind::kInt, "groups of channels / num_groups"),
                   {"epsilon", 1e-5, "added to the variance"},
                   {"activation", "", "after the norm: \"\", \"Relu\" or \"Silu\" (x sigmoid(x))"}},
         .infer = infer_group_norm_blocked,
         .doc = "GroupNormalization (per-channel scale and bias) of a channel-blocked tensor, then "
                "an optional Relu or SiLU"});
  r.add(
      {.name = "GatherChannels",
       .min_inputs = 1,
       .max_inputs = -1,
       .properties = kInjective,
       .attrs = {required_attr("input_index", AttrKind::kInts, "the input of each output channel"),
                 required_attr("input_channel", AttrKind::kInts,
                               "the channel of that input each output channel is")},
       .infer = infer_gather_channels,
       .doc = "whole channel planes of inputs of one N, H and W, in any order (NCHW, or "
              "channel-blocked in and out)"});
}

Tensor blocked_conv_weights(const Tensor& w, bool depthwise, int block) {
  const Tensor src = w.contiguous();
  const float* s = src.data<float>();
  const int64_t M = w.dim(0), C = w.dim(1), K = w.dim(2) * w.dim(3), b = block;
  const int64_t ocb = (M + block - 1) / block;
  if (depthwise) {
    Tensor t = Tensor::zeros(DType::kF32, {ocb, 1, w.dim(2), w.dim(3), b});
    float* d = t.data<float>();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) d[((m / b) * K + k) * b + m % b] = s[m * K + k];
    return t;
  }
  const int64_t icb = (C + block - 1) / block;
  Tensor t = Tensor::zeros(DType::kF32, {ocb, icb, w.dim(2), w.dim(3), b, b});
  float* d = t.data<float>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t k = 0; k < K; ++k)
        d[((((m / b) * icb + c / b) * K + k) * b + c % b) * b + m % b] = s[(m * C + c) * K + k];
  return t;
}

}  // namespace pto
