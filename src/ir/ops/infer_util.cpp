#include "infer_util.h"

namespace pto::infer {

void same_as_input(InferContext& c, size_t out, size_t in) {
  if (out < c.outputs.size() && c.has_input(in)) c.outputs[out] = c.inputs[in];
}

void broadcast(InferContext& c, DType dtype) {
  std::optional<Shape> shape = Shape{};
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!c.has_input(i)) continue;
    if (!c.inputs[i].shape || !shape) {
      shape.reset();
      continue;
    }
    shape = broadcast_shapes(*shape, *c.inputs[i].shape, c.where());
  }
  DType dt = dtype != DType::kUndefined ? dtype : (c.has_input(0) ? c.inputs[0].dtype : dtype);
  set(c, 0, dt, shape);
}

std::optional<std::vector<int64_t>> constant_ints(const InferContext& c, size_t i) {
  if (i >= c.constants.size() || !c.constants[i]) return std::nullopt;
  const Tensor& t = *c.constants[i];
  if (!is_integral(t.dtype())) return std::nullopt;
  Tensor packed = t.contiguous();
  return dispatch(t.dtype(), kIntTypes, c.where(), [&]<class T>() {
    const T* p = packed.data<T>();
    return std::vector<int64_t>(p, p + packed.numel());
  });
}

const ShapeValue* shape_value(const InferContext& c, size_t i) {
  return i < c.values.size() ? c.values[i] : nullptr;
}

void set(InferContext& c, size_t out, DType dtype, std::optional<Shape> shape) {
  if (out >= c.outputs.size()) return;
  c.outputs[out].dtype = dtype;
  c.outputs[out].shape = std::move(shape);
}

void add_opaque(OpRegistry& r, const std::string& name, int min_inputs, int max_inputs,
                AttrSchema attrs, InferFn infer, std::string doc) {
  r.add({.name = name,
         .min_inputs = min_inputs,
         .max_inputs = max_inputs,
         .properties = kOpaque,
         .attrs = std::move(attrs),
         .infer = std::move(infer),
         .doc = std::move(doc)});
}

}  // namespace pto::infer
