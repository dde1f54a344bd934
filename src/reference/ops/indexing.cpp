// Reference kernels for the gathers (Gather, GatherElements, GatherND), OneHot, NonZero, Compress
// and ReverseSequence. Data moves as raw elements (any dtype); every index is bounds-checked
// before use and negative indices count from the end where ONNX allows them.
#include "index_math.h"
#include "layout_params.h"

namespace pto::reference {

void register_scatter_kernels(KernelRegistry& r);  // scatter.cpp
void register_unique_kernels(KernelRegistry& r);   // unique.cpp

// The node's where() (an allocation) is built only for an error: a Loop body gathers its step's
// row on every iteration.
std::vector<int64_t> gather_indices(const KernelContext& c, int64_t* axis_out, Dims* out_shape) {
  const Tensor& data = c.input(0);
  const Tensor& ind = c.input(1);
  const int64_t rank = data.rank(), a = c.node.attr_int("axis");
  const int64_t axis =
      a >= -rank && a < rank ? (a < 0 ? a + rank : a) : normalize_axis(a, rank, c.where());
  const Dims& d = data.shape();
  out_shape->assign(d.begin(), d.begin() + axis);
  out_shape->insert(out_shape->end(), ind.shape().begin(), ind.shape().end());
  out_shape->insert(out_shape->end(), d.begin() + axis + 1, d.end());
  // An integer tensor reads without an error (the name is for the others).
  std::vector<int64_t> idx =
      index_values(ind, is_integral(ind.dtype()) ? std::string() : c.where(), "indices");
  const int64_t n = d[axis];
  for (int64_t& i : idx) {                                   // checked even for an empty output
    if (i < -n || i >= n) fix_index(i, n, c.where(), axis);  // throws
    i = i < 0 ? i + n : i;
  }
  *axis_out = axis;
  return idx;
}

std::vector<int64_t> gather_elements_indices(const KernelContext& c, int64_t* axis_out) {
  const std::string w = c.where();
  const Tensor& data = c.input(0);
  const Tensor& ind = c.input(1);
  const int64_t axis = normalize_axis(c.node.attr_int("axis"), data.rank(), w);
  check_elements_shape(data, ind, axis, w);
  std::vector<int64_t> idx = index_values(ind, w, "indices");
  for (int64_t& i : idx) i = fix_index(i, data.dim(axis), w, axis);
  *axis_out = axis;
  return idx;
}

std::vector<int64_t> reverse_sequence_lens(const KernelContext& c, int64_t* batch_axis,
                                           int64_t* time_axis) {
  const std::string w = c.where();
  const Tensor& x = c.input(0);
  *batch_axis = c.node.attr_int("batch_axis");
  *time_axis = c.node.attr_int("time_axis");
  if (x.rank() < 2) throw ValueError(cat(w, ": input must have rank >= 2, got ", x.str()));
  if (!((*batch_axis == 0 && *time_axis == 1) || (*batch_axis == 1 && *time_axis == 0)))
    throw ValueError(cat(w, ": batch_axis and time_axis must be 0 and 1, got ", *batch_axis,
                         " and ", *time_axis));
  const Tensor& lens_t = c.input(1);
  std::vector<int64_t> lens = index_values(lens_t, w, "sequence_lens");
  const int64_t batch = x.dim(*batch_axis), steps = x.dim(*time_axis);
  if (lens_t.rank() != 1 || lens_t.dim(0) != batch)
    throw ValueError(cat(w, ": sequence_lens must be [", batch, "], got ", lens_t.str()));
  for (int64_t l : lens)
    if (l < 0 || l > steps)
      throw ValueError(cat(w, ": sequence length ", l, " is outside [0, ", steps, "]"));
  return lens;
}

std::vector<int64_t> gather_nd_offsets(const KernelContext& c, Dims* out_shape, int64_t* slice) {
  const std::string w = c.where();
  const Tensor& data = c.input(0);
  const Tensor& ind = c.input(1);
  const int64_t b = c.node.attr_int("batch_dims");
  const int64_t r = data.rank(), q = ind.rank();
  if (q < 1 || r < 1) throw ValueError(cat(w, ": data and indices must have rank >= 1"));
  if (b < 0 || b >= std::min(q, r))
    throw ValueError(cat(w, ": batch_dims ", b, " must be in [0, min(rank(data), rank(indices)))"));
  const int64_t m = ind.dim(-1);
  if (m > r - b)
    throw ValueError(
        cat(w, ": indices' last dimension ", m, " exceeds rank(data) - batch_dims = ", r - b));
  for (int64_t k = 0; k < b; ++k)
    if (ind.dim(k) != data.dim(k))
      throw ValueError(
          cat(w, ": batch dimension ", k, " differs: data ", data.str(), ", indices ", ind.str()));
  const Dims& d = data.shape();
  out_shape->assign(ind.shape().begin(), ind.shape().end() - 1);
  out_shape->insert(out_shape->end(), d.begin() + b + m, d.end());
  const std::vector<int64_t> idx = index_values(ind, w, "indices");
  const int64_t batches = dims_product(d, 0, b);
  const int64_t rows = dims_product(ind.shape(), b, q - 1);  // index rows per batch
  const int64_t block = dims_product(d, b, d.size());        // data elements per batch
  const Dims strides = contiguous_strides(d);
  *slice = dims_product(d, b + m, d.size());
  std::vector<int64_t> from(static_cast<size_t>(batches * rows));
  for (int64_t bi = 0; bi < batches; ++bi)
    for (int64_t j = 0; j < rows; ++j) {
      int64_t& f = from[bi * rows + j];
      f = bi * block;
      for (int64_t t = 0; t < m; ++t)
        f += fix_index(idx[(bi * rows + j) * m + t], d[b + t], w, b + t) * strides[b + t];
    }
  return from;
}

namespace {

// Gather: out[outer, indices..., inner] = data[outer, indices[...], inner] along `axis`.
std::vector<Tensor> gather(const KernelContext& c) {
  const Tensor& data = c.input(0);
  int64_t axis = 0;
  Dims out_shape;
  const std::vector<int64_t> idx = gather_indices(c, &axis, &out_shape);
  Tensor y = Tensor::empty(data.dtype(), out_shape);
  if (y.numel() == 0) return {y};
  const Dims& d = data.shape();
  const int64_t n = d[axis], m = static_cast<int64_t>(idx.size());
  const int64_t outer = dims_product(d, 0, axis), inner = dims_product(d, axis + 1, d.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < m; ++j)
      copy_elems(y, (o * m + j) * inner, data, (o * n + idx[j]) * inner, inner);
  return {y};
}

std::vector<Tensor> gather_elements(const KernelContext& c) {
  const Tensor& data = c.input(0);
  const Tensor& ind = c.input(1);
  int64_t axis = 0;
  const std::vector<int64_t> idx = gather_elements_indices(c, &axis);
  Tensor y = Tensor::empty(data.dtype(), ind.shape());
  const Dims strides = contiguous_strides(data.shape());
  Dims pos(ind.rank(), 0);
  for (int64_t i = 0; i < ind.numel(); ++i) {
    unravel(i, ind.shape(), pos);
    pos[axis] = idx[i];
    int64_t from = 0;
    for (int64_t k = 0; k < data.rank(); ++k) from += pos[k] * strides[k];
    copy_elems(y, i, data, from, 1);
  }
  return {y};
}

// GatherND with batch_dims b: indices [B..., R..., m] pick slices data[B..., i_0..i_{m-1}, S...].
std::vector<Tensor> gather_nd(const KernelContext& c) {
  const Tensor& data = c.input(0);
  Dims out_shape;
  int64_t slice = 0;
  const std::vector<int64_t> from = gather_nd_offsets(c, &out_shape, &slice);
  Tensor y = Tensor::empty(data.dtype(), out_shape);
  for (size_t j = 0; j < from.size(); ++j)
    copy_elems(y, static_cast<int64_t>(j) * slice, data, from[j], slice);
  return {y};
}

// OneHot: depth slots inserted at `axis`, on_value where the slot equals the index (negative
// indices count from depth from opset 11), off_value elsewhere; out-of-range indices give all
// off_value.
std::vector<Tensor> one_hot(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& ind = c.input(0);
  const Tensor& depth_t = c.input(1);
  const Tensor& values = c.input(2);
  if (depth_t.numel() != 1 || depth_t.rank() > 1)
    throw ValueError(cat(w, ": depth must hold a single number, got ", depth_t.str()));
  if (values.numel() != 2 || values.rank() != 1)
    throw ValueError(cat(w, ": values must be [off_value, on_value], got ", values.str()));
  const double depth_d = to_doubles(depth_t, w)[0];
  if (!(depth_d >= 1) || depth_d > 9.0e18)
    throw ValueError(cat(w, ": depth must be a positive number, got ", depth_d));
  const int64_t depth = static_cast<int64_t>(depth_d);
  const int64_t axis = normalize_axis(c.node.attr_int("axis"), ind.rank() + 1, w);
  Dims out_shape = ind.shape();
  out_shape.insert(out_shape.begin() + axis, depth);
  Tensor y = Tensor::empty(values.dtype(), out_shape);
  if (y.numel() == 0) return {y};
  const std::vector<double> idx = to_doubles(ind, w);  // any numeric type, truncated to int
  const bool negative_ok = c.node.opset == 0 || c.node.opset >= 11;  // OneHot-9: [0, depth) only
  const int64_t outer = dims_product(ind.shape(), 0, axis);
  const int64_t inner = dims_product(ind.shape(), axis, ind.shape().size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < depth; ++j)
      for (int64_t i = 0; i < inner; ++i) {
        double v = std::trunc(idx[o * inner + i]);
        if (v < 0 && negative_ok) v += static_cast<double>(depth);
        copy_elems(y, (o * depth + j) * inner + i, values, v == static_cast<double>(j) ? 1 : 0, 1);
      }
  return {y};
}

// Truth of element i of any tensor (nonzero; NaN is true, as in numpy).
std::vector<bool> truth(const Tensor& t, const std::string& w) {
  return dispatch(t.dtype(), kAllTypes, w, [&]<class T>() {
    const T* p = t.data<T>();
    std::vector<bool> v(t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<compute_t<T>>(p[i]) != 0;
    return v;
  });
}

// NonZero: [rank, count] int64 coordinates of the nonzero elements in row-major order. A 0-D
// input gives [0, count], as the ONNX reference does.
std::vector<Tensor> non_zero(const KernelContext& c) {
  const Tensor& x = c.input(0);
  std::vector<bool> nz = truth(x, c.where());
  int64_t count = 0;
  for (bool b : nz) count += b;
  Tensor y = Tensor::empty(DType::kI64, {x.rank(), count});
  int64_t* out = y.data<int64_t>();
  Dims pos(x.rank(), 0);
  int64_t j = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (!nz[i]) continue;
    unravel(i, x.shape(), pos);
    for (int64_t k = 0; k < x.rank(); ++k) out[k * count + j] = pos[k];
    ++j;
  }
  return {y};
}

// Compress: the slices along `axis` (of the flattened input when absent) whose condition is true.
// A condition shorter than the axis counts as false past its end; a longer one must be false
// past it.
std::vector<Tensor> compress(const KernelContext& c) {
  const std::string w = c.where();
  Tensor x = c.input(0);
  const Tensor& cond_t = c.input(1);
  if (cond_t.rank() != 1) throw ValueError(cat(w, ": condition must be 1-D, got ", cond_t.str()));
  int64_t axis = 0;
  if (c.attrs().has("axis"))
    axis = normalize_axis(c.attrs().get_int("axis"), x.rank(), w);
  else
    x = x.reshape({x.numel()});
  std::vector<bool> cond = truth(cond_t, w);
  const Dims& s = x.shape();
  const int64_t n = s[axis];
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < static_cast<int64_t>(cond.size()); ++i) {
    if (!cond[i]) continue;
    if (i >= n) throw ValueError(cat(w, ": condition is true at ", i, ", past the axis size ", n));
    keep.push_back(i);
  }
  Dims out_shape = s;
  out_shape[axis] = static_cast<int64_t>(keep.size());
  Tensor y = Tensor::empty(x.dtype(), out_shape);
  const int64_t outer = dims_product(s, 0, axis), inner = dims_product(s, axis + 1, s.size());
  const int64_t kept = static_cast<int64_t>(keep.size());
  if (y.numel() == 0) return {y};
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < kept; ++j)
      copy_elems(y, (o * kept + j) * inner, x, (o * n + keep[j]) * inner, inner);
  return {y};
}

// ReverseSequence: for each batch entry b, reverses the first sequence_lens[b] steps along
// time_axis (batch_axis and time_axis are 0 and 1 in either order).
std::vector<Tensor> reverse_sequence(const KernelContext& c) {
  const Tensor& x = c.input(0);
  int64_t batch_axis = 0, time_axis = 0;
  const std::vector<int64_t> lens = reverse_sequence_lens(c, &batch_axis, &time_axis);
  Tensor y = Tensor::empty(x.dtype(), x.shape());
  const Dims strides = contiguous_strides(x.shape());
  Dims pos(x.rank(), 0);
  for (int64_t i = 0; i < x.numel(); ++i) {
    unravel(i, x.shape(), pos);
    const int64_t t = pos[time_axis], len = lens[pos[batch_axis]];
    const int64_t from = t < len ? i + (len - 1 - 2 * t) * strides[time_axis] : i;
    copy_elems(y, i, x, from, 1);
  }
  return {y};
}

}  // namespace

void register_indexing_kernels(KernelRegistry& r) {
  r.add("Gather", gather);
  r.add("GatherElements", gather_elements);
  r.add("GatherND", gather_nd);
  r.add("OneHot", one_hot);
  r.add("NonZero", non_zero);
  r.add("Compress", compress);
  r.add("ReverseSequence", reverse_sequence);
  register_scatter_kernels(r);
  register_unique_kernels(r);
}

}  // namespace pto::reference
