// CPU kernels for MaxPool and AveragePool (1-D, 2-D and 3-D, float32, NCHW or level 3's
// channel-blocked NCHWc; MaxPool without its Indices output) and GlobalAveragePool / GlobalMaxPool
// (any rank, through the folds of reduce.cpp). Window geometry comes from ir/ops/window.h, as in
// shape inference and the reference, and the per-row and per-column window extents are tabulated
// once per node run.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/kernel.h"
#include "backend/cpu/reduce_kernels.h"
#include "ir/ops/window.h"
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

// Per output position along one axis: how many positions its window counts. Positions past
// in + pad_begin + pad_end (ceil_mode's overhang) are not counted; padding counts when count_pad.
std::vector<float> axis_counts(int64_t in, int64_t out, int64_t k, int64_t s, int64_t d, int64_t pb,
                               int64_t pe, bool count_pad) {
  std::vector<float> count(static_cast<size_t>(out), 0.0f);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t q = o * s + j * d;
      if (q >= in + pb + pe) break;
      if ((q - pb >= 0 && q - pb < in) || count_pad) count[o] += 1;
    }
  return count;
}

// A channel-blocked value [N, C/c, H, W, c] (level 3's NCHWc) pooled over H and W: a 3-D window
// whose last axis (the channel lanes) has size 1, stride 1, no dilation and no padding.
bool lanes_untouched(const window::Params& p) {
  return p.rank() == 3 && p.kernel[2] == 1 && p.strides[2] == 1 && p.dilations[2] == 1 &&
         (p.auto_pad != window::AutoPad::kNotSet || (p.pads[2] == 0 && p.pads[5] == 0));
}

// Pools `planes` planes of x ([planes, h, w, lanes]) into y ([planes, oh, ow, lanes]) with one
// axis's window on the rows and another's on the columns, in parallel over the planes. A max
// window holding a NaN gives NaN (torch's max_pool, numpy's max).
void pool_2d(PoolGeom g, const window::Axis& ah, const window::Axis& aw, bool is_max,
             bool count_pad, const float* xp, float* yp, int64_t planes) {
  g.oh = ah.out;
  g.ow = aw.out;
  g.ph = ah.pad_begin;
  g.pw = aw.pad_begin;
  if (planes * g.oh * g.ow * g.lanes == 0) return;
  g.span = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
  const std::vector<float> rows =
      axis_counts(g.h, g.oh, g.kh, g.sh, g.dh, g.ph, ah.pad_end, count_pad);
  const std::vector<float> cols =
      axis_counts(g.w, g.ow, g.kw, g.sw, g.dw, g.pw, aw.pad_end, count_pad);
  const PoolIndex ix{rows.data(), cols.data()};
  const int64_t work = g.oh * (g.kh * g.span + g.kw * g.span) * g.lanes + 1;
  parallel_for(0, planes, std::max<int64_t>(1, kParallelGrain / work), [&](int64_t p0, int64_t p1) {
    std::vector<float> scratch(static_cast<size_t>(2 * g.span * g.lanes));
    PTO_ISA_DISPATCH(pool_planes, g, ix, is_max, xp, yp, p0, p1, scratch.data());
  });
}

// A 3-D window over [N, C, D, H, W] (MViT's attention pooling, 3-D CNNs), separably: the H x W
// window on each of the N C D planes, then the D window on [N C, D, 1, OH OW] as a column of
// positions whose OH OW values are the lanes. Max and sums separate exactly, an average's count
// is the product of the axes' counts; a NaN carries through both passes of a max.
Tensor pool_3d(const Tensor& x, const window::Params& p, bool is_max, bool count_pad,
               const std::string& w) {
  window::Axis ax[3];
  for (size_t i = 0; i < 3; ++i) ax[i] = window::forward_axis(p, i, x.dim(2 + i), w);
  const int64_t nc = x.dim(0) * x.dim(1), d = x.dim(2), h = x.dim(3), wd = x.dim(4);
  Tensor t = Tensor::empty(DType::kF32, {x.dim(0), x.dim(1), d, ax[1].out, ax[2].out});
  PoolGeom g{};
  g.h = h, g.w = wd, g.kh = p.kernel[1], g.kw = p.kernel[2];
  g.sh = p.strides[1], g.sw = p.strides[2], g.dh = p.dilations[1], g.dw = p.dilations[2];
  pool_2d(g, ax[1], ax[2], is_max, count_pad, x.data<float>(), t.data<float>(), nc * d);
  Tensor y = Tensor::empty(DType::kF32, {x.dim(0), x.dim(1), ax[0].out, ax[1].out, ax[2].out});
  PoolGeom gd{};
  gd.h = d, gd.w = 1, gd.kh = p.kernel[0], gd.kw = 1, gd.sh = p.strides[0], gd.sw = 1;
  gd.dh = p.dilations[0], gd.dw = 1, gd.lanes = ax[1].out * ax[2].out;
  pool_2d(gd, ax[0], window::Axis{1, 0, 0}, is_max, count_pad, t.data<float>(), y.data<float>(),
          nc);
  return y;
}

std::vector<Tensor> run_pool(const KernelContext& c, bool is_max) {
  const std::string w = c.where();
  const Tensor& x = c.input(0);
  const Dims kernel = c.attrs().get_ints("kernel_shape");
  if (kernel.size() != static_cast<size_t>(x.rank() - 2))
    throw ValueError(cat(w, ": kernel_shape ", dims_str(kernel), " does not match ", x.rank() - 2,
                         " spatial axes of X ", x.str()));
  const window::Params p = window::read_params(c.attrs(), kernel, true, w);
  const bool count_pad = !is_max && c.node.attr_int("count_include_pad") != 0;
  // A 5-D value whose last axis the window leaves alone is pooled as level 3's NCHWc (the same
  // result as a 3-D pool: the last axis becomes the lanes); any other 3-D window, separably.
  const bool blocked = x.rank() == 5 && lanes_untouched(p) &&
                       window::forward_axis(p, 2, x.dim(4), w).out == x.dim(4);
  if (x.rank() == 5 && !blocked) return one(pool_3d(x, p, is_max, count_pad, w));
  const size_t rank = blocked ? 2 : static_cast<size_t>(x.rank() - 2);
  window::Axis axes[2];
  for (size_t i = 0; i < rank; ++i) axes[i] = window::forward_axis(p, i, x.dim(2 + i), w);
  // Lift 1-D to 2-D: a leading axis of size 1 with a unit window.
  const window::Axis ah = rank == 2 ? axes[0] : window::Axis{1, 0, 0};
  const window::Axis aw = axes[rank - 1];
  PoolGeom g{};
  g.h = rank == 2 ? x.dim(2) : 1;
  g.kh = rank == 2 ? p.kernel[0] : 1;
  g.kw = p.kernel[rank - 1];
  g.sh = rank == 2 ? p.strides[0] : 1;
  g.sw = p.strides[rank - 1];
  g.dh = rank == 2 ? p.dilations[0] : 1;
  g.dw = p.dilations[rank - 1];
  g.w = x.dim(rank + 1);
  g.lanes = blocked ? x.dim(4) : 1;
  Dims yshape = {x.dim(0), x.dim(1)};
  if (rank == 2) yshape.push_back(ah.out);
  yshape.push_back(aw.out);
  if (blocked) yshape.push_back(g.lanes);
  Tensor y = Tensor::empty(DType::kF32, yshape);
  pool_2d(g, ah, aw, is_max, count_pad, x.data<float>(), y.data<float>(), x.dim(0) * x.dim(1));
  return one(std::move(y));
}

bool accepts_pool(const NodeInfo& n, bool is_max) {
  if (n.dtype(0) != DType::kF32 || !n.inputs[0].shape) return false;
  const size_t rank = n.inputs[0].shape->size();
  if (rank < 3 || rank > 5) return false;
  if (!is_max) return true;
  const bool indices = n.node.outputs.size() > 1 && n.node.outputs[1] != kNoValue;
  return !indices && n.node.attr_int("storage_order") == 0;
}

// GlobalAveragePool and GlobalMaxPool: a fold over everything past [N, C].
std::vector<Tensor> run_global_pool(const KernelContext& c, bool is_max) {
  const Tensor& x = c.input(0);
  if (x.rank() < 2)
    throw ValueError(cat(c.where(), ": X must be [N, C, spatial...], got ", x.str()));
  Dims yshape = x.shape();
  for (size_t i = 2; i < yshape.size(); ++i) yshape[i] = 1;
  Tensor y = Tensor::empty(DType::kF32, yshape);
  const int64_t planes = y.numel();
  if (planes == 0) return one(std::move(y));
  const int64_t size = x.numel() / planes;
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  fold_all(is_max ? Fold::kMax : Fold::kSum, xp, planes, size, 1, nullptr, yp);  // NaN propagates
  for (int64_t k = 0; k < planes; ++k) {
    if (!is_max)
      yp[k] /= static_cast<float>(size);
    else if (size == 0)
      yp[k] = std::numeric_limits<float>::lowest();  // the reference's empty max
  }
  return one(std::move(y));
}

}  // namespace

void register_pool_kernels(KernelRegistry& r) {
  for (bool is_max : {true, false}) {
    r.add(is_max ? "MaxPool" : "AveragePool",
          {.accepts = [is_max](const NodeInfo& n) { return accepts_pool(n, is_max); },
           .run = [is_max](const KernelContext& c) { return run_pool(c, is_max); }});
    r.add(is_max ? "GlobalMaxPool" : "GlobalAveragePool",
          {.accepts = [](const NodeInfo& n) { return n.dtype(0) == DType::kF32; },
           .run = [is_max](const KernelContext& c) { return run_global_pool(c, is_max); }});
  }
}

}  // namespace pto::cpu
