// Type inference over a whole graph: each node's OpDef::infer in topological order.
#include "pto/op_registry.h"

namespace pto {

void infer_types(Graph& g) {
  for (const Node& n : g.nodes()) {
    InferContext ctx{n, {}, {}, {}};
    for (ValueId v : n.inputs) {
      ctx.inputs.push_back(v == kNoValue ? TensorType{} : g.value(v).type);
      ctx.constants.push_back(v == kNoValue ? nullptr : g.initializer(v));
    }
    ctx.outputs.resize(n.outputs.size());
    if (n.def->infer) n.def->infer(ctx);
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      if (n.outputs[i] == kNoValue) continue;
      TensorType& declared = g.value(n.outputs[i]).type;
      const TensorType& inferred = ctx.outputs[i];
      // Keep what the model declared when inference knows less.
      if (inferred.dtype != DType::kUndefined) declared.dtype = inferred.dtype;
      if (inferred.shape) declared.shape = inferred.shape;
    }
  }
}

}  // namespace pto
