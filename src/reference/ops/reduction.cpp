// Reference kernels for the Reduce* family and ArgMax/ArgMin.
//
// A reduction maps every input element to the output element it folds into (the input's index
// with reduced axes zeroed), then folds in one pass. Floats accumulate in double; integer sums and
// products wrap modulo 2^bits like numpy; L2, LogSum, LogSumExp and Mean on integers compute in
// double and truncate (saturating). Reducing an empty set gives the op's identity: 0 for sums,
// 1 for products, lowest / -inf for max, highest / +inf for min, NaN for mean, -inf for LogSum.
// With noop_with_empty_axes and no axes, each element is reduced alone (as the ONNX reference
// does): ReduceSumSquare then squares, ReduceL2 takes |x| and so on.
#include <algorithm>
#include <cmath>
#include <limits>

#include "index_math.h"
#include "ir/ops/op_params.h"

namespace pto::reference {

void register_scan_kernels(KernelRegistry& r);  // reduction_scan.cpp: CumSum, CumProd, TopK

namespace {

enum class Op { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare };

struct Plan {
  Dims out_shape;  // what the node returns (keepdims applied)
  int64_t out_numel = 0;
  std::vector<int64_t> out_of;  // output element of each input element
  std::vector<int64_t> count;   // input elements folded into each output element
};

// Which axes the node reduces: the `axes` input, else the `axes` attribute; none given means all
// of them unless noop_with_empty_axes.
std::vector<bool> reduced_axes(const KernelContext& c, int64_t rank) {
  std::optional<std::vector<int64_t>> axes;
  if (c.has_input(1)) {
    const Tensor& a = c.input(1);
    if (a.rank() > 1)
      throw ValueError(cat(c.where(), ": axes must be a 1-D tensor, got ", a.str()));
    axes = index_values(a, c.where(), "axes");
  }
  return params::reduce(c.node, axes).reduced(rank, c.where());
}

Plan make_plan(const KernelContext& c, const Tensor& x) {
  const Dims& in = x.shape();
  const int64_t rank = x.rank();
  std::vector<bool> reduced = reduced_axes(c, rank);
  const bool keepdims = params::reduce(c.node, {}).keepdims;
  Plan p;
  Dims kept(in);  // the keepdims shape: reduced axes become 1
  for (int64_t k = 0; k < rank; ++k) {
    if (reduced[k]) kept[k] = 1;
    if (!reduced[k])
      p.out_shape.push_back(in[k]);
    else if (keepdims)
      p.out_shape.push_back(1);
  }
  p.out_numel = checked_numel(kept);
  Dims kept_strides = contiguous_strides(kept);
  for (int64_t k = 0; k < rank; ++k)
    if (reduced[k]) kept_strides[k] = 0;
  p.out_of.resize(x.numel());
  p.count.assign(p.out_numel, 0);
  Dims idx(rank, 0);
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t o = 0;
    for (int64_t k = 0; k < rank; ++k) o += idx[k] * kept_strides[k];
    p.out_of[i] = o;
    ++p.count[o];
    for (int64_t k = rank - 1; k >= 0 && ++idx[k] == in[k]; --k) idx[k] = 0;  // odometer
  }
  return p;
}

// Max that propagates NaN (numpy's maximum.reduce).
double nan_max(double a, double b) {
  return std::isnan(a) || a >= b ? a : b;
}
double nan_min(double a, double b) {
  return std::isnan(a) || a <= b ? a : b;
}

// Floating-point inputs, and the double-precision path for integer L2 / LogSum / LogSumExp.
template <class T>
void reduce_in_double(Op op, const T* x, T* y, const Plan& p) {
  const int64_t n = static_cast<int64_t>(p.out_of.size());
  auto val = [&](int64_t i) { return static_cast<double>(static_cast<compute_t<T>>(x[i])); };
  double init = op == Op::kProd  ? 1.0
                : op == Op::kMax ? -INFINITY
                : op == Op::kMin ? INFINITY
                                 : 0.0;
  std::vector<double> acc(p.out_numel, init);
  std::vector<double> shift(op == Op::kLogSumExp ? p.out_numel : 0, -INFINITY);
  if (op == Op::kLogSumExp) {  // subtract the largest finite element for stability
    for (int64_t i = 0; i < n; ++i)
      if (std::isfinite(val(i))) shift[p.out_of[i]] = std::max(shift[p.out_of[i]], val(i));
    for (double& s : shift)
      if (!std::isfinite(s)) s = 0;
  }
  for (int64_t i = 0; i < n; ++i) {
    double v = val(i);
    double& a = acc[p.out_of[i]];
    switch (op) {
      case Op::kSum:
      case Op::kMean:
      case Op::kLogSum:
        a += v;
        break;
      case Op::kL1:
        a += std::fabs(v);
        break;
      case Op::kL2:
      case Op::kSumSquare:
        a += v * v;
        break;
      case Op::kProd:
        a *= v;
        break;
      case Op::kMax:
        a = nan_max(a, v);
        break;
      case Op::kMin:
        a = nan_min(a, v);
        break;
      case Op::kLogSumExp:
        a += std::exp(v - shift[p.out_of[i]]);
        break;
    }
  }
  for (int64_t o = 0; o < p.out_numel; ++o) {
    double a = acc[o];
    switch (op) {
      case Op::kMean:
        a = a / static_cast<double>(p.count[o]);
        break;
      case Op::kL2:
        a = std::sqrt(a);
        break;
      case Op::kLogSum:
        a = std::log(a);
        break;
      case Op::kLogSumExp:
        a = std::log(a) + shift[o];
        break;
      default:
        break;
    }
    y[o] = saturate_cast<T>(a);
  }
}

// |v| modulo 2^bits: the absolute value of the lowest integer is itself, as in numpy.
template <class T>
T wrap_abs(T v) {
  if constexpr (std::is_signed_v<T>)
    return v < 0 ? static_cast<T>(0 - static_cast<uint64_t>(v)) : v;
  else
    return v;
}

// Integer sums, products, min and max, exactly and wrapping; mean truncates toward zero.
template <class T>
void reduce_integer(Op op, const T* x, T* y, const Plan& p) {
  const int64_t n = static_cast<int64_t>(p.out_of.size());
  T init = op == Op::kProd  ? T(1)
           : op == Op::kMax ? std::numeric_limits<T>::lowest()
           : op == Op::kMin ? std::numeric_limits<T>::max()
                            : T(0);
  std::vector<T> acc(p.out_numel, init);
  for (int64_t i = 0; i < n; ++i) {
    T v = x[i];
    T& a = acc[p.out_of[i]];
    switch (op) {
      case Op::kSum:
      case Op::kMean:
        a = wrap_add(a, v);
        break;
      case Op::kL1:
        a = wrap_add(a, wrap_abs(v));
        break;
      case Op::kSumSquare:
        a = wrap_add(a, wrap_mul(v, v));
        break;
      case Op::kProd:
        a = wrap_mul(a, v);
        break;
      case Op::kMax:
        a = std::max(a, v);
        break;
      case Op::kMin:
        a = std::min(a, v);
        break;
      default:
        PTO_CHECK(false) << "reduce_integer: op goes through double";
    }
  }
  for (int64_t o = 0; o < p.out_numel; ++o) {
    T a = acc[o];
    if (op == Op::kMean) {
      const int64_t cnt = p.count[o];
      if (cnt == 0)
        a = 0;
      else if constexpr (std::is_signed_v<T>)
        a = static_cast<T>(static_cast<int64_t>(a) / cnt);  // cnt > 0: never INT64_MIN / -1
      else
        a = static_cast<T>(static_cast<uint64_t>(a) / static_cast<uint64_t>(cnt));
    }
    y[o] = a;
  }
}

Kernel reduce_kernel(Op op) {
  const bool logical = op == Op::kMax || op == Op::kMin;  // defined on bool
  const bool float_only = op == Op::kLogSum || op == Op::kLogSumExp || op == Op::kL2;
  return [op, logical, float_only](const KernelContext& c) {
    const Tensor& x = c.input(0);
    if ((op == Op::kLogSum || op == Op::kLogSumExp) && c.node.opset >= 28 &&
        !is_floating(x.dtype()))
      throw TypeError(cat(c.where(), ": integer inputs were removed in opset 28, got ", x.str()));
    Plan p = make_plan(c, x);
    Tensor y = Tensor::empty(x.dtype(), p.out_shape);
    dispatch(x.dtype(), kNumericTypes | (logical ? kBoolType : 0u), c.where(), [&]<class T>() {
      const T* in = x.data<T>();
      T* out = y.data<T>();
      if constexpr (std::is_same_v<T, bool>) {
        // max is any, min is all; the empty max is false and the empty min true.
        std::vector<bool> acc(p.out_numel, op == Op::kMin);
        for (size_t i = 0; i < p.out_of.size(); ++i)
          acc[p.out_of[i]] = op == Op::kMax ? acc[p.out_of[i]] || in[i] : acc[p.out_of[i]] && in[i];
        for (int64_t o = 0; o < p.out_numel; ++o) out[o] = acc[o];
      } else if constexpr (std::is_integral_v<T>) {
        if (float_only)
          reduce_in_double(op, in, out, p);
        else
          reduce_integer(op, in, out, p);
      } else {
        reduce_in_double(op, in, out, p);
      }
    });
    return std::vector<Tensor>{y};
  };
}

// ArgMax / ArgMin along `axis`. NaN counts as the extreme for both (numpy's argmax / argmin
// return the first NaN); select_last_index picks the last of equal extremes.
Kernel arg_kernel(bool is_max) {
  return [is_max](const KernelContext& c) {
    const Tensor& x = c.input(0);
    const int64_t axis = normalize_axis(c.node.attr_int("axis"), x.rank(), c.where());
    const bool keepdims = c.node.attr_int("keepdims") != 0;
    const bool last = c.node.attr_int("select_last_index") != 0;
    const Dims& in = x.shape();
    const int64_t n = in[axis];
    const int64_t outer = dims_product(in, 0, axis), inner = dims_product(in, axis + 1, in.size());
    Dims out_shape;
    for (int64_t k = 0; k < x.rank(); ++k)
      if (k != axis)
        out_shape.push_back(in[k]);
      else if (keepdims)
        out_shape.push_back(1);
    Tensor y = Tensor::empty(DType::kI64, out_shape);
    if (y.numel() == 0) return std::vector<Tensor>{y};
    if (n == 0)
      throw ValueError(cat(c.where(), ": cannot take the arg", is_max ? "max" : "min",
                           " of an empty axis ", axis));
    int64_t* out = y.data<int64_t>();
    dispatch(x.dtype(), kNumericTypes, c.where(), [&]<class T>() {
      using C = compute_t<T>;
      const T* p = x.data<T>();
      // true when a should replace the current best b (strictly better, or equal and `last`).
      auto better = [&](C a, C b) {
        if constexpr (std::is_floating_point_v<C>) {
          if (std::isnan(b)) return last && std::isnan(a);
          if (std::isnan(a)) return true;
        }
        if (a == b) return last;
        return is_max ? a > b : a < b;
      };
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
          const T* line = p + o * n * inner + i;
          int64_t best = 0;
          for (int64_t j = 1; j < n; ++j)
            if (better(static_cast<C>(line[j * inner]), static_cast<C>(line[best * inner])))
              best = j;
          out[o * inner + i] = best;
        }
    });
    return std::vector<Tensor>{y};
  };
}

}  // namespace

void register_reduction_kernels(KernelRegistry& r) {
  r.add("ReduceSum", reduce_kernel(Op::kSum));
  r.add("ReduceMean", reduce_kernel(Op::kMean));
  r.add("ReduceMax", reduce_kernel(Op::kMax));
  r.add("ReduceMin", reduce_kernel(Op::kMin));
  r.add("ReduceProd", reduce_kernel(Op::kProd));
  r.add("ReduceL1", reduce_kernel(Op::kL1));
  r.add("ReduceL2", reduce_kernel(Op::kL2));
  r.add("ReduceLogSum", reduce_kernel(Op::kLogSum));
  r.add("ReduceLogSumExp", reduce_kernel(Op::kLogSumExp));
  r.add("ReduceSumSquare", reduce_kernel(Op::kSumSquare));
  r.add("ArgMax", arg_kernel(true));
  r.add("ArgMin", arg_kernel(false));
  register_scan_kernels(r);
}

}  // namespace pto::reference
