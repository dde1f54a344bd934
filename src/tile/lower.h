// Lowering of kernel groups (include/pto/kernel_graph.h) to tile programs (tile_program.h).
#pragma once

#include <optional>
#include <string>

#include "pto/kernel_graph.h"
#include "tile/tile_program.h"

namespace pto {

// A group of elementwise/broadcast nodes on float32 (and boolean) values, static or symbolic
// shapes, as one tile program; row reductions over the index space's last axis (ReduceSum/Mean/
// Max/Min with keepdims, Softmax, LogSoftmax) may be among them: inputs are group.inputs in
// first-use order minus the scalar float32 initializers (inlined as immediates), outputs are
// group.outputs in order; the index space is the common shape of the outputs. Returns nullopt and
// sets *why_not (when given) if some node has no tile form, a value has another dtype or an unknown
// shape, or the outputs' shapes differ.
std::optional<TileProgram> lower_elementwise(const Graph& g, const KernelGroup& group,
                                             std::string* why_not = nullptr);

// The elementwise chain after a heavy node (group.anchor, MatMul/Conv/Gemm) as a GEMM/conv
// epilogue: program input 0 is `accumulator` (the anchor's output, the C block), the other inputs
// are the chain's other operands, and the single output (of the accumulator's shape) is written
// back over C. Every node of the group but the one producing `accumulator` must be elementwise;
// the accumulator must not itself be read outside the group.
std::optional<TileProgram> lower_epilogue(const Graph& g, const KernelGroup& group,
                                          ValueId accumulator, std::string* why_not = nullptr);

}  // namespace pto
