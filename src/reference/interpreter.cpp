// The interpreter loop: bind inputs and initializers, run each node's kernel in order, release a
// value after its last reader, and return the graph outputs.
#include <algorithm>
#include <charconv>
#include <new>

#include "pto/liveness.h"
#include "pto/op_registry.h"
#include "pto/reference.h"

namespace pto::reference {

const Tensor& KernelContext::input(size_t i) const {
  if (!has_input(i)) throw ValueError(cat(where(), ": required input ", i, " is missing"));
  return inputs[i];
}

KernelRegistry& KernelRegistry::global() {
  static KernelRegistry* registry = [] {
    auto* r = new KernelRegistry();
    register_elementwise_kernels(*r);
    register_nn_kernels(*r);
    register_tensor_kernels(*r);
    register_reduction_kernels(*r);
    register_indexing_kernels(*r);
    register_attention_kernels(*r);
    register_quantization_kernels(*r);
    register_loss_kernels(*r);
    register_image_kernels(*r);
    register_signal_kernels(*r);
    register_recurrent_kernels(*r);
    register_control_flow_kernels(*r);
    register_sequence_kernels(*r);
    register_ml_kernels(*r);
    return r;
  }();
  return *registry;
}

void KernelRegistry::add(const std::string& op, Kernel k) {
  const OpDef* def = OpRegistry::global().find(op);
  PTO_CHECK(def != nullptr) << "reference kernel for '" << op << "' has no OpDef";
  kernels_.add(op, std::move(k));
  const auto id = static_cast<size_t>(def->id);
  if (by_op_id_.size() <= id) by_op_id_.resize(id + 1, -1);
  by_op_id_[id] = static_cast<int32_t>(kernels_.size() - 1);
}

const Kernel* KernelRegistry::find(const Node& n) const {
  // The name check keeps the answer right for a node whose OpDef came from another registry.
  if (n.def && n.def->id >= 0 && static_cast<size_t>(n.def->id) < by_op_id_.size()) {
    const int32_t k = by_op_id_[static_cast<size_t>(n.def->id)];
    if (k >= 0 && kernels_.name_at(static_cast<size_t>(k)) == n.op)
      return &kernels_.at(static_cast<size_t>(k));
  }
  return find(n.op);
}

namespace {

// The integer factor of a product dim ("32*h": 32, a derived torch.export Dim); 1 for others.
int64_t dim_factor(const std::string& symbol) {
  int64_t f = 0;
  const char* end = symbol.data() + symbol.size();
  auto [p, ec] = std::from_chars(symbol.data(), end, f);
  return ec == std::errc() && p != end && *p == '*' && f > 0 ? f : 1;
}

// The symbolic dimensions bound so far by a call's inputs: a few, searched in order (a hash map
// of strings cost more than the check, on every call).
using Symbols = std::vector<std::pair<const std::string*, int64_t>>;

// Tensor t against the dtype and shape of `type`; where() says what t is, only for an error.
template <class Where>
void check_tensor(const TensorType& type, const Where& where, const Tensor& t, Symbols& symbols) {
  if (type.dtype != DType::kUndefined && t.dtype() != type.dtype)
    throw TypeError(
        cat(where(), ": expected dtype ", dtype_name(type.dtype), ", got ", dtype_name(t.dtype())));
  if (!type.shape) return;
  const Shape& s = *type.shape;
  if (static_cast<int64_t>(s.size()) != t.rank())
    throw ValueError(cat(where(), ": expected rank ", s.size(), " ", shape_str(s), ", got shape ",
                         dims_str(t.shape())));
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i].is_known() && s[i].value != t.shape()[i])
      throw ValueError(cat(where(), ": dimension ", i, " should be ", s[i].value, ", got ",
                           t.shape()[i], " (expected ", shape_str(s), ", got ", dims_str(t.shape()),
                           ")"));
    if (s[i].is_symbolic()) {
      auto it = std::find_if(symbols.begin(), symbols.end(),
                             [&](const auto& b) { return *b.first == s[i].symbol; });
      if (it == symbols.end()) it = symbols.insert(it, {&s[i].symbol, t.shape()[i]});
      if (it->second != t.shape()[i])
        throw ValueError(cat(where(), ": dimension ", i, " ('", s[i].symbol, "') is ", t.shape()[i],
                             " but another input set it to ", it->second));
      if (const int64_t f = dim_factor(s[i].symbol); t.shape()[i] % f != 0)
        throw ValueError(cat(where(), ": dimension ", i, " ('", s[i].symbol, "') is ", t.shape()[i],
                             ", not a multiple of ", f));
    }
  }
}

// A graph input's value against its declared type: a tensor, a sequence (each element checked
// on its own, as a symbolic dim may differ between elements) or an optional (None, or what the
// optional holds).
void check_input(const Graph& g, ValueId v, const Tensor& t, Symbols& symbols) {
  const TensorType& type = g.value(v).type;
  auto name = [&] { return cat("input '", g.value(v).name, "'"); };  // only for an error
  if (!t.defined()) throw ValueError(cat(name(), ": no tensor was given"));
  if (t.kind() == ValueKind::kNone) {
    if (!type.optional)
      throw TypeError(cat(name(), ": expected ", type.str(), ", got an empty optional (None)"));
    return;
  }
  if (type.sequence != (t.kind() == ValueKind::kSequence))
    throw TypeError(cat(name(), ": expected ", type.str(), ", got ",
                        t.is_tensor() ? "a tensor " + t.str() : "a sequence"));
  if (t.is_tensor()) return check_tensor(type, name, t, symbols);
  for (size_t i = 0; i < t.items().size(); ++i) {
    Symbols own;
    check_tensor(
        type, [&] { return cat(name(), " element ", i); }, t.items()[i], own);
  }
}

}  // namespace

void check_tensor_values(const Node& n, const std::vector<Tensor>& values) {
  if (n.def && n.def->has(kNonTensorValues)) return;
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i].defined() && !values[i].is_tensor())
      throw UnsupportedError(
          cat(n.where(), ": input ", i, " is ", values[i].str(), "; the op takes tensors only"));
}

void run_node(const Graph& g, KernelContext& ctx, std::vector<Tensor>& env,
              const std::function<std::vector<Tensor>()>& kernel, const NodeObserver& observer) {
  const Node& n = ctx.node;
  ctx.inputs.reserve(n.inputs.size());
  for (ValueId v : n.inputs) {
    if (v == kNoValue) {
      ctx.inputs.emplace_back();
      continue;
    }
    if (!env[v].defined())
      throw ValueError(cat(n.where(), ": input '", g.value(v).name, "' has no value"));
    ctx.inputs.push_back(env[v].contiguous());
  }
  check_tensor_values(n, ctx.inputs);
  std::vector<Tensor> outs;
  try {
    outs = kernel();
  } catch (const std::bad_alloc&) {
    throw ValueError(cat(n.where(), ": out of memory"));
  } catch (const std::length_error& e) {
    throw ValueError(cat(n.where(), ": size too large (", e.what(), ")"));
  }
  PTO_CHECK(outs.size() <= n.outputs.size())
      << n.where() << ": kernel returned " << outs.size() << " outputs";
  for (size_t o = 0; o < n.outputs.size(); ++o) {
    if (n.outputs[o] == kNoValue) continue;
    if (o >= outs.size() || !outs[o].defined())
      throw UnsupportedError(cat(n.where(), ": output ", o, " is not produced"));
    env[n.outputs[o]] = std::move(outs[o]);
  }
  if (observer) {
    std::vector<Tensor> seen;
    for (ValueId v : n.outputs) seen.push_back(v == kNoValue ? Tensor() : env[v]);
    observer(n, seen);
  }
}

void check_inputs(const Graph& g, const std::vector<Tensor>& inputs) {
  Symbols symbols;
  for (size_t i = 0; i < inputs.size(); ++i) check_input(g, g.inputs()[i], inputs[i], symbols);
}

std::vector<Tensor> run(const Graph& g, const std::vector<Tensor>& inputs,
                        const NodeObserver& observer) {
  if (inputs.size() != g.inputs().size())
    throw ValueError(
        cat("graph '", g.name, "': expected ", g.inputs().size(), " inputs, got ", inputs.size()));
  check_inputs(g, inputs);
  std::vector<Tensor> env(g.values().size());
  for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs()[i]] = inputs[i];
  for (const auto& [v, t] : g.initializers())
    if (!env[v].defined()) env[v] = t;  // a graph input with a default keeps the caller's value

  // Each intermediate is dropped after its last reader (the liveness every runtime shares).
  const Liveness live = analyze_liveness(g, single_node_kernels(g));
  const auto& nodes = g.nodes();
  const KernelRegistry& kernels = KernelRegistry::global();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    const Kernel* k = kernels.find(n);
    if (!k) throw UnsupportedError(cat(n.where(), ": the reference interpreter has no kernel"));
    KernelContext ctx{n, {}, n.outputs.size()};
    run_node(
        g, ctx, env, [&] { return (*k)(ctx); }, observer);
    for (ValueId v : live.release_after[i]) env[v] = Tensor();
  }
  std::vector<Tensor> out;
  for (ValueId v : g.outputs()) {
    if (!env[v].defined())
      throw ValueError(cat("graph output '", g.value(v).name, "' was never computed"));
    out.push_back(env[v]);
  }
  return out;
}

}  // namespace pto::reference
