// Reference kernels for linear quantization. Arithmetic follows the ONNX reference: division in
// the input's precision, round half to even, saturate to the target integer range.
#include <cmath>

#include "kernel_util.h"

namespace pto::reference {
namespace {

// For each element of a tensor of shape `x`, the index into a scale / zero-point tensor `s` that
// is a scalar, a 1-D per-axis vector, or a blocked tensor (block_size > 0).
std::vector<int64_t> param_index(const Dims& x, const Dims& s, int64_t axis, int64_t block,
                                 const std::string& where) {
  const int64_t n = checked_numel(x);
  std::vector<int64_t> idx(n, 0);
  const int64_t s_numel = checked_numel(s);
  if (s_numel == 1) return idx;
  const int64_t rank = static_cast<int64_t>(x.size());
  axis = normalize_axis(axis, rank, where);
  Dims coord(rank);
  if (block <= 0) {
    if (s.size() != 1 || s[0] != x[axis])
      throw ValueError(cat(where, ": per-axis scale ", dims_str(s), " must be 1-D of length ",
                           x[axis], " (axis ", axis, ")"));
    for (int64_t i = 0; i < n; ++i) {
      unravel(i, x, coord);
      idx[i] = coord[axis];
    }
    return idx;
  }
  if (static_cast<int64_t>(s.size()) != rank)
    throw ValueError(
        cat(where, ": blocked scale ", dims_str(s), " must have the rank of ", dims_str(x)));
  for (int64_t d = 0; d < rank; ++d) {
    bool ok = d == axis ? (s[d] * block >= x[d] && (s[d] - 1) * block < std::max<int64_t>(x[d], 1))
                        : s[d] == x[d];
    if (!ok)
      throw ValueError(cat(where, ": blocked scale ", dims_str(s), " does not fit input ",
                           dims_str(x), " with block_size ", block, " on axis ", axis));
  }
  Dims sstr = contiguous_strides(s);
  for (int64_t i = 0; i < n; ++i) {
    unravel(i, x, coord);
    int64_t off = 0;
    for (int64_t d = 0; d < rank; ++d) off += (d == axis ? coord[d] / block : coord[d]) * sstr[d];
    idx[i] = off;
  }
  return idx;
}

template <class T>
std::pair<double, double> int_range() {
  return {static_cast<double>(std::numeric_limits<T>::lowest()),
          static_cast<double>(std::numeric_limits<T>::max())};
}

std::vector<Tensor> quantize_linear(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor &X = c.input(0), &S = c.input(1);
  const auto& a = c.attrs();
  DType out = DType::kU8;
  if (c.has_input(2))
    out = c.input(2).dtype();
  else if (c.node.attr_int("output_dtype") != 0)
    out = dtype_from_onnx_code(a.get_int("output_dtype"), w);
  if (c.node.attr_int("output_dtype") != 0 && c.has_input(2) &&
      dtype_from_onnx_code(a.get_int("output_dtype"), w) != out)
    throw TypeError(cat(w, ": output_dtype differs from the zero point's dtype"));
  if (c.node.opset < 21 && S.rank() > 1)
    throw ValueError(cat(w, ": y_scale must be a scalar or a vector before opset 21"));
  const int64_t axis = c.node.attr_int("axis"), block = c.node.attr_int("block_size");
  std::vector<int64_t> si = param_index(X.shape(), S.shape(), axis, block, w);
  std::vector<double> s = to_doubles(S, w);
  std::vector<double> zp(s.size(), 0.0);
  if (c.has_input(2)) {
    const Tensor& Z = c.input(2);
    if (Z.shape() != S.shape())
      throw ValueError(cat(w, ": zero point ", Z.str(), " must match the scale ", S.str()));
    zp = to_doubles(Z, w);
  }
  // The division happens in the input's precision (or `precision`, opset 23+).
  DType prec =
      c.node.attr_int("precision") ? dtype_from_onnx_code(a.get_int("precision"), w) : X.dtype();
  std::vector<double> x = to_doubles(X, w);
  Tensor y = Tensor::empty(out, X.shape());
  dispatch(out, kIntTypes, w, [&]<class Q>() {
    if constexpr (sizeof(Q) > 2) {
      throw UnsupportedError(cat(w, ": quantizing to ", dtype_name(out), " is not supported"));
    } else {
      auto [lo, hi] = int_range<Q>();
      Q* p = y.data<Q>();
      dispatch(prec, kFloatTypes, w, [&]<class P>() {
        for (int64_t i = 0; i < X.numel(); ++i) {
          using C = compute_t<P>;
          P q = static_cast<P>(static_cast<C>(static_cast<P>(static_cast<C>(x[i]))) /
                               static_cast<C>(static_cast<P>(static_cast<C>(s[si[i]]))));
          double r = std::nearbyint(static_cast<double>(static_cast<C>(q)));
          if (std::isnan(r)) r = 0;
          p[i] = static_cast<Q>(std::clamp(r + zp[si[i]], lo, hi));
        }
      });
    }
  });
  return {y};
}

std::vector<Tensor> dequantize_linear(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor &X = c.input(0), &S = c.input(1);
  const auto& a = c.attrs();
  if (!is_integral(X.dtype()))
    throw UnsupportedError(cat(w, ": dequantizing ", dtype_name(X.dtype()), " is not supported"));
  if (c.node.opset < 21 && S.rank() > 1)
    throw ValueError(cat(w, ": x_scale must be a scalar or a vector before opset 21"));
  DType out = c.node.attr_int("output_dtype") ? dtype_from_onnx_code(a.get_int("output_dtype"), w)
                                              : S.dtype();
  std::vector<int64_t> si =
      param_index(X.shape(), S.shape(), c.node.attr_int("axis"), c.node.attr_int("block_size"), w);
  std::vector<double> s = to_doubles(S, w), x = to_doubles(X, w);
  std::vector<double> zp(s.size(), 0.0);
  if (c.has_input(2)) {
    const Tensor& Z = c.input(2);
    if (Z.dtype() != X.dtype()) throw TypeError(cat(w, ": zero point dtype differs from x's"));
    if (Z.shape() != S.shape())
      throw ValueError(cat(w, ": zero point ", Z.str(), " must match the scale ", S.str()));
    zp = to_doubles(Z, w);
  }
  // (float(x) - float(zp)) * scale in float32, as the ONNX reference computes it.
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = static_cast<float>(static_cast<float>(x[i]) - static_cast<float>(zp[si[i]])) *
           static_cast<float>(s[si[i]]);
  return {from_doubles(out, X.shape(), y, w)};
}

std::vector<Tensor> dynamic_quantize_linear(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  if (X.dtype() != DType::kF32) throw UnsupportedError(cat(w, ": input must be f32"));
  const float* x = X.data<float>();
  float mx = 0, mn = 0;
  for (int64_t i = 0; i < X.numel(); ++i) mx = std::max(mx, x[i]), mn = std::min(mn, x[i]);
  const float scale = (mx == mn ? 1.0f : mx - mn) / 255.0f;
  const float zp = std::nearbyint(std::clamp(0.0f - mn / scale, 0.0f, 255.0f));
  Tensor y = Tensor::empty(DType::kU8, X.shape());
  for (int64_t i = 0; i < X.numel(); ++i) {
    float q = std::nearbyint(x[i] / scale) + zp;
    y.data<uint8_t>()[i] = static_cast<uint8_t>(std::isnan(q) ? 0 : std::clamp(q, 0.0f, 255.0f));
  }
  return {y, Tensor::scalar<float>(scale), Tensor::scalar<uint8_t>(static_cast<uint8_t>(zp))};
}

// The integer ops below compute (x - x_zp) and (w - w_zp) exactly in f64, run the float Conv or
// MatMul reference kernel on them (exact: integer sums stay far below 2^53), and requantize.
Tensor minus_zero_point(const Tensor& x, const KernelContext& c, size_t zp_input, int64_t axis,
                        const std::string& what) {
  const std::string w = c.where();
  if (!is_integral(x.dtype()))
    throw UnsupportedError(cat(w, ": ", what, " of dtype ", dtype_name(x.dtype())));
  std::vector<double> v = to_doubles(x, w);
  if (c.has_input(zp_input)) {
    const Tensor& Z = c.input(zp_input);
    std::vector<double> z = to_doubles(Z, w);
    if (z.size() == 1) {
      for (double& e : v) e -= z[0];
    } else if (Z.rank() == 1 && axis < x.rank() && Z.dim(0) == x.dim(axis)) {
      Dims coord(x.rank());
      for (int64_t i = 0; i < x.numel(); ++i) {
        unravel(i, x.shape(), coord);
        v[i] -= z[coord[axis]];
      }
    } else {
      throw ValueError(cat(w, ": zero point ", Z.str(), " of ", what,
                           " must be a scalar or one "
                           "value per channel of ",
                           x.str()));
    }
  }
  return from_doubles(DType::kF64, x.shape(), v, w);
}

std::vector<double> run_float_kernel(const std::string& op, const KernelContext& c,
                                     std::vector<Tensor> inputs, Dims* shape) {
  Node n = c.node;
  n.op = op;
  KernelContext inner{n, std::move(inputs), 1};
  Tensor y = (*KernelRegistry::global().find(op))(inner).at(0);
  *shape = y.shape();
  return to_doubles(y, c.where());
}

// Requantizes integer accumulators: round(acc * x_scale * w_scale / y_scale + y_zp), saturated.
// The multiplier is formed in the scales' precision, the product in double (numpy's promotion of
// int32 with a float scale).
Tensor requantize(const std::vector<double>& acc, const Dims& shape, const Tensor& xs,
                  const Tensor& ws, const Tensor& ys, const Tensor* yzp, DType out, int64_t axis,
                  bool round_then_clip, const std::string& w) {
  std::vector<double> a = to_doubles(xs, w), b = to_doubles(ws, w), y = to_doubles(ys, w);
  if (a.size() != 1 || y.size() != 1)
    throw UnsupportedError(cat(w, ": per-axis input or output scales are not supported"));
  const int64_t channels = static_cast<int64_t>(b.size());
  if (channels != 1 && (static_cast<int64_t>(shape.size()) <= axis || shape[axis] != channels))
    throw ValueError(
        cat(w, ": ", channels, " weight scales do not match output ", dims_str(shape)));
  const double zp = yzp ? to_doubles(*yzp, w).at(0) : 0.0;
  Tensor result = Tensor::empty(out, shape);
  Dims coord(shape.size());
  dispatch(out, kIntTypes, w, [&]<class Q>() {
    Q* p = result.data<Q>();
    const double lo = static_cast<double>(std::numeric_limits<Q>::lowest());
    const double hi = static_cast<double>(std::numeric_limits<Q>::max());
    dispatch(ws.dtype(), kFloatTypes, w, [&]<class S>() {
      using C = compute_t<S>;
      for (size_t i = 0; i < acc.size(); ++i) {
        int64_t ch = 0;
        if (channels > 1) {
          unravel(static_cast<int64_t>(i), shape, coord);
          ch = coord[axis];
        }
        const S prod = static_cast<S>(static_cast<C>(a[0]) * static_cast<C>(b[ch]));
        const S mult = static_cast<S>(static_cast<C>(prod) / static_cast<C>(y[0]));
        double v = acc[i] * static_cast<double>(static_cast<C>(mult)) + zp;
        v = round_then_clip ? std::clamp(std::nearbyint(v), lo, hi)
                            : std::nearbyint(std::clamp(v, lo, hi));
        p[i] = static_cast<Q>(std::isnan(v) ? 0 : v);
      }
    });
  });
  return result;
}

std::vector<Tensor> qlinear_matmul(const KernelContext& c) {
  const std::string w = c.where();
  // b's scale and zero point are per tensor or per column (its last axis, the output's last).
  Tensor a = minus_zero_point(c.input(0), c, 2, 0, "a");
  Tensor b = minus_zero_point(c.input(3), c, 5, std::max<int64_t>(c.input(3).rank() - 1, 0), "b");
  Dims shape;
  std::vector<double> acc = run_float_kernel("MatMul", c, {a, b}, &shape);
  DType out = c.has_input(7) ? c.input(7).dtype() : c.input(0).dtype();
  const Tensor* yzp = c.has_input(7) ? &c.input(7) : nullptr;
  const int64_t last = std::max<int64_t>(static_cast<int64_t>(shape.size()) - 1, 0);
  return {requantize(acc, shape, c.input(1), c.input(4), c.input(6), yzp, out, last, true, w)};
}

std::vector<Tensor> conv_integer(const KernelContext& c) {
  Tensor x = minus_zero_point(c.input(0), c, 2, 1, "x");
  Tensor wt = minus_zero_point(c.input(1), c, 3, 0, "w");
  Dims shape;
  std::vector<double> acc = run_float_kernel("Conv", c, {x, wt}, &shape);
  Tensor y = Tensor::empty(DType::kI32, shape);
  for (size_t i = 0; i < acc.size(); ++i) y.data<int32_t>()[i] = static_cast<int32_t>(acc[i]);
  return {y};
}

std::vector<Tensor> qlinear_conv(const KernelContext& c) {
  const std::string w = c.where();
  Tensor x = minus_zero_point(c.input(0), c, 2, 1, "x");
  Tensor wt = minus_zero_point(c.input(3), c, 5, 0, "w");
  std::vector<Tensor> inputs = {x, wt};
  if (c.has_input(8)) {
    const Tensor& B = c.input(8);
    if (B.dtype() != DType::kI32) throw TypeError(cat(w, ": B must be i32"));
    inputs.push_back(from_doubles(DType::kF64, B.shape(), to_doubles(B, w), w));
  }
  Dims shape;
  std::vector<double> acc = run_float_kernel("Conv", c, inputs, &shape);
  DType out = c.has_input(7) ? c.input(7).dtype() : c.input(0).dtype();
  const Tensor* yzp = c.has_input(7) ? &c.input(7) : nullptr;
  return {requantize(acc, shape, c.input(1), c.input(4), c.input(6), yzp, out, 1, false, w)};
}

}  // namespace

void register_quantization_kernels(KernelRegistry& r) {
  r.add("QLinearMatMul", qlinear_matmul);
  r.add("ConvInteger", conv_integer);
  r.add("QLinearConv", qlinear_conv);
  r.add("QuantizeLinear", quantize_linear);
  r.add("DequantizeLinear", dequantize_linear);
  r.add("DynamicQuantizeLinear", dynamic_quantize_linear);
}

}  // namespace pto::reference
