// The CPU backend: the execution contract (pto/backend.h) over the CPU kernels.
//
//   single node          the op's kernel from KernelRegistry, when its accepts() takes the node;
//                        its prepare() runs here, once (weights packed into GEMM panels);
//   Conv/Gemm/MatMul     the anchor's kernel with a FusedEpilogue: bias, residual and activation
//   + epilogue           applied to each output tile while it is in L1 (fusion/epilogue_chain.h);
//   Elementwise group    one tile program (src/tile) run by TileKernel over cache-sized tiles;
//   MatMul/Conv          the chain as a tile program the GEMM (or depthwise conv) runs on each
//   + Elementwise        output block in cache;
//   Cast+Op+Cast         a norm's kernel reading its input in bf16/f16 and storing its output so
//                        (Kernel::takes_casts, fusion/node_casts.h);
//   Add+Norm             a LayerNorm's or RMSNorm's kernel computing its input's sum of operands
//                        as it loads each row (Kernel::takes_sums, fusion/sum_norm.h).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "backend/cpu/conv/conv.h"
#include "backend/cpu/env_switch.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/tile_kernel.h"
#include "fusion/epilogue_chain.h"
#include "fusion/node_casts.h"
#include "fusion/sum_norm.h"
#include "ir/ops/op_params.h"
#include "pto/op_registry.h"
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

// How messages name a kernel: by its first output, and its op when it is a single node.
std::string kernel_name(const Graph& g, const KernelGroup& group) {
  const Node& last = g.nodes()[group.last_node()];
  const std::string out = group.outputs.empty() ? last.name : g.value(group.outputs[0]).name;
  return cat("kernel '", out, "' (", kernel_label(g, group), ")");
}

// A group's knobs on a kernel that takes none: ValueError naming the kernel.
void check_no_knobs(const Graph& g, const KernelGroup& group) {
  if (!group.knobs.empty())
    throw ValueError(
        cat(kernel_name(g, group), ": takes no knob '", group.knobs.begin()->first, "'"));
}

// One node on its CPU kernel. The group's inputs are the node's distinct inputs; `slots` maps
// each node input to its position there (-1 for a missing optional input).
class NodeKernel : public CompiledKernel {
 public:
  // `node` is the group's only node, or the anchor of a fused group.
  NodeKernel(const Graph& g, const KernelGroup& group, int32_t node, const Kernel* k)
      : node_(g.nodes()[node]),
        kernel_(k),
        slots_(node_input_slots(node_, group)),
        knobs_(group.knobs) {
    NodeInfo info = node_info(g, node_);
    info.knobs = &knobs_;
    for (const auto& [name, values] : knobs_) {
      if (!k->check_knob) check_no_knobs(g, group);
      knobs_described_ += cat(k->check_knob(info, name, values, kernel_name(g, group)), "\n");
    }
    if (k->prepare) state_ = k->prepare(info);
  }

  std::vector<Tensor> run(const std::vector<Tensor>& inputs) const override {
    KernelContext ctx = context(inputs);
    return run_with(ctx, inputs);
  }

  // The node's inputs move out of the runtime's instead of being copied (a copy is two
  // allocations, a small graph's main per-call cost), except those read twice or kept for what
  // the kernel reads after the node (kept_); they go back when the kernel returns or throws.
  std::vector<Tensor> run_taking(std::vector<Tensor>& inputs) const override {
    KernelContext ctx{{node_, {}, node_.outputs.size()}, &state_};
    ctx.knobs = &knobs_;
    // A node reading the group's inputs in order, and nothing beside: the whole vector.
    const bool whole = kept_.empty() && reads_in_order(slots_, inputs.size());
    if (whole) {
      ctx.inputs = std::move(inputs);
    } else {
      ctx.inputs.reserve(slots_.size());
      for (size_t i = 0; i < slots_.size(); ++i)
        ctx.inputs.push_back(slots_[i] < 0 ? Tensor()
                             : movable(i)  ? std::move(inputs[slots_[i]])
                                           : inputs[slots_[i]]);
    }
    auto give_back = [&] {
      if (whole) {
        inputs = std::move(ctx.inputs);
        return;
      }
      for (size_t i = 0; i < slots_.size(); ++i)
        if (slots_[i] >= 0 && movable(i)) inputs[slots_[i]] = std::move(ctx.inputs[i]);
    };
    try {
      std::vector<Tensor> out = run_with(ctx, inputs);
      give_back();
      return out;
    } catch (...) {
      give_back();
      throw;
    }
  }

  std::string describe() const override {
    return (kernel_->describe ? kernel_->describe(state_) : std::string()) + knobs_described_;
  }
  std::string algorithm(const std::vector<Dims>& inputs) const override {
    if (!kernel_->algorithm) return CompiledKernel::algorithm(inputs);
    std::vector<Dims> node_inputs;
    for (int s : slots_) node_inputs.push_back(s < 0 ? Dims{} : inputs.at(s));
    return kernel_->algorithm(node_, state_, node_inputs);
  }

  // Weights packed at compile time: GEMM panels of B (MatMul, Gemm) or of A per group (Conv).
  size_t prepared_bytes() const override {
    return kernel_->packed_bytes ? kernel_->packed_bytes(state_) : 0;
  }
  // The inputs the kernel packed, unless the node also reads the same value as another input.
  std::vector<ValueId> packed_constants() const override {
    if (!kernel_->packed_inputs) return {};
    const std::vector<size_t> packed = kernel_->packed_inputs(state_);
    std::vector<ValueId> out;
    for (size_t i : packed) {
      bool read_elsewhere = false;
      for (size_t j = 0; j < node_.inputs.size(); ++j)
        read_elsewhere =
            read_elsewhere || (node_.inputs[j] == node_.inputs.at(i) &&
                               std::find(packed.begin(), packed.end(), j) == packed.end());
      if (!read_elsewhere) out.push_back(node_.inputs[i]);
    }
    return out;
  }
  Tensor unpack_constant(ValueId v) const override {
    if (kernel_->packed_inputs)
      for (size_t i : kernel_->packed_inputs(state_))
        if (node_.inputs.at(i) == v) return kernel_->unpack(state_, i);
    return CompiledKernel::unpack_constant(v);
  }

 protected:
  // Runs the node on `ctx` (its inputs gathered); `inputs` are the group's, for what a subclass
  // reads beside the node's own (a residual, tile operands, views), whose slots are in kept_.
  virtual std::vector<Tensor> run_with(KernelContext& ctx,
                                       const std::vector<Tensor>& inputs) const {
    (void)inputs;
    return outputs_of(ctx);
  }

  // Whether run_taking may move node input i out of the group's inputs.
  bool movable(size_t i) const {
    const int s = slots_[i];
    return std::count(slots_.begin(), slots_.end(), s) == 1 &&
           std::find(kept_.begin(), kept_.end(), s) == kept_.end();
  }

  // The node's inputs from the group's, with the prepared state and the knobs.
  KernelContext context(const std::vector<Tensor>& inputs) const {
    KernelContext ctx{{node_, gather_node_inputs(slots_, inputs), node_.outputs.size()}, &state_};
    ctx.knobs = &knobs_;
    return ctx;
  }

  // Runs the kernel and keeps the outputs the node defines (the group's outputs).
  std::vector<Tensor> outputs_of(const KernelContext& ctx) const {
    std::vector<Tensor> all = kernel_->run(ctx);
    if (all.size() == node_.outputs.size() &&
        std::find(node_.outputs.begin(), node_.outputs.end(), kNoValue) == node_.outputs.end())
      return all;  // every output is the group's: as they are (no copies)
    std::vector<Tensor> out;
    for (size_t o = 0; o < node_.outputs.size(); ++o)
      if (node_.outputs[o] != kNoValue) out.push_back(o < all.size() ? all[o] : Tensor());
    return out;
  }

  const Node& node_;
  const Kernel* kernel_;
  std::vector<int> slots_;
  std::vector<int> kept_;  // group input slots read beside the node's inputs
  Knobs knobs_;
  std::string knobs_described_;  // a line per knob, as the kernel says what it changes
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
    epilogue_.store = chain.store;
    for (int32_t v : chain.views) {
      const Node& n = g.nodes()[v];
      const reference::Kernel* k = reference::KernelRegistry::global().find(n.op);
      PTO_CHECK(k) << n.where() << ": no kernel for a view";
      views_.push_back({&n, k, node_input_slots(n, group)});
      kept_.insert(kept_.end(), views_.back().slots.begin(), views_.back().slots.end());
    }
    if (residual_slot_ >= 0) kept_.push_back(residual_slot_);
  }

  std::vector<Tensor> run_with(KernelContext& ctx,
                               const std::vector<Tensor>& inputs) const override {
    FusedEpilogue with_residual;
    const FusedEpilogue* ep = &epilogue_;  // copied (a bias, a tile program) only for a residual
    if (residual_slot_ >= 0) {
      with_residual = epilogue_;
      with_residual.residual = inputs[residual_slot_];
      ep = &with_residual;
    }
    ctx.epilogue = ep;
    std::vector<Tensor> out = outputs_of(ctx);
    // The views only relabel the product's shape (they are views of contiguous data).
    for (const View& v : views_) {
      std::vector<Tensor> args = gather_node_inputs(v.slots, inputs);
      args[0] = out[0];
      reference::KernelContext vc{*v.node, std::move(args), 1};
      out = {(*v.kernel)(vc)[0]};
    }
    // The anchor checked the residual's size; an Add that broadcasts it to another shape of the
    // same size is the unfused graph's to compute (rare enough to compute twice).
    if (ep->residual.defined() && ep->residual.shape() != out[0].shape())
      throw KernelDeclined(cat(node_.where(), ": residual ", ep->residual.str(), " and output ",
                               out[0].str(), " differ"));
    return out;
  }

 private:
  struct View {
    const Node* node;
    const reference::Kernel* kernel;
    std::vector<int> slots;
  };
  FusedEpilogue epilogue_;
  int residual_slot_ = -1;
  std::vector<View> views_;
};

// A node with the Casts around it on a kernel that takes them: input 0 read where the widening
// Cast reads it, the output stored in the narrowing Cast's type (FusedEpilogue::store).
class CastsKernel : public NodeKernel {
 public:
  CastsKernel(const Graph& g, const KernelGroup& group, const fusion::NodeCasts& casts,
              const Kernel* k)
      : NodeKernel(g, group, casts.node, k) {
    auto it = std::find(group.inputs.begin(), group.inputs.end(), casts.input);
    PTO_CHECK(it != group.inputs.end()) << "cpu: the Casts' input is not a group input";
    slots_[0] = static_cast<int>(it - group.inputs.begin());
    epilogue_.store = casts.store;
  }

  std::vector<Tensor> run_with(KernelContext& ctx, const std::vector<Tensor>&) const override {
    ctx.epilogue = &epilogue_;
    return outputs_of(ctx);
  }

 private:
  FusedEpilogue epilogue_;
};

// The kernel of a group of a node with its Casts, when it takes them.
const Kernel* takes_casts(const Graph& g, const fusion::NodeCasts& casts) {
  const Kernel* k = accepted(g, g.nodes()[casts.node]);
  return k && k->takes_casts ? k : nullptr;
}

// PTO_ADD_NORM=0 leaves Add+LayerNormalization (RMSNormalization) groups to the tile program
// (A/B and tests); unset or 1, the norm's kernel runs them. Anything else is an error.
bool add_norm_enabled() {
  return env_switch("PTO_ADD_NORM");
}

// The norm kernel of a SumNorm group when it can compute the sum: float32 values, the normalized
// axes of the norm input of sizes known at compile time, each Add of the norm input's shape, each
// operand that shape or a suffix of it covering the normalized axes (leading 1s aside; a symbolic
// batch or sequence matches itself), Scale and B of the normalized shape (the norm kernel's fast
// path). Else null: the group stays a tile program. What only the run's shapes show (an operand's
// rows not dividing the sum's) makes the kernel decline and the nodes run one by one.
const Kernel* sum_norm_kernel(const Graph& g, const fusion::SumNorm& s) {
  const Node& norm = g.nodes()[s.norm];
  const Kernel* k = accepted(g, norm);
  if (!k || !k->takes_sums || (s.narrow >= 0 && !k->takes_casts)) return nullptr;
  const std::optional<Shape>& x = g.value(norm.inputs[0]).type.shape;
  if (!x) return nullptr;
  const auto rank = static_cast<int64_t>(x->size());
  int64_t axis = params::norm(norm).axis;
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return nullptr;
  const Shape normalized(x->begin() + axis, x->end());
  if (!is_static(normalized)) return nullptr;
  auto strip = [](Shape d) {  // leading 1s off
    d.erase(d.begin(), std::find_if(d.begin(), d.end(), [](const Dim& v) { return v != Dim(1); }));
    return d;
  };
  const Shape tail = strip(normalized);
  for (const fusion::SumNorm::Add& a : s.adds) {
    const TensorType& t = g.value(g.nodes()[a.node].outputs[0]).type;
    if (t.dtype != DType::kF32 || !t.shape || !may_equal(*t.shape, *x)) return nullptr;
  }
  for (ValueId v : s.operands) {
    const TensorType& t = g.value(v).type;
    if (t.dtype != DType::kF32 || !t.shape) return nullptr;
    const Shape d = strip(*t.shape);
    if (d.size() > x->size() || d.size() < tail.size() ||
        !std::equal(d.begin(), d.end(), x->end() - static_cast<std::ptrdiff_t>(d.size())))
      return nullptr;
  }
  for (size_t i = 1; i < norm.inputs.size() && i < 3; ++i) {
    if (norm.inputs[i] == kNoValue) continue;
    const std::optional<Shape>& t = g.value(norm.inputs[i]).type.shape;
    if (!t || strip(*t) != tail) return nullptr;
  }
  return k;
}

// A LayerNormalization or RMSNormalization whose input is a sum of operands (fusion/sum_norm.h):
// the norm's kernel computes the sum as it loads each row, and writes the sums the group outputs.
class SumNormKernel : public NodeKernel {
 public:
  SumNormKernel(const Graph& g, const KernelGroup& group, const fusion::SumNorm& s, const Kernel* k)
      : NodeKernel(g, group, s.norm, k) {
    for (ValueId v : s.operands) {
      auto it = std::find(group.inputs.begin(), group.inputs.end(), v);
      PTO_CHECK(it != group.inputs.end()) << "cpu: a sum operand is not a group input";
      operand_slots_.push_back(static_cast<int>(it - group.inputs.begin()));
    }
    kept_ = operand_slots_;
    for (const fusion::SumNorm::Add& a : s.adds) sum_.adds.push_back({a.lhs, a.rhs});
    store_ = s.store;
    // Per group output: the norm's Y (-1; stored as the Cast after it stores it) or an Add's
    // result.
    const ValueId y = s.narrow >= 0 ? g.nodes()[s.narrow].outputs[0] : node_.outputs[0];
    for (ValueId v : group.outputs) {
      int add = -1;
      for (size_t i = 0; i < s.adds.size(); ++i)
        if (g.nodes()[s.adds[i].node].outputs[0] == v) add = static_cast<int>(i);
      PTO_CHECK(add >= 0 || v == y) << "cpu: a sum group's output is not a sum";
      outputs_.push_back(add);
    }
  }

  std::vector<Tensor> run_with(KernelContext& ctx,
                               const std::vector<Tensor>& inputs) const override {
    FusedSum sum = sum_;
    // The sum's shape: the operands' broadcast (each a suffix of it, which the kernel checks).
    for (int s : operand_slots_) {
      const Tensor& t = inputs[s];
      sum.operands.push_back(t);
      sum.shape = sum.operands.size() == 1 ? t.shape()
                                           : broadcast_dims(sum.shape, t.shape(), node_.where());
    }
    sum.outputs.resize(sum.adds.size());
    for (int a : outputs_)
      if (a >= 0) sum.outputs[a] = Tensor::empty(DType::kF32, sum.shape);
    FusedEpilogue ep;
    ep.sum = &sum;
    ep.store = store_;
    ctx.epilogue = &ep;
    Tensor y = std::move(outputs_of(ctx)[0]);
    std::vector<Tensor> out;
    for (int a : outputs_) out.push_back(a < 0 ? y : sum.outputs[a]);
    return out;
  }

 private:
  std::vector<int> operand_slots_;  // per operand: its group input
  FusedSum sum_;                    // the adds; operands, outputs and shape filled per run
  std::vector<int> outputs_;        // per group output: -1 the norm's Y, else an Add's index
  DType store_ = DType::kF32;       // Y's type: bf16 or f16 when a Cast after the norm stores it
};

// A MatMul, Gemm or Conv followed by any elementwise chain: the chain as a tile program the GEMM
// (or the depthwise conv) runs on each output block while it is in cache (Epilogue::tile).
class TileEpilogueKernel : public NodeKernel {
 public:
  TileEpilogueKernel(const Graph& g, const KernelGroup& group, int32_t anchor, const Kernel* k,
                     TileProgram program)
      : NodeKernel(g, group, anchor, k), tile_(std::move(program)) {
    const auto& ins = tile_.program().inputs;
    for (size_t i = 1; i < ins.size(); ++i) {
      auto it = std::find(group.inputs.begin(), group.inputs.end(), ins[i].value);
      PTO_CHECK(it != group.inputs.end()) << "tile operand '" << ins[i].name << "' is not an input";
      operand_slots_.push_back(static_cast<int>(it - group.inputs.begin()));
    }
    kept_ = operand_slots_;
  }

  std::vector<Tensor> run_with(KernelContext& ctx,
                               const std::vector<Tensor>& inputs) const override {
    FusedEpilogue ep;
    ep.tile = &tile_;
    ep.store = graph_dtype(tile_.program().outputs[0].dtype);
    for (int s : operand_slots_) ep.tile_inputs.push_back(inputs[s]);
    ctx.epilogue = &ep;
    return outputs_of(ctx);
  }

  std::string describe() const override {
    return cat(tile_.program().str(), "  plan: on each output block of the ", node_.op,
               " as its blocking cuts them, up to ", tile_.capacity(), " values at a time\n");
  }

 private:
  TileKernel tile_;
  std::vector<int> operand_slots_;  // per program input k >= 1: its group input
};

// Whether the conv kernel can index every operand of `program` on output `y`
// (conv_operand_strides). A symbolic dimension (the batch of a torch capture) is taken as the
// other shape's where that is known, else as 2: the mapping depends only on which dimensions
// broadcast, and the kernel still declines at run time what it cannot index.
bool conv_operands_map(const Graph& g, const TileProgram& program, ValueId y) {
  const std::optional<Shape>& out = g.value(y).type.shape;
  if (!out) return true;
  for (size_t k = 1; k < program.inputs.size(); ++k) {
    if (program.inputs[k].dtype != TileDType::kF32) return false;
    const std::optional<Shape>& in = g.value(program.inputs[k].value).type.shape;
    if (!in) continue;
    if (in->size() > out->size()) return false;
    Dims t(in->size()), o(out->size());
    for (size_t d = 0; d < o.size(); ++d) {
      const Dim& od = (*out)[d];
      const Dim* td = d + t.size() >= o.size() ? &(*in)[d + t.size() - o.size()] : nullptr;
      o[d] = od.is_known() ? od.value : td && td->is_known() && td->value != 1 ? td->value : 2;
      if (td) t[d + t.size() - o.size()] = td->is_known() ? td->value : o[d];
    }
    if (!conv_operand_strides(t, o)) return false;
  }
  return true;
}

// Whether `group` is a MatMul (one B for every batch item), a Gemm without C or a Conv (NCHW,
// 1-D or 2-D) followed by an elementwise chain the tile ISA lowers as an epilogue whose operands
// the kernel can index; the program when it is.
std::optional<TileProgram> tile_epilogue_of(const Graph& g, const KernelGroup& group) {
  if (group.anchor < 0 || group.rule.find("+Elementwise") == std::string::npos) return std::nullopt;
  const Node& a = g.nodes()[group.anchor];
  const bool matmul = a.op == "MatMul" || a.op == "DynamicQuantizeMatMul", gemm = a.op == "Gemm",
             conv = a.op == "Conv";
  if ((!matmul && !gemm && !conv) || (conv && !a.domain.empty())) return std::nullopt;
  if (gemm && a.inputs.size() > 2 && a.inputs[2] != kNoValue) return std::nullopt;
  const TensorType& b = g.value(a.inputs[1]).type;
  if (matmul && (!b.shape || b.shape->size() > 2)) return std::nullopt;
  if (!accepted(g, a)) return std::nullopt;
  std::optional<TileProgram> program = lower_epilogue(g, group, a.outputs[0]);
  if (program && conv && !conv_operands_map(g, *program, a.outputs[0])) return std::nullopt;
  // A half result (the chain ends in a Cast to bf16/f16): the float GEMMs store it (c_half).
  // Nothing else: a bool or integer result (a comparison ending the chain) is no half store.
  if (program) {
    const TileDType out = program->outputs[0].dtype;
    const bool half = out == TileDType::kBF16 || out == TileDType::kF16;
    if (out != TileDType::kF32 && !(half && (a.op == "MatMul" || a.op == "Gemm")))
      return std::nullopt;
  }
  return program;
}

// A fused elementwise (and row-reduction) group: its tile program on the tile executor.
class ElementwiseKernel : public CompiledKernel {
 public:
  ElementwiseKernel(const Graph& g, const KernelGroup& group, TileProgram program)
      : kernel_(std::move(program), kernel_name(g, group), group.tile),
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
    for (int32_t i : group.nodes) {
      const Node& n = g.nodes()[i];
      ShapeStep step{n.def && n.def->is_elementwise(), {}, n.outputs[0]};
      for (ValueId v : n.inputs) {
        auto it = std::find(group.inputs.begin(), group.inputs.end(), v);
        step.inputs.push_back(
            {v, it == group.inputs.end() ? -1 : static_cast<int>(it - group.inputs.begin())});
      }
      shape_steps_.push_back(std::move(step));
    }
    outputs_ = group.outputs;
    std::vector<int> sorted = slots_;
    std::sort(sorted.begin(), sorted.end());
    permutation_ = slots_.size() == group.inputs.size();
    for (size_t k = 0; k < sorted.size(); ++k)
      permutation_ = permutation_ && sorted[k] == static_cast<int>(k);
    // The swaps that take the group's order to the program's: position k gets slots_[k].
    std::vector<int> at(slots_.size());  // the group input now at each position
    for (size_t k = 0; k < at.size(); ++k) at[k] = static_cast<int>(k);
    for (size_t k = 0; permutation_ && k < slots_.size(); ++k) {
      const auto j = static_cast<size_t>(std::find(at.begin(), at.end(), slots_[k]) - at.begin());
      if (j == k) continue;
      std::swap(at[k], at[j]);
      swaps_.emplace_back(k, j);
    }
    outputs_in_order_ = order_.size() == p.outputs.size();
    for (size_t o = 0; o < order_.size(); ++o)
      outputs_in_order_ = outputs_in_order_ && order_[o] == static_cast<int>(o);
    for (int slot : slots_) {
      const std::optional<Shape>& in = g.value(group.inputs[slot]).type.shape;
      Dims d;
      for (size_t k = 0; in && k < in->size() && (*in)[k].is_known(); ++k)
        d.push_back((*in)[k].value);
      if (!in || d.size() != in->size()) {
        input_shapes_.clear();
        break;
      }
      input_shapes_.push_back(std::move(d));
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
    std::vector<Tensor> lent = inputs;
    return run_taking(lent);
  }

  // The program's inputs move out of `inputs` (each read once) and back when it returns or throws.
  std::vector<Tensor> run_taking(std::vector<Tensor>& inputs) const override {
    const TileProgram& p = kernel_.program();
    // A static program on the input shapes it was compiled for needs the shape checks once.
    Dims broadcast;
    const Dims* shape = &shape_;
    if (!checked_.load(std::memory_order_relaxed) || !has_compiled_shapes(inputs)) {
      for (int s : slots_) broadcast = broadcast_dims(broadcast, inputs[s].shape(), where_);
      if (!static_shape_) shape = &broadcast;
      check_shapes(inputs, *shape);
      if (static_shape_ && has_compiled_shapes(inputs))
        checked_.store(true, std::memory_order_relaxed);
    }
    std::vector<Tensor> outs;
    outs.reserve(p.outputs.size());
    for (const TileOperand& o : p.outputs)
      outs.push_back(Tensor::empty(graph_dtype(o.dtype), *shape));
    if (permutation_) {
      // The group's inputs in the program's order in place, and back after: moves, no list.
      permute(inputs, false);
      try {
        kernel_.run(inputs, outs);
      } catch (...) {
        permute(inputs, true);
        throw;
      }
      permute(inputs, true);
      if (outputs_in_order_) return outs;
      return ordered(outs);
    }
    auto once = [&](size_t k) { return std::count(slots_.begin(), slots_.end(), slots_[k]) == 1; };
    std::vector<Tensor> args;
    args.reserve(slots_.size());
    for (size_t k = 0; k < slots_.size(); ++k)
      args.push_back(once(k) ? std::move(inputs[slots_[k]]) : inputs[slots_[k]]);
    auto give_back = [&] {
      for (size_t k = 0; k < slots_.size(); ++k)
        if (once(k)) inputs[slots_[k]] = std::move(args[k]);
    };
    try {
      kernel_.run(args, outs);
    } catch (...) {
      give_back();
      throw;
    }
    give_back();
    if (outputs_in_order_) return outs;
    return ordered(outs);
  }

  std::string describe() const override { return kernel_.describe(); }

 private:
  // How one node's output shape follows from its inputs: the broadcast of them all (elementwise
  // ops), or input 0's (Softmax and the other row ops the tile ISA takes).
  struct ShapeStep {
    bool broadcast;
    std::vector<std::pair<ValueId, int>> inputs;  // value, and its group-input slot or -1
    ValueId output;
  };

  // The program's outputs in the group's order.
  std::vector<Tensor> ordered(std::vector<Tensor>& outs) const {
    std::vector<Tensor> out;
    out.reserve(order_.size());
    for (int o : order_) out.push_back(std::move(outs[o]));  // each program output once
    return out;
  }

  // inputs[k] = inputs[slots_[k]] for every k (slots_ a permutation), or its inverse (`back`):
  // the swaps of swaps_, forward or backward.
  void permute(std::vector<Tensor>& inputs, bool back) const {
    if (back)
      for (auto it = swaps_.rbegin(); it != swaps_.rend(); ++it)
        std::swap(inputs[it->first], inputs[it->second]);
    else
      for (const auto& [a, b] : swaps_) std::swap(inputs[a], inputs[b]);
  }

  // Every output of the group must have the program's index space: an unknown dimension that
  // turns out to broadcast inside the group makes the program wrong for this run, and the
  // runtime runs the nodes one by one instead.
  void check_shapes(const std::vector<Tensor>& inputs, const Dims& shape) const {
    std::vector<std::pair<ValueId, Dims>> known;
    auto dims_of = [&](const std::pair<ValueId, int>& in) -> const Dims* {
      if (in.second >= 0) return &inputs[in.second].shape();
      for (const auto& [v, d] : known)
        if (v == in.first) return &d;
      return nullptr;
    };
    for (const ShapeStep& st : shape_steps_) {
      Dims out;
      for (size_t i = 0; i < st.inputs.size(); ++i) {
        if (st.inputs[i].first == kNoValue) continue;
        const Dims* d = dims_of(st.inputs[i]);
        if (!d) continue;
        if (!st.broadcast) {
          out = *d;
          break;
        }
        try {
          out = broadcast_dims(out, *d, where_);
        } catch (const ValueError& e) {
          throw KernelDeclined(e.what());
        }
      }
      // Inside, a smaller value is read broadcast, as the graph means it; an output must fill
      // the index space.
      const bool is_output =
          std::find(outputs_.begin(), outputs_.end(), st.output) != outputs_.end();
      if ((is_output || !st.broadcast) && out != shape)  // a row op must see whole rows
        throw KernelDeclined(cat(where_, ": output of shape ", dims_str(out), " from a group over ",
                                 dims_str(shape)));
      known.push_back({st.output, std::move(out)});
    }
  }

  // Whether the program's inputs have the shapes inference gave them at compile time.
  bool has_compiled_shapes(const std::vector<Tensor>& inputs) const {
    if (input_shapes_.size() != slots_.size()) return false;  // one was not known then
    for (size_t k = 0; k < slots_.size(); ++k)
      if (inputs[slots_[k]].shape() != input_shapes_[k]) return false;
    return true;
  }

  TileKernel kernel_;
  std::vector<ShapeStep> shape_steps_;
  std::vector<ValueId> outputs_;
  std::string where_;
  std::vector<int> slots_;  // per program input: its position in the group's inputs
  std::vector<int> order_;  // per group output: its program output
  // slots_ is a permutation of the group's inputs (each read once), which run_taking applies in
  // place by swaps_; order_ is the identity. Then a run builds no argument list.
  bool permutation_ = false;
  std::vector<std::pair<size_t, size_t>> swaps_;
  bool outputs_in_order_ = false;
  bool static_shape_ = false;
  Dims shape_;
  std::vector<Dims> input_shapes_;            // per program input, when all are known
  mutable std::atomic<bool> checked_{false};  // the checks passed on input_shapes_
};

class CpuBackend : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  Device device() const override { return {}; }

  bool supports(const Graph& g, const KernelGroup& group) const override {
    if (group.nodes.size() == 1)
      return accepted(g, g.nodes()[group.nodes[0]]) != nullptr ||
             lower_elementwise(g, group).has_value();
    if (group.rule == "Elementwise") return lower_elementwise(g, group).has_value();
    if (group.rule.find("+Elementwise") != std::string::npos)
      return tile_epilogue_of(g, group).has_value();
    if (fusion::is_sum_norm_rule(group.rule)) {
      auto sum = fusion::sum_norm_of_group(g, group.nodes);
      return sum && add_norm_enabled() && sum_norm_kernel(g, *sum) != nullptr;
    }
    if (auto casts = fusion::casts_of_group(g, group.nodes, group.anchor))
      return takes_casts(g, *casts) != nullptr;
    auto chain = fusion::epilogue_of_group(g, group.nodes);
    Activation act;
    return chain && activation_from(chain->activation, act) &&
           accepted(g, g.nodes()[chain->anchor]) != nullptr;
  }

  std::unique_ptr<CompiledKernel> compile(const Graph& g, const KernelGroup& group) const override {
    // A single node runs its op's kernel; as a tile program when its tile is pinned
    // (CompileOptions::tiles, the tuner) or when it has no kernel of its own (a lone PRelu).
    if (group.nodes.size() == 1) {
      const Kernel* own = accepted(g, g.nodes()[group.nodes[0]]);
      if ((own && group.tile.empty()) || !lower_elementwise(g, group))
        return std::make_unique<NodeKernel>(g, group, group.nodes[0], own);
    }
    if (group.rule == "Elementwise" || group.nodes.size() == 1) {
      std::string why;
      auto program = lower_elementwise(g, group, &why);
      PTO_CHECK(program) << "cpu: elementwise group does not lower: " << why;
      check_no_knobs(g, group);  // a tile program takes only `tile`
      return std::make_unique<ElementwiseKernel>(g, group, std::move(*program));
    }
    if (auto program = tile_epilogue_of(g, group))
      return std::make_unique<TileEpilogueKernel>(
          g, group, group.anchor, accepted(g, g.nodes()[group.anchor]), std::move(*program));
    if (fusion::is_sum_norm_rule(group.rule)) {
      auto sum = fusion::sum_norm_of_group(g, group.nodes);
      PTO_CHECK(sum) << "cpu: compile of a sum norm group that is not one";
      const Kernel* k = sum_norm_kernel(g, *sum);
      PTO_CHECK(k) << "cpu: compile of a sum norm group its kernel does not take";
      return std::make_unique<SumNormKernel>(g, group, *sum, k);
    }
    if (auto casts = fusion::casts_of_group(g, group.nodes, group.anchor))
      return std::make_unique<CastsKernel>(g, group, *casts, takes_casts(g, *casts));
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
