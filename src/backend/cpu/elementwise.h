// Vector loops behind the elementwise CPU kernels (elementwise.cpp) and the GEMM epilogue: each
// runs on the calling thread with the active ISA's vectors (elementwise_impl.h, compiled per ISA).
// Strides are 0 (a broadcast scalar) or 1 (contiguous); the kernels reduce numpy broadcasting to
// rows of this form.
#pragma once

#include <cstdint>

namespace pto::cpu {

// X(name): every float32 unary op. Results match the reference kernel of the same ONNX op exactly
// where the op is exact (Relu, Abs, Floor, Sqrt, ...) and within a few ulp otherwise.
// clang-format off
#define PTO_UNARY_OPS(X) \
  X(Identity) \
  X(Relu) \
  X(LeakyRelu) \
  X(Clip) \
  X(ThresholdedRelu) \
  X(Sigmoid) \
  X(HardSigmoid) \
  X(HardSwish) \
  X(Tanh) \
  X(Exp) \
  X(Expm1) \
  X(Log) \
  X(Log1p) \
  X(Erf) \
  X(Sqrt) \
  X(Reciprocal) \
  X(Neg) \
  X(Abs) \
  X(Sign) \
  X(Floor) \
  X(Ceil) \
  X(Round) \
  X(Square) \
  X(Gelu) \
  X(GeluTanh) \
  X(Silu) \
  X(Swish) \
  X(Softplus) \
  X(Softsign) \
  X(Mish) \
  X(Elu) \
  X(Selu) \
  X(Celu) \
  X(PowHalf) \
  X(Sin) \
  X(Cos) \
  X(Shrink) \
  X(Atan)
// clang-format on

enum class UnaryOp {
#define PTO_ENUM(name) k##name,
  PTO_UNARY_OPS(PTO_ENUM)
#undef PTO_ENUM
};

// PowHalf is pow(x, 0.5): sqrt, except -0 -> +0 and -inf -> +inf.
// Attribute values an op reads: LeakyRelu/Elu/Celu/ThresholdedRelu/Swish alpha in a; Clip's
// bounds in a (lo) and b (hi); HardSigmoid alpha, beta; Selu alpha, gamma; Shrink lambd, bias.
struct UnaryParams {
  float a = 0.0f, b = 0.0f;
};

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kMax, kMin };
enum class CompareOp { kEqual, kLess, kLessOrEqual, kGreater, kGreaterOrEqual };

// y[i] = op(x[i]), i < n.
void unary_f32(UnaryOp op, const UnaryParams& p, const float* x, float* y, int64_t n);
// y[i] = op(a[i * sa], b[i * sb]). Max/Min propagate NaN.
void binary_f32(BinaryOp op, const float* a, int64_t sa, const float* b, int64_t sb, float* y,
                int64_t n);
void compare_f32(CompareOp op, const float* a, int64_t sa, const float* b, int64_t sb, bool* y,
                 int64_t n);
// y[i] = c[i * sc] ? a[i * sa] : b[i * sb] on 32-bit elements of any type (bits are copied).
void where_b32(const bool* c, int64_t sc, const float* a, int64_t sa, const float* b, int64_t sb,
               float* y, int64_t n);

// IEEE half (as bits) <-> float, to nearest even, with inf, NaN and subnormals: F16C's VCVTPH2PS
// and VCVTPS2PH where has_ext(Ext::kF16c), else pto::Float16 element by element (the same values;
// a NaN stays a NaN, its payload may differ). round_to_f16: x[i] = float(Float16(x[i])) in place
// (the operands of fp16 products).
void f16_to_f32(const uint16_t* x, float* y, int64_t n);
void f32_to_f16(const float* x, uint16_t* y, int64_t n);
void round_to_f16(float* x, int64_t n);
// bf16 (as bits) <-> float the same way, with pto::BFloat16's rounding (to nearest even, NaN stays
// a quiet NaN), vectorized on every ISA. round_to_bf16: x[i] = float(BFloat16(x[i])) in place.
void bf16_to_f32(const uint16_t* x, float* y, int64_t n);
void f32_to_bf16(const float* x, uint16_t* y, int64_t n);
void round_to_bf16(float* x, int64_t n);

}  // namespace pto::cpu
