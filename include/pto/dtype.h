// Element types and the one place where a runtime DType becomes a C++ type (dispatch()).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "pto/error.h"

namespace pto {

// The dtypes PyPTO knows. Open to more: add an enumerator, a row in dtype.cpp's table and a case
// in dispatch(); a static_assert there fails until all three agree.
enum class DType : uint8_t {
  kUndefined = 0,
  kF32,
  kF64,
  kF16,
  kBF16,
  kI8,
  kI16,
  kI32,
  kI64,
  kU8,
  kU16,
  kU32,
  kU64,
  kBool,
  // Storage dtypes: tensors hold them and Cast, CastLike, QuantizeLinear, DequantizeLinear and the
  // movement ops (which copy bytes) read and write them; nothing computes in them. Every one takes
  // one byte per element in memory: the 4- and 2-bit types are packed only in ONNX TensorProto
  // data (exporter and importer).
  kF8E4M3FN,
  kF8E4M3FNUZ,
  kF8E5M2,
  kF8E5M2FNUZ,
  kF8E8M0,
  kF4E2M1,
  kI4,
  kU4,
  kI2,
  kU2,
};
inline constexpr int kNumDTypes = 24;

// IEEE half, stored as bits; arithmetic goes through float.
struct Float16 {
  uint16_t bits = 0;
  Float16() = default;
  explicit Float16(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }

  static uint16_t from_float(float f);
  static float to_float(uint16_t h);
};

// bfloat16: the top half of a float, rounded to nearest even.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) : bits(from_float(f)) {}
  operator float() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

  static uint16_t from_float(float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);  // keep it a quiet NaN
    u += 0x7fff + ((u >> 16) & 1);
    return static_cast<uint16_t>(u >> 16);
  }
};

// How a small float format spends its bit patterns.
enum class SmallFloatKind : uint8_t {
  kIEEE,    // the all-ones exponent holds Inf and NaN (E5M2)
  kFN,      // no Inf; only the all-ones pattern (either sign) is NaN (E4M3FN)
  kFNUZ,    // no Inf, no -0: 0x80 is the NaN (E4M3FNUZ, E5M2FNUZ)
  kFinite,  // no Inf, no NaN: out-of-range values saturate (E2M1)
  kE8M0,    // unsigned powers of two 2^(bits-127), 0xFF is NaN (E8M0)
};
struct SmallFloatFormat {
  int exp_bits, mant_bits, bias;
  SmallFloatKind kind;
};
// E8M0's `round_mode` (Cast-24): the exponent of |x| rounded up, down or to nearest.
enum class E8M0Rounding : uint8_t { kUp, kDown, kNearest };

// x rounded to nearest even in format f (E8M0: by `e8m0`), as bits. `saturate` (Cast-19's
// attribute) clamps finite out-of-range values and Inf to the largest finite value; without it
// they become Inf where the format has one, else NaN. The float8 results are ml_dtypes'.
uint8_t small_float_from_double(const SmallFloatFormat& f, double x, bool saturate,
                                E8M0Rounding e8m0 = E8M0Rounding::kUp);
float small_float_to_float(const SmallFloatFormat& f, uint8_t bits);

// A float8 / float4 value, stored as bits; arithmetic goes through float.
template <SmallFloatFormat F>
struct SmallFloat {
  static constexpr SmallFloatFormat format = F;
  uint8_t bits = 0;
  SmallFloat() = default;
  explicit SmallFloat(float x) : bits(small_float_from_double(F, x, true)) {}
  operator float() const { return small_float_to_float(F, bits); }
};
using Float8E4M3FN = SmallFloat<SmallFloatFormat{4, 3, 7, SmallFloatKind::kFN}>;
using Float8E4M3FNUZ = SmallFloat<SmallFloatFormat{4, 3, 8, SmallFloatKind::kFNUZ}>;
using Float8E5M2 = SmallFloat<SmallFloatFormat{5, 2, 15, SmallFloatKind::kIEEE}>;
using Float8E5M2FNUZ = SmallFloat<SmallFloatFormat{5, 2, 16, SmallFloatKind::kFNUZ}>;
using Float8E8M0 = SmallFloat<SmallFloatFormat{8, 0, 127, SmallFloatKind::kE8M0}>;
using Float4E2M1 = SmallFloat<SmallFloatFormat{2, 1, 1, SmallFloatKind::kFinite}>;

// A 4- or 2-bit integer, one per byte (sign-extended when signed). Converting an integer wraps
// (two's complement), like the wider integer types.
template <int Bits, bool Signed>
struct SmallInt {
  static constexpr int bits = Bits;
  static constexpr int min = Signed ? -(1 << (Bits - 1)) : 0;
  static constexpr int max = Signed ? (1 << (Bits - 1)) - 1 : (1 << Bits) - 1;
  std::conditional_t<Signed, int8_t, uint8_t> value = 0;
  SmallInt() = default;
  explicit SmallInt(int64_t v) {
    auto low = static_cast<int>(static_cast<uint64_t>(v) & ((1u << Bits) - 1));
    value = static_cast<decltype(value)>(Signed && low > max ? low - (1 << Bits) : low);
  }
  operator int() const { return value; }
};
using Int4 = SmallInt<4, true>;
using UInt4 = SmallInt<4, false>;
using Int2 = SmallInt<2, true>;
using UInt2 = SmallInt<2, false>;

template <class T>
inline constexpr bool is_small_float_v = false;
template <SmallFloatFormat F>
inline constexpr bool is_small_float_v<SmallFloat<F>> = true;
template <class T>
inline constexpr bool is_small_int_v = false;
template <int B, bool S>
inline constexpr bool is_small_int_v<SmallInt<B, S>> = true;

size_t dtype_size(DType dt);
std::string_view dtype_name(DType dt);      // "f32", "bf16", "i64", "bool", ...
DType dtype_from_name(std::string_view n);  // accepts our names and numpy's ("float32", "int64")
bool is_floating(DType dt);                 // f32, f64, f16, bf16
bool is_integral(DType dt);                 // signed and unsigned integers, not bool
bool is_signed(DType dt);
bool is_storage_only(DType dt);  // the float8, float4, 4- and 2-bit dtypes
bool is_small_float(DType dt);   // the float8 and float4 dtypes
// Bits per element in packed ONNX TensorProto data: 4 or 2 for the sub-byte types, else 8*size.
int packed_bits(DType dt);
// Packs n one-per-byte elements of a 4- or 2-bit dtype ONNX's way (element i in the bits
// [i*b, i*b+b) of the little-endian stream, unused high bits zero) into ceil(n*b/8) bytes, and
// back (signed values sign-extended). Other dtypes: a copy of n*size bytes.
size_t packed_nbytes(DType dt, int64_t n);
void pack_elements(DType dt, const void* src, int64_t n, uint8_t* dst);
void unpack_elements(DType dt, const uint8_t* src, int64_t n, void* dst);

template <class T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kF64;
};
template <>
struct DTypeOf<Float16> {
  static constexpr DType value = DType::kF16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType value = DType::kI8;
};
template <>
struct DTypeOf<int16_t> {
  static constexpr DType value = DType::kI16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kI64;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kU8;
};
template <>
struct DTypeOf<uint16_t> {
  static constexpr DType value = DType::kU16;
};
template <>
struct DTypeOf<uint32_t> {
  static constexpr DType value = DType::kU32;
};
template <>
struct DTypeOf<uint64_t> {
  static constexpr DType value = DType::kU64;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};
template <>
struct DTypeOf<Float8E4M3FN> {
  static constexpr DType value = DType::kF8E4M3FN;
};
template <>
struct DTypeOf<Float8E4M3FNUZ> {
  static constexpr DType value = DType::kF8E4M3FNUZ;
};
template <>
struct DTypeOf<Float8E5M2> {
  static constexpr DType value = DType::kF8E5M2;
};
template <>
struct DTypeOf<Float8E5M2FNUZ> {
  static constexpr DType value = DType::kF8E5M2FNUZ;
};
template <>
struct DTypeOf<Float8E8M0> {
  static constexpr DType value = DType::kF8E8M0;
};
template <>
struct DTypeOf<Float4E2M1> {
  static constexpr DType value = DType::kF4E2M1;
};
template <>
struct DTypeOf<Int4> {
  static constexpr DType value = DType::kI4;
};
template <>
struct DTypeOf<UInt4> {
  static constexpr DType value = DType::kU4;
};
template <>
struct DTypeOf<Int2> {
  static constexpr DType value = DType::kI2;
};
template <>
struct DTypeOf<UInt2> {
  static constexpr DType value = DType::kU2;
};
template <class T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

// The type in which a reference kernel computes on T: half types widen to float.
template <class T>
struct ComputeTypeOf {
  using type = T;
};
template <>
struct ComputeTypeOf<Float16> {
  using type = float;
};
template <>
struct ComputeTypeOf<BFloat16> {
  using type = float;
};
template <SmallFloatFormat F>
struct ComputeTypeOf<SmallFloat<F>> {
  using type = float;
};
template <int B, bool S>
struct ComputeTypeOf<SmallInt<B, S>> {
  using type = int;
};
template <class T>
using compute_t = typename ComputeTypeOf<T>::type;

// Which dtypes a dispatch accepts.
enum DTypeSet : uint32_t {
  kFloatTypes = 1u << 0,    // f32 f64 f16 bf16
  kSignedInts = 1u << 1,    // i8 i16 i32 i64
  kUnsignedInts = 1u << 2,  // u8 u16 u32 u64
  kBoolType = 1u << 3,
  kIntTypes = kSignedInts | kUnsignedInts,
  kNumericTypes = kFloatTypes | kIntTypes,
  kAllTypes = kNumericTypes | kBoolType,
  // Storage dtypes: only kernels that name these sets see them.
  kSmallFloatTypes = 1u << 4,  // f8e4m3fn f8e4m3fnuz f8e5m2 f8e5m2fnuz f8e8m0 f4e2m1
  kSmallIntTypes = 1u << 5,    // i4 u4 i2 u2
  kStorageTypes = kSmallFloatTypes | kSmallIntTypes,
};

// ONNX's TensorProto.DataType numbering, used by dtype attributes in the IR (Cast's `to`,
// QuantizeLinear's `output_dtype`, ...). Codes without a PyPTO dtype throw UnsupportedError.
DType dtype_from_onnx_code(int64_t code, std::string_view where);
int onnx_code(DType dt);

[[noreturn]] void throw_unsupported_dtype(DType dt, std::string_view where);

// Calls f.template operator()<T>() with T the C++ type of dt, if dt is in `allowed`; otherwise
// throws UnsupportedError naming `where`. Usage:
//   dispatch(t.dtype(), kFloatTypes, "[Exp]", [&]<class T>() { ... });
template <class F>
decltype(auto) dispatch(DType dt, uint32_t allowed, std::string_view where, F&& f) {
  static_assert(kNumDTypes == 24, "add the new dtype to dispatch()");
  auto in = [&](uint32_t set) { return (allowed & set) != 0; };
  switch (dt) {
    case DType::kF32:
      if (in(kFloatTypes)) return f.template operator()<float>();
      break;
    case DType::kF64:
      if (in(kFloatTypes)) return f.template operator()<double>();
      break;
    case DType::kF16:
      if (in(kFloatTypes)) return f.template operator()<Float16>();
      break;
    case DType::kBF16:
      if (in(kFloatTypes)) return f.template operator()<BFloat16>();
      break;
    case DType::kI8:
      if (in(kSignedInts)) return f.template operator()<int8_t>();
      break;
    case DType::kI16:
      if (in(kSignedInts)) return f.template operator()<int16_t>();
      break;
    case DType::kI32:
      if (in(kSignedInts)) return f.template operator()<int32_t>();
      break;
    case DType::kI64:
      if (in(kSignedInts)) return f.template operator()<int64_t>();
      break;
    case DType::kU8:
      if (in(kUnsignedInts)) return f.template operator()<uint8_t>();
      break;
    case DType::kU16:
      if (in(kUnsignedInts)) return f.template operator()<uint16_t>();
      break;
    case DType::kU32:
      if (in(kUnsignedInts)) return f.template operator()<uint32_t>();
      break;
    case DType::kU64:
      if (in(kUnsignedInts)) return f.template operator()<uint64_t>();
      break;
    case DType::kBool:
      if (in(kBoolType)) return f.template operator()<bool>();
      break;
    case DType::kF8E4M3FN:
    case DType::kF8E4M3FNUZ:
    case DType::kF8E5M2:
    case DType::kF8E5M2FNUZ:
    case DType::kF8E8M0:
    case DType::kF4E2M1:
    case DType::kI4:
    case DType::kU4:
    case DType::kI2:
    case DType::kU2:
      break;  // dispatch_with_storage() only
    case DType::kUndefined:
      break;
  }
  throw_unsupported_dtype(dt, where);
}

// dispatch() that also reaches the storage dtypes when `allowed` names kSmallFloatTypes or
// kSmallIntTypes. A function of its own so that dispatch()'s callers are not compiled for them.
template <class F>
decltype(auto) dispatch_with_storage(DType dt, uint32_t allowed, std::string_view where, F&& f) {
  auto in = [&](uint32_t set) { return (allowed & set) != 0; };
  switch (dt) {
    case DType::kF8E4M3FN:
      if (in(kSmallFloatTypes)) return f.template operator()<Float8E4M3FN>();
      break;
    case DType::kF8E4M3FNUZ:
      if (in(kSmallFloatTypes)) return f.template operator()<Float8E4M3FNUZ>();
      break;
    case DType::kF8E5M2:
      if (in(kSmallFloatTypes)) return f.template operator()<Float8E5M2>();
      break;
    case DType::kF8E5M2FNUZ:
      if (in(kSmallFloatTypes)) return f.template operator()<Float8E5M2FNUZ>();
      break;
    case DType::kF8E8M0:
      if (in(kSmallFloatTypes)) return f.template operator()<Float8E8M0>();
      break;
    case DType::kF4E2M1:
      if (in(kSmallFloatTypes)) return f.template operator()<Float4E2M1>();
      break;
    case DType::kI4:
      if (in(kSmallIntTypes)) return f.template operator()<Int4>();
      break;
    case DType::kU4:
      if (in(kSmallIntTypes)) return f.template operator()<UInt4>();
      break;
    case DType::kI2:
      if (in(kSmallIntTypes)) return f.template operator()<Int2>();
      break;
    case DType::kU2:
      if (in(kSmallIntTypes)) return f.template operator()<UInt2>();
      break;
    default:
      return dispatch(dt, allowed, where, std::forward<F>(f));
  }
  throw_unsupported_dtype(dt, where);
}

}  // namespace pto
