// The Casts around a node that its own kernel can take: a norm or softmax reading a value widened
// from bf16/f16 by a Cast, and/or whose result a Cast narrows to bf16/f16,
//
//   x16 -> Cast(to=float) -> LayerNormalization -> Cast(to=bfloat16) -> y16
//
// run as one kernel that reads x16, computes in float32 and stores y16 (rule
// "Cast+LayerNormalization+Cast"; norm.cpp, Kernel::takes_casts). The fusion pass builds groups
// from it and a backend reads the roles back from a group, as for fusion/epilogue_chain.h.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "pto/graph.h"
#include "pto/reader_index.h"

namespace pto::fusion {

struct NodeCasts {
  int32_t node = -1;
  int32_t widen = -1;         // the Cast making the node's input 0 from bf16/f16, or -1
  int32_t narrow = -1;        // the Cast of the node's output 0 to bf16/f16, or -1
  ValueId input = kNoValue;   // what the kernel reads as input 0: the widening Cast's input
  DType store = DType::kF32;  // the type the kernel stores its output in
  std::vector<int32_t> nodes() const;      // ascending
  std::string rule(const Graph& g) const;  // "Cast+Softmax", "LayerNormalization+Cast", ...
};

// The Casts around `node` (not elementwise, every output but output 0 absent) its kernel could
// take: a widening Cast read only by its input 0, a narrowing Cast that is the only reader of its
// output 0; nullopt when there is neither. `readers` is the graph's.
std::optional<NodeCasts> match_casts(const Graph& g, int32_t node, const ReaderIndex& readers);

// The type `n` stores in when it is a Cast of a float32 value to bf16 or f16, else nullopt.
std::optional<DType> narrows_to_half(const Graph& g, const Node& n);

// Reads a group formed from match_casts back into its roles (nullopt when it is not one).
std::optional<NodeCasts> casts_of_group(const Graph& g, const std::vector<int32_t>& nodes,
                                        int32_t anchor);

}  // namespace pto::fusion
