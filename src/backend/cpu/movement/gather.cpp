// Gather, GatherElements, GatherND and ReverseSequence on the CPU. The indices are read and checked
// by the reference's code (same errors, raised before any copy); the copies then run in parallel
// over output rows.
#include <cstring>

#include "backend/cpu/movement/movement.h"
#include "backend/cpu/movement/strided_copy.h"
#include "pto/parallel.h"
#include "reference/ops/index_math.h"
#include "reference/ops/layout_params.h"

namespace pto::cpu {
namespace {

std::vector<Tensor> gather(const KernelContext& c) {
  const Tensor& data = c.input(0);
  int64_t axis = 0;
  Dims out_shape;
  const std::vector<int64_t> idx = reference::gather_indices(c, &axis, &out_shape);
  Tensor y = Tensor::empty(data.dtype(), out_shape);
  if (y.numel() == 0) return {y};
  const Dims& d = data.shape();
  const int64_t n = d[axis], m = static_cast<int64_t>(idx.size());
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < axis; ++k) outer *= d[k];
  for (size_t k = axis + 1; k < d.size(); ++k) inner *= d[k];
  const int64_t row_bytes = inner * static_cast<int64_t>(data.itemsize());
  const int64_t grain = std::max<int64_t>(1, kCopyGrainBytes / row_bytes);
  with_element_size(data.itemsize(), [&]<class U>() {
    const U* src = static_cast<const U*>(data.raw_data());
    U* dst = static_cast<U*>(y.raw_data());
    parallel_for(0, outer * m, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const U* from = src + ((r / m) * n + idx[r % m]) * inner;
        U* to = dst + r * inner;
        if (row_bytes >= 32)
          std::memcpy(to, from, static_cast<size_t>(row_bytes));
        else
          for (int64_t i = 0; i < inner; ++i) to[i] = from[i];
      }
    });
  });
  return {y};
}

// Contiguous int64 or int32 indices, all inside [-n, n): in place of the reference's reading
// (an index vector made and normalized value by value), which then only runs to raise the error.
template <class I>
bool indices_in_range(const Tensor& ind, int64_t n) {
  const I* p = ind.data<I>();
  bool ok = true;
  for (int64_t i = 0; i < ind.numel(); ++i) ok &= p[i] >= -n && p[i] < n;
  return ok;
}

// GatherElements: out[p] = data[p with p[axis] = indices[p]]. One data offset per row of the
// indices' last dimension, then a loop along that row; a row whose indices are all the same (an
// index Expand-ed along the last axis, as the GroupQueryAttention expansion's) is one memcpy.
std::vector<Tensor> gather_elements(const KernelContext& c) {
  const Tensor& data = c.input(0);
  const Tensor& ind = c.input(1);
  int64_t axis = c.axis(c.node.attr_int("axis"), data.rank());
  const bool i64 = ind.dtype() == DType::kI64;
  const bool fast = ind.is_contiguous() && (i64 || ind.dtype() == DType::kI32) &&
                    ind.rank() == data.rank() && data.rank() > 0 &&
                    (i64 ? indices_in_range<int64_t>(ind, data.dim(axis))
                         : indices_in_range<int32_t>(ind, data.dim(axis)));
  std::vector<int64_t> checked;
  if (fast)
    reference::check_elements_shape(data, ind, axis, c.where());
  else
    checked = reference::gather_elements_indices(c, &axis);
  Tensor y = Tensor::empty(data.dtype(), ind.shape());
  if (y.numel() == 0) return {y};
  const Dims& shape = ind.shape();
  const Dims& strides = data.strides();
  const int64_t last = ind.rank() - 1, width = shape[last], rows = y.numel() / width;
  const int64_t n = data.dim(axis);
  const int64_t grain =
      std::max<int64_t>(1, kCopyGrainBytes / (width * static_cast<int64_t>(data.itemsize())));
  auto index = [&](int64_t i) -> int64_t {
    if (!fast) return checked[i];
    const int64_t v = i64 ? ind.data<int64_t>()[i] : ind.data<int32_t>()[i];
    return v < 0 ? v + n : v;
  };
  with_element_size(data.itemsize(), [&]<class U>() {
    const U* src = static_cast<const U*>(data.raw_data());
    U* dst = static_cast<U*>(y.raw_data());
    const bool rows_contiguous = strides[last] == 1;
    parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        int64_t base = 0;  // the data offset of (row's position, 0 along axis and last)
        for (int64_t k = last, rest = row; k-- > 0;) {
          if (k != axis) base += (rest % shape[k]) * strides[k];
          rest /= shape[k];
        }
        const int64_t at = row * width;
        U* to = dst + at;
        if (axis == last) {
          for (int64_t j = 0; j < width; ++j) to[j] = src[base + index(at + j)];
          continue;
        }
        const int64_t first = index(at);
        bool same = rows_contiguous;
        for (int64_t j = 1; j < width && same; ++j) same = index(at + j) == first;
        if (same) {
          std::memcpy(to, src + base + first * strides[axis],
                      static_cast<size_t>(width) * sizeof(U));
          continue;
        }
        for (int64_t j = 0; j < width; ++j) to[j] = src[base + j + index(at + j) * strides[axis]];
      }
    });
  });
  return {y};
}

// GatherND: a contiguous slice copied per index row (the masks and positions of Hugging Face
// decoders are its usual users: small int64 tensors).
std::vector<Tensor> gather_nd(const KernelContext& c) {
  const Tensor& data = c.input(0);
  Dims out_shape;
  int64_t slice = 0;
  const std::vector<int64_t> from = reference::gather_nd_offsets(c, &out_shape, &slice);
  Tensor y = Tensor::empty(data.dtype(), out_shape);
  if (y.numel() == 0) return {y};
  const int64_t bytes = slice * static_cast<int64_t>(data.itemsize());
  const int64_t grain = std::max<int64_t>(1, kCopyGrainBytes / std::max<int64_t>(bytes, 1));
  with_element_size(data.itemsize(), [&]<class U>() {
    const U* src = static_cast<const U*>(data.raw_data());
    U* dst = static_cast<U*>(y.raw_data());
    parallel_for(0, static_cast<int64_t>(from.size()), grain, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j)
        for (int64_t i = 0; i < slice; ++i) dst[j * slice + i] = src[from[j] + i];
    });
  });
  return {y};
}

// ReverseSequence: y[t, b] = x[len_b - 1 - t, b] for t < len_b, else x[t, b] (axes 0 and 1 in
// either order), one contiguous row of the trailing dims per (t, b). tf2onnx writes it for
// Keras' Bidirectional RNNs (TensorFlow's ReverseV2 of the time axis).
std::vector<Tensor> reverse_sequence(const KernelContext& c) {
  int64_t batch_axis = 0, time_axis = 0;
  const std::vector<int64_t> lens = reference::reverse_sequence_lens(c, &batch_axis, &time_axis);
  const Tensor x = c.input(0).is_contiguous() ? c.input(0) : pack(c.input(0));
  Tensor y = Tensor::empty(x.dtype(), x.shape());
  if (y.numel() == 0) return {y};
  const int64_t d0 = x.dim(0), d1 = x.dim(1), inner = x.numel() / (d0 * d1);
  const size_t row_bytes = static_cast<size_t>(inner) * x.itemsize();
  const auto* src = static_cast<const char*>(x.raw_data());
  auto* dst = static_cast<char*>(y.raw_data());
  const int64_t grain = std::max<int64_t>(1, kCopyGrainBytes / static_cast<int64_t>(row_bytes));
  parallel_for(0, d0 * d1, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i0 = r / d1, i1 = r % d1;
      const int64_t t = time_axis == 0 ? i0 : i1, len = lens[batch_axis == 0 ? i0 : i1];
      const int64_t from_t = t < len ? len - 1 - t : t;
      const int64_t from = time_axis == 0 ? from_t * d1 + i1 : i0 * d1 + from_t;
      std::memcpy(dst + r * static_cast<int64_t>(row_bytes), src + from * row_bytes, row_bytes);
    }
  });
  return {y};
}

}  // namespace

void register_gather_kernels(KernelRegistry& r) {
  r.add("Gather", {.run = gather});
  r.add("GatherElements", {.run = gather_elements});
  r.add("GatherND", {.run = gather_nd});
  r.add("ReverseSequence", {.run = reverse_sequence});
}

}  // namespace pto::cpu
