// NN ops that keep their input's shape: normalizations, Softmax / LogSoftmax / Hardmax, Dropout.
#include "infer_util.h"
#include "op_params.h"

namespace pto {
namespace {

void infer_batch_norm(InferContext& c) {
  infer::same_as_input(c, 0, 0);
  // Training outputs: running mean and variance (and, before opset 14, the batch's own).
  for (size_t o = 1; o < c.outputs.size(); ++o) {
    DType dt = c.has_input(3)   ? c.inputs[3].dtype
               : c.has_input(0) ? c.inputs[0].dtype
                                : DType::kUndefined;
    std::optional<Shape> s;
    if (c.has_input(0) && c.inputs[0].shape && c.inputs[0].shape->size() >= 2)
      s = Shape{(*c.inputs[0].shape)[1]};
    infer::set(c, o, dt, s);
  }
}

void infer_layer_norm(InferContext& c) {
  infer::same_as_input(c, 0, 0);
  if (c.outputs.size() < 2 || !c.has_input(0)) return;
  const params::Norm p = params::norm(c.node);
  DType stash = dtype_from_onnx_code(p.stash_type, c.where());
  std::optional<Shape> s = c.inputs[0].shape;
  if (s) {
    const int64_t rank = static_cast<int64_t>(s->size());
    const int64_t axis = normalize_axis(p.axis, rank, c.where());
    for (int64_t i = axis; i < rank; ++i) (*s)[i] = 1;
  }
  for (size_t o = 1; o < c.outputs.size(); ++o) infer::set(c, o, stash, s);
}

void infer_dropout(InferContext& c) {
  infer::same_as_input(c, 0, 0);
  if (c.outputs.size() < 2 || !c.has_input(0)) return;
  const int opset = c.node.opset;
  DType mask = opset > 0 && opset < 10 ? c.inputs[0].dtype : DType::kBool;
  infer::set(c, 1, mask, c.inputs[0].shape);
}

OpDef same_shape(const char* name, int min_in, int max_in, uint32_t props, AttrSchema attrs) {
  return {.name = name,
          .min_inputs = min_in,
          .max_inputs = max_in,
          .properties = props,
          .attrs = std::move(attrs),
          .infer = [](InferContext& c) { infer::same_as_input(c); }};
}

}  // namespace

void register_nn_norm_ops(OpRegistry& r) {
  r.add({.name = "BatchNormalization",
         .min_inputs = 5,
         .max_inputs = 5,
         .min_outputs = 1,
         .max_outputs = 5,
         .properties = kOpaque,
         .attrs = {{"epsilon", 1e-5},
                   {"momentum", 0.9},
                   bool_attr("training_mode", false, "opset 14+"),
                   {"spatial", int64_t{1}, "opset < 9: 0 for per-element statistics"},
                   optional_attr("is_test", AttrKind::kInt, "opset < 7"),
                   optional_attr("consumed_inputs", AttrKind::kInts, "opset 1 only; ignored")},
         .infer = infer_batch_norm,
         .doc = "inference: scale * (x - mean) / sqrt(var + eps) + bias per channel; "
                "training_mode: batch statistics and updated running statistics"});
  r.add({.name = "LayerNormalization",
         .min_inputs = 2,
         .max_inputs = 3,
         .min_outputs = 1,
         .max_outputs = 3,
         .properties = kReduction,
         .attrs = params::norm_attrs(),
         .infer = infer_layer_norm});
  r.add(same_shape("InstanceNormalization", 3, 3, kReduction,
                   {{"epsilon", 1e-5},
                    optional_attr("consumed_inputs", AttrKind::kInts, "opset 1 only; ignored")}));
  r.add(same_shape("GroupNormalization", 3, 3, kReduction,
                   {{"epsilon", 1e-5},
                    required_attr("num_groups", AttrKind::kInt),
                    {"stash_type", int64_t{1}, "opset 21+: the statistics' ONNX type"}}));
  r.add(
      same_shape("LpNormalization", 1, 1, kReduction, {{"axis", int64_t{-1}}, {"p", int64_t{2}}}));
  r.add(same_shape("MeanVarianceNormalization", 1, 1, kReduction,
                   {{"axes", Dims{0, 2, 3}},
                    optional_attr("across_channels", AttrKind::kInt, "opset 1"),
                    optional_attr("normalize_variance", AttrKind::kInt, "opset 1")}));
  r.add(same_shape(
      "LRN", 1, 1, kOpaque,
      {{"alpha", 1e-4}, {"beta", 0.75}, {"bias", 1.0}, required_attr("size", AttrKind::kInt)}));
  for (const char* op : {"Softmax", "LogSoftmax", "Hardmax"})
    r.add(same_shape(op, 1, 1, kReduction, {params::softmax_axis_attr()}));
  r.add({.name = "Dropout",
         .min_inputs = 1,
         .max_inputs = 3,
         .min_outputs = 1,
         .max_outputs = 2,
         .properties = kElementwise | kView,
         .attrs = {optional_attr("ratio", AttrKind::kFloat, "opset < 12; 0.5 when absent"),
                   optional_attr("seed", AttrKind::kInt, "opset 12+"),
                   optional_attr("is_test", AttrKind::kInt, "opset < 7"),
                   optional_attr("consumed_inputs", AttrKind::kInts, "opset 1 only; ignored")},
         .infer = infer_dropout,
         .doc = "inference: identity (mask all true); training with a nonzero ratio is "
                "unsupported"});
}

}  // namespace pto
