// Element types and the one place where a runtime DType becomes a C++ type (dispatch()).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

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
};
inline constexpr int kNumDTypes = 14;

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

size_t dtype_size(DType dt);
std::string_view dtype_name(DType dt);      // "f32", "bf16", "i64", "bool", ...
DType dtype_from_name(std::string_view n);  // accepts our names and numpy's ("float32", "int64")
bool is_floating(DType dt);                 // f32, f64, f16, bf16
bool is_integral(DType dt);                 // signed and unsigned integers, not bool
bool is_signed(DType dt);

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
  static_assert(kNumDTypes == 14, "add the new dtype to dispatch()");
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
    case DType::kUndefined:
      break;
  }
  throw_unsupported_dtype(dt, where);
}

}  // namespace pto
