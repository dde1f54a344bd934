// Element type conversion with ONNX Cast's rules, for the Cast kernel and any other code that
// needs a tensor in another dtype.
//  - integer -> integer wraps (two's complement), like numpy's astype;
//  - float -> integer truncates toward zero and saturates at the target's range, NaN -> 0 (the
//    spec leaves these undefined; saturating keeps them from being undefined behaviour in C++);
//  - anything -> bool is `x != 0` (NaN -> true); bool -> anything is 0 or 1;
//  - to f16/bf16 rounds to nearest even, once: f64 and 64-bit integers go through a
//    round-to-odd float so that the two roundings equal one;
//  - to the float8 / float4 storage types rounds to nearest even (E8M0: by `round_mode`), with
//    Cast's `saturate` (see small_float_from_double); from them goes through float;
//  - to the 4- and 2-bit integers: integers wrap; floats truncate toward zero and become 0 when
//    out of range or NaN (ml_dtypes' rule, which ONNX's reference and test data follow).
#pragma once

#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>

#include "pto/tensor.h"

namespace pto::reference {

namespace detail {

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>;

// Rounds a double to float with round-to-odd: exact values stay, inexact ones take the
// truncated float with its last bit set. A later rounding to fewer bits is then correct.
inline float to_float_round_odd(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || std::isinf(d) || static_cast<double>(f) == d) return f;
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) --u;  // step toward zero
  return std::bit_cast<float>(u | 1u);
}

// A 64-bit integer to double with round-to-odd (exact below 2^53), for the same reason.
template <class I>
double to_double_round_odd(I v) {
  using U = std::make_unsigned_t<I>;
  bool neg = false;
  U mag = static_cast<U>(v);
  if constexpr (std::is_signed_v<I>) {
    neg = v < 0;
    if (neg) mag = U(0) - mag;
  }
  int width = std::bit_width(static_cast<uint64_t>(mag));
  if (width <= 53) return neg ? -static_cast<double>(mag) : static_cast<double>(mag);
  int shift = width - 53;
  uint64_t m = static_cast<uint64_t>(mag) >> shift;
  if (static_cast<uint64_t>(mag) & ((uint64_t{1} << shift) - 1)) m |= 1;
  double d = std::ldexp(static_cast<double>(m), shift);
  return neg ? -d : d;
}

// A double to float, integer or half type T; saturating for integers, NaN -> 0.
template <class T>
T from_double(double d) {
  if constexpr (std::is_same_v<T, bool>) {
    return d != 0;
  } else if constexpr (is_half_v<T>) {
    return T(to_float_round_odd(d));
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(d);
  } else {
    if (std::isnan(d)) return T(0);
    constexpr double hi = static_cast<double>(std::numeric_limits<T>::max()) + 1.0;  // 2^digits
    constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
    if (d >= hi) return std::numeric_limits<T>::max();
    if (d <= lo) return std::numeric_limits<T>::min();
    return static_cast<T>(d);  // truncates; the truncated value is representable here
  }
}

}  // namespace detail

// Cast's attributes for storage targets.
struct StorageCast {
  bool saturate = true;
  E8M0Rounding round = E8M0Rounding::kUp;
};

template <class To, class From>
To cast_value(From v, const StorageCast& mode = {});

namespace detail {

template <class T>
inline constexpr bool is_storage_v = is_small_float_v<T> || is_small_int_v<T>;

// Cast to or from a storage type (one of To, From is).
template <class To, class From>
To storage_cast(From v, const StorageCast& mode) {
  if constexpr (is_small_float_v<From>) {
    return cast_value<To>(static_cast<float>(v), mode);
  } else if constexpr (is_small_int_v<From>) {
    return cast_value<To>(static_cast<int32_t>(v), mode);
  } else if constexpr (is_small_float_v<To>) {
    double d;
    if constexpr (std::is_same_v<From, bool>)
      d = v ? 1 : 0;
    else if constexpr (std::is_integral_v<From> && sizeof(From) == 8)
      d = to_double_round_odd(v);
    else
      d = static_cast<double>(static_cast<compute_t<From>>(v));
    To out;
    out.bits = small_float_from_double(To::format, d, mode.saturate, mode.round);
    return out;
  } else if constexpr (std::is_integral_v<From>) {  // and bool
    return To(static_cast<int64_t>(v));             // wraps
  } else {
    double t = std::trunc(static_cast<double>(static_cast<compute_t<From>>(v)));
    return t >= To::min && t <= To::max ? To(static_cast<int64_t>(t)) : To(0);  // NaN: 0
  }
}

}  // namespace detail

// Converts one value from From to To with the rules above.
template <class To, class From>
To cast_value(From v, const StorageCast& mode) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (detail::is_storage_v<To> || detail::is_storage_v<From>) {
    return detail::storage_cast<To>(v, mode);
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<compute_t<From>>(v) != 0;
  } else if constexpr (std::is_same_v<From, bool>) {
    return v ? To(compute_t<To>(1)) : To(compute_t<To>(0));
  } else if constexpr (std::is_integral_v<From> && std::is_integral_v<To>) {
    return static_cast<To>(v);                      // modular (C++20)
  } else if constexpr (std::is_integral_v<From>) {  // integer -> float or half
    if constexpr (std::is_floating_point_v<To>)
      return static_cast<To>(v);
    else if constexpr (sizeof(From) <= 2)
      return To(static_cast<float>(v));  // exact in float
    else
      return detail::from_double<To>(detail::to_double_round_odd(v));
  } else if constexpr (std::is_same_v<From, double>) {
    return detail::from_double<To>(v);
  } else {  // float or a half type -> anything else
    float f = static_cast<float>(v);
    if constexpr (detail::is_half_v<To>)
      return To(f);
    else
      return detail::from_double<To>(static_cast<double>(f));
  }
}

// x converted to dtype `to` (a new tensor; x itself when it already has that dtype).
// Throws UnsupportedError naming `where` for dtypes outside PyPTO's set.
Tensor cast(const Tensor& x, DType to, const std::string& where = "[Cast]",
            const StorageCast& mode = {});

}  // namespace pto::reference
