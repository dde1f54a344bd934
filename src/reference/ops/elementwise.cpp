// Reference kernels for unary elementwise math and logic (Abs ... Identity). Activations live in
// activation.cpp, binary and variadic ops in binary.cpp; all are registered from here. Half types
// compute in float and round once.
#include <cmath>

#include "elementwise_util.h"

namespace pto::reference {

void check_same_dtype(const KernelContext& c, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype())
    throw TypeError(cat(c.where(), ": input dtypes differ: ", dtype_name(a.dtype()), " and ",
                        dtype_name(b.dtype())));
}

namespace {

// Round half to even, independent of the floating-point environment's rounding mode.
template <class F>
F round_half_even(F x) {
  F r = std::round(x);  // half away from zero
  if (std::fabs(x - std::trunc(x)) == F(0.5)) r = F(2) * std::round(x / F(2));
  return r;
}

template <class T>
T sign_value(T x) {
  if constexpr (is_int_v<T>) {
    return static_cast<T>(x > 0 ? 1 : (x < T(0) ? -1 : 0));
  } else {
    compute_t<T> v = static_cast<compute_t<T>>(x);
    if (std::isnan(v)) return x;
    return static_cast<T>(compute_t<T>(v > 0 ? 1 : (v < 0 ? -1 : 0)));
  }
}

void register_unary_math(KernelRegistry& r) {
  r.add("Abs", unary_kernel<kNumericTypes>([](auto x) { return abs_value(x); }));
  r.add("Neg", unary_kernel<kFloatTypes | kSignedInts>([](auto x) {
          using T = decltype(x);
          if constexpr (is_int_v<T>)
            return wrap_neg(x);
          else
            return static_cast<T>(-static_cast<compute_t<T>>(x));
        }));
  r.add("Sign", unary_kernel<kNumericTypes>([](auto x) { return sign_value(x); }));
  r.add("Exp", float_kernel([](auto x) { return std::exp(x); }));
  r.add("Log", float_kernel([](auto x) { return std::log(x); }));
  r.add("Sqrt", float_kernel([](auto x) { return std::sqrt(x); }));
  r.add("Reciprocal", float_kernel([](auto x) { return decltype(x)(1) / x; }));
  r.add("Floor", float_kernel([](auto x) { return std::floor(x); }));
  r.add("Ceil", float_kernel([](auto x) { return std::ceil(x); }));
  r.add("Round", float_kernel([](auto x) { return round_half_even(x); }));
  r.add("Sin", float_kernel([](auto x) { return std::sin(x); }));
  r.add("Cos", float_kernel([](auto x) { return std::cos(x); }));
  r.add("Tan", float_kernel([](auto x) { return std::tan(x); }));
  r.add("Asin", float_kernel([](auto x) { return std::asin(x); }));
  r.add("Acos", float_kernel([](auto x) { return std::acos(x); }));
  r.add("Atan", float_kernel([](auto x) { return std::atan(x); }));
  r.add("Sinh", float_kernel([](auto x) { return std::sinh(x); }));
  r.add("Cosh", float_kernel([](auto x) { return std::cosh(x); }));
  r.add("Asinh", float_kernel([](auto x) { return std::asinh(x); }));
  r.add("Acosh", float_kernel([](auto x) { return std::acosh(x); }));
  r.add("Atanh", float_kernel([](auto x) { return std::atanh(x); }));
  r.add("Erf", float_kernel([](auto x) { return std::erf(x); }));

  r.add("IsNaN", unary_kernel<kFloatTypes>(
                     [](auto x) { return std::isnan(static_cast<compute_t<decltype(x)>>(x)); }));
  r.add("IsInf", [](const KernelContext& c) {
    bool pos = c.node.attr_int("detect_positive") != 0;
    bool neg = c.node.attr_int("detect_negative") != 0;
    return unary_kernel<kFloatTypes>([pos, neg](auto x) {
      auto v = static_cast<compute_t<decltype(x)>>(x);
      return std::isinf(v) && (v > 0 ? pos : neg);
    })(c);
  });

  r.add("Not", unary_kernel<kBoolType>([](bool x) { return !x; }));
  r.add("BitwiseNot", unary_kernel<kIntTypes>([](auto x) { return static_cast<decltype(x)>(~x); }));
  // Identity copies: outputs never alias inputs in the reference interpreter.
  r.add("Identity", [](const KernelContext& c) { return std::vector<Tensor>{c.input(0).clone()}; });
}

}  // namespace

void register_elementwise_kernels(KernelRegistry& r) {
  register_unary_math(r);
  register_activation_kernels(r);
  register_binary_kernels(r);
}

}  // namespace pto::reference
