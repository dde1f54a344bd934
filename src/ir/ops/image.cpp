// Image op definitions: GridSample, AffineGrid, CenterCropPad, Col2Im, RoiAlign, MaxUnpool and
// NonMaxSuppression. Output shapes that come from shape-like inputs (AffineGrid's size,
// CenterCropPad's shape, Col2Im's image_shape, MaxUnpool's output_shape) are known only when
// those inputs are constants; NonMaxSuppression's row count depends on data.
#include "infer_util.h"

namespace pto {
namespace {

// Known dimension d of an input's shape, or unknown.
Dim dim_of(const InferContext& c, size_t in, size_t d) {
  if (!c.has_input(in) || !c.inputs[in].shape || d >= c.inputs[in].shape->size())
    return Dim::unknown();
  return (*c.inputs[in].shape)[d];
}

// A shape of `rank` unknown dimensions; nullopt when the rank is unknown (< 0).
std::optional<Shape> unknown_dims(int64_t rank) {
  if (rank < 0) return std::nullopt;
  return Shape(static_cast<size_t>(rank), Dim::unknown());
}

// The length of a 1-D input (its element count), or -1 when not known.
int64_t vector_length(const InferContext& c, size_t in) {
  if (!c.has_input(in) || !c.inputs[in].shape || c.inputs[in].shape->size() != 1) return -1;
  const Dim& d = c.inputs[in].shape->front();
  return d.is_known() ? d.value : -1;
}

// GridSample: Y is [N, C, grid spatial dims...] for X [N, C, ...] and grid [N, ..., r].
void infer_grid_sample(InferContext& c) {
  if (!c.has_input(0) || !c.has_input(1)) return;
  std::optional<Shape> shape;
  if (const auto& g = c.inputs[1].shape; g && g->size() >= 2) {
    shape = Shape{dim_of(c, 0, 0), dim_of(c, 0, 1)};
    if (!(*shape)[0].is_known() && !(*shape)[0].is_symbolic()) (*shape)[0] = (*g)[0];
    shape->insert(shape->end(), g->begin() + 1, g->end() - 1);
  }
  infer::set(c, 0, c.inputs[0].dtype, shape);
}

// AffineGrid: size = [N, C, H, W] gives [N, H, W, 2]; [N, C, D, H, W] gives [N, D, H, W, 3].
void infer_affine_grid(InferContext& c) {
  if (!c.has_input(0) || !c.has_input(1)) return;
  std::optional<Shape> shape;
  if (auto size = infer::constant_ints(c, 1); size && (size->size() == 4 || size->size() == 5)) {
    bool valid = true;
    for (int64_t v : *size) valid = valid && v >= 0;
    if (valid) {
      shape = Shape{(*size)[0]};
      for (size_t k = 2; k < size->size(); ++k) shape->push_back((*size)[k]);
      shape->push_back(static_cast<int64_t>(size->size()) - 2);
    }
  } else if (int64_t n = vector_length(c, 1); n == 4 || n == 5) {
    shape = unknown_dims(n);
    shape->front() = dim_of(c, 0, 0);
    shape->back() = Dim(n - 2);
  }
  infer::set(c, 0, c.inputs[0].dtype, shape);
}

void infer_center_crop_pad(InferContext& c) {
  if (!c.has_input(0) || !c.has_input(1)) return;
  const TensorType& x = c.inputs[0];
  std::optional<Shape> shape;
  if (x.shape) {
    const int64_t rank = static_cast<int64_t>(x.shape->size());
    std::vector<int64_t> axes = c.attrs().get_ints("axes", {});
    if (axes.empty())
      for (int64_t k = 0; k < rank; ++k) axes.push_back(k);
    shape = *x.shape;
    auto sizes = infer::constant_ints(c, 1);
    if (sizes && sizes->size() != axes.size()) sizes.reset();
    for (size_t i = 0; i < axes.size(); ++i) {
      const int64_t a = normalize_axis(axes[i], rank, c.where());
      (*shape)[a] = sizes && (*sizes)[i] >= 0 ? Dim((*sizes)[i]) : Dim::unknown();
    }
  }
  infer::set(c, 0, x.dtype, shape);
}

// Col2Im: [N, C * prod(block_shape), L] becomes [N, C, image_shape...].
void infer_col2im(InferContext& c) {
  if (!c.has_input(0) || !c.has_input(1) || !c.has_input(2)) return;
  std::optional<Shape> shape;
  auto image = infer::constant_ints(c, 1);
  auto block = infer::constant_ints(c, 2);
  const int64_t n = image ? static_cast<int64_t>(image->size()) : vector_length(c, 1);
  if (n >= 0) {
    shape = unknown_dims(n + 2);
    (*shape)[0] = dim_of(c, 0, 0);
    if (image)
      for (int64_t k = 0; k < n; ++k)
        if ((*image)[k] >= 0) (*shape)[k + 2] = Dim((*image)[k]);
    const Dim cb = dim_of(c, 0, 1);
    if (block && cb.is_known()) {
      int64_t prod = 1;
      for (int64_t b : *block) prod = b > 0 && prod <= (int64_t{1} << 40) ? prod * b : 0;
      if (prod > 0 && cb.value % prod == 0) (*shape)[1] = Dim(cb.value / prod);
    }
  }
  infer::set(c, 0, c.inputs[0].dtype, shape);
}

void infer_roi_align(InferContext& c) {
  if (!c.has_input(0) || !c.has_input(1)) return;
  Dim rois = dim_of(c, 1, 0);
  if (!rois.is_known() && !rois.is_symbolic()) rois = dim_of(c, 2, 0);
  Shape s{rois, dim_of(c, 0, 1), Dim(c.node.attr_int("output_height")),
          Dim(c.node.attr_int("output_width"))};
  for (size_t k = 2; k < 4; ++k)
    if (s[k].value < 0) s[k] = Dim::unknown();
  infer::set(c, 0, c.inputs[0].dtype, s);
}

// MaxUnpool: output_shape when it is a constant, else (in - 1) * stride - pads + kernel.
void infer_max_unpool(InferContext& c) {
  if (!c.has_input(0) || !c.has_input(1)) return;
  const TensorType& x = c.inputs[0];
  std::optional<Shape> shape;
  if (c.has_input(2)) {
    if (auto out = infer::constant_ints(c, 2)) {
      shape = Shape();
      for (int64_t v : *out) shape->push_back(v >= 0 ? Dim(v) : Dim::unknown());
    } else {
      shape = unknown_dims(vector_length(c, 2));
    }
  } else if (x.shape && x.shape->size() >= 3) {
    const size_t n = x.shape->size() - 2;
    const std::vector<int64_t> kernel = c.attrs().get_ints("kernel_shape", {});
    const std::vector<int64_t> strides = c.attrs().get_ints("strides", std::vector<int64_t>(n, 1));
    const std::vector<int64_t> pads = c.attrs().get_ints("pads", std::vector<int64_t>(2 * n, 0));
    shape = Shape{(*x.shape)[0], (*x.shape)[1]};
    for (size_t k = 0; k < n; ++k) {
      const Dim& d = (*x.shape)[k + 2];
      Dim out = Dim::unknown();
      auto sane = [](int64_t v, int64_t lo) { return v >= lo && v < (int64_t{1} << 31); };
      if (d.is_known() && sane(d.value, 1) && kernel.size() == n && strides.size() == n &&
          pads.size() == 2 * n && sane(kernel[k], 1) && sane(strides[k], 1) && sane(pads[k], 0) &&
          sane(pads[k + n], 0)) {
        const int64_t v = (d.value - 1) * strides[k] - pads[k] - pads[k + n] + kernel[k];
        if (v >= 0) out = Dim(v);
      }
      shape->push_back(out);
    }
  }
  infer::set(c, 0, x.dtype, shape);
}

}  // namespace

void register_image_ops(OpRegistry& r) {
  infer::add_opaque(
      r, "GridSample", 2, 2,
      {bool_attr("align_corners", false),
       {"mode", "linear", "linear, nearest or cubic (bilinear, bicubic before opset 20)"},
       {"padding_mode", "zeros", "zeros, border or reflection"}},
      infer_grid_sample,
      "samples X at the normalized coordinates of grid (nearest, N-linear or N-cubic)");
  infer::add_opaque(
      r, "AffineGrid", 2, 2, {bool_attr("align_corners", false)}, infer_affine_grid,
      "the sampling grid of an affine transform theta for an output of the given size");
  infer::add_opaque(
      r, "CenterCropPad", 2, 2, {optional_attr("axes", AttrKind::kInts, "absent: all axes")},
      infer_center_crop_pad, "center-crops or zero-pads the given axes to the given sizes");
  infer::add_opaque(
      r, "Col2Im", 3, 3,
      {optional_attr("dilations", AttrKind::kInts), optional_attr("pads", AttrKind::kInts),
       optional_attr("strides", AttrKind::kInts)},
      infer_col2im, "sums sliding blocks back into an image (fold)");
  infer::add_opaque(r, "RoiAlign", 3, 3,
                    {{"coordinate_transformation_mode", "half_pixel",
                      "opset 16+ (opset 10 behaved as output_half_pixel)"},
                     {"mode", "avg"},
                     {"output_height", int64_t{1}},
                     {"output_width", int64_t{1}},
                     {"sampling_ratio", int64_t{0}},
                     {"spatial_scale", 1.0}},
                    infer_roi_align,
                    "bilinear-sampled average or max pooling of each region of interest");
  infer::add_opaque(
      r, "MaxUnpool", 2, 3,
      {required_attr("kernel_shape", AttrKind::kInts), optional_attr("pads", AttrKind::kInts),
       optional_attr("strides", AttrKind::kInts)},
      infer_max_unpool, "scatters MaxPool values back to their indices");
  infer::add_opaque(
      r, "NonMaxSuppression", 2, 5, {{"center_point_box", int64_t{0}}},
      [](InferContext& c) {
        infer::set(c, 0, DType::kI64, Shape{Dim::unknown(), Dim(3)});
      },
      "[batch, class, box] rows of the boxes kept by greedy IoU suppression");
}

}  // namespace pto
