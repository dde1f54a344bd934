// The CPU backend: the execution contract (pto/backend.h) over the CPU kernels.
//
//   single node          the op's kernel from KernelRegistry, when its accepts() takes the node;
//                        its prepare() runs here, once (weights packed into GEMM panels);
//   Conv/Gemm/MatMul     the anchor's kernel with a FusedEpilogue: bias, residual and activation
//   + epilogue           applied to each output tile while it is in L1 (fusion/epilogue_chain.h);
//   Elementwise group    one tile program (src/tile) run by TileKernel over cache-sized tiles.
#include <algorithm>
#include <limits>

#include "backend/cpu/kernel.h"
#include "backend/cpu/tile_kernel.h"
#include "fusion/epilogue_chain.h"
#include "tile/lower.h"

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

// A fused elementwise (and row-reduction) group: its tile program on the tile executor.
class ElementwiseKernel : public CompiledKernel {
 public:
  ElementwiseKernel(const KernelGroup& group, TileProgram program)
      : kernel_(std::move(program)),
        where_(cat("[", kernel_.program().outputs.empty() ? "" : kernel_.program().outputs[0].name,
                   "]")) {
    const TileProgram& p = kernel_.program();
    for (const TileOperand& in : p.inputs) {
      auto it = std::find(group.inputs.begin(), group.inputs.end(), in.value);
      PTO_CHECK(it != group.inputs.end())
          << "tile operand '" << in.name << "' is not a group input";
      slots_.push_back(static_cast<int>(it - group.inputs.begin()));
    }
    for (ValueId v : group.outputs) {
      int found = -1;
      for (size_t o = 0; o < p.outputs.size(); ++o)
        if (p.outputs[o].value == v) found = static_cast<int>(o);
      PTO_CHECK(found >= 0) << "group output has no tile operand";
      order_.push_back(found);
    }
    if (p.shape) {
      static_shape_ = true;
      for (const Dim& d : *p.shape) {
        if (!d.is_known()) static_shape_ = false;
        shape_.push_back(d.value);
      }
    }
  }

  std::vector<Tensor> run(const std::vector<Tensor>& inputs) const override {
    const TileProgram& p = kernel_.program();
    std::vector<Tensor> args;
    args.reserve(slots_.size());
    Dims shape;
    for (int s : slots_) {
      args.push_back(inputs[s]);
      shape = broadcast_dims(shape, inputs[s].shape(), where_);
    }
    if (static_shape_) shape = shape_;
    std::vector<Tensor> outs;
    for (const TileOperand& o : p.outputs)
      outs.push_back(
          Tensor::empty(o.dtype == TileDType::kBool ? DType::kBool : DType::kF32, shape));
    kernel_.run(args, outs);
    std::vector<Tensor> ordered;
    for (int o : order_) ordered.push_back(outs[o]);
    return ordered;
  }

  std::string describe() const override { return kernel_.program().str(); }

 private:
  TileKernel kernel_;
  std::string where_;
  std::vector<int> slots_;  // per program input: its position in the group's inputs
  std::vector<int> order_;  // per group output: its program output
  bool static_shape_ = false;
  Dims shape_;
};

class CpuBackend : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  Device device() const override { return {}; }

  bool supports(const Graph& g, const KernelGroup& group) const override {
    if (group.nodes.size() == 1) return accepted(g, g.nodes()[group.nodes[0]]) != nullptr;
    if (group.rule == "Elementwise") return lower_elementwise(g, group).has_value();
    auto chain = fusion::epilogue_of_group(g, group.nodes);
    Activation act;
    return chain && activation_from(chain->activation, act) &&
           accepted(g, g.nodes()[chain->anchor]) != nullptr;
  }

  std::unique_ptr<CompiledKernel> compile(const Graph& g, const KernelGroup& group) const override {
    if (group.nodes.size() == 1)
      return std::make_unique<NodeKernel>(g, group, group.nodes[0],
                                          accepted(g, g.nodes()[group.nodes[0]]));
    if (group.rule == "Elementwise") {
      std::string why;
      auto program = lower_elementwise(g, group, &why);
      PTO_CHECK(program) << "cpu: elementwise group does not lower: " << why;
      return std::make_unique<ElementwiseKernel>(group, std::move(*program));
    }
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
