// Linear quantization ops: QuantizeLinear, DequantizeLinear (per-tensor, per-axis, blocked) and
// DynamicQuantizeLinear.
#include "infer_util.h"
#include "window.h"

namespace pto {
namespace {

// QuantizeLinear's output type: the zero point's, else output_dtype, else uint8.
void infer_quantize(InferContext& c) {
  if (!c.has_input(0)) return;
  DType dt = DType::kU8;
  if (c.has_input(2))
    dt = c.inputs[2].dtype;
  else if (c.node.attr_int("output_dtype") != 0)
    dt = dtype_from_onnx_code(c.attrs().get_int("output_dtype"), c.where());
  infer::set(c, 0, dt, c.inputs[0].shape);
}

void infer_dequantize(InferContext& c) {
  if (!c.has_input(0) || !c.has_input(1)) return;
  DType dt = c.node.attr_int("output_dtype") != 0
                 ? dtype_from_onnx_code(c.attrs().get_int("output_dtype"), c.where())
                 : c.inputs[1].dtype;
  infer::set(c, 0, dt, c.inputs[0].shape);
}

// DynamicQuantizeMatMul: A [..., K] by B [K, N] gives float [..., N].
void infer_dynamic_quantize_matmul(InferContext& c) {
  if (!c.has_input(0)) return;
  std::optional<Shape> y;
  const auto &a = c.inputs[0].shape, &b = c.has_input(1) ? c.inputs[1].shape : std::nullopt;
  if (a && b && !a->empty() && b->size() == 2) {
    y = *a;
    y->back() = (*b)[1];
  }
  infer::set(c, 0, c.inputs[0].dtype, y);
}

// MatMulNBits: A [..., K] by the N x K block-quantized weight gives A's type [..., N]
// (ir/ops/nbits.h).
void infer_mat_mul_nbits(InferContext& c) {
  if (!c.has_input(0)) return;
  std::optional<Shape> y = c.inputs[0].shape;
  if (y && !y->empty()) y->back() = Dim(c.node.attr_int("N"));
  infer::set(c, 0, c.inputs[0].dtype, y && !y->empty() ? y : std::nullopt);
}

// Quantized contractions: the output type is the output zero point's, else the input's.
DType qlinear_dtype(const InferContext& c) {
  return c.has_input(7) ? c.inputs[7].dtype : c.inputs[0].dtype;
}

void infer_qlinear_matmul(InferContext& c) {
  if (!c.has_input(0)) return;
  infer::set(c, 0, qlinear_dtype(c), std::nullopt);
}

}  // namespace

namespace {

// QuantizeLinear's and DequantizeLinear's shared attributes.
AttrSchema quantize_attrs() {
  return {{"axis", int64_t{1}, "the per-axis scale's axis"},
          {"block_size", int64_t{0}, "opset 21+: blocked quantization; 0: none"},
          {"output_dtype", int64_t{0}, "opset 21+: ONNX type code; 0: from the zero point"}};
}

}  // namespace

void register_qlinear_ops(OpRegistry& r);  // qlinear_ops.cpp: ONNX Runtime's QOperator ops

void register_quantization_ops(OpRegistry& r) {
  r.add({.name = "QLinearMatMul",
         .min_inputs = 8,
         .max_inputs = 8,
         .properties = kOpaque,
         .attrs = AttrSchema::none(),
         .infer = infer_qlinear_matmul});
  r.add({.name = "QLinearConv",
         .min_inputs = 8,
         .max_inputs = 9,
         .properties = kOpaque,
         .attrs = window::window_attrs().with({{"group", int64_t{1}}}),
         .infer = [](InferContext& c) {
           if (c.has_input(0)) infer::conv_output(c, 3, qlinear_dtype(c));
         }});
  r.add({.name = "ConvInteger",
         .min_inputs = 2,
         .max_inputs = 4,
         .properties = kOpaque,
         .attrs = window::window_attrs().with({{"group", int64_t{1}}}),
         .infer = [](InferContext& c) {
           if (c.has_input(0)) infer::conv_output(c, 1, DType::kI32);
         }});
  r.add({.name = "QuantizeLinear",
         .min_inputs = 2,
         .max_inputs = 3,
         .properties = kElementwise,
         .attrs = quantize_attrs().with(
             {bool_attr("saturate", true, "opset 19+: float8 targets saturate"),
              {"precision", int64_t{0}, "opset 23+: type code of the division; 0: the input's"}}),
         .infer = infer_quantize});
  r.add({.name = "DequantizeLinear",
         .min_inputs = 2,
         .max_inputs = 3,
         .properties = kElementwise,
         .attrs = quantize_attrs(),
         .infer = infer_dequantize});
  // ONNX Runtime's contrib op of the same name (what its transformer optimizer makes of
  // DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul), plus per-row activation scales:
  // A is quantized to uint8 on the fly (per tensor as DynamicQuantizeLinear, or per row), the
  // integer product taken exactly, and Y = float(acc) * (a_scale * b_scale[n]) + bias[n].
  r.add({.name = "DynamicQuantizeMatMul",
         .min_inputs = 3,
         .max_inputs = 5,
         .properties = kOpaque,
         .attrs = {{"per_row", int64_t{0},
                    "1: one activation scale and zero point per row of A (per token); "
                    "0: one for the whole tensor"}},
         .infer = infer_dynamic_quantize_matmul,
         .doc = "float A quantized to uint8 at run time (per tensor or row) times an 8-bit B "
                "(per-tensor or per-column scale and zero point), plus bias"});
  r.add({.name = "DynamicQuantizeLinear",
         .min_inputs = 1,
         .max_inputs = 1,
         .min_outputs = 3,
         .max_outputs = 3,
         .properties = kReduction,
         .attrs = AttrSchema::none(),
         .infer = [](InferContext& c) {
           if (!c.has_input(0)) return;
           infer::set(c, 0, DType::kU8, c.inputs[0].shape);
           infer::set(c, 1, DType::kF32, Shape{});
           infer::set(c, 2, DType::kU8, Shape{});
         }});
  // onnxruntime's contrib op (domain com.microsoft, read and written as it is): the weight stays
  // in its 2/4/8-bit blocks, multiplied in float32 (docs/precision.md "Weight-only").
  r.add({.name = "MatMulNBits",
         .min_inputs = 3,
         .max_inputs = 6,
         .properties = kOpaque,
         .attrs = {required_attr("K", AttrKind::kInt, "the inner dimension"),
                   required_attr("N", AttrKind::kInt, "the output columns"),
                   {"bits", int64_t{4}, "bits of a weight code: 2, 4 or 8"},
                   required_attr("block_size", AttrKind::kInt,
                                 "codes along K sharing one scale and zero point"),
                   {"accuracy_level", int64_t{0},
                    "the least precision A may be rounded to (0 unset, 1 f32, 2 f16, 3 bf16, 4 "
                    "int8); PyPTO computes in float32, which every level allows"}},
         .infer = infer_mat_mul_nbits,
         .doc = "com.microsoft: A times a weight of 2/4/8-bit codes in blocks along K, "
                "(code - zero_point) * scale per block, plus bias"});
  register_qlinear_ops(r);
}

}  // namespace pto
