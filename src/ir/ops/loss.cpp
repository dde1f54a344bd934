// Loss ops used by training graphs: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.
#include "infer_util.h"

namespace pto {
namespace {

void infer_loss(InferContext& c) {
  if (!c.has_input(0)) return;
  std::optional<Shape> shape;
  if (c.node.attr_string("reduction") != "none")
    shape = Shape{};
  else if (c.has_input(1))
    shape = c.inputs[1].shape;
  infer::set(c, 0, c.inputs[0].dtype, shape);
  if (c.outputs.size() > 1) infer::same_as_input(c, 1, 0);
}

}  // namespace

void register_loss_ops(OpRegistry& r) {
  r.add({.name = "NegativeLogLikelihoodLoss",
         .min_inputs = 2,
         .max_inputs = 3,
         .properties = kReduction,
         .attrs = {optional_attr("ignore_index", AttrKind::kInt),
                   {"reduction", "mean", "none, sum or mean"}},
         .infer = infer_loss});
  r.add({.name = "SoftmaxCrossEntropyLoss",
         .min_inputs = 2,
         .max_inputs = 3,
         .min_outputs = 1,
         .max_outputs = 2,
         .properties = kReduction,
         .attrs = {optional_attr("ignore_index", AttrKind::kInt),
                   {"reduction", "mean", "none, sum or mean"}},
         .infer = infer_loss});
}

}  // namespace pto
