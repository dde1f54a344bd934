// Op definitions for Cast, CastLike, BitCast, Constant, ConstantOfShape, Range, EyeLike and Trilu.
#include <cmath>
#include <limits>
#include <variant>

#include "tensor_infer.h"

namespace pto {
namespace {

// Cast's target: an element-type code, or (Cast-1) a type name such as "FLOAT".
DType cast_target(const InferContext& c) {
  return c.attrs().get_dtype("to");
}

std::optional<Shape> shape_of(const InferContext& c, size_t i) {
  return c.has_input(i) ? c.inputs[i].shape : std::nullopt;
}

void infer_constant(InferContext& c) {
  const Attributes& a = c.attrs();
  if (a.has("value") && std::holds_alternative<Tensor>(a.all().at("value"))) {
    const Tensor& t = a.get_tensor("value");
    infer::set(c, 0, t.dtype(), to_shape(t.shape()));
  } else if (a.has("value_float")) {
    infer::set(c, 0, DType::kF32, Shape{});
  } else if (a.has("value_int")) {
    infer::set(c, 0, DType::kI64, Shape{});
  } else if (a.has("value_floats")) {
    infer::set(c, 0, DType::kF32, Shape{static_cast<int64_t>(a.get_floats("value_floats").size())});
  } else if (a.has("value_ints")) {
    infer::set(c, 0, DType::kI64, Shape{static_cast<int64_t>(a.get_ints("value_ints").size())});
  }
  // Strings and sparse values have no PyPTO dtype; the kernel reports them unsupported.
}

void infer_constant_of_shape(InferContext& c) {
  DType dt = DType::kF32;
  if (c.attrs().has("value")) dt = c.attrs().get_tensor("value").dtype();
  if (std::optional<std::vector<int64_t>> dims = infer::constant_ints(c, 0)) {
    for (int64_t d : *dims)
      if (d < 0) throw ValueError(cat(c.where(), ": negative dimension in ", dims_str(*dims)));
    return infer::set(c, 0, dt, to_shape(*dims));
  }
  if (const ShapeValue* v = infer::shape_value(c, 0); v && !v->scalar)
    return infer::set(c, 0, dt, v->dims);
  std::optional<Shape> s = shape_of(c, 0);
  if (s && s->size() == 1 && (*s)[0].is_known())
    return infer::set(c, 0, dt, infer::unknown_dims(static_cast<size_t>((*s)[0].value)));
  infer::set(c, 0, dt, std::nullopt);
}

void infer_range(InferContext& c) {
  DType dt = c.has_input(0) ? c.inputs[0].dtype : DType::kUndefined;
  Dim n = Dim::unknown();
  auto s = infer::constant_ints(c, 0), l = infer::constant_ints(c, 1),
       d = infer::constant_ints(c, 2);
  if (s && l && d && s->size() == 1 && l->size() == 1 && d->size() == 1 && (*d)[0] != 0) {
    __extension__ using Wide = __int128;
    Wide diff = static_cast<Wide>((*l)[0]) - (*s)[0], step = (*d)[0];
    Wide q = diff / step + ((diff % step != 0) && ((diff > 0) == (step > 0)) ? 1 : 0);
    if (q <= 0)
      n = Dim(0);
    else if (q <= std::numeric_limits<int64_t>::max())
      n = Dim(static_cast<int64_t>(q));
  }
  // Range(0, n, 1) with a symbolic n (arange over a sequence length): n elements.
  const ShapeValue* lv = infer::shape_value(c, 1);
  if (s && d && s->size() == 1 && d->size() == 1 && (*s)[0] == 0 && (*d)[0] == 1 && lv &&
      lv->dims.size() == 1 && lv->dims[0].is_symbolic())
    n = lv->dims[0];
  auto fs = infer::constant_floats(c, 0), fl = infer::constant_floats(c, 1),
       fd = infer::constant_floats(c, 2);
  if (fs && fl && fd && fs->size() == 1 && fl->size() == 1 && fd->size() == 1) {
    double count = std::ceil(((*fl)[0] - (*fs)[0]) / (*fd)[0]);
    if (count <= 0)
      n = Dim(0);
    else if (count < 9.0e18)
      n = Dim(static_cast<int64_t>(count));
  }
  infer::set(c, 0, dt, Shape{n});
}

void infer_eye_like(InferContext& c) {
  DType dt = c.has_input(0) ? c.inputs[0].dtype : DType::kUndefined;
  if (c.attrs().has("dtype")) dt = dtype_from_onnx_code(c.attrs().get_int("dtype"), c.where());
  std::optional<Shape> s = shape_of(c, 0);
  if (s && s->size() != 2)
    throw ValueError(cat(c.where(), ": expected a 2-D input, got ", shape_str(*s)));
  infer::set(c, 0, dt, s);
}

}  // namespace

namespace {

// Cast's and CastLike's attributes besides Cast's `to`.
AttrSchema cast_attrs() {
  return {bool_attr("saturate", true, "opset 19+: float8 targets saturate"),
          {"round_mode", "up", "opset 24+: rounding to float8e8m0"}};
}

}  // namespace

void register_generate_ops(OpRegistry& r) {
  r.add({.name = "Cast",
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = kElementwise,
         .attrs = cast_attrs().with({required_attr("to", AttrKind::kDType)}),
         .infer = [](InferContext& c) { infer::set(c, 0, cast_target(c), shape_of(c, 0)); }});
  r.add({.name = "CastLike",
         .min_inputs = 2,
         .max_inputs = 2,
         .properties = kElementwise,
         .attrs = cast_attrs(),
         .infer = [](InferContext& c) {
           infer::set(c, 0, c.has_input(1) ? c.inputs[1].dtype : DType::kUndefined, shape_of(c, 0));
         }});
  r.add({.name = "BitCast",
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = 0,
         .attrs = {required_attr("to", AttrKind::kDType)},
         .infer = [](InferContext& c) {
           DType to = cast_target(c);
           if (c.has_input(0) && c.inputs[0].dtype != DType::kUndefined &&
               packed_bits(c.inputs[0].dtype) != packed_bits(to))
             throw ValueError(cat(c.where(), ": BitCast from ", dtype_name(c.inputs[0].dtype), " (",
                                  packed_bits(c.inputs[0].dtype), " bits) to ", dtype_name(to),
                                  " (", packed_bits(to), " bits): the widths must be equal"));
           infer::set(c, 0, to, shape_of(c, 0));
         }});
  r.add({.name = "Constant",
         .min_inputs = 0,
         .max_inputs = 0,
         .properties = 0,
         // Exactly one of these (sparse_value is not supported).
         .attrs = {optional_attr("value", AttrKind::kTensor),
                   optional_attr("value_float", AttrKind::kFloat),
                   optional_attr("value_floats", AttrKind::kFloats),
                   optional_attr("value_int", AttrKind::kInt),
                   optional_attr("value_ints", AttrKind::kInts),
                   optional_attr("value_string", AttrKind::kString),
                   optional_attr("value_strings", AttrKind::kStrings)},
         .infer = infer_constant});
  r.add({.name = "ConstantOfShape",
         .min_inputs = 1,
         .max_inputs = 1,
         .properties = 0,
         .attrs = {optional_attr("value", AttrKind::kTensor, "one element; absent: float 0")},
         .infer = infer_constant_of_shape});
  r.add({.name = "Range",
         .min_inputs = 3,
         .max_inputs = 3,
         .properties = 0,
         .attrs = AttrSchema::none(),
         .infer = infer_range});
  r.add(
      {.name = "EyeLike",
       .min_inputs = 1,
       .max_inputs = 1,
       .properties = kShapeOnly,
       .attrs = {optional_attr("dtype", AttrKind::kInt, "absent: the input's"), {"k", int64_t{0}}},
       .infer = infer_eye_like});
  r.add({.name = "Trilu",
         .min_inputs = 1,
         .max_inputs = 2,
         .properties = kInjective,
         .attrs = {bool_attr("upper", true)},
         .infer = [](InferContext& c) { infer::same_as_input(c); }});
}

}  // namespace pto
