// RecognizeAttention: finds scaled dot-product attention spelled out in primitive ops (as
// torch.export, the ONNX exporters and hand-written model code produce it) and replaces it by one
// ONNX Attention op, so the fusion and backends see one op and the [batch, heads, q, kv] score
// tensor is never written to memory:
//
//   MatMul(Softmax(mask(softcap(MatMul(Q, Kt) * scale)), axis=-1) [guarded], V)
//     -> Attention(Q, K, V [, attn_mask]) {scale [, is_causal] [, softcap]}
//
// Matching is backwards from the root MatMul:
// - the probabilities may be guarded as torch's SDPA decomposition writes it,
//   Where(Not(Equal(ReduceMax(s, -1), -inf)), Softmax(s), 0), or as the ONNX exporter does,
//   Where(IsNaN(Softmax(s)), 0, Softmax(s)) (a fully masked row gives 0, which is what Attention
//   computes for it);
// - Softmax over the last axis;
// - up to three mask layers, each Add(s, m) (a float mask), Where(m, s, -inf) (a boolean mask,
//   true = attend) or Where(m, -inf, s) (masked_fill: true = masked, negated with Not). A boolean
//   constant that is exactly the lower triangle of a square [q, kv] matrix becomes is_causal=1.
//   At most one mask remains as attn_mask, except that two float masks added in turn (T5-style
//   position bias, then the padding mask: (s + bias) + pad) become one, bias + pad, added to the
//   scores once: the sum is associated differently, which moves a score by float rounding;
// - a soft cap inside the masks, c tanh(s / c) (Gemma-2, FlexAttention's soft_cap), as softcap;
// - a scale as Mul or Div by a scalar constant on the scores, on Q, or on Kt, in any combination
//   (the exporters' sqrt-scaling of both operands included); none means 1;
// - Kt = Transpose(X, p) of rank 4: K is X transposed by p with its last two entries swapped
//   (no node when that is the identity). Kt of another form gets a Transpose inserted;
// - K and V each repeated over a group of query heads (Llama's repeat_kv: Reshape(Expand(
//   Unsqueeze(x, 2)))) become the groups' own K and V, the grouped heads Attention takes.
//
// Conditions, each checked on the static or symbolic shapes (a rewrite never guesses): Q, K and
// V of rank 4 and dtype float32; equal batch and head dims on Q, K and V (MatMul's broadcasting
// of them is not Attention's grouped heads); a mask of rank <= 4 whose dims are 1 or equal to the
// scores' and whose last dim is the key length (Attention pads a shorter one as masked) or, when
// that length is not proved, may be (Attention then gets PyPTO's mask_broadcast: the mask's last
// axis broadcasts, 1 or the key count, as in the Add or Where; anything else raises); every
// intermediate read only inside the pattern. Anything else is left as it was. The two contracted
// pairs (Q's head size with K's, the key length of the scores with V's) only need to be not known
// to differ: each MatMul requires them equal, and Attention raises at run time where they are not
// (a decoder's K/V cache, Concat(past, new), has a length no shape inference names, and Dynamo
// gives the past keys and the past values symbols of their own).
//
// Two MatMuls with the same precision attribute (AutoMixedPrecision's "bf16": it runs before this
// pass) give Attention that precision, whose products round the same operands and the
// probabilities too (op_params.h); MatMuls that differ, or split into bf16x3 products (which
// only MatMul and Gemm have), give a float32 Attention.
//
// The one change in meaning: an unguarded Softmax of a row whose every score is -inf is NaN in
// the primitive form and 0 in Attention (as in torch's SDPA); rows with any visible key agree to
// float rounding.
#include <cmath>
#include <limits>

#include "ir/ops/op_params.h"
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Match {
  std::vector<size_t> consumed;  // nodes to remove (the root is retargeted)
  ValueId q = kNoValue, kt = kNoValue, v = kNoValue, mask = kNoValue;
  ValueId added = kNoValue;   // a float mask added before `mask` (itself a float mask)
  bool mask_negated = false;  // the mask is true where masked (Where(m, -inf, s))
  bool mask_added = false;    // the mask is a float one (Add)
  bool causal = false;
  double scale = 1.0;
  double softcap = 0.0;   // > 0: c tanh(s / c) on the scaled scores (Gemma-2)
  std::string precision;  // both MatMuls' precision attribute, when they agree
};

class AttentionMatcher {
 public:
  AttentionMatcher(Graph& g, const std::vector<int>& uses) : g_(g), uses_(uses) {}

  std::optional<Match> match(const Node& root) {
    if (root.op != "MatMul" || root.inputs.size() != 2 || root.outputs.size() != 1)
      return std::nullopt;
    m_.v = root.inputs[1];
    ValueId s = probabilities(root.inputs[0]);
    if (s == kNoValue) return std::nullopt;
    for (int layer = 0; layer < 3; ++layer) {
      if (!mask_layer(s)) break;
    }
    s = capped(s);
    s = scaled(s);
    const Node* qk = inner(s, "MatMul");
    if (!qk || qk->inputs.size() != 2) return std::nullopt;
    m_.q = scaled(qk->inputs[0]);
    m_.kt = scaled(qk->inputs[1]);
    const std::string p = root.attrs.get_string("precision", "");
    // "bf16x3" has no Attention form: its Attention computes in float32 (more exact).
    if (p == qk->attrs.get_string("precision", "") && p != params::kSplitBf16) m_.precision = p;
    return m_;
  }

 private:
  // The producer of v when it is `op` and only the pattern reads v; records it. The guarded form
  // reads the scores twice (Softmax and ReduceMax).
  const Node* inner(ValueId v, std::string_view op) {
    const Node* n = producer(g_, v);
    const int readers = v == guarded_scores_ || v == guarded_probabilities_ ? 2 : 1;
    if (!n || n->op != op || n->outputs.size() != 1 || uses_[v] != readers || g_.is_output(v))
      return nullptr;
    m_.consumed.push_back(static_cast<size_t>(g_.value(v).producer));
    return n;
  }
  void undo(size_t count) { m_.consumed.resize(count); }

  bool is_last_axis(const Node& n, ValueId x) {
    const TensorType& t = g_.value(x).type;
    if (!t.shape) return false;
    const auto rank = static_cast<int64_t>(t.shape->size());
    const int64_t axis = n.attrs.get_int("axis", -1);
    return axis == -1 || axis == rank - 1;
  }

  // Softmax(s) or its guarded form; returns s.
  ValueId probabilities(ValueId p) {
    const size_t mark = m_.consumed.size();
    if (const Node* w = inner(p, "Where"); w && w->inputs.size() == 3) {
      // Where(alive, Softmax(s), 0), alive = Not(Equal(ReduceMax(s, -1, keepdims), -inf)).
      const Node* soft = inner(w->inputs[1], "Softmax");
      const Node* alive = inner(w->inputs[0], "Not");
      const Node* eq = alive ? inner(alive->inputs[0], "Equal") : nullptr;
      const Node* rmax = nullptr;
      if (eq && eq->inputs.size() == 2 && scalar_constant(g_, eq->inputs[1]) == kNegInf)
        rmax = inner(eq->inputs[0], "ReduceMax");
      if (soft && rmax && scalar_constant(g_, w->inputs[2]) == 0.0 &&
          rmax->inputs[0] == soft->inputs[0] && rmax->attrs.get_int("keepdims", 1) == 1 &&
          reduces_last_axis(*rmax) && uses_[soft->inputs[0]] == 2 &&
          is_last_axis(*soft, soft->inputs[0])) {
        guarded_scores_ = soft->inputs[0];
        return soft->inputs[0];
      }
      undo(mark);
    }
    if (const Node* w = inner(p, "Where"); w && w->inputs.size() == 3) {
      // Where(IsNaN(p), 0, p), p = Softmax(s): the ONNX exporter's guard (a softmax is NaN
      // where every score is -inf).
      guarded_probabilities_ = w->inputs[2];
      const Node* nan = inner(w->inputs[0], "IsNaN");
      if (nan && nan->inputs[0] == w->inputs[2] && scalar_constant(g_, w->inputs[1]) == 0.0) {
        const Node* soft = inner(w->inputs[2], "Softmax");
        if (soft && is_last_axis(*soft, soft->inputs[0])) return soft->inputs[0];
      }
      guarded_probabilities_ = kNoValue;
      undo(mark);
    }
    const Node* soft = inner(p, "Softmax");
    if (!soft || !is_last_axis(*soft, soft->inputs[0])) return kNoValue;
    return soft->inputs[0];
  }

  bool reduces_last_axis(const Node& r) {
    std::optional<std::vector<int64_t>> axes;
    if (r.inputs.size() > 1 && r.inputs[1] != kNoValue) {
      const Tensor* c = constant(g_, r.inputs[1]);
      if (!c) return false;
      axes = std::vector<int64_t>();
      for (double d : to_doubles(*c)) axes->push_back(static_cast<int64_t>(d));
    } else if (r.attrs.has("axes")) {
      axes = r.attrs.get_ints("axes");
    }
    const TensorType& t = g_.value(r.inputs[0]).type;
    if (!axes || axes->size() != 1 || !t.shape) return false;
    const auto rank = static_cast<int64_t>(t.shape->size());
    return (*axes)[0] == -1 || (*axes)[0] == rank - 1;
  }

  // One mask layer around the scores: moves s inside it and records the mask.
  bool mask_layer(ValueId& s) {
    const size_t mark = m_.consumed.size();
    const Node* n = producer(g_, s);
    if (!n) return false;
    ValueId inside = kNoValue, mask = kNoValue;
    bool negated = false;
    if (n->op == "Add" && n->inputs.size() == 2 && inner(s, "Add")) {
      // The scores are the operand that leads back to the MatMul; the mask is the other one.
      const int side = leads_to_scores(n->inputs[0]) ? 0 : 1;
      inside = n->inputs[side];
      mask = n->inputs[1 - side];
      if (!is_floating(dtype_of_value(g_, mask))) return undo(mark), false;
    } else if (n->op == "Where" && n->inputs.size() == 3 && inner(s, "Where")) {
      if (scalar_constant(g_, n->inputs[2]) == kNegInf) {
        inside = n->inputs[1];
      } else if (scalar_constant(g_, n->inputs[1]) == kNegInf) {
        inside = n->inputs[2];
        negated = true;
      } else {
        return undo(mark), false;
      }
      mask = n->inputs[0];
    } else {
      return false;
    }
    if (!negated && n->op == "Where" && is_causal_constant(mask)) {
      if (m_.causal) return undo(mark), false;
      m_.causal = true;
    } else if (m_.mask == kNoValue) {
      m_.mask = mask;
      m_.mask_negated = negated;
      m_.mask_added = n->op == "Add";
    } else if (n->op == "Add" && m_.mask_added && m_.added == kNoValue) {
      m_.added = mask;  // the layers are found outside in: this one is added first
    } else {
      return undo(mark), false;
    }
    s = inside;
    return true;
  }

  // Whether v is (a scaled or masked form of) a MatMul: tells scores from an added mask, on
  // either side of the Add. Either answer keeps a rewrite exact (Add commutes); it only chooses
  // the side the match follows.
  bool leads_to_scores(ValueId v, int hops = 6) {
    const Node* n = producer(g_, v);
    if (!n || hops == 0) return false;
    if (n->op == "MatMul") return true;
    if (n->op == "Tanh") return leads_to_scores(n->inputs[0], hops - 1);  // a soft cap
    if (n->op == "Where" && n->inputs.size() == 3)
      return leads_to_scores(n->inputs[scalar_constant(g_, n->inputs[1]) == kNegInf ? 2 : 1],
                             hops - 1);
    if (n->op != "Mul" && n->op != "Div" && n->op != "Add") return false;
    for (const ValueId x : n->inputs)
      if (leads_to_scores(x, hops - 1)) return true;
    return false;
  }

  // A boolean constant [.., q, kv] with q == kv, true exactly on and below the diagonal.
  bool is_causal_constant(ValueId v) {
    const Tensor* c = constant(g_, v);
    if (!c || c->dtype() != DType::kBool || c->rank() < 2) return false;
    const int64_t q = c->dim(c->rank() - 2), kv = c->dim(c->rank() - 1);
    if (q != kv || c->numel() != q * kv) return false;
    const std::vector<double> d = to_doubles(*c);
    for (int64_t i = 0; i < q; ++i)
      for (int64_t j = 0; j < kv; ++j)
        if ((d[i * kv + j] != 0) != (j <= i)) return false;
    return true;
  }

  // v without a soft cap c tanh(v / c) (Mul(Tanh(Div(v, c)), c), the division also as a Mul by
  // 1 / c, the constants on either side of the Muls), recorded as the softcap.
  ValueId capped(ValueId v) {
    const size_t mark = m_.consumed.size();
    const Node* outer = producer(g_, v);
    if (!outer || outer->op != "Mul" || outer->inputs.size() != 2) return v;
    const int k = scalar_constant(g_, outer->inputs[0]) ? 0 : 1;
    const std::optional<double> c = scalar_constant(g_, outer->inputs[k]);
    if (!c || !(*c > 0) || !std::isfinite(*c) || !inner(v, "Mul")) return v;
    const Node* t = inner(outer->inputs[1 - k], "Tanh");
    const Node* div = t ? producer(g_, t->inputs[0]) : nullptr;
    if (!div || (div->op != "Div" && div->op != "Mul") || div->inputs.size() != 2)
      return undo(mark), v;
    const int j = div->op == "Mul" && scalar_constant(g_, div->inputs[0]) ? 0 : 1;
    const std::optional<double> d = scalar_constant(g_, div->inputs[j]);
    const double inv = d ? (div->op == "Div" ? 1.0 / *d : *d) : 0.0;
    if (!d || std::fabs(inv * *c - 1.0) > 1e-6 || !inner(t->inputs[0], div->op))
      return undo(mark), v;
    m_.softcap = *c;
    return div->inputs[1 - j];
  }

  // Whether x times the one-element constant c has x's shape: c's rank is not above x's (the
  // dims themselves may be unnamed, as a decoder's cache length).
  bool keeps_shape(ValueId c, ValueId x) {
    const TensorType& t = g_.value(x).type;
    const Tensor* k = constant(g_, c);  // none: a Constant node's value_float or value_int
    return t.shape && (!k || k->rank() <= static_cast<int64_t>(t.shape->size()));
  }

  // v without a Mul or Div by a scalar constant (folded into the scale).
  ValueId scaled(ValueId v) {
    for (;;) {
      const Node* n = producer(g_, v);
      if (!n || (n->op != "Mul" && n->op != "Div") || n->inputs.size() != 2) return v;
      const int k = n->op == "Mul" && scalar_constant(g_, n->inputs[0]) ? 0 : 1;
      std::optional<double> c = scalar_constant(g_, n->inputs[k]);
      if (!c || *c == 0 || !std::isfinite(*c) || !keeps_shape(n->inputs[k], n->inputs[1 - k]))
        return v;
      if (!inner(v, n->op)) return v;
      m_.scale *= n->op == "Div" ? 1.0 / *c : *c;
      v = n->inputs[1 - k];
    }
  }

  Graph& g_;
  const std::vector<int>& uses_;
  Match m_;
  ValueId guarded_scores_ = kNoValue;         // read by Softmax and the guard's ReduceMax
  ValueId guarded_probabilities_ = kNoValue;  // read by IsNaN and the guard's Where
};

// Whether two dims may be equal at run time: not two different known sizes. For the contracted
// dims of a MatMul, which must be equal for the MatMul to run.
bool may_be_equal(const Dim& a, const Dim& b) {
  return !(a.is_known() && b.is_known() && a.value != b.value);
}

const Shape* shape4(const Graph& g, ValueId v) {
  const TensorType& t = g.value(v).type;
  return t.dtype == DType::kF32 && t.shape && t.shape->size() == 4 ? &*t.shape : nullptr;
}

// K from Kt: the transpose's input permuted with the last two axes swapped back.
struct KeyPlan {
  ValueId source = kNoValue;
  std::vector<int64_t> perm;  // empty: source is K itself
};

std::optional<KeyPlan> key_plan(const Graph& g, const std::vector<int>& uses, ValueId kt,
                                std::vector<size_t>& consumed) {
  const Node* t = producer(g, kt);
  if (t && t->op == "Transpose" && uses[kt] == 1 && !g.is_output(kt) && t->attrs.has("perm")) {
    std::vector<int64_t> p = t->attrs.get_ints("perm");
    if (p.size() != 4) return std::nullopt;
    std::swap(p[2], p[3]);
    consumed.push_back(static_cast<size_t>(g.value(kt).producer));
    if (p == std::vector<int64_t>{0, 1, 2, 3}) return KeyPlan{t->inputs[0], {}};
    return KeyPlan{t->inputs[0], p};
  }
  return KeyPlan{kt, {0, 1, 3, 2}};
}

// K or V repeated over the query heads of its group, as Hugging Face's repeat_kv and PyPTO's own
// SDPA converter (enable_gqa) write it: Reshape(Expand(Unsqueeze(x, 2), [b, hkv, g, s, d]),
// [b, hkv * g, s, d]), x = [b, hkv, s, d]. Attention takes x itself (query head h reads K/V head
// h / g, the same pairing), so the copies are never made. Checked on the ops' constants and the
// values' shapes, however the target shapes are spelled: Unsqueeze's axis is 2; Expand makes g
// copies on it and keeps x's axes (a constant target: every other entry 1 or x's size); the
// Reshape's result has x's batch and head size (the same size or symbol) and hkv * g heads, so
// its length is x's, whatever shape inference could name of it (a decoder's cache length, a
// Concat's, is unnamed). Every intermediate read only here.
struct Repeated {
  ValueId source = kNoValue;
  int64_t groups = 0;
  std::vector<size_t> nodes;
};

std::optional<Repeated> repeated_heads(const Graph& g, const std::vector<int>& uses, ValueId v) {
  auto only = [&](ValueId x, const char* op) -> const Node* {
    const Node* n = producer(g, x);
    return n && n->op == op && n->domain.empty() && n->outputs.size() == 1 && uses[x] == 1 &&
                   !g.is_output(x)
               ? n
               : nullptr;
  };
  const Node* r = only(v, "Reshape");
  const Node* e = r ? only(r->inputs[0], "Expand") : nullptr;
  const Node* u = e && e->inputs.size() == 2 ? only(e->inputs[0], "Unsqueeze") : nullptr;
  if (!u) return std::nullopt;
  const ValueId x = u->inputs[0];
  const std::optional<Shape>&xs = g.value(x).type.shape, &rs = g.value(v).type.shape;
  if (!xs || !rs || xs->size() != 4 || rs->size() != 4) return std::nullopt;
  // Unsqueeze's one axis: an input (opset 13+) or an attribute.
  std::vector<int64_t> axes;
  if (u->inputs.size() > 1 && u->inputs[1] != kNoValue) {
    const Tensor* c = constant(g, u->inputs[1]);
    if (!c) return std::nullopt;
    for (double d : to_doubles(*c)) axes.push_back(static_cast<int64_t>(d));
  } else {
    axes = u->attrs.get_ints("axes", {});
  }
  if (axes.size() != 1 || (axes[0] != 2 && axes[0] != -3)) return std::nullopt;
  // Expand's result: g >= 2 on the new axis, x's sizes on the others. Read from the target when
  // it is a constant (each other entry 1, or x's known size there), else from the shapes.
  const std::optional<Shape>& es = g.value(r->inputs[0]).type.shape;
  if (!es || es->size() != 5 || !(*es)[2].is_known()) return std::nullopt;
  const int64_t groups = (*es)[2].value;
  if (groups < 2) return std::nullopt;
  const Tensor* target = constant(g, e->inputs[1]);
  const std::vector<double> t =
      target && target->numel() == 5 ? to_doubles(*target) : std::vector<double>();
  if (!t.empty() && t[2] != static_cast<double>(groups)) return std::nullopt;
  for (int d : {0, 1, 2, 3}) {
    const int five = d < 2 ? d : d + 1;
    const Dim& have = (*xs)[d];
    const bool kept =
        t.empty() ? same_dim((*es)[five], have)
                  : t[five] == 1 || (have.is_known() && static_cast<double>(have.value) == t[five]);
    if (!kept) return std::nullopt;
  }
  // The Reshape: [b, hkv * g, s, d] from [b, hkv, g, s, d], its element count x's times g.
  const Dim& hkv = (*xs)[1];
  if (!hkv.is_known() || !(*rs)[1].is_known() || (*rs)[1].value != hkv.value * groups ||
      !same_dim((*rs)[0], (*xs)[0]) || !same_dim((*rs)[3], (*xs)[3]))
    return std::nullopt;
  const Dim& length = (*rs)[2];
  if (!same_dim(length, (*xs)[2]) && (length.is_known() || length.is_symbolic()))
    return std::nullopt;
  Repeated out{x, groups, {}};
  for (const ValueId y : {v, r->inputs[0], e->inputs[0]})
    out.nodes.push_back(static_cast<size_t>(g.value(y).producer));
  return out;
}

bool attention(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  AttentionMatcher matcher(g, rw.uses());
  std::optional<Match> m = matcher.match(g.nodes()[i]);
  if (!m) return false;
  const ValueId out = g.nodes()[i].outputs[0];
  std::optional<KeyPlan> key = key_plan(g, rw.uses(), m->kt, m->consumed);
  const Shape *q = shape4(g, m->q), *kt = shape4(g, m->kt), *v = shape4(g, m->v),
              *y = shape4(g, out);
  if (!key || !q || !kt || !v || !y) return false;
  // Q [b, h, sq, d], Kt [b, h, d, skv], V [b, h, skv, dv]: no broadcasting between them.
  for (int d = 0; d < 2; ++d)
    if (!same_dim((*q)[d], (*kt)[d]) || !same_dim((*q)[d], (*v)[d])) return false;
  if (!may_be_equal((*q)[3], (*kt)[2]) || !may_be_equal((*kt)[3], (*v)[2])) return false;
  std::optional<TensorType> summed;  // the type of added + mask
  bool mask_broadcast = false;       // Attention's mask_broadcast: the key axis not proved
  if (m->added != kNoValue) {
    const TensorType &a = g.value(m->added).type, &b = g.value(m->mask).type;
    if (a.dtype != b.dtype || !a.shape || !b.shape) return false;
    try {
      summed = TensorType{a.dtype, broadcast_shapes(*a.shape, *b.shape, "attention mask")};
    } catch (const ValueError&) {
      return false;
    }
  }
  if (m->mask != kNoValue) {
    const TensorType& mt = summed ? *summed : g.value(m->mask).type;
    if (!mt.shape || mt.shape->size() > 4 || mt.shape->empty()) return false;
    const Shape& ms = *mt.shape;
    const Shape scores = {(*q)[0], (*q)[1], (*q)[2], (*kt)[3]};
    const size_t off = 4 - ms.size();
    for (size_t d = 0; d < ms.size(); ++d) {
      const bool one = ms[d].is_known() && ms[d].value == 1;
      if (same_dim(ms[d], scores[off + d]) || (one && off + d < 3)) continue;
      // The key axis, of a length not proved the scores' (a decoder's padding mask sliced to
      // the cache's length): the mask broadcasts there as in the Add or Where it came from.
      if (off + d == 3 && (one || may_be_equal(ms[d], scores[3]))) {
        mask_broadcast = true;
        continue;
      }
      return false;
    }
    if (m->mask_negated && mt.dtype != DType::kBool) return false;
  }
  if (m->causal && !(same_dim((*q)[2], (*kt)[3]))) return false;

  // Grouped K/V heads repeated for the query heads: Attention reads the groups' K and V.
  ValueId key_source = key->source, value = m->v;
  int64_t groups = 1;
  if (key->perm.empty()) {
    const auto rk = repeated_heads(g, rw.uses(), key->source);
    const auto rv = repeated_heads(g, rw.uses(), m->v);
    if (rk && rv && rk->groups == rv->groups) {
      key_source = rk->source;
      value = rv->source;
      groups = rk->groups;
      for (const auto* r : {&*rk, &*rv})
        m->consumed.insert(m->consumed.end(), r->nodes.begin(), r->nodes.end());
    }
  }

  // Rewrite: K (a transpose when needed), a negated mask, then the root becomes Attention.
  const std::string& name = g.nodes()[i].name;
  size_t at = i;
  ValueId k = key_source;
  if (!key->perm.empty()) {
    k = g.add_value(g.unique_name(name + "_key"), TensorType{DType::kF32, std::nullopt});
    Attributes a;
    a.set("perm", key->perm);
    rw.insert(at++, "Transpose", {key_source}, {k}, std::move(a), name + "_key");
  }
  ValueId mask = m->mask;
  if (summed) {
    mask = g.add_value(g.unique_name(name + "_mask"), *summed);
    rw.insert(at++, "Add", {m->added, m->mask}, {mask}, {}, name + "_mask");
  }
  if (m->mask_negated) {
    mask = g.add_value(g.unique_name(name + "_keep"), TensorType{DType::kBool, std::nullopt});
    rw.insert(at++, "Not", {m->mask}, {mask}, {}, name + "_keep");
  }
  for (size_t n : m->consumed) rw.remove(n < i ? n : n + (at - i));
  Attributes attrs;
  attrs.set("scale", m->scale);
  if (m->causal) attrs.set("is_causal", int64_t{1});
  if (m->softcap > 0) attrs.set("softcap", m->softcap);
  if (mask_broadcast) attrs.set("mask_broadcast", int64_t{1});
  if (!m->precision.empty()) attrs.set("precision", m->precision);
  std::vector<ValueId> inputs = {m->q, k, value};
  if (mask != kNoValue) inputs.push_back(mask);
  retarget(g.mutable_nodes()[at], "Attention", std::move(inputs), std::move(attrs));
  ctx.note(m->causal ? "RecognizeAttention/Causal" : "RecognizeAttention/Attention");
  if (groups > 1) ctx.note("RecognizeAttention/GroupedHeads");
  return true;
}

Graph recognize_attention(Graph g, const PassContext& ctx) {
  apply_rules(g, {{nullptr, attention}}, ctx);
  return g;
}

}  // namespace

void register_recognize_attention(PassRegistry& r) {
  r.add({"RecognizeAttention", recognize_attention,
         "replaces MatMul-scale-mask-Softmax-MatMul (with SDPA's guard for fully masked rows) "
         "by one Attention op"});
}

}  // namespace pto::passes
