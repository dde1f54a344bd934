// Indexing op definitions: gathers, scatters, OneHot, NonZero, Compress, Unique, ReverseSequence
// and TensorScatter. Gathers are injective; scatters write into a copy of their first input (so
// may reuse its buffer); ops whose output shape depends on data are opaque.
#include "infer_util.h"

namespace pto {
namespace {

void infer_gather(InferContext& c) {
  if (!c.has_input(0) || !c.has_input(1)) return;
  const TensorType& data = c.inputs[0];
  const TensorType& idx = c.inputs[1];
  std::optional<Shape> shape;
  if (data.shape && idx.shape) {
    const Shape& d = *data.shape;
    const int64_t axis =
        normalize_axis(c.node.attr_int("axis"), static_cast<int64_t>(d.size()), c.where());
    shape = Shape(d.begin(), d.begin() + axis);
    shape->insert(shape->end(), idx.shape->begin(), idx.shape->end());
    shape->insert(shape->end(), d.begin() + axis + 1, d.end());
  }
  infer::set(c, 0, data.dtype, shape);
}

// GatherND: indices.shape[:-1] + data.shape[batch_dims + m:], m = indices.shape[-1].
void infer_gather_nd(InferContext& c) {
  if (!c.has_input(0) || !c.has_input(1)) return;
  const TensorType& data = c.inputs[0];
  const TensorType& idx = c.inputs[1];
  std::optional<Shape> shape;
  const int64_t b = c.node.attr_int("batch_dims");
  if (data.shape && idx.shape && !idx.shape->empty() && idx.shape->back().is_known()) {
    const int64_t m = idx.shape->back().value;
    const int64_t r = static_cast<int64_t>(data.shape->size());
    if (b >= 0 && m <= r - b) {
      shape = Shape(idx.shape->begin(), idx.shape->end() - 1);
      shape->insert(shape->end(), data.shape->begin() + b + m, data.shape->end());
    }
  }
  infer::set(c, 0, data.dtype, shape);
}

void infer_one_hot(InferContext& c) {
  if (!c.has_input(0) || !c.has_input(2)) return;
  const TensorType& idx = c.inputs[0];
  std::optional<Shape> shape;
  if (idx.shape) {
    const int64_t r = static_cast<int64_t>(idx.shape->size());
    const int64_t axis = normalize_axis(c.node.attr_int("axis"), r + 1, c.where());
    Dim depth = Dim::unknown();
    if (auto v = infer::constant_ints(c, 1); v && v->size() == 1 && (*v)[0] > 0)
      depth = Dim((*v)[0]);
    shape = *idx.shape;
    shape->insert(shape->begin() + axis, depth);
  }
  infer::set(c, 0, c.inputs[2].dtype, shape);
}

void infer_non_zero(InferContext& c) {
  if (!c.has_input(0)) return;
  std::optional<Shape> shape;
  if (c.inputs[0].shape)
    shape = Shape{Dim(static_cast<int64_t>(c.inputs[0].shape->size())), Dim::unknown()};
  infer::set(c, 0, DType::kI64, shape);
}

// Compress and Unique: the size along `axis` (or of the flattened input) depends on data.
std::optional<Shape> data_dependent_along_axis(const InferContext& c) {
  const TensorType& x = c.inputs[0];
  if (!c.attrs().has("axis")) return Shape{Dim::unknown()};
  if (!x.shape) return std::nullopt;
  Shape s = *x.shape;
  s[normalize_axis(c.attrs().get_int("axis"), static_cast<int64_t>(s.size()), c.where())] =
      Dim::unknown();
  return s;
}

void infer_compress(InferContext& c) {
  if (!c.has_input(0)) return;
  infer::set(c, 0, c.inputs[0].dtype, data_dependent_along_axis(c));
}

void infer_unique(InferContext& c) {
  if (!c.has_input(0)) return;
  const TensorType& x = c.inputs[0];
  infer::set(c, 0, x.dtype, data_dependent_along_axis(c));
  infer::set(c, 1, DType::kI64, Shape{Dim::unknown()});
  Dim n = Dim::unknown();  // inverse_indices: one per element (or per slice along axis)
  if (x.shape && c.attrs().has("axis")) {
    n = (*x.shape)[normalize_axis(c.attrs().get_int("axis"), static_cast<int64_t>(x.shape->size()),
                                  c.where())];
  } else if (x.shape && is_static(*x.shape)) {
    n = Dim(checked_numel(to_dims(*x.shape), "Unique"));
  }
  infer::set(c, 2, DType::kI64, Shape{n});
  infer::set(c, 3, DType::kI64, Shape{Dim::unknown()});
}

void add(OpRegistry& r, const std::string& name, int min_in, int max_in, uint32_t props,
         AttrSchema attrs, InferFn infer) {
  r.add({.name = name,
         .min_inputs = min_in,
         .max_inputs = max_in,
         .properties = props,
         .attrs = std::move(attrs),
         .infer = std::move(infer)});
}

}  // namespace

void register_indexing_ops(OpRegistry& r) {
  auto same = [](InferContext& c) { infer::same_as_input(c); };
  auto like_indices = [](InferContext& c) {
    if (!c.has_input(0) || !c.has_input(1)) return;
    infer::set(c, 0, c.inputs[0].dtype, c.inputs[1].shape);
  };
  const AttrSchema axis0 = {{"axis", int64_t{0}}};
  const AttrDef reduction = {"reduction", "none", "opset 16+: none, add, mul, max or min"};
  add(r, "Gather", 2, 2, kInjective, axis0, infer_gather);
  add(r, "GatherElements", 2, 2, kInjective, axis0, like_indices);
  add(r, "GatherND", 2, 2, kInjective, {{"batch_dims", int64_t{0}}}, infer_gather_nd);
  // Scatter is ScatterElements' deprecated name (opsets 9-10).
  add(r, "Scatter", 3, 3, kInPlace, axis0, same);
  add(r, "ScatterElements", 3, 3, kInPlace, axis0.with({reduction}), same);
  add(r, "ScatterND", 3, 3, kInPlace, {reduction}, same);
  add(r, "TensorScatter", 2, 3, kInPlace,
      {{"axis", int64_t{-2}, "the sequence axis"}, {"mode", "linear", "linear or circular"}}, same);
  add(r, "OneHot", 3, 3, kInjective, {{"axis", int64_t{-1}}}, infer_one_hot);
  add(r, "NonZero", 1, 1, kOpaque, AttrSchema::none(), infer_non_zero);
  add(r, "Compress", 2, 2, kOpaque,
      {optional_attr("axis", AttrKind::kInt, "absent: the flattened input")}, infer_compress);
  add(r, "ReverseSequence", 2, 2, kInjective,
      {{"batch_axis", int64_t{1}}, {"time_axis", int64_t{0}}}, same);
  r.add({.name = "Unique",
         .min_inputs = 1,
         .max_inputs = 1,
         .min_outputs = 1,
         .max_outputs = 4,
         .properties = kOpaque,
         .attrs = {optional_attr("axis", AttrKind::kInt, "absent: the flattened input"),
                   bool_attr("sorted", true)},
         .infer = infer_unique,
         .doc = "unique values (or slices along axis), first indices, inverse indices, counts"});
}

}  // namespace pto
