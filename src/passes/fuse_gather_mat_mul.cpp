// FuseGatherMatMul: a product of each row by a matrix gathered for it, as exporters write a
// mixture of experts' layer with static shapes (transformers' "batched_mm" experts):
//
//   Squeeze(MatMul(Gather(W [E, N, K], I [S], axis 0), Unsqueeze(X [S, K], -1)), -1)
//     -> GatherMatMul(X, W, I)                      Y[s] = W[I[s]] X[s]
//   Squeeze(MatMul(Unsqueeze(X [S, K], 1), Gather(W [E, K, N], I [S], axis 0)), 1)
//     -> GatherMatMul(X, W, I) {trans_w = 1}        Y[s] = X[s] W[I[s]]
//
// The gathered [S, N, K] copy of the weights is never made, and the CPU kernel multiplies each
// expert's rows in one GEMM. W must be a constant (the experts' weights). Level 2: the GEMM sums
// in its own order. The Gather and MatMul left unread go with EliminateDeadCode.
#include "passes/passes.h"
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

const Node* producer_of(const Graph& g, ValueId v) {
  for (const Node& n : g.nodes())
    for (ValueId o : n.outputs)
      if (o == v) return &n;
  return nullptr;
}

size_t rank_of(const Graph& g, ValueId v) {
  const TensorType& t = g.value(v).type;
  return t.shape ? t.shape->size() : 0;
}

// The one axis a Squeeze or Unsqueeze node names (as a constant input), normalized to `rank`.
std::optional<int64_t> single_axis(const Graph& g, const Node& n, size_t rank) {
  const auto axes = constant_ints(g, n, 1);
  if (!axes || axes->size() != 1) return std::nullopt;
  const int64_t a = (*axes)[0];
  return a < 0 ? a + static_cast<int64_t>(rank) : a;
}

// Gather(W, I) along axis 0 with W a constant 3-D float32 tensor and I 1-D: (W, I).
std::optional<std::pair<ValueId, ValueId>> gathered_weight(const Graph& g, ValueId v) {
  const Node* n = producer_of(g, v);
  if (!n || n->op != "Gather" || n->inputs.size() != 2 || n->attrs.get_int("axis", 0) != 0)
    return std::nullopt;
  const Tensor* w = constant_of(g, n->inputs[0]);
  if (!w || w->rank() != 3 || w->dtype() != DType::kF32 || rank_of(g, n->inputs[1]) != 1)
    return std::nullopt;
  const DType it = dtype_of_value(g, n->inputs[1]);
  if (it != DType::kI64 && it != DType::kI32) return std::nullopt;
  return std::make_pair(n->inputs[0], n->inputs[1]);
}

// Unsqueeze(X, axis) of a 2-D float32 X: X.
std::optional<ValueId> unsqueezed(const Graph& g, ValueId v, int64_t axis) {
  const Node* n = producer_of(g, v);
  if (!n || n->op != "Unsqueeze" || n->inputs.size() != 2 || rank_of(g, n->inputs[0]) != 2 ||
      dtype_of_value(g, n->inputs[0]) != DType::kF32)
    return std::nullopt;
  if (single_axis(g, *n, 3) != axis) return std::nullopt;
  return n->inputs[0];
}

Graph fuse_gather_mat_mul(Graph g, const PassContext& ctx) {
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& sq = g.nodes()[i];
    if (sq.op != "Squeeze" || sq.inputs.size() != 2 || sq.outputs.size() != 1) continue;
    const Node* mm = producer_of(g, sq.inputs[0]);
    if (!mm || mm->op != "MatMul" || mm->inputs.size() != 2 || mm->attrs.has("precision") ||
        rank_of(g, sq.inputs[0]) != 3)
      continue;
    const std::optional<int64_t> axis = single_axis(g, sq, 3);
    std::optional<std::pair<ValueId, ValueId>> wi;
    std::optional<ValueId> x;
    int64_t trans = 0;
    if (axis == 2) {  // [S, N, K] x [S, K, 1]
      wi = gathered_weight(g, mm->inputs[0]);
      x = unsqueezed(g, mm->inputs[1], 2);
    } else if (axis == 1) {  // [S, 1, K] x [S, K, N]
      wi = gathered_weight(g, mm->inputs[1]);
      x = unsqueezed(g, mm->inputs[0], 1);
      trans = 1;
    }
    if (!wi || !x) continue;
    const ValueId w = wi->first, idx = wi->second, xv = *x;
    Attributes a;
    a.set("trans_w", trans);
    retarget(g.mutable_nodes()[i], "GatherMatMul", {xv, w, idx}, a);
    g.mutable_nodes()[i].domain = "pto";
    ctx.note("FuseGatherMatMul");
  }
  return g;
}

}  // namespace

void register_fuse_gather_mat_mul(PassRegistry& r) {
  r.add({"FuseGatherMatMul", fuse_gather_mat_mul,
         "a MatMul of rows by matrices gathered per row (a mixture of experts' layer) as one "
         "GatherMatMul"});
}

}  // namespace pto::passes
