// FoldAttentionHeads: the head splits and the head merge around a 4-D Attention become its 3-D
// form (ONNX's packed heads), so that the CPU kernel reads Q, K and V, and writes Y, in the
// projections' [batch, seq, heads * d] layout with row strides instead of four transposing copies:
//
//   Attention(T(R(q, [B, S, Hq, D])), T(R(k, ..Hkv..)), T(R(v, ..)) [, mask]) -> y
//   Reshape(Transpose(y, [0, 2, 1, 3]), [B, S, Hq * Dv]) -> out
//     -> Attention(q, k, v [, mask], q_num_heads = Hq, kv_num_heads = Hkv) -> out
//
// (T: Transpose with perm [0, 2, 1, 3]; R: a Reshape of a 3-D [B, S, H * D] tensor.) When q, k
// and v are the three outputs, in order, of one Split of a 3-D x on its last axis
// (MergeSiblingMatMuls' merged projection, GPT-2's c_attn), the Split goes too: Attention(x, x, x
// [, mask]) with qkv_split = the three widths, read in place; a 2-D [B * S, width] x whose parts
// are each reshaped to [B, S, w] (torch's import of a Linear on rows) is reshaped once instead.
// Only an Attention with a mask or none (no KV cache, one output) whose output is read by that head
// merge alone; the Transposes and Reshapes left unread go with EliminateDeadCode. Every element is
// the same sum in the same order, so the bits do not change.
#include "ir/ops/op_params.h"
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

bool is_head_perm(const Node& n) {
  return n.op == "Transpose" && n.domain.empty() && n.inputs.size() == 1 && n.attrs.has("perm") &&
         n.attrs.get_ints("perm") == std::vector<int64_t>{0, 2, 1, 3};
}

bool is_perm(const Node* n, const std::vector<int64_t>& perm) {
  return n && n->op == "Transpose" && n->domain.empty() && n->inputs.size() == 1 &&
         n->attrs.has("perm") && n->attrs.get_ints("perm") == perm;
}

bool dims_match(const std::optional<Shape>& s, std::initializer_list<const Dim*> dims) {
  if (!s || s->size() != dims.size()) return false;
  size_t i = 0;
  for (const Dim* d : dims)
    if (!same_dim((*s)[i++], *d)) return false;
  return true;
}

// u when v is torch's batched K^T and back, which leaves u as it was:
//   Transpose(Reshape(Transpose(Reshape(u, [B*H, S, D]), [0, 2, 1]), [B, H, D, S]), [0, 1, 3, 2])
// (GPT-2's export: SDPA's K transposed for the score product, RecognizeAttention's undoing it).
ValueId skip_transposed_round_trip(const Graph& g, ValueId v) {
  const Node* t2 = producer(g, v);
  if (!is_perm(t2, {0, 1, 3, 2})) return v;
  const Node* r2 = producer(g, t2->inputs[0]);
  if (!r2 || r2->op != "Reshape" || !r2->domain.empty()) return v;
  const Node* t1 = producer(g, r2->inputs[0]);
  if (!is_perm(t1, {0, 2, 1})) return v;
  const Node* r1 = producer(g, t1->inputs[0]);
  if (!r1 || r1->op != "Reshape" || !r1->domain.empty()) return v;
  const ValueId u = r1->inputs[0];
  const auto& us = g.value(u).type.shape;
  if (!us || us->size() != 4) return v;
  const Dim &b = (*us)[0], &h = (*us)[1], &s = (*us)[2], &d = (*us)[3];
  // [X, S, D] from [B, H, S, D] merges B and H; then [B, H, D, S] splits them back.
  const auto& r1s = g.value(r1->outputs[0]).type.shape;
  if (!r1s || r1s->size() != 3 || !same_dim((*r1s)[1], s) || !same_dim((*r1s)[2], d) ||
      !dims_match(g.value(r2->outputs[0]).type.shape, {&b, &h, &d, &s}))
    return v;
  return u;
}

// The 3-D [B, S, H * D] value that `v` = Transpose(Reshape(x, [B, S, H, D])) splits into heads,
// and H; nullopt for anything else.
std::optional<std::pair<ValueId, int64_t>> head_split_of(const Graph& g, ValueId v) {
  const Node* t = producer(g, skip_transposed_round_trip(g, v));
  if (!t || !is_head_perm(*t)) return std::nullopt;
  const Node* r = producer(g, t->inputs[0]);
  if (!r || r->op != "Reshape" || !r->domain.empty() || r->inputs.empty()) return std::nullopt;
  const ValueId x = r->inputs[0];
  const auto &xs = g.value(x).type.shape, &rs = g.value(r->outputs[0]).type.shape;
  if (!xs || !rs || xs->size() != 3 || rs->size() != 4 || !same_dim((*xs)[0], (*rs)[0]) ||
      !same_dim((*xs)[1], (*rs)[1]) || !(*xs)[2].is_known() || !(*rs)[2].is_known() ||
      !(*rs)[3].is_known() || (*xs)[2].value != (*rs)[2].value * (*rs)[3].value)
    return std::nullopt;
  return std::pair{x, (*rs)[2].value};
}

// The Reshape node merging y's heads back, Reshape(Transpose(y, [0, 2, 1, 3]), shape), when it
// and its Transpose are y's only readers; the Transpose's index in `transpose`. The shape is
// [B, S, H * Dv], or any other (GPT-2's [B * S, H * Dv]) given as a constant without zeros, which
// then reshapes the 3-D result (a view).
int32_t head_merge_of(Rewrite& rw, ValueId y, int32_t& transpose) {
  const Graph& g = rw.graph();
  transpose = rw.readers().single_reader(y);
  if (transpose < 0 || !is_head_perm(g.nodes()[static_cast<size_t>(transpose)])) return -1;
  const ValueId t = g.nodes()[static_cast<size_t>(transpose)].outputs[0];
  const int32_t r = rw.readers().single_reader(t);
  if (r < 0) return -1;
  const Node& n = g.nodes()[static_cast<size_t>(r)];
  if (n.op != "Reshape" || !n.domain.empty() || n.inputs[0] != t || g.is_output(t)) return -1;
  const auto &ts = g.value(t).type.shape, &rs = g.value(n.outputs[0]).type.shape;
  if (!ts || !rs || ts->size() != 4 || !(*ts)[2].is_known() || !(*ts)[3].is_known()) return -1;
  if (rs->size() == 3 && same_dim((*ts)[0], (*rs)[0]) && same_dim((*ts)[1], (*rs)[1]) &&
      (*rs)[2].is_known() && (*rs)[2].value == (*ts)[2].value * (*ts)[3].value)
    return r;
  const std::optional<std::vector<int64_t>> shape = constant_ints(g, n, 1);
  if (!shape || std::find(shape->begin(), shape->end(), 0) != shape->end()) return -1;
  return r;
}

// The Split on the last axis whose outputs are q, k and v, in that order: of a 3-D x, or of a 2-D
// [B * S, width] x with q, k and v Reshapes of its outputs to [B, S, w] (torch's import of a Linear
// on rows; `unflattened` says which). nullptr for anything else.
const Node* qkv_split_of(const Graph& g, const ValueId (&qkv)[3], bool& unflattened) {
  ValueId parts[3];
  const Node* first = producer(g, qkv[0]);
  unflattened = first && first->op == "Reshape" && first->domain.empty();
  for (size_t p = 0; p < 3; ++p) {
    parts[p] = qkv[p];
    if (!unflattened) continue;
    const Node* r = producer(g, qkv[p]);
    if (!r || r->op != "Reshape" || !r->domain.empty()) return nullptr;
    parts[p] = r->inputs[0];
  }
  const Node* s = producer(g, parts[0]);
  if (!s || s->op != "Split" || !s->domain.empty() || s->outputs.size() != 3 ||
      s->outputs[0] != parts[0] || s->outputs[1] != parts[1] || s->outputs[2] != parts[2])
    return nullptr;
  const auto& xs = g.value(s->inputs[0]).type.shape;
  const int64_t axis = s->attrs.get_int("axis", 0);
  if (!xs || xs->size() != (unflattened ? 2u : 3u) ||
      (axis != static_cast<int64_t>(xs->size()) - 1 && axis != -1))
    return nullptr;
  if (!unflattened) return s;
  // Each part [M, w] became [B, S, w]: the same B and S for all three.
  const Shape& q = *g.value(qkv[0]).type.shape;
  for (const ValueId v : qkv) {
    const Shape& vs = *g.value(v).type.shape;
    if (!same_dim(vs[0], q[0]) || !same_dim(vs[1], q[1])) return nullptr;
  }
  return s;
}

bool fold_heads(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const Node& n = g.nodes()[i];
  if (n.op != "Attention" || !n.domain.empty() || n.inputs.size() < 3 || n.inputs.size() > 4 ||
      n.outputs.size() != 1 || n.attrs.has("q_num_heads") || n.attrs.has("kv_num_heads") ||
      n.attrs.has("qkv_split"))
    return false;
  const auto& ys = g.value(n.outputs[0]).type.shape;
  if (!ys || ys->size() != 4 || !(*ys)[1].is_known() || !(*ys)[3].is_known()) return false;
  std::optional<std::pair<ValueId, int64_t>> parts[3];
  for (size_t p = 0; p < 3; ++p)
    if (!(parts[p] = head_split_of(g, n.inputs[p]))) return false;
  if (parts[1]->second != parts[2]->second) return false;
  int32_t transpose = -1;
  const int32_t merge = head_merge_of(rw, n.outputs[0], transpose);
  if (merge < 0) return false;

  std::vector<ValueId> inputs = {parts[0]->first, parts[1]->first, parts[2]->first};
  Attributes attrs = n.attrs;
  attrs.set("q_num_heads", parts[0]->second);
  attrs.set("kv_num_heads", parts[1]->second);
  // A 2-D merged x gets a Reshape to [B, S, width] (a view), put in front of the Attention last.
  ValueId flat = kNoValue;
  std::vector<int64_t> unflatten;
  bool unflattened = false;
  const ValueId qkv[3] = {inputs[0], inputs[1], inputs[2]};
  if (const Node* s = qkv_split_of(g, qkv, unflattened)) {
    std::vector<int64_t> widths;
    for (const ValueId v : inputs) widths.push_back(g.value(v).type.shape->back().value);
    const Shape q = *g.value(inputs[0]).type.shape;
    const int64_t width = widths[0] + widths[1] + widths[2];
    if (!unflattened) {
      inputs.assign(3, s->inputs[0]);
    } else if (q[0].is_known() || q[1].is_known()) {  // one of B and S may be -1
      flat = s->inputs[0];
      unflatten = {q[0].is_known() ? q[0].value : -1, q[1].is_known() ? q[1].value : -1, width};
    }
    if (!unflattened || flat != kNoValue) {
      attrs.set("qkv_split", widths);
      ctx.note("FoldAttentionHeads/Split");
    }
  }
  if (n.inputs.size() > 3) inputs.push_back(n.inputs[3]);
  const Node& m = g.nodes()[static_cast<size_t>(merge)];
  const ValueId out = m.outputs[0];
  rw.remove(static_cast<size_t>(transpose));
  // Copies: add_value may move the values.
  const Shape y4 = *ys;  // [B, Hq, Sq, Dv]
  const Shape ms = *g.value(out).type.shape;
  if (ms.size() == 3 && same_dim(ms[0], y4[0]) && same_dim(ms[1], y4[2])) {
    rw.remove(static_cast<size_t>(merge));
    rw.move_output(i, 0, out);
  } else {  // the merge's Reshape stays, on the 3-D result
    const Shape y3 = {y4[0], y4[2], Dim(y4[1].value * y4[3].value)};
    const ValueId y = g.add_value(g.unique_name(g.value(n.outputs[0]).name + "_heads"),
                                  TensorType{dtype_of_value(g, out), y3});
    g.mutable_nodes()[static_cast<size_t>(merge)].inputs[0] = y;
    rw.move_output(i, 0, y);
  }
  const Shape q = *g.value(inputs[0]).type.shape;
  ValueId x3 = kNoValue;
  if (flat != kNoValue) {
    x3 = g.add_value(g.unique_name(g.value(flat).name + "_rows"),
                     TensorType{dtype_of_value(g, flat), Shape{q[0], q[1], Dim(unflatten[2])}});
    inputs[0] = inputs[1] = inputs[2] = x3;
  }
  Node& a = g.mutable_nodes()[i];
  retarget(a, "Attention", std::move(inputs), std::move(attrs), a.opset);
  ctx.note("FoldAttentionHeads/Heads");
  if (flat != kNoValue) {  // last: the Attention moves to i + 1
    Tensor shape = Tensor::empty(DType::kI64, {3});
    std::copy(unflatten.begin(), unflatten.end(), shape.data<int64_t>());
    const ValueId sid =
        g.add_constant(g.unique_name(g.value(flat).name + "_rows_shape"), std::move(shape));
    rw.insert(i, "Reshape", {flat, sid}, {x3}, {}, g.value(x3).name);
  }
  return true;
}

Graph fold_attention_heads(Graph g, const PassContext& ctx) {
  // Dead readers (the Shape nodes an exporter computed a head merge's target from, folded since)
  // would hide a value's one reader: dead code goes first, unreported (EliminateDeadCode follows).
  const PassContext quiet{ctx.level, ctx.mixed_precision};
  g = PassRegistry::global().find("EliminateDeadCode")->run(std::move(g), quiet);
  apply_rules(g, {{nullptr, fold_heads}}, ctx);
  return g;
}

}  // namespace

void register_fold_attention_heads(PassRegistry& r) {
  r.add({"FoldAttentionHeads", fold_attention_heads,
         "reads Attention's Q, K and V and writes its output in the [batch, seq, heads * d] "
         "layout (3-D form), in place of the head-split transposes; a Q/K/V Split folds in"});
}

}  // namespace pto::passes
