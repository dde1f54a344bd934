// Type inference over a whole graph: each node's OpDef::infer in topological order, with the
// symbolic contents of shape arithmetic (pto/shape_value.h) propagated alongside.
#include <deque>
#include <unordered_map>

#include "pto/op_registry.h"
#include "pto/shape_value.h"

namespace pto {

void infer_types(Graph& g) {
  infer_types(g, NodeFolder());
}

void infer_types(Graph& g, const NodeFolder& fold) {
  // Data known before running: initializers, the outputs of Constant nodes, and what `fold`
  // computes (kept in `folded`, whose elements do not move).
  std::unordered_map<ValueId, const Tensor*> known;
  std::deque<Tensor> folded;
  std::unordered_map<ValueId, ShapeValue> values;
  auto remember_constant = [&](ValueId v, const Tensor& t) {
    known[v] = &t;
    if (auto sv = shape_value_of_constant(t)) values[v] = std::move(*sv);
  };
  for (const auto& [v, t] : g.initializers()) remember_constant(v, t);
  for (Node& n : g.mutable_nodes()) {
    InferContext ctx{n, {}, {}, {}, {}};
    for (ValueId v : n.inputs) {
      ctx.inputs.push_back(v == kNoValue ? TensorType{} : g.value(v).type);
      auto it = v == kNoValue ? known.end() : known.find(v);
      ctx.constants.push_back(it == known.end() ? nullptr : it->second);
      auto sv = v == kNoValue ? values.end() : values.find(v);
      ctx.values.push_back(sv == values.end() ? nullptr : &sv->second);
    }
    if (n.op == "Constant" && n.outputs.size() == 1 && n.outputs[0] != kNoValue &&
        n.attrs.has("value") && std::holds_alternative<Tensor>(n.attrs.all().at("value")))
      remember_constant(n.outputs[0], n.attrs.get_tensor("value"));
    ctx.outputs.resize(n.outputs.size());
    if (n.def->infer) n.def->infer(ctx);
    for (auto& [k, sub] : ctx.subgraphs) n.attrs.set(k, std::move(sub));
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      if (n.outputs[i] == kNoValue) continue;
      TensorType& declared = g.value(n.outputs[i]).type;
      const TensorType& inferred = ctx.outputs[i];
      // Keep what the model declared when inference knows less.
      if (inferred.dtype != DType::kUndefined) declared.dtype = inferred.dtype;
      if (!inferred.is_tensor()) declared.sequence = inferred.sequence;
      if (!inferred.is_tensor()) declared.optional = inferred.optional;
      if (!inferred.shape) {
        // A sequence's declared element shape is a hint ONNX does not hold a model to (its node
        // tests declare rank-0 elements for rank-1 ones): where inference cannot tell, unknown.
        if (inferred.sequence) declared.shape.reset();
        continue;
      }
      if (declared.shape && declared.shape->size() == inferred.shape->size()) {
        // Merge dim by dim: what inference knows wins, what only the model declared stays.
        for (size_t d = 0; d < inferred.shape->size(); ++d)
          if ((*inferred.shape)[d].is_known() || !(*declared.shape)[d].is_known())
            (*declared.shape)[d] = (*inferred.shape)[d];
      } else {
        declared.shape = inferred.shape;
      }
    }
    if (fold && n.op != "Constant") {
      if (auto outs = fold(n, ctx.inputs, ctx.constants, ctx.outputs)) {
        for (size_t i = 0; i < n.outputs.size() && i < outs->size(); ++i) {
          if (n.outputs[i] == kNoValue || !(*outs)[i].defined()) continue;
          folded.push_back(std::move((*outs)[i]));
          const Tensor& t = folded.back();
          TensorType& type = g.value(n.outputs[i]).type;
          type.dtype = t.dtype();
          type.shape = to_shape(t.shape());
          remember_constant(n.outputs[i], t);
        }
      }
    }
    if (n.outputs.size() == 1 && n.outputs[0] != kNoValue && !values.contains(n.outputs[0]) &&
        (is_integral(g.value(n.outputs[0]).type.dtype) ||
         g.value(n.outputs[0]).type.dtype == DType::kBool))
      if (auto sv = evaluate_shape_value(n, ctx.inputs, ctx.values))
        values[n.outputs[0]] = std::move(*sv);
  }
}

}  // namespace pto
