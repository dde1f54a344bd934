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

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pto/graph.h"
#include "pto/kernel_graph.h"
#include "pto/passes.h"
#include "pto/reference.h"
#include "pto/runtime.h"

namespace pto {

// compile()'s decisions made before any backend sees the graph: the kernel groups fusion formed,
// in dependency order before stages reorder them, and per group the view nodes that joined it
// ahead of its kernel (leading) or after it (trailing). A saved model stores them with the
// optimized graph (pto/serialize.h), so loading runs no pass and no fusion.
struct KernelPartition {
  KernelGraph kernels;
  std::vector<std::vector<int32_t>> leading, trailing;  // node indices, one list per kernel
};

// Reported as compiling advances (a progress bar, pto compile --graph-after): after each graph
// pass with the graph it left (`graph` set), then after each kernel a backend compiled.
struct CompileProgress {
  const char* stage;  // "pass" or "kernel"
  std::string name;   // the pass, or the kernel's rule or op
  size_t done = 0, total = 0;
  const Graph* graph = nullptr;  // the graph after the pass ("pass" only)
};

struct CompileOptions {
  int level = 2;                    // 0..3: op by op, + clean-up, + fusion, + layout changes
  bool memory_optimization = true;  // level >= 2: plan intermediates into one reused arena
  // Drop the graph's copy of weights that kernels hold packed (GEMM panels), so they are not in
  // memory twice; graph_with_weights() gives them back. Frees memory when the caller holds no
  // other reference to the weights (an ONNX model loaded for compile, BatchNorm-folded weights).
  bool release_packed_weights = true;
  // Level >= 2: independent steps too small to fill the machine run at the same time, one per
  // thread (stages; results are bit for bit those of running them one after another).
  bool concurrent_kernels = true;
  // Matrix products (MatMul, Gemm) in `mixed_precision` (bf16 or f16 operands) with fp32
  // accumulation, everything else in fp32 (the AutoMixedPrecision pass). bf16: VDPBF16PS where
  // the CPU has AVX512_BF16, else the same rounding on the fp32 kernels; f16: operands rounded to
  // fp16 (F16C) on the fp32 kernels. Convolutions stay fp32.
  bool auto_mixed_precision = false;
  DType mixed_precision = DType::kBF16;
  // Float32 MatMul/Gemm not marked by auto_mixed_precision: "highest" (fp32), "high" (bf16x3 on
  // AMX tiles) or "medium" (bf16), as torch.set_float32_matmul_precision (PassOptions).
  std::string matmul_precision = "highest";
  // Float32 Conv the same (not depthwise ones), as torch.backends.mkldnn.conv.fp32_precision:
  // "highest" (its "ieee"), "high" ("tf32": bf16x3 on AMX tiles), "medium" ("bf16").
  std::string conv_precision = "highest";
  std::vector<std::string> dump_after;  // passes after which the graph is printed (PTO_DUMP_AFTER)
  // Tile shapes pinned for tile kernels instead of the planner's ({rows, cols} of the output
  // merged to 2-D, or {cols}): kernel name -> shape, where a kernel is named by any of its nodes
  // or its first output, and "*" names every tile kernel (a named one wins). A kernel of a
  // control-flow node's compiled subgraph is named by its path, "node/attribute/name"
  // ("loop_0/body/y", "loop_0/body/*" for all of that subgraph's; node_backends() spells them).
  // A name that matches no tile kernel, a bad shape, or one whose working set does not fit L1 is
  // a ValueError.
  std::map<std::string, std::vector<int64_t>> tiles;
  // The autotuner's winners (docs/tuning.md): each kernel without a pinned tile takes the knobs
  // the tuning cache holds for its signature and this thread count (stale ones are ignored).
  // False, or PTO_TUNE_CACHE=off without a tune_cache_path: the planner's choices only.
  bool use_tune_cache = true;
  // A control-flow subgraph whose inputs have dimensions unknown at compile time is compiled
  // again at run time for each concrete input-shape signature it meets (a few per node), so its
  // shape arithmetic folds and every op gets its kernel (docs/architecture.md, "Compiled control
  // flow"); false: the compile made with the unknown dims runs every shape. Not saved with a
  // model (pto::save): a loaded model takes the default.
  bool specialize_subgraphs = true;
  std::string tune_cache_path;  // "": $PTO_TUNE_CACHE or the default file (tune_cache.h)
  // Called as compiling advances; empty: nothing is reported.
  std::function<void(const CompileProgress&)> on_progress;
};

// What one step of the plan is: one kernel covering a list of nodes.
struct StepInfo {
  std::string backend;         // "cpu", "reference"
  std::string rule;            // the fusion rule ("Conv+Bias+Relu"), "" for a single node
  std::vector<int32_t> nodes;  // indices into graph().nodes()
  std::vector<ValueId> inputs, outputs;
};

// What compile() made, for people and tools (pto compile --stats, fast.stats()).
struct ExecutableStats {
  size_t nodes_in = 0;               // nodes of the graph given to compile()
  size_t nodes = 0;                  // after the graph passes
  size_t kernels = 0;                // plan steps
  size_t fused_kernels = 0;          // steps covering more than one node
  size_t peak_bytes = 0;             // the planned arena: peak intermediate memory with the plan
  size_t unplanned_peak_bytes = 0;   // every intermediate in its own buffer (no plan)
  size_t live_peak_bytes = 0;        // the most intermediate bytes live at once (lower bound)
  size_t unplanned_values = 0;       // intermediates the plan left to the pool
  bool memory_planned = false;       // false before the first run of a graph with symbolic dims
  size_t weight_bytes = 0;           // the graph's constants (initializers) still held
  size_t packed_weight_bytes = 0;    // kernels' compile-time copies of them (packed GEMM panels)
  size_t released_weight_bytes = 0;  // constants dropped because a kernel holds them packed
  size_t stages = 0;                 // groups of steps that run at the same time (more than one)
  size_t staged_kernels = 0;         // steps in them
  size_t tuned_kernels = 0;          // steps whose knobs came from the tuning cache
  // The compiled subgraphs of control-flow nodes, recursively: their steps (not counted in
  // `kernels`), and the most arena memory they plan at once (one subgraph of a node runs at a
  // time, with its own subgraphs'). packed_weight_bytes and tuned_kernels include their kernels.
  size_t subgraph_kernels = 0;
  size_t subgraph_fused_kernels = 0;
  size_t subgraph_peak_bytes = 0;
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
  // The same, calling `observer` after each step with every value the step made (its kernel's
  // outputs, by id in graph()), in execution order: values inside a fused kernel are never
  // materialized and are not shown. `pto check` and pypto.debug compare them with a reference.
  using ValueObserver = std::function<void(ValueId, const Tensor&)>;
  std::vector<Tensor> run_observing_values(const std::vector<Tensor>& inputs,
                                           const ValueObserver& observer) const;
  // run() writing graph output k into outputs[k] where defined (a view the caller owns, e.g. a
  // step's slice of a Scan's stacked output, overlapping no input): the kernel making it writes
  // there when it can, else it is copied in; the result holds outputs[k] itself. An output whose
  // dtype or shape is not outputs[k]'s, or a non-contiguous outputs[k], comes back as from run(),
  // outputs[k] untouched. `outputs` is empty or one entry per graph output (else a ValueError).
  std::vector<Tensor> run_into(const std::vector<Tensor>& inputs,
                               const std::vector<Tensor>& outputs) const;

  // The graph it runs: the one given to compile() after the passes of its level. Weights that
  // kernels hold packed are released there (Graph::is_released; CompileOptions).
  const Graph& graph() const { return *graph_; }
  // graph() with the released weights rebuilt from their packed copies: a complete graph, to
  // print, export or compile again.
  Graph graph_with_weights() const;
  const CompileOptions& options() const { return options_; }
  // For node i of graph(): the backend of the step that runs it ("cpu", "reference").
  const std::string& node_backend(size_t i) const;
  // For node i of graph(), a control-flow node: its subgraphs as compiled (attribute name, the
  // Executable that runs each branch or iteration), in attribute order: where the subgraph's
  // input shapes were unknown at compile time, the one specialized for the shapes of the node's
  // last run (CompileOptions::specialize_subgraphs), else the compile made at compile time.
  // Empty for other nodes, and for a control-flow node left to the reference backend (a
  // subgraph did not compile).
  std::vector<std::pair<std::string, const Executable*>> subgraphs(size_t i) const;
  // (op, backend) for every node of graph(), in order; a control-flow node is followed by the
  // nodes of its compiled subgraphs, as ("node/attribute/op", backend), recursively
  // ("loop_0/body/MatMul", "cpu"; "loop_0/body/if_1/then_branch/Add", "cpu").
  std::vector<std::pair<std::string, std::string>> node_backends() const;
  size_t num_steps() const;
  size_t step_of_node(size_t i) const;  // the step that runs node i of graph()
  const StepInfo& step(size_t i) const;
  // The kernel of step i as its backend describes it (a tile program), or "".
  std::string describe_step(size_t i) const;
  // What step i's kernel computes (the step less its leading and trailing views), with the tile
  // and knobs it was compiled with: the autotuner compiles variants of it.
  const KernelGroup& step_group(size_t i) const;
  const std::vector<PassReport>& pass_report() const;
  // The kernel groups as fusion formed them (what a saved model stores; KernelPartition).
  const KernelPartition& partition() const;
  // Kernel count and memory; the memory plan of `input_shapes` when given, else of the last run
  // (or of the static shapes).
  ExecutableStats stats() const;
  ExecutableStats stats(const std::vector<Dims>& input_shapes) const;
  // The pool every run allocates from (stats show whether steady state reuses everything).
  MemoryPoolStats memory_stats() const;

  struct Plan;  // per-node kernels and prepared state (src/runtime/executable.cpp)

 private:
  friend Executable compile(Graph g, const CompileOptions& options);
  std::vector<Tensor> run_impl(const std::vector<Tensor>& inputs,
                               const reference::NodeObserver& node_observer,
                               const ValueObserver& value_observer,
                               const std::vector<Tensor>& destinations = {}) const;
  // run_impl without the prefix of graph().source on its errors.
  std::vector<Tensor> run_steps(const std::vector<Tensor>& inputs,
                                const reference::NodeObserver& node_observer,
                                const ValueObserver& value_observer,
                                const std::vector<Tensor>& destinations) const;
  friend Executable compile_partitioned(Graph g, KernelPartition partition,
                                        const CompileOptions& options,
                                        std::vector<PassReport> passes, size_t nodes_in);
  Executable(std::shared_ptr<const Graph> g, CompileOptions options, std::shared_ptr<Plan> plan);

  std::shared_ptr<const Graph> graph_;
  CompileOptions options_;
  std::shared_ptr<Plan> plan_;
};

// Verifies `g`, infers its types and prepares it for execution. Throws ValueError for an invalid
// level or graph, UnsupportedError for an op or option PyPTO cannot run.
Executable compile(Graph g, const CompileOptions& options = {});

// The second half of compile(), for a graph that has already been through the passes of
// options.level and its partition into kernels (loading a saved model): stages, each kernel from
// its backend (weights packed again), liveness. No pass and no fusion runs. `passes` and
// `nodes_in` are what the first compile reported (pass_report(), stats().nodes_in). Throws
// ValueError when the partition does not fit the graph.
Executable compile_partitioned(Graph g, KernelPartition partition, const CompileOptions& options,
                               std::vector<PassReport> passes = {}, size_t nodes_in = 0);

}  // namespace pto
