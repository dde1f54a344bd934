// Parameter decoders shared by shape inference, the reference kernels and the CPU kernels: one
// reading of an op's attributes (and of the inputs that replaced attributes in later opsets), so
// that every backend agrees on defaults and opset differences. window.h does the same for Conv
// and pooling. Defaults come from the op's schema (OpDef::attrs, read through Node::attr_int and
// friends); the schema pieces several ops share are here too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pto/op_registry.h"

namespace pto::params {

// ---- precision: PyPTO's mixed precision on MatMul, Gemm, Conv and Attention ----
// "bf16" ("f16"; the AutoMixedPrecision and PromoteHalf passes) rounds the two product operands
// (A and B; Conv's X and W) to bf16 (IEEE half) before the products, which accumulate in fp32;
// the value stays fp32. The ONNX exporter writes it as Cast(to=bfloat16 or float16) and
// Cast(to=float) on each operand, which means the same. On Attention both products round their
// operands: Q and K, then the unnormalized probabilities exp(s - max) and V (as PyTorch's CPU
// flash attention under autocast); the softmax and its sums stay fp32. The exporter's Casts
// round Q, K and V; the probabilities' rounding has no ONNX form (the file computes them in fp32).
//
// "bf16x3" (MatMul, Gemm and Conv; the MatMulPrecision and ConvPrecision passes, torch's
// float32 precision "high" / "tf32"): each fp32 operand x is split into a bf16 head h = bf16(x) and
// tail l = bf16(x - h), and the product sums Ah Bh + Al Bh + Ah Bl in fp32 (about 2^-16 relative
// error per product instead of fp32's 2^-24; cpu/gemm.h); a Conv's bias is added once. The
// operands and the result stay fp32.
AttrDef precision_attr();
inline constexpr const char* kSplitBf16 = "bf16x3";
// Whether `op` (default domain) has the attribute: MatMul, Gemm, Conv, Attention.
bool has_precision_attr(const std::string& op);
// Under the attribute a MatMul's or Gemm's A and B may each be float32 or stored in the
// precision's own type already (StoreHalfOperands: the rounding is then exact), and the result is
// float32. The dtype of n's result when its A is `a`: float32 under a precision, else `a`.
DType product_result_dtype(const Node& n, DType a);
// Throws TypeError unless the operand dtypes fit: equal, or under a precision each float32 or
// the precision's type (a Gemm's C stays float32).
void check_product_operands(const Node& n, DType a, DType b, const std::string& where);

// ---- Softmax, LogSoftmax, Hardmax ----
AttrDef softmax_axis_attr();
// The axis as written (not normalized): the attribute, else 1 before opset 13 and -1 from 13.
int64_t softmax_axis(const Node& n);
// Before opset 13 the input is coerced to 2-D [prod(dims < axis), prod(dims >= axis)] and
// normalized over the whole second part; from 13 over the one axis.
bool softmax_coerces_2d(const Node& n);

// ---- LayerNormalization, RMSNormalization: axis, epsilon, stash_type ----
AttrSchema norm_attrs();
struct Norm {
  int64_t axis;  // as written (normalize against the rank)
  double epsilon;
  int64_t stash_type;  // ONNX type code of the statistics
};
Norm norm(const Node& n);

// ---- Gemm ----
struct Gemm {
  double alpha;
  double beta;
  bool trans_a;
  bool trans_b;
};
Gemm gemm(const Node& n);

// ---- MatMul, Gemm: PyPTO's `precision` (AutoMixedPrecision, PromoteHalf) ----
// What the products round both operands to before accumulating in fp32: kF32 (no attribute, no
// rounding; and "bf16x3" on a MatMul, Gemm or Conv, which splits its operands instead of
// rounding them), kBF16 ("bf16") or kF16 ("f16"); nullopt for any other string.
std::optional<DType> product_precision(const Node& n);
// Whether a MatMul, Gemm or Conv sums three bf16 products of its operands' heads and tails
// ("bf16x3").
bool split_bf16_products(const Node& n);
// The attribute value for a reduced precision: "bf16" or "f16" (dtype_name).
std::string product_precision_name(DType precision);

// ---- Reduce* ----
AttrSchema reduce_attrs();
// The axes of a Reduce* node as written (not normalized): input 1 when the node has one (ReduceSum
// from opset 13, the others from 18), else the `axes` attribute. `axes_input` is input 1's
// contents when known (nullopt: the node has no input 1, or its value is not known yet).
struct Reduce {
  std::optional<std::vector<int64_t>> axes;  // nullopt: given by an input whose value is unknown
  bool keepdims;
  bool noop_with_empty_axes;  // with no axes: identity instead of reducing everything

  // Which axes of a rank-`rank` input are reduced (axes must be known): no axes means all of them
  // unless noop_with_empty_axes. Throws ValueError on an axis out of range or repeated.
  std::vector<bool> reduced(int64_t rank, const std::string& where) const;
};
Reduce reduce(const Node& n, const std::optional<std::vector<int64_t>>& axes_input);

// ---- Attention (opset 23+) ----
struct Attention {
  int64_t q_num_heads;   // 0: not given (4-D inputs carry their heads)
  int64_t kv_num_heads;  // 0: not given
  bool is_causal;
  int64_t qk_matmul_output_mode;
  double softcap;                               // 0: none
  int64_t left_window_size, right_window_size;  // -1: unbounded
  std::optional<double> scale;                  // absent: 1 / sqrt(head size)
  // PyPTO: {Q, K, V} widths when inputs 0-2 are one 3-D tensor holding Q, K and V side by side
  // on its last axis (FoldAttentionHeads); empty: three tensors, as ONNX has them.
  std::vector<int64_t> qkv_split;
  // PyPTO: the mask broadcasts to the scores by numpy's rules on every axis, its last one too (1:
  // the same for every key), where ONNX pads a shorter last axis with "masked"
  // (RecognizeAttention, for a mask whose length it cannot prove the scores').
  bool mask_broadcast = false;

  double scale_for(int64_t head_size) const;
};
Attention attention(const Node& n);

}  // namespace pto::params
