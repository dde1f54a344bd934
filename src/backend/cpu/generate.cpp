// CPU kernels for the ops that make values rather than read them (Range, ConstantOfShape, Shape,
// Size) and for CumSum. Mostly shape arithmetic on a few int64 elements, which the runtime would
// otherwise hand to the reference interpreter whenever a dimension is symbolic. The parameters
// come from the reference's own code (reference/ops/generate_params.h: same errors, same values);
// only the loops are here, parallel where a tensor is large.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backend/cpu/kernel.h"
#include "pto/parallel.h"
#include "reference/ops/generate_params.h"
#include "reference/ops/index_math.h"

namespace pto::cpu {
namespace {

constexpr int64_t kGrain = 16384;  // elements per parallel chunk at least

std::vector<Tensor> range(const KernelContext& c) {
  const int64_t n = reference::range_length(c);
  Tensor y = Tensor::empty(c.input(0).dtype(), {n});
  dispatch(y.dtype(), kFloatTypes | kSignedInts, c.where(), [&]<class T>() {
    const T start = c.input(0).data<T>()[0], delta = c.input(2).data<T>()[0];
    T* out = y.data<T>();
    parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[i] = reference::range_value(start, delta, i);
    });
  });
  return one(std::move(y));
}

// Copies of one element of `size` bytes, filled in parallel.
template <class T>
void fill(T* out, const void* value, int64_t n) {
  T v;
  std::memcpy(&v, value, sizeof v);
  parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { std::fill(out + b, out + e, v); });
}

std::vector<Tensor> constant_of_shape(const KernelContext& c) {
  const Tensor value = reference::constant_of_shape_value(c);
  Tensor y = Tensor::empty(value.dtype(), reference::constant_of_shape_dims(c));
  switch (y.itemsize()) {
    case 8:
      fill(static_cast<uint64_t*>(y.raw_data()), value.raw_data(), y.numel());
      break;
    case 4:
      fill(static_cast<uint32_t*>(y.raw_data()), value.raw_data(), y.numel());
      break;
    case 2:
      fill(static_cast<uint16_t*>(y.raw_data()), value.raw_data(), y.numel());
      break;
    default:
      fill(static_cast<uint8_t*>(y.raw_data()), value.raw_data(), y.numel());
  }
  return one(std::move(y));
}

std::vector<Tensor> shape(const KernelContext& c) {
  const std::vector<int64_t> dims = reference::shape_output(c);
  Tensor y = Tensor::empty(DType::kI64, {static_cast<int64_t>(dims.size())});
  std::copy(dims.begin(), dims.end(), y.data<int64_t>());
  return one(std::move(y));
}

std::vector<Tensor> size(const KernelContext& c) {
  Tensor y = Tensor::empty(DType::kI64, {});
  y.data<int64_t>()[0] = c.input(0).numel();
  return one(std::move(y));
}

// CumSum along the axis given by input 1, the input viewed as [outer, n, inner]: the same running
// sums as the reference (floats accumulate in double and round each output once, integers wrap),
// `inner` lines at a time so the inner loop is contiguous; parallel over outer x inner blocks.
std::vector<Tensor> cumsum(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const int64_t axis = normalize_axis(reference::scalar_int(c.input(1), c.where(), "axis"),
                                      std::max<int64_t>(x.rank(), 1), c.where());
  const bool exclusive = c.node.attr_int("exclusive") != 0;
  const bool reverse = c.node.attr_int("reverse") != 0;
  const Dims& s = x.shape();
  const int64_t n = x.rank() ? s[axis] : 1;
  const int64_t outer = reference::dims_product(s, 0, axis);
  const int64_t inner = reference::dims_product(s, axis + 1, s.size());
  Tensor y = Tensor::empty(x.dtype(), s);
  if (y.numel() == 0) return one(std::move(y));
  constexpr int64_t kBlock = 256;  // lines of one task, one accumulator each
  const int64_t blocks = (inner + kBlock - 1) / kBlock;
  dispatch(x.dtype(), kFloatTypes | kSignedInts, c.where(), [&]<class T>() {
    using Acc = std::conditional_t<std::is_integral_v<T>, T, double>;
    const T* in = x.data<T>();
    T* out = y.data<T>();
    const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, n * kBlock));
    parallel_for(0, outer * blocks, grain, [&](int64_t begin, int64_t end) {
      Acc acc[kBlock];
      for (int64_t t = begin; t < end; ++t) {
        const int64_t o = t / blocks, i0 = t % blocks * kBlock;
        const int64_t m = std::min(kBlock, inner - i0);
        std::fill(acc, acc + m, Acc(0));
        for (int64_t step = 0; step < n; ++step) {
          const int64_t at = (o * n + (reverse ? n - 1 - step : step)) * inner + i0;
          for (int64_t i = 0; i < m; ++i) {
            const Acc prev = acc[i];
            if constexpr (std::is_integral_v<T>)
              acc[i] = reference::wrap_add(acc[i], in[at + i]);
            else
              acc[i] += static_cast<double>(static_cast<compute_t<T>>(in[at + i]));
            out[at + i] = static_cast<T>(exclusive ? prev : acc[i]);
          }
        }
      }
    });
  });
  return one(std::move(y));
}

bool is_float_or_signed(DType dt) {
  return dt == DType::kF32 || dt == DType::kF64 || dt == DType::kI64 || dt == DType::kI32;
}

}  // namespace

void register_generate_kernels(KernelRegistry& r) {
  r.add("Range", {.accepts = [](const NodeInfo& info) { return is_float_or_signed(info.dtype(0)); },
                  .run = range});
  r.add("ConstantOfShape", {.run = constant_of_shape});
  r.add("Shape", {.run = shape});
  r.add("Size", {.run = size});
  r.add("CumSum", {.accepts =
                       [](const NodeInfo& info) {
                         return info.inputs.size() == 2 && is_float_or_signed(info.dtype(0)) &&
                                (info.dtype(1) == DType::kI64 || info.dtype(1) == DType::kI32);
                       },
                   .run = cumsum});
}

}  // namespace pto::cpu
