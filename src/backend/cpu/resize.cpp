// Resize and Upsample on float32. The plan and each axis's taps (source indices and weights) come
// from the reference's code (reference/ops/resize_plan.h), so every mode, coordinate transform,
// nearest rule, cubic coefficient, exclude_outside, antialias and error is the reference's; the
// interpolation is separable as there, one axis at a time, in float with the weights rounded to
// float (the reference accumulates in double). An axis with more than one value per position
// (`inner` > 1: every axis but the last) is a weighted sum of whole rows, vectorized along them;
// the last axis is a weighted gather per output value. Each pass runs in parallel over its
// output rows.
#include <algorithm>
#include <vector>

#include "backend/cpu/kernel.h"
#include "pto/parallel.h"
#include "reference/ops/resize_plan.h"

namespace pto::cpu {
namespace {

constexpr int64_t kGrainValues = 32768;  // multiply-adds per parallel chunk, at least

// y[b, o, k] = sum_j w[o, j] x[b, index[o, j], k] (or the extrapolation value) over
// [outer, in, inner] -> [outer, out, inner].
void resize_pass(const float* x, float* y, int64_t outer, int64_t inner,
                 const reference::ResizeTaps& t, float extrapolation) {
  std::vector<float> w(t.weight.begin(), t.weight.end());
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
      if (inner == 1) {
        float acc = 0;
        for (int64_t j = 0; j < n; ++j) acc += wo[j] * xb[idx[j]];
        *yr = acc;
        continue;
      }
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
