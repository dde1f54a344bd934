// Reference kernels for the scans CumSum / CumProd and for TopK. Each works line by line along
// one axis of the input viewed as [outer, n, inner].
#include <algorithm>
#include <cmath>
#include <numeric>

#include "index_math.h"
#include "topk_plan.h"

namespace pto::reference {
namespace {

// CumSum / CumProd: running sum (product) along the axis given by input 1; `exclusive` leaves
// out the current element, `reverse` runs from the end. Floats accumulate in double, integers
// wrap like numpy.
Kernel scan_kernel(bool product) {
  return [product](const KernelContext& c) {
    const Tensor& x = c.input(0);
    const int64_t axis = normalize_axis(scalar_int(c.input(1), c.where(), "axis"),
                                        std::max<int64_t>(x.rank(), 1), c.where());
    const bool exclusive = c.node.attr_int("exclusive") != 0;
    const bool reverse = c.node.attr_int("reverse") != 0;
    const Dims& s = x.shape();
    const int64_t n = x.rank() ? s[axis] : 1;
    const int64_t outer = dims_product(s, 0, axis), inner = dims_product(s, axis + 1, s.size());
    Tensor y = Tensor::empty(x.dtype(), s);
    if (y.numel() == 0) return std::vector<Tensor>{y};
    dispatch(x.dtype(), kNumericTypes, c.where(), [&]<class T>() {
      using Acc = std::conditional_t<std::is_integral_v<T>, T, double>;
      const T* in = x.data<T>();
      T* out = y.data<T>();
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
          Acc acc = product ? Acc(1) : Acc(0);
          for (int64_t step = 0; step < n; ++step) {
            const int64_t at = (o * n + (reverse ? n - 1 - step : step)) * inner + i;
            const Acc prev = acc;
            if constexpr (std::is_integral_v<T>)
              acc = product ? wrap_mul(acc, in[at]) : wrap_add(acc, in[at]);
            else
              acc = product ? acc * static_cast<double>(static_cast<compute_t<T>>(in[at]))
                            : acc + static_cast<double>(static_cast<compute_t<T>>(in[at]));
            out[at] = static_cast<T>(exclusive ? prev : acc);
          }
        }
    });
    return std::vector<Tensor>{y};
  };
}

// TopK: the k largest (largest=1) or smallest values along `axis`, ordered best first, ties by
// lower index (the ONNX reference's stable order). NaN orders above every number, as in the
// reference's lexsort. `sorted=0` allows any order; this kernel always sorts.
std::vector<Tensor> top_k(const KernelContext& c) {
  const TopKPlan p = topk_plan(c);
  const Tensor& x = c.input(0);
  const int64_t n = p.n, k = p.k, inner = p.inner;
  Tensor values = Tensor::empty(x.dtype(), p.out_shape);
  Tensor indices = Tensor::empty(DType::kI64, p.out_shape);
  if (values.numel() == 0) return {values, indices};
  int64_t* pi = indices.data<int64_t>();
  dispatch(x.dtype(), kNumericTypes, c.where(), [&]<class T>() {
    using C = compute_t<T>;
    const T* in = x.data<T>();
    T* pv = values.data<T>();
    std::vector<int64_t> order(n);
    for (int64_t o = 0; o < p.outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        const T* line = in + o * n * inner + i;
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
          return topk_before(p.largest, static_cast<C>(line[a * inner]),
                             static_cast<C>(line[b * inner]));
        });
        for (int64_t j = 0; j < k; ++j) {
          const int64_t at = (o * k + j) * inner + i;
          pv[at] = line[order[j] * inner];
          pi[at] = order[j];
        }
      }
  });
  return {values, indices};
}

}  // namespace

TopKPlan topk_plan(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& x = c.input(0);
  TopKPlan p;
  if (c.has_input(1))
    p.k = scalar_int(c.input(1), w, "k");
  else if (c.attrs().has("k"))
    p.k = c.attrs().get_int("k");
  else
    throw ValueError(cat(w, ": k is neither an input nor an attribute"));
  if (x.rank() == 0) throw ValueError(cat(w, ": input must have rank >= 1"));
  p.axis = normalize_axis(c.node.attr_int("axis"), x.rank(), w);
  p.largest = c.node.attr_int("largest") != 0;
  const Dims& s = x.shape();
  p.n = s[p.axis];
  if (p.k < 0 || p.k > p.n)
    throw ValueError(
        cat(w, ": k = ", p.k, " is outside [0, ", p.n, "] (the size of axis ", p.axis, ")"));
  p.outer = dims_product(s, 0, p.axis);
  p.inner = dims_product(s, p.axis + 1, s.size());
  p.out_shape = s;
  p.out_shape[p.axis] = p.k;
  return p;
}

void register_scan_kernels(KernelRegistry& r) {
  r.add("CumSum", scan_kernel(false));
  r.add("CumProd", scan_kernel(true));
  r.add("TopK", top_k);
}

}  // namespace pto::reference
