// The com.microsoft ops that onnxruntime writes into the models it optimizes (its transformer
// optimizer, Optimum's O2/O3 exports, a session's optimized_model_filepath) and ORT's
// SimplifiedLayerNormalization of the default domain, read as the standard ops they stand for.
// They are ORT's fusions for ORT's kernels; PyPTO's passes make their own from the standard ops
// (docs/architecture.md, "Contrib ops").
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
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

// onnxruntime's channel-blocked layout, the ops of domain com.microsoft.nchwc that a session
// saves at ORT_ENABLE_ALL on an x86 CPU (its NchwcTransformer): a blocked value [N, C/b, H, W, b]
// is declared [N, C, H, W] with C rounded up to the block b. PyPTO reads each as the NCHW tensor
// of C channels (the padding channels are zeros, or what the element-wise ops make of zeros, and
// no real channel reads them), so the standard ops onnxruntime runs on blocked values unchanged
// (same-shape Add/Mul/Sum, activations, Concat of whole blocks, a Reshape that splits the block
// off and back) mean the same here; the convolutions' reordered filters are put back in OIHW
// order at import.

// A com.microsoft.nchwc Conv's filter dims 0 and 1 and its group.
struct NchwcConvShape {
  int64_t out = 0, in = 0, group = 1;
};

// The channel block b that the file's NCHWc convs were reordered for: 16 (AVX-512) or 8 (AVX2),
// the one their filters fit. Where both fit (every channel count a multiple of 16), the one
// onnxruntime would use on this CPU, unless PTO_NCHWC_BLOCK says which (8 or 16; an error when
// the filters do not fit it).
int64_t nchwc_block_size(const std::vector<NchwcConvShape>& convs, const std::string& where);

// Whether op `op` of `domain` is one expand_nchwc_op reads.
bool is_nchwc_op(const std::string& domain, const std::string& op);

// What the NCHWc ops of one graph share: the block, and each filter already put back in order.
struct NchwcState {
  int64_t block = 0;
  std::unordered_map<ValueId, ValueId> filters;
};

// Appends the standard nodes of NCHWc op `op` (as expand_contrib_op does): ReorderInput and
// ReorderOutput pad and slice the channels (and transpose NHWC), Conv is Conv + Sum + activation
// on the filter in OIHW order, the pools and Upsample are MaxPool, AveragePool, GlobalMaxPool,
// GlobalAveragePool and Resize.
void expand_nchwc_op(Graph& g, NchwcState& state, const std::string& op,
                     const std::vector<ValueId>& inputs, const std::vector<ValueId>& outputs,
                     const Attributes& attrs, const std::string& name, const std::string& where);

}  // namespace pto::onnx
