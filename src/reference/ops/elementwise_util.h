// Helpers shared by the elementwise reference kernels (elementwise.cpp, activation.cpp,
// binary.cpp): typed map loops with broadcasting, and integer arithmetic without UB (also used by
// the CPU kernels, backend/cpu/elementwise.cpp, so both compute the same values).
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#include "kernel_util.h"

namespace pto::reference {

void register_activation_kernels(KernelRegistry& r);
void register_binary_kernels(KernelRegistry& r);

template <class T>
inline constexpr bool is_int_v = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// Converts a double to T: rounds for floats; for integers truncates toward zero and saturates,
// NaN becoming 0 (a plain static_cast would be UB out of range).
template <class T>
T saturate_cast(double v) {
  if constexpr (is_int_v<T>) {
    if (std::isnan(v)) return T(0);
    // 2^63 and 2^64 are exact doubles; max() itself may round up to them, hence >=.
    if (v >= static_cast<double>(std::numeric_limits<T>::max()))
      return std::numeric_limits<T>::max();
    if (v <= static_cast<double>(std::numeric_limits<T>::lowest()))
      return std::numeric_limits<T>::lowest();
    return static_cast<T>(v);
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != 0;
  } else {
    return static_cast<T>(static_cast<compute_t<T>>(v));
  }
}

// Integer add/sub/mul/neg that wrap modulo 2^bits (two's complement), as numpy and ONNX Runtime
// do; computing in uint64 avoids signed overflow and the int promotion of small unsigned types.
template <class T>
T wrap_add(T a, T b) {
  return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
template <class T>
T wrap_sub(T a, T b) {
  return static_cast<T>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
template <class T>
T wrap_mul(T a, T b) {
  return static_cast<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
template <class T>
T wrap_neg(T a) {
  return static_cast<T>(uint64_t{0} - static_cast<uint64_t>(a));
}

// Integer division truncating toward zero (C, and ONNX's reference); x / 0 is 0.
template <class T>
T int_div(T a, T b) {
  if (b == 0) return T(0);
  if constexpr (std::is_signed_v<T>)
    if (b == T(-1)) return wrap_neg(a);  // INT_MIN / -1 wraps to INT_MIN
  return static_cast<T>(a / b);
}

// Integer remainder: fmod=1 takes the dividend's sign (C %), fmod=0 the divisor's (Python).
template <class T>
T int_mod(T a, T b, bool c_style) {
  if (b == 0) return T(0);
  if constexpr (std::is_signed_v<T>) {
    if (b == T(-1)) return T(0);  // also avoids INT_MIN % -1
    T r = static_cast<T>(a % b);
    if (!c_style && r != 0 && ((r < 0) != (b < 0))) r = static_cast<T>(r + b);
    return r;
  } else {
    return static_cast<T>(a % b);
  }
}

// Floating-point Mod with fmod=0: a - floor(a / b) * b, with ONNX's special cases.
template <class F>
F float_mod(F a, F b) {
  if (std::isnan(a) || std::isnan(b) || std::isinf(a) || b == 0)
    return std::numeric_limits<F>::quiet_NaN();
  if (std::isinf(b)) {
    if (a == 0) return std::copysign(F(0), b);
    return (a > 0) == (b > 0) ? a : b;
  }
  F r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r == 0 ? std::copysign(F(0), b) : r;
}

// |x|; integers wrap (abs(INT_MIN) is INT_MIN).
template <class T>
T abs_value(T x) {
  if constexpr (std::is_unsigned_v<T>)
    return x;
  else if constexpr (is_int_v<T>)
    return x < 0 ? wrap_neg(x) : x;  // abs(INT_MIN) wraps to INT_MIN, as in numpy
  else
    return static_cast<T>(std::fabs(static_cast<compute_t<T>>(x)));
}

// ONNX Mod of a and b: fmod=1 (c_style) is C's fmod / %, fmod=0 Python's remainder.
template <class T>
T mod_value(T a, T b, bool c_style) {
  if constexpr (is_int_v<T>) {
    return int_mod(a, b, c_style);
  } else {
    auto x = static_cast<compute_t<T>>(a), y = static_cast<compute_t<T>>(b);
    return static_cast<T>(c_style ? std::fmod(x, y) : float_mod(x, y));
  }
}

// y[i] = f(x[i]) where f maps T to some R; the output dtype is R's.
template <class T, class F>
Tensor map_unary(const Tensor& x, F&& f) {
  using R = std::decay_t<decltype(f(std::declval<T>()))>;
  Tensor y = Tensor::empty(dtype_of<R>, x.shape());
  const T* in = x.data<T>();
  R* out = y.data<R>();
  for (int64_t i = 0; i < x.numel(); ++i) out[i] = f(in[i]);
  return y;
}

// out = f(a, b) with numpy broadcasting, a of type A and b of type B; output dtype is f's result.
template <class A, class B, class F>
Tensor map_binary(const Tensor& a, const Tensor& b, const std::string& where, F&& f) {
  using R = std::decay_t<decltype(f(std::declval<A>(), std::declval<B>()))>;
  std::vector<std::vector<int64_t>> off;
  Dims shape = broadcast_all({a.shape(), b.shape()}, where, &off);
  Tensor y = Tensor::empty(dtype_of<R>, shape);
  const A* pa = a.data<A>();
  const B* pb = b.data<B>();
  R* out = y.data<R>();
  for (int64_t i = 0; i < y.numel(); ++i) out[i] = f(pa[off[0][i]], pb[off[1][i]]);
  return y;
}

// Adapts g, a function of the compute type (float for half types), to a T -> T function.
template <class G>
auto in_compute_type(G g) {
  return [g](auto x) {
    using T = decltype(x);
    return static_cast<T>(g(static_cast<compute_t<T>>(x)));
  };
}

// The DTypeSet that T belongs to.
template <class T>
constexpr uint32_t dtype_set_of() {
  if constexpr (std::is_same_v<T, bool>)
    return kBoolType;
  else if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Float16> ||
                     std::is_same_v<T, BFloat16>)
    return kFloatTypes;
  else if constexpr (std::is_signed_v<T>)
    return kSignedInts;
  else
    return kUnsignedInts;
}

// dispatch() that instantiates f only for the dtypes in Types, so that f may use operations that
// exist for those types only (~x on integers, std::isnan on floats). f returns a Tensor.
template <uint32_t Types, class F>
Tensor dispatch_only(DType dt, const std::string& where, F&& f) {
  return dispatch(dt, Types, where, [&]<class T>() -> Tensor {
    if constexpr ((dtype_set_of<T>() & Types) != 0)
      return f.template operator()<T>();
    else
      throw_unsupported_dtype(dt, where);
  });
}

// A kernel applying f (generic over the element type T, returning any R) to input 0.
template <uint32_t Types, class F>
Kernel unary_kernel(F f) {
  return [f](const KernelContext& c) {
    const Tensor& x = c.input(0);
    return std::vector<Tensor>{
        dispatch_only<Types>(x.dtype(), c.where(), [&]<class T>() { return map_unary<T>(x, f); })};
  };
}

// As unary_kernel, for float ops written on the compute type: g(float or double).
template <class G>
Kernel float_kernel(G g) {
  return unary_kernel<kFloatTypes>(in_compute_type(g));
}

// Both inputs' dtypes must match (ONNX type constraint T for both).
void check_same_dtype(const KernelContext& c, const Tensor& a, const Tensor& b);

}  // namespace pto::reference
