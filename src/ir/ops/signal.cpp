// Signal op definitions: DFT, STFT, the Hann / Hamming / Blackman windows, MelWeightMatrix and
// Det. Complex values are real tensors with a trailing axis of 2 (real, imaginary); a trailing
// axis of 1 is a real signal. Sizes given as inputs are known only when those are constants.
#include "infer_util.h"

namespace pto {
namespace {

// The single integer of a constant input, when there is one.
std::optional<int64_t> constant_scalar(const InferContext& c, size_t in) {
  if (!c.has_input(in)) return std::nullopt;
  auto v = infer::constant_ints(c, in);
  if (!v || v->size() != 1) return std::nullopt;
  return v->front();
}

// DFT: the input with the transformed axis resized and the trailing axis 2 (or 1 for an inverse
// one-sided transform, which yields a real signal). The axis is an attribute before opset 20 and
// an input from 20 on.
void infer_dft(InferContext& c) {
  if (!c.has_input(0)) return;
  const TensorType& x = c.inputs[0];
  const bool inverse = c.node.attr_int("inverse") != 0;
  const bool onesided = c.node.attr_int("onesided") != 0;
  std::optional<Shape> shape;
  if (x.shape && x.shape->size() >= 2) {
    const int64_t rank = static_cast<int64_t>(x.shape->size());
    std::optional<int64_t> axis;
    if (c.node.opset != 0 && c.node.opset < 20)
      axis = c.node.attr_int("axis");
    else if (!c.has_input(2))
      axis = -2;
    else
      axis = constant_scalar(c, 2);
    const std::optional<int64_t> length = constant_scalar(c, 1);
    shape = *x.shape;
    shape->back() = Dim(inverse && onesided ? 1 : 2);
    if (axis) {
      const int64_t a = normalize_axis(*axis, rank, c.where());
      if (a == rank - 1) throw ValueError(cat(c.where(), ": axis cannot be the complex axis"));
      const Dim n = (*shape)[a];
      Dim out = Dim::unknown();
      if (length && *length > 0) {
        out = Dim(inverse || !onesided ? *length : *length / 2 + 1);
      } else if (c.has_input(1)) {
        out = Dim::unknown();
      } else if (!onesided) {
        out = n;
      } else if (n.is_known()) {
        out = Dim(inverse ? 2 * (n.value - 1) : n.value / 2 + 1);
      }
      (*shape)[a] = out;
    } else if (onesided || c.has_input(1)) {
      for (int64_t k = 0; k + 1 < rank; ++k) (*shape)[k] = Dim::unknown();
    }
  }
  infer::set(c, 0, x.dtype, shape);
}

// STFT: [batch, frames, bins, 2] with frames = 1 + (length - frame_length) / frame_step.
void infer_stft(InferContext& c) {
  if (!c.has_input(0)) return;
  const TensorType& x = c.inputs[0];
  Dim batch = Dim::unknown(), length = Dim::unknown();
  if (x.shape && x.shape->size() == 3) batch = (*x.shape)[0], length = (*x.shape)[1];
  std::optional<int64_t> frame = constant_scalar(c, 3);
  if (!frame && !c.has_input(3) && c.has_input(2) && c.inputs[2].shape &&
      c.inputs[2].shape->size() == 1 && c.inputs[2].shape->front().is_known())
    frame = c.inputs[2].shape->front().value;
  const std::optional<int64_t> step = constant_scalar(c, 1);
  const bool onesided = c.node.attr_int("onesided") != 0;
  Dim frames = Dim::unknown(), bins = Dim::unknown();
  if (frame && *frame > 0) {
    bins = Dim(onesided ? *frame / 2 + 1 : *frame);
    if (step && *step > 0 && length.is_known() && length.value >= *frame)
      frames = Dim(1 + (length.value - *frame) / *step);
  }
  infer::set(c, 0, x.dtype, Shape{batch, frames, bins, Dim(2)});
}

// The window ops: a vector of `size` elements in output_datatype (default f32).
void infer_window(InferContext& c) {
  const DType dt = dtype_from_onnx_code(c.node.attr_int("output_datatype"), c.where());
  const std::optional<int64_t> size = constant_scalar(c, 0);
  infer::set(c, 0, dt, Shape{size && *size >= 0 ? Dim(*size) : Dim::unknown()});
}

// MelWeightMatrix: [dft_length / 2 + 1, num_mel_bins].
void infer_mel(InferContext& c) {
  const DType dt = dtype_from_onnx_code(c.node.attr_int("output_datatype"), c.where());
  const std::optional<int64_t> bins = constant_scalar(c, 0);
  const std::optional<int64_t> length = constant_scalar(c, 1);
  infer::set(c, 0, dt,
             Shape{length && *length >= 0 ? Dim(*length / 2 + 1) : Dim::unknown(),
                   bins && *bins >= 0 ? Dim(*bins) : Dim::unknown()});
}

// Det: [..., M, M] -> [...].
void infer_det(InferContext& c) {
  if (!c.has_input(0)) return;
  const TensorType& x = c.inputs[0];
  std::optional<Shape> shape;
  if (x.shape && x.shape->size() >= 2) shape = Shape(x.shape->begin(), x.shape->end() - 2);
  infer::set(c, 0, x.dtype, shape);
}

}  // namespace

void register_signal_ops(OpRegistry& r) {
  infer::add_opaque(
      r, "DFT", 1, 3,
      {{"axis", int64_t{1}, "opset 17-19; an input from 20 (default -2)"},
       bool_attr("inverse", false),
       bool_attr("onesided", false)},
      infer_dft,
      "discrete Fourier transform along one axis; complex values as a trailing [re, im] axis");
  infer::add_opaque(r, "STFT", 2, 4, {bool_attr("onesided", true)}, infer_stft,
                    "short-time Fourier transform of windowed frames");
  infer::add_opaque(r, "HannWindow", 1, 1,
                    {{"output_datatype", int64_t{1}}, bool_attr("periodic", true)}, infer_window,
                    "sin^2(pi n / N)");
  infer::add_opaque(r, "HammingWindow", 1, 1,
                    {{"output_datatype", int64_t{1}}, bool_attr("periodic", true)}, infer_window,
                    "25/46 - 21/46 cos(2 pi n / N)");
  infer::add_opaque(r, "BlackmanWindow", 1, 1,
                    {{"output_datatype", int64_t{1}}, bool_attr("periodic", true)}, infer_window,
                    "0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)");
  infer::add_opaque(r, "MelWeightMatrix", 5, 5, {{"output_datatype", int64_t{1}}}, infer_mel,
                    "triangular mel filter bank, [dft_length / 2 + 1, num_mel_bins]");
  infer::add_opaque(r, "Det", 1, 1, AttrSchema::none(), infer_det,
                    "determinant of the square matrices in the last two axes");
}

}  // namespace pto
