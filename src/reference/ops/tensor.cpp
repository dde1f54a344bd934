// Reference kernels for shape and layout ops: Reshape, Flatten, Squeeze, Unsqueeze, Transpose,
// Expand, Tile, Concat, Split, Slice, DepthToSpace, SpaceToDepth, Shape and Size.
// They move elements without looking at them, so every dtype works: each output is a strided
// view of the input (Tensor::view) packed by Tensor::clone.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>

#include "generate_params.h"
#include "layout_params.h"
#include "tensor_kernels.h"

namespace pto::reference {
namespace {

using Ints = std::vector<int64_t>;

std::vector<Tensor> one(Tensor t) {
  return {std::move(t)};
}

// An int list given as input `i` (later opsets) or attribute `name` (earlier ones).
std::optional<Ints> input_or_attr(const KernelContext& c, size_t i, const std::string& name) {
  if (c.has_input(i)) return to_int64s(c.input(i), c.where());
  if (c.attrs().has(name)) return c.attrs().get_ints(name);
  return std::nullopt;
}

}  // namespace

Tensor permuted_view(const Tensor& t, const Ints& perm) {
  Dims shape(perm.size()), strides(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    shape[i] = t.shape()[perm[i]];
    strides[i] = t.strides()[perm[i]];
  }
  return t.view(std::move(shape), std::move(strides), 0);
}

// ---- Reshape and friends: same elements, new shape ----

Dims reshape_dims(const KernelContext& c) {
  std::optional<Ints> spec = input_or_attr(c, 1, "shape");
  if (!spec) throw ValueError(cat(c.where(), ": the target shape is missing"));
  return reshape_dims(c, *spec, c.node.attr_int("allowzero") != 0);
}

Dims reshape_dims(const KernelContext& c, const Ints& spec, bool allowzero) {
  const Tensor& x = c.input(0);
  Dims out;
  out.reserve(spec.size());
  int64_t infer_at = -1;
  bool has_zero = false;
  for (size_t i = 0; i < spec.size(); ++i) {
    int64_t v = spec[i];
    if (v == -1) {
      if (infer_at >= 0) throw ValueError(cat(c.where(), ": more than one -1 in the shape"));
      infer_at = static_cast<int64_t>(i);
      out.push_back(1);
    } else if (v == 0 && !allowzero) {
      if (static_cast<int64_t>(i) >= x.rank())
        throw ValueError(cat(c.where(), ": shape[", i, "] = 0 copies a dimension that input ",
                             x.str(), " does not have"));
      out.push_back(x.shape()[i]);
    } else if (v < 0) {
      throw ValueError(cat(c.where(), ": invalid dimension ", v, " in the shape"));
    } else {
      has_zero |= v == 0;
      out.push_back(v);
    }
  }
  if (infer_at >= 0) {
    if (has_zero) throw ValueError(cat(c.where(), ": allowzero=1 with both 0 and -1 in the shape"));
    int64_t known = check_output_dims(out, c);
    if (known == 0 || x.numel() % known != 0)
      throw ValueError(cat(c.where(), ": cannot reshape ", x.str(), " to ", dims_str(spec)));
    out[infer_at] = x.numel() / known;
  }
  if (check_output_dims(out, c) != x.numel())
    throw ValueError(cat(c.where(), ": cannot reshape ", x.str(), " (", x.numel(), " elements) to ",
                         dims_str(out)));
  return out;
}

Dims flatten_dims(const KernelContext& c) {
  const Tensor& x = c.input(0);
  int64_t axis = c.node.attr_int("axis");
  if (axis < -x.rank() || axis > x.rank())
    throw ValueError(cat(c.where(), ": axis ", axis, " is out of range for ", x.str()));
  if (axis < 0) axis += x.rank();
  Dims lead(x.shape().begin(), x.shape().begin() + axis);
  Dims rest(x.shape().begin() + axis, x.shape().end());
  return {checked_numel(lead), checked_numel(rest)};
}

Dims squeeze_dims(const KernelContext& c) {
  const Tensor& x = c.input(0);
  std::optional<Ints> axes = input_or_attr(c, 1, "axes");
  std::vector<bool> drop(x.rank(), false);
  if (axes) {
    for (int64_t a : *axes) {
      int64_t n = normalize_axis(a, x.rank(), c.where());
      if (drop[n]) throw ValueError(cat(c.where(), ": axis ", a, " is repeated"));
      if (x.shape()[n] != 1)
        throw ValueError(
            cat(c.where(), ": cannot squeeze axis ", a, " of ", x.str(), ": its size is not 1"));
      drop[n] = true;
    }
  } else {
    for (int64_t i = 0; i < x.rank(); ++i) drop[i] = x.shape()[i] == 1;
  }
  Dims out;
  for (int64_t i = 0; i < x.rank(); ++i)
    if (!drop[i]) out.push_back(x.shape()[i]);
  return out;
}

Dims unsqueeze_dims(const KernelContext& c) {
  const Tensor& x = c.input(0);
  std::optional<Ints> axes = input_or_attr(c, 1, "axes");
  if (!axes) throw ValueError(cat(c.where(), ": axes are required"));
  int64_t rank = x.rank() + static_cast<int64_t>(axes->size());
  std::vector<bool> inserted(rank, false);
  for (int64_t a : *axes) {
    int64_t n = normalize_axis(a, rank, c.where());
    if (inserted[n]) throw ValueError(cat(c.where(), ": axis ", a, " is repeated"));
    inserted[n] = true;
  }
  Dims out;
  size_t k = 0;
  for (int64_t i = 0; i < rank; ++i) out.push_back(inserted[i] ? 1 : x.shape()[k++]);
  return out;
}

// ---- Layout changes ----

Ints transpose_perm(const KernelContext& c) {
  const Tensor& x = c.input(0);
  Ints perm(x.rank());
  for (int64_t i = 0; i < x.rank(); ++i) perm[i] = x.rank() - 1 - i;
  if (c.attrs().has("perm")) perm = c.attrs().get_ints("perm");
  if (static_cast<int64_t>(perm.size()) != x.rank())
    throw ValueError(cat(c.where(), ": perm ", dims_str(perm), " does not match ", x.str()));
  std::vector<bool> seen(x.rank(), false);
  for (int64_t& p : perm) {
    p = normalize_axis(p, x.rank(), c.where());
    if (seen[p]) throw ValueError(cat(c.where(), ": perm ", dims_str(perm), " repeats an axis"));
    seen[p] = true;
  }
  return perm;
}

Tensor expand_view(const KernelContext& c) {
  const Tensor& x = c.input(0);
  Ints shape = to_int64s(c.input(1), c.where());
  for (int64_t d : shape)
    if (d < 0) throw ValueError(cat(c.where(), ": negative dimension in shape ", dims_str(shape)));
  Dims out = broadcast_dims(x.shape(), shape, c.where());
  Dims strides(out.size(), 0);
  size_t lead = out.size() - x.shape().size();
  for (size_t i = 0; i < x.shape().size(); ++i)
    if (x.shape()[i] != 1) strides[lead + i] = x.strides()[i];
  check_output_dims(out, c.where());
  return x.view(out, strides, 0);
}

Tensor tile_view(const KernelContext& c, Dims* out) {
  const Tensor& x = c.input(0);
  Ints repeats(x.rank(), 1);
  if (c.node.opset > 0 && c.node.opset < 6) {  // Tile-1: a count `tiles` along one `axis`
    Ints tiles = to_int64s(c.input(1), c.where());
    Ints axis = to_int64s(c.input(2), c.where());
    if (tiles.size() != 1 || axis.size() != 1)
      throw ValueError(cat(c.where(), ": tiles and axis must be scalars"));
    repeats[normalize_axis(axis[0], x.rank(), c.where())] = tiles[0];
  } else {
    repeats = to_int64s(c.input(1), c.where());
  }
  if (static_cast<int64_t>(repeats.size()) != x.rank())
    throw ValueError(cat(c.where(), ": repeats ", dims_str(repeats), " do not match ", x.str()));
  // View x as [r0, d0, r1, d1, ...] with zero strides on the repeat axes, then merge the pairs.
  Dims shape, strides;
  out->clear();
  for (int64_t i = 0; i < x.rank(); ++i) {
    if (repeats[i] < 0) throw ValueError(cat(c.where(), ": negative repeat ", repeats[i]));
    shape.insert(shape.end(), {repeats[i], x.shape()[i]});
    strides.insert(strides.end(), {0, x.strides()[i]});
    out->push_back(checked_numel({repeats[i], x.shape()[i]}, "[Tile] output"));
  }
  check_output_dims(*out, c.where());
  return x.view(shape, strides, 0);
}

Dims concat_dims(const KernelContext& c, int64_t* axis_out) {
  if (c.inputs.empty()) throw ValueError(cat(c.where(), ": no inputs"));
  const Tensor& first = c.input(0);
  int64_t rank = first.rank();
  int64_t axis = c.attrs().get_int("axis", c.node.opset > 0 && c.node.opset < 4 ? 1 : INT64_MIN);
  if (axis == INT64_MIN) throw ValueError(cat(c.where(), ": attribute 'axis' is required"));
  axis = normalize_axis(axis, rank, c.where());
  Dims out = first.shape();
  out[axis] = 0;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.input(i);
    bool ok = t.dtype() == first.dtype() && t.rank() == rank;
    for (int64_t k = 0; ok && k < rank; ++k) ok = k == axis || t.shape()[k] == first.shape()[k];
    if (!ok)
      throw ValueError(cat(c.where(), ": input ", i, " ", t.str(), " does not match input 0 ",
                           first.str(), " outside axis ", axis));
    out[axis] += t.shape()[axis];
  }
  check_output_dims(out, c.where());
  *axis_out = axis;
  return out;
}

// ---- Pieces: Split and Slice ----

namespace {

// normalize_axis without building c.where() (an allocation) unless the axis is out of range.
int64_t axis_of(const KernelContext& c, int64_t axis, int64_t rank) {
  if (axis >= -rank && axis < rank) return axis < 0 ? axis + rank : axis;
  return normalize_axis(axis, rank, c.where());
}

}  // namespace

SplitParams split_params(const KernelContext& c) {
  SplitParams p;
  p.axis = c.node.attr_int("axis");
  p.split = input_or_attr(c, 1, "split");
  if (c.attrs().has("num_outputs")) p.num_outputs = c.attrs().get_int("num_outputs");
  return p;
}

std::vector<Tensor> split_views(const KernelContext& c) {
  return split_views(c, split_params(c));
}

std::vector<Tensor> split_views(const KernelContext& c, const SplitParams& p) {
  const Tensor& x = c.input(0);
  int64_t axis = axis_of(c, p.axis, x.rank());
  int64_t dim = x.shape()[axis];
  auto n = static_cast<int64_t>(c.num_outputs);
  Ints sizes;
  if (p.split) {
    sizes = *p.split;
    if (static_cast<int64_t>(sizes.size()) != n)
      throw ValueError(cat(c.where(), ": split ", dims_str(sizes), " has ", sizes.size(),
                           " entries for ", n, " outputs"));
  } else if (p.num_outputs) {
    if (*p.num_outputs != n)
      throw ValueError(
          cat(c.where(), ": num_outputs is ", *p.num_outputs, " but the node has ", n, " outputs"));
    int64_t chunk = n > 0 ? (dim + n - 1) / n : 0;  // the last chunk may be smaller
    for (int64_t i = 0; i < n; ++i) sizes.push_back(std::clamp<int64_t>(dim - i * chunk, 0, chunk));
    if (n > 0 && sizes.back() == 0 && dim > 0)
      throw ValueError(cat(c.where(), ": cannot split ", dim, " into ", n, " chunks"));
  } else {
    if (n == 0 || dim % n != 0)
      throw ValueError(cat(c.where(), ": cannot split ", dim, " evenly into ", n, " outputs"));
    sizes.assign(n, dim / n);
  }
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) throw ValueError(cat(c.where(), ": negative split size in ", dims_str(sizes)));
    total += std::min<int64_t>(s, dim + 1);  // bounded, so no overflow
  }
  if (total != dim)
    throw ValueError(cat(c.where(), ": split ", dims_str(sizes), " does not sum to ", dim));
  std::vector<Tensor> views;
  views.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t s : sizes) {
    Dims shape = x.shape();
    shape[axis] = s;
    views.push_back(x.view(std::move(shape), x.strides(), start * x.strides()[axis]));
    start += s;
  }
  return views;
}

SliceParams slice_params(const KernelContext& c) {
  SliceParams p;
  if (c.attrs().has("starts")) {  // Slice-1: attributes
    p.starts = c.attrs().get_ints("starts");
    p.ends = c.attrs().get_ints("ends");
    p.axes = c.attrs().get_ints("axes", {});
  } else {
    p.starts = to_int64s(c.input(1), c.where());
    p.ends = to_int64s(c.input(2), c.where());
    if (c.has_input(3)) p.axes = to_int64s(c.input(3), c.where());
    if (c.has_input(4)) p.steps = to_int64s(c.input(4), c.where());
  }
  if (p.axes.empty() && !(c.has_input(3) && c.input(3).numel() == 0))
    for (size_t i = 0; i < p.starts.size(); ++i) p.axes.push_back(static_cast<int64_t>(i));
  if (p.steps.empty()) p.steps.assign(p.starts.size(), 1);
  if (p.ends.size() != p.starts.size() || p.axes.size() != p.starts.size() ||
      p.steps.size() != p.starts.size())
    throw ValueError(cat(c.where(), ": starts, ends, axes and steps differ in length"));
  return p;
}

Tensor slice_view(const KernelContext& c) {
  return slice_view(c, slice_params(c));
}

Tensor slice_view(const KernelContext& c, const SliceParams& p) {
  const Tensor& x = c.input(0);
  Dims shape = x.shape(), strides = x.strides();
  int64_t offset = 0;
  for (size_t i = 0; i < p.starts.size(); ++i) {
    int64_t a = axis_of(c, p.axes[i], x.rank());
    for (size_t j = 0; j < i; ++j)  // a few axes: no set to allocate
      if (axis_of(c, p.axes[j], x.rank()) == a)
        throw ValueError(cat(c.where(), ": axis ", p.axes[i], " is repeated"));
    int64_t d = x.shape()[a], step = p.steps[i];
    if (step == 0) throw ValueError(cat(c.where(), ": step 0 on axis ", p.axes[i]));
    int64_t s = p.starts[i] < 0 ? p.starts[i] + d : p.starts[i];
    int64_t e = p.ends[i] < 0 ? p.ends[i] + d : p.ends[i];
    int64_t count;
    if (d == 0) {
      count = 0;
    } else if (step > 0) {
      s = std::clamp<int64_t>(s, 0, d);
      e = std::clamp<int64_t>(e, 0, d);
      count = e > s ? (e - s - 1) / step + 1 : 0;
    } else {
      s = std::clamp<int64_t>(s, 0, d - 1);
      e = std::clamp<int64_t>(e, -1, d - 1);
      uint64_t mag = static_cast<uint64_t>(-(step + 1)) + 1;  // |step| without overflow
      count = s > e ? static_cast<int64_t>(static_cast<uint64_t>(s - e - 1) / mag) + 1 : 0;
    }
    shape[a] = count;
    if (count > 0) offset += s * x.strides()[a];
    strides[a] = count > 1 ? x.strides()[a] * step : x.strides()[a];  // |step| < d here
  }
  return x.view(std::move(shape), std::move(strides), offset);
}

// ---- Blocks between depth and space (NCHW) ----

Tensor depth_to_space_view(const KernelContext& c, Dims* out) {
  const Tensor& x = c.input(0);
  int64_t b = c.attrs().get_int("blocksize");
  std::string mode = c.node.attr_string("mode");
  if (x.rank() != 4) throw ValueError(cat(c.where(), ": expected a 4-D input, got ", x.str()));
  if (b <= 0 || b > x.shape()[1] / b || x.shape()[1] % (b * b) != 0)
    throw ValueError(cat(c.where(), ": channels of ", x.str(), " are not a multiple of blocksize ",
                         b, " squared"));
  int64_t n = x.shape()[0], ch = x.shape()[1] / (b * b), h = x.shape()[2], w = x.shape()[3];
  *out = {n, ch, h * b, w * b};
  if (mode == "DCR") return permuted_view(x.reshape({n, b, b, ch, h, w}), {0, 3, 4, 1, 5, 2});
  if (mode == "CRD") return permuted_view(x.reshape({n, ch, b, b, h, w}), {0, 1, 4, 2, 5, 3});
  throw ValueError(cat(c.where(), ": unknown mode '", mode, "'"));
}

Tensor space_to_depth_view(const KernelContext& c, Dims* out) {
  const Tensor& x = c.input(0);
  int64_t b = c.attrs().get_int("blocksize");
  if (x.rank() != 4) throw ValueError(cat(c.where(), ": expected a 4-D input, got ", x.str()));
  if (b <= 0 || x.shape()[2] % b != 0 || x.shape()[3] % b != 0)
    throw ValueError(
        cat(c.where(), ": spatial dims of ", x.str(), " are not multiples of blocksize ", b));
  std::string mode = c.node.attr_string("mode");  // CRD: since opset 25
  if (mode != "DCR" && mode != "CRD")
    throw ValueError(cat(c.where(), ": unknown mode '", mode, "'"));
  int64_t n = x.shape()[0], ch = x.shape()[1], h = x.shape()[2] / b, w = x.shape()[3] / b;
  Ints perm = mode == "DCR" ? Ints{0, 3, 5, 1, 2, 4} : Ints{0, 1, 3, 5, 2, 4};
  *out = {n, ch * b * b, h, w};
  return permuted_view(x.reshape({n, ch, h, b, w, b}), perm);
}

namespace {

// ---- The kernels ----

std::vector<Tensor> reshape_kernel(const KernelContext& c) {
  return one(c.input(0).reshape(reshape_dims(c)));
}
std::vector<Tensor> flatten_kernel(const KernelContext& c) {
  return one(c.input(0).reshape(flatten_dims(c)));
}
std::vector<Tensor> squeeze_kernel(const KernelContext& c) {
  return one(c.input(0).reshape(squeeze_dims(c)));
}
std::vector<Tensor> unsqueeze_kernel(const KernelContext& c) {
  return one(c.input(0).reshape(unsqueeze_dims(c)));
}

std::vector<Tensor> transpose_kernel(const KernelContext& c) {
  return one(permuted_view(c.input(0), transpose_perm(c)).clone());
}

std::vector<Tensor> expand_kernel(const KernelContext& c) {
  return one(expand_view(c).clone());
}

std::vector<Tensor> tile_kernel(const KernelContext& c) {
  Dims out;
  Tensor v = tile_view(c, &out);
  if (v.numel() == 0) return one(Tensor::empty(v.dtype(), out));
  return one(v.clone().reshape(out));
}

std::vector<Tensor> concat_kernel(const KernelContext& c) {
  int64_t axis = 0;
  Tensor y = Tensor::empty(c.input(0).dtype(), concat_dims(c, &axis));
  if (y.numel() == 0) return one(y);
  // Each input contributes one block of shape[axis:] per index of the outer dims.
  int64_t outer = 1;
  for (int64_t k = 0; k < axis; ++k) outer *= y.shape()[k];
  size_t out_row = static_cast<size_t>(y.numel() / outer) * y.itemsize();
  auto* dst = static_cast<std::byte*>(y.raw_data());
  size_t col = 0;
  for (const Tensor& t : c.inputs) {
    size_t row = static_cast<size_t>(t.numel() / outer) * t.itemsize();
    const auto* src = static_cast<const std::byte*>(t.raw_data());
    for (int64_t o = 0; o < outer && row; ++o)
      std::memcpy(dst + o * out_row + col, src + o * row, row);
    col += row;
  }
  return one(y);
}

std::vector<Tensor> split_kernel(const KernelContext& c) {
  std::vector<Tensor> outs;
  for (const Tensor& v : split_views(c)) outs.push_back(v.clone());
  return outs;
}

std::vector<Tensor> slice_kernel(const KernelContext& c) {
  return one(slice_view(c).clone());
}

std::vector<Tensor> depth_to_space_kernel(const KernelContext& c) {
  Dims out;
  Tensor v = depth_to_space_view(c, &out);
  return one(v.clone().reshape(out));
}

std::vector<Tensor> space_to_depth_kernel(const KernelContext& c) {
  Dims out;
  Tensor v = space_to_depth_view(c, &out);
  return one(v.clone().reshape(out));
}

// ---- Shape queries ----

std::vector<Tensor> shape_kernel(const KernelContext& c) {
  Ints dims = shape_output(c);
  return one(Tensor::from_vector(dims, {static_cast<int64_t>(dims.size())}));
}

std::vector<Tensor> size_kernel(const KernelContext& c) {
  return one(Tensor::scalar<int64_t>(c.input(0).numel()));
}

}  // namespace

std::vector<int64_t> shape_output(const KernelContext& c) {
  const Tensor& x = c.input(0);
  int64_t r = x.rank();
  auto clamp_index = [r](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + r : i, 0, r); };
  int64_t start = clamp_index(c.node.attr_int("start"));
  int64_t end = clamp_index(c.attrs().get_int("end", r));
  return {x.shape().begin() + start, x.shape().begin() + std::max(start, end)};
}

void register_layout_kernels(KernelRegistry& r) {
  r.add("Reshape", reshape_kernel);
  r.add("Flatten", flatten_kernel);
  r.add("Squeeze", squeeze_kernel);
  r.add("Unsqueeze", unsqueeze_kernel);
  r.add("Transpose", transpose_kernel);
  r.add("Expand", expand_kernel);
  r.add("Tile", tile_kernel);
  r.add("Concat", concat_kernel);
  r.add("Split", split_kernel);
  r.add("Slice", slice_kernel);
  r.add("DepthToSpace", depth_to_space_kernel);
  r.add("SpaceToDepth", space_to_depth_kernel);
  r.add("Shape", shape_kernel);
  r.add("Size", size_kernel);
}

void register_tensor_kernels(KernelRegistry& r) {
  register_layout_kernels(r);
  register_cast_kernels(r);
  register_generator_kernels(r);
  register_pad_kernels(r);
  register_resize_kernels(r);
}

}  // namespace pto::reference
