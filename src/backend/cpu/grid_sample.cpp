// GridSample on float32 (X and grid), any number of spatial axes. The plan, each output point's
// taps (padding_mode, align_corners, the nearest/linear/cubic weights in double) and every error
// are the reference's (reference/ops/grid_sample_plan.h), and each sample is summed in double in
// the same tap order, so the results are the reference's bit for bit. The work is split into
// blocks of output points of one image, in parallel: a block's taps are computed once and applied
// to every channel, channel by channel (contiguous output rows).
//
// The fast path (2-D, bilinear or nearest, zeros or border padding, either align_corners: image
// warps, optical flow, deformable sampling) computes the taps in float on vectors of points and
// each channel's samples as masked gathers (grid_sample_impl.h), summed in float: within a few
// float ulps of the reference, not bit for bit (nearest is exact).
#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include "backend/cpu/grid_sample_isa.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/scratch.h"
#include "pto/parallel.h"
#include "reference/ops/grid_sample_plan.h"

namespace pto::cpu {
namespace {

using reference::Tap;

constexpr int64_t kBlockPoints = 256;

// The fast path's rule for `plan`, or nullopt when it does not apply.
std::optional<GridSample2d> fast_form(const reference::GridSamplePlan& plan) {
  if (plan.rank != 2 || plan.mode == reference::SampleMode::kCubic) return std::nullopt;
  const reference::AxisSampler& a = plan.axes[0];
  if (a.pad == reference::PadMode::kReflection || plan.plane >= (int64_t{1} << 24))
    return std::nullopt;
  return GridSample2d{plan.axes[0].size, plan.axes[1].size,
                      plan.mode == reference::SampleMode::kNearest,
                      a.pad == reference::PadMode::kBorder, a.align_corners};
}

// The fast path: blocks of output points of one image in parallel, the block's taps computed
// once and applied to every channel.
void run_fast(const reference::GridSamplePlan& plan, const GridSample2d& s, const float* x,
              const float* grid, float* out) {
  const int64_t points = plan.points, blocks = (points + kBlockPoints - 1) / kBlockPoints;
  const int taps = grid_taps(s);
  const int64_t grain = std::max<int64_t>(1, 16 / std::max<int64_t>(plan.c, 1));
  parallel_for(0, plan.n * blocks, grain, [&](int64_t t0, int64_t t1) {
    float* idx = scratch_as<float>(static_cast<size_t>(2 * taps * kBlockPoints));
    float* w = idx + taps * kBlockPoints;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / blocks, p0 = t % blocks * kBlockPoints;
      const int64_t len = std::min(kBlockPoints, points - p0);
      PTO_ISA_DISPATCH(grid_sample_taps, s, grid + (n * points + p0) * 2, len, idx, w,
                       kBlockPoints);
      for (int64_t ch = 0; ch < plan.c; ++ch)
        PTO_ISA_DISPATCH(grid_sample_apply, idx, w, taps, kBlockPoints, len,
                         x + (n * plan.c + ch) * plan.plane, out + (n * plan.c + ch) * points + p0);
    }
  });
}

std::vector<Tensor> run_grid_sample(const KernelContext& c) {
  const reference::GridSamplePlan plan = reference::grid_sample_plan(c);
  Tensor y = Tensor::empty(DType::kF32, plan.out_shape);
  if (y.numel() == 0) return one(std::move(y));
  if (const std::optional<GridSample2d> s = fast_form(plan)) {
    run_fast(plan, *s, c.input(0).data<float>(), c.input(1).data<float>(), y.data<float>());
    return one(std::move(y));
  }
  const int64_t points = plan.points, r = plan.rank, channels = plan.c;
  const int64_t blocks = (points + kBlockPoints - 1) / kBlockPoints;
  const float* x = c.input(0).data<float>();
  const float* grid = c.input(1).data<float>();
  float* out = y.data<float>();
  const bool nearest = plan.mode == reference::SampleMode::kNearest;
  const int64_t grain = std::max<int64_t>(1, 16 / std::max<int64_t>(channels, 1));
  parallel_for(0, plan.n * blocks, grain, [&](int64_t t0, int64_t t1) {
    std::vector<std::vector<Tap>> per_axis(static_cast<size_t>(r));
    std::vector<Tap> combined, next, taps;
    std::vector<int64_t> first(kBlockPoints + 1);  // the block's taps of point j: [first[j], ..)
    std::vector<char> finite(kBlockPoints);
    std::vector<double> coords(static_cast<size_t>(r));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / blocks, p0 = t % blocks * kBlockPoints;
      const int64_t len = std::min(kBlockPoints, points - p0);
      taps.clear();
      for (int64_t j = 0; j < len; ++j) {
        const float* g = grid + (n * points + p0 + j) * r;
        for (int64_t k = 0; k < r; ++k) coords[k] = g[k];
        first[j] = static_cast<int64_t>(taps.size());
        finite[j] = reference::grid_point_taps(plan, coords.data(), combined, per_axis, next);
        if (finite[j]) taps.insert(taps.end(), combined.begin(), combined.end());
      }
      first[len] = static_cast<int64_t>(taps.size());
      for (int64_t ch = 0; ch < channels; ++ch) {
        const float* src = x + (n * channels + ch) * plan.plane;
        float* dst = out + (n * channels + ch) * points + p0;
        for (int64_t j = 0; j < len; ++j) {
          if (!finite[j]) {
            dst[j] = std::numeric_limits<float>::quiet_NaN();
          } else if (nearest) {
            dst[j] = first[j] == first[j + 1] ? 0.0f : src[taps[first[j]].index];
          } else {
            double acc = 0;
            for (int64_t i = first[j]; i < first[j + 1]; ++i)
              acc += taps[i].weight * static_cast<double>(src[taps[i].index]);
            dst[j] = static_cast<float>(acc);
          }
        }
      }
    }
  });
  return one(std::move(y));
}

bool accepts_grid_sample(const NodeInfo& n) {
  return n.dtype(0) == DType::kF32 && n.dtype(1) == DType::kF32;
}

}  // namespace

void register_grid_sample_kernels(KernelRegistry& r) {
  r.add("GridSample", {.accepts = accepts_grid_sample, .run = run_grid_sample});
}

}  // namespace pto::cpu
