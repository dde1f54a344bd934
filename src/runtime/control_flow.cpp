// Compiled control flow (control_flow.h). The subgraphs are compiled when the enclosing model is:
// a subgraph is a self-contained graph whose last inputs are its captures (docs/architecture.md,
// "Control flow"), so compile() takes it as it is, and its nodes get the normal fallback to the
// reference backend one by one. Types come from the node's type inference: a Loop body whose
// carried values change shape has unknown dims there, and its Executable plans memory per
// input-shape signature like any model with dynamic shapes.
#include "runtime/control_flow.h"

#include <algorithm>

#include "pto/control_flow_runner.h"
#include "pto/log.h"
#include "pto/reference.h"
#include "pto/shape.h"

namespace pto {
namespace {

// The constant of `g` that outer value `v` is: an initializer, not a graph input with a default.
const Tensor* outer_constant(const Graph& g, ValueId v) {
  const Tensor* t = g.initializer(v);
  if (!t || std::find(g.inputs().begin(), g.inputs().end(), v) != g.inputs().end()) return nullptr;
  return t;
}

// Subgraph input `in` read from a new constant `t` by every node (graph outputs keep `in`).
void read_as_constant(Graph& sub, ValueId in, const Tensor& t) {
  const ValueId c = sub.add_constant(sub.value(in).name + "_const", t);
  for (Node& node : sub.mutable_nodes())
    for (ValueId& v : node.inputs)
      if (v == in) v = c;
}

// Whether body output `out` is body input `in` itself, or `in` through Identity nodes.
bool passes_through(const Graph& body, ValueId out, ValueId in) {
  for (int hops = 0; out != in; ++hops) {
    const int p = body.value(out).producer;
    if (p < 0 || hops > 8) return false;
    const Node& id = body.nodes()[static_cast<size_t>(p)];
    if (id.op != "Identity" || !id.domain.empty() || id.inputs.size() != 1) return false;
    out = id.inputs[0];
  }
  return true;
}

// `sub` with each input that holds a constant of `g` in every run read from a constant of its
// own: its kernels then see a weight (a GEMM packs it once, not per iteration) and constant
// folding can use it. Such inputs are the captures whose outer value is a constant, and a
// Loop's carried values that the body passes on unchanged from a constant initial value:
// tf2onnx carries a TensorFlow while loop's weights (its resource variables) so, as Keras'
// GRU and SimpleRNN layers become Loops. The subgraph input stays, so the node passes its
// inputs as before (and a pass-through body output still returns it).
Graph with_constant_captures(const Graph& g, const Node& n, const Graph& sub) {
  Graph out = sub;
  const auto captures = static_cast<size_t>(sub.num_captures);
  for (size_t c = 0; c < captures; ++c) {
    const Tensor* t = outer_constant(g, n.inputs[n.inputs.size() - captures + c]);
    if (t) read_as_constant(out, out.inputs()[out.inputs().size() - captures + c], *t);
  }
  // Loop: node inputs (M, cond, v...), body inputs (i, cond, v..., captures), body outputs
  // (cond, v..., scan outputs).
  if (n.op != "Loop" || !n.domain.empty() || sub.inputs().size() < captures + 2) return out;
  const size_t carried = sub.inputs().size() - captures - 2;
  for (size_t k = 0; k < carried && 1 + k < sub.outputs().size() && 2 + k < n.inputs.size(); ++k) {
    const ValueId in = sub.inputs()[2 + k];
    if (n.inputs[2 + k] == kNoValue || !passes_through(sub, sub.outputs()[1 + k], in)) continue;
    if (const Tensor* t = outer_constant(g, n.inputs[2 + k])) read_as_constant(out, in, *t);
  }
  return out;
}

// Whether a node or value of `g` has this name (a pin then names `g`'s own kernel).
bool own_name(const Graph& g, const std::string& name) {
  for (const Node& n : g.nodes())
    if (n.name == name) return true;
  for (const Value& v : g.values())
    if (v.name == name) return true;
  return false;
}

// How node_backends() and tile pins name node n: its name, else its op.
const std::string& path_name(const Node& n) {
  return n.name.empty() ? n.op : n.name;
}

// The pins of `tiles` for subgraph `attr` of node n, named as in that subgraph.
std::map<std::string, std::vector<int64_t>> subgraph_tiles(
    const std::map<std::string, std::vector<int64_t>>& tiles, const Graph& g, const Node& n,
    const std::string& attr) {
  const std::string prefix = cat(path_name(n), "/", attr, "/");
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& [name, dims] : tiles)
    if (name.size() > prefix.size() && name.starts_with(prefix) && !own_name(g, name))
      out[name.substr(prefix.size())] = dims;
  return out;
}

}  // namespace

std::map<std::string, std::vector<int64_t>> own_tiles(
    const std::map<std::string, std::vector<int64_t>>& tiles, const Graph& g) {
  std::map<std::string, std::vector<int64_t>> out = tiles;
  for (const Node& n : g.nodes())
    for (const auto& [attr, value] : n.attrs.all())
      if (const auto* sub = std::get_if<GraphAttr>(&value); sub && *sub)
        for (const auto& [name, dims] : subgraph_tiles(tiles, g, n, attr))
          out.erase(cat(path_name(n), "/", attr, "/", name));
  return out;
}

namespace {

// Whether `g`'s inputs are all tensors of known shape (nothing to specialize), or whether some
// input is not a tensor (a sequence: its "shape" says nothing, so it is not specialized either).
bool needs_specializing(const Graph& g) {
  bool unknown = false;
  for (ValueId v : g.inputs()) {
    const TensorType& t = g.value(v).type;
    if (!t.is_tensor()) return false;
    if (!t.shape) {
      unknown = true;
      continue;
    }
    for (const Dim& d : *t.shape)
      if (!d.is_known()) unknown = true;
  }
  return unknown;
}

// Whether compiling `generic` again for concrete shapes can change what runs: some node (nested
// subgraphs' included) is on the reference backend (a CPU kernel that needs a known rank), or is
// shape arithmetic (Shape, Size) or an If that known shapes may fold. Otherwise the CPU kernels
// already take any shape, and a specialization would only cost a compile and a copy of the
// kernels' packed weights per signature.
bool worth_specializing(const Executable& generic) {
  for (const auto& [path, backend] : generic.node_backends()) {
    const std::string op = path.substr(path.rfind('/') + 1);
    if (backend != "cpu" || op == "Shape" || op == "Size" || op == "If") return true;
  }
  return false;
}

// Whether each input dim of `g` that is not known is a symbol, none merely unknown: a Loop body
// whose carried value changes shape from one iteration to the next has such a dim (inference
// makes the dims that differ unknown), and would meet a new signature every iteration.
bool symbolic_dims_only(const Graph& g) {
  for (ValueId v : g.inputs()) {
    const TensorType& t = g.value(v).type;
    if (!t.is_tensor() || !t.shape) return false;
    for (const Dim& d : *t.shape)
      if (!d.is_known() && !d.is_symbolic()) return false;
  }
  return true;
}

// Whether subgraph `attr` of `n` runs once per iteration (a Loop or Scan body) on inputs whose
// shapes stay those of the first iteration: compiled for those shapes, its kernels take their
// static-shape paths (an elementwise kernel checks its shapes once, not on every call; views
// reshape to the compiled dims; one memory plan without a lookup by shape), which a body that
// runs tens of times a call pays for at once even when no node changes backend.
bool iterated_with_fixed_shapes(const Node& n, const std::string& attr, const Graph& body) {
  return (n.op == "Loop" || n.op == "Scan") && n.domain.empty() && attr == "body" &&
         symbolic_dims_only(body);
}

bool same_shapes(const std::vector<Dims>& shapes, const std::vector<Tensor>& inputs) {
  if (shapes.size() != inputs.size()) return false;
  for (size_t i = 0; i < shapes.size(); ++i)
    if (shapes[i] != inputs[i].shape()) return false;
  return true;
}

}  // namespace

std::unique_ptr<ControlFlowKernel> ControlFlowKernel::compile(const Graph& g,
                                                              const KernelGroup& group,
                                                              const CompileOptions& options) {
  if (group.nodes.size() != 1) return nullptr;
  const Node& n = g.nodes()[group.nodes[0]];
  // The nested compiles report no progress of their own, and take the tile pins named by
  // their path ("loop_0/body/y"). The tuning cache is read by kernel signature, as outside.
  CompileOptions nested = options;
  nested.on_progress = nullptr;
  std::vector<Subgraph> subgraphs;
  for (const auto& [attr, value] : n.attrs.all()) {
    const auto* sub = std::get_if<GraphAttr>(&value);
    if (!sub || !*sub) continue;
    nested.tiles = subgraph_tiles(options.tiles, g, n, attr);
    try {
      auto source = std::make_shared<const Graph>(with_constant_captures(g, n, **sub));
      Executable generic = pto::compile(*source, nested);
      if (!options.specialize_subgraphs || !needs_specializing(*source) ||
          (!worth_specializing(generic) && !iterated_with_fixed_shapes(n, attr, *source)))
        source = nullptr;
      subgraphs.push_back({attr, std::move(generic), std::move(source), nested});
    } catch (const InternalError&) {
      throw;  // a bug, not a subgraph we cannot compile
    } catch (const Error& e) {
      // A pin the user named for this subgraph must apply, or say why it cannot.
      if (!nested.tiles.empty())
        throw ValueError(cat(n.where(), ": subgraph '", attr, "': ", e.what()));
      log(LogLevel::kInfo,
          cat(n.where(), ": subgraph '", attr, "' not compiled (", e.what(), "); interpreted"));
      return nullptr;
    }
  }
  if (subgraphs.empty()) return nullptr;
  return std::unique_ptr<ControlFlowKernel>(new ControlFlowKernel(n, group, std::move(subgraphs)));
}

ControlFlowKernel::ControlFlowKernel(const Node& n, const KernelGroup& group,
                                     std::vector<Subgraph> subgraphs)
    : node_(n), slots_(node_input_slots(n, group)), subgraphs_(std::move(subgraphs)) {
  for (const Subgraph& s : subgraphs_) specializable_ = specializable_ || s.source;
}

const Executable& ControlFlowKernel::pick(size_t k, const std::vector<Tensor>& inputs) const {
  const Subgraph& sub = subgraphs_[k];
  if (!sub.source) return sub.generic;
  auto found = [&](size_t e) -> const Executable& {
    last_.store(static_cast<int>(e), std::memory_order_relaxed);
    const Executable* exe = entries_[e]->exes[k].get();
    return exe ? *exe : sub.generic;
  };
  // Published entries are read without the lock (they never change once counted).
  const size_t seen = num_entries_.load(std::memory_order_acquire);
  for (size_t e = 0; e < seen; ++e)
    if (same_shapes(entries_[e]->shapes, inputs)) return found(e);
  // Inputs the generic compile would reject (a fixed dim, symbols that disagree) are rejected
  // the same way, before any compile: a specialization takes the shapes as they come.
  reference::check_inputs(*sub.source, inputs);
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t count = num_entries_.load(std::memory_order_relaxed);
  for (size_t e = seen; e < count; ++e)  // another thread may have added it meanwhile
    if (same_shapes(entries_[e]->shapes, inputs)) return found(e);
  if (count == kMaxSpecializations) {
    if (!full_logged_)
      log(LogLevel::kInfo, cat(node_.where(), ": subgraphs specialized for ", count,
                               " input shapes already; other shapes run the generic compile"));
    full_logged_ = true;
    last_.store(-1, std::memory_order_relaxed);
    return sub.generic;
  }
  // Every subgraph that takes these inputs (both branches of an If: the same captures) is
  // compiled for their shapes now, so the node's subgraphs() all show what these shapes run.
  auto entry = std::make_unique<Specialization>();
  for (const Tensor& t : inputs) entry->shapes.push_back(t.shape());
  entry->exes.resize(subgraphs_.size());
  for (size_t j = 0; j < subgraphs_.size(); ++j) {
    const Subgraph& s = subgraphs_[j];
    if (!s.source || s.source->inputs().size() != inputs.size()) continue;
    try {
      if (j != k) reference::check_inputs(*s.source, inputs);
      Graph typed = *s.source;
      for (size_t i = 0; i < inputs.size(); ++i)
        typed.value(typed.inputs()[i]).type.shape = to_shape(inputs[i].shape());
      entry->exes[j] = std::make_unique<Executable>(pto::compile(std::move(typed), s.options));
    } catch (const InternalError& e) {
      // A bug in a pass on these shapes; the generic compile still runs them, so the run goes on
      // there, and says so where it is seen.
      log(LogLevel::kWarn, cat(node_.where(), ": subgraph '", s.attr,
                               "' not specialized for these shapes (", e.what(), ")"));
    } catch (const Error& e) {
      log(LogLevel::kInfo, cat(node_.where(), ": subgraph '", s.attr,
                               "' not specialized for these shapes (", e.what(), ")"));
    }
  }
  entries_[count] = std::move(entry);
  num_entries_.store(count + 1, std::memory_order_release);
  return found(count);
}

std::vector<Tensor> ControlFlowKernel::run(const std::vector<Tensor>& inputs) const {
  AllocatorScope scope(pool_);
  std::vector<Tensor> all = reference::run_control_flow_into(
      node_, gather_node_inputs(slots_, inputs),
      [this](const std::string& attr, const std::vector<Tensor>& in,
             const std::vector<Tensor>& dests) {
        for (size_t k = 0; k < subgraphs_.size(); ++k)
          if (subgraphs_[k].attr == attr) {
            const Executable& exe = specializable_ ? pick(k, in) : subgraphs_[k].generic;
            return dests.empty() ? exe.run(in) : exe.run_into(in, dests);
          }
        throw InternalError(cat(node_.where(), ": no compiled subgraph '", attr, "'"));
      });
  std::vector<Tensor> out;  // the node's named outputs, as the group lists them
  for (size_t o = 0; o < node_.outputs.size(); ++o)
    if (node_.outputs[o] != kNoValue) out.push_back(o < all.size() ? all[o] : Tensor());
  return out;
}

std::vector<std::pair<std::string, const Executable*>> ControlFlowKernel::subgraphs() const {
  const int last = last_.load(std::memory_order_relaxed);
  std::vector<std::pair<std::string, const Executable*>> out;
  for (size_t k = 0; k < subgraphs_.size(); ++k) {
    const Executable* exe =
        last >= 0 ? entries_[static_cast<size_t>(last)]->exes[k].get() : nullptr;
    out.emplace_back(subgraphs_[k].attr, exe ? exe : &subgraphs_[k].generic);
  }
  return out;
}

void ControlFlowKernel::add_stats(ExecutableStats& s) const {
  size_t peak = 0;
  for (const auto& [name, exe] : subgraphs()) {
    const ExecutableStats sub = exe->stats();  // its own subgraphs' already added
    s.subgraph_kernels += sub.kernels + sub.subgraph_kernels;
    s.subgraph_fused_kernels += sub.fused_kernels + sub.subgraph_fused_kernels;
    s.packed_weight_bytes += sub.packed_weight_bytes;
    s.tuned_kernels += sub.tuned_kernels;
    peak = std::max(peak, sub.peak_bytes + sub.subgraph_peak_bytes);
  }
  s.subgraph_peak_bytes = std::max(s.subgraph_peak_bytes, peak);
}

std::string ControlFlowKernel::describe() const {
  std::string d;
  for (const auto& [name, exe] : subgraphs())
    d += cat(d.empty() ? "" : ", ", name, ": ", exe->num_steps(), " kernels");
  return d;
}

}  // namespace pto
