// Shape and layout op definitions: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Expand,
// Tile, Concat, Split, Slice, Pad, DepthToSpace, SpaceToDepth, Shape and Size.
// Inference keeps symbolic dims where an op passes them through (Reshape's 0, Transpose,
// Concat's other axes, Unsqueeze, Flatten of one symbolic dim, whole-axis slices).
#include <algorithm>
#include <limits>
#include <map>

#include "tensor_infer.h"

namespace pto {
namespace infer {

std::optional<std::vector<double>> constant_floats(const InferContext& c, size_t i) {
  if (i >= c.constants.size() || !c.constants[i]) return std::nullopt;
  const Tensor& t = *c.constants[i];
  if (!is_floating(t.dtype())) return std::nullopt;
  Tensor packed = t.contiguous();
  return dispatch(t.dtype(), kFloatTypes, c.where(), [&]<class T>() {
    std::vector<double> v;
    for (int64_t k = 0; k < packed.numel(); ++k)
      v.push_back(static_cast<double>(static_cast<compute_t<T>>(packed.data<T>()[k])));
    return v;
  });
}

std::optional<std::vector<int64_t>> ints_input_or_attr(const InferContext& c, size_t i,
                                                       const std::string& name) {
  if (c.has_input(i)) return constant_ints(c, i);
  if (c.attrs().has(name)) return c.attrs().get_ints(name);
  return std::nullopt;
}

Dim product(const Shape& s, size_t begin, size_t end) {
  Dim out(1);
  for (size_t i = begin; i < end; ++i) out = dim_mul(out, s[i]);
  return out;
}

Shape unknown_dims(size_t rank) {
  return Shape(rank, Dim::unknown());
}

}  // namespace infer

namespace {

using Ints = std::vector<int64_t>;
constexpr int kManyOutputs = std::numeric_limits<int>::max();

const std::optional<Shape>& shape_of(const InferContext& c, size_t i) {
  static const std::optional<Shape> kNone;
  return c.has_input(i) ? c.inputs[i].shape : kNone;
}

DType dtype_of_input(const InferContext& c, size_t i = 0) {
  return c.has_input(i) ? c.inputs[i].dtype : DType::kUndefined;
}

// Output `out` has input 0's dtype and the given shape.
void set_like_input(InferContext& c, std::optional<Shape> shape, size_t out = 0) {
  infer::set(c, out, dtype_of_input(c), std::move(shape));
}

// The rank of a 1-D shape-like input (its length), when known.
std::optional<size_t> length_of(const InferContext& c, size_t i) {
  const auto& s = shape_of(c, i);
  if (!s || s->size() != 1 || !(*s)[0].is_known()) return std::nullopt;
  return static_cast<size_t>((*s)[0].value);
}

void infer_reshape(InferContext& c) {
  // The target: constant ints, or a shape value computed from Shape() whose elements may be
  // symbols (copied as they are) or unknown (at most one can be solved from the element count).
  Shape spec;
  bool literal = true;
  if (std::optional<Ints> ints = infer::ints_input_or_attr(c, 1, "shape")) {
    spec = to_shape(*ints);
    for (size_t i = 0; i < ints->size(); ++i) spec[i] = Dim((*ints)[i]);
  } else if (const ShapeValue* v = infer::shape_value(c, 1); v && !v->scalar) {
    spec = v->dims;
    literal = false;
  } else {
    std::optional<size_t> k = length_of(c, 1);
    set_like_input(c, k ? std::optional<Shape>(infer::unknown_dims(*k)) : std::nullopt);
    return;
  }
  bool allowzero = c.node.attr_int("allowzero") != 0;
  const auto& in = shape_of(c, 0);
  Shape out;
  std::optional<size_t> minus_one;
  bool solvable = true;
  for (size_t i = 0; i < spec.size(); ++i) {
    const Dim& d = spec[i];
    if (d.is_symbolic()) {
      out.push_back(d);
    } else if (!d.is_known() && (d.value == -1 || !literal)) {
      if (minus_one && literal) throw ValueError(cat(c.where(), ": more than one -1 in the shape"));
      solvable = solvable && !minus_one;
      minus_one = i;
      out.push_back(Dim::unknown());
    } else if (d.value == 0 && !allowzero) {
      if (in && i >= in->size())
        throw ValueError(cat(c.where(), ": shape[", i, "] = 0 copies a dimension that input ",
                             shape_str(*in), " does not have"));
      out.push_back(in ? (*in)[i] : Dim::unknown());
    } else if (d.value < -1) {
      throw ValueError(cat(c.where(), ": invalid dimension ", d.value, " in the shape"));
    } else {
      out.push_back(d);
    }
  }
  if (minus_one && solvable && in) {
    // The one unknown element is the input's element count over the others' (symbolic products
    // cancel: [batch, 16, 64] to [-1, 64] gives 16*batch).
    Dim rest(1);
    for (size_t i = 0; i < out.size(); ++i)
      if (i != *minus_one) rest = dim_mul(rest, out[i]);
    const Dim total = infer::product(*in, 0, in->size());
    if (std::optional<Dim> q = dim_div(total, rest))
      out[*minus_one] = *q;
    else if (total.is_known() && rest.is_known() && literal)
      throw ValueError(
          cat(c.where(), ": cannot reshape ", shape_str(*in), " to ", shape_str(spec)));
  }
  set_like_input(c, out);
}

void infer_flatten(InferContext& c) {
  const auto& in = shape_of(c, 0);
  if (!in) return set_like_input(c, std::nullopt);
  auto r = static_cast<int64_t>(in->size());
  int64_t axis = c.node.attr_int("axis");
  if (axis < -r || axis > r)
    throw ValueError(cat(c.where(), ": axis ", axis, " is out of range for rank ", r));
  if (axis < 0) axis += r;
  set_like_input(c, Shape{infer::product(*in, 0, axis), infer::product(*in, axis, r)});
}

void infer_squeeze(InferContext& c) {
  const auto& in = shape_of(c, 0);
  std::optional<Ints> axes = infer::ints_input_or_attr(c, 1, "axes");
  if (!in || (!axes && c.has_input(1))) return set_like_input(c, std::nullopt);
  auto r = static_cast<int64_t>(in->size());
  std::vector<bool> drop(r, false);
  if (axes) {
    for (int64_t a : *axes) {
      int64_t n = normalize_axis(a, r, c.where());
      if ((*in)[n].is_known() && (*in)[n].value != 1)
        throw ValueError(cat(c.where(), ": cannot squeeze axis ", a, " of ", shape_str(*in)));
      drop[n] = true;
    }
  } else {
    for (int64_t i = 0; i < r; ++i) {
      if (!(*in)[i].is_known()) return set_like_input(c, std::nullopt);  // may or may not be 1
      drop[i] = (*in)[i].value == 1;
    }
  }
  Shape out;
  for (int64_t i = 0; i < r; ++i)
    if (!drop[i]) out.push_back((*in)[i]);
  set_like_input(c, out);
}

void infer_unsqueeze(InferContext& c) {
  const auto& in = shape_of(c, 0);
  std::optional<Ints> axes = infer::ints_input_or_attr(c, 1, "axes");
  if (!in || !axes) return set_like_input(c, std::nullopt);
  auto r = static_cast<int64_t>(in->size() + axes->size());
  std::vector<bool> inserted(r, false);
  for (int64_t a : *axes) {
    int64_t n = normalize_axis(a, r, c.where());
    if (inserted[n]) throw ValueError(cat(c.where(), ": axis ", a, " is repeated"));
    inserted[n] = true;
  }
  Shape out;
  size_t k = 0;
  for (int64_t i = 0; i < r; ++i) out.push_back(inserted[i] ? Dim(1) : (*in)[k++]);
  set_like_input(c, out);
}

void infer_transpose(InferContext& c) {
  const auto& in = shape_of(c, 0);
  if (!in) return set_like_input(c, std::nullopt);
  auto r = static_cast<int64_t>(in->size());
  Ints perm(r);
  for (int64_t i = 0; i < r; ++i) perm[i] = r - 1 - i;
  if (c.attrs().has("perm")) perm = c.attrs().get_ints("perm");
  if (static_cast<int64_t>(perm.size()) != r)
    throw ValueError(cat(c.where(), ": perm ", dims_str(perm), " does not match rank ", r));
  Shape out;
  for (int64_t p : perm) out.push_back((*in)[normalize_axis(p, r, c.where())]);
  set_like_input(c, out);
}

void infer_expand(InferContext& c) {
  const auto& in = shape_of(c, 0);
  std::optional<Ints> shape = infer::constant_ints(c, 1);
  if (in && shape) return set_like_input(c, broadcast_shapes(*in, to_shape(*shape), c.where()));
  if (const ShapeValue* v = infer::shape_value(c, 1); in && v && !v->scalar)
    return set_like_input(c, broadcast_shapes(*in, v->dims, c.where()));
  std::optional<size_t> k = length_of(c, 1);
  if (in && k) return set_like_input(c, infer::unknown_dims(std::max(*k, in->size())));
  set_like_input(c, std::nullopt);
}

void infer_tile(InferContext& c) {
  const auto& in = shape_of(c, 0);
  if (!in) return set_like_input(c, std::nullopt);
  // The repeats as dims: constants, or a shape value with symbols (x.repeat(batch, 1) tiles by
  // a dim of another tensor).
  std::optional<Shape> repeats;
  if (c.node.opset > 0 && c.node.opset < 6) {  // Tile-1: tiles and axis
    auto tiles = infer::constant_ints(c, 1), axis = infer::constant_ints(c, 2);
    if (tiles && axis && tiles->size() == 1 && axis->size() == 1) {
      repeats = Shape(in->size(), Dim(1));
      (*repeats)[normalize_axis((*axis)[0], static_cast<int64_t>(in->size()), c.where())] =
          (*tiles)[0];
    }
  } else if (std::optional<Ints> r = infer::constant_ints(c, 1)) {
    repeats = to_shape(*r);
  } else if (const ShapeValue* v = infer::shape_value(c, 1); v && !v->scalar) {
    repeats = v->dims;
  }
  Shape out = infer::unknown_dims(in->size());
  if (repeats && repeats->size() == in->size())
    for (size_t i = 0; i < in->size(); ++i) out[i] = dim_mul((*in)[i], (*repeats)[i]);
  set_like_input(c, out);
}

void infer_concat(InferContext& c) {
  std::optional<Shape> first;
  for (size_t i = 0; i < c.num_inputs() && !first; ++i) first = shape_of(c, i);
  if (!first) return set_like_input(c, std::nullopt);
  auto r = static_cast<int64_t>(first->size());
  int64_t axis = c.node.attr_int("axis");
  axis = normalize_axis(axis, r, c.where());
  Shape out = *first;
  // Other axes: any input that knows the dim; the concat axis: the sum of the inputs' (a sum of
  // symbols where they are symbolic: a cache's Concat(past, new) is "(past+seq)").
  Dim length(0);
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const auto& s = shape_of(c, i);
    if (!s) {
      length = Dim::unknown();
      continue;
    }
    if (static_cast<int64_t>(s->size()) != r)
      throw ValueError(cat(c.where(), ": input ", i, " has rank ", s->size(), ", input 0 has ", r));
    for (int64_t k = 0; k < r; ++k)
      if (k != axis && !out[k].is_known() && (*s)[k].is_known()) out[k] = (*s)[k];
    length = dim_add(length, (*s)[axis]);
  }
  out[axis] = length;
  set_like_input(c, out);
}

void infer_split(InferContext& c) {
  const auto& in = shape_of(c, 0);
  size_t n = c.outputs.size();
  if (!in) {
    for (size_t i = 0; i < n; ++i) set_like_input(c, std::nullopt, i);
    return;
  }
  int64_t axis =
      normalize_axis(c.node.attr_int("axis"), static_cast<int64_t>(in->size()), c.where());
  const Dim& d = (*in)[axis];
  std::optional<Ints> sizes = infer::ints_input_or_attr(c, 1, "split");
  if (!sizes && !c.has_input(1) && d.is_known() && n > 0) {
    auto parts = static_cast<int64_t>(n);
    if (c.attrs().has("num_outputs")) {
      int64_t chunk = (d.value + parts - 1) / parts;
      sizes = Ints();
      for (int64_t i = 0; i < parts; ++i)
        sizes->push_back(std::clamp<int64_t>(d.value - i * chunk, 0, chunk));
    } else if (d.value % parts == 0) {
      sizes = Ints(n, d.value / parts);
    }
  }
  if (sizes && sizes->size() != n)
    throw ValueError(cat(c.where(), ": split has ", sizes->size(), " sizes for ", n, " outputs"));
  for (size_t i = 0; i < n; ++i) {
    Shape out = *in;
    out[axis] = sizes ? Dim((*sizes)[i]) : Dim::unknown();
    set_like_input(c, out, i);
  }
}

// The length of slice [start, end) by step of an axis of size d (as the kernel clamps).
int64_t slice_length(int64_t start, int64_t end, int64_t step, int64_t d) {
  if (d == 0 || step == 0) return 0;
  if (start < 0) start += d;
  if (end < 0) end += d;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, d);
    end = std::clamp<int64_t>(end, 0, d);
    return end > start ? (end - start - 1) / step + 1 : 0;
  }
  start = std::clamp<int64_t>(start, 0, d - 1);
  end = std::clamp<int64_t>(end, -1, d - 1);
  auto mag = static_cast<uint64_t>(-(step + 1)) + 1;
  return start > end ? static_cast<int64_t>(static_cast<uint64_t>(start - end - 1) / mag) + 1 : 0;
}

// The length of x[0:end] on a dimension `d` for a symbolic end (a symbol or a product, "2*seq"):
// the symbol itself where d is that symbol, "min(N,end)" where d is a known N (broadcast_shapes
// knows that min(N, s) broadcasts with s to s; products treat the parenthesized min as one
// factor), unknown otherwise.
Dim slice_to_symbol(const InferContext& c, const Dim& d, const Dim& end,
                    const std::optional<Ints>& starts, const std::optional<Ints>& steps, size_t i) {
  const bool from_zero = starts && i < starts->size() && (*starts)[i] == 0;
  const bool unit = !c.has_input(4) || (steps && i < steps->size() && (*steps)[i] == 1);
  if (!from_zero || !unit || !end.is_symbolic()) return Dim::unknown();
  if (d == end) return d;
  if (d.is_known() && d.value > 1) return Dim::sym(cat("min(", d.value, ",", end.symbol, ")"));
  return Dim::unknown();
}

void infer_slice(InferContext& c) {
  const auto& in = shape_of(c, 0);
  if (!in) return set_like_input(c, std::nullopt);
  auto r = static_cast<int64_t>(in->size());
  std::optional<Ints> starts, ends, axes, steps;
  if (c.attrs().has("starts")) {
    starts = c.attrs().get_ints("starts");
    ends = c.attrs().get_ints("ends");
    if (c.attrs().has("axes")) axes = c.attrs().get_ints("axes");
  } else {
    starts = infer::constant_ints(c, 1);
    ends = infer::constant_ints(c, 2);
    if (c.has_input(3)) {
      axes = infer::constant_ints(c, 3);
      if (!axes) return set_like_input(c, infer::unknown_dims(r));
    }
    if (c.has_input(4)) steps = infer::constant_ints(c, 4);
  }
  // Ends computed from another tensor's shape (x[:, :seq]): symbols where not constant.
  const ShapeValue* symbolic_ends = ends ? nullptr : infer::shape_value(c, 2);
  if (symbolic_ends && symbolic_ends->scalar) symbolic_ends = nullptr;
  size_t n = starts ? starts->size() : (ends ? ends->size() : 0);
  if (!axes) {
    if (!starts && !ends) return set_like_input(c, infer::unknown_dims(r));
    axes = Ints();
    for (size_t i = 0; i < n; ++i) axes->push_back(static_cast<int64_t>(i));
  }
  Shape out = *in;
  for (size_t i = 0; i < axes->size(); ++i) {
    int64_t a = normalize_axis((*axes)[i], r, c.where());
    bool known = starts && ends && (!c.has_input(4) || steps) && i < starts->size() &&
                 i < ends->size() && (!steps || i < steps->size());
    if (!known) {
      out[a] = Dim::unknown();
      if (symbolic_ends && i < symbolic_ends->dims.size())
        out[a] = slice_to_symbol(c, (*in)[a], symbolic_ends->dims[i], starts, steps, i);
      continue;
    }
    int64_t s = (*starts)[i], e = (*ends)[i], st = steps ? (*steps)[i] : 1;
    if (st == 0) throw ValueError(cat(c.where(), ": step 0 on axis ", (*axes)[i]));
    if ((*in)[a].is_known())
      out[a] = Dim(slice_length(s, e, st, (*in)[a].value));
    else if (!(s == 0 && st == 1 && e >= std::numeric_limits<int32_t>::max()))  // not whole
      out[a] = Dim::unknown();
  }
  set_like_input(c, out);
}

void infer_pad(InferContext& c) {
  const auto& in = shape_of(c, 0);
  if (!in) return set_like_input(c, std::nullopt);
  auto r = static_cast<int64_t>(in->size());
  std::optional<Ints> pads =
      c.has_input(1) ? infer::constant_ints(c, 1)
                     : c.attrs().get_ints(c.attrs().has("pads") ? "pads" : "paddings", {});
  std::optional<Ints> axes;
  if (c.has_input(3)) {
    axes = infer::constant_ints(c, 3);
  } else {
    axes = Ints();
    for (int64_t i = 0; i < r; ++i) axes->push_back(i);
  }
  if (!pads || !axes || pads->size() != 2 * axes->size())
    return set_like_input(c, infer::unknown_dims(r));
  Shape out = *in;
  for (size_t i = 0; i < axes->size(); ++i) {
    int64_t a = normalize_axis((*axes)[i], r, c.where());
    int64_t total;
    if (__builtin_add_overflow((*pads)[i], (*pads)[axes->size() + i], &total))
      return set_like_input(c, infer::unknown_dims(r));
    if (total == 0) continue;
    if (!out[a].is_known() || __builtin_add_overflow(out[a].value, total, &total)) {
      out[a] = Dim::unknown();
    } else {
      if (total < 0)
        throw ValueError(
            cat(c.where(), ": pads make axis ", a, " of ", shape_str(*in), " negative"));
      out[a] = Dim(total);
    }
  }
  set_like_input(c, out);
}

// DepthToSpace (to_space) or SpaceToDepth on NCHW.
void infer_depth_space(InferContext& c, bool to_space) {
  const auto& in = shape_of(c, 0);
  if (!in) return set_like_input(c, std::nullopt);
  if (in->size() != 4)
    throw ValueError(cat(c.where(), ": expected a 4-D input, got ", shape_str(*in)));
  int64_t b = c.attrs().get_int("blocksize");
  if (b <= 0 || b > (int64_t{1} << 20)) throw ValueError(cat(c.where(), ": invalid blocksize ", b));
  Shape out = *in;
  auto scale = [&](Dim d, bool up) {
    if (!d.is_known()) return Dim::unknown();
    if (up) return Dim(d.value * b);
    return d.value % b == 0 ? Dim(d.value / b) : Dim::unknown();
  };
  int64_t bb = b * b;
  if (to_space) {
    out[1] =
        (*in)[1].is_known() && (*in)[1].value % bb == 0 ? Dim((*in)[1].value / bb) : Dim::unknown();
    out[2] = scale((*in)[2], true);
    out[3] = scale((*in)[3], true);
  } else {
    out[1] = (*in)[1].is_known() ? Dim((*in)[1].value * bb) : Dim::unknown();
    out[2] = scale((*in)[2], false);
    out[3] = scale((*in)[3], false);
  }
  set_like_input(c, out);
}

void infer_shape(InferContext& c) {
  const auto& in = shape_of(c, 0);
  if (!in) return infer::set(c, 0, DType::kI64, infer::unknown_dims(1));
  auto r = static_cast<int64_t>(in->size());
  auto clamp_index = [r](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + r : i, 0, r); };
  int64_t start = clamp_index(c.node.attr_int("start"));
  int64_t end = clamp_index(c.attrs().get_int("end", r));
  infer::set(c, 0, DType::kI64, Shape{std::max<int64_t>(end - start, 0)});
}

}  // namespace

void register_tensor_ops(OpRegistry& r) {
  r.add({.name = "Reshape",
         .min_inputs = 1,
         .max_inputs = 2,
         .properties = kInjective | kView,
         .attrs = {bool_attr("allowzero", false, "opset 14+: 1 keeps a 0 in the shape literally"),
                   optional_attr("shape", AttrKind::kInts, "opset 1-4; an input from 5"),
                   optional_attr("consumed_inputs", AttrKind::kInts, "opset 1 only; ignored")},
         .infer = infer_reshape});
  r.add({.name = "Flatten",
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kInjective | kView,
         .attrs = {{"axis", int64_t{1}}},
         .infer = infer_flatten});
  r.add({.name = "Squeeze",
         .min_inputs = 1,
         .max_inputs = 2,
         .properties = kInjective | kView,
         .attrs = {optional_attr("axes", AttrKind::kInts, "before opset 13; an input from 13")},
         .infer = infer_squeeze});
  r.add({.name = "Unsqueeze",
         .min_inputs = 1,
         .max_inputs = 2,
         .properties = kInjective | kView,
         .attrs = {optional_attr("axes", AttrKind::kInts, "before opset 13; an input from 13")},
         .infer = infer_unsqueeze});
  r.add({.name = "Transpose",
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kInjective,
         .attrs = {optional_attr("perm", AttrKind::kInts, "absent: reverse the axes")},
         .infer = infer_transpose});
  r.add({.name = "Expand",
         .min_inputs = 2,
         .max_inputs = 2,
         .properties = kInjective | kBroadcast,
         .attrs = AttrSchema::none(),
         .infer = infer_expand});
  r.add({.name = "Tile",
         .min_inputs = 2,
         .max_inputs = 3,
         .properties = kInjective,
         .attrs = AttrSchema::none(),
         .infer = infer_tile});
  r.add({.name = "Concat",
         .min_inputs = 1,
         .max_inputs = -1,
         .properties = kInjective,
         .attrs = {{"axis", int64_t{1}, "required from opset 4; 1 in opset 1"}},
         .infer = infer_concat});
  r.add({.name = "Split",
         .min_inputs = 1,
         .max_inputs = 2,
         .min_outputs = 1,
         .max_outputs = kManyOutputs,
         .properties = kInjective,
         .attrs = {{"axis", int64_t{0}},
                   optional_attr("split", AttrKind::kInts, "before opset 13; an input from 13"),
                   optional_attr("num_outputs", AttrKind::kInt, "opset 18+")},
         .infer = infer_split});
  r.add({.name = "Slice",
         .min_inputs = 1,
         .max_inputs = 5,
         .properties = kInjective,
         .attrs = {optional_attr("starts", AttrKind::kInts, "opset 1-9; inputs from 10"),
                   optional_attr("ends", AttrKind::kInts, "opset 1-9"),
                   optional_attr("axes", AttrKind::kInts, "opset 1-9")},
         .infer = infer_slice});
  r.add({.name = "Pad",
         .min_inputs = 1,
         .max_inputs = 4,
         .properties = kInjective,
         .attrs = {{"mode", "constant", "constant, reflect, edge or wrap"},
                   optional_attr("pads", AttrKind::kInts, "opset 2-10; an input from 11"),
                   optional_attr("paddings", AttrKind::kInts, "opset 1"),
                   optional_attr("value", AttrKind::kFloat, "opset 1-10; 0 when absent")},
         .infer = infer_pad});
  r.add({.name = "DepthToSpace",
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kInjective,
         .attrs = {required_attr("blocksize", AttrKind::kInt), {"mode", "DCR", "DCR or CRD"}},
         .infer = [](InferContext& c) { infer_depth_space(c, true); }});
  // mode arrived in opset 25 (DCR or CRD, as DepthToSpace).
  r.add({.name = "SpaceToDepth",
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kInjective,
         .attrs = {required_attr("blocksize", AttrKind::kInt), {"mode", "DCR", "DCR or CRD"}},
         .infer = [](InferContext& c) { infer_depth_space(c, false); }});
  r.add({.name = "Shape",
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kShapeOnly,
         .attrs = {{"start", int64_t{0}}, optional_attr("end", AttrKind::kInt, "absent: the rank")},
         .infer = infer_shape});
  r.add({.name = "Size",
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kShapeOnly,
         .attrs = AttrSchema::none(),
         .infer = [](InferContext& c) { infer::set(c, 0, DType::kI64, Shape{}); }});
  register_generate_ops(r);
  register_resize_ops(r);
}

}  // namespace pto
