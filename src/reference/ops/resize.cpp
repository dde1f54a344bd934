// Reference kernels for Resize (opsets 10-19+) and Upsample (opsets 1-9).
//
// Interpolation is separable: the input is resized one axis at a time, in double precision, as
// the ONNX reference implementation does. For each output index along an axis, a coordinate
// transform gives the source coordinate x; the kernel (nearest, linear, cubic, optionally
// antialiased) gives n weights for the n source indices nearest to x; indices outside the input
// are clamped to its edge (or dropped with exclude_outside). The result is rounded back to the
// input dtype, saturating.
#include <algorithm>
#include <cmath>

#include "cast.h"
#include "resize_plan.h"
#include "tensor_kernels.h"

namespace pto::reference {
namespace {

// The weights of the n source pixels around x (ratio = x - floor(x), or 1 when x is whole).
std::vector<double> coefficients(const ResizeParams& p, double ratio, double scale) {
  if (p.mode == "nearest") {
    if (ratio == 1.0) return {0, 1};
    std::string m = p.nearest;
    if (m == "simple") m = scale < 1.0 ? "ceil" : "floor";
    if (m == "round_prefer_floor") return {double(ratio <= 0.5), double(ratio > 0.5)};
    if (m == "round_prefer_ceil") return {double(ratio < 0.5), double(ratio >= 0.5)};
    if (m == "floor") return {1, 0};
    return {0, 1};  // ceil
  }
  double s = std::min(scale, 1.0);
  std::vector<double> w;
  if (p.mode == "linear") {
    if (!p.antialias) return {1 - ratio, ratio};
    // A triangle filter stretched by 1/scale when downsampling.
    auto start = static_cast<int64_t>(std::floor(-1.0 / s) + 1);
    for (int64_t i = start; i < start + 2 - 2 * start; ++i)
      w.push_back(std::clamp(1.0 - std::fabs((static_cast<double>(i) - ratio) * s), 0.0, 1.0));
  } else {
    double a = p.cubic_a;
    if (!p.antialias) {
      double r = ratio, q = 1 - ratio;
      return {((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
              ((a + 2) * r - (a + 3)) * r * r + 1, ((a + 2) * q - (a + 3)) * q * q + 1,
              ((a * (q + 1) - 5 * a) * (q + 1) + 8 * a) * (q + 1) - 4 * a};
    }
    auto cubic = [a](double x) {
      x = std::fabs(x);
      if (x <= 1) return (a + 2) * x * x * x - (a + 3) * x * x + 1;
      if (x < 2) return a * x * x * x - 5 * a * x * x + 8 * a * x - 4 * a;
      return 0.0;
    };
    auto start = static_cast<int64_t>(std::floor(-2.0 / s) + 1);
    for (int64_t i = start; i < 2 - start; ++i)
      w.push_back(cubic(s * (static_cast<double>(i) - ratio)));
  }
  double sum = 0;
  for (double v : w) sum += v;
  for (double& v : w) v /= sum;
  return w;
}

// The source coordinate of output index y along an axis of `in` pixels resized to `out`.
double source_coordinate(const ResizeParams& p, double y, double scale, int64_t in, int64_t out,
                         double roi_start, double roi_end) {
  // Fractional for non-integer scales, as in the ONNX reference and the backend tests;
  // onnxruntime uses the integer output length for align_corners and tf_crop_and_resize.
  double out_width = scale * static_cast<double>(in);
  double last = static_cast<double>(in - 1);
  const std::string& m = p.coord;
  if (m == "align_corners") return out_width == 1 ? 0.0 : y * last / (out_width - 1);
  if (m == "asymmetric") return y / scale;
  if (m == "tf_crop_and_resize") {
    double x = out_width == 1 ? (roi_end - roi_start) * last / 2
                              : y * (roi_end - roi_start) * last / (out_width - 1);
    return x + roi_start * last;
  }
  if (m == "pytorch_half_pixel") return out_width == 1 ? -0.5 : (y + 0.5) / scale - 0.5;
  if (m == "half_pixel_symmetric") {
    double adjustment = static_cast<double>(out) / out_width;
    double offset = static_cast<double>(in) / 2 * (1 - adjustment);
    return offset + (y + 0.5) / scale - 0.5;
  }
  if (m == "tf_half_pixel_for_nn") return (y + 0.5) / scale;
  return (y + 0.5) / scale - 0.5;  // half_pixel
}

}  // namespace

ResizeTaps resize_taps(const ResizeParams& p, int64_t in, int64_t out, double scale,
                       double roi_start, double roi_end, const std::string& where) {
  if (in == 0 && out > 0)
    throw ValueError(cat(where, ": cannot resize an axis of size 0 to ", out));
  if (p.antialias && scale < 1.0 / (1 << 20))
    throw ValueError(cat(where, ": antialiasing a downscale by ", scale, " is not supported"));
  ResizeTaps t;
  t.in = in;
  t.out = out;
  for (int64_t o = 0; o < out; ++o) {
    double x = source_coordinate(p, static_cast<double>(o), scale, in, out, roi_start, roi_end);
    if (std::isnan(x)) throw ValueError(cat(where, ": the scale gives an invalid coordinate"));
    bool extrapolate =
        p.coord == "tf_crop_and_resize" && (x < 0 || x > static_cast<double>(in - 1));
    x = std::clamp(x, -1e15, 1e15);  // far outside, every source index is clamped anyway
    double xi = std::floor(x);
    std::vector<double> w = coefficients(p, x == xi ? 1.0 : x - xi, scale);
    auto n = static_cast<int64_t>(w.size());
    if (o == 0) t.n = n;
    PTO_CHECK(n == t.n) << "resize_taps: " << n << " taps after " << t.n;
    // The n indices nearest x, ties to the smaller one (the reference's edge-padded window).
    int64_t pad = (n + 1) / 2;
    double xp = x + static_cast<double>(pad);
    double pf = std::floor(xp), frac = xp - pf;
    int64_t off = n % 2 == 0 ? (frac == 0 ? -(n / 2) : -(n / 2) + 1)
                             : (frac <= 0.5 ? -((n - 1) / 2) : -((n - 1) / 2) + 1);
    int64_t first = static_cast<int64_t>(pf) + off - pad;
    std::vector<int64_t> idx(n);
    for (int64_t j = 0; j < n; ++j) idx[j] = first + j;
    if (p.exclude_outside) {
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        if (idx[j] < 0 || idx[j] >= in) w[j] = 0;
        sum += w[j];
      }
      if (sum != 0)
        for (double& v : w) v /= sum;
    }
    for (int64_t& i : idx) i = std::clamp<int64_t>(i, 0, in - 1);
    t.index.insert(t.index.end(), idx.begin(), idx.end());
    t.weight.insert(t.weight.end(), w.begin(), w.end());
    t.extrapolate.push_back(extrapolate);
  }
  return t;
}

namespace {

// Resizes `data` (shape `shape`, doubles) along `axis` to `out` pixels, in place.
void resize_axis(std::vector<double>& data, Dims& shape, int64_t axis, int64_t out, double scale,
                 double roi_start, double roi_end, const ResizeParams& p,
                 const std::string& where) {
  int64_t in = shape[axis];
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < axis; ++k) outer *= shape[k];
  for (size_t k = axis + 1; k < shape.size(); ++k) inner *= shape[k];
  int64_t count = checked_numel({outer, out, inner}, "[Resize] output");
  if (static_cast<uint64_t>(count) > max_tensor_bytes() / sizeof(double))
    throw ValueError(cat(where, ": resizing axis ", axis, " to ", out, " needs ", count,
                         " intermediate values, more than the memory limit allows"));
  if (in == 0 && out > 0)
    throw ValueError(cat(where, ": cannot resize axis ", axis, " of size 0 to ", out));
  std::vector<double> result(static_cast<size_t>(count));
  shape[axis] = out;
  if (result.empty()) {  // nothing to compute (and `out` alone may be huge)
    data = std::move(result);
    return;
  }
  const ResizeTaps t = resize_taps(p, in, out, scale, roi_start, roi_end, where);
  const bool nearest = p.mode == "nearest";
  for (int64_t o = 0; o < out; ++o) {
    const int64_t* idx = t.index.data() + o * t.n;
    const double* w = t.weight.data() + o * t.n;
    for (int64_t b = 0; b < outer; ++b)
      for (int64_t k = 0; k < inner; ++k) {
        double acc = 0;
        if (t.extrapolate[o]) {
          acc = p.extrapolation;
        } else {
          // Nearest selects its one tap of weight 1: the other's 0 times an inf or NaN
          // neighbour must not reach the result (PyTorch and ONNX Runtime copy the value).
          for (int64_t j = 0; j < t.n; ++j)
            if (!nearest || w[j] != 0) acc += w[j] * data[(b * in + idx[j]) * inner + k];
        }
        result[(b * out + o) * inner + k] = acc;
      }
  }
  data = std::move(result);
}

// Rounds back to T as the ONNX reference's saturate_cast does: integers round half to even and
// clamp; floats clamp finite values to the finite range (a cubic overshoot) but keep an input's
// infinities and NaNs, as ONNX Runtime and PyTorch do.
template <class T>
T saturate(double v) {
  if constexpr (std::is_same_v<T, bool>) {
    return std::nearbyint(v) != 0;
  } else if constexpr (std::is_integral_v<T>) {
    return cast_value<T>(std::nearbyint(v));
  } else {
    double hi = static_cast<double>(static_cast<compute_t<T>>(std::numeric_limits<T>::max()));
    if constexpr (std::is_same_v<T, Float16>) hi = 65504.0;
    if constexpr (std::is_same_v<T, BFloat16>) hi = 3.3895313892515355e38;
    return cast_value<T>(std::isfinite(v) ? std::clamp(v, -hi, hi) : v);
  }
}

// Resizes x to `out` along each axis of `order`, with per-axis scales and roi (start, end).
Tensor interpolate(const Tensor& x, const Dims& out, const std::vector<double>& scales,
                   const std::vector<double>& roi, const std::vector<int64_t>& order,
                   const ResizeParams& p, const std::string& where) {
  check_output_dims(out, where);
  int64_t r = x.rank();
  std::vector<double> data = to_doubles(x, where);
  Dims shape = x.shape();
  for (int64_t a : order) {
    double rs = roi.empty() ? 0.0 : roi[a], re = roi.empty() ? 1.0 : roi[r + a];
    if (!is_identity_axis(p, shape[a], out[a], scales[a], rs, re))
      resize_axis(data, shape, a, out[a], scales[a], rs, re, p, where);
  }
  Tensor y = Tensor::empty(x.dtype(), out);
  dispatch(x.dtype(), kAllTypes, where, [&]<class T>() {
    T* dst = y.data<T>();
    for (int64_t i = 0; i < y.numel(); ++i) dst[i] = saturate<T>(data[i]);
  });
  return y;
}

std::vector<double> floats_of(const Tensor& t, const std::string& where) {
  if (!is_floating(t.dtype()))
    throw TypeError(cat(where, ": expected a float tensor, got ", t.str()));
  return to_doubles(t, where);
}

void check_scale(double s, const std::string& where) {
  if (!(s > 0) || !std::isfinite(s))
    throw ValueError(cat(where, ": scales must be positive and finite, got ", s));
}

}  // namespace

bool is_identity_axis(const ResizeParams& p, int64_t in, int64_t out, double scale,
                      double roi_start, double roi_end) {
  return std::fabs(scale - 1.0) <= 1e-9 && out == in &&
         (p.coord != "tf_crop_and_resize" ||
          (std::fabs(roi_start) <= 1e-9 && std::fabs(roi_end - 1.0) <= 1e-9));
}

ResizePlan resize_plan(const KernelContext& c) {
  const Tensor& x = c.input(0);
  int64_t r = x.rank();
  bool v10 = c.node.opset == 10;
  ResizeParams p;
  const Attributes& at = c.attrs();
  p.mode = c.node.attr_string("mode");
  if (p.mode != "nearest" && p.mode != "linear" && p.mode != "cubic")
    throw ValueError(cat(c.where(), ": unknown mode '", p.mode, "'"));
  p.coord = at.get_string("coordinate_transformation_mode", v10 ? "asymmetric" : "half_pixel");
  static const char* kCoords[] = {
      "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",  "align_corners",
      "asymmetric", "tf_crop_and_resize",   "tf_half_pixel_for_nn"};
  if (std::none_of(std::begin(kCoords), std::end(kCoords),
                   [&](const char* m) { return p.coord == m; }))
    throw ValueError(cat(c.where(), ": unknown coordinate_transformation_mode '", p.coord, "'"));
  p.nearest = at.get_string("nearest_mode", v10 ? "simple" : "round_prefer_floor");
  if (p.nearest != "round_prefer_floor" && p.nearest != "round_prefer_ceil" &&
      p.nearest != "floor" && p.nearest != "ceil" && p.nearest != "simple")
    throw ValueError(cat(c.where(), ": unknown nearest_mode '", p.nearest, "'"));
  p.cubic_a = c.node.attr_float("cubic_coeff_a");
  p.exclude_outside = c.node.attr_int("exclude_outside") != 0;
  p.extrapolation = c.node.attr_float("extrapolation_value");
  p.antialias = c.node.attr_int("antialias") != 0 && p.mode != "nearest";
  std::string policy = c.node.attr_string("keep_aspect_ratio_policy");
  if (policy != "stretch" && policy != "not_larger" && policy != "not_smaller")
    throw ValueError(cat(c.where(), ": unknown keep_aspect_ratio_policy '", policy, "'"));

  // The resized axes, in the order they are processed.
  std::vector<int64_t> axes;
  if (at.has("axes")) {
    std::vector<bool> seen(r, false);
    for (int64_t a : at.get_ints("axes")) {
      int64_t n = normalize_axis(a, r, c.where());
      if (seen[n]) throw ValueError(cat(c.where(), ": axis ", a, " is repeated"));
      seen[n] = true;
      axes.push_back(n);
    }
  } else {
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  }
  auto k = static_cast<int64_t>(axes.size());

  Tensor roi_t, scales_t, sizes_t;
  if (v10) {
    scales_t = c.input(1);
  } else {
    if (c.has_input(1)) roi_t = c.input(1);
    if (c.has_input(2) && c.input(2).numel() > 0) scales_t = c.input(2);
    if (c.has_input(3) && c.input(3).numel() > 0) sizes_t = c.input(3);
  }
  if (scales_t.defined() == sizes_t.defined())
    throw ValueError(cat(c.where(), ": exactly one of scales and sizes must be given"));

  std::vector<double> scales(r, 1.0);
  Dims out = x.shape();
  if (scales_t.defined()) {
    std::vector<double> s = floats_of(scales_t, c.where());
    if (static_cast<int64_t>(s.size()) != k)
      throw ValueError(cat(c.where(), ": ", s.size(), " scales for ", k, " axes"));
    for (int64_t i = 0; i < k; ++i) {
      check_scale(s[i], c.where());
      double o = std::floor(s[i] * static_cast<double>(x.shape()[axes[i]]));
      if (o > 9.0e18) throw ValueError(cat(c.where(), ": scale ", s[i], " is too large"));
      scales[axes[i]] = s[i];
      out[axes[i]] = static_cast<int64_t>(o);
    }
  } else {
    std::vector<int64_t> s = to_int64s(sizes_t, c.where());
    if (static_cast<int64_t>(s.size()) != k)
      throw ValueError(cat(c.where(), ": ", s.size(), " sizes for ", k, " axes"));
    for (int64_t i = 0; i < k; ++i) {
      int64_t in = x.shape()[axes[i]];
      if (s[i] < 0) throw ValueError(cat(c.where(), ": negative size ", s[i]));
      if (in == 0 && s[i] > 0)
        throw ValueError(cat(c.where(), ": cannot resize axis ", axes[i], " of size 0"));
      scales[axes[i]] = in == 0 ? 1.0 : static_cast<double>(s[i]) / static_cast<double>(in);
      out[axes[i]] = s[i];
    }
    if (policy != "stretch") {
      double scale = scales[axes[0]];
      for (int64_t a : axes)
        scale = policy == "not_larger" ? std::min(scale, scales[a]) : std::max(scale, scales[a]);
      for (int64_t a : axes) {
        scales[a] = scale;
        double o = scale * static_cast<double>(x.shape()[a]) + 0.5;
        if (o > 9.0e18) throw ValueError(cat(c.where(), ": output size is too large"));
        out[a] = static_cast<int64_t>(o);
      }
    }
  }

  std::vector<double> roi;  // [starts..., ends...] over all r axes
  if (p.coord == "tf_crop_and_resize") {
    if (!roi_t.defined() || roi_t.numel() == 0)
      throw ValueError(cat(c.where(), ": tf_crop_and_resize needs roi"));
    std::vector<double> given = floats_of(roi_t, c.where());
    if (static_cast<int64_t>(given.size()) != 2 * k)
      throw ValueError(cat(c.where(), ": roi has ", given.size(), " values for ", k, " axes"));
    roi.assign(r, 0.0);
    roi.resize(2 * r, 1.0);
    for (int64_t i = 0; i < k; ++i) {
      roi[axes[i]] = given[i];
      roi[r + axes[i]] = given[k + i];
    }
  }
  check_output_dims(out, c.where());
  return {p, out, scales, roi, axes};
}

// Upsample: nearest or (bi)linear with asymmetric coordinates; scales as attribute (opset 7),
// input (opset 9) or height_scale/width_scale on NCHW (opset 1).
ResizePlan upsample_plan(const KernelContext& c) {
  const Tensor& x = c.input(0);
  int64_t r = x.rank();
  ResizeParams p;
  p.mode = c.node.attr_string("mode");
  if (p.mode == "bilinear") p.mode = "linear";
  if (p.mode != "nearest" && p.mode != "linear")
    throw ValueError(cat(c.where(), ": unknown mode '", p.mode, "'"));
  p.coord = "asymmetric";
  p.nearest = "simple";
  std::vector<double> scales;
  if (c.has_input(1)) {
    scales = floats_of(c.input(1), c.where());
  } else if (c.attrs().has("scales")) {
    scales = c.attrs().get_floats("scales");
  } else if (c.attrs().has("height_scale") && r == 4) {
    scales = {1.0, 1.0, c.attrs().get_float("height_scale"), c.attrs().get_float("width_scale")};
  } else {
    throw ValueError(cat(c.where(), ": scales are required"));
  }
  if (static_cast<int64_t>(scales.size()) != r)
    throw ValueError(cat(c.where(), ": ", scales.size(), " scales for ", x.str()));
  Dims out(r);
  std::vector<int64_t> axes;
  for (int64_t i = 0; i < r; ++i) {
    check_scale(scales[i], c.where());
    double o = std::floor(scales[i] * static_cast<double>(x.shape()[i]));
    if (o > 9.0e18) throw ValueError(cat(c.where(), ": scale ", scales[i], " is too large"));
    out[i] = static_cast<int64_t>(o);
    axes.push_back(i);
  }
  check_output_dims(out, c.where());
  return {p, out, scales, {}, axes};
}

namespace {

std::vector<Tensor> resize_kernel(const KernelContext& c) {
  const ResizePlan r = c.node.op == "Upsample" ? upsample_plan(c) : resize_plan(c);
  return {interpolate(c.input(0), r.out, r.scales, r.roi, r.order, r.params, c.where())};
}

}  // namespace

void register_resize_kernels(KernelRegistry& r) {
  r.add("Resize", resize_kernel);
  r.add("Upsample", resize_kernel);
}

}  // namespace pto::reference
