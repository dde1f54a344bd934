// A norm whose input is a sum: Adds feeding the input of a LayerNormalization or RMSNormalization,
//
//   x = (a + b) + c -> LayerNormalization(x, scale, bias) -> y
//
// (a decomposed SkipLayerNormalization, BERT's embedding sum, a residual Add no GEMM epilogue
// took). The norm's kernel computes each row's sum while it loads the row, in the graph's order
// of additions, and writes any of the sums the graph reads elsewhere in the same pass (rule
// "Add+LayerNormalization"; norm.cpp, Kernel::takes_sums). The fusion pass names an elementwise
// group that is exactly this so, and a backend reads the roles back from the group.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "pto/graph.h"

namespace pto::fusion {

struct SumNorm {
  int32_t norm = -1;  // the LayerNormalization or RMSNormalization node
  // Each Add in node order: its two terms, >= 0 an index into `operands`, < 0 the result of
  // adds[-1 - t]. The last Add makes the norm's input 0.
  struct Add {
    int32_t node = -1;
    int lhs = 0, rhs = 0;
  };
  std::vector<Add> adds;
  std::vector<ValueId> operands;  // the values summed, read from outside the group
  // The Cast storing the norm's output in bf16 or f16 (its only reader), or -1; `store` its type.
  int32_t narrow = -1;
  DType store = DType::kF32;
  // "Add+LayerNormalization", "Add+RMSNormalization", "Add+LayerNormalization+Cast", ...
  std::string rule(const Graph& g) const;
};

// The group `nodes` (ascending) read as a SumNorm, or nullopt: one LayerNormalization (with only
// output Y) or RMSNormalization, last or followed by a Cast of Y to bf16 or f16 that is Y's only
// reader, and before it only Adds (two inputs, one output), the last of which makes the norm's
// input 0; no Add's result is the norm's Scale or B. (An Add whose result only leaves the group
// is computed with the others; the kernel writes it out.)
std::optional<SumNorm> sum_norm_of_group(const Graph& g, const std::vector<int32_t>& nodes);

// Whether `rule` is one sum_norm_of_group's groups are named by.
bool is_sum_norm_rule(const std::string& rule);

}  // namespace pto::fusion
