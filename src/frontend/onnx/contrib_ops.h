// The com.microsoft ops that onnxruntime writes into the models it optimizes (its transformer
// optimizer, Optimum's O2/O3 exports, a session's optimized_model_filepath) and ORT's
// SimplifiedLayerNormalization of the default domain, read as the standard ops they stand for.
// They are ORT's fusions for ORT's kernels; PyPTO's passes make their own from the standard ops
// (docs/architecture.md, "Contrib ops").
#pragma once

#include <string>
#include <vector>

#include "pto/graph.h"

namespace pto::onnx {

// Whether op `op` of `domain` is one expand_contrib_op reads.
bool is_expanded_contrib_op(const std::string& domain, const std::string& op);

// Appends to `g` the standard nodes that compute the contrib op's `outputs` (kNoValue: an output
// the model does not ask for) from `inputs` (kNoValue: an absent optional input). `name` prefixes
// the new nodes and values; `where` starts error messages. Forms the expansion does not cover are
// an UnsupportedError that says which.
void expand_contrib_op(Graph& g, const std::string& op, const std::vector<ValueId>& inputs,
                       const std::vector<ValueId>& outputs, const Attributes& attrs,
                       const std::string& name, const std::string& where);

}  // namespace pto::onnx
