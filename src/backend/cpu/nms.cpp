// NonMaxSuppression on float32 boxes and scores (detection models' post-processing: SSD, Faster
// and Mask R-CNN, RetinaNet, YOLO exported end to end). The reference kernel's algorithm and
// arithmetic (reference/ops/image_detect.cpp), so the selected boxes are the same: per batch and
// class, the boxes above score_threshold best score first (NaN last, ties by index), each kept
// unless its IoU with a kept one exceeds iou_threshold, up to max_output_boxes_per_class. What
// changes: each box's corners and area computed once per batch, the candidates taken best first
// from a heap of (score, index) pairs (only as many as the loop reads), each box tested against
// all kept ones at once (branch-free, vectorized), and the (batch, class) pairs run in parallel,
// their rows concatenated in order. Malformed inputs go to the reference for its errors.
#include <algorithm>
#include <cmath>

#include "backend/cpu/kernel.h"
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

bool accepts_nms(const NodeInfo& n) {
  auto absent_or = [&](size_t i, DType t) {
    return i >= n.inputs.size() || n.dtype(i) == DType::kUndefined || n.dtype(i) == t;
  };
  return n.inputs.size() >= 2 && n.dtype(0) == DType::kF32 && n.dtype(1) == DType::kF32 &&
         absent_or(2, DType::kI64) && absent_or(3, DType::kF32) && absent_or(4, DType::kF32) &&
         n.outputs.size() == 1;
}

struct Candidate {
  float score;
  int64_t index;
};

std::vector<Tensor> run_nms(const KernelContext& c) {
  const Tensor &boxes = c.input(0), &scores = c.input(1);
  const int64_t center = c.node.attr_int("center_point_box");
  if (boxes.rank() != 3 || boxes.dim(2) != 4 || scores.rank() != 3 ||
      scores.dim(0) != boxes.dim(0) || scores.dim(2) != boxes.dim(1) ||
      (center != 0 && center != 1))
    return run_reference(c);
  auto given = [&](size_t i) { return c.has_input(i) && c.input(i).numel() > 0; };
  for (size_t i = 2; i < 5; ++i)
    if (given(i) && c.input(i).dtype() != (i == 2 ? DType::kI64 : DType::kF32))
      return run_reference(c);
  const int64_t max_out = given(2) ? std::max<int64_t>(c.input(2).data<int64_t>()[0], 0) : 0;
  const float iou_threshold = given(3) ? c.input(3).data<float>()[0] : 0.0f;
  const bool by_score = given(4);
  const float score_threshold = by_score ? c.input(4).data<float>()[0] : 0.0f;
  const int64_t B = boxes.dim(0), K = scores.dim(1), n = boxes.dim(1);
  // Corners [y_min, x_min, y_max, x_max] and areas of every box, as the reference computes them.
  std::vector<float> corner(static_cast<size_t>(B * n * 4)), area(static_cast<size_t>(B * n));
  const float* pb = boxes.data<float>();
  for (int64_t i = 0; i < B * n; ++i) {
    const float *p = pb + i * 4, v0 = p[0], v1 = p[1], v2 = p[2], v3 = p[3];
    float* o = corner.data() + i * 4;
    if (center == 0) {
      o[0] = std::min(v0, v2), o[2] = std::max(v0, v2);
      o[1] = std::min(v1, v3), o[3] = std::max(v1, v3);
    } else {  // [x_center, y_center, width, height]
      o[1] = v0 - v2 / 2, o[3] = v0 + v2 / 2;
      o[0] = v1 - v3 / 2, o[2] = v1 + v3 / 2;
    }
    area[i] = (o[3] - o[1]) * (o[2] - o[0]);
  }
  // The boxes kept so far in one (batch, class), as columns, and whether box p (corners, area)
  // is suppressed by any of them: the reference's tests (each IoU's arithmetic and comparisons,
  // in float) evaluated without branches across the kept boxes, so the loop vectorizes.
  struct Kept {
    std::vector<float> y0, x0, y1, x1, area;
    std::vector<int64_t> index;
    void clear() {
      for (auto* v : {&y0, &x0, &y1, &x1, &area}) v->clear();
      index.clear();
    }
  };
  auto suppressed = [iou_threshold](const Kept& k, const float* p, float area_p) {
    const size_t m = k.index.size();
    const float *ky0 = k.y0.data(), *kx0 = k.x0.data(), *ky1 = k.y1.data(), *kx1 = k.x1.data(),
                *ka = k.area.data();
    unsigned any = 0;
    for (size_t j = 0; j < m; ++j) {
      const float ix0 = std::max(p[1], kx0[j]), ix1 = std::min(p[3], kx1[j]);
      const float iy0 = std::max(p[0], ky0[j]), iy1 = std::min(p[2], ky1[j]);
      const float inter = (ix1 - ix0) * (iy1 - iy0);
      const float uni = area_p + ka[j] - inter;
      const bool hit = (ix1 > ix0) & (iy1 > iy0) & (inter > 0) & (area_p > 0) & (ka[j] > 0) &
                       (uni > 0) & (inter / uni > iou_threshold);
      any |= static_cast<unsigned>(hit);
    }
    return any != 0;
  };
  std::vector<std::vector<int64_t>> kept_of(static_cast<size_t>(B * K));
  const float* ps = scores.data<float>();
  if (max_out > 0)
    parallel_for(0, B * K, 1, [&](int64_t t0, int64_t t1) {
      std::vector<Candidate> order;
      Kept k;
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t b = t / K;
        const float* s = ps + t * n;
        order.clear();
        for (int64_t i = 0; i < n; ++i)
          if (!by_score || s[i] > score_threshold) order.push_back({s[i], i});
        // Best score first, NaN last, ties by index (the reference's stable sort; a total order,
        // so the same sequence), taken from a heap: the loop usually stops at max_out boxes long
        // before the candidates run out, so most are never sorted.
        auto worse = [](const Candidate& x, const Candidate& y) {
          const bool nx = std::isnan(x.score), ny = std::isnan(y.score);
          if (nx || ny) return nx == ny ? x.index > y.index : nx;
          return x.score != y.score ? x.score < y.score : x.index > y.index;
        };
        std::make_heap(order.begin(), order.end(), worse);
        k.clear();
        while (!order.empty() && static_cast<int64_t>(k.index.size()) < max_out) {
          std::pop_heap(order.begin(), order.end(), worse);
          const int64_t i = order.back().index;
          order.pop_back();
          const float* p = corner.data() + (b * n + i) * 4;
          const float area_p = area[b * n + i];
          if (suppressed(k, p, area_p)) continue;
          k.y0.push_back(p[0]);
          k.x0.push_back(p[1]);
          k.y1.push_back(p[2]);
          k.x1.push_back(p[3]);
          k.area.push_back(area_p);
          k.index.push_back(i);
        }
        kept_of[t] = k.index;
      }
    });
  int64_t rows = 0;
  for (const auto& k : kept_of) rows += static_cast<int64_t>(k.size());
  Tensor y = Tensor::empty(DType::kI64, {rows, 3});
  int64_t* out = y.data<int64_t>();
  for (int64_t t = 0; t < B * K; ++t)
    for (int64_t i : kept_of[t]) {
      *out++ = t / K;
      *out++ = t % K;
      *out++ = i;
    }
  return one(std::move(y));
}

}  // namespace

void register_nms_kernel(KernelRegistry& r) {
  r.add("NonMaxSuppression",
        {.accepts = accepts_nms, .run = run_nms, .reference_at_run_time = true});
}

}  // namespace pto::cpu
