// Reference kernels for ScatterElements (and its old name Scatter), ScatterND and TensorScatter.
// Each copies the data input and writes updates into the copy in row-major order of the updates,
// so with duplicate indices and no reduction the last write wins (as in the ONNX reference).
// Reductions: add and mul wrap on integers; max and min propagate NaN like numpy
// (scatter_plan.h, shared with the CPU kernels).
#include <cmath>

#include "scatter_plan.h"

namespace pto::reference {
namespace {

void check_updates(const Tensor& data, const Tensor& updates, const Dims& want,
                   const std::string& w) {
  if (updates.dtype() != data.dtype())
    throw TypeError(
        cat(w, ": updates ", updates.str(), " must have the dtype of data ", data.str()));
  if (updates.shape() != want)
    throw ValueError(cat(w, ": updates ", updates.str(), " should have shape ", dims_str(want)));
}

// ScatterElements: output[..., indices[i, j, ...], ...] (index along `axis`) = updates[i, j, ...].
void elements_offsets(const KernelContext& c, std::vector<int64_t>& offsets) {
  const std::string w = c.where();
  const Tensor& data = c.input(0);
  const Tensor& ind = c.input(1);
  const Tensor& upd = c.input(2);
  const int64_t axis = normalize_axis(c.node.attr_int("axis"), data.rank(), w);
  check_elements_shape(data, ind, axis, w);
  check_updates(data, upd, ind.shape(), w);
  index_values_into(ind, w, "indices", offsets);  // each becomes its offset in place
  const Dims strides = contiguous_strides(data.shape());
  if (offsets.empty()) return;
  // Row by row of the indices' last dimension: the offset of the row's position without the axis,
  // then one index per element.
  const Dims& shape = ind.shape();
  const int64_t last = ind.rank() - 1, width = shape[last], n = data.dim(axis);
  const int64_t step = axis == last ? 0 : strides[last];  // along the row, off the axis
  for (int64_t row = 0; row < ind.numel() / width; ++row) {
    int64_t base = 0;
    for (int64_t k = last, rest = row; k-- > 0;) {
      if (k != axis) base += (rest % shape[k]) * strides[k];
      rest /= shape[k];
    }
    for (int64_t j = 0; j < width; ++j) {
      const int64_t i = row * width + j;
      offsets[i] = base + j * step + fix_index(offsets[i], n, w, axis) * strides[axis];
    }
  }
}

// ScatterND: indices [..., k] address slices data[i_0, ..., i_{k-1}, :, ...]; updates has shape
// indices.shape[:-1] + data.shape[k:].
void nd_offsets(const KernelContext& c, int64_t* slice_out, std::vector<int64_t>& offsets) {
  const std::string w = c.where();
  const Tensor& data = c.input(0);
  const Tensor& ind = c.input(1);
  const Tensor& upd = c.input(2);
  if (ind.rank() < 1) throw ValueError(cat(w, ": indices must have rank >= 1"));
  const int64_t k = ind.dim(-1);
  if (k > data.rank())
    throw ValueError(
        cat(w, ": indices' last dimension ", k, " exceeds the rank of data ", data.str()));
  const Dims& d = data.shape();
  Dims want(ind.shape().begin(), ind.shape().end() - 1);
  want.insert(want.end(), d.begin() + k, d.end());
  check_updates(data, upd, want, w);
  const int64_t rows = dims_product(ind.shape(), 0, ind.rank() - 1);
  const int64_t slice = dims_product(d, k, d.size());
  const Dims strides = contiguous_strides(d);
  // Row j's k indices become its offset, written at j (<= j * k: read before overwritten).
  index_values_into(ind, w, "indices", offsets);
  if (k == 0) offsets.assign(static_cast<size_t>(rows), 0);
  for (int64_t j = 0; j < rows && k > 0; ++j) {
    int64_t off = 0;
    for (int64_t t = 0; t < k; ++t) off += fix_index(offsets[j * k + t], d[t], w, t) * strides[t];
    offsets[j] = off;
  }
  offsets.resize(static_cast<size_t>(rows));
  *slice_out = slice;
}

// Copies data, then combines each update slice into the copy in row-major order of the updates.
std::vector<Tensor> scatter(const KernelContext& c) {
  int64_t slice = 0;
  std::vector<int64_t> offsets;
  scatter_offsets(c, &slice, offsets);
  const ScatterReduction red = scatter_reduction(c);
  const Tensor& updates = c.input(2);
  Tensor out = c.input(0).clone();
  dispatch(out.dtype(), kAllTypes, c.where(), [&]<class T>() {
    T* o = out.data<T>();
    const T* u = updates.data<T>();
    for (size_t i = 0; i < offsets.size(); ++i)
      for (int64_t e = 0; e < slice; ++e)
        o[offsets[i] + e] = scatter_combine(red, o[offsets[i] + e], u[i * slice + e]);
  });
  return {out};
}

// TensorScatter (KV-cache update): for each batch entry b, writes update's `sequence` steps along
// `axis` into the cache starting at write_indices[b] (0 when absent); mode "circular" wraps
// around the cache length, "linear" must stay inside it.
std::vector<Tensor> tensor_scatter(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& cache = c.input(0);
  const Tensor& upd = c.input(1);
  const std::string mode = c.node.attr_string("mode");
  if (mode != "linear" && mode != "circular")
    throw ValueError(cat(w, ": mode must be linear or circular, got '", mode, "'"));
  if (cache.rank() < 2) throw ValueError(cat(w, ": past_cache must have rank >= 2"));
  const int64_t axis = normalize_axis(c.node.attr_int("axis"), cache.rank(), w);
  if (axis == 0) throw ValueError(cat(w, ": axis must not be the batch axis 0"));
  if (upd.dtype() != cache.dtype() || upd.rank() != cache.rank())
    throw ValueError(cat(w, ": update ", upd.str(), " does not match past_cache ", cache.str()));
  for (int64_t k = 0; k < cache.rank(); ++k)
    if (k == axis ? upd.dim(k) > cache.dim(k) : upd.dim(k) != cache.dim(k))
      throw ValueError(cat(w, ": update ", upd.str(), " does not fit past_cache ", cache.str()));
  const int64_t batch = cache.dim(0), max_len = cache.dim(axis), len = upd.dim(axis);
  std::vector<int64_t> start(batch, 0);
  if (c.has_input(2)) {
    const Tensor& wi = c.input(2);
    if (wi.rank() != 1 || wi.dim(0) != batch)
      throw ValueError(cat(w, ": write_indices must be [", batch, "], got ", wi.str()));
    start = index_values(wi, w, "write_indices");
  }
  const Dims& s = cache.shape();
  const int64_t prefix = dims_product(s, 0, axis), per_batch = dims_product(s, 1, axis);
  const int64_t inner = dims_product(s, axis + 1, s.size());
  Tensor out = cache.clone();
  if (out.numel() == 0 || len == 0) return {out};
  for (int64_t p = 0; p < prefix; ++p) {
    const int64_t b = p / per_batch;
    if (mode == "linear" && (start[b] < 0 || start[b] > max_len - len))
      throw ValueError(cat(w, ": writing ", len, " steps at write_indices[", b, "] = ", start[b],
                           " leaves the cache length ", max_len));
    for (int64_t t = 0; t < len; ++t) {
      const int64_t pos =
          mode == "circular" ? ((start[b] % max_len) + max_len + t) % max_len : start[b] + t;
      copy_elems(out, (p * max_len + pos) * inner, upd, (p * len + t) * inner, inner);
    }
  }
  return {out};
}

}  // namespace

ScatterReduction scatter_reduction(const KernelContext& c) {
  // Scatter (ScatterElements' old name) has no reduction attribute: it always replaces.
  if (c.node.op == "Scatter") return ScatterReduction::kNone;
  const std::string r = c.node.attr_string("reduction");
  if (r == "none") return ScatterReduction::kNone;
  if (r == "add") return ScatterReduction::kAdd;
  if (r == "mul") return ScatterReduction::kMul;
  if (r == "max") return ScatterReduction::kMax;
  if (r == "min") return ScatterReduction::kMin;
  throw ValueError(cat(c.where(), ": reduction must be none, add, mul, max or min, got '", r, "'"));
}

void scatter_offsets(const KernelContext& c, int64_t* slice, std::vector<int64_t>& offsets) {
  if (c.node.op == "ScatterND") return nd_offsets(c, slice, offsets);
  *slice = 1;
  elements_offsets(c, offsets);
}

void register_scatter_kernels(KernelRegistry& r) {
  r.add("Scatter", scatter);
  r.add("ScatterElements", scatter);
  r.add("ScatterND", scatter);
  r.add("TensorScatter", tensor_scatter);
}

}  // namespace pto::reference
