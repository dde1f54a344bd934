// The Kernel Graph (level 2 of DESIGN.md): the Tensor Graph partitioned into kernels. Each kernel
// is a group of nodes that runs as one compiled kernel, reading its inputs from memory once and
// writing only its outputs; values inside a group never reach memory.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "pto/graph.h"

namespace pto {

// Tuning knobs of one kernel (docs/tuning.md "Knobs"): name -> integers, e.g. "gemm.blocks" ->
// {kc, mc, nc}. Absent knobs are the planner's choice.
using Knobs = std::map<std::string, std::vector<int64_t>>;

struct KernelGroup {
  std::vector<int32_t> nodes;    // indices into the graph's nodes, in topological order
  std::string rule;              // the fusion rule that formed it; "" for a single node
  std::vector<ValueId> inputs;   // values read from outside the group, in first-use order
  std::vector<ValueId> outputs;  // values the group produces that are read outside it
  int32_t anchor = -1;           // the heavy node (Conv, MatMul) a group is built around, or -1
  // A tile shape pinned for it ({rows, cols} or {cols}; CompileOptions::tiles, src/tile/
  // tile_planner.h); empty: the tiling planner chooses.
  std::vector<int64_t> tile;
  // Other knobs pinned for it (the autotuner's winners, from the tuning cache); the kernel
  // validates them when compiled (ValueError naming the kernel). The tile is `tile`, not a knob.
  Knobs knobs;

  int32_t last_node() const { return nodes.back(); }
};

struct KernelGraph {
  std::vector<KernelGroup> kernels;  // in an order that respects every dependency
};

// What a profile or the tuner calls a kernel: its fusion rule, else the op of its first node that
// computes (a Conv with the Reshape views absorbed after it is "Conv"), else its last node's op.
std::string kernel_label(const Graph& g, const KernelGroup& k);

class ReaderIndex;  // pto/reader_index.h

// Node n as a kernel of its own: its inputs, and every output it defines (a lone node's kernel
// produces them all, read or not).
KernelGroup single_node_group(const Graph& g, int32_t n);

// One group per node: what levels 0 and 1 run.
KernelGraph single_node_kernels(const Graph& g);

// Fills inputs and outputs of a group whose `nodes` are set (outputs: values used by a node
// outside the group, or graph outputs). With the graph's `readers` it costs the group's size;
// without, it builds them (the graph's size): callers finishing many groups pass one index.
void finish_group(const Graph& g, KernelGroup& group, const ReaderIndex* readers = nullptr);

// Puts the kernels in an order that respects every dependency between them (a kernel runs after
// every kernel whose outputs it reads), preferring the order of their last nodes. Ordering by last
// node alone is not enough: a group may span nodes on both sides of another group that reads one
// of its early values. Returns false, changing nothing, when the kernels depend on each other in
// a cycle.
bool order_kernels(const Graph& g, KernelGraph& kg);

// "k3 ConvAddRelu [conv1, add1, relu1] (x, w, b, r) -> (y)": one line a kernel.
std::string print(const Graph& g, const KernelGraph& kg);

}  // namespace pto

namespace pto {

struct FusionOptions {
  // Whether an elementwise node may join a fused elementwise kernel (the tile ISA can express
  // it); empty: no elementwise fusion.
  std::function<bool(const Graph&, int32_t node)> elementwise_fusible;
  // Whether a MatMul/Gemm/Conv group (group.anchor) with an elementwise chain after it can run the
  // chain as its epilogue, or a norm (group.anchor) with its Casts can run on its own kernel (a
  // backend supports it); empty: only the bias/residual/activation epilogue.
  std::function<bool(const Graph&, const KernelGroup&)> epilogue_fusible;
};

// FuseKernels (level 2, src/fusion): partitions `g` into kernels by the fusion rules: a Conv,
// Gemm or MatMul with its epilogue (bias, residual add, activation), maximal convex groups of
// elementwise nodes of one output shape, and a norm with the Casts around it. Every other node is
// a kernel of its own. PTO_LOG=info
// reports which rules fired.
KernelGraph fuse_kernels(const Graph& g, const FusionOptions& options = {});

}  // namespace pto
