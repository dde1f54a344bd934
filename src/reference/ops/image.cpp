// Reference kernels for the image family's sampling ops, GridSample and AffineGrid. The layout
// ops (CenterCropPad, Col2Im, MaxUnpool) are in image_layout.cpp, the detection ops (RoiAlign,
// NonMaxSuppression) in image_detect.cpp.
#include <algorithm>
#include <cmath>

#include "grid_sample_plan.h"
#include "index_math.h"
#include "output_buffer.h"

namespace pto::reference {

void register_image_layout_kernels(KernelRegistry& r);  // image_layout.cpp
void register_image_detect_kernels(KernelRegistry& r);  // image_detect.cpp

namespace {

// Reflects x into [lo, hi] by folding it at the nearer border until it lands inside (the ONNX
// reference's _gs_reflect). A zero-width range (one pixel with align_corners) collapses to lo.
double reflect(double x, double lo, double hi) {
  const double range = hi - lo;
  if (range <= 0) return lo;
  if (x >= lo && x <= hi) return x;
  const double dx = x < lo ? lo - x : x - hi;
  const double folds = std::floor(dx / range);
  const double rest = std::fmod(dx, range);
  const bool even = std::fmod(folds, 2.0) == 0;
  if (x < lo) return even ? lo + rest : hi - rest;
  return even ? hi - rest : lo + rest;
}

// Keys' cubic convolution weights (alpha = -0.75) of the four taps floor(x) - 1 .. floor(x) + 2,
// for t = x - floor(x).
void cubic_weights(double t, double w[4]) {
  constexpr double a = -0.75;
  auto outer = [&](double s) { return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a; };  // 1<|s|<2
  auto inner = [&](double s) { return ((a + 2) * s - (a + 3)) * s * s + 1; };        // |s|<=1
  w[0] = outer(t + 1);
  w[1] = inner(t);
  w[2] = inner(1 - t);
  w[3] = outer(2 - t);
}

// GridSample: Y[n, c, p...] samples X[n, c] at grid[n, p...], whose last axis holds normalized
// coordinates in reverse axis order (x = the last spatial axis first). Out-of-range reads follow
// padding_mode. Opsets 16 (4-D only, "bilinear"/"bicubic") and 20+ (N-D, "linear"/"cubic") are
// both served by the N-D code; either spelling of a mode is accepted at every opset.
std::vector<Tensor> grid_sample(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  const GridSamplePlan plan = grid_sample_plan(c);
  Tensor Y = Tensor::empty(X.dtype(), plan.out_shape);
  if (Y.numel() == 0) return {Y};
  const int64_t N = plan.n, C = plan.c, r = plan.rank, points = plan.points, plane = plan.plane;
  const SampleMode mode = plan.mode;
  const std::vector<double> grid = to_doubles(c.input(1), w);

  const uint32_t types = mode == SampleMode::kNearest ? kAllTypes : kFloatTypes;
  dispatch(X.dtype(), types, w, [&]<class T>() {
    const T* in = X.data<T>();
    T* out = Y.data<T>();
    std::vector<std::vector<Tap>> per_axis(r);
    std::vector<Tap> combined, next;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t p = 0; p < points; ++p) {
        const bool finite =
            grid_point_taps(plan, grid.data() + (n * points + p) * r, combined, per_axis, next);
        for (int64_t ch = 0; ch < C; ++ch) {
          const T* src = in + (n * C + ch) * plane;
          T& dst = out[(n * C + ch) * points + p];
          if (!finite) {
            if constexpr (std::is_integral_v<T>)
              dst = T(0);
            else
              dst = static_cast<T>(std::numeric_limits<compute_t<T>>::quiet_NaN());
          } else if (mode == SampleMode::kNearest) {
            dst = combined.empty() ? T(0) : src[combined[0].index];  // exact for every dtype
          } else {
            double acc = 0;
            for (const Tap& t : combined)
              acc += t.weight * static_cast<double>(static_cast<compute_t<T>>(src[t.index]));
            dst = static_cast<T>(static_cast<compute_t<T>>(acc));
          }
        }
      }
  });
  return {Y};
}

// AffineGrid: grid[n, (d,) h, w] = theta[n] @ (x_w, y_h, (z_d,) 1), where each base coordinate
// spans [-1, 1] over its axis (pixel corners with align_corners, pixel centers without).
std::vector<Tensor> affine_grid(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& theta = c.input(0);
  const std::vector<int64_t> size = index_values(c.input(1), w, "size");
  if (c.input(1).rank() != 1 || (size.size() != 4 && size.size() != 5))
    throw ValueError(
        cat(w, ": size must be [N, C, H, W] or [N, C, D, H, W], got ", c.input(1).str()));
  const int64_t r = static_cast<int64_t>(size.size()) - 2;
  if (theta.rank() != 3 || theta.dim(0) != size[0] || theta.dim(1) != r || theta.dim(2) != r + 1)
    throw ValueError(
        cat(w, ": theta must be [", size[0], ", ", r, ", ", r + 1, "], got ", theta.str()));
  for (int64_t v : size)
    if (v < 0) throw ValueError(cat(w, ": size has a negative entry"));
  if (!is_floating(theta.dtype())) throw TypeError(cat(w, ": theta must be a float tensor"));
  const bool align = c.node.attr_int("align_corners") != 0;
  Dims out_shape{size[0]};
  for (int64_t k = 2; k < r + 2; ++k) out_shape.push_back(size[k]);
  out_shape.push_back(r);
  std::vector<double> out = output_buffer(out_shape, w);
  if (out.empty()) return {from_doubles(theta.dtype(), out_shape, out, w)};
  // base[k][i]: the normalized coordinate of index i along spatial axis k (D/H/W order).
  std::vector<std::vector<double>> base(r);
  for (int64_t k = 0; k < r; ++k) {
    const int64_t s = size[k + 2];
    for (int64_t i = 0; i < s; ++i) {
      // With align_corners a one-pixel axis sits at -1 (the spec's function body, which also
      // gives -1 for D; PyTorch uses 0).
      const double di = static_cast<double>(i), ds = static_cast<double>(s);
      if (align)
        base[k].push_back(s == 1 ? -1.0 : -1.0 + 2.0 * di / (ds - 1));
      else
        base[k].push_back((2.0 * di + 1) / ds - 1);
    }
  }
  const std::vector<double> th = to_doubles(theta, w);
  const Dims spatial(out_shape.begin() + 1, out_shape.end() - 1);
  const int64_t points = dims_product(spatial, 0, spatial.size());
  Dims idx(r);
  std::vector<double> homo(r + 1, 1.0);
  for (int64_t n = 0; n < size[0]; ++n)
    for (int64_t p = 0; p < points; ++p) {
      unravel(p, spatial, idx);
      // Homogeneous point in (x, y, z, 1) order: the last spatial axis first.
      for (int64_t k = 0; k < r; ++k) homo[k] = base[r - 1 - k][idx[r - 1 - k]];
      for (int64_t j = 0; j < r; ++j) {
        double acc = 0;
        for (int64_t k = 0; k <= r; ++k) acc += th[(n * r + j) * (r + 1) + k] * homo[k];
        out[(n * points + p) * r + j] = acc;
      }
    }
  return {from_doubles(theta.dtype(), out_shape, out, w)};
}

}  // namespace

int64_t AxisSampler::pixel(int64_t i) const {
  if (i >= 0 && i < size) return i;
  if (pad == PadMode::kZeros) return -1;
  if (pad == PadMode::kBorder) return std::clamp<int64_t>(i, 0, size - 1);
  const double lo = align_corners ? 0.0 : -0.5;
  const double hi = align_corners ? size - 1.0 : size - 0.5;
  return std::clamp<int64_t>(static_cast<int64_t>(reflect(static_cast<double>(i), lo, hi)), 0,
                             size - 1);
}

bool AxisSampler::taps(double n, std::vector<Tap>& out) const {
  if (!std::isfinite(n)) return false;
  const double d = static_cast<double>(size);
  double x;
  if (single) {  // matters for nearest, where a last-bit difference can flip a .5 tie
    const float f = static_cast<float>(n), fd = static_cast<float>(size);
    x = align_corners ? (f + 1) / 2 * (fd - 1) : ((f + 1) * fd - 1) / 2;
  } else {
    x = align_corners ? (n + 1) / 2 * (d - 1) : ((n + 1) * d - 1) / 2;
  }
  if (mode == SampleMode::kNearest) x = std::nearbyint(x);  // half to even, as PyTorch
  const double lo = align_corners ? 0.0 : -0.5;
  const double hi = align_corners ? d - 1 : d - 0.5;
  if (x < lo || x > hi) {
    if (pad == PadMode::kBorder) x = std::clamp(x, 0.0, d - 1);
    if (pad == PadMode::kReflection) x = reflect(x, lo, hi);
  }
  if (std::isnan(x)) return false;  // e.g. an overflow to inf, reflected
  // Past this margin every tap reads zero padding; clamping keeps the integer casts defined.
  x = std::clamp(x, -8.0, d + 8);
  auto add = [&](int64_t i, double weight) {
    const int64_t p = pixel(i);
    if (p >= 0) out.push_back({p, weight});
  };
  if (mode == SampleMode::kNearest) {
    add(static_cast<int64_t>(x), 1.0);
    return true;
  }
  const double f = std::floor(x);
  const int64_t i0 = static_cast<int64_t>(f);
  const double t = x - f;
  if (mode == SampleMode::kLinear) {
    add(i0, 1 - t);
    add(i0 + 1, t);
  } else {
    double w[4];
    cubic_weights(t, w);
    for (int k = 0; k < 4; ++k) add(i0 - 1 + k, w[k]);
  }
  return true;
}

GridSamplePlan grid_sample_plan(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  const Tensor& G = c.input(1);
  if (X.rank() < 3)
    throw ValueError(cat(w, ": X must be [N, C, spatial...] (rank >= 3), got ", X.str()));
  const int64_t r = X.rank() - 2;
  if (G.rank() != r + 2 || G.dim(0) != X.dim(0) || G.dim(-1) != r)
    throw ValueError(
        cat(w, ": grid must be [N, spatial..., ", r, "] for X ", X.str(), ", got ", G.str()));
  if (!is_floating(G.dtype())) throw TypeError(cat(w, ": grid must be a float tensor"));
  GridSamplePlan p;
  const std::string mode_name = c.node.attr_string("mode");
  if (mode_name == "nearest")
    p.mode = SampleMode::kNearest;
  else if (mode_name == "linear" || mode_name == "bilinear")
    p.mode = SampleMode::kLinear;
  else if (mode_name == "cubic" || mode_name == "bicubic")
    p.mode = SampleMode::kCubic;
  else
    throw ValueError(cat(w, ": unknown mode '", mode_name, "'"));
  const std::string pad_name = c.node.attr_string("padding_mode");
  PadMode pad;
  if (pad_name == "zeros")
    pad = PadMode::kZeros;
  else if (pad_name == "border")
    pad = PadMode::kBorder;
  else if (pad_name == "reflection")
    pad = PadMode::kReflection;
  else
    throw ValueError(cat(w, ": unknown padding_mode '", pad_name, "'"));
  const bool align = c.node.attr_int("align_corners") != 0;

  p.n = X.dim(0);
  p.c = X.dim(1);
  p.rank = r;
  p.out_shape = {p.n, p.c};
  for (int64_t k = 1; k <= r; ++k) p.out_shape.push_back(G.dim(k));
  p.points = dims_product(p.out_shape, 2, p.out_shape.size());
  if (dims_product(p.out_shape, 0, p.out_shape.size()) == 0) return p;
  const Dims in_spatial(X.shape().begin() + 2, X.shape().end());
  for (int64_t d : in_spatial)
    if (d == 0) throw ValueError(cat(w, ": cannot sample an empty input ", X.str()));
  p.in_strides = contiguous_strides(in_spatial);
  p.plane = dims_product(in_spatial, 0, in_spatial.size());
  const bool single = G.dtype() != DType::kF64;
  for (int64_t k = 0; k < r; ++k) p.axes.push_back({in_spatial[k], p.mode, pad, align, single});
  return p;
}

bool grid_point_taps(const GridSamplePlan& p, const double* coords, std::vector<Tap>& combined,
                     std::vector<std::vector<Tap>>& per_axis, std::vector<Tap>& next) {
  // The taps of every axis, then their tensor product as (plane offset, weight) pairs.
  const int64_t r = p.rank;
  bool finite = true;
  for (int64_t k = 0; k < r; ++k) {
    per_axis[k].clear();
    finite = p.axes[k].taps(coords[r - 1 - k], per_axis[k]) && finite;
  }
  combined.assign(1, {0, 1.0});
  for (int64_t k = 0; k < r && finite; ++k) {
    next.clear();
    for (const Tap& a : combined)
      for (const Tap& b : per_axis[k])
        next.push_back({a.index + b.index * p.in_strides[k], a.weight * b.weight});
    combined.swap(next);
  }
  return finite;
}

void register_image_kernels(KernelRegistry& r) {
  r.add("GridSample", grid_sample);
  r.add("AffineGrid", affine_grid);
  register_image_layout_kernels(r);
  register_image_detect_kernels(r);
}

}  // namespace pto::reference
