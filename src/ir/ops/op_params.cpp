#include "op_params.h"

#include <cmath>

namespace pto::params {

AttrDef precision_attr() {
  return optional_attr("precision", AttrKind::kString,
                       "PyPTO: \"bf16\" or \"f16\" rounds the product operands to that type "
                       "(fp32 accumulation); \"bf16x3\" (MatMul, Gemm, Conv) sums three bf16 "
                       "products of their heads and tails");
}

bool has_precision_attr(const std::string& op) {
  return op == "MatMul" || op == "Gemm" || op == "Conv" || op == "Attention";
}

DType product_result_dtype(const Node& n, DType a) {
  const std::optional<DType> p = product_precision(n);
  return p && *p != DType::kF32 ? DType::kF32 : a;
}

void check_product_operands(const Node& n, DType a, DType b, const std::string& where) {
  const std::optional<DType> p = product_precision(n);
  if (p && *p != DType::kF32) {
    auto fits = [&](DType d) { return d == DType::kF32 || d == *p; };
    if (fits(a) && fits(b)) return;
    throw TypeError(cat(where, ": operands ", dtype_name(a), " and ", dtype_name(b),
                        " of a precision=\"", dtype_name(*p), "\" product must each be f32 or ",
                        dtype_name(*p)));
  }
  if (a != b)
    throw TypeError(
        cat(where, ": A and B must share a dtype, got ", dtype_name(a), " and ", dtype_name(b)));
}

AttrDef softmax_axis_attr() {
  return {"axis", int64_t{-1}, "1 before opset 13"};
}

int64_t softmax_axis(const Node& n) {
  if (n.attrs.has("axis")) return n.attrs.get_int("axis");
  return softmax_coerces_2d(n) ? 1 : n.attr_int("axis");
}

bool softmax_coerces_2d(const Node& n) {
  return n.opset > 0 && n.opset < 13;
}

AttrSchema norm_attrs() {
  return {{"axis", int64_t{-1}, "the first normalized axis"},
          {"epsilon", 1e-5},
          {"stash_type", int64_t{1}, "ONNX type code of the statistics"}};
}

Norm norm(const Node& n) {
  return {n.attr_int("axis"), n.attr_float("epsilon"), n.attr_int("stash_type")};
}

Gemm gemm(const Node& n) {
  return {n.attr_float("alpha"), n.attr_float("beta"), n.attr_int("transA") != 0,
          n.attr_int("transB") != 0};
}

std::optional<DType> product_precision(const Node& n) {
  const std::string p = n.attrs.get_string("precision", "");
  if (p.empty()) return DType::kF32;
  if (p == product_precision_name(DType::kBF16)) return DType::kBF16;
  if (p == product_precision_name(DType::kF16)) return DType::kF16;
  if (p == kSplitBf16 && split_bf16_products(n)) return DType::kF32;
  return std::nullopt;
}

bool split_bf16_products(const Node& n) {
  return (n.op == "MatMul" || n.op == "Gemm" || n.op == "Conv") &&
         n.attrs.get_string("precision", "") == kSplitBf16;
}

std::string product_precision_name(DType precision) {
  PTO_CHECK(precision == DType::kBF16 || precision == DType::kF16)
      << "a product precision is bf16 or f16, not " << dtype_name(precision);
  return std::string(dtype_name(precision));
}

AttrSchema reduce_attrs() {
  return {optional_attr("axes", AttrKind::kInts, "before the axes input; absent: all axes"),
          bool_attr("keepdims", true),
          bool_attr("noop_with_empty_axes", false, "1: no axes means identity, not all axes")};
}

std::vector<bool> Reduce::reduced(int64_t rank, const std::string& where) const {
  PTO_CHECK(axes.has_value()) << where << ": the reduced axes are not known";
  std::vector<bool> out(static_cast<size_t>(rank), axes->empty() && !noop_with_empty_axes);
  for (int64_t a : *axes) {
    const int64_t k = normalize_axis(a, rank, where);
    if (out[static_cast<size_t>(k)])
      throw ValueError(cat(where, ": axis ", a, " is repeated in axes"));
    out[static_cast<size_t>(k)] = true;
  }
  return out;
}

Reduce reduce(const Node& n, const std::optional<std::vector<int64_t>>& axes_input) {
  Reduce r{std::nullopt, n.attr_int("keepdims") != 0, n.attr_int("noop_with_empty_axes") != 0};
  const bool has_input = n.inputs.size() > 1 && n.inputs[1] != kNoValue;
  if (!has_input)
    r.axes = n.attrs.get_ints("axes", {});
  else
    r.axes = axes_input;
  return r;
}

double Attention::scale_for(int64_t head_size) const {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(head_size));
}

Attention attention(const Node& n) {
  const Attributes& a = n.attrs;
  Attention p{a.get_int("q_num_heads", 0),     a.get_int("kv_num_heads", 0),
              n.attr_int("is_causal") != 0,    n.attr_int("qk_matmul_output_mode"),
              n.attr_float("softcap"),         n.attr_int("left_window_size"),
              n.attr_int("right_window_size"), std::nullopt,
              a.get_ints("qkv_split", {}),     a.get_int("mask_broadcast", 0) != 0};
  if (a.has("scale")) p.scale = a.get_float("scale");
  return p;
}

}  // namespace pto::params
