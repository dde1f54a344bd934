// Reference kernels for the image family's detection ops: RoiAlign and NonMaxSuppression. Both
// follow the ONNX reference (itself a port of onnxruntime's kernels) step by step, quirks
// included, since the conformance outputs come from it.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "bilinear_corners.h"
#include "index_math.h"
#include "output_buffer.h"

namespace pto::reference {
namespace {

// RoiAlign: each region [x1, y1, x2, y2] (scaled by spatial_scale, shifted by half a pixel in
// half_pixel mode) is split into output_height x output_width bins; each bin averages (or takes
// the max of) a grid of bilinear samples. As in onnxruntime, max mode takes the largest
// *weighted corner* of each sample, not the largest interpolated value.
std::vector<Tensor> roi_align(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  const Tensor& rois = c.input(1);
  if (X.rank() != 4) throw ValueError(cat(w, ": X must be [N, C, H, W], got ", X.str()));
  if (rois.rank() != 2 || rois.dim(1) != 4)
    throw ValueError(cat(w, ": rois must be [num_rois, 4], got ", rois.str()));
  const std::vector<int64_t> batch = index_values(c.input(2), w, "batch_indices");
  if (c.input(2).rank() != 1 || c.input(2).dim(0) != rois.dim(0))
    throw ValueError(cat(w, ": batch_indices must be [", rois.dim(0), "], got ", c.input(2).str()));
  if (rois.dtype() != X.dtype()) throw TypeError(cat(w, ": rois must have X's dtype"));
  const std::string mode = c.node.attr_string("mode");
  if (mode != "avg" && mode != "max") throw ValueError(cat(w, ": unknown mode '", mode, "'"));
  // Opset 10 had no coordinate_transformation_mode and behaved as output_half_pixel.
  const std::string ctm = c.attrs().get_string(
      "coordinate_transformation_mode",
      c.node.opset != 0 && c.node.opset < 16 ? "output_half_pixel" : "half_pixel");
  if (ctm != "half_pixel" && ctm != "output_half_pixel")
    throw ValueError(cat(w, ": unknown coordinate_transformation_mode '", ctm, "'"));
  const bool half_pixel = ctm == "half_pixel";
  const int64_t ph = c.node.attr_int("output_height");
  const int64_t pw = c.node.attr_int("output_width");
  const int64_t sampling = c.node.attr_int("sampling_ratio");
  const double scale = c.node.attr_float("spatial_scale");
  if (ph < 1 || pw < 1) throw ValueError(cat(w, ": output_height and output_width must be >= 1"));
  if (sampling < 0) throw ValueError(cat(w, ": sampling_ratio must be >= 0"));
  const int64_t N = X.dim(0), C = X.dim(1), H = X.dim(2), W = X.dim(3), R = rois.dim(0);
  Dims out_shape{R, C, ph, pw};
  std::vector<double> out = output_buffer(out_shape, w);
  if (!out.empty() && (H == 0 || W == 0))
    throw ValueError(cat(w, ": cannot pool from an empty feature map ", X.str()));
  const std::vector<double> box = to_doubles(rois, w);
  const std::vector<double> data = to_doubles(X, w);
  // Sample grids past these sizes are a malformed region, not a real workload.
  constexpr double kMaxGrid = 1 << 20;
  constexpr int64_t kMaxSamples = 1 << 20;  // per bin
  for (int64_t r = 0; r < R && C > 0; ++r) {
    if (batch[r] < 0 || batch[r] >= N)
      throw ValueError(cat(w, ": batch index ", batch[r], " is outside [0, ", N, ")"));
    const double offset = half_pixel ? 0.5 : 0.0;
    const double start_w = box[r * 4 + 0] * scale - offset;
    const double start_h = box[r * 4 + 1] * scale - offset;
    double roi_w = box[r * 4 + 2] * scale - offset - start_w;
    double roi_h = box[r * 4 + 3] * scale - offset - start_h;
    if (!half_pixel) {  // malformed regions become 1x1
      roi_w = std::max(roi_w, 1.0);
      roi_h = std::max(roi_h, 1.0);
    }
    const double bin_h = roi_h / static_cast<double>(ph), bin_w = roi_w / static_cast<double>(pw);
    auto grid_size = [&](double bin) -> int64_t {
      const double g = sampling > 0 ? static_cast<double>(sampling) : std::ceil(bin);
      if (!(g <= kMaxGrid)) throw ValueError(cat(w, ": region ", r, " is too large or NaN"));
      return g > 0 ? static_cast<int64_t>(g) : 0;  // a negative grid samples nothing
    };
    const int64_t gh = grid_size(bin_h), gw = grid_size(bin_w);
    if (gh * gw > kMaxSamples)
      throw ValueError(
          cat(w, ": region ", r, " needs ", gh, " x ", gw, " samples per bin; set sampling_ratio"));
    const double count = static_cast<double>(std::max<int64_t>(gh * gw, 1));
    std::vector<BilinearCorners> samples;  // one bin's sample points, shared by all channels
    for (int64_t y = 0; y < ph; ++y)
      for (int64_t x = 0; x < pw; ++x) {
        samples.clear();
        for (int64_t iy = 0; iy < gh; ++iy) {
          const double yy = start_h + static_cast<double>(y) * bin_h +
                            (static_cast<double>(iy) + 0.5) * bin_h / static_cast<double>(gh);
          for (int64_t ix = 0; ix < gw; ++ix) {
            const double xx = start_w + static_cast<double>(x) * bin_w +
                              (static_cast<double>(ix) + 0.5) * bin_w / static_cast<double>(gw);
            samples.push_back(bilinear_corners(yy, xx, H, W));
          }
        }
        for (int64_t ch = 0; ch < C; ++ch) {
          const double* plane = data.data() + (batch[r] * C + ch) * H * W;
          double acc = 0;
          for (size_t s = 0; s < samples.size(); ++s) {
            const BilinearCorners& k = samples[s];
            if (mode == "avg") {
              for (int q = 0; q < 4; ++q) acc += k.weight[q] * plane[k.pos[q]];
            } else {
              double v = k.weight[0] * plane[k.pos[0]];
              for (int q = 1; q < 4; ++q) v = std::max(v, k.weight[q] * plane[k.pos[q]]);
              acc = s == 0 ? v : std::max(acc, v);
            }
          }
          out[((r * C + ch) * ph + y) * pw + x] = mode == "avg" ? acc / count : acc;
        }
      }
  }
  return {from_doubles(X.dtype(), out_shape, out, w)};
}

// NonMaxSuppression: per batch and class, boxes above score_threshold are taken best score
// first (ties: lower index) and kept unless their IoU with an already kept box exceeds
// iou_threshold, up to max_output_boxes_per_class. Arithmetic is in the boxes' precision, as in
// the reference, so boundary cases (IoU == threshold) agree.
std::vector<Tensor> non_max_suppression(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& boxes = c.input(0);
  const Tensor& scores = c.input(1);
  if (boxes.rank() != 3 || boxes.dim(2) != 4)
    throw ValueError(cat(w, ": boxes must be [batches, boxes, 4], got ", boxes.str()));
  if (scores.rank() != 3 || scores.dim(0) != boxes.dim(0) || scores.dim(2) != boxes.dim(1))
    throw ValueError(cat(w, ": scores must be [", boxes.dim(0), ", classes, ", boxes.dim(1),
                         "], got ", scores.str()));
  if (boxes.dtype() != scores.dtype())
    throw TypeError(cat(w, ": boxes and scores differ in dtype"));
  const int64_t center = c.node.attr_int("center_point_box");
  if (center != 0 && center != 1) throw ValueError(cat(w, ": center_point_box must be 0 or 1"));
  // An absent or empty input means its default.
  auto given = [&](size_t i) { return c.has_input(i) && c.input(i).numel() > 0; };
  int64_t max_out = 0;
  if (given(2)) max_out = std::max<int64_t>(index_values(c.input(2), w, "max_output_boxes")[0], 0);
  const int64_t B = boxes.dim(0), K = scores.dim(1), n = boxes.dim(1);
  std::vector<int64_t> rows;
  dispatch(boxes.dtype(), kFloatTypes, w, [&]<class T>() {
    using F = std::conditional_t<std::is_floating_point_v<compute_t<T>>, compute_t<T>, double>;
    auto threshold = [&](size_t i) -> F {
      if (!given(i)) return F(0);
      if (!is_floating(c.input(i).dtype()))
        throw TypeError(cat(w, ": input ", i, " must be a float tensor"));
      return static_cast<F>(to_doubles(c.input(i), w)[0]);
    };
    const F iou_threshold = threshold(3);
    const bool by_score = given(4);
    const F score_threshold = threshold(4);
    const T* pb = boxes.data<T>();
    const T* ps = scores.data<T>();
    // A box as [y_min, x_min, y_max, x_max].
    auto corners = [&](int64_t b, int64_t i, F out[4]) {
      const T* p = pb + (b * n + i) * 4;
      const F v0 = static_cast<F>(p[0]), v1 = static_cast<F>(p[1]), v2 = static_cast<F>(p[2]),
              v3 = static_cast<F>(p[3]);
      if (center == 0) {
        out[0] = std::min(v0, v2), out[2] = std::max(v0, v2);
        out[1] = std::min(v1, v3), out[3] = std::max(v1, v3);
      } else {  // [x_center, y_center, width, height]
        out[1] = v0 - v2 / 2, out[3] = v0 + v2 / 2;
        out[0] = v1 - v3 / 2, out[2] = v1 + v3 / 2;
      }
    };
    auto suppresses = [&](int64_t b, int64_t i, int64_t j) {
      F p[4], q[4];
      corners(b, i, p);
      corners(b, j, q);
      const F ix0 = std::max(p[1], q[1]), ix1 = std::min(p[3], q[3]);
      const F iy0 = std::max(p[0], q[0]), iy1 = std::min(p[2], q[2]);
      if (!(ix1 > ix0) || !(iy1 > iy0)) return false;
      const F inter = (ix1 - ix0) * (iy1 - iy0);
      const F area_p = (p[3] - p[1]) * (p[2] - p[0]), area_q = (q[3] - q[1]) * (q[2] - q[0]);
      const F uni = area_p + area_q - inter;
      if (!(inter > 0) || !(area_p > 0) || !(area_q > 0) || !(uni > 0)) return false;
      return inter / uni > iou_threshold;
    };
    std::vector<int64_t> order, kept;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t k = 0; k < K; ++k) {
        const T* s = ps + (b * K + k) * n;
        order.clear();
        for (int64_t i = 0; i < n; ++i)
          if (!by_score || static_cast<F>(s[i]) > score_threshold) order.push_back(i);
        // Best score first, NaN last; stable, so ties keep the lower index first.
        std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) {
          const F a = static_cast<F>(s[i]), z = static_cast<F>(s[j]);
          if (std::isnan(a) || std::isnan(z)) return !std::isnan(a) && std::isnan(z);
          return a > z;
        });
        kept.clear();
        for (int64_t i : order) {
          if (static_cast<int64_t>(kept.size()) >= max_out) break;
          bool keep = true;
          for (int64_t j : kept) keep = keep && !suppresses(b, i, j);
          if (!keep) continue;
          kept.push_back(i);
          rows.insert(rows.end(), {b, k, i});
        }
      }
  });
  return {Tensor::from_vector<int64_t>(rows, {static_cast<int64_t>(rows.size() / 3), 3})};
}

}  // namespace

void register_image_detect_kernels(KernelRegistry& r) {
  r.add("RoiAlign", roi_align);
  r.add("NonMaxSuppression", non_max_suppression);
}

}  // namespace pto::reference
