// The reference interpreter as a backend: one node per kernel, on the plain loops of
// src/reference/ops. Asked last, so it runs exactly what no other backend takes.
#include "pto/backend.h"
#include "pto/reference.h"

namespace pto::reference {
namespace {

class NodeKernel : public CompiledKernel {
 public:
  NodeKernel(const Node& n, const KernelGroup& group, const Kernel* k)
      : node_(n), kernel_(k), slots_(node_input_slots(n, group)) {}

  std::vector<Tensor> run(const std::vector<Tensor>& inputs) const override {
    KernelContext ctx{node_, gather_node_inputs(slots_, inputs), node_.outputs.size()};
    return outputs_of(ctx);
  }
  std::vector<Tensor> run_taking(std::vector<Tensor>& inputs) const override {
    if (!reads_in_order(slots_, inputs.size())) return run(inputs);
    KernelContext ctx{node_, std::move(inputs), node_.outputs.size()};
    try {
      std::vector<Tensor> out = outputs_of(ctx);
      inputs = std::move(ctx.inputs);
      return out;
    } catch (...) {
      inputs = std::move(ctx.inputs);
      throw;
    }
  }

 private:
  std::vector<Tensor> outputs_of(const KernelContext& ctx) const {
    check_tensor_values(node_, ctx.inputs);
    std::vector<Tensor> all = (*kernel_)(ctx);
    std::vector<Tensor> out;
    for (size_t o = 0; o < node_.outputs.size(); ++o)
      if (node_.outputs[o] != kNoValue) out.push_back(o < all.size() ? all[o] : Tensor());
    return out;
  }

  const Node& node_;
  const Kernel* kernel_;
  std::vector<int> slots_;
};

class ReferenceBackend : public Backend {
 public:
  std::string name() const override { return "reference"; }
  Device device() const override { return {}; }
  bool supports(const Graph& g, const KernelGroup& group) const override {
    return group.nodes.size() == 1 &&
           KernelRegistry::global().find(g.nodes()[group.nodes[0]]) != nullptr;
  }
  std::unique_ptr<CompiledKernel> compile(const Graph& g, const KernelGroup& group) const override {
    const Node& n = g.nodes()[group.nodes[0]];
    return std::make_unique<NodeKernel>(n, group, KernelRegistry::global().find(n));
  }
};

}  // namespace

std::unique_ptr<Backend> make_backend() {
  return std::make_unique<ReferenceBackend>();
}

}  // namespace pto::reference
