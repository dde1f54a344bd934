// Sequence and optional op definitions (ONNX seq(tensor) and optional(T)): SequenceEmpty,
// SequenceConstruct, SequenceAt, SequenceInsert, SequenceErase, SequenceLength, SplitToSequence,
// ConcatFromSequence, Optional, OptionalHasElement, OptionalGetElement. SequenceMap, which has a
// body, is with control flow. A sequence's type is its elements' (TensorType::sequence); the
// elements of one sequence share a dtype, and their shape is kept where every element agrees.
#include "infer_util.h"

namespace pto {
namespace {

TensorType sequence_of(TensorType element) {
  element.sequence = true;
  return element;
}

TensorType element_of(TensorType seq) {
  seq.sequence = false;
  return seq;
}

// The type that covers both: the dims where they agree, unknown elsewhere.
std::optional<Shape> common_shape(const std::optional<Shape>& a, const std::optional<Shape>& b) {
  if (!a || !b || a->size() != b->size()) return std::nullopt;
  Shape s = *a;
  for (size_t d = 0; d < s.size(); ++d)
    if (s[d] != (*b)[d]) s[d] = Dim::unknown();
  return s;
}

// Input i must be typed as a sequence.
void expect_sequence(const InferContext& c, size_t i) {
  const TensorType& t = c.input(i);
  if (!t.sequence || t.optional)
    throw TypeError(cat(c.where(), ": input ", i, " should be a sequence, got ", t.str()));
}

void expect_tensor(const InferContext& c, size_t i) {
  if (c.has_input(i) && !c.inputs[i].is_tensor())
    throw TypeError(cat(c.where(), ": input ", i, " should be a tensor, got ", c.inputs[i].str()));
}

void infer_empty(InferContext& c) {
  const DType dt = c.attrs().has("dtype") ? c.attrs().get_dtype("dtype") : DType::kF32;
  c.outputs[0] = sequence_of({dt, std::nullopt});
}

void infer_construct(InferContext& c) {
  TensorType t = c.input(0);
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    expect_tensor(c, i);
    const TensorType& x = c.input(i);
    if (x.dtype != t.dtype)
      throw TypeError(cat(c.where(), ": input ", i, " is ", dtype_name(x.dtype), ", input 0 ",
                          dtype_name(t.dtype), " (a sequence holds one dtype)"));
    t.shape = common_shape(t.shape, x.shape);
  }
  c.outputs[0] = sequence_of(t);
}

void infer_at(InferContext& c) {
  expect_sequence(c, 0);
  c.outputs[0] = element_of(c.input(0));
}

void infer_insert(InferContext& c) {
  expect_sequence(c, 0);
  expect_tensor(c, 1);
  TensorType seq = c.input(0);
  const TensorType& x = c.input(1);
  if (x.dtype != seq.dtype)
    throw TypeError(cat(c.where(), ": inserts ", dtype_name(x.dtype), " into a sequence of ",
                        dtype_name(seq.dtype)));
  seq.shape = common_shape(seq.shape, x.shape);
  c.outputs[0] = seq;
}

void infer_erase(InferContext& c) {
  expect_sequence(c, 0);
  c.outputs[0] = c.input(0);
}

void infer_length(InferContext& c) {
  expect_sequence(c, 0);
  infer::set(c, 0, DType::kI64, Shape{});
}

void infer_split(InferContext& c) {
  expect_tensor(c, 0);
  const TensorType& x = c.input(0);
  TensorType element{x.dtype, std::nullopt};
  if (x.shape) {
    Shape s = *x.shape;
    const int64_t axis =
        normalize_axis(c.node.attr_int("axis"), static_cast<int64_t>(s.size()), c.where());
    if (c.has_input(1))
      s[axis] = Dim::unknown();  // the last part may be shorter
    else if (c.node.attr_int("keepdims"))
      s[axis] = Dim(1);
    else
      s.erase(s.begin() + axis);
    element.shape = std::move(s);
  }
  c.outputs[0] = sequence_of(element);
}

void infer_concat(InferContext& c) {
  expect_sequence(c, 0);
  const TensorType& seq = c.input(0);
  TensorType out{seq.dtype, std::nullopt};
  if (seq.shape) {
    Shape s = *seq.shape;
    const bool new_axis = c.node.attr_int("new_axis") != 0;
    const int64_t rank = static_cast<int64_t>(s.size()) + (new_axis ? 1 : 0);
    const int64_t axis = normalize_axis(c.node.attr_int("axis"), rank, c.where());
    if (new_axis)
      s.insert(s.begin() + axis, Dim::unknown());  // the sequence's length
    else
      s[axis] = Dim::unknown();  // the sum of the elements' sizes
    out.shape = std::move(s);
  }
  c.outputs[0] = out;
}

void infer_optional(InferContext& c) {
  TensorType t;
  if (c.has_input(0)) {
    t = c.inputs[0];
    if (t.optional) throw TypeError(cat(c.where(), ": the input is already optional"));
  } else if (c.attrs().has("type")) {
    t = parse_type(c.attrs().get_string("type"));
  } else {
    throw ValueError(cat(c.where(), ": an Optional without an input needs the attribute 'type'"));
  }
  t.optional = true;
  c.outputs[0] = t;
}

void infer_has_element(InferContext& c) {
  infer::set(c, 0, DType::kBool, Shape{});
}

void infer_get_element(InferContext& c) {
  TensorType t = c.input(0);  // opset 18 also takes a plain tensor or sequence: itself
  t.optional = false;
  c.outputs[0] = t;
}

void add(OpRegistry& r, const std::string& name, int min_inputs, int max_inputs, AttrSchema attrs,
         InferFn infer, std::string doc) {
  r.add({.name = name,
         .min_inputs = min_inputs,
         .max_inputs = max_inputs,
         .properties = kOpaque | kNonTensorValues,
         .attrs = std::move(attrs),
         .infer = std::move(infer),
         .doc = std::move(doc)});
}

}  // namespace

void register_sequence_ops(OpRegistry& r) {
  add(r, "SequenceEmpty", 0, 0, {optional_attr("dtype", AttrKind::kDType, "default float32")},
      infer_empty, "an empty sequence of dtype");
  add(r, "SequenceConstruct", 1, -1, AttrSchema::none(), infer_construct,
      "the sequence of its inputs");
  add(r, "SequenceAt", 2, 2, AttrSchema::none(), infer_at, "the element at position");
  add(r, "SequenceInsert", 2, 3, AttrSchema::none(), infer_insert,
      "the sequence with the tensor inserted at position (default: at the end)");
  add(r, "SequenceErase", 1, 2, AttrSchema::none(), infer_erase,
      "the sequence without the element at position (default: the last)");
  add(r, "SequenceLength", 1, 1, AttrSchema::none(), infer_length,
      "the number of elements, an int64 scalar");
  add(r, "SplitToSequence", 1, 2, {{"axis", int64_t{0}}, bool_attr("keepdims", true)}, infer_split,
      "the input cut along axis into parts of the given sizes (default: 1) as a sequence");
  add(r, "ConcatFromSequence", 1, 1,
      {required_attr("axis", AttrKind::kInt), bool_attr("new_axis", false)}, infer_concat,
      "the elements concatenated along axis, or stacked along a new axis");
  add(r, "Optional", 0, 1,
      {optional_attr("type", AttrKind::kType, "the type of an empty optional")}, infer_optional,
      "an optional holding the input, or an empty one of type");
  add(r, "OptionalHasElement", 0, 1, AttrSchema::none(), infer_has_element,
      "whether the optional holds a value (false for a missing input)");
  add(r, "OptionalGetElement", 1, 1, AttrSchema::none(), infer_get_element,
      "the value an optional holds (an error for an empty one)");
}

}  // namespace pto
