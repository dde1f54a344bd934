// Reference kernels for binary elementwise ops with numpy broadcasting (arithmetic, Pow, Mod,
// bit ops, logic, comparisons), the variadic Sum/Mean/Max/Min, and Where.
//
// Integers: add/sub/mul wrap modulo 2^bits; division and Mod by zero give 0 and INT_MIN / -1
// gives INT_MIN (numpy's results), so no input is undefined behaviour.
#include <algorithm>
#include <cmath>

#include "elementwise_util.h"

namespace pto::reference {
namespace {

// Opset 1-6 Add/Sub/Mul/Div/... had a `broadcast` flag and an `axis` attribute that aligns B
// with the middle of A; numpy-style broadcasting gives the same answer only without `axis`.
void check_legacy_broadcast(const KernelContext& c) {
  if (c.node.opset > 0 && c.node.opset < 7 && c.attrs().has("axis"))
    throw UnsupportedError(cat(c.where(), ": legacy (opset < 7) broadcasting with 'axis'"));
}

// A kernel computing f(a, b) for two inputs of one dtype in Types; f's result type is the
// output's element type.
template <uint32_t Types, class F>
Kernel binary_kernel(F f) {
  return [f](const KernelContext& c) {
    const Tensor& a = c.input(0);
    const Tensor& b = c.input(1);
    check_same_dtype(c, a, b);
    check_legacy_broadcast(c);
    return std::vector<Tensor>{dispatch_only<Types>(
        a.dtype(), c.where(), [&]<class T>() { return map_binary<T, T>(a, b, c.where(), f); })};
  };
}

// Lifts an arithmetic op on the compute type to T (floats) or uses the integer form.
template <class FloatOp, class IntOp>
auto arith(FloatOp fop, IntOp iop) {
  return [fop, iop](auto a, auto b) {
    using T = decltype(a);
    if constexpr (is_int_v<T>)
      return iop(a, b);
    else
      return static_cast<T>(fop(static_cast<compute_t<T>>(a), static_cast<compute_t<T>>(b)));
  };
}

// Integer power by squaring, wrapping; negative exponents truncate 1 / a^-e toward zero.
template <class T, class E>
T int_pow(T a, E e) {
  if constexpr (std::is_signed_v<E>) {
    if (e < 0) {
      if (a == 1) return T(1);
      if constexpr (std::is_signed_v<T>)
        if (a == T(-1)) return T((e % 2) ? -1 : 1);
      return T(0);
    }
  }
  T result = 1;
  for (uint64_t n = static_cast<uint64_t>(e); n; n >>= 1) {
    if (n & 1) result = wrap_mul(result, a);
    a = wrap_mul(a, a);
  }
  return result;
}

// Pow: the exponent may have another dtype than the base; the output has the base's.
std::vector<Tensor> pow_kernel(const KernelContext& c) {
  const Tensor& a = c.input(0);
  const Tensor& b = c.input(1);
  check_legacy_broadcast(c);
  return {dispatch_only<kNumericTypes>(a.dtype(), c.where(), [&]<class T>() {
    return dispatch_only<kNumericTypes>(b.dtype(), c.where(), [&]<class E>() {
      return map_binary<T, E>(a, b, c.where(), [](T x, E y) {
        if constexpr (is_int_v<T> && is_int_v<E>)
          return int_pow(x, y);
        else
          return saturate_cast<T>(std::pow(static_cast<double>(static_cast<compute_t<T>>(x)),
                                           static_cast<double>(static_cast<compute_t<E>>(y))));
      });
    });
  })};
}

std::vector<Tensor> mod_kernel(const KernelContext& c) {
  int64_t fmod = c.node.attr_int("fmod");
  if (fmod != 0 && fmod != 1) throw ValueError(cat(c.where(), ": fmod must be 0 or 1, got ", fmod));
  return binary_kernel<kNumericTypes>(
      [c_style = fmod == 1](auto a, auto b) { return mod_value(a, b, c_style); })(c);
}

// BitShift: shifts of a negative or >= bit-width amount give what sign extension alone gives.
std::vector<Tensor> bitshift_kernel(const KernelContext& c) {
  std::string direction = c.attrs().get_string("direction", "");
  if (direction != "LEFT" && direction != "RIGHT")
    throw ValueError(
        cat(c.where(), ": direction must be 'LEFT' or 'RIGHT', got '", direction, "'"));
  bool left = direction == "LEFT";
  return binary_kernel<kIntTypes>([left](auto x, auto y) {
    using T = decltype(x);
    constexpr int bits = 8 * sizeof(T);
    // A negative y converts to a huge uint64, so one comparison checks both ends.
    if (static_cast<uint64_t>(y) >= static_cast<uint64_t>(bits)) {
      if constexpr (std::is_signed_v<T>)
        if (!left && x < 0) return T(-1);
      return T(0);
    }
    if (left) return static_cast<T>(static_cast<uint64_t>(x) << y);
    return static_cast<T>(x >> y);  // arithmetic for signed T (C++20)
  })(c);
}

// Comparisons: bool output, compared in the compute type. NaN compares unequal to everything.
template <uint32_t Types, class Cmp>
Kernel comparison(Cmp cmp) {
  return binary_kernel<Types>([cmp](auto a, auto b) {
    using C = compute_t<decltype(a)>;
    return cmp(static_cast<C>(a), static_cast<C>(b));
  });
}

// Sum, Mean, Max, Min over 1..N inputs of one dtype, broadcast together: the fold starts from the
// first input, `step` folds in each next one, `finish` gets the result and the input count.
template <uint32_t Types, class Step, class Finish>
Kernel variadic(Step step, Finish finish) {
  return [step, finish](const KernelContext& c) {
    if (c.inputs.empty()) throw ValueError(cat(c.where(), ": needs at least one input"));
    std::vector<Dims> shapes;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      check_same_dtype(c, c.input(0), c.input(i));
      shapes.push_back(c.input(i).shape());
    }
    std::vector<std::vector<int64_t>> off;
    Dims shape = broadcast_all(shapes, c.where(), &off);
    return std::vector<Tensor>{dispatch_only<Types>(c.input(0).dtype(), c.where(), [&]<class T>() {
      // Floats accumulate in double, rounding once; integers in T (wrapping).
      using Acc = std::conditional_t<is_int_v<T>, T, double>;
      Tensor y = Tensor::empty(dtype_of<T>, shape);
      T* out = y.data<T>();
      auto value = [&](size_t k, int64_t i) {
        return static_cast<Acc>(static_cast<compute_t<T>>(c.inputs[k].data<T>()[off[k][i]]));
      };
      for (int64_t i = 0; i < y.numel(); ++i) {
        Acc acc = value(0, i);
        for (size_t k = 1; k < c.inputs.size(); ++k) acc = step(acc, value(k, i));
        out[i] = static_cast<T>(static_cast<compute_t<T>>(finish(acc, c.inputs.size())));
      }
      return y;
    })};
  };
}

// Max/Min propagate NaN (numpy's maximum/minimum, ONNX's reference).
template <class A>
A nan_max(A a, A b) {
  if constexpr (!is_int_v<A>)
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<A>::quiet_NaN();
  return std::max(a, b);
}
template <class A>
A nan_min(A a, A b) {
  if constexpr (!is_int_v<A>)
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<A>::quiet_NaN();
  return std::min(a, b);
}

std::vector<Tensor> where_kernel(const KernelContext& c) {
  const Tensor& cond = c.input(0);
  const Tensor& x = c.input(1);
  const Tensor& y = c.input(2);
  if (cond.dtype() != DType::kBool)
    throw TypeError(cat(c.where(), ": condition must be bool, got ", dtype_name(cond.dtype())));
  check_same_dtype(c, x, y);
  std::vector<std::vector<int64_t>> off;
  Dims shape = broadcast_all({cond.shape(), x.shape(), y.shape()}, c.where(), &off);
  return {dispatch_only<kAllTypes>(x.dtype(), c.where(), [&]<class T>() {
    Tensor out = Tensor::empty(x.dtype(), shape);
    const bool* pc = cond.data<bool>();
    const T* px = x.data<T>();
    const T* py = y.data<T>();
    T* po = out.data<T>();
    for (int64_t i = 0; i < out.numel(); ++i) po[i] = pc[off[0][i]] ? px[off[1][i]] : py[off[2][i]];
    return out;
  })};
}

}  // namespace

void register_binary_kernels(KernelRegistry& r) {
  r.add("Add", binary_kernel<kNumericTypes>(arith([](auto a, auto b) { return a + b; },
                                                  [](auto a, auto b) { return wrap_add(a, b); })));
  r.add("Sub", binary_kernel<kNumericTypes>(arith([](auto a, auto b) { return a - b; },
                                                  [](auto a, auto b) { return wrap_sub(a, b); })));
  r.add("Mul", binary_kernel<kNumericTypes>(arith([](auto a, auto b) { return a * b; },
                                                  [](auto a, auto b) { return wrap_mul(a, b); })));
  r.add("Div", binary_kernel<kNumericTypes>(arith([](auto a, auto b) { return a / b; },
                                                  [](auto a, auto b) { return int_div(a, b); })));
  r.add("Pow", pow_kernel);
  r.add("Mod", mod_kernel);
  r.add("BitShift", bitshift_kernel);

  r.add("BitwiseAnd", binary_kernel<kIntTypes>([](auto a, auto b) { return decltype(a)(a & b); }));
  r.add("BitwiseOr", binary_kernel<kIntTypes>([](auto a, auto b) { return decltype(a)(a | b); }));
  r.add("BitwiseXor", binary_kernel<kIntTypes>([](auto a, auto b) { return decltype(a)(a ^ b); }));
  r.add("And", binary_kernel<kBoolType>([](bool a, bool b) { return a && b; }));
  r.add("Or", binary_kernel<kBoolType>([](bool a, bool b) { return a || b; }));
  r.add("Xor", binary_kernel<kBoolType>([](bool a, bool b) { return a != b; }));

  r.add("Equal", comparison<kAllTypes>([](auto a, auto b) { return a == b; }));
  r.add("Less", comparison<kNumericTypes>([](auto a, auto b) { return a < b; }));
  r.add("Greater", comparison<kNumericTypes>([](auto a, auto b) { return a > b; }));
  r.add("LessOrEqual", comparison<kNumericTypes>([](auto a, auto b) { return a <= b; }));
  r.add("GreaterOrEqual", comparison<kNumericTypes>([](auto a, auto b) { return a >= b; }));

  auto same = [](auto acc, size_t) { return acc; };
  r.add("Sum", variadic<kNumericTypes>(
                   [](auto a, auto b) {
                     if constexpr (is_int_v<decltype(a)>)
                       return wrap_add(a, b);
                     else
                       return a + b;
                   },
                   same));
  r.add("Mean", variadic<kFloatTypes>([](auto a, auto b) { return a + b; },
                                      [](auto acc, size_t n) { return acc / double(n); }));
  r.add("Max", variadic<kNumericTypes>([](auto a, auto b) { return nan_max(a, b); }, same));
  r.add("Min", variadic<kNumericTypes>([](auto a, auto b) { return nan_min(a, b); }, same));
  r.add("Where", where_kernel);
}

}  // namespace pto::reference
