#include "pto/dtype.h"

#include <array>

namespace pto {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::string_view numpy_name;
  size_t size;
  int onnx;  // TensorProto.DataType
};

constexpr std::array<DTypeInfo, kNumDTypes> kTable = {{
    {DType::kUndefined, "undefined", "undefined", 0, 0},
    {DType::kF32, "f32", "float32", 4, 1},
    {DType::kF64, "f64", "float64", 8, 11},
    {DType::kF16, "f16", "float16", 2, 10},
    {DType::kBF16, "bf16", "bfloat16", 2, 16},
    {DType::kI8, "i8", "int8", 1, 3},
    {DType::kI16, "i16", "int16", 2, 5},
    {DType::kI32, "i32", "int32", 4, 6},
    {DType::kI64, "i64", "int64", 8, 7},
    {DType::kU8, "u8", "uint8", 1, 2},
    {DType::kU16, "u16", "uint16", 2, 4},
    {DType::kU32, "u32", "uint32", 4, 12},
    {DType::kU64, "u64", "uint64", 8, 13},
    {DType::kBool, "bool", "bool", 1, 9},
}};

const DTypeInfo& info(DType dt) {
  auto i = static_cast<size_t>(dt);
  PTO_CHECK(i < kTable.size() && kTable[i].dtype == dt) << "bad dtype " << i;
  return kTable[i];
}

}  // namespace

size_t dtype_size(DType dt) {
  return info(dt).size;
}
std::string_view dtype_name(DType dt) {
  return info(dt).name;
}

DType dtype_from_name(std::string_view n) {
  for (const auto& row : kTable)
    if (row.dtype != DType::kUndefined && (row.name == n || row.numpy_name == n)) return row.dtype;
  throw ValueError(cat("unknown dtype '", n, "'"));
}

namespace {

// ONNX element types PyPTO has no dtype for, by code, for the error that names them.
std::string_view onnx_type_name(int64_t code) {
  switch (code) {
    case 8:
      return "STRING";
    case 14:
      return "COMPLEX64";
    case 15:
      return "COMPLEX128";
    case 17:
      return "FLOAT8E4M3FN";
    case 18:
      return "FLOAT8E4M3FNUZ";
    case 19:
      return "FLOAT8E5M2";
    case 20:
      return "FLOAT8E5M2FNUZ";
    case 21:
      return "UINT4";
    case 22:
      return "INT4";
    case 23:
      return "FLOAT4E2M1";
    default:
      return "";
  }
}

}  // namespace

DType dtype_from_onnx_code(int64_t code, std::string_view where) {
  for (const auto& row : kTable)
    if (row.dtype != DType::kUndefined && row.onnx == code) return row.dtype;
  const std::string_view name = onnx_type_name(code);
  throw UnsupportedError(cat(where, ": ONNX element type ", code,
                             name.empty() ? "" : cat(" (", name, ")"),
                             " is not supported (PyPTO computes in float32/64, float16, bfloat16, "
                             "8..64-bit integers and bool; no 4-bit or float8 kernels)"));
}

int onnx_code(DType dt) {
  return info(dt).onnx;
}

bool is_floating(DType dt) {
  return dt == DType::kF32 || dt == DType::kF64 || dt == DType::kF16 || dt == DType::kBF16;
}
bool is_integral(DType dt) {
  switch (dt) {
    case DType::kI8:
    case DType::kI16:
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
    case DType::kU16:
    case DType::kU32:
    case DType::kU64:
      return true;
    default:
      return false;
  }
}
bool is_signed(DType dt) {
  return is_floating(dt) || dt == DType::kI8 || dt == DType::kI16 || dt == DType::kI32 ||
         dt == DType::kI64;
}

void throw_unsupported_dtype(DType dt, std::string_view where) {
  throw UnsupportedError(cat(where, " dtype ", dtype_name(dt), " is not supported here"));
}

// Half precision conversion with round-to-nearest-even, subnormals, Inf and NaN.
uint16_t Float16::from_float(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000) return static_cast<uint16_t>(sign | (abs > 0x7f800000 ? 0x7e00 : 0x7c00));
  if (abs >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // rounds to >= 65520: Inf
  if (abs < 0x38800000) {                                              // subnormal or zero in half
    // value = abs_float; half subnormal unit = 2^-24
    float a = std::bit_cast<float>(abs);
    float scaled = a * 16777216.0f;                              // 2^24, exact
    uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));  // ties to even (default mode)
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t mant = abs & 0x7fffff;
  uint32_t exp = (abs >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float Float16::to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000 | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

}  // namespace pto
