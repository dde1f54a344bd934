// The detection ops on float32: NonMaxSuppression and RoiAlign.
//
// NonMaxSuppression on float32 boxes and scores (detection models' post-processing: SSD, Faster
// and Mask R-CNN, RetinaNet, YOLO exported end to end). The reference kernel's algorithm and
// arithmetic (reference/ops/image_detect.cpp), so the selected boxes are the same: per batch and
// class, the boxes above score_threshold best score first (NaN last, ties by index), each kept
// unless its IoU with a kept one exceeds iou_threshold, up to max_output_boxes_per_class. What
// changes: each box's corners and area computed once per batch, the candidates taken best first
// from a heap of (score, index) pairs (only as many as the loop reads), each box tested against
// all kept ones at once (branch-free, vectorized), and the (batch, class) pairs run in parallel,
// their rows concatenated in order. Malformed inputs go to the reference for its errors.
//
// RoiAlign (Faster/Mask R-CNN's box features): the reference's sample points and bilinear weights
// (computed in double, as there, once per region and shared by every channel) and its sums in
// double, over one contiguous channel plane at a time (the reference walks all planes for each
// bin), (region, channel) pairs in parallel. Malformed regions and inputs go to the reference.
#include <algorithm>
#include <cmath>

#include "backend/cpu/kernel.h"
#include "pto/parallel.h"
#include "reference/ops/bilinear_corners.h"

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

// ---- RoiAlign ----

bool accepts_roi_align(const NodeInfo& n) {
  const std::string mode = n.node.attr_string("mode");
  return n.dtype(0) == DType::kF32 && n.dtype(1) == DType::kF32 && n.dtype(2) == DType::kI64 &&
         n.outputs.size() == 1 && (mode == "avg" || mode == "max");
}

std::vector<Tensor> run_roi_align(const KernelContext& c) {
  const Tensor &X = c.input(0), &rois = c.input(1), &batch_t = c.input(2);
  if (X.rank() != 4 || rois.rank() != 2 || rois.dim(1) != 4 || batch_t.rank() != 1 ||
      batch_t.dim(0) != rois.dim(0))
    return run_reference(c);
  const std::string ctm = c.attrs().get_string(
      "coordinate_transformation_mode",
      c.node.opset != 0 && c.node.opset < 16 ? "output_half_pixel" : "half_pixel");
  if (ctm != "half_pixel" && ctm != "output_half_pixel") return run_reference(c);
  const bool half_pixel = ctm == "half_pixel", avg = c.node.attr_string("mode") == "avg";
  const int64_t ph = c.node.attr_int("output_height"), pw = c.node.attr_int("output_width");
  const int64_t sampling = c.node.attr_int("sampling_ratio");
  const double scale = c.node.attr_float("spatial_scale");
  const int64_t N = X.dim(0), C = X.dim(1), H = X.dim(2), W = X.dim(3), R = rois.dim(0);
  if (ph < 1 || pw < 1 || sampling < 0 || (R * C > 0 && (H == 0 || W == 0)))
    return run_reference(c);
  const int64_t* batch = batch_t.data<int64_t>();
  const float* box = rois.data<float>();
  // Each region's sample grid (the reference's rules; a malformed one goes to it for the error).
  constexpr double kMaxGrid = 1 << 20;
  constexpr int64_t kMaxSamples = 1 << 20;
  std::vector<int64_t> grid(static_cast<size_t>(R * 2));
  std::vector<double> geom(static_cast<size_t>(R * 4));  // start_h, start_w, bin_h, bin_w
  for (int64_t r = 0; r < R; ++r) {
    if (C > 0 && (batch[r] < 0 || batch[r] >= N)) return run_reference(c);
    const double offset = half_pixel ? 0.5 : 0.0;
    const double start_w = static_cast<double>(box[r * 4 + 0]) * scale - offset;
    const double start_h = static_cast<double>(box[r * 4 + 1]) * scale - offset;
    double roi_w = static_cast<double>(box[r * 4 + 2]) * scale - offset - start_w;
    double roi_h = static_cast<double>(box[r * 4 + 3]) * scale - offset - start_h;
    if (!half_pixel) {
      roi_w = std::max(roi_w, 1.0);
      roi_h = std::max(roi_h, 1.0);
    }
    const double bin_h = roi_h / static_cast<double>(ph), bin_w = roi_w / static_cast<double>(pw);
    int64_t g[2];
    for (int k = 0; k < 2; ++k) {
      const double bin = k == 0 ? bin_h : bin_w;
      const double s = sampling > 0 ? static_cast<double>(sampling) : std::ceil(bin);
      if (!(s <= kMaxGrid)) return run_reference(c);
      g[k] = s > 0 ? static_cast<int64_t>(s) : 0;
    }
    if (g[0] * g[1] > kMaxSamples) return run_reference(c);
    grid[r * 2] = g[0], grid[r * 2 + 1] = g[1];
    geom[r * 4] = start_h, geom[r * 4 + 1] = start_w, geom[r * 4 + 2] = bin_h;
    geom[r * 4 + 3] = bin_w;
  }
  Tensor y = Tensor::empty(DType::kF32, {R, C, ph, pw});
  if (y.numel() == 0) return one(std::move(y));
  const float* in = X.data<float>();
  float* out = y.data<float>();
  const int64_t bins = ph * pw;
  // Per region: every bin's samples (shared by the channels), then channel planes in parallel.
  std::vector<reference::BilinearCorners> samples;
  std::vector<int64_t> first(static_cast<size_t>(bins + 1));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t gh = grid[r * 2], gw = grid[r * 2 + 1];
    const double start_h = geom[r * 4], start_w = geom[r * 4 + 1], bin_h = geom[r * 4 + 2],
                 bin_w = geom[r * 4 + 3];
    samples.clear();
    for (int64_t yb = 0; yb < ph; ++yb)
      for (int64_t xb = 0; xb < pw; ++xb) {
        first[yb * pw + xb] = static_cast<int64_t>(samples.size());
        for (int64_t iy = 0; iy < gh; ++iy) {
          const double yy = start_h + static_cast<double>(yb) * bin_h +
                            (static_cast<double>(iy) + 0.5) * bin_h / static_cast<double>(gh);
          for (int64_t ix = 0; ix < gw; ++ix) {
            const double xx = start_w + static_cast<double>(xb) * bin_w +
                              (static_cast<double>(ix) + 0.5) * bin_w / static_cast<double>(gw);
            samples.push_back(reference::bilinear_corners(yy, xx, H, W));
          }
        }
      }
    first[bins] = static_cast<int64_t>(samples.size());
    const double count = static_cast<double>(std::max<int64_t>(gh * gw, 1));
    const int64_t per_bin = std::max<int64_t>(gh * gw, 1);
    parallel_for(0, C, std::max<int64_t>(1, 8192 / (bins * per_bin)), [&](int64_t c0, int64_t c1) {
      for (int64_t ch = c0; ch < c1; ++ch) {
        const float* plane = in + (batch[r] * C + ch) * H * W;
        float* o = out + (r * C + ch) * bins;
        for (int64_t bin = 0; bin < bins; ++bin) {
          double acc = 0;
          for (int64_t s = first[bin]; s < first[bin + 1]; ++s) {
            const reference::BilinearCorners& k = samples[s];
            if (avg) {
              for (int q = 0; q < 4; ++q) acc += k.weight[q] * static_cast<double>(plane[k.pos[q]]);
            } else {
              double v = k.weight[0] * static_cast<double>(plane[k.pos[0]]);
              for (int q = 1; q < 4; ++q)
                v = std::max(v, k.weight[q] * static_cast<double>(plane[k.pos[q]]));
              acc = s == first[bin] ? v : std::max(acc, v);
            }
          }
          o[bin] = static_cast<float>(avg ? acc / count : acc);
        }
      }
    });
  }
  return one(std::move(y));
}

}  // namespace

void register_detect_kernels(KernelRegistry& r) {
  r.add("RoiAlign",
        {.accepts = accepts_roi_align, .run = run_roi_align, .reference_at_run_time = true});
  r.add("NonMaxSuppression",
        {.accepts = accepts_nms, .run = run_nms, .reference_at_run_time = true});
}

}  // namespace pto::cpu
