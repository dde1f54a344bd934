// Reference Conv and ConvTranspose: direct loops over 1-3 spatial axes in double precision (Conv's
// X and W rounded to bf16 first under precision="bf16", see AutoMixedPrecision; split into bf16
// heads and tails under "bf16x3", see ConvPrecision). The
// loop order keeps the innermost loop a contiguous row of the output (Conv) or input
// (ConvTranspose), so ResNet-sized models run in seconds.
#include "ir/ops/op_params.h"
#include "nn_kernels.h"

namespace pto::reference {
namespace {

struct ConvShapes {
  int64_t N, C, M, group;
  Dims in_spatial;
  Dims kernel;
};

// Checks X, W and B for Conv (W is [M, C/group, k...]) or ConvTranspose (W is [C, M/group, k...]).
ConvShapes check_conv_inputs(const KernelContext& c, bool transpose) {
  const std::string w = c.where();
  const Tensor &X = c.input(0), &W = c.input(1);
  require_float(X.dtype(), w);
  if (W.dtype() != X.dtype() || (c.has_input(2) && c.input(2).dtype() != X.dtype()))
    throw TypeError(cat(w, ": X, W and B must share a dtype, got ", X.str(), ", ", W.str(),
                        c.has_input(2) ? ", " + c.input(2).str() : ""));
  if (X.rank() < 3) throw ValueError(cat(w, ": X must be [N, C, spatial...], got ", X.str()));
  if (X.rank() > 5)
    throw UnsupportedError(cat(w, ": more than 3 spatial axes are not supported, got ", X.str()));
  if (W.rank() != X.rank())
    throw ValueError(cat(w, ": W ", W.str(), " must have the rank of X ", X.str()));
  ConvShapes s;
  s.N = X.dim(0);
  s.C = X.dim(1);
  s.group = c.node.attr_int("group");
  if (s.group < 1 || s.group > std::max<int64_t>(s.C, 1) || s.C % s.group != 0)
    throw ValueError(
        cat(w, ": group ", s.group, " must be >= 1 and divide the ", s.C, " input channels"));
  if (transpose) {
    if (W.dim(0) != s.C)
      throw ValueError(cat(w, ": W ", W.str(), " must have ", s.C, " input channels (dim 0)"));
    s.M = W.dim(1) * s.group;
  } else {
    s.M = W.dim(0);
    if (W.dim(1) * s.group != s.C || s.M % s.group != 0)
      throw ValueError(cat(w, ": W ", W.str(), " does not match ", s.C, " input channels in ",
                           s.group, " groups"));
  }
  s.in_spatial.assign(X.shape().begin() + 2, X.shape().end());
  s.kernel.assign(W.shape().begin() + 2, W.shape().end());
  if (c.attrs().has("kernel_shape") && c.attrs().get_ints("kernel_shape") != s.kernel)
    throw ValueError(cat(w, ": kernel_shape ", dims_str(c.attrs().get_ints("kernel_shape")),
                         " does not match W ", W.str()));
  if (c.has_input(2) && (c.input(2).rank() != 1 || c.input(2).dim(0) != s.M))
    throw ValueError(cat(w, ": B must be 1-D with ", s.M, " elements, got ", c.input(2).str()));
  return s;
}

Dims output_shape(const ConvShapes& s, const Geom3& g) {
  Dims y = {s.N, s.M};
  for (size_t i = 0; i < s.in_spatial.size(); ++i) y.push_back(g.out[3 - s.in_spatial.size() + i]);
  return y;
}

std::vector<Tensor> conv(const KernelContext& c) {
  const std::string w = c.where();
  const ConvShapes s = check_conv_inputs(c, false);
  const window::Params p = window::read_params(c.attrs(), s.kernel, false, w);
  std::vector<window::Axis> axes;
  for (size_t i = 0; i < p.rank(); ++i)
    axes.push_back(window::forward_axis(p, i, s.in_spatial[i], w));
  const Geom3 g = lift(p, axes, s.in_spatial);
  const Dims yshape = output_shape(s, g);
  if (checked_numel(yshape, w.c_str()) == 0) return {Tensor::empty(c.input(0).dtype(), yshape)};

  const std::vector<double> x = product_operand(c, c.input(0), w),
                            wt = product_operand(c, c.input(1), w);
  std::vector<double> bias = c.has_input(2) ? to_doubles(c.input(2), w) : std::vector<double>();
  const int64_t Cg = s.C / s.group, Mg = s.M / s.group;
  const int64_t in_size = c.input(0).numel() ? g.in_size() : 0;
  const int64_t out_size = g.out_size(), k_size = g.k_size();
  auto convolve = [&](const std::vector<double>& xs, const std::vector<double>& ws) {
    std::vector<double> y(static_cast<size_t>(s.N * s.M * out_size));
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t m = 0; m < s.M; ++m) {
        double* acc = y.data() + (n * s.M + m) * out_size;
        const int64_t grp = m / Mg;
        for (int64_t ic = 0; ic < Cg; ++ic) {
          const double* xp = xs.data() + (n * s.C + grp * Cg + ic) * in_size;
          const double* wp = ws.data() + (m * Cg + ic) * k_size;
          for (int64_t k0 = 0; k0 < g.k[0]; ++k0) {
            const int64_t off0 = k0 * g.d[0] - g.pb[0];
            const Range r0 = valid_range(g.out[0], g.in[0], g.s[0], off0);
            for (int64_t k1 = 0; k1 < g.k[1]; ++k1) {
              const int64_t off1 = k1 * g.d[1] - g.pb[1];
              const Range r1 = valid_range(g.out[1], g.in[1], g.s[1], off1);
              for (int64_t k2 = 0; k2 < g.k[2]; ++k2) {
                const int64_t off2 = k2 * g.d[2] - g.pb[2];
                const Range r2 = valid_range(g.out[2], g.in[2], g.s[2], off2);
                const double wv = wp[(k0 * g.k[1] + k1) * g.k[2] + k2];
                for (int64_t o0 = r0.lo; o0 < r0.hi; ++o0) {
                  const int64_t i0 = o0 * g.s[0] + off0;
                  for (int64_t o1 = r1.lo; o1 < r1.hi; ++o1) {
                    const int64_t i1 = o1 * g.s[1] + off1;
                    const int64_t xbase = (i0 * g.in[1] + i1) * g.in[2] + off2;
                    double* arow = acc + (o0 * g.out[1] + o1) * g.out[2];
                    const int64_t st = g.s[2];
                    for (int64_t o2 = r2.lo; o2 < r2.hi; ++o2) arow[o2] += wv * xp[xbase + o2 * st];
                  }
                }
              }
            }
          }
        }
      }
    return y;
  };
  // bf16x3: the three products of the split X and W, the bias added once.
  std::vector<double> y =
      params::split_bf16_products(c.node) ? split_products(x, wt, convolve) : convolve(x, wt);
  if (!bias.empty())
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t m = 0; m < s.M; ++m)
        for (int64_t i = 0; i < out_size; ++i) y[(n * s.M + m) * out_size + i] += bias[m];
  return {from_doubles(c.input(0).dtype(), yshape, y, w)};
}

std::vector<Tensor> conv_transpose(const KernelContext& c) {
  const std::string w = c.where();
  const ConvTransposePlan plan = conv_transpose_plan(c);
  const Geom3& g = plan.g;
  const Dims& yshape = plan.y_shape;
  if (checked_numel(yshape, w.c_str()) == 0) return {Tensor::empty(c.input(0).dtype(), yshape)};

  const std::vector<double> x = to_doubles(c.input(0), w), wt = to_doubles(c.input(1), w);
  std::vector<double> bias = c.has_input(2) ? to_doubles(c.input(2), w) : std::vector<double>();
  const int64_t Cg = plan.c / plan.group, Mg = plan.m / plan.group;
  const int64_t in_size = c.input(0).numel() ? g.in_size() : 0;
  const int64_t out_size = g.out_size(), k_size = g.k_size();
  std::vector<double> y(static_cast<size_t>(plan.n * plan.m * out_size));
  // Scatter: input position i feeds output position i * stride + k * dilation - pad_begin.
  for (int64_t n = 0; n < plan.n; ++n)
    for (int64_t ch = 0; ch < plan.c; ++ch) {
      const int64_t grp = ch / Cg;
      const double* xp = x.data() + (n * plan.c + ch) * in_size;
      for (int64_t mg = 0; mg < Mg; ++mg) {
        const int64_t m = grp * Mg + mg;
        double* acc = y.data() + (n * plan.m + m) * out_size;
        const double* wp = wt.data() + (ch * Mg + mg) * k_size;
        for (int64_t k0 = 0; k0 < g.k[0]; ++k0) {
          const int64_t off0 = k0 * g.d[0] - g.pb[0];
          const Range r0 = valid_range(g.in[0], g.out[0], g.s[0], off0);
          for (int64_t k1 = 0; k1 < g.k[1]; ++k1) {
            const int64_t off1 = k1 * g.d[1] - g.pb[1];
            const Range r1 = valid_range(g.in[1], g.out[1], g.s[1], off1);
            for (int64_t k2 = 0; k2 < g.k[2]; ++k2) {
              const int64_t off2 = k2 * g.d[2] - g.pb[2];
              const Range r2 = valid_range(g.in[2], g.out[2], g.s[2], off2);
              const double wv = wp[(k0 * g.k[1] + k1) * g.k[2] + k2];
              for (int64_t i0 = r0.lo; i0 < r0.hi; ++i0) {
                const int64_t o0 = i0 * g.s[0] + off0;
                for (int64_t i1 = r1.lo; i1 < r1.hi; ++i1) {
                  const int64_t o1 = i1 * g.s[1] + off1;
                  const double* xrow = xp + (i0 * g.in[1] + i1) * g.in[2];
                  const int64_t abase = (o0 * g.out[1] + o1) * g.out[2] + off2;
                  const int64_t st = g.s[2];
                  for (int64_t i2 = r2.lo; i2 < r2.hi; ++i2) acc[abase + i2 * st] += wv * xrow[i2];
                }
              }
            }
          }
        }
      }
    }
  if (!bias.empty())
    for (int64_t n = 0; n < plan.n; ++n)
      for (int64_t m = 0; m < plan.m; ++m)
        for (int64_t i = 0; i < out_size; ++i) y[(n * plan.m + m) * out_size + i] += bias[m];
  return {from_doubles(c.input(0).dtype(), yshape, y, w)};
}

// DeformConv in double precision, one output element at a time (deform_conv_plan).
std::vector<Tensor> deform_conv(const KernelContext& c) {
  const std::string w = c.where();
  const DeformConvPlan p = deform_conv_plan(c);
  const std::vector<double> x = to_doubles(c.input(0), w), wt = to_doubles(c.input(1), w),
                            off = to_doubles(c.input(2), w);
  const std::vector<double> bias = p.bias ? to_doubles(c.input(3), w) : std::vector<double>{};
  const std::vector<double> mask = p.mask ? to_doubles(c.input(4), w) : std::vector<double>{};
  const int64_t cg = p.c / p.group, mg = p.m / p.group, taps = p.kh * p.kw, plane = p.oh * p.ow;
  const int64_t c_per_og = p.c / p.offset_group;
  std::vector<double> y(static_cast<size_t>(p.n * p.m * plane));
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t m = 0; m < p.m; ++m)
      for (int64_t i = 0; i < p.oh; ++i)
        for (int64_t j = 0; j < p.ow; ++j) {
          double acc = p.bias ? bias[m] : 0.0;
          const int64_t g = m / mg;
          for (int64_t ci = 0; ci < cg; ++ci) {
            const int64_t ch = g * cg + ci, og = ch / c_per_og;
            const double* xp = &x[(n * p.c + ch) * p.h * p.w];
            for (int64_t ky = 0; ky < p.kh; ++ky)
              for (int64_t kx = 0; kx < p.kw; ++kx) {
                const int64_t t = og * taps + ky * p.kw + kx, pix = i * p.ow + j;
                const double dy = off[((n * p.offset_group * taps * 2) + 2 * t) * plane + pix];
                const double dx = off[((n * p.offset_group * taps * 2) + 2 * t + 1) * plane + pix];
                const double yy = static_cast<double>(i * p.stride_h - p.pad_top + ky * p.dil_h);
                const double xx = static_cast<double>(j * p.stride_w - p.pad_left + kx * p.dil_w);
                double v = bilinear_zero_outside(xp, p.h, p.w, yy + dy, xx + dx);
                if (p.mask) v *= mask[(n * p.offset_group * taps + t) * plane + pix];
                acc += v * wt[((m * cg + ci) * p.kh + ky) * p.kw + kx];
              }
          }
          y[((n * p.m + m) * p.oh + i) * p.ow + j] = acc;
        }
  return {from_doubles(c.input(0).dtype(), {p.n, p.m, p.oh, p.ow}, y, w)};
}

}  // namespace

DeformConvPlan deform_conv_plan(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor &X = c.input(0), &W = c.input(1), &off = c.input(2);
  if (X.rank() != 4)
    throw UnsupportedError(
        cat(w, ": DeformConv on ", X.rank() - 2, "-D data is not supported (2-D images only)"));
  DeformConvPlan p;
  p.n = X.dim(0), p.c = X.dim(1), p.h = X.dim(2), p.w = X.dim(3);
  const auto& a = c.attrs();
  p.group = a.get_int("group", 1), p.offset_group = a.get_int("offset_group", 1);
  if (W.rank() != 4 || p.group < 1 || p.offset_group < 1 || p.c % p.group != 0 ||
      W.dim(1) * p.group != p.c || W.dim(0) % p.group != 0 || p.c % p.offset_group != 0)
    throw ValueError(cat(w, ": X ", X.str(), " and W ", W.str(), " do not fit group ", p.group,
                         " and offset_group ", p.offset_group));
  p.m = W.dim(0);
  const Dims kernel = a.get_ints("kernel_shape", {W.dim(2), W.dim(3)});
  if (kernel != Dims{W.dim(2), W.dim(3)})
    throw ValueError(cat(w, ": kernel_shape ", dims_str(kernel), " differs from W's ", W.str()));
  p.kh = kernel[0], p.kw = kernel[1];
  const Dims strides = a.get_ints("strides", {1, 1}), dil = a.get_ints("dilations", {1, 1});
  const Dims pads = a.get_ints("pads", {0, 0, 0, 0});
  if (strides.size() != 2 || dil.size() != 2 || pads.size() != 4 || strides[0] < 1 ||
      strides[1] < 1 || dil[0] < 1 || dil[1] < 1 ||
      std::any_of(pads.begin(), pads.end(), [](int64_t v) { return v < 0; }))
    throw ValueError(cat(w, ": strides ", dims_str(strides), ", dilations ", dims_str(dil),
                         " and pads ", dims_str(pads), " must be positive (pads >= 0), per axis"));
  p.stride_h = strides[0], p.stride_w = strides[1], p.dil_h = dil[0], p.dil_w = dil[1];
  p.pad_top = pads[0], p.pad_left = pads[1];
  p.oh = (p.h + pads[0] + pads[2] - (p.kh - 1) * p.dil_h - 1) / p.stride_h + 1;
  p.ow = (p.w + pads[1] + pads[3] - (p.kw - 1) * p.dil_w - 1) / p.stride_w + 1;
  const Dims want_off = {p.n, p.offset_group * p.kh * p.kw * 2, p.oh, p.ow};
  if (p.oh < 1 || p.ow < 1 || off.shape() != want_off)
    throw ValueError(cat(w, ": offset ", off.str(), " must be ", dims_str(want_off)));
  p.bias = c.has_input(3);
  if (p.bias && c.input(3).shape() != Dims{p.m})
    throw ValueError(cat(w, ": B ", c.input(3).str(), " must be [", p.m, "]"));
  p.mask = c.has_input(4);
  const Dims want_mask = {p.n, p.offset_group * p.kh * p.kw, p.oh, p.ow};
  if (p.mask && c.input(4).shape() != want_mask)
    throw ValueError(cat(w, ": mask ", c.input(4).str(), " must be ", dims_str(want_mask)));
  return p;
}

ConvTransposePlan conv_transpose_plan(const KernelContext& c) {
  const std::string w = c.where();
  const ConvShapes s = check_conv_inputs(c, true);
  const window::Params p = window::read_params(c.attrs(), s.kernel, false, w);
  const size_t rank = p.rank();
  const Dims opad = c.attrs().get_ints("output_padding", Dims(rank, 0));
  Dims oshape = c.attrs().get_ints("output_shape", {});
  if (oshape.size() == rank + 2) oshape.erase(oshape.begin(), oshape.begin() + 2);
  if (opad.size() != rank || (!oshape.empty() && oshape.size() != rank))
    throw ValueError(cat(w, ": output_padding ", dims_str(opad), " and output_shape ",
                         dims_str(oshape), " must have one value per spatial axis"));
  std::vector<window::Axis> axes;
  for (size_t i = 0; i < rank; ++i) {
    if (opad[i] < 0 || (!oshape.empty() && oshape[i] < 0))
      throw ValueError(cat(w, ": output_padding and output_shape must be >= 0"));
    axes.push_back(
        window::transpose_axis(p, i, s.in_spatial[i], opad[i], oshape.empty() ? -1 : oshape[i], w));
  }
  ConvTransposePlan plan{s.N, s.C, s.M, s.group, lift(p, axes, s.in_spatial), {}};
  plan.y_shape = output_shape(s, plan.g);
  return plan;
}

void register_conv_kernels(KernelRegistry& r) {
  r.add("Conv", conv);
  r.add("ConvTranspose", conv_transpose);
  r.add("DeformConv", deform_conv);
}

}  // namespace pto::reference
