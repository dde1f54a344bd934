// Op definitions for Resize and Upsample. The output shape is known when the scales or sizes
// are constants: floor(dim * scale), or the sizes (with keep_aspect_ratio_policy's rounding).
#include <cmath>

#include "tensor_infer.h"

namespace pto {
namespace {

// The output dims for input `in` scaled along `axes` by `scales`; unknown where in is.
Shape scaled(const Shape& in, const std::vector<int64_t>& axes, const std::vector<double>& scales) {
  Shape out = in;
  for (size_t i = 0; i < axes.size(); ++i) {
    const Dim& d = in[axes[i]];
    double o = d.is_known() ? std::floor(scales[i] * static_cast<double>(d.value)) : -1;
    out[axes[i]] = o >= 0 && o < 9.0e18 ? Dim(static_cast<int64_t>(o)) : Dim::unknown();
  }
  return out;
}

void infer_resize(InferContext& c) {
  DType dt = c.has_input(0) ? c.inputs[0].dtype : DType::kUndefined;
  std::optional<Shape> in = c.has_input(0) ? c.inputs[0].shape : std::nullopt;
  if (!in) return infer::set(c, 0, dt, std::nullopt);
  auto r = static_cast<int64_t>(in->size());
  std::vector<int64_t> axes;
  if (c.attrs().has("axes")) {
    for (int64_t a : c.attrs().get_ints("axes")) axes.push_back(normalize_axis(a, r, c.where()));
  } else {
    for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  }
  Shape unknown = *in;
  for (int64_t a : axes) unknown[a] = Dim::unknown();

  bool v10 = c.node.opset == 10;
  size_t scales_at = v10 ? 1 : 2;
  // GCC 12 warns (wrongly) about an optional<vector> here, so unpack it at once.
  std::vector<double> scales = infer::constant_floats(c, scales_at).value_or(std::vector<double>{});
  if (!scales.empty()) {
    if (scales.size() != axes.size()) return infer::set(c, 0, dt, unknown);
    return infer::set(c, 0, dt, scaled(*in, axes, scales));
  }
  std::optional<std::vector<int64_t>> sizes = v10 ? std::nullopt : infer::constant_ints(c, 3);
  if (!sizes || sizes->size() != axes.size()) return infer::set(c, 0, dt, unknown);
  std::string policy = c.node.attr_string("keep_aspect_ratio_policy");
  Shape out = *in;
  if (policy == "stretch") {
    for (size_t i = 0; i < axes.size(); ++i) out[axes[i]] = Dim((*sizes)[i]);
    return infer::set(c, 0, dt, out);
  }
  // not_larger / not_smaller: one scale for all axes, from the known input dims.
  std::optional<double> scale;
  for (size_t i = 0; i < axes.size(); ++i) {
    const Dim& d = (*in)[axes[i]];
    if (!d.is_known() || d.value == 0) return infer::set(c, 0, dt, unknown);
    double s = static_cast<double>((*sizes)[i]) / static_cast<double>(d.value);
    if (!scale)
      scale = s;
    else
      scale = policy == "not_larger" ? std::min(*scale, s) : std::max(*scale, s);
  }
  for (int64_t a : axes) {
    double o = *scale * static_cast<double>((*in)[a].value) + 0.5;
    out[a] = o < 9.0e18 ? Dim(static_cast<int64_t>(o)) : Dim::unknown();
  }
  infer::set(c, 0, dt, out);
}

void infer_upsample(InferContext& c) {
  DType dt = c.has_input(0) ? c.inputs[0].dtype : DType::kUndefined;
  std::optional<Shape> in = c.has_input(0) ? c.inputs[0].shape : std::nullopt;
  if (!in) return infer::set(c, 0, dt, std::nullopt);
  std::optional<std::vector<double>> scales;
  if (c.has_input(1))
    scales = infer::constant_floats(c, 1);
  else if (c.attrs().has("scales"))
    scales = c.attrs().get_floats("scales");
  else if (c.attrs().has("height_scale") && in->size() == 4)
    scales = {1.0, 1.0, c.attrs().get_float("height_scale"), c.attrs().get_float("width_scale")};
  std::vector<int64_t> axes;
  for (size_t i = 0; i < in->size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (!scales || scales->size() != in->size())
    return infer::set(c, 0, dt, infer::unknown_dims(in->size()));
  infer::set(c, 0, dt, scaled(*in, axes, *scales));
}

}  // namespace

void register_resize_ops(OpRegistry& r) {
  r.add({.name = "Resize",
         .min_inputs = 1,
         .max_inputs = 4,
         .properties = kOpaque,
         .attrs = {bool_attr("antialias", false, "opset 18+"),
                   optional_attr("axes", AttrKind::kInts, "opset 18+; absent: all axes"),
                   {"coordinate_transformation_mode", "half_pixel", "opset 11+"},
                   {"cubic_coeff_a", -0.75, "opset 11+"},
                   bool_attr("exclude_outside", false, "opset 11+"),
                   {"extrapolation_value", 0.0, "opset 11+"},
                   {"keep_aspect_ratio_policy", "stretch", "opset 18+"},
                   {"mode", "nearest", "nearest, linear or cubic"},
                   {"nearest_mode", "round_prefer_floor", "opset 11+"}},
         .infer = infer_resize});
  r.add({.name = "Upsample",
         .min_inputs = 1,
         .max_inputs = 2,
         .properties = kOpaque,
         .attrs = {{"mode", "nearest", "nearest, linear (bilinear in opset 1)"},
                   optional_attr("scales", AttrKind::kFloats, "opset 7-8; an input from 9"),
                   optional_attr("height_scale", AttrKind::kFloat, "opset 1"),
                   optional_attr("width_scale", AttrKind::kFloat, "opset 1")},
         .infer = infer_upsample});
}

}  // namespace pto
