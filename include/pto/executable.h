// Compiling a Tensor Graph into something that runs, and running it (level 4 of DESIGN.md).
//
//   pto::Graph g = pto::onnx::load("model.onnx");
//   pto::Executable exe = pto::compile(g, {.level = 2});
//   std::vector<pto::Tensor> out = exe.run({input});
//
// The interface is the one the later levels fill in: passes, fusion, tiling and the CPU backend
// change what compile() builds, not how it is called. Until the CPU backend lands, run() executes
// the graph on the reference kernels.
#pragma once

#include <memory>
#include <vector>

#include "pto/graph.h"
#include "pto/reference.h"
#include "pto/runtime.h"

namespace pto {

struct CompileOptions {
  int level = 2;                      // 0..3: op by op, + clean-up, + fusion, + layout changes
  bool memory_optimization = true;    // reuse intermediate buffers as soon as they are dead
  bool auto_mixed_precision = false;  // bf16 compute with fp32 islands (not implemented yet)
};

class Executable {
 public:
  Executable(Executable&&) noexcept = default;
  Executable& operator=(Executable&&) noexcept = default;
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;
  ~Executable();

  // Runs on one tensor per graph input, in order. Checks count, dtypes, ranks, fixed dimensions,
  // that each symbolic dimension is consistent across inputs and inside its declared range
  // (ValueError/TypeError naming the input). Safe to call from several threads at once.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs) const;
  // The same, calling `observer` after each node with its outputs (debugging tools, tests).
  std::vector<Tensor> run(const std::vector<Tensor>& inputs,
                          const reference::NodeObserver& observer) const;

  const Graph& graph() const { return *graph_; }
  const CompileOptions& options() const { return options_; }
  // For node i of graph(): "cpu" when the CPU backend runs it, "reference" when it falls back.
  const std::string& node_backend(size_t i) const;
  // The pool every run allocates from (stats show whether steady state reuses everything).
  MemoryPoolStats memory_stats() const;

  struct Plan;  // per-node kernels and prepared state (src/runtime/executable.cpp)

 private:
  friend Executable compile(Graph g, const CompileOptions& options);
  Executable(std::shared_ptr<const Graph> g, CompileOptions options, std::shared_ptr<Plan> plan);

  std::shared_ptr<const Graph> graph_;
  CompileOptions options_;
  std::shared_ptr<Plan> plan_;
};

// Verifies `g`, infers its types and prepares it for execution. Throws ValueError for an invalid
// level or graph, UnsupportedError for an op or option PyPTO cannot run.
Executable compile(Graph g, const CompileOptions& options = {});

}  // namespace pto
