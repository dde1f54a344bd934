// Compiled control flow: the plan step of an If, Loop or Scan node. Each subgraph is compiled once,
// with the enclosing model's options, into an Executable of its own (passes, fusion, backends,
// memory plan), and the step runs the node's semantics (reference::run_control_flow) with every
// branch or iteration on that Executable. The runtime builds it, not a backend: a backend runs
// kernels on buffers, while a subgraph needs a plan, an arena and backends of its own.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pto/backend.h"
#include "pto/executable.h"

namespace pto {

// CompileOptions::tiles less the pins that name a kernel of a control-flow node's subgraph
// ("node/attribute/...", unless a node or value of `g` itself has that name): the pins of `g`'s
// own kernels. The subgraphs' compiles take theirs, the prefix stripped.
std::map<std::string, std::vector<int64_t>> own_tiles(
    const std::map<std::string, std::vector<int64_t>>& tiles, const Graph& g);

class ControlFlowKernel final : public CompiledKernel {
 public:
  // The kernel of `group`, a single control-flow node of `g`, with its subgraphs compiled with
  // `options`; nullptr for any other group, or when a subgraph does not compile (the node then
  // runs on the reference backend, its subgraphs on the interpreter).
  static std::unique_ptr<ControlFlowKernel> compile(const Graph& g, const KernelGroup& group,
                                                    const CompileOptions& options);

  std::vector<Tensor> run(const std::vector<Tensor>& inputs) const override;
  // Adds the subgraphs' kernels and memory to the enclosing model's stats (ExecutableStats).
  void add_stats(ExecutableStats& s) const;
  std::string describe() const override;

  // The compiled subgraphs by attribute name, in attribute order.
  const std::vector<std::pair<std::string, Executable>>& subgraphs() const { return subgraphs_; }

 private:
  ControlFlowKernel(const Node& n, const KernelGroup& group,
                    std::vector<std::pair<std::string, Executable>> subgraphs);

  const Node& node_;  // in the enclosing Executable's graph, which outlives its kernels
  std::vector<int> slots_;
  std::vector<std::pair<std::string, Executable>> subgraphs_;
  // Where the node's own tensors (slices, stacked scan outputs) come from: not the enclosing
  // step's arena slots, which the plan sized for the node's outputs only.
  std::shared_ptr<MemoryPool> pool_ = executable_memory_pool();
};

}  // namespace pto
