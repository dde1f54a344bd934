// Reduction op definitions: the ONNX Reduce* family, ArgMax/ArgMin, the scans CumSum/CumProd and
// TopK. Reduce axes come from the `axes` attribute (older opsets) or the optional second input
// (ReduceSum from opset 13, the others from 18); inference knows them only when that input is a
// constant.
#include <algorithm>

#include "infer_util.h"
#include "op_params.h"

namespace pto {
namespace {

// Output shape of reducing `in` over `axes` (every axis when `all`).
Shape reduced_shape(const Shape& in, const std::vector<int64_t>& axes, bool all, bool keepdims) {
  Shape out;
  for (int64_t k = 0; k < static_cast<int64_t>(in.size()); ++k) {
    bool reduced = all || std::binary_search(axes.begin(), axes.end(), k);
    if (!reduced)
      out.push_back(in[k]);
    else if (keepdims)
      out.push_back(Dim(1));
  }
  return out;
}

void infer_reduce(InferContext& c) {
  if (!c.has_input(0)) return;
  const TensorType& x = c.inputs[0];
  const params::Reduce p =
      params::reduce(c.node, c.has_input(1) ? infer::constant_ints(c, 1) : std::nullopt);
  std::optional<Shape> shape;
  if (x.shape && p.axes) {
    const std::vector<bool> reduced = p.reduced(static_cast<int64_t>(x.shape->size()), c.where());
    shape = Shape{};
    for (size_t k = 0; k < reduced.size(); ++k) {
      if (!reduced[k])
        shape->push_back((*x.shape)[k]);
      else if (p.keepdims)
        shape->push_back(Dim(1));
    }
  } else if (x.shape && p.keepdims) {
    shape = Shape(x.shape->size(), Dim::unknown());
  }
  infer::set(c, 0, x.dtype, shape);
}

void infer_arg(InferContext& c) {
  if (!c.has_input(0)) return;
  const TensorType& x = c.inputs[0];
  std::optional<Shape> shape;
  if (x.shape) {
    const int64_t axis =
        normalize_axis(c.node.attr_int("axis"), static_cast<int64_t>(x.shape->size()), c.where());
    shape = reduced_shape(*x.shape, {axis}, false, c.node.attr_int("keepdims") != 0);
  }
  infer::set(c, 0, DType::kI64, shape);
}

void infer_topk(InferContext& c) {
  if (!c.has_input(0)) return;
  const TensorType& x = c.inputs[0];
  std::optional<Shape> shape;
  if (x.shape) {
    shape = *x.shape;
    const int64_t axis =
        normalize_axis(c.node.attr_int("axis"), static_cast<int64_t>(shape->size()), c.where());
    Dim k = Dim::unknown();
    if (c.has_input(1)) {
      if (auto v = infer::constant_ints(c, 1); v && v->size() == 1) k = Dim((*v)[0]);
    } else if (c.attrs().has("k")) {
      k = Dim(c.attrs().get_int("k"));
    }
    (*shape)[axis] = k;
  }
  infer::set(c, 0, x.dtype, shape);
  infer::set(c, 1, DType::kI64, shape);
}

void reduce_op(OpRegistry& r, const std::string& name) {
  r.add({.name = name,
         .min_inputs = 1,
         .max_inputs = 2,
         .properties = kReduction,
         .attrs = params::reduce_attrs(),
         .infer = infer_reduce});
}

}  // namespace

void register_reduction_ops(OpRegistry& r) {
  for (const char* op :
       {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
        "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"})
    reduce_op(r, op);
  for (const char* op : {"ArgMax", "ArgMin"})
    r.add({.name = op,
           .min_inputs = 1,
           .max_inputs = 1,
           .properties = kReduction,
           .attrs = {{"axis", int64_t{0}},
                     bool_attr("keepdims", true),
                     bool_attr("select_last_index", false, "opset 12+")},
           .infer = infer_arg});
  // Scans keep the input's shape: not reductions in the sense passes rely on (smaller output).
  for (const char* op : {"CumSum", "CumProd"})
    r.add({.name = op,
           .min_inputs = 2,
           .max_inputs = 2,
           .properties = kOpaque,
           .attrs = {bool_attr("exclusive", false), bool_attr("reverse", false)},
           .infer = [](InferContext& c) { infer::same_as_input(c); }});
  r.add({.name = "TopK",
         .min_inputs = 1,
         .max_inputs = 2,
         .min_outputs = 2,
         .max_outputs = 2,
         .properties = kOpaque,
         .attrs = {{"axis", int64_t{-1}},
                   bool_attr("largest", true, "opset 11+"),
                   bool_attr("sorted", true, "opset 11+"),
                   optional_attr("k", AttrKind::kInt, "opset 1-9; an input from 10")},
         .infer = infer_topk,
         .doc = "the k largest (or smallest) values along an axis and their indices"});
}

}  // namespace pto
