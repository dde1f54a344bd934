// Reference kernels for elementwise ops. Half types compute in float and round once.
#include <cmath>

#include "kernel_util.h"

namespace pto::reference {
namespace {

// out[i] = f(x[i]) over the dtypes in `types`.
template <class F>
Kernel unary_kernel(uint32_t types, F f) {
  return [types, f](const KernelContext& c) {
    const Tensor& x = c.input(0);
    Tensor y = Tensor::empty(x.dtype(), x.shape());
    dispatch(x.dtype(), types, c.where(), [&]<class T>() {
      const T* in = x.data<T>();
      T* out = y.data<T>();
      for (int64_t i = 0; i < x.numel(); ++i)
        out[i] = static_cast<T>(f(static_cast<compute_t<T>>(in[i])));
    });
    return std::vector<Tensor>{y};
  };
}

// out = f(a, b) with numpy broadcasting; both inputs must share a dtype.
template <class F>
Kernel binary_kernel(uint32_t types, F f) {
  return [types, f](const KernelContext& c) {
    const Tensor& a = c.input(0);
    const Tensor& b = c.input(1);
    if (a.dtype() != b.dtype())
      throw TypeError(cat(c.where(), ": input dtypes differ: ", dtype_name(a.dtype()), " and ",
                          dtype_name(b.dtype())));
    std::vector<std::vector<int64_t>> off;
    Dims shape = broadcast_all({a.shape(), b.shape()}, c.where(), &off);
    Tensor y = Tensor::empty(a.dtype(), shape);
    dispatch(a.dtype(), types, c.where(), [&]<class T>() {
      const T* pa = a.data<T>();
      const T* pb = b.data<T>();
      T* out = y.data<T>();
      for (int64_t i = 0; i < y.numel(); ++i)
        out[i] = static_cast<T>(
            f(static_cast<compute_t<T>>(pa[off[0][i]]), static_cast<compute_t<T>>(pb[off[1][i]])));
    });
    return std::vector<Tensor>{y};
  };
}

}  // namespace

void register_elementwise_kernels(KernelRegistry& r) {
  r.add("Relu",
        unary_kernel(kFloatTypes | kSignedInts, [](auto x) { return x > 0 ? x : decltype(x)(0); }));
  r.add("Exp", unary_kernel(kFloatTypes, [](auto x) { return std::exp(x); }));
  r.add("Add", binary_kernel(kNumericTypes, [](auto a, auto b) { return a + b; }));
  r.add("Sub", binary_kernel(kNumericTypes, [](auto a, auto b) { return a - b; }));
  r.add("Mul", binary_kernel(kNumericTypes, [](auto a, auto b) { return a * b; }));
  r.add("Div", binary_kernel(kNumericTypes, [](auto a, auto b) { return a / b; }));
}

}  // namespace pto::reference
