// What the integer-op kernels (quant_kernels.cpp: MatMulInteger, QLinearMatMul, the linear
// quantization ops; quant_conv.cpp: ConvInteger, QLinearConv) share: reading their byte and
// scale parameters the way the reference does.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/kernel.h"

namespace pto::cpu {

inline bool is_byte(DType d) {
  return d == DType::kU8 || d == DType::kI8;
}

// The rank of an input type, or -1 when unknown.
inline int64_t rank_of(const TensorType& t) {
  return t.shape ? static_cast<int64_t>(t.shape->size()) : -1;
}

inline int32_t byte_value(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kI8 ? t.data<int8_t>()[i] : t.data<uint8_t>()[i];
}

// Every element of a uint8 / int8 tensor as int32.
std::vector<int32_t> byte_values(const Tensor& t);

// A per-column (per output channel) parameter: one value, or n values as [n] or [1, n].
bool per_column(const Tensor& t, int64_t n, bool* per_col);

// The requantization multipliers as the reference forms them: float(float(a_scale * b_scale[j]) /
// y_scale), applied in double, one per element of b_scale (a_scale and y_scale one value).
std::vector<double> requant_multipliers(const Tensor& a_scale, const Tensor& b_scale,
                                        const Tensor& y_scale);

// The exact integer sum fits int32 up to this depth (|a - za|, |b - zb| <= 255); the references
// of QLinearMatMul and QLinearConv sum in double, so a deeper product runs there.
constexpr int64_t kMaxExactK = 32768;

// ConvInteger and QLinearConv (quant_conv.cpp), registered from register_quant_kernels.
void register_quant_conv_kernels(KernelRegistry& r);

}  // namespace pto::cpu
