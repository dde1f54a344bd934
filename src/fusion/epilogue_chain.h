// The epilogue of a heavy node: what follows a Conv (or ConvTranspose), Gemm or MatMul along a
// chain of single-use values and can be applied to each output tile while it is still in cache,
//
//   y = store(act(anchor(x, w) + bias + residual))
//
// in that order, each part optional (store: a Cast to bf16 or f16). The fusion pass builds groups
// from it and a backend reads the roles back from a group, so both agree on what a group means.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "pto/graph.h"
#include "pto/reader_index.h"

namespace pto::fusion {

struct EpilogueChain {
  int32_t anchor = -1;         // Conv, ConvTranspose, Gemm or MatMul
  std::vector<int32_t> nodes;  // anchor first, then the epilogue nodes in order
  // View nodes (Reshape, Flatten, Squeeze, Unsqueeze) on the way, for a Gemm or MatMul: they keep
  // the product's rows of N and change only the shape the rest of the chain sees.
  std::vector<int32_t> views;
  ValueId bias = kNoValue;      // constant added per output channel (Conv) or column (MatMul)
  ValueId residual = kNoValue;  // tensor of the output's shape added before the activation
  std::string activation;       // "", or an op name: "Relu", "Clip", ..., "Silu"
  double lo = 0, hi = 0;        // Clip bounds, LeakyRelu slope (lo)
  // A trailing Cast to bf16 or f16 (Gemm, MatMul; StoreHalfOperands): the result is stored in
  // that type, rounded from the float epilogue's value.
  DType store = DType::kF32;
  ValueId result = kNoValue;  // the value the chain produces
  // The rule's name: "Conv+Bias+Add+Relu" (anchor op, then the parts present).
  std::string rule(const Graph& g) const;
};

// The longest epilogue chain starting at node `anchor` (whose op must be Conv, ConvTranspose, Gemm
// or MatMul with float32 output), or nullopt when nothing follows it that can be fused. `readers`
// is the graph's.
std::optional<EpilogueChain> match_epilogue(const Graph& g, int32_t anchor,
                                            const ReaderIndex& readers);

// Reads a group formed from match_epilogue back into its roles (nullopt when it is not one).
std::optional<EpilogueChain> epilogue_of_group(const Graph& g, const std::vector<int32_t>& nodes);

}  // namespace pto::fusion
