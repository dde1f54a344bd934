// Ops of the ai.onnx.preview domain read as the standard ops they stand for: FlexAttention, with
// its score_mod and prob_mod subgraphs spliced in between the products, so that PyPTO's passes
// see (and fuse) an ordinary attention graph.
#pragma once

#include <string>
#include <vector>

#include "pto/graph.h"

namespace pto::onnx {

// Whether op `op` of `domain` is one expand_preview_op reads.
bool is_preview_op(const std::string& domain, const std::string& op);

// Appends to `g` the standard nodes computing the node's `outputs` from `inputs` (the node's own,
// then the outer values its subgraphs capture, as the importer lists them); `attrs` holds the
// subgraphs already converted. As expand_contrib_op (contrib_ops.h) otherwise.
void expand_preview_op(Graph& g, const std::string& op, const std::vector<ValueId>& inputs,
                       const std::vector<ValueId>& outputs, const Attributes& attrs,
                       const std::string& name, const std::string& where);

}  // namespace pto::onnx
