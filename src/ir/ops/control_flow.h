// Control flow (If, Loop, Scan): how a node's inputs and outputs split into the ONNX roles, shared
// by type inference (control_flow.cpp), the verifier, the reference kernels and the ONNX exporter.
// A node's last num_captures inputs are the outer values its subgraphs read; each subgraph lists
// the same values as its last inputs (Graph::num_captures).
#pragma once

#include <vector>

#include "pto/graph.h"

namespace pto::control_flow {

// The node's subgraphs (its graph attributes), in attribute order; empty for other nodes.
std::vector<const Graph*> subgraphs(const Node& n);

// How many of the node's inputs, the last ones, are captures (0 for a node without subgraphs).
int num_captures(const Node& n);

// Loop: [M, cond, v_initial (N)..., captures] -> outputs [v_final (N)..., scan outputs (K)].
// Scan (opset 9+): [states (N)..., scan inputs (M)..., captures] -> [states (N)..., scan
// outputs (K)]; opset 8 has sequence_lens first and a batch axis.
struct Arity {
  size_t carried = 0;       // N: loop-carried values or Scan states
  size_t scan_inputs = 0;   // Scan's M
  size_t scan_outputs = 0;  // K
};
Arity loop_arity(const Node& n);
Arity scan_arity(const Node& n);

// Checks a control-flow node's subgraphs against the node: each subgraph verifies, all of them
// have the same number of captures, the node passes its captures last, and the subgraph's
// inputs and outputs match the op's arity. Throws ValueError naming the node.
void verify_subgraphs(const Node& n);

// Scan's axes and directions, normalized: scan input i is sliced along in_axes[i] (reversed when
// in_reverse[i]); scan output j is stacked along out_axes[j] (of the stacked rank out_ranks[j];
// left as written, possibly negative, where that rank is given as -1: not known yet).
struct ScanAxes {
  std::vector<int64_t> in_axes, out_axes;
  std::vector<bool> in_reverse, out_reverse;
};
ScanAxes scan_axes(const Node& n, const std::vector<int64_t>& in_ranks,
                   const std::vector<int64_t>& out_ranks);

}  // namespace pto::control_flow
