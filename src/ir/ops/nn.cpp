// The NN op family: convolutions and pooling here; normalizations, softmax and dropout in
// nn_norm.cpp; Gemm, MatMul, MatMulInteger and Einsum in nn_matmul.cpp; the blocked-layout ops
// in blocked_layout.cpp. All follow ONNX semantics.
#include "infer_util.h"
#include "op_params.h"
#include "window.h"

namespace pto {

void register_nn_norm_ops(OpRegistry& r);         // nn_norm.cpp
void register_nn_matmul_ops(OpRegistry& r);       // nn_matmul.cpp
void register_blocked_layout_ops(OpRegistry& r);  // blocked_layout.cpp (the blocked-channel layout)

namespace {

// The kernel's spatial sizes: the kernel_shape attribute, else the trailing dims of W (input
// w_input) when all known.
std::optional<Dims> kernel_of(const InferContext& c, size_t rank, bool from_weight,
                              size_t w_input = 1) {
  if (c.attrs().has("kernel_shape")) return c.attrs().get_ints("kernel_shape");
  if (!from_weight || !c.has_input(w_input) || !c.inputs[w_input].shape) return std::nullopt;
  const Shape& w = *c.inputs[w_input].shape;
  if (w.size() != rank + 2) return std::nullopt;
  Dims k;
  for (size_t i = 2; i < w.size(); ++i) {
    if (!w[i].is_known()) return std::nullopt;
    k.push_back(w[i].value);
  }
  return k;
}

// [N, channels, out...] for a Conv/pool over x, or nullopt when x's rank is unknown.
std::optional<Shape> forward_shape(const InferContext& c, Dim channels, bool from_weight,
                                   bool pooling, size_t w_input = 1) {
  const std::optional<Shape>& x = c.input(0).shape;
  if (!x) return std::nullopt;
  if (x->size() < 3)
    throw ValueError(
        cat(c.where(), ": input must have rank >= 3 ([N, C, spatial...]), got ", shape_str(*x)));
  const size_t rank = x->size() - 2;
  Shape y = {(*x)[0], channels};
  std::optional<Dims> kernel = kernel_of(c, rank, from_weight, w_input);
  if (kernel && kernel->size() != rank)
    throw ValueError(cat(c.where(), ": kernel_shape ", dims_str(*kernel), " does not match ", rank,
                         " spatial axes"));
  std::optional<window::Params> p;
  if (kernel) p = window::read_params(c.attrs(), *kernel, pooling, c.where());
  for (size_t i = 0; i < rank; ++i) {
    const Dim& d = (*x)[i + 2];
    if (p && d.is_known())
      y.push_back(window::forward_axis(*p, i, d.value, c.where()).out);
    else
      y.push_back(Dim::unknown());
  }
  return y;
}

void infer_conv(InferContext& c) {
  if (!c.has_input(0)) return;
  infer::conv_output(c, 1, c.inputs[0].dtype);
}

// DeformConv: Y [N, W's oC, offset's spatial dims] (the offsets are given per output position).
void infer_deform_conv(InferContext& c) {
  if (!c.has_input(0)) return;
  const std::optional<Shape>& x = c.inputs[0].shape;
  std::optional<Shape> y;
  if (x && x->size() >= 3) {
    y = Shape{(*x)[0], Dim::unknown()};
    if (c.has_input(1) && c.inputs[1].shape && !c.inputs[1].shape->empty())
      (*y)[1] = (*c.inputs[1].shape)[0];
    const std::optional<Shape>& off = c.has_input(2) ? c.inputs[2].shape : std::nullopt;
    for (size_t i = 2; i < x->size(); ++i)
      y->push_back(off && off->size() == x->size() ? (*off)[i] : Dim::unknown());
  }
  infer::set(c, 0, c.inputs[0].dtype, y);
}

void infer_conv_transpose(InferContext& c) {
  if (!c.has_input(0)) return;
  const std::optional<Shape>& x = c.inputs[0].shape;
  std::optional<Shape> y;
  if (x && x->size() >= 3) {
    const size_t rank = x->size() - 2;
    const int64_t group = c.node.attr_int("group");
    Dim m = Dim::unknown();
    if (c.has_input(1) && c.inputs[1].shape && c.inputs[1].shape->size() == rank + 2 &&
        (*c.inputs[1].shape)[1].is_known() && group > 0)
      m = (*c.inputs[1].shape)[1].value * group;
    y = Shape{(*x)[0], m};
    Dims out_shape = c.attrs().get_ints("output_shape", {});
    if (out_shape.size() > rank) out_shape.erase(out_shape.begin(), out_shape.end() - rank);
    std::optional<Dims> kernel = kernel_of(c, rank, true);
    std::optional<window::Params> p;
    if (kernel && kernel->size() == rank)
      p = window::read_params(c.attrs(), *kernel, false, c.where());
    Dims opad = c.attrs().get_ints("output_padding", Dims(rank, 0));
    for (size_t i = 0; i < rank; ++i) {
      const Dim& d = (*x)[i + 2];
      if (out_shape.size() == rank)
        y->push_back(out_shape[i]);
      else if (p && d.is_known() && opad.size() == rank)
        y->push_back(window::transpose_axis(*p, i, d.value, opad[i], -1, c.where()).out);
      else
        y->push_back(Dim::unknown());
    }
  }
  infer::set(c, 0, c.inputs[0].dtype, y);
}

void infer_pool(InferContext& c) {
  if (!c.has_input(0)) return;
  const std::optional<Shape>& x = c.inputs[0].shape;
  std::optional<Shape> y;
  if (x && x->size() >= 2) y = forward_shape(c, (*x)[1], false, true);
  infer::set(c, 0, c.inputs[0].dtype, y);
  if (c.outputs.size() > 1) infer::set(c, 1, DType::kI64, y);
}

void infer_global_pool(InferContext& c) {
  if (!c.has_input(0)) return;
  std::optional<Shape> y = c.inputs[0].shape;
  if (y) {
    if (y->size() < 2)
      throw ValueError(cat(c.where(), ": input must have rank >= 2, got ", shape_str(*y)));
    for (size_t i = 2; i < y->size(); ++i) (*y)[i] = 1;
  }
  infer::set(c, 0, c.inputs[0].dtype, y);
}

}  // namespace

void infer::conv_output(InferContext& c, size_t w_input, DType dtype) {
  Dim m = Dim::unknown();
  if (c.has_input(w_input) && c.inputs[w_input].shape && !c.inputs[w_input].shape->empty())
    m = (*c.inputs[w_input].shape)[0];
  infer::set(c, 0, dtype, forward_shape(c, m, true, false, w_input));
}

void register_nn_ops(OpRegistry& r) {
  r.add({.name = "Conv",
         .min_inputs = 2,
         .max_inputs = 3,
         .properties = kOpaque,
         .attrs = window::window_attrs().with({{"group", int64_t{1}}, params::precision_attr()}),
         .infer = infer_conv,
         .doc = "N-D convolution with groups, dilations, strides, pads / auto_pad and bias"});
  r.add({.name = "DeformConv",
         .min_inputs = 3,
         .max_inputs = 5,
         .properties = kOpaque,
         .attrs = {optional_attr("dilations", AttrKind::kInts, "absent: 1 per spatial axis"),
                   {"group", int64_t{1}},
                   optional_attr("kernel_shape", AttrKind::kInts, "absent: from W"),
                   {"offset_group", int64_t{1}},
                   optional_attr("pads", AttrKind::kInts, "absent: 0"),
                   optional_attr("strides", AttrKind::kInts, "absent: 1 per spatial axis")},
         .infer = infer_deform_conv,
         .doc = "convolution whose taps sample the input at learned offsets (bilinear, zero "
                "outside), times an optional mask per tap"});
  r.add({.name = "ConvTranspose",
         .min_inputs = 2,
         .max_inputs = 3,
         .properties = kOpaque,
         .attrs = window::window_attrs().with(
             {{"group", int64_t{1}},
              optional_attr("output_padding", AttrKind::kInts, "absent: 0 per spatial axis"),
              optional_attr("output_shape", AttrKind::kInts, "absent: from pads")}),
         .infer = infer_conv_transpose,
         .doc = "transposed convolution (output_padding, output_shape, groups, dilations)"});
  r.add({.name = "MaxPool",
         .min_inputs = 1,
         .max_inputs = 1,
         .min_outputs = 1,
         .max_outputs = 2,
         .properties = kOpaque,
         .attrs =
             window::pool_attrs().with({{"storage_order", int64_t{0}, "1: Indices column-major"}}),
         .infer = infer_pool,
         .doc = "max over sliding windows; optional flat argmax Indices"});
  r.add({.name = "AveragePool",
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kOpaque,
         .attrs = window::pool_attrs().with({bool_attr("count_include_pad", false)}),
         .infer = infer_pool});
  // LpPool-1 took a float p; it is read as an int (opset 2+), so such a node is rejected.
  r.add({.name = "LpPool",
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kOpaque,
         .attrs = window::pool_attrs().with({{"p", int64_t{2}}}),
         .infer = infer_pool});
  for (const char* name : {"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})
    r.add({.name = name,
           .min_inputs = 1,
           .max_inputs = 1,
           .properties = kReduction,
           .attrs = std::string_view(name) == "GlobalLpPool" ? AttrSchema{{"p", int64_t{2}}}
                                                             : AttrSchema::none(),
           .infer = infer_global_pool});
  register_nn_norm_ops(r);
  register_nn_matmul_ops(r);
  register_blocked_layout_ops(r);
}

}  // namespace pto
