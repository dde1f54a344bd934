// FoldConstants: evaluates at compile time every node whose inputs are all constants, with the
// reference kernel of its op, and turns its outputs into initializers (same values, same names).
// Shape and Size of a value whose type has a fully static shape fold too, without data, so that
// Shape -> Gather -> Concat -> Reshape chains become a constant shape. One forward sweep: a folded
// output is a constant for the nodes after it. Skipped: ops marked kNondeterministic, results
// over kMaxFoldedBytes, and any node whose kernel throws (the node stays; the run reports it).
#include <algorithm>

#include "passes/passes.h"
#include "passes/rewrite_util.h"
#include "pto/op_registry.h"
#include "pto/reference.h"

namespace pto::passes {
namespace {

constexpr size_t kMaxFoldedBytes = size_t{64} << 20;

// Shape (with start/end, clamped as the op does) or Size of a statically shaped input.
std::optional<Tensor> fold_shape_op(const Graph& g, const Node& n) {
  if (n.inputs.size() != 1 || n.outputs.size() != 1) return std::nullopt;
  std::optional<Dims> dims = static_dims(g, n.inputs[0]);
  if (!dims) return std::nullopt;
  if (n.op == "Size") {
    int64_t numel = 1;
    for (int64_t d : *dims) {
      if (d != 0 && numel > INT64_MAX / d) return std::nullopt;
      numel *= d;
    }
    return Tensor::scalar<int64_t>(numel);
  }
  auto r = static_cast<int64_t>(dims->size());
  auto clamp_index = [r](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + r : i, 0, r); };
  int64_t start = clamp_index(n.attrs.get_int("start", 0));
  int64_t end = std::max(start, clamp_index(n.attrs.get_int("end", r)));
  std::vector<int64_t> out(dims->begin() + start, dims->begin() + end);
  return Tensor::from_vector(out, {static_cast<int64_t>(out.size())});
}

// The node's outputs computed by its reference kernel; nullopt when it cannot be folded.
std::optional<std::vector<Tensor>> evaluate(const Graph& g, const Node& n) {
  const reference::Kernel* kernel = reference::KernelRegistry::global().find(n.op);
  if (!kernel || !n.domain.empty()) return std::nullopt;
  for (ValueId o : n.outputs) {  // refuse before computing what is known to be too large
    std::optional<Dims> d = static_dims(g, o);
    if (d && static_cast<size_t>(checked_numel(*d)) * dtype_size(g.value(o).type.dtype) >
                 kMaxFoldedBytes)
      return std::nullopt;
  }
  reference::KernelContext kc{n, {}, n.outputs.size()};
  for (ValueId v : n.inputs) {
    if (v == kNoValue) {
      kc.inputs.emplace_back();
      continue;
    }
    const Tensor* t = constant_of(g, v);
    if (!t) return std::nullopt;
    kc.inputs.push_back(t->contiguous());
  }
  std::vector<Tensor> outs;
  try {
    outs = (*kernel)(kc);
  } catch (const Error&) {
    return std::nullopt;  // the node stays; running the graph reports the error where it is
  } catch (const std::bad_alloc&) {
    return std::nullopt;
  } catch (const std::length_error&) {
    return std::nullopt;
  }
  if (outs.size() < n.outputs.size()) outs.resize(n.outputs.size());
  for (size_t o = 0; o < n.outputs.size(); ++o) {
    if (n.outputs[o] == kNoValue) continue;
    if (!outs[o].defined() || outs[o].nbytes() > kMaxFoldedBytes) return std::nullopt;
    // A kernel may hand back a view of an input (Identity, Reshape); a folded constant owns its
    // data, so that rewriting one initializer in place can never change another.
    for (const Tensor& in : kc.inputs)
      if (in.defined() && in.storage() == outs[o].storage()) {
        outs[o] = outs[o].clone();
        break;
      }
  }
  return outs;
}

Graph fold_constants(Graph g, const PassContext& ctx) {
  std::vector<bool> folded(g.nodes().size(), false);
  int count = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (!n.def || n.def->has(kNondeterministic) || n.outputs.empty()) continue;
    std::optional<std::vector<Tensor>> outs;
    std::string rule = "FoldConstants/" + n.op;
    if (n.def->has(kShapeOnly) && (n.op == "Shape" || n.op == "Size") &&
        !constant_of(g, n.inputs[0])) {
      // Shape/Size read only the type; data-carrying shape-only ops (EyeLike) fold below.
      if (std::optional<Tensor> t = fold_shape_op(g, n)) outs = std::vector<Tensor>{*t};
      rule = "FoldConstants/static " + n.op;
    } else {
      try {
        outs = evaluate(g, n);
      } catch (const Error&) {  // e.g. an output type whose element count overflows
        continue;
      }
    }
    if (!outs) continue;
    // The same values become initializers: names (graph outputs included) stay as they were.
    std::vector<ValueId> outputs = n.outputs;
    for (size_t o = 0; o < outputs.size(); ++o)
      if (outputs[o] != kNoValue) g.set_initializer(outputs[o], std::move((*outs)[o]));
    folded[i] = true;
    ++count;
    ctx.note(rule);
  }
  if (count) g.remove_nodes(folded);
  return g;
}

}  // namespace

void register_fold_constants(PassRegistry& r) {
  r.add({"FoldConstants", fold_constants,
         "evaluates nodes whose inputs are all constants, and Shape/Size of static shapes"});
}

}  // namespace pto::passes
