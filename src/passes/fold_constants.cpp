// FoldConstants: evaluates at compile time every node whose inputs are all constants, with the
// reference kernel of its op, and turns its outputs into initializers (same values, same names).
// Shape and Size of a value whose type has a fully static shape fold too, without data, so that
// Shape -> Gather -> Concat -> Reshape chains become a constant shape. One forward sweep: a folded
// output is a constant for the nodes after it. Skipped: ops marked kNondeterministic, results
// over kMaxFoldedBytes, sequences and optionals, and any node whose kernel throws (the node stays;
// the run reports it). PassContext::max_folded_bytes lowers the size limit.
#include <algorithm>

#include "passes/passes.h"
#include "passes/rewrite_util.h"
#include "pto/op_registry.h"
#include "pto/reference.h"

namespace pto::passes {
namespace {

constexpr size_t kMaxFoldedBytes = size_t{64} << 20;

// Shape (with start/end, clamped as the op does) or Size of an input of static shape `dims`.
std::optional<Tensor> fold_shape_op(const Node& n, const std::optional<Dims>& dims) {
  if (n.inputs.size() != 1 || n.outputs.size() != 1 || !dims) return std::nullopt;
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

// The node's outputs computed by its reference kernel on `inputs` (every one known; nullptr only
// for a missing optional input), each at most `max_bytes` (`out_types`: the inferred output
// types, to refuse before computing what is known to be too large); nullopt when it cannot be
// folded.
std::optional<std::vector<Tensor>> evaluate(const Node& n, const std::vector<const Tensor*>& inputs,
                                            const std::vector<TensorType>& out_types,
                                            size_t max_bytes) {
  const reference::Kernel* kernel = reference::KernelRegistry::global().find(n.op);
  if (!kernel || !n.domain.empty()) return std::nullopt;
  for (const TensorType& t : out_types)
    if (t.shape && is_static(*t.shape) &&
        static_cast<size_t>(checked_numel(to_dims(*t.shape))) * dtype_size(t.dtype) > max_bytes)
      return std::nullopt;
  reference::KernelContext kc{n, {}, n.outputs.size()};
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (n.inputs[i] == kNoValue) {
      kc.inputs.emplace_back();
      continue;
    }
    if (!inputs[i]) return std::nullopt;
    kc.inputs.push_back(inputs[i]->contiguous());
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
    if (!outs[o].defined() || outs[o].nbytes() > max_bytes) return std::nullopt;
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

// evaluate() on g's constants and inferred types.
std::optional<std::vector<Tensor>> evaluate(const Graph& g, const Node& n, size_t max_bytes) {
  std::vector<const Tensor*> inputs;
  for (ValueId v : n.inputs) inputs.push_back(v == kNoValue ? nullptr : constant_of(g, v));
  std::vector<TensorType> out_types;
  for (ValueId o : n.outputs) out_types.push_back(o == kNoValue ? TensorType{} : g.value(o).type);
  return evaluate(n, inputs, out_types, max_bytes);
}

// An If whose cond is a constant becomes the branch it takes: the branch's nodes are inserted
// before position `pos` (the If's), its captures read the If's captured inputs, its constants
// become initializers, and each If output is an Identity of the branch output (EliminateNoOps
// removes those). Returns the number of nodes inserted; the caller removes the If.
size_t inline_if(Graph& g, size_t pos, bool cond) {
  const Node n = g.nodes()[pos];
  // The If's outputs move to the Identities below; the If itself is removed by the caller.
  for (ValueId& o : g.mutable_nodes()[pos].outputs) {
    if (o != kNoValue) g.value(o).producer = -1;
    o = kNoValue;
  }
  const Graph& branch = n.attrs.get_graph(cond ? "then_branch" : "else_branch");
  const std::vector<ValueId> outs = inline_subgraph(
      g, pos, branch, std::vector<ValueId>(n.inputs.begin() + 1, n.inputs.end()), n.name);
  size_t at = pos + branch.nodes().size();
  for (size_t o = 0; o < n.outputs.size(); ++o)
    if (n.outputs[o] != kNoValue)
      g.insert_node(at++, "Identity", {outs[o]}, {n.outputs[o]}, {}, cat(n.name, "/output_", o));
  return at - pos;
}

// One sweep over the nodes in order; returns how many it folded.
int fold_once(Graph& g, const PassContext& ctx) {
  std::vector<bool> folded(g.nodes().size(), false);
  int count = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (folded[i] || !n.def || n.def->has(kNondeterministic) || n.outputs.empty()) continue;
    // Initializers hold tensors: a sequence or an optional is never a constant.
    if (std::any_of(n.outputs.begin(), n.outputs.end(),
                    [&](ValueId v) { return v != kNoValue && !g.value(v).type.is_tensor(); }))
      continue;
    const Tensor* cond = n.op == "If" && n.domain.empty() ? constant_of(g, n.inputs[0]) : nullptr;
    if (cond && cond->numel() == 1 && cond->dtype() == DType::kBool) {
      const size_t added = inline_if(g, i, cond->contiguous().data<bool>()[0]);
      folded.insert(folded.begin() + static_cast<std::ptrdiff_t>(i), added, false);
      folded[i + added] = true;
      ++count;
      ctx.note("FoldConstants/If with a constant cond");
      --i;  // the branch's nodes, now at i.., are visited next (and folded when constant)
      continue;
    }
    std::optional<std::vector<Tensor>> outs;
    std::string rule = "FoldConstants/" + n.op;
    if (n.def->has(kShapeOnly) && (n.op == "Shape" || n.op == "Size") &&
        !constant_of(g, n.inputs[0])) {
      // Shape/Size read only the type; data-carrying shape-only ops (EyeLike) fold below.
      if (std::optional<Tensor> t = fold_shape_op(n, static_dims(g, n.inputs[0])))
        outs = std::vector<Tensor>{*t};
      rule = "FoldConstants/static " + n.op;
    } else {
      try {
        outs = evaluate(g, n, ctx.max_folded_bytes ? ctx.max_folded_bytes : kMaxFoldedBytes);
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
  return count;
}

// Sweeps until nothing folds, inferring types between sweeps: a folded value can make a shape
// static only once the types are inferred again (Silero VAD's Pad widths, computed by a chain of
// Concat/Reshape/Slice, give the STFT Conv a static shape, whose Shape then folds, and with it
// the cond of an If on that shape, which then becomes its branch). Capped: each sweep after the
// first costs an inference of the whole graph.
Graph fold_constants(Graph g, const PassContext& ctx) {
  constexpr int kMaxSweeps = 8;
  for (int sweep = 0; sweep < kMaxSweeps && fold_once(g, ctx) > 0; ++sweep) {
    if (sweep + 1 == kMaxSweeps) break;
    try {
      infer_types(g);
    } catch (const Error&) {
      break;  // the pass manager's check after the pass reports it
    }
  }
  return g;
}

}  // namespace

void register_fold_constants(PassRegistry& r) {
  r.add({"FoldConstants", fold_constants,
         "evaluates nodes whose inputs are all constants, and Shape/Size of static shapes"});
}

}  // namespace pto::passes

namespace pto {

NodeFolder constant_folder(size_t max_bytes) {
  return
      [max_bytes](const Node& n, const std::vector<TensorType>& in_types,
                  const std::vector<const Tensor*>& constants,
                  const std::vector<TensorType>& out_types) -> std::optional<std::vector<Tensor>> {
        if (!n.def || n.def->has(kNondeterministic) || n.outputs.empty() || n.op == "If") return {};
        for (const TensorType& t : out_types)
          if (!t.is_tensor()) return {};
        if ((n.op == "Shape" || n.op == "Size") && n.domain.empty() && in_types.size() == 1) {
          const std::optional<Shape>& s = in_types[0].shape;
          std::optional<Tensor> t = passes::fold_shape_op(
              n, s && is_static(*s) ? std::optional<Dims>(to_dims(*s)) : std::nullopt);
          if (t) return std::vector<Tensor>{*t};
          if (!constants.empty() && constants[0] == nullptr) return {};
        }
        return passes::evaluate(n, constants, out_types, max_bytes);
      };
}

}  // namespace pto
