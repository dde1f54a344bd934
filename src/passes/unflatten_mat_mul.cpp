// UnflattenMatMul: undoes the flattening torch.export writes around a Linear layer on a 3-D (or
// higher) input,
//
//   Reshape(Gemm(Reshape(x, [-1, K]), W, C), [d0, .., dn-2, N])   (or MatMul(., W))
//     -> Add(MatMul(x, W), C)
//
// when the second Reshape restores exactly x's leading dimensions (its known entries equal x's,
// and at most one -1 stands where x's one unknown or symbolic dimension is; or, for a target
// computed from Shape() at run time, its inferred shape is x's leading dims, symbols included, as
// the TorchScript exporter writes every Linear of a dynamic model). x may also merge more than
// its last dim into K ([b, s, h, d] to [b*s, h*d], the attention output's projection): the first
// Reshape then stays, as Reshape(x, [0, .., 0, K]). MatMul broadcasts over
// the leading dimensions, so the result is the same, and the value keeps its symbolic batch
// instead of the "?" that flattening leaves: shapes stay known for the rest of the pipeline
// (composite recognition, epilogues) and two Reshapes per layer disappear. A Gemm with transB
// stays: MatMul would need a transposed copy of the weight, which costs memory (the model keeps
// its own copy) and buys nothing the Gemm epilogue through views does not already fuse.
//
// The batched form torch writes for a matmul of two 4-D (or higher) tensors,
//
//   Reshape(MatMul(Reshape(a, [-1, m, k]), Reshape(b, [-1, k, n])), [d0, .., m, n])
//     -> MatMul(a, b)
//
// when a and b have the same leading dims, each flattened operand is exactly [product of them,
// last two dims], and the result is put back into those leading dims: attention's
// q @ k^T and p @ v keep their [batch, heads, ...] form for RecognizeAttention.
#include "passes/passes.h"
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

// Whether Reshape target t puts back the leading dimensions `lead` with n columns.
bool restores_leading(const std::vector<int64_t>& t, const Shape& lead, int64_t n) {
  if (t.size() != lead.size() + 1 || t.back() != n) return false;
  int wild = 0;
  for (size_t i = 0; i < lead.size(); ++i) {
    if (lead[i].is_known()) {
      if (t[i] != lead[i].value) return false;
    } else if (t[i] == -1) {
      ++wild;
    } else {
      return false;
    }
  }
  return wild <= 1;
}

// Whether a Reshape whose target is computed at run time gives the leading dimensions `lead`
// with n columns, by its inferred type: each dimension known or the same symbol ([batch*seq, N]
// back to [batch, seq, N] with the target Concat(Shape(x)[0], Shape(x)[1], N)).
bool restores_type(const TensorType& y, const Shape& lead, const Dim& n) {
  if (!y.shape || y.shape->size() != lead.size() + 1 || !same_dim(y.shape->back(), n)) return false;
  for (size_t i = 0; i < lead.size(); ++i)
    if (!same_dim((*y.shape)[i], lead[i])) return false;
  return true;
}

// How many leading dims of x stay when its trailing ones are merged into k columns: the first j
// with x[j] * .. * x[rank-1] == k, all known. 0 when there is none.
size_t leading_rank(const Shape& x, int64_t k) {
  int64_t tail = 1;
  for (size_t j = x.size(); j-- > 1;) {
    if (!x[j].is_known() || __builtin_mul_overflow(tail, x[j].value, &tail) || tail > k) return 0;
    if (tail == k) return j;
  }
  return 0;
}

// The input of a Reshape that merges the leading dims of a rank >= 4 value into one: v =
// Reshape(x) with v [prod(x[:-2]), x[-2], x[-1]]. kNoValue otherwise.
ValueId merged_batch(const Graph& g, ValueId v) {
  const Node* r = producer(g, v);
  if (!r || r->op != "Reshape" || r->outputs.size() != 1) return kNoValue;
  const auto &xs = g.value(r->inputs[0]).type.shape, &vs = g.value(v).type.shape;
  if (!xs || xs->size() < 4 || !vs || vs->size() != 3) return kNoValue;
  const size_t rank = xs->size();
  Dim batch(1);
  for (size_t i = 0; i + 2 < rank; ++i) batch = dim_mul(batch, (*xs)[i]);
  if (!same_dim((*vs)[0], batch) || !same_dim((*vs)[1], (*xs)[rank - 2]) ||
      !same_dim((*vs)[2], (*xs)[rank - 1]))
    return kNoValue;
  return r->inputs[0];
}

// Reshape(MatMul(merged a, merged b)) -> MatMul(a, b); see the header.
int unflatten_batched(Graph& g, const PassContext& ctx) {
  const ReaderIndex readers(g);
  std::vector<bool> remove(g.nodes().size(), false);
  int fired = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& m = g.nodes()[i];
    if (m.op != "MatMul" || m.inputs.size() != 2 || m.outputs.size() != 1) continue;
    const ValueId a = merged_batch(g, m.inputs[0]), b = merged_batch(g, m.inputs[1]);
    if (a == kNoValue || b == kNoValue) continue;
    const Shape &as = *g.value(a).type.shape, &bs = *g.value(b).type.shape;
    if (as.size() != bs.size()) continue;
    const int32_t un = readers.single_reader(m.outputs[0]);
    if (un < 0 || g.nodes()[un].op != "Reshape") continue;
    const auto& ys = g.value(g.nodes()[un].outputs[0]).type.shape;
    const auto& ms = g.value(m.outputs[0]).type.shape;
    if (!ys || ys->size() != as.size() || !ms || ms->size() != 3) continue;
    bool ok = same_dim(ys->end()[-2], (*ms)[1]) && same_dim(ys->back(), (*ms)[2]);
    for (size_t d = 0; ok && d + 2 < as.size(); ++d)
      ok = same_dim(as[d], bs[d]) && same_dim(as[d], (*ys)[d]);
    if (!ok) continue;
    // The flattening Reshapes go when the MatMul was their only reader.
    for (ValueId flat : m.inputs)
      if (readers.single_reader(flat) >= 0) remove[g.value(flat).producer] = true;
    remove[i] = true;
    retarget(g.mutable_nodes()[un], "MatMul", {a, b}, with_precision_of(m));
    ctx.note("UnflattenMatMul/Batched");
    ++fired;
  }
  g.remove_nodes(remove);
  return fired;
}

Graph unflatten_mat_mul(Graph g, const PassContext& ctx) {
  unflatten_batched(g, ctx);
  // Readers as the pass found them. A rewrite moves readers only among the nodes it matched (the
  // MatMul and the two Reshapes); a later match that meets such a stale reader fails its op and
  // input checks exactly as it would on the rewritten graph.
  const ReaderIndex readers(g);
  std::vector<bool> remove(g.nodes().size(), false);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& flat = g.nodes()[i];
    if (flat.op != "Reshape" || flat.outputs.size() != 1) continue;
    const TensorType& xt = g.value(flat.inputs[0]).type;
    const TensorType& ft = g.value(flat.outputs[0]).type;
    if (!xt.shape || xt.shape->size() < 3 || !ft.shape || ft.shape->size() != 2) continue;
    const Dim k = ft.shape->back();
    const size_t lead_rank = k.is_known() ? leading_rank(*xt.shape, k.value) : 0;
    if (lead_rank == 0) continue;
    const Shape lead(xt.shape->begin(), xt.shape->begin() + static_cast<std::ptrdiff_t>(lead_rank));
    const int32_t mm = readers.single_reader(flat.outputs[0]);
    if (mm < 0) continue;
    const Node& m = g.nodes()[mm];
    const bool gemm = m.op == "Gemm";
    if ((!gemm && m.op != "MatMul") || m.inputs[0] != flat.outputs[0] || m.outputs.size() != 1)
      continue;
    if (gemm && (m.attrs.get_int("transA", 0) != 0 || m.attrs.get_float("alpha", 1.0) != 1.0 ||
                 m.attrs.get_float("beta", 1.0) != 1.0))
      continue;
    const bool trans_b = gemm && m.attrs.get_int("transB", 0) != 0;
    const ValueId w = m.inputs[1];
    const TensorType& wt = g.value(w).type;
    if (!wt.shape || wt.shape->size() != 2) continue;
    const Dim n = (*wt.shape)[trans_b ? 0 : 1];
    if (!n.is_known()) continue;
    // A transposed weight would need a transposed copy: one more copy of every Linear weight
    // (the model keeps its own), while Gemm reads it transposed in place. Left as it is.
    if (trans_b) continue;
    ValueId c = gemm && m.inputs.size() > 2 ? m.inputs[2] : kNoValue;
    if (c != kNoValue) {  // C must be a row of N (or a scalar) to broadcast the same way
      const TensorType& ct = g.value(c).type;
      if (!ct.shape || ct.shape->size() > 2 ||
          (ct.shape->size() == 2 && !((*ct.shape)[0] == Dim(1))))
        continue;
    }
    const int32_t un = readers.single_reader(m.outputs[0]);
    if (un < 0 || g.nodes()[un].op != "Reshape") continue;
    const Node& unflat = g.nodes()[un];
    auto target = constant_ints(g, unflat, 1);
    const bool restores = target ? unflat.attrs.get_int("allowzero", 0) == 0 &&
                                       restores_leading(*target, lead, n.value)
                                 : restores_type(g.value(unflat.outputs[0]).type, lead, n);
    if (!restores) continue;

    // x itself when only its last dim is merged; else x with its trailing dims merged into k
    // (the attention output [batch, seq, heads, dh] -> [batch, seq, heads * dh]): the flattening
    // Reshape stays with the target [0, .., 0, k], which copies the leading dims at run time.
    ValueId x = flat.inputs[0];
    if (lead_rank + 1 < xt.shape->size()) {
      std::vector<int64_t> t(lead_rank, 0);
      t.push_back(k.value);
      Node& merge = g.mutable_nodes()[i];
      merge.inputs.resize(2);
      merge.inputs[1] = g.add_constant(
          merge.name + "_shape", Tensor::from_vector<int64_t>(t, {static_cast<int64_t>(t.size())}));
      merge.attrs = {};
      x = merge.outputs[0];
    } else {
      remove[i] = true;
    }
    const ValueId weight = w;
    const ValueId product = m.outputs[0];
    retarget(g.mutable_nodes()[mm], "MatMul", {x, weight}, with_precision_of(m));
    Node& last = g.mutable_nodes()[un];
    if (c != kNoValue)
      retarget(last, "Add", {product, c});
    else
      retarget(last, "Identity", {product});
    ctx.note(gemm ? "UnflattenMatMul/Gemm" : "UnflattenMatMul/MatMul");
  }
  g.remove_nodes(remove);
  return g;
}

}  // namespace

void register_unflatten_mat_mul(PassRegistry& r) {
  r.add({"UnflattenMatMul", unflatten_mat_mul,
         "MatMul on the unflattened input instead of Reshape-Gemm-Reshape (Linear on 3-D inputs)"});
}

}  // namespace pto::passes
