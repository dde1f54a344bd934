// Reference kernels for activation functions (Relu ... Shrink, PRelu, Clip). Written on the
// compute type (float for half types, else the type itself) and rounded once.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "elementwise_util.h"

namespace pto::reference {
namespace {

template <class F>
F sigmoid(F v) {
  // Two forms so that exp never overflows.
  if (v >= 0) return F(1) / (F(1) + std::exp(-v));
  F e = std::exp(v);
  return e / (F(1) + e);
}

template <class F>
F softplus(F v) {
  // log(1 + exp(v)) without overflow for large v.
  return v > 0 ? v + std::log1p(std::exp(-v)) : std::log1p(std::exp(v));
}

// A float activation whose function depends on attributes: make(attrs) returns g(v).
template <class Make>
Kernel float_attr_kernel(Make make) {
  return [make](const KernelContext& c) { return float_kernel(make(c))(c); };
}

// ONNX float attributes are float32: a value, or the schema's default, rounds through float.
double attr(const KernelContext& c, const char* name) {
  return static_cast<float>(c.node.attr_float(name));
}

Tensor scalar_bound(const KernelContext& c, size_t i, const char* what) {
  const Tensor& t = c.input(i);
  if (t.numel() != 1)
    throw ValueError(cat(c.where(), ": '", what, "' must be a scalar, got ", t.str()));
  if (t.dtype() != c.input(0).dtype())
    throw TypeError(cat(c.where(), ": '", what, "' is ", dtype_name(t.dtype()), ", input is ",
                        dtype_name(c.input(0).dtype())));
  return t;
}

// Clip: min(max(x, lo), hi), so lo > hi gives hi everywhere; NaN stays NaN. Before opset 11 the
// bounds are float attributes, from 11 optional scalar inputs.
std::vector<Tensor> clip(const KernelContext& c) {
  const Tensor& x = c.input(0);
  bool attrs = c.node.opset > 0 && c.node.opset < 11;
  if (!attrs && c.inputs.size() > 3)
    throw ValueError(cat(c.where(), ": expected at most 3 inputs"));
  return {dispatch_only<kNumericTypes>(x.dtype(), c.where(), [&]<class T>() {
    using C = compute_t<T>;
    C lo = std::numeric_limits<C>::lowest(), hi = std::numeric_limits<C>::max();
    if (attrs) {
      if constexpr (!is_int_v<T>) {
        lo = static_cast<C>(c.attrs().get_float("min", -std::numeric_limits<double>::infinity()));
        hi = static_cast<C>(c.attrs().get_float("max", std::numeric_limits<double>::infinity()));
      } else {
        throw UnsupportedError(cat(c.where(), ": integer inputs need opset 12 or later"));
      }
    } else {
      if (c.has_input(1)) lo = static_cast<C>(scalar_bound(c, 1, "min").template data<T>()[0]);
      if (c.has_input(2)) hi = static_cast<C>(scalar_bound(c, 2, "max").template data<T>()[0]);
    }
    return map_unary<T>(x, [lo, hi](T x) {
      C v = static_cast<C>(x);
      if constexpr (!is_int_v<T>)
        if (std::isnan(v)) return x;
      return static_cast<T>(std::min(std::max(v, lo), hi));
    });
  })};
}

// PRelu: slope * x where x < 0. Slope broadcasts to X's shape (one direction only).
std::vector<Tensor> prelu(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const Tensor& slope = c.input(1);
  check_same_dtype(c, x, slope);
  Dims shape = broadcast_dims(x.shape(), slope.shape(), c.where());
  if (shape != x.shape())
    throw ValueError(cat(c.where(), ": slope ", slope.str(), " does not broadcast to X ", x.str()));
  return {dispatch_only<kFloatTypes | kIntTypes>(x.dtype(), c.where(), [&]<class T>() {
    return map_binary<T, T>(x, slope, c.where(), [](T v, T s) {
      if constexpr (is_int_v<T>)
        return v < 0 ? wrap_mul(v, s) : v;
      else
        return v < 0 ? static_cast<T>(static_cast<compute_t<T>>(s) * static_cast<compute_t<T>>(v))
                     : v;
    });
  })};
}

}  // namespace

void register_activation_kernels(KernelRegistry& r) {
  r.add("Relu", unary_kernel<kFloatTypes | kSignedInts>([](auto x) {
          using T = decltype(x);
          if constexpr (is_int_v<T>) {
            return x > 0 ? x : T(0);
          } else {
            compute_t<T> v = static_cast<compute_t<T>>(x);
            return v > 0 || std::isnan(v) ? x : T(0);
          }
        }));
  r.add("Sigmoid", float_kernel([](auto v) { return sigmoid(v); }));
  r.add("Tanh", float_kernel([](auto v) { return std::tanh(v); }));
  r.add("Softplus", float_kernel([](auto v) { return softplus(v); }));
  r.add("Softsign", float_kernel([](auto v) { return v / (decltype(v)(1) + std::fabs(v)); }));
  r.add("Mish", float_kernel([](auto v) { return v * std::tanh(softplus(v)); }));
  r.add("HardSwish", float_kernel([](auto v) {
          using F = decltype(v);
          return v * std::max(F(0), std::min(F(1), v / F(6) + F(0.5)));
        }));

  r.add("Elu", float_attr_kernel([](const KernelContext& c) {
          double alpha = attr(c, "alpha");
          return [alpha](auto v) {
            using F = decltype(v);
            return v < 0 ? F(alpha) * std::expm1(v) : v;
          };
        }));
  r.add("Selu", float_attr_kernel([](const KernelContext& c) {
          double alpha = attr(c, "alpha");
          double gamma = attr(c, "gamma");
          return [alpha, gamma](auto v) {
            using F = decltype(v);
            return v > 0 ? F(gamma) * v : F(gamma) * (F(alpha) * std::exp(v) - F(alpha));
          };
        }));
  r.add("Celu", float_attr_kernel([](const KernelContext& c) {
          double alpha = attr(c, "alpha");
          if (alpha == 0) throw ValueError(cat(c.where(), ": alpha must be nonzero"));
          return [alpha](auto v) {
            using F = decltype(v);
            return std::max(F(0), v) + std::min(F(0), F(alpha) * std::expm1(v / F(alpha)));
          };
        }));
  r.add("LeakyRelu", float_attr_kernel([](const KernelContext& c) {
          double alpha = attr(c, "alpha");
          return [alpha](auto v) { return v < 0 ? decltype(v)(alpha) * v : v; };
        }));
  r.add("HardSigmoid", float_attr_kernel([](const KernelContext& c) {
          double alpha = attr(c, "alpha"), beta = attr(c, "beta");
          return [alpha, beta](auto v) {
            using F = decltype(v);
            return std::max(F(0), std::min(F(1), F(alpha) * v + F(beta)));
          };
        }));
  r.add("ThresholdedRelu", float_attr_kernel([](const KernelContext& c) {
          double alpha = attr(c, "alpha");
          return [alpha](auto v) { return v > decltype(v)(alpha) ? v : decltype(v)(0); };
        }));
  r.add("Swish", float_attr_kernel([](const KernelContext& c) {
          double alpha = attr(c, "alpha");
          return [alpha](auto v) { return v * sigmoid(decltype(v)(alpha) * v); };
        }));
  r.add("SwiGLU", [](const KernelContext& c) {
    const Tensor &a = c.input(0), &b = c.input(1);
    if (a.shape() != b.shape() || a.dtype() != b.dtype())
      throw ValueError(
          cat(c.where(), ": A ", a.str(), " and B ", b.str(), " must have one shape and dtype"));
    const double alpha = c.node.attr_float("alpha");
    std::vector<double> x = to_doubles(a, c.where()), y = to_doubles(b, c.where());
    for (size_t i = 0; i < x.size(); ++i) x[i] = x[i] / (1 + std::exp(-alpha * x[i])) * y[i];
    return std::vector<Tensor>{from_doubles(a.dtype(), a.shape(), x, c.where())};
  });
  r.add("Gelu", float_attr_kernel([](const KernelContext& c) {
          std::string approximate = c.node.attr_string("approximate");
          if (approximate != "none" && approximate != "tanh")
            throw ValueError(
                cat(c.where(), ": approximate must be 'none' or 'tanh', got '", approximate, "'"));
          bool tanh = approximate == "tanh";
          return [tanh](auto v) {
            using F = decltype(v);
            if (tanh) {
              F k = static_cast<F>(std::sqrt(2.0 / std::numbers::pi));
              return F(0.5) * v * (F(1) + std::tanh(k * (v + F(0.044715) * v * v * v)));
            }
            return F(0.5) * v * (F(1) + std::erf(v / static_cast<F>(std::numbers::sqrt2)));
          };
        }));

  // Shrink allows integer inputs too: computed in double, truncated back like numpy's astype.
  r.add("Shrink", [](const KernelContext& c) {
    double lambd = c.node.attr_float("lambd"), bias = c.node.attr_float("bias");
    return unary_kernel<kNumericTypes>([lambd, bias](auto x) {
      using T = decltype(x);
      double v = static_cast<double>(static_cast<compute_t<T>>(x));
      return saturate_cast<T>(v < -lambd ? v + bias : (v > lambd ? v - bias : 0.0));
    })(c);
  });
  r.add("PRelu", prelu);
  r.add("Clip", clip);
}

}  // namespace pto::reference
