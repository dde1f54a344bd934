// Liveness of the values of a graph run as a sequence of steps (one per kernel of a Kernel
// Graph; one per node for the reference interpreter). The one analysis the interpreter, the
// Executable and the memory planner share.
#pragma once

#include <climits>
#include <vector>

#include "pto/kernel_graph.h"

namespace pto {

struct Liveness {
  static constexpr int32_t kForever = INT32_MAX;  // graph outputs (and what they are views of)
  std::vector<int32_t> def;       // step producing each value; -1 for inputs and initializers
  std::vector<int32_t> last_use;  // last step reading the value itself; -1 when never read
  // The value whose buffer a value may share: itself, or for an output of a kView op (an
  // output that may be a view of input 0), input 0's root.
  std::vector<ValueId> root;
  // For a root: the last step reading it or any view of it (kForever when a graph output is, or
  // is a view of, it). The planner may reuse its buffer after that step.
  std::vector<int32_t> buffer_end;
  // Values whose last reader is step s (never inputs, initializers or graph outputs): a runtime
  // drops its reference to them after step s.
  std::vector<std::vector<ValueId>> release_after;
};

Liveness analyze_liveness(const Graph& g, const KernelGraph& kg);

}  // namespace pto
