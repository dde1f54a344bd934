// The CPU backend: the execution contract (pto/backend.h) over the CPU kernels.
//
//   single node          the op's kernel from KernelRegistry, when its accepts() takes the node;
//                        its prepare() runs here, once (weights packed into GEMM panels);
//   Conv/Gemm/MatMul     the anchor's kernel with a FusedEpilogue: bias, residual and activation
//   + epilogue           applied to each output tile while it is in L1 (fusion/epilogue_chain.h).
#include <limits>

#include "backend/cpu/kernel.h"
#include "fusion/epilogue_chain.h"

namespace pto::cpu {
namespace {

NodeInfo node_info(const Graph& g, const Node& n) {
  NodeInfo info{n, {}, {}, {}};
  for (ValueId v : n.inputs) {
    info.inputs.push_back(v == kNoValue ? TensorType{} : g.value(v).type);
    info.constants.push_back(v == kNoValue ? nullptr : g.initializer(v));
  }
  for (ValueId v : n.outputs)
    info.outputs.push_back(v == kNoValue ? TensorType{} : g.value(v).type);
  return info;
}

// The kernel of `n` if the CPU has one that accepts it.
const Kernel* accepted(const Graph& g, const Node& n) {
  const Kernel* k = KernelRegistry::global().find(n.op);
  if (!k) return nullptr;
  return !k->accepts || k->accepts(node_info(g, n)) ? k : nullptr;
}

bool activation_from(const std::string& name, Activation& act) {
  static const std::pair<const char*, Activation> kActs[] = {
      {"", Activation::kNone},           {"Relu", Activation::kRelu},
      {"Clip", Activation::kClip},       {"LeakyRelu", Activation::kLeakyRelu},
      {"Sigmoid", Activation::kSigmoid}, {"Tanh", Activation::kTanh},
      {"Gelu", Activation::kGelu},       {"GeluTanh", Activation::kGeluTanh},
      {"Silu", Activation::kSilu},       {"HardSwish", Activation::kHardSwish}};
  for (const auto& [n, a] : kActs)
    if (name == n) {
      act = a;
      return true;
    }
  return false;
}

// One node on its CPU kernel. The group's inputs are the node's distinct inputs; `slots` maps
// each node input to its position there (-1 for a missing optional input).
class NodeKernel : public CompiledKernel {
 public:
  // `node` is the group's only node, or the anchor of a fused group.
  NodeKernel(const Graph& g, const KernelGroup& group, int32_t node, const Kernel* k)
      : node_(g.nodes()[node]), kernel_(k), slots_(node_input_slots(node_, group)) {
    if (k->prepare) state_ = k->prepare(node_info(g, node_));
  }

  std::vector<Tensor> run(const std::vector<Tensor>& inputs) const override {
    KernelContext ctx{{node_, gather_node_inputs(slots_, inputs), node_.outputs.size()}, &state_};
    return outputs_of(ctx);
  }

 protected:
  // Runs the kernel and keeps the outputs the node defines (the group's outputs).
  std::vector<Tensor> outputs_of(const KernelContext& ctx) const {
    std::vector<Tensor> all = kernel_->run(ctx);
    std::vector<Tensor> out;
    for (size_t o = 0; o < node_.outputs.size(); ++o)
      if (node_.outputs[o] != kNoValue) out.push_back(o < all.size() ? all[o] : Tensor());
    return out;
  }

  const Node& node_;
  const Kernel* kernel_;
  std::vector<int> slots_;
  std::any state_;
};

// A Conv, Gemm or MatMul with its epilogue.
class EpilogueKernel : public NodeKernel {
 public:
  EpilogueKernel(const Graph& g, const KernelGroup& group, const fusion::EpilogueChain& chain,
                 const Kernel* k)
      : NodeKernel(g, group, chain.anchor, k) {
    for (size_t i = 0; i < group.inputs.size(); ++i)
      if (group.inputs[i] == chain.residual) residual_slot_ = static_cast<int>(i);
    if (chain.bias != kNoValue) {
      const Tensor& b = *g.initializer(chain.bias);
      epilogue_.bias = b.reshape({b.numel()});
    }
    PTO_CHECK(activation_from(chain.activation, epilogue_.act))
        << "no CPU activation for '" << chain.activation << "'";
    epilogue_.lo = static_cast<float>(chain.lo);
    epilogue_.hi = static_cast<float>(chain.hi);
  }

  std::vector<Tensor> run(const std::vector<Tensor>& inputs) const override {
    FusedEpilogue ep = epilogue_;
    if (residual_slot_ >= 0) ep.residual = inputs[residual_slot_];
    KernelContext ctx{{node_, gather_node_inputs(slots_, inputs), node_.outputs.size()}, &state_};
    ctx.epilogue = &ep;
    return outputs_of(ctx);
  }

 private:
  FusedEpilogue epilogue_;
  int residual_slot_ = -1;
};

class CpuBackend : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  Device device() const override { return {}; }

  bool supports(const Graph& g, const KernelGroup& group) const override {
    if (group.nodes.size() == 1) return accepted(g, g.nodes()[group.nodes[0]]) != nullptr;
    auto chain = fusion::epilogue_of_group(g, group.nodes);
    Activation act;
    return chain && activation_from(chain->activation, act) &&
           accepted(g, g.nodes()[chain->anchor]) != nullptr;
  }

  std::unique_ptr<CompiledKernel> compile(const Graph& g, const KernelGroup& group) const override {
    if (group.nodes.size() == 1)
      return std::make_unique<NodeKernel>(g, group, group.nodes[0],
                                          accepted(g, g.nodes()[group.nodes[0]]));
    auto chain = fusion::epilogue_of_group(g, group.nodes);
    PTO_CHECK(chain) << "cpu: compile of an unsupported group";
    return std::make_unique<EpilogueKernel>(g, group, *chain,
                                            accepted(g, g.nodes()[chain->anchor]));
  }
};

}  // namespace

std::unique_ptr<Backend> make_backend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace pto::cpu
