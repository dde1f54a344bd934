// Reference kernels for ops that make new values rather than move old ones: Constant,
// ConstantOfShape, Range, EyeLike and Trilu.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <variant>

#include "cast.h"
#include "generate_params.h"
#include "tensor_kernels.h"

namespace pto::reference {
namespace {

std::vector<Tensor> constant_kernel(const KernelContext& c) {
  const auto& attrs = c.attrs().all();
  if (attrs.count("sparse_value"))
    throw UnsupportedError(cat(c.where(), ": sparse constants are not supported"));
  if (attrs.count("value_string") || attrs.count("value_strings"))
    throw UnsupportedError(cat(c.where(), ": string constants are not supported"));
  if (attrs.count("value")) return {c.attrs().get_tensor("value")};
  if (attrs.count("value_float"))
    return {Tensor::scalar(static_cast<float>(c.attrs().get_float("value_float")))};
  if (attrs.count("value_int")) return {Tensor::scalar(c.attrs().get_int("value_int"))};
  if (attrs.count("value_floats")) {
    std::vector<float> v;
    for (double d : c.attrs().get_floats("value_floats")) v.push_back(static_cast<float>(d));
    return {Tensor::from_vector(v, {static_cast<int64_t>(v.size())})};
  }
  if (attrs.count("value_ints")) {
    std::vector<int64_t> v = c.attrs().get_ints("value_ints");
    return {Tensor::from_vector(v, {static_cast<int64_t>(v.size())})};
  }
  throw ValueError(cat(c.where(), ": no value attribute"));
}

// Fills a new tensor of `shape` with copies of the single element of `value`.
Tensor filled(const Tensor& value, const Dims& shape) {
  Tensor out = Tensor::empty(value.dtype(), shape);
  auto* dst = static_cast<std::byte*>(out.raw_data());
  for (int64_t i = 0; i < out.numel(); ++i)
    std::memcpy(dst + i * out.itemsize(), value.raw_data(), out.itemsize());
  return out;
}

std::vector<Tensor> constant_of_shape_kernel(const KernelContext& c) {
  return {filled(constant_of_shape_value(c), constant_of_shape_dims(c))};
}

std::vector<Tensor> range_kernel(const KernelContext& c) {
  const int64_t n = range_length(c);
  Tensor out = Tensor::empty(c.input(0).dtype(), {n});
  dispatch(out.dtype(), kFloatTypes | kSignedInts, c.where(), [&]<class T>() {
    const T start = c.input(0).data<T>()[0], delta = c.input(2).data<T>()[0];
    for (int64_t i = 0; i < n; ++i) out.data<T>()[i] = range_value(start, delta, i);
  });
  return {out};
}

// Ones on the k-th diagonal of a matrix shaped like the input; zeros elsewhere.
std::vector<Tensor> eye_like_kernel(const KernelContext& c) {
  const Tensor& x = c.input(0);
  if (x.rank() != 2) throw ValueError(cat(c.where(), ": expected a 2-D input, got ", x.str()));
  DType dt = x.dtype();
  if (c.attrs().has("dtype")) dt = dtype_from_onnx_code(c.attrs().get_int("dtype"), c.where());
  int64_t rows = x.shape()[0], cols = x.shape()[1];
  int64_t k = std::clamp<int64_t>(c.node.attr_int("k"), -rows, cols);
  Tensor out = Tensor::zeros(dt, x.shape());
  if (out.numel() == 0) return {out};
  dispatch(dt, kAllTypes, c.where(), [&]<class T>() {
    T* p = out.data<T>();
    for (int64_t i = 0; i < rows; ++i)
      if (i + k >= 0 && i + k < cols) p[i * cols + i + k] = cast_value<T>(true);
  });
  return {out};
}

// Keeps the upper (j - i >= k) or lower (j - i <= k) triangle of the last two axes; zeros the
// rest. Zero is all-zero bytes in every dtype, so rows are copied as bytes.
std::vector<Tensor> trilu_kernel(const KernelContext& c) {
  const Tensor& x = c.input(0);
  if (x.rank() < 2)
    throw ValueError(cat(c.where(), ": expected at least 2 dimensions, got ", x.str()));
  int64_t k = 0;
  if (c.has_input(1)) {
    std::vector<int64_t> kv = to_int64s(c.input(1), c.where());
    if (kv.size() != 1) throw ValueError(cat(c.where(), ": k must be a scalar"));
    k = kv[0];
  }
  bool upper = c.node.attr_int("upper") != 0;
  int64_t rows = x.shape()[x.rank() - 2], cols = x.shape()[x.rank() - 1];
  k = std::clamp<int64_t>(k, -rows - 1, cols + 1);  // beyond this every k acts the same
  Tensor out = Tensor::zeros(x.dtype(), x.shape());
  if (out.numel() == 0) return {out};
  size_t item = x.itemsize();
  const auto* src = static_cast<const std::byte*>(x.raw_data());
  auto* dst = static_cast<std::byte*>(out.raw_data());
  int64_t matrices = x.numel() / (rows * cols);
  for (int64_t m = 0; m < matrices; ++m)
    for (int64_t i = 0; i < rows; ++i) {
      int64_t lo = upper ? std::clamp<int64_t>(i + k, 0, cols) : 0;
      int64_t hi = upper ? cols : std::clamp<int64_t>(i + k + 1, 0, cols);
      if (hi <= lo) continue;
      size_t off = static_cast<size_t>((m * rows + i) * cols + lo) * item;
      std::memcpy(dst + off, src + off, static_cast<size_t>(hi - lo) * item);
    }
  return {out};
}

}  // namespace

Dims constant_of_shape_dims(const KernelContext& c) {
  Dims shape = to_int64s(c.input(0), c.where());
  check_output_dims(shape, c.where());
  return shape;
}

Tensor constant_of_shape_value(const KernelContext& c) {
  if (!c.attrs().has("value")) return Tensor::zeros(DType::kF32, {1});
  Tensor value = c.attrs().get_tensor("value").contiguous();
  if (value.numel() != 1)
    throw ValueError(cat(c.where(), ": 'value' must hold one element, got ", value.str()));
  return value;
}

// max(ceil((limit - start) / delta), 0).
int64_t range_length(const KernelContext& c) {
  const Tensor &start = c.input(0), &limit = c.input(1), &delta = c.input(2);
  if (start.numel() != 1 || limit.numel() != 1 || delta.numel() != 1)
    throw ValueError(cat(c.where(), ": start, limit and delta must be scalars"));
  if (limit.dtype() != start.dtype() || delta.dtype() != start.dtype())
    throw TypeError(cat(c.where(), ": start, limit and delta must share a dtype"));
  return dispatch(start.dtype(), kFloatTypes | kSignedInts, c.where(), [&]<class T>() -> int64_t {
    using C = compute_t<T>;
    C s = static_cast<C>(start.data<T>()[0]), l = static_cast<C>(limit.data<T>()[0]),
      d = static_cast<C>(delta.data<T>()[0]);
    if (d == C(0)) throw ValueError(cat(c.where(), ": delta is 0"));
    if constexpr (std::is_integral_v<C>) {
      // In 128 bits, so that limit - start cannot overflow.
      __extension__ using Wide = __int128;
      Wide diff = static_cast<Wide>(l) - s;
      Wide q = diff / d + ((diff % d != 0) && ((diff > 0) == (d > 0)) ? 1 : 0);  // ceil
      if (q > std::numeric_limits<int64_t>::max())
        throw ValueError(cat(c.where(), ": the range is too long"));
      return q > 0 ? static_cast<int64_t>(q) : 0;
    } else {
      double count = std::ceil((static_cast<double>(l) - s) / static_cast<double>(d));
      if (std::isnan(count) || count > 9.0e18)
        throw ValueError(cat(c.where(), ": cannot make a range from ", s, " to ", l, " by ", d));
      return count > 0 ? static_cast<int64_t>(count) : 0;
    }
  });
}

void register_generator_kernels(KernelRegistry& r) {
  r.add("Constant", constant_kernel);
  r.add("ConstantOfShape", constant_of_shape_kernel);
  r.add("Range", range_kernel);
  r.add("EyeLike", eye_like_kernel);
  r.add("Trilu", trilu_kernel);
}

}  // namespace pto::reference
