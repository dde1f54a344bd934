// Compiled control flow: the plan step of an If, Loop or Scan node. Each subgraph is compiled once,
// with the enclosing model's options, into an Executable of its own (passes, fusion, backends,
// memory plan), and the step runs the node's semantics (reference::run_control_flow) with every
// branch or iteration on that Executable. The runtime builds it, not a backend: a backend runs
// kernels on buffers, while a subgraph needs a plan, an arena and backends of its own.
//
// Shape specialization: a subgraph whose inputs have dimensions unknown at compile time (the
// enclosing model's symbolic dims, captured) is compiled once as it is (the generic compile) and
// again, at run time, for each concrete input-shape signature it meets (a few at most,
// CompileOptions::specialize_subgraphs): with the shapes known, the shape arithmetic folds, an
// If on a shape (Silero VAD's "squeeze the last dim if it is 1") is replaced by its branch, and
// ops after it get a known rank and their CPU kernels. The generic compile runs any other shape.
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
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

  // The compiled subgraphs by attribute name, in attribute order: each as specialized for the
  // input shapes of its last run, else (before any run, shapes not specialized) the generic one.
  std::vector<std::pair<std::string, const Executable*>> subgraphs() const;
  // How many input-shape specializations the node holds (each compiles all of its subgraphs
  // that take those inputs: both branches of an If).
  size_t num_specializations() const { return num_entries_.load(std::memory_order_acquire); }

  // The most input-shape signatures a node specializes its subgraphs for; later ones run the
  // generic compile (a Loop whose carried value grows meets a new shape every iteration).
  static constexpr size_t kMaxSpecializations = 4;

 private:
  struct Subgraph {
    std::string attr;
    Executable generic;
    // What was compiled (captured constants read in place) and with which options, kept to
    // compile it again for concrete shapes; null when its inputs are static or specializing is
    // off.
    std::shared_ptr<const Graph> source;
    CompileOptions options;
  };
  // The subgraphs compiled for one input-shape signature; a null slot runs the generic compile
  // (a subgraph that takes other inputs, or whose specialized compile failed).
  struct Specialization {
    std::vector<Dims> shapes;
    std::vector<std::unique_ptr<Executable>> exes;  // per subgraph
  };

  ControlFlowKernel(const Node& n, const KernelGroup& group, std::vector<Subgraph> subgraphs);
  // The Executable that runs subgraph k on these inputs, specializing it on a new signature.
  const Executable& pick(size_t k, const std::vector<Tensor>& inputs) const;

  const Node& node_;  // in the enclosing Executable's graph, which outlives its kernels
  std::vector<int> slots_;
  std::vector<Subgraph> subgraphs_;
  bool specializable_ = false;  // some subgraph has a source
  // Entries are only added (under mutex_), never moved or removed, so a run reads a published
  // one without the lock; last_ is the entry the latest run used (-1: the generic compile).
  mutable std::mutex mutex_;
  mutable std::array<std::unique_ptr<Specialization>, kMaxSpecializations> entries_;
  mutable std::atomic<size_t> num_entries_{0};
  mutable std::atomic<int> last_{-1};
  mutable bool full_logged_ = false;
  // Where the node's own tensors (slices, stacked scan outputs) come from: not the enclosing
  // step's arena slots, which the plan sized for the node's outputs only.
  std::shared_ptr<MemoryPool> pool_ = executable_memory_pool();
};

}  // namespace pto
