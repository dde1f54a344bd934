// Resize and Upsample on float32. The plan and each axis's taps (source indices and weights) come
// from the reference's code (reference/ops/resize_plan.h), so every mode, coordinate transform,
// nearest rule, cubic coefficient, exclude_outside, antialias and error is the reference's; the
// interpolation is separable as there, one axis at a time, in float with the weights rounded to
// float (the reference accumulates in double). An axis with more than one value per position
// (`inner` > 1: every axis but the last) is a weighted sum of whole rows, vectorized along them;
// the last axis is a weighted gather per output value. Each pass runs in parallel over its
// output rows. A plane (the last two axes) whose outputs each copy one input value (nearest, the
// 2x upsampling of YOLO and U-Net decoders) is one pass of row gathers and row copies instead;
// so is the plane of a blocked tensor [N, C/c, H, W, c] (level 3), a run of c values a position.
#include <algorithm>
#include <vector>

#include "backend/cpu/kernel.h"
#include "pto/parallel.h"
#include "reference/ops/resize_plan.h"

namespace pto::cpu {
namespace {

constexpr int64_t kGrainValues = 32768;  // multiply-adds per parallel chunk, at least

// y[b, o] = sum_j w[o, j] x[b, index[o, j]] (or the extrapolation value) over [outer, in] ->
// [outer, out]: the last axis, a weighted gather per output value, a row of them at a time (an
// index per value, not a division: YOLOv8's 2x nearest upsampling of [256, 20, 20] took 1.1 ms
// dividing out each output's row and column, a tenth of that without).
void resize_last_axis(const float* x, float* y, int64_t outer, const reference::ResizeTaps& t,
                      const std::vector<float>& w, float extrapolation) {
  const int64_t n = t.n, out = t.out, in = t.in;
  const bool extrapolates =
      std::find(t.extrapolate.begin(), t.extrapolate.end(), true) != t.extrapolate.end();
  const int64_t grain = std::max<int64_t>(1, kGrainValues / std::max<int64_t>(out * n, 1));
  parallel_for(0, outer, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* xb = x + b * in;
      float* yb = y + b * out;
      if (n == 1 && !extrapolates) {  // nearest: one tap, weight 1
        for (int64_t o = 0; o < out; ++o) yb[o] = w[o] * xb[t.index[o]];
        continue;
      }
      for (int64_t o = 0; o < out; ++o) {
        if (extrapolates && t.extrapolate[o]) {
          yb[o] = extrapolation;
          continue;
        }
        const int64_t* idx = t.index.data() + o * n;
        const float* wo = w.data() + o * n;
        float acc = 0;
        for (int64_t j = 0; j < n; ++j) acc += wo[j] * xb[idx[j]];
        yb[o] = acc;
      }
    }
  });
}

// y[b, o, k] = sum_j w[o, j] x[b, index[o, j], k] (or the extrapolation value) over
// [outer, in, inner] -> [outer, out, inner].
void resize_pass(const float* x, float* y, int64_t outer, int64_t inner,
                 const reference::ResizeTaps& t, float extrapolation) {
  std::vector<float> w(t.weight.begin(), t.weight.end());
  if (inner == 1) return resize_last_axis(x, y, outer, t, w, extrapolation);
  const int64_t n = t.n, out = t.out, in = t.in;
  const int64_t grain = std::max<int64_t>(1, kGrainValues / std::max<int64_t>(inner * n, 1));
  parallel_for(0, outer * out, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / out, o = r % out;
      float* yr = y + r * inner;
      if (t.extrapolate[o]) {
        std::fill(yr, yr + inner, extrapolation);
        continue;
      }
      const int64_t* idx = t.index.data() + o * n;
      const float* wo = w.data() + o * n;
      const float* xb = x + b * in * inner;
      const float* x0 = xb + idx[0] * inner;
      for (int64_t k = 0; k < inner; ++k) yr[k] = wo[0] * x0[k];
      for (int64_t j = 1; j < n; ++j) {
        const float* xj = xb + idx[j] * inner;
        const float wj = wo[j];
        for (int64_t k = 0; k < inner; ++k) yr[k] += wj * xj[k];
      }
    }
  });
}

// The input index each output copies, when every output of an axis takes one input value whole:
// nearest (its taps are {1, 0} or {0, 1}), or any mode at positions landing on inputs; no
// extrapolation. Empty otherwise. A copy, unlike the weighted sum, leaves the neighbour of weight 0
// unread, so an inf there does not make NaN (as in PyTorch's nearest).
std::vector<int64_t> copy_indices(const reference::ResizeTaps& t) {
  std::vector<int64_t> index(static_cast<size_t>(t.out));
  for (int64_t o = 0; o < t.out; ++o) {
    if (t.extrapolate[o]) return {};
    int64_t from = -1;
    for (int64_t j = 0; j < t.n; ++j) {
      const double w = t.weight[o * t.n + j];
      if (w == 1.0 && from < 0)
        from = t.index[o * t.n + j];
      else if (w != 0.0)
        return {};
    }
    if (from < 0) return {};
    index[o] = from;
  }
  return index;
}

// Both axes of a plane as one pass of copies, [outer, ih, iw] -> [outer, oh, ow] by the index
// arrays of copy_indices: an output row gathers from its input row, or repeats the row above when
// both come from the same input row (every other row of a 2x nearest upsampling), with no
// intermediate tensor.
// `inner` > 1: each position is a run of `inner` values (the channel lanes of a blocked tensor
// [N, C/c, H, W, c], whose Resize of H and W AssignLayouts keeps blocked), copied whole.
void resize_copies_2d(const float* x, float* y, int64_t outer, int64_t ih, int64_t iw,
                      int64_t inner, const std::vector<int64_t>& rows,
                      const std::vector<int64_t>& cols) {
  const auto oh = static_cast<int64_t>(rows.size()), ow = static_cast<int64_t>(cols.size());
  const int64_t* col = cols.data();
  const int64_t len = ow * inner;  // values per output row
  // Columns doubled (a 2x nearest upsampling): each input value written twice, no index loads
  // (a loop the compiler vectorizes with permutes).
  bool doubled = ow == 2 * iw;
  for (int64_t k = 0; doubled && k < ow; ++k) doubled = col[k] == k / 2;
  const int64_t grain = std::max<int64_t>(1, kGrainValues / std::max<int64_t>(len, 1));
  parallel_for(0, outer * oh, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / oh, o = r % oh;
      float* yr = y + r * len;
      if (r > r0 && o > 0 && rows[o] == rows[o - 1]) {
        std::copy_n(yr - len, len, yr);
        continue;
      }
      const float* xr = x + (b * ih + rows[o]) * iw * inner;
      if (inner == 1 && doubled) {
        for (int64_t k = 0; k < iw; ++k) yr[2 * k] = yr[2 * k + 1] = xr[k];
      } else if (inner == 1) {
        for (int64_t k = 0; k < ow; ++k) yr[k] = xr[col[k]];
      } else if (inner == 16) {  // AVX-512's lanes: a constant length the compiler unrolls
        for (int64_t k = 0; k < ow; ++k) std::copy_n(xr + col[k] * 16, 16, yr + k * 16);
      } else if (inner == 8) {
        for (int64_t k = 0; k < ow; ++k) std::copy_n(xr + col[k] * 8, 8, yr + k * 8);
      } else {
        for (int64_t k = 0; k < ow; ++k) std::copy_n(xr + col[k] * inner, inner, yr + k * inner);
      }
    }
  });
}

std::vector<Tensor> run_resize(const KernelContext& c) {
  const reference::ResizePlan plan =
      c.node.op == "Upsample" ? reference::upsample_plan(c) : reference::resize_plan(c);
  const Tensor& x = c.input(0);
  Tensor y = Tensor::empty(DType::kF32, plan.out);
  if (y.numel() == 0) return one(std::move(y));
  Dims shape = x.shape();
  std::vector<int64_t> axes;
  for (int64_t a : plan.order)
    if (!reference::is_identity_axis(plan.params, shape[a], plan.out[a], plan.scales[a],
                                     plan.roi_start(a), plan.roi_end(a)))
      axes.push_back(a);
  if (axes.empty()) {
    std::copy_n(x.data<float>(), x.numel(), y.data<float>());
    return one(std::move(y));
  }
  const auto rank = static_cast<int64_t>(shape.size());
  // A plane, the last two axes or the two before a last identity axis (a blocked tensor's
  // lanes): both axes in one pass when copies.
  const int64_t last = std::max(axes[0], axes.size() > 1 ? axes[1] : axes[0]);
  if (axes.size() == 2 && std::min(axes[0], axes[1]) == last - 1 &&
      (last == rank - 1 || last == rank - 2)) {
    auto taps = [&](int64_t a) {
      return reference::resize_taps(plan.params, shape[a], plan.out[a], plan.scales[a],
                                    plan.roi_start(a), plan.roi_end(a), c.where());
    };
    const std::vector<int64_t> rows = copy_indices(taps(last - 1));
    const std::vector<int64_t> cols = rows.empty() ? rows : copy_indices(taps(last));
    if (!cols.empty()) {
      const int64_t ih = shape[last - 1], iw = shape[last];
      const int64_t inner = last == rank - 1 ? 1 : shape[rank - 1];
      resize_copies_2d(x.data<float>(), y.data<float>(), x.numel() / (ih * iw * inner), ih, iw,
                       inner, rows, cols);
      return one(std::move(y));
    }
  }
  std::vector<float> bufs[2];
  const float* src = x.data<float>();
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t a = axes[i];
    const reference::ResizeTaps t =
        reference::resize_taps(plan.params, shape[a], plan.out[a], plan.scales[a],
                               plan.roi_start(a), plan.roi_end(a), c.where());
    int64_t outer = 1, inner = 1;
    for (int64_t k = 0; k < a; ++k) outer *= shape[k];
    for (size_t k = a + 1; k < shape.size(); ++k) inner *= shape[k];
    shape[a] = plan.out[a];
    float* dst = y.data<float>();
    if (i + 1 < axes.size()) {
      bufs[i % 2].resize(static_cast<size_t>(outer * t.out * inner));
      dst = bufs[i % 2].data();
    }
    resize_pass(src, dst, outer, inner, t, static_cast<float>(plan.params.extrapolation));
    src = dst;
  }
  return one(std::move(y));
}

bool accepts_resize(const NodeInfo& n) {
  return n.dtype(0) == DType::kF32 &&
         (n.outputs[0].dtype == DType::kF32 || n.outputs[0].dtype == DType::kUndefined);
}

}  // namespace

void register_resize_kernels(KernelRegistry& r) {
  for (const char* op : {"Resize", "Upsample"})
    r.add(op, {.accepts = accepts_resize, .run = run_resize});
}

}  // namespace pto::cpu
