#include "pto/dtype.h"

#include <algorithm>
#include <array>
#include <limits>

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
    {DType::kF8E4M3FN, "f8e4m3fn", "float8_e4m3fn", 1, 17},
    {DType::kF8E4M3FNUZ, "f8e4m3fnuz", "float8_e4m3fnuz", 1, 18},
    {DType::kF8E5M2, "f8e5m2", "float8_e5m2", 1, 19},
    {DType::kF8E5M2FNUZ, "f8e5m2fnuz", "float8_e5m2fnuz", 1, 20},
    {DType::kF8E8M0, "f8e8m0", "float8_e8m0fnu", 1, 24},
    {DType::kF4E2M1, "f4e2m1", "float4_e2m1fn", 1, 23},
    {DType::kI4, "i4", "int4", 1, 22},
    {DType::kU4, "u4", "uint4", 1, 21},
    {DType::kI2, "i2", "int2", 1, 26},
    {DType::kU2, "u2", "uint2", 1, 25},
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
    case 27:
      return "FLOAT6E2M3";
    case 28:
      return "FLOAT6E3M2";
    default:
      return "";
  }
}

}  // namespace

DType dtype_from_onnx_code(int64_t code, std::string_view where) {
  for (const auto& row : kTable)
    if (row.dtype != DType::kUndefined && row.onnx == code) return row.dtype;
  const std::string_view name = onnx_type_name(code);
  throw UnsupportedError(
      cat(where, ": ONNX element type ", code, name.empty() ? "" : cat(" (", name, ")"),
          " is not supported (PyPTO computes in float32/64, float16, bfloat16, "
          "8..64-bit integers and bool, and stores float8, float4, 4- and 2-bit integers)"));
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

bool is_storage_only(DType dt) {
  return dt >= DType::kF8E4M3FN;
}

bool is_small_float(DType dt) {
  return dt >= DType::kF8E4M3FN && dt <= DType::kF4E2M1;
}

int packed_bits(DType dt) {
  switch (dt) {
    case DType::kF4E2M1:
    case DType::kI4:
    case DType::kU4:
      return 4;
    case DType::kI2:
    case DType::kU2:
      return 2;
    default:
      return static_cast<int>(8 * dtype_size(dt));
  }
}

size_t packed_nbytes(DType dt, int64_t n) {
  return (static_cast<size_t>(n) * static_cast<size_t>(packed_bits(dt)) + 7) / 8;
}

void pack_elements(DType dt, const void* src, int64_t n, uint8_t* dst) {
  const int b = packed_bits(dt);
  if (b % 8 == 0) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(dt));
    return;
  }
  std::memset(dst, 0, packed_nbytes(dt, n));
  const auto* in = static_cast<const uint8_t*>(src);
  const unsigned mask = (1u << b) - 1;
  for (int64_t i = 0; i < n; ++i)
    dst[i * b / 8] |= static_cast<uint8_t>((in[i] & mask) << (i * b % 8));
}

void unpack_elements(DType dt, const uint8_t* src, int64_t n, void* dst) {
  const int b = packed_bits(dt);
  if (b % 8 == 0) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(dt));
    return;
  }
  auto* out = static_cast<uint8_t*>(dst);
  const unsigned mask = (1u << b) - 1, sign = 1u << (b - 1);
  const bool extend = dt == DType::kI4 || dt == DType::kI2;
  for (int64_t i = 0; i < n; ++i) {
    unsigned v = (src[i * b / 8] >> (i * b % 8)) & mask;
    out[i] = static_cast<uint8_t>(extend && (v & sign) ? v | ~mask : v);
  }
}

namespace {

// E8M0 from the bits of float(x), as ONNX's reference (numpy_helper.to_float8e8m0) computes it:
// the sign is dropped, Inf and NaN become NaN (0xFF), zero and float subnormals 2^-127 (0).
uint8_t e8m0_from_float(float x, bool saturate, E8M0Rounding mode) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  uint32_t exp = (u >> 23) & 0xff;
  if (exp == 0xff) return 0xff;
  bool up = false;
  if (mode == E8M0Rounding::kNearest)
    up = (u & 0x400000) && ((u & 0x200000) || (u & 0x1fffff) || exp > 0);
  else if (mode == E8M0Rounding::kUp)
    up = (u & 0x7fffff) != 0;
  if (up && !(saturate && exp == 0xfe)) ++exp;  // 0xfe + 1 without saturation is the NaN
  return static_cast<uint8_t>(exp);
}

// The largest finite value of a (non-E8M0) format.
double small_float_max(const SmallFloatFormat& f) {
  const int top = (1 << f.exp_bits) - 1;  // the all-ones exponent field
  const double m = std::ldexp(1.0, -f.mant_bits);
  switch (f.kind) {
    case SmallFloatKind::kIEEE:
      return (2 - m) * std::ldexp(1.0, top - 1 - f.bias);
    case SmallFloatKind::kFN:  // the all-ones mantissa is the NaN
      return (2 - 2 * m) * std::ldexp(1.0, top - f.bias);
    default:
      return (2 - m) * std::ldexp(1.0, top - f.bias);
  }
}

}  // namespace

uint8_t small_float_from_double(const SmallFloatFormat& f, double x, bool saturate,
                                E8M0Rounding e8m0) {
  if (f.kind == SmallFloatKind::kE8M0)
    return e8m0_from_float(static_cast<float>(x), saturate, e8m0);
  const int width = 1 + f.exp_bits + f.mant_bits, M = f.mant_bits;
  const bool neg = std::signbit(x);
  const auto sign = static_cast<uint8_t>(neg ? 1u << (width - 1) : 0u);
  const uint8_t top = static_cast<uint8_t>((1u << f.exp_bits) - 1);
  const uint8_t inf = static_cast<uint8_t>(sign | (top << M));
  uint8_t nan = 0x80;  // FNUZ
  if (f.kind == SmallFloatKind::kIEEE) nan = static_cast<uint8_t>(inf | (1u << (M - 1)));
  if (f.kind == SmallFloatKind::kFN) nan = static_cast<uint8_t>(sign | 0x7f);
  // No NaN to give: ml_dtypes (and so ONNX's reference) gives the zero of the opposite sign.
  if (f.kind == SmallFloatKind::kFinite) nan = static_cast<uint8_t>(neg ? 0u : 1u << (width - 1));
  if (std::isnan(x)) return nan;
  const double max = small_float_max(f);
  // The encoding of `a` (representable, >= 0) with the sign.
  const int emin = 1 - f.bias;  // exponent of the smallest normal
  auto encode = [&](double a) -> uint8_t {
    if (a == 0) return f.kind == SmallFloatKind::kFNUZ ? 0 : sign;
    int e = std::ilogb(a);
    if (e < emin) return static_cast<uint8_t>(sign | static_cast<int>(std::ldexp(a, M - emin)));
    auto mant = static_cast<int>(std::ldexp(a, M - e)) - (1 << M);
    return static_cast<uint8_t>(sign | ((e + f.bias) << M) | mant);
  };
  auto overflow = [&]() -> uint8_t {
    if (saturate || f.kind == SmallFloatKind::kFinite) return encode(max);
    return f.kind == SmallFloatKind::kIEEE ? inf : nan;
  };
  const double a = std::fabs(x);
  if (std::isinf(a)) return overflow();
  // Round to nearest even at the quantum of a's binade (of the subnormals below emin).
  int e = a == 0 ? emin : std::max(std::ilogb(a), emin);
  double r = std::ldexp(std::nearbyint(std::ldexp(a, M - e)), e - M);
  return r > max ? overflow() : encode(r);
}

float small_float_to_float(const SmallFloatFormat& f, uint8_t bits) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (f.kind == SmallFloatKind::kE8M0) return bits == 0xff ? nan : std::ldexp(1.0f, bits - 127);
  const int width = 1 + f.exp_bits + f.mant_bits, M = f.mant_bits;
  const bool neg = (bits >> (width - 1)) & 1;
  const int top = (1 << f.exp_bits) - 1;
  const int field = (bits >> M) & top, mant = bits & ((1 << M) - 1);
  if (f.kind == SmallFloatKind::kFNUZ && bits == 0x80) return nan;
  if (f.kind == SmallFloatKind::kFN && (bits & 0x7f) == 0x7f) return neg ? -nan : nan;
  if (f.kind == SmallFloatKind::kIEEE && field == top) {
    float v = mant ? nan : std::numeric_limits<float>::infinity();
    return neg ? -v : v;
  }
  float v = field == 0 ? std::ldexp(static_cast<float>(mant), 1 - f.bias - M)
                       : std::ldexp(static_cast<float>(mant + (1 << M)), field - f.bias - M);
  return neg ? -v : v;
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
