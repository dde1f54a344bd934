// Reference kernels of the blocked-channel layout ops (src/ir/ops/blocked_layout.cpp): the two
// reorders, ConvBlocked and GroupNormBlocked as plain loops in double (ConvBlocked's X and W
// rounded to bf16 first under precision="bf16", as Conv's). ConvBlocked reads only the
// `channels` real input lanes and writes the padded output lanes as bias + 0 (general) or 0
// (depthwise); nothing reads them. GatherChannels copies elements as bytes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "nn_kernels.h"

namespace pto::reference {
namespace {

// [N, C, H, W] -> [N, ceil(C/b), H, W, b], padded lanes 0.
Tensor blocked(const Tensor& x, int64_t b, const std::string& w) {
  if (x.rank() != 4 || b < 1)
    throw ValueError(cat(w, ": X must be [N, C, H, W] and block >= 1, got ", x.str()));
  const int64_t N = x.dim(0), C = x.dim(1), HW = x.dim(2) * x.dim(3), Cb = (C + b - 1) / b;
  const std::vector<double> v = to_doubles(x, w);
  std::vector<double> y(static_cast<size_t>(N * Cb * HW * b), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t p = 0; p < HW; ++p)
        y[static_cast<size_t>(((n * Cb + ch / b) * HW + p) * b + ch % b)] =
            v[static_cast<size_t>((n * C + ch) * HW + p)];
  return from_doubles(x.dtype(), {N, Cb, x.dim(2), x.dim(3), b}, y, w);
}

std::vector<Tensor> to_blocked(const KernelContext& c) {
  return {blocked(c.input(0), c.attrs().get_int("block"), c.where())};
}

std::vector<Tensor> from_blocked(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& x = c.input(0);
  const int64_t C = c.attrs().get_int("channels");
  if (x.rank() != 5 || C > x.dim(1) * x.dim(4) || C <= (x.dim(1) - 1) * x.dim(4))
    throw ValueError(cat(w, ": X must be [N, Cb, H, W, c] with ", C, " channels, got ", x.str()));
  const int64_t N = x.dim(0), Cb = x.dim(1), HW = x.dim(2) * x.dim(3), b = x.dim(4);
  const std::vector<double> v = to_doubles(x, w);
  std::vector<double> y(static_cast<size_t>(N * C * HW));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ch = 0; ch < C; ++ch)
      for (int64_t p = 0; p < HW; ++p)
        y[static_cast<size_t>((n * C + ch) * HW + p)] =
            v[static_cast<size_t>(((n * Cb + ch / b) * HW + p) * b + ch % b)];
  return {from_doubles(x.dtype(), {N, C, x.dim(2), x.dim(3)}, y, w)};
}

std::vector<Tensor> conv_blocked(const KernelContext& c) {
  const std::string where = c.where();
  const Tensor& W = c.input(1);
  // An NCHW X with C <= c (a first conv) is the blocked X with one block.
  const bool nchw = c.input(0).rank() == 4 && W.rank() == 6 && c.input(0).dim(1) <= W.dim(4);
  const Tensor X = nchw ? blocked(c.input(0), W.dim(4), where) : c.input(0);
  require_float(X.dtype(), where);
  const int64_t C = c.attrs().get_int("channels"), group = c.node.attr_int("group");
  const bool depthwise = W.rank() == 5;
  // Grouped (not depthwise): every group has whole blocks of input and output channels.
  const bool grouped_fits = group >= 1 && X.dim(1) % group == 0 && W.dim(0) % group == 0 &&
                            W.dim(1) * group == X.dim(1) &&
                            (group == 1 || C == X.dim(1) * X.dim(4));
  if (X.rank() != 5 || (W.rank() != 5 && W.rank() != 6) || X.dim(4) != W.dim(-1) ||
      (!depthwise && (!grouped_fits || W.dim(4) != X.dim(4))) ||
      (depthwise && (W.dim(0) != X.dim(1) || W.dim(1) != 1 || group != C)) ||
      C > X.dim(1) * X.dim(4) || C <= (X.dim(1) - 1) * X.dim(4))
    throw ValueError(cat(where, ": X ", X.str(), " and W ", W.str(), " do not fit ", C,
                         " channels in ", group, " groups"));
  const int64_t N = X.dim(0), ICb = X.dim(1), IH = X.dim(2), IW = X.dim(3), b = X.dim(4);
  const int64_t OCb = W.dim(0), KH = W.dim(2), KW = W.dim(3);
  const int64_t icb_g = depthwise ? 1 : W.dim(1), ocb_g = depthwise ? 1 : OCb / group;
  if (c.has_input(2) && c.input(2).numel() != OCb * b)
    throw ValueError(cat(where, ": B must have ", OCb * b, " elements, got ", c.input(2).str()));
  const window::Params p = window::read_params(c.attrs(), {KH, KW}, false, where);
  const window::Axis ay = window::forward_axis(p, 0, IH, where);
  const window::Axis ax = window::forward_axis(p, 1, IW, where);
  const int64_t OH = ay.out, OW = ax.out;

  // precision="bf16": X and W rounded to bf16 first, as the reference Conv does.
  const std::vector<double> x = product_operand(c, X, where), wt = product_operand(c, W, where);
  const std::vector<double> bias =
      c.has_input(2) ? to_doubles(c.input(2), where) : std::vector<double>(OCb * b, 0.0);
  std::vector<double> y(static_cast<size_t>(N * OCb * OH * OW * b), 0.0);
  auto xat = [&](int64_t n, int64_t cb, int64_t iy, int64_t ix, int64_t lane) {
    return x[static_cast<size_t>((((n * ICb + cb) * IH + iy) * IW + ix) * b + lane)];
  };
  for (int64_t n = 0; n < N; ++n)
    for (int64_t ob = 0; ob < OCb; ++ob)
      for (int64_t oy = 0; oy < OH; ++oy)
        for (int64_t ox = 0; ox < OW; ++ox)
          for (int64_t o = 0; o < b; ++o) {
            const bool real = ob * b + o < C || !depthwise;
            double acc = real ? bias[static_cast<size_t>(ob * b + o)] : 0.0;
            for (int64_t ky = 0; ky < KH && real; ++ky) {
              const int64_t iy = oy * p.strides[0] + ky * p.dilations[0] - ay.pad_begin;
              if (iy < 0 || iy >= IH) continue;
              for (int64_t kx = 0; kx < KW; ++kx) {
                const int64_t ix = ox * p.strides[1] + kx * p.dilations[1] - ax.pad_begin;
                if (ix < 0 || ix >= IW) continue;
                if (depthwise) {
                  acc += xat(n, ob, iy, ix, o) *
                         wt[static_cast<size_t>(((ob * KH + ky) * KW + kx) * b + o)];
                  continue;
                }
                // The input channels of this output block's group: ICb / group blocks.
                const int64_t ic0 = ob / ocb_g * icb_g * b;
                for (int64_t ic = 0; ic < std::min(C - ic0, icb_g * b); ++ic)
                  acc += xat(n, (ic0 + ic) / b, iy, ix, ic % b) *
                         wt[static_cast<size_t>(
                             ((((ob * icb_g + ic / b) * KH + ky) * KW + kx) * b + ic % b) * b + o)];
              }
            }
            y[static_cast<size_t>((((n * OCb + ob) * OH + oy) * OW + ox) * b + o)] = acc;
          }
  return {from_doubles(X.dtype(), {N, OCb, OH, OW, b}, y, where)};
}

// The depthwise conv, the activation and the 1x1 conv, one after the other: the definition the
// fused CPU kernel is checked against (`precision` applies to the 1x1 convs).
// `t` clamped as activation `act` ("", "Relu" or "Clip" with bounds `min` and `max`) says.
Tensor activate(const KernelContext& c, Tensor t, const std::string& act, const char* min,
                const char* max) {
  if (act.empty()) return t;
  if (act != "Relu" && act != "Clip")
    throw ValueError(cat(c.where(), ": activation must be \"\", Relu or Clip, got ", act));
  const double lo = act == "Relu" ? 0.0 : c.attrs().get_float(min, 0.0);
  const double hi =
      act == "Relu" ? std::numeric_limits<double>::infinity() : c.attrs().get_float(max, 0.0);
  std::vector<double> v = to_doubles(t, c.where());
  for (double& x : v) x = std::min(std::max(x, lo), hi);
  return from_doubles(t.dtype(), t.shape(), v, c.where());
}

std::vector<Tensor> dw_pw_conv_blocked(const KernelContext& c) {
  // A 1x1 ConvBlocked to `channels` channels.
  auto one_by_one = [&](int64_t channels) {
    Node n = c.node;
    n.op = "ConvBlocked";
    n.attrs = Attributes();
    n.attrs.set("kernel_shape", Dims{1, 1});
    n.attrs.set("channels", channels);
    n.attrs.set("group", int64_t{1});
    if (c.attrs().has("precision")) n.attrs.set("precision", c.attrs().get_string("precision"));
    return n;
  };
  Tensor x = c.input(0);
  if (c.has_input(5)) {  // the 1x1 expansion and its activation first
    const Node e = one_by_one(c.attrs().get_int("expand_channels"));
    std::vector<Tensor> ins = {x, c.input(5)};
    if (c.has_input(6)) ins.push_back(c.input(6));
    x = activate(c, conv_blocked({e, ins, 1})[0], c.attrs().get_string("expand_activation", ""),
                 "expand_min", "expand_max");
  }
  Node dw = c.node;
  dw.op = "ConvBlocked";
  dw.attrs = Attributes();
  for (const auto& [name, value] : c.attrs().all())
    if (name != "activation" && name != "min" && name != "max" && name != "precision" &&
        name.rfind("expand_", 0) != 0)
      dw.attrs.set(name, value);
  dw.attrs.set("group", c.attrs().get_int("channels"));
  Tensor mid = conv_blocked({dw, {x, c.input(1), c.input(2)}, 1})[0];
  mid = activate(c, mid, c.attrs().get_string("activation", ""), "min", "max");
  return conv_blocked(
      {one_by_one(c.attrs().get_int("channels")), {mid, c.input(3), c.input(4)}, 1});
}

// GroupNormalization of blocked X, in double: channel k is lane k % b of block k / b; each of G
// groups of C / G channels is normalized over its channels and H x W, then scaled and shifted
// per channel, then the activation. Padded lanes are written as 0.
std::vector<Tensor> group_norm_blocked(const KernelContext& c) {
  const std::string where = c.where();
  const Tensor& X = c.input(0);
  require_float(X.dtype(), where);
  const int64_t C = c.attrs().get_int("channels"), G = c.attrs().get_int("num_groups");
  if (X.rank() != 5 || C > X.dim(1) * X.dim(4) || C <= (X.dim(1) - 1) * X.dim(4) || G < 1 ||
      C % G != 0)
    throw ValueError(cat(where, ": X must be [N, Cb, H, W, c] with ", C, " channels in ", G,
                         " groups, got ", X.str()));
  const int64_t N = X.dim(0), Cb = X.dim(1), HW = X.dim(2) * X.dim(3), b = X.dim(4);
  const std::vector<double> x = to_doubles(X, where), scale = to_doubles(c.input(1), where),
                            bias = to_doubles(c.input(2), where);
  if (static_cast<int64_t>(scale.size()) < C || static_cast<int64_t>(bias.size()) < C)
    throw ValueError(cat(where, ": scale and bias need ", C, " values"));
  const double eps = c.attrs().get_float("epsilon", 1e-5);
  const std::string act = c.attrs().get_string("activation", "");
  auto at = [&](int64_t n, int64_t ch, int64_t p) {
    return static_cast<size_t>(((n * Cb + ch / b) * HW + p) * b + ch % b);
  };
  std::vector<double> y(x.size(), 0.0);
  const int64_t per = C / G;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t grp = 0; grp < G; ++grp) {
      double sum = 0, sq = 0;
      for (int64_t ch = grp * per; ch < (grp + 1) * per; ++ch)
        for (int64_t p = 0; p < HW; ++p) sum += x[at(n, ch, p)];
      const double mean = sum / static_cast<double>(per * HW);
      for (int64_t ch = grp * per; ch < (grp + 1) * per; ++ch)
        for (int64_t p = 0; p < HW; ++p) sq += (x[at(n, ch, p)] - mean) * (x[at(n, ch, p)] - mean);
      const double inv = 1 / std::sqrt(sq / static_cast<double>(per * HW) + eps);
      for (int64_t ch = grp * per; ch < (grp + 1) * per; ++ch)
        for (int64_t p = 0; p < HW; ++p) {
          const double v = (x[at(n, ch, p)] - mean) * inv * scale[ch] + bias[ch];
          y[at(n, ch, p)] = act == "Relu"   ? std::max(v, 0.0)
                            : act == "Silu" ? v / (1 + std::exp(-v))
                                            : v;
        }
    }
  return {from_doubles(X.dtype(), X.shape(), y, where)};
}

// Y[n, j, h, w] = X{index[j]}[n, channel[j], h, w], NCHW or blocked (padded output lanes 0),
// element by element as bytes: every dtype, NaN payloads untouched.
std::vector<Tensor> gather_channels(const KernelContext& c) {
  const std::string where = c.where();
  const Dims index = c.attrs().get_ints("input_index"),
             channel = c.attrs().get_ints("input_channel");
  const Tensor& x0 = c.input(0);
  const bool blocked = x0.rank() == 5;
  if ((x0.rank() != 4 && !blocked) || index.empty() || index.size() != channel.size())
    throw ValueError(cat(where,
                         ": inputs must be [N, C, H, W] or [N, Cb, H, W, c] and the index "
                         "lists of one non-zero length, got ",
                         x0.str()));
  const int64_t N = x0.dim(0), HW = x0.dim(2) * x0.dim(3), b = blocked ? x0.dim(4) : 1;
  std::vector<Tensor> xs;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& x = c.input(i);
    if (x.rank() != x0.rank() || x.dtype() != x0.dtype() || x.dim(0) != N ||
        x.dim(2) != x0.dim(2) || x.dim(3) != x0.dim(3) || (blocked && x.dim(4) != b))
      throw ValueError(
          cat(where, ": input ", i, " ", x.str(), " does not match input 0 ", x0.str()));
    xs.push_back(x.contiguous());
  }
  const auto J = static_cast<int64_t>(index.size());
  const int64_t Jb = (J + b - 1) / b;
  Tensor y = blocked ? Tensor::zeros(x0.dtype(), {N, Jb, x0.dim(2), x0.dim(3), b})
                     : Tensor::empty(x0.dtype(), {N, J, x0.dim(2), x0.dim(3)});
  const size_t item = x0.itemsize();
  auto* out = static_cast<std::byte*>(y.raw_data());
  for (int64_t j = 0; j < J; ++j) {
    const auto k = static_cast<size_t>(j);
    if (index[k] < 0 || index[k] >= static_cast<int64_t>(xs.size()))
      throw ValueError(cat(where, ": output channel ", j, " reads input ", index[k]));
    const Tensor& x = xs[static_cast<size_t>(index[k])];
    const int64_t C = x.dim(1) * b, ch = channel[k];
    if (ch < 0 || ch >= C)
      throw ValueError(cat(where, ": output channel ", j, " reads channel ", ch, " of ", x.str()));
    const auto* in = static_cast<const std::byte*>(x.raw_data());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t p = 0; p < HW; ++p) {
        const int64_t from = ((n * x.dim(1) + ch / b) * HW + p) * b + ch % b;
        const int64_t to = ((n * (blocked ? Jb : J) + j / b) * HW + p) * b + j % b;
        std::memcpy(out + static_cast<size_t>(to) * item, in + static_cast<size_t>(from) * item,
                    item);
      }
  }
  return {y};
}

}  // namespace

void register_blocked_layout_kernels(KernelRegistry& r) {
  r.add("ReorderToBlocked", to_blocked);
  r.add("ReorderFromBlocked", from_blocked);
  r.add("ConvBlocked", conv_blocked);
  r.add("DwPwConvBlocked", dw_pw_conv_blocked);
  r.add("GroupNormBlocked", group_norm_blocked);
  r.add("GatherChannels", gather_channels);
}

}  // namespace pto::reference
