// Reference kernels for linear quantization. Arithmetic follows the ONNX reference: division in
// the input's precision, round half to even, saturate to the target integer range.
#include <cmath>

#include "cast.h"
#include "ir/ops/nbits.h"
#include "kernel_util.h"
#include "pto/op_registry.h"

namespace pto::reference {
namespace {

// For each element of a tensor of shape `x`, the index into a scale / zero-point tensor `s` that
// is a scalar, a 1-D per-axis vector, or a blocked tensor (block_size > 0).
// (A scale of [1] with a zero point of [], or the reverse, as onnxruntime's quantizer writes for a
// bias, is one value too.)
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
  if constexpr (is_small_int_v<T>)
    return {T::min, T::max};
  else
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
    if (Z.shape() != S.shape() && !(Z.numel() == 1 && S.numel() == 1))  // [] and [1]: one value
      throw ValueError(cat(w, ": zero point ", Z.str(), " must match the scale ", S.str()));
    zp = to_doubles(Z, w);
  }
  // The division happens in the input's precision (or `precision`, opset 23+).
  DType prec =
      c.node.attr_int("precision") ? dtype_from_onnx_code(a.get_int("precision"), w) : X.dtype();
  std::vector<double> x = to_doubles(X, w);
  const StorageCast mode{.saturate = c.node.attr_int("saturate") != 0};
  Tensor y = Tensor::empty(out, X.shape());
  dispatch_with_storage(out, kIntTypes | kStorageTypes, w, [&]<class Q>() {
    if constexpr (sizeof(Q) > 2) {
      throw UnsupportedError(cat(w, ": quantizing to ", dtype_name(out), " is not supported"));
    } else {
      Q* p = y.data<Q>();
      dispatch(prec, kFloatTypes, w, [&]<class P>() {
        for (int64_t i = 0; i < X.numel(); ++i) {
          using C = compute_t<P>;
          P q = static_cast<P>(static_cast<C>(static_cast<P>(static_cast<C>(x[i]))) /
                               static_cast<C>(static_cast<P>(static_cast<C>(s[si[i]]))));
          if constexpr (is_small_float_v<Q>) {
            // ONNX's reference: float8 ignores the (zero) zero point, float4 adds it.
            double v = static_cast<double>(static_cast<C>(q));
            if (out == DType::kF4E2M1) v = static_cast<float>(v + zp[si[i]]);
            p[i] = cast_value<Q>(v, mode);
          } else {
            auto [lo, hi] = int_range<Q>();
            double r = std::nearbyint(static_cast<double>(static_cast<C>(q)));
            if (std::isnan(r)) r = 0;
            p[i] = cast_value<Q>(static_cast<int64_t>(std::clamp(r + zp[si[i]], lo, hi)));
          }
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
  if (!is_integral(X.dtype()) && !is_storage_only(X.dtype()))
    throw UnsupportedError(cat(w, ": dequantizing ", dtype_name(X.dtype()), " is not supported"));
  // Float8 and float4 are dequantized without a zero point (ONNX's reference ignores float4's and
  // requires float8's to be zero).
  const bool float_x = is_small_float(X.dtype());
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
    if (Z.shape() != S.shape() && !(Z.numel() == 1 && S.numel() == 1))  // [] and [1]: one value
      throw ValueError(cat(w, ": zero point ", Z.str(), " must match the scale ", S.str()));
    zp = to_doubles(Z, w);
    if (float_x) {
      if (X.dtype() != DType::kF4E2M1 &&
          std::any_of(zp.begin(), zp.end(), [](double z) { return z != 0; }))
        throw ValueError(cat(w, ": a float8 zero point must be zero"));
      std::fill(zp.begin(), zp.end(), 0.0);
    }
  }
  // (float(x) - float(zp)) * scale in float32, as the ONNX reference computes it.
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = static_cast<float>(static_cast<float>(x[i]) - static_cast<float>(zp[si[i]])) *
           static_cast<float>(s[si[i]]);
  return {from_doubles(out, X.shape(), y, w)};
}

// DynamicQuantizeLinear's uint8 quantization of x[0..n): scale and zero point from the range of
// the values and 0, then y = saturate(round(x / scale) + zp) (NaN -> 0).
struct DynamicQuant {
  float scale = 1, zp = 0;
};

DynamicQuant dynamic_quantize(const float* x, int64_t n, uint8_t* y) {
  float mx = 0, mn = 0;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]), mn = std::min(mn, x[i]);
  DynamicQuant q;
  q.scale = (mx == mn ? 1.0f : mx - mn) / 255.0f;
  q.zp = std::nearbyint(std::clamp(0.0f - mn / q.scale, 0.0f, 255.0f));
  for (int64_t i = 0; i < n; ++i) {
    float v = std::nearbyint(x[i] / q.scale) + q.zp;
    y[i] = static_cast<uint8_t>(std::isnan(v) ? 0 : std::clamp(v, 0.0f, 255.0f));
  }
  return q;
}

std::vector<Tensor> dynamic_quantize_linear(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  if (X.dtype() != DType::kF32) throw UnsupportedError(cat(w, ": input must be f32"));
  Tensor y = Tensor::empty(DType::kU8, X.shape());
  const DynamicQuant q = dynamic_quantize(X.data<float>(), X.numel(), y.data<uint8_t>());
  return {y, Tensor::scalar<float>(q.scale), Tensor::scalar<uint8_t>(static_cast<uint8_t>(q.zp))};
}

// A [..., K] quantized per tensor (or per row, per_row), times B [K, N] (int8 or uint8) minus its
// zero point, exactly in int64; Y = float(acc) * float(a_scale * b_scale[n]) + bias[n] in float32.
std::vector<Tensor> dynamic_quantize_matmul(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor &A = c.input(0), &B = c.input(1), &S = c.input(2);
  if (A.dtype() != DType::kF32 || S.dtype() != DType::kF32)
    throw UnsupportedError(cat(w, ": A and b_scale must be f32"));
  if (!is_integral(B.dtype()) || B.rank() != 2 || A.rank() < 1 || A.dim(-1) != B.dim(0))
    throw ValueError(
        cat(w, ": A ", A.str(), " and B ", B.str(), " must be [..., K] and an 8-bit [K, N]"));
  const int64_t K = B.dim(0), N = B.dim(1);
  int64_t M = 1;
  for (int64_t d = 0; d + 1 < A.rank(); ++d) M *= A.dim(d);
  auto per_column = [&](const Tensor& t, const char* what) {
    if (t.numel() != 1 && t.numel() != N)
      throw ValueError(cat(w, ": ", what, " ", t.str(), " must have 1 or ", N, " values"));
    std::vector<double> v = to_doubles(t, w);
    if (v.size() == 1) v.assign(static_cast<size_t>(N), v[0]);
    return v;
  };
  const std::vector<double> bs = per_column(S, "b_scale");
  const std::vector<double> bz =
      c.has_input(3) ? per_column(c.input(3), "b_zero_point") : std::vector<double>(N, 0.0);
  const std::vector<double> bias =
      c.has_input(4) ? per_column(c.input(4), "bias") : std::vector<double>(N, 0.0);
  const std::vector<double> b = to_doubles(B, w);
  const bool per_row = c.node.attr_int("per_row") != 0;
  std::vector<uint8_t> q(static_cast<size_t>(A.numel()));
  std::vector<DynamicQuant> qp(per_row ? static_cast<size_t>(M) : 1);
  if (per_row) {
    for (int64_t i = 0; i < M; ++i)
      qp[i] = dynamic_quantize(A.data<float>() + i * K, K, q.data() + i * K);
  } else {
    qp[0] = dynamic_quantize(A.data<float>(), A.numel(), q.data());
  }
  Dims yshape = A.shape();
  yshape.back() = N;
  Tensor Y = Tensor::empty(DType::kF32, yshape);
  float* y = Y.data<float>();
  for (int64_t i = 0; i < M; ++i) {
    const DynamicQuant& p = qp[per_row ? i : 0];
    for (int64_t j = 0; j < N; ++j) {
      int64_t acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += (static_cast<int64_t>(q[i * K + k]) - static_cast<int64_t>(p.zp)) *
               static_cast<int64_t>(b[k * N + j] - bz[j]);
      const float scale = p.scale * static_cast<float>(bs[j]);
      y[i * N + j] =
          static_cast<float>(static_cast<int32_t>(acc)) * scale + static_cast<float>(bias[j]);
    }
  }
  return {Y};
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
                                     std::vector<Tensor> inputs, Dims* shape,
                                     const Attributes* attrs = nullptr) {
  Node n = c.node;
  n.op = op;
  n.def = OpRegistry::global().find(op);
  if (attrs) n.attrs = *attrs;
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

// QGemm: acc = (A - a_zp)' (B - b_zp)' + C exactly (B's zero point per tensor or per column),
// then Y = acc * (alpha * a_scale * b_scale[n]) in float32, requantized with y_scale and y_zp when
// given (the multiplier alpha * a_scale * b_scale / y_scale formed in float32, as QLinearMatMul's).
std::vector<Tensor> qgemm(const KernelContext& c) {
  const std::string w = c.where();
  const bool trans_b = c.node.attr_int("transB") != 0;
  const Tensor& A = c.input(0);
  if (A.dtype() != DType::kU8 && A.dtype() != DType::kI8)
    throw TypeError(cat(w, ": A must be uint8 or int8, got ", A.str()));
  std::vector<Tensor> inputs = {minus_zero_point(A, c, 2, 0, "a"),
                                minus_zero_point(c.input(3), c, 5, trans_b ? 0 : 1, "b")};
  if (c.has_input(6)) {
    const Tensor& C = c.input(6);
    if (C.dtype() != DType::kI32) throw TypeError(cat(w, ": C must be i32, got ", C.str()));
    inputs.push_back(from_doubles(DType::kF64, C.shape(), to_doubles(C, w), w));
  }
  Attributes plain;  // Gemm with alpha = beta = 1: the exact integer sum
  plain.set("transA", c.node.attr_int("transA"));
  plain.set("transB", c.node.attr_int("transB"));
  Dims shape;
  std::vector<double> acc = run_float_kernel("Gemm", c, std::move(inputs), &shape, &plain);
  const float alpha = static_cast<float>(c.node.attr_float("alpha"));
  const Tensor a_scale =
      Tensor::scalar<float>(alpha * static_cast<float>(to_doubles(c.input(1), w).at(0)));
  const Tensor& b_scale = c.input(4);
  if (c.has_input(7)) {
    const Tensor* yzp = c.has_input(8) ? &c.input(8) : nullptr;
    const DType out = yzp ? yzp->dtype() : DType::kU8;
    return {requantize(acc, shape, a_scale, b_scale, c.input(7), yzp, out, 1, true, w)};
  }
  const std::vector<double> bs = to_doubles(b_scale, w);
  const int64_t n = shape.at(1);
  if (bs.size() != 1 && static_cast<int64_t>(bs.size()) != n)
    throw ValueError(cat(w, ": b_scale ", b_scale.str(), " must have 1 or ", n, " values"));
  std::vector<double> y(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) {
    const float s = a_scale.data<float>()[0] * static_cast<float>(bs[bs.size() == 1 ? 0 : i % n]);
    y[i] = static_cast<float>(static_cast<float>(acc[i]) * s);
  }
  return {from_doubles(DType::kF32, shape, y, w)};
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

// MatMulNBits: W dequantized in float32 as onnxruntime does ((code - zero) * scale), then
// Y = A W + bias with the products summed in double, rounded once to A's type.
std::vector<Tensor> mat_mul_nbits(const KernelContext& c) {
  const std::string w = c.where();
  const nbits::Layout L = nbits::layout(c.node, w);
  const Tensor& A = c.input(0);
  if (!is_floating(A.dtype()) || A.rank() < 1 || A.dim(-1) != L.k)
    throw ValueError(cat(w, ": A ", A.str(), " must be float [..., K = ", L.k, "]"));
  const Tensor* zp = c.has_input(3) ? &c.input(3) : nullptr;
  const Tensor* g_idx = c.has_input(4) ? &c.input(4) : nullptr;
  nbits::check_operands(L, c.input(1), c.input(2), zp, g_idx, w);
  std::vector<double> bias(static_cast<size_t>(L.n), 0.0);
  if (c.has_input(5)) {
    bias = to_doubles(c.input(5), w);
    if (static_cast<int64_t>(bias.size()) != L.n)
      throw ValueError(cat(w, ": bias ", c.input(5).str(), " must hold N = ", L.n, " values"));
  }
  std::vector<float> weight(static_cast<size_t>(L.k * L.n));
  nbits::dequantize(L, c.input(1), c.input(2), zp, g_idx, 0, L.n, weight.data(), L.n);
  const std::vector<double> a = to_doubles(A, w);
  const int64_t M = A.numel() / L.k;
  std::vector<double> y(static_cast<size_t>(M * L.n));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < L.n; ++j) {
      double acc = bias[j];
      for (int64_t k = 0; k < L.k; ++k) acc += a[i * L.k + k] * weight[k * L.n + j];
      y[i * L.n + j] = acc;
    }
  Dims shape = A.shape();
  shape.back() = L.n;
  return {from_doubles(A.dtype(), shape, y, w)};
}

}  // namespace

void register_qlinear_kernels(KernelRegistry& r);  // qlinear.cpp: ONNX Runtime's QOperator ops

void register_quantization_kernels(KernelRegistry& r) {
  register_qlinear_kernels(r);
  r.add("QGemm", qgemm);
  r.add("QLinearMatMul", qlinear_matmul);
  r.add("ConvInteger", conv_integer);
  r.add("QLinearConv", qlinear_conv);
  r.add("QuantizeLinear", quantize_linear);
  r.add("DequantizeLinear", dequantize_linear);
  r.add("DynamicQuantizeLinear", dynamic_quantize_linear);
  r.add("DynamicQuantizeMatMul", dynamic_quantize_matmul);
  r.add("MatMulNBits", mat_mul_nbits);
}

}  // namespace pto::reference
