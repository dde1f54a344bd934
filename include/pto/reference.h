// The reference interpreter: executes a Tensor Graph op by op with plain, obviously-correct
// loops. It is the oracle every pass, kernel and backend is tested against.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pto/backend.h"
#include "pto/graph.h"
#include "pto/registry.h"

namespace pto::reference {

// What a reference kernel sees. Inputs are contiguous; a missing optional input is undefined.
struct KernelContext {
  const Node& node;
  std::vector<Tensor> inputs;
  size_t num_outputs;

  const Attributes& attrs() const { return node.attrs; }
  std::string where() const { return node.where(); }
  bool has_input(size_t i) const { return i < inputs.size() && inputs[i].defined(); }
  const Tensor& input(size_t i) const;  // throws ValueError when missing
};

// Returns the node's outputs (as many as num_outputs; an unused optional output may be undefined).
using Kernel = std::function<std::vector<Tensor>(const KernelContext&)>;

class KernelRegistry {
 public:
  static KernelRegistry& global();            // every built-in kernel, registered on first use
  void add(const std::string& op, Kernel k);  // a second kernel for an op is an InternalError
  const Kernel* find(std::string_view op) const { return kernels_.find(op); }
  // The kernel of n.op, by the id of its OpDef (one index, no hashing): what the interpreter asks
  // for every node it runs. The same answer as find(n.op).
  const Kernel* find(const Node& n) const;
  std::vector<std::string> names() const { return kernels_.names(); }  // sorted

 private:
  Registry<Kernel> kernels_{"reference kernel"};
  std::vector<int32_t> by_op_id_;  // OpDef id -> index into kernels_, -1 for none
};

// Called after each node with its outputs; `pto check` and tests use it to see every value.
using NodeObserver = std::function<void(const Node&, const std::vector<Tensor>& outputs)>;

// One step of an interpreter loop, shared by run() below and the Executable: fills ctx.inputs from
// `env` (made contiguous), calls `kernel` (which reads ctx), checks that every output the node
// names was produced, stores the outputs in `env` and shows them to `observer`. Errors name the
// node; out-of-memory becomes a ValueError.
void run_node(const Graph& g, KernelContext& ctx, std::vector<Tensor>& env,
              const std::function<std::vector<Tensor>()>& kernel, const NodeObserver& observer);

// A sequence or an empty optional among the values a node of an op without kNonTensorValues is
// about to read: UnsupportedError naming the node (the runtime twin of check_tensor_values(g, n)).
void check_tensor_values(const Node& n, const std::vector<Tensor>& values);

// Checks each input's dtype, rank and known or symbolic dimensions against the graph's declaration
// (ValueError/TypeError naming the input); the input count must already match.
void check_inputs(const Graph& g, const std::vector<Tensor>& inputs);

// Runs `g` on `inputs` (one per graph input, in order). Checks each input's dtype, rank and
// known or symbolic dimensions against the graph's declaration (ValueError naming the input).
std::vector<Tensor> run(const Graph& g, const std::vector<Tensor>& inputs,
                        const NodeObserver& observer = {});

// Runs one subgraph of a control-flow node, named by its attribute ("then_branch", "body"), on
// the subgraph's inputs (the captures last).
using SubgraphRunner =
    std::function<std::vector<Tensor>(const std::string& attr, const std::vector<Tensor>& inputs)>;

// Control flow (If, Loop, Scan) on the node's inputs, each subgraph run by `run_sub`: the
// reference kernels pass the interpreter, the Executable its compiled subgraphs (src/runtime),
// so both share one reading of the ONNX semantics (cond, trip counts, scan axes, stacking).
std::vector<Tensor> run_control_flow(const Node& n, std::vector<Tensor> inputs,
                                     const SubgraphRunner& run_sub);

// The reference interpreter as a backend (pto/backend.h): single nodes only.
std::unique_ptr<Backend> make_backend();

// Kernel families (src/reference/ops/*.cpp) register themselves through these.
void register_elementwise_kernels(KernelRegistry& r);
void register_nn_kernels(KernelRegistry& r);
void register_tensor_kernels(KernelRegistry& r);
void register_reduction_kernels(KernelRegistry& r);
void register_indexing_kernels(KernelRegistry& r);
void register_attention_kernels(KernelRegistry& r);
void register_quantization_kernels(KernelRegistry& r);
void register_loss_kernels(KernelRegistry& r);
void register_image_kernels(KernelRegistry& r);
void register_signal_kernels(KernelRegistry& r);
void register_recurrent_kernels(KernelRegistry& r);
void register_control_flow_kernels(KernelRegistry& r);
void register_sequence_kernels(KernelRegistry& r);
void register_ml_kernels(KernelRegistry& r);  // ai.onnx.ml (ml.cpp, ml_trees.cpp)

}  // namespace pto::reference
