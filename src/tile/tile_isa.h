// The tile instruction set (level 3 of DESIGN.md): what one instruction of a TileProgram is. Plain
// data without standard containers, so that the per-ISA executors (src/backend/cpu/tile_exec_*)
// can include it. Registers hold one tile of float32 values; a tile is a contiguous run of the
// output's flattened index space (a piece of a row, or several whole rows), at most the executor's
// tile capacity long. Boolean values live in registers as 1.0f / 0.0f.
#pragma once

#include <cstdint>

namespace pto {

// X(enum name, printed name). Params: LeakyRelu/Elu/Celu/ThresholdedRelu/Swish alpha in imm0;
// HardSigmoid alpha, beta; Selu alpha, gamma; Shrink lambd, bias in imm0, imm1. PowHalf is pow(x,
// 0.5): sqrt except -0 -> +0 and -inf -> +inf. Rsqrt is 1 / sqrt(x). RoundBf16 / RoundF16: to the
// nearest bf16 / IEEE half value (ties to even), kept in float: what a Cast to that dtype stores.
// clang-format off
#define PTO_TILE_UNARY_OPS(X) \
  X(Neg, "neg") \
  X(Abs, "abs") \
  X(Exp, "exp") \
  X(Expm1, "expm1") \
  X(Log, "log") \
  X(Log1p, "log1p") \
  X(Sqrt, "sqrt") \
  X(Rsqrt, "rsqrt") \
  X(Reciprocal, "reciprocal") \
  X(Square, "square") \
  X(Relu, "relu") \
  X(LeakyRelu, "leaky_relu") \
  X(ThresholdedRelu, "thresholded_relu") \
  X(Sigmoid, "sigmoid") \
  X(HardSigmoid, "hard_sigmoid") \
  X(HardSwish, "hard_swish") \
  X(Tanh, "tanh") \
  X(Erf, "erf") \
  X(Gelu, "gelu") \
  X(GeluTanh, "gelu_tanh") \
  X(Silu, "silu") \
  X(Swish, "swish") \
  X(Softplus, "softplus") \
  X(Softsign, "softsign") \
  X(Mish, "mish") \
  X(Elu, "elu") \
  X(Selu, "selu") \
  X(Celu, "celu") \
  X(Floor, "floor") \
  X(Ceil, "ceil") \
  X(Round, "round") \
  X(Sign, "sign") \
  X(PowHalf, "pow_half") \
  X(Not, "not") \
  X(IsNaN, "isnan") \
  X(IsInf, "isinf") \
  X(RoundBf16, "round_bf16") \
  X(RoundF16, "round_f16") \
  X(Sin, "sin") \
  X(Cos, "cos") \
  X(Shrink, "shrink")
// clang-format on

enum class TileUnary : uint8_t {
#define PTO_TILE_ENUM(name, text) k##name,
  PTO_TILE_UNARY_OPS(PTO_TILE_ENUM)
#undef PTO_TILE_ENUM
};

// Max/Min propagate NaN (either side). Pow is the general std::pow; the lowering turns constant
// integer exponents into multiplications first. And/Or/Xor act on 0/1 booleans.
enum class TileBinary : uint8_t { kAdd, kSub, kMul, kDiv, kMax, kMin, kPow, kAnd, kOr, kXor };
enum class TileCompare : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe };
enum class TileReduce : uint8_t { kSum, kMax, kMin };

// Element types of operands (registers are always float32). New dtypes slot in here and in the
// executor's load/store. kI32: inputs only, converted to f32 when loaded (the int32 accumulators
// of an integer product read by Cast(to=float)). kBF16 / kF16: half-precision storage, widened
// exactly when loaded; a store rounds to nearest even (the lowering rounds a value first wherever
// the graph says it is half, so the store's own rounding changes nothing). kU8 / kI8: 8-bit
// integers (quantized tensors), widened exactly when loaded; a store takes values the lowering
// already rounded and clamped to the type's range (QuantizeLinear).
enum class TileDType : uint8_t { kF32, kBool, kI32, kBF16, kF16, kU8, kI8 };

enum class TileOpcode : uint8_t {
  kLoad,        // dst = inputs[operand], broadcast over the tile, converted to f32
  kStore,       // outputs[operand] = a, converted to the output's dtype
  kConst,       // dst = imm0
  kUnary,       // dst = fn(a; imm0, imm1)
  kBinary,      // dst = a fn b
  kBinaryImm,   // dst = a fn imm0, or imm0 fn a when imm_left
  kClip,        // dst = min(max(a, imm0), imm1) as std::min(std::max(..)) (NaN stays)
  kCompare,     // dst = (a fn b) ? 1 : 0
  kCompareImm,  // dst = (a fn imm0) ? 1 : 0, or (imm0 fn a) when imm_left
  kSelect,      // dst = a != 0 ? b : c
  kFma,         // dst = a * b + c, one rounding
  // dst = fn over each row of a, in every column of that row. A row is the index space's last
  // axis: a program with a reduction is run in tiles of whole rows.
  kRowReduce,
};

struct TileInstr {
  TileOpcode op = TileOpcode::kConst;
  uint8_t fn = 0;  // a TileUnary, TileBinary or TileCompare, by op
  bool imm_left = false;
  int16_t dst = -1, a = -1, b = -1, c = -1;  // registers
  int32_t operand = -1;                      // kLoad: input index; kStore: output index
  float imm0 = 0.0f, imm1 = 0.0f;
};

}  // namespace pto
