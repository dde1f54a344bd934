// RecognizeComposites: finds activations and normalizations spelled out in primitive ops (as
// torch.onnx.export and hand-written model code produce them) and replaces each by the one ONNX
// op that means it, so later levels see one op:
//   x * 0.5 * (1 + Erf(x / 1.41421 | x * 0.70711))                   -> Gelu
//   x * 0.5 * (1 + Tanh(0.79788 * (x + 0.044715 * x^3)))             -> Gelu approximate="tanh"
//   (the Tanh's argument also as 0.79788 * x * (1 + 0.044715 * x * x), Bloom's)
//   (x - mean(x)) / Sqrt(mean((x - mean(x))^2) [+ eps]) [* g] [+ b]  -> LayerNormalization
//   x / Sqrt(mean(x^2) [+ eps]) [* g]                                -> RMSNormalization
//   x * Clip(x + 3, 0, 6) / 6 (one Clip or a min and a max Clip)       -> HardSwish
//   Reshape(InstanceNormalization(Reshape(x, [N, G, -1]), 1, 0), x's shape) [* g] [+ b]
//     (torch.onnx.export's GroupNorm before opset 18)                  -> GroupNormalization
// Matching is backwards from the candidate root (the last node of the pattern). The product
// x * 0.5 * s is matched in any association; commutative operands in either order; x^2 as Pow 2 or
// Mul(d, d); x^3 as Pow 3 or Mul chains; the division as Div, Mul by Reciprocal or Mul by Div(1,
// .); the means are ReduceMean over the last axis with keepdims (axes as attribute or constant
// input). Every intermediate must be read only inside the pattern; otherwise nothing changes.
// Constants are compared to 1e-4 relative (exporters print them with 8 digits), or to two roundings
// of a half type where they are values of one. SiLU (x * Sigmoid(x)) is left alone: it has no ONNX
// op.
//
// The fused op is not bit-identical to the chain it replaces (the reference computes the fused
// ops in double): results agree to a few float ulps.
#include <cmath>
#include <limits>
#include <numbers>

#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

// What one match needs to know: the graph, use counts, and the nodes the match consumed.
struct Matcher {
  Graph& g;
  const std::vector<int>& uses;
  std::vector<size_t> consumed;  // nodes to remove (the root is retargeted, not listed)

  // The producer of v when it is `op` and v is read once (by the pattern); records it.
  const Node* inner(ValueId v, std::string_view op, int allowed_uses = 1) {
    const Node* n = producer(g, v);
    if (!n || n->op != op || n->outputs.size() != 1 || uses[v] != allowed_uses || g.is_output(v))
      return nullptr;
    consumed.push_back(static_cast<size_t>(g.value(v).producer));
    return n;
  }
  // A scalar constant within 1e-4 of `want` (relative), or within two roundings of the half types:
  // a half constant, or an fp32 one whose value is a half (a half graph's, widened by PromoteHalf,
  // which runs first: an fp16 file's 1/sqrt2 is 0.70703125, 1.1e-4 from the fp32 one).
  bool is_const(ValueId v, double want) {
    auto c = scalar_constant(g, v);
    if (!c) return false;
    const DType dt = dtype_of_value(g, v);
    const float f = static_cast<float>(*c);
    const bool f16 = dt == DType::kF16 || (dt == DType::kF32 && float(Float16(f)) == f);
    const bool bf16 = dt == DType::kBF16 || (dt == DType::kF32 && float(BFloat16(f)) == f);
    const double tol = f16 ? 2e-3 : bf16 ? 1.6e-2 : 1e-4;
    return std::fabs(*c - want) <= tol * std::fabs(want);
  }
  // For a binary node n with operand `known` (either side), the other operand.
  static ValueId other(const Node& n, ValueId known) {
    if (n.inputs.size() != 2) return kNoValue;
    return n.inputs[0] == known ? n.inputs[1] : n.inputs[1] == known ? n.inputs[0] : kNoValue;
  }
  // For a binary node n with a constant operand close to `want`, the other operand.
  ValueId times_const(const Node& n, double want) {
    if (n.inputs.size() != 2) return kNoValue;
    if (is_const(n.inputs[1], want)) return n.inputs[0];
    if (is_const(n.inputs[0], want)) return n.inputs[1];
    return kNoValue;
  }
};

// Tries `f` on a fresh Matcher for each alternative; the first that matches wins.
template <class F>
std::optional<std::vector<size_t>> first_match(Rewrite& rw, int alternatives, F f) {
  for (int k = 0; k < alternatives; ++k) {
    Matcher m{rw.graph(), rw.uses(), {}};
    if (f(m, k)) return std::move(m.consumed);
  }
  return std::nullopt;
}

// ---- GELU ----

// x^3 as Pow(x, 3), Mul(Mul(x, x), x) or Mul(x, Mul(x, x)).
bool is_cube(Matcher& m, ValueId v, ValueId x) {
  const Node* n = producer(m.g, v);
  if (!n) return false;
  if (n->op == "Pow") return n->inputs[0] == x && m.inner(v, "Pow") && m.is_const(n->inputs[1], 3);
  if (n->op != "Mul" || !m.inner(v, "Mul")) return false;
  const ValueId sq = Matcher::other(*n, x);
  const Node* s = sq == kNoValue ? nullptr : m.inner(sq, "Mul");
  return s && s->inputs[0] == x && s->inputs[1] == x;
}

// q = 0.044715 x^2: Mul(0.044715, Mul(x, x)) or Mul(Mul(x, 0.044715), x), either side.
bool is_scaled_square(Matcher& m, ValueId q, ValueId x) {
  const Node* n = m.inner(q, "Mul");
  if (!n) return false;
  if (const ValueId sq = m.times_const(*n, 0.044715); sq != kNoValue) {
    const Node* s = m.inner(sq, "Mul");
    return s && s->inputs[0] == x && s->inputs[1] == x;
  }
  const ValueId scaled = Matcher::other(*n, x);
  const Node* k = scaled == kNoValue ? nullptr : m.inner(scaled, "Mul");
  return k && m.times_const(*k, 0.044715) == x;
}

// v = (sqrt(2/pi) x) (1 + 0.044715 x^2): the tanh argument factored as Bloom writes it.
bool is_factored_tanh_argument(Matcher& m, ValueId v, ValueId x) {
  const Node* prod = m.inner(v, "Mul");
  if (!prod || prod->inputs.size() != 2) return false;
  for (int side = 0; side < 2; ++side) {
    const size_t mark = m.consumed.size();
    const Node* lin = m.inner(prod->inputs[side], "Mul");
    const Node* add = lin && m.times_const(*lin, std::sqrt(2 / std::numbers::pi)) == x
                          ? m.inner(prod->inputs[1 - side], "Add")
                          : nullptr;
    const ValueId q = add ? m.times_const(*add, 1.0) : kNoValue;
    if (q != kNoValue && is_scaled_square(m, q, x)) return true;
    m.consumed.resize(mark);
  }
  return false;
}

// s = 1 + Erf(x / sqrt2) or 1 + Tanh(sqrt(2/pi) * (x + 0.044715 x^3)) (or of Bloom's factored
// sqrt(2/pi) x (1 + 0.044715 x^2)); sets `tanh`.
bool gelu_sum(Matcher& m, ValueId s, ValueId x, bool& tanh) {
  const Node* add = m.inner(s, "Add");
  if (!add) return false;
  const ValueId t = m.times_const(*add, 1.0);
  const Node* f = producer(m.g, t);
  if (!f) return false;
  if (f->op == "Erf") {
    tanh = false;
    const Node* u = m.inner(t, "Erf") ? producer(m.g, f->inputs[0]) : nullptr;
    if (!u) return false;
    if (u->op == "Div")
      return u->inputs[0] == x && m.is_const(u->inputs[1], std::numbers::sqrt2) &&
             m.inner(f->inputs[0], "Div");
    return u->op == "Mul" && m.times_const(*u, 1 / std::numbers::sqrt2) == x &&
           m.inner(f->inputs[0], "Mul");
  }
  if (f->op != "Tanh" || !m.inner(t, "Tanh")) return false;
  tanh = true;
  if (is_factored_tanh_argument(m, f->inputs[0], x)) return true;
  const Node* scaled = m.inner(f->inputs[0], "Mul");
  const ValueId w = scaled ? m.times_const(*scaled, std::sqrt(2 / std::numbers::pi)) : kNoValue;
  const Node* sum = w == kNoValue ? nullptr : m.inner(w, "Add");
  const ValueId cubic = sum ? Matcher::other(*sum, x) : kNoValue;
  const Node* k = cubic == kNoValue ? nullptr : m.inner(cubic, "Mul");
  const ValueId cube = k ? m.times_const(*k, 0.044715) : kNoValue;
  return cube != kNoValue && is_cube(m, cube, x);
}

bool gelu(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const Node& root = g.nodes()[i];
  if (root.op != "Mul" || root.inputs.size() != 2 || root.outputs.size() != 1) return false;
  if (!is_floating(dtype_of_value(g, root.outputs[0]))) return false;
  // The three factors {x, 0.5, s}: one root operand is a single-use Mul of two of them.
  bool tanh = false;
  ValueId x = kNoValue;
  auto consumed = first_match(rw, 12, [&](Matcher& m, int k) {
    const int side = k / 6, pick = k % 6;  // which operand is the inner Mul; which leaf is what
    const Node* in = m.inner(root.inputs[side], "Mul");
    if (!in) return false;
    const ValueId leaves[3] = {in->inputs[0], in->inputs[1], root.inputs[1 - side]};
    static constexpr int kOrder[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                         {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    const ValueId half = leaves[kOrder[pick][0]], xs = leaves[kOrder[pick][1]],
                  s = leaves[kOrder[pick][2]];
    if (!m.is_const(half, 0.5) || m.is_const(xs, 0.5)) return false;
    x = xs;
    return gelu_sum(m, s, x, tanh);
  });
  // A broadcasting constant ([1, 1] 0.5) may have grown x: Gelu(x) must have the root's shape.
  if (!consumed || !same_shape(g, x, root.outputs[0])) return false;
  Attributes attrs;
  if (tanh) attrs.set("approximate", std::string("tanh"));
  for (size_t n : *consumed) rw.remove(n);
  retarget(g.mutable_nodes()[i], "Gelu", {x}, std::move(attrs));
  ctx.note(tanh ? "RecognizeComposites/GeluTanh" : "RecognizeComposites/Gelu");
  return true;
}

// ---- HardSwish ----

// Clip(v) bounds as a chain: Clip(a, lo, hi), or Clip(Clip(a, lo, _), _, hi) as torch.export
// decomposes clamp(min, max). Returns a, or kNoValue.
ValueId clip_0_6(Matcher& m, ValueId v) {
  const Node* outer = m.inner(v, "Clip");
  if (!outer || outer->inputs.size() < 2) return kNoValue;
  auto bound = [&](const Node& c, size_t i, double want) {
    if (i >= c.inputs.size() || c.inputs[i] == kNoValue) return want != want;  // absent: NaN
    return m.is_const(c.inputs[i], want) || (want == 0 && scalar_constant(m.g, c.inputs[i]) == 0.0);
  };
  constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  if (bound(*outer, 1, 0) && bound(*outer, 2, 6)) return outer->inputs[0];
  if (bound(*outer, 1, kNone) && bound(*outer, 2, 6)) {
    const Node* inner = m.inner(outer->inputs[0], "Clip");
    if (inner && bound(*inner, 1, 0) && bound(*inner, 2, kNone)) return inner->inputs[0];
  }
  return kNoValue;
}

// x * Clip(x + 3, 0, 6) / 6 (torch's decomposition of hardswish) -> HardSwish(x).
bool hard_swish(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const Node& root = g.nodes()[i];
  if (root.op != "Div" || root.inputs.size() != 2 || root.outputs.size() != 1) return false;
  if (!is_floating(dtype_of_value(g, root.outputs[0]))) return false;
  ValueId x = kNoValue;
  auto consumed = first_match(rw, 2, [&](Matcher& m, int side) {
    if (!m.is_const(root.inputs[1], 6)) return false;
    const Node* mul = m.inner(root.inputs[0], "Mul");
    if (!mul || mul->inputs.size() != 2) return false;
    x = mul->inputs[side];
    const ValueId a = clip_0_6(m, mul->inputs[1 - side]);
    const Node* add = a == kNoValue ? nullptr : producer(m.g, a);
    if (!add || add->op != "Add" || m.times_const(*add, 3.0) != x) return false;
    // x + 3 is read by the Clip only; x itself is read by the Add and the Mul.
    return m.inner(a, "Add") != nullptr;
  });
  if (!consumed || !same_shape(g, x, root.outputs[0])) return false;
  for (size_t n : *consumed) rw.remove(n);
  retarget(g.mutable_nodes()[i], "HardSwish", {x});
  ctx.note("RecognizeComposites/HardSwish");
  return true;
}

// ---- LayerNormalization and RMSNormalization ----

// ReduceMean of v over the last axis with keepdims: returns its input.
ValueId mean_last_axis(Matcher& m, ValueId v) {
  const Node* n = m.inner(v, "ReduceMean");
  if (!n || n->attrs.get_int("keepdims", 1) != 1) return kNoValue;
  const auto& shape = m.g.value(n->inputs[0]).type.shape;
  if (!shape || shape->empty()) return kNoValue;
  std::vector<int64_t> axes = n->attrs.get_ints("axes", {});
  if (n->inputs.size() > 1 && n->inputs[1] != kNoValue) {
    const Tensor* a = constant(m.g, n->inputs[1]);
    if (!a || !axes.empty()) return kNoValue;
    for (double d : to_doubles(*a)) axes.push_back(static_cast<int64_t>(d));
  }
  const auto rank = static_cast<int64_t>(shape->size());
  if (axes.size() != 1 || (axes[0] != -1 && axes[0] != rank - 1)) return kNoValue;
  return n->inputs[0];
}

struct Norm {
  bool layer = false;  // LayerNormalization (else RMSNormalization)
  ValueId x = kNoValue;
  double eps = 0;
};

// v = num / Sqrt(mean(num^2) + eps), with num = x - mean(x) (LayerNorm) or num = x (RMSNorm).
// `root`: v is the pattern's last value, which may have any readers (its node is retargeted).
bool normalized(Matcher& m, ValueId v, int variant, Norm& out, bool root) {
  const Node* n = producer(m.g, v);
  if (!n || n->inputs.size() != 2) return false;
  // The division: Div(num, sd), or Mul(num, Reciprocal(sd) | Div(1, sd)) either way round.
  ValueId num = kNoValue, sd = kNoValue;
  if (n->op == "Div") {
    if (!root && !m.inner(v, "Div")) return false;
    num = n->inputs[0], sd = n->inputs[1];
  } else if (n->op == "Mul") {
    if (!root && !m.inner(v, "Mul")) return false;
    const int r = variant & 1;
    num = n->inputs[1 - r];
    const Node* rec = producer(m.g, n->inputs[r]);
    if (!rec) return false;
    if (rec->op == "Reciprocal" && m.inner(n->inputs[r], "Reciprocal"))
      sd = rec->inputs[0];
    else if (rec->op == "Div" && m.is_const(rec->inputs[0], 1.0) && m.inner(n->inputs[r], "Div"))
      sd = rec->inputs[1];
    else
      return false;
  } else {
    return false;
  }
  const Node* sq = m.inner(sd, "Sqrt");
  if (!sq) return false;
  // Sqrt(var + eps), or Sqrt(var) where an exporter dropped a tiny eps (onnxscript's optimizer
  // folds x + 1e-12 away in f32).
  ValueId var = sq->inputs[0];
  std::optional<double> eps = 0.0;
  const Node* plus = producer(m.g, var);
  if (plus && plus->op == "Add") {
    const int e = (variant >> 1) & 1;  // which operand of the Add is eps
    eps = scalar_constant(m.g, plus->inputs[e]);
    if (!eps || *eps < 0 || !m.inner(var, "Add")) return false;
    var = plus->inputs[1 - e];
  }
  const ValueId squares = mean_last_axis(m, var);
  const Node* p = producer(m.g, squares);
  if (!p) return false;
  // num is read by the square (once for Pow, twice for Mul) and the division, nowhere else when it
  // is an intermediate of the pattern.
  int square_reads = 0;
  if (p->op == "Pow" && p->inputs[0] == num && m.is_const(p->inputs[1], 2))
    square_reads = 1;
  else if (p->op == "Mul" && p->inputs[0] == num && p->inputs[1] == num)
    square_reads = 2;
  if (!square_reads || !m.inner(squares, p->op)) return false;
  out.eps = *eps;
  // LayerNorm: num = Sub(x, ReduceMean(x)), read only here.
  const size_t before = m.consumed.size();
  const Node* sub = m.inner(num, "Sub", square_reads + 1);
  if (sub && mean_last_axis(m, sub->inputs[1]) == sub->inputs[0]) {
    out.layer = true;
    out.x = sub->inputs[0];
  } else {
    m.consumed.resize(before);
    out.layer = false;
    out.x = num;
  }
  return true;
}

// A per-channel parameter for x: shape [1, ..., 1, C] with C x's last dimension, x's dtype.
bool channel_param(const Graph& g, ValueId p, ValueId x) {
  const auto& ps = g.value(p).type.shape;
  const auto& xs = g.value(x).type.shape;
  if (!ps || !xs || ps->empty() || xs->empty() || ps->size() > xs->size()) return false;
  if (dtype_of_value(g, p) != dtype_of_value(g, x) || ps->back() != xs->back()) return false;
  for (size_t d = 0; d + 1 < ps->size(); ++d)
    if ((*ps)[d] != Dim(1)) return false;
  return xs->back().is_known() || xs->back().is_symbolic();
}

// Whether the one reader of node i's output ends a match of `match` too: a longer match (through
// the scale or bias step) is preferred, so the rule fires there rather than at i.
template <class Match>
bool reader_matches(Rewrite& rw, size_t i, Match match) {
  const int32_t user = rw.readers().single_reader(rw.graph().nodes()[i].outputs[0]);
  return user >= 0 && match(rw, static_cast<size_t>(user)).has_value();
}

struct NormMatch {
  std::vector<size_t> consumed;
  Norm norm;
  ValueId gamma = kNoValue, beta = kNoValue;
};

// The whole pattern ending at node `i`: [Add(Mul(n, gamma), beta) | Mul(n, gamma) | n].
std::optional<NormMatch> match_norm(Rewrite& rw, size_t i) {
  Graph& g = rw.graph();
  const Node& root = g.nodes()[i];
  if (root.outputs.size() != 1 || root.inputs.size() != 2) return std::nullopt;
  if (!is_floating(dtype_of_value(g, root.outputs[0]))) return std::nullopt;
  const ValueId out = root.outputs[0];
  for (int k = 0; k < 64; ++k) {
    const int variant = k & 3, gs = (k >> 2) & 1, bs = (k >> 3) & 1, form = k >> 4;
    NormMatch r;
    Matcher m{g, rw.uses(), {}};
    ValueId n = out;
    if (form == 0) {  // Add(Mul(n, gamma), beta)
      if (root.op != "Add") continue;
      r.beta = root.inputs[1 - bs];
      const Node* mul = m.inner(root.inputs[bs], "Mul");
      if (!mul) continue;
      n = mul->inputs[gs], r.gamma = mul->inputs[1 - gs];
    } else if (form == 1) {  // Mul(n, gamma)
      if (root.op != "Mul" || bs) continue;
      n = root.inputs[gs], r.gamma = root.inputs[1 - gs];
    } else if (form == 2) {  // Add(n, beta): LayerNorm without a scale
      if (root.op != "Add" || gs) continue;
      n = root.inputs[bs], r.beta = root.inputs[1 - bs];
    } else if (gs || bs) {
      continue;
    }
    if (!normalized(m, n, variant, r.norm, n == out)) continue;
    if (r.gamma != kNoValue && !channel_param(g, r.gamma, r.norm.x)) continue;
    if (r.beta != kNoValue && (!r.norm.layer || !channel_param(g, r.beta, r.norm.x))) continue;
    r.consumed = std::move(m.consumed);
    return r;
  }
  return std::nullopt;
}

bool norm(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const std::string& op = g.nodes()[i].op;
  if (op != "Add" && op != "Mul" && op != "Div") return false;
  auto r = match_norm(rw, i);
  if (!r || !same_shape(g, r->norm.x, g.nodes()[i].outputs[0])) return false;
  if (reader_matches(rw, i, match_norm)) return false;
  ValueId gamma = r->gamma;
  if (gamma == kNoValue) {  // the fused ops need a scale: ones, when the size is known
    const auto& xs = g.value(r->norm.x).type.shape;
    if (!xs || xs->empty() || !xs->back().is_known()) return false;
    auto ones = float_tensor(dtype_of_value(g, r->norm.x), {xs->back().value},
                             std::vector<double>(static_cast<size_t>(xs->back().value), 1.0));
    if (!ones) return false;
    gamma = g.add_constant(g.nodes()[i].name + "_scale", std::move(*ones));
  }
  Attributes attrs;
  attrs.set("axis", int64_t{-1});
  attrs.set("epsilon", r->norm.eps);
  std::vector<ValueId> inputs = {r->norm.x, gamma};
  if (r->beta != kNoValue) inputs.push_back(r->beta);
  for (size_t n : r->consumed) rw.remove(n);
  const bool layer = r->norm.layer;
  retarget(g.mutable_nodes()[i], layer ? "LayerNormalization" : "RMSNormalization",
           std::move(inputs), std::move(attrs));
  ctx.note(layer ? "RecognizeComposites/LayerNormalization"
                 : "RecognizeComposites/RMSNormalization");
  return true;
}

// ---- GroupNormalization ----

// A constant per channel of x [N, C, ...] (shape [C, 1, ...] or [1, C, 1, ...], or [C]) as [C],
// or nullopt.
std::optional<Tensor> channel_vector(const Graph& g, ValueId p, ValueId x, int64_t channels) {
  const Tensor* t = constant(g, p);
  const auto& xs = g.value(x).type.shape;
  if (!t || !xs || t->dtype() != dtype_of_value(g, x) || t->numel() != channels ||
      t->rank() > static_cast<int64_t>(xs->size()))
    return std::nullopt;
  for (int64_t d = 0; d < t->rank(); ++d) {
    const int64_t axis = d + static_cast<int64_t>(xs->size()) - t->rank();
    if (t->dim(d) != 1 && axis != 1) return std::nullopt;
  }
  return t->contiguous().reshape({channels});
}

// Every element of constant v equals `want` (numel `count`).
bool all_equal(const Graph& g, ValueId v, int64_t count, double want) {
  const Tensor* t = v == kNoValue ? nullptr : constant(g, v);
  if (!t || t->numel() != count) return false;
  for (double d : to_doubles(*t))
    if (d != want) return false;
  return true;
}

struct GroupNormMatch {
  std::vector<size_t> consumed;
  ValueId x = kNoValue;
  int64_t groups = 0, channels = 0;
  double eps = 1e-5;
  ValueId gamma = kNoValue, beta = kNoValue;  // per-channel constants, or none
};

// torch.onnx.export's GroupNorm (before opset 18 had the op), ending at node `i`:
// [Add(Mul(r, gamma), beta) | Mul(r, gamma) | Add(r, beta) | r], r = Reshape(InstanceNormalization(
// Reshape(x, [N, G, -1]), ones, zeros), x's shape): G groups of C / G channels.
std::optional<GroupNormMatch> match_group_norm(Rewrite& rw, size_t i) {
  Graph& g = rw.graph();
  const Node& root = g.nodes()[i];
  if (root.outputs.size() != 1 || !root.domain.empty()) return std::nullopt;
  for (int form = 0; form < 4; ++form) {
    GroupNormMatch r;
    Matcher m{g, rw.uses(), {}};
    ValueId v = root.outputs[0];
    const Node* node = &root;
    // Add(Mul(r, gamma), beta), or Add(r, beta) (a unit gamma the passes removed).
    if (form == 0 || form == 3) {
      if (root.op != "Add" || root.inputs.size() != 2) continue;
      const int side = constant(g, root.inputs[0]) ? 1 : 0;
      r.beta = root.inputs[1 - side];
      node = m.inner(root.inputs[side], form == 0 ? "Mul" : "Reshape");
      if (!node) continue;
    }
    if (form <= 1) {  // Mul(r, gamma)
      if (node->op != "Mul" || node->inputs.size() != 2) continue;
      const int side = constant(g, node->inputs[0]) ? 1 : 0;
      r.gamma = node->inputs[1 - side];
      v = node->inputs[side];
      node = nullptr;
    }
    const Node* back = node ? (node->op == "Reshape" ? node : nullptr) : m.inner(v, "Reshape");
    if (!back || back->inputs.empty()) continue;
    const Node* in = m.inner(back->inputs[0], "InstanceNormalization");
    if (!in || in->inputs.size() != 3) continue;
    const Node* split = m.inner(in->inputs[0], "Reshape");
    if (!split || split->inputs.empty()) continue;
    r.x = split->inputs[0];
    const auto& xs = g.value(r.x).type.shape;
    const auto& ss = g.value(in->inputs[0]).type.shape;
    if (!xs || xs->size() < 3 || !(*xs)[1].is_known() || !ss || ss->size() != 3 ||
        !(*ss)[1].is_known() || !same_dim((*ss)[0], (*xs)[0]) ||
        !is_floating(dtype_of_value(g, r.x)))
      continue;
    // The Reshape back gives x's shape: statically, or as Shape(x) (a dynamic export's).
    const Node* shape_of = back->inputs.size() > 1 ? producer(g, back->inputs[1]) : nullptr;
    if (!same_shape(g, back->outputs[0], r.x) &&
        !(shape_of && shape_of->op == "Shape" && !shape_of->inputs.empty() &&
          shape_of->inputs[0] == r.x && !shape_of->attrs.has("start") &&
          !shape_of->attrs.has("end")))
      continue;
    r.channels = (*xs)[1].value, r.groups = (*ss)[1].value;
    if (r.groups < 1 || r.channels % r.groups != 0) continue;
    // [N, G, -1] must split the channel axis into groups: a target [0 | N, G, -1], or a last
    // dimension of (C / G) * spatial.
    int64_t spatial = 1;
    for (size_t d = 2; d < xs->size(); ++d) {
      if (!(*xs)[d].is_known()) spatial = -1;
      if (spatial > 0) spatial *= (*xs)[d].value;
    }
    const std::optional<std::vector<int64_t>> to =
        split->inputs.size() > 1 ? constant_ints(g, *split, 1) : std::nullopt;
    const bool target = to && to->size() == 3 && (*to)[1] == r.groups && (*to)[2] == -1 &&
                        (((*to)[0] == 0 && split->attrs.get_int("allowzero", 0) == 0) ||
                         ((*xs)[0].is_known() && (*to)[0] == (*xs)[0].value));
    if (!target &&
        (spatial < 0 || !(*ss)[2].is_known() || (*ss)[2].value != r.channels / r.groups * spatial))
      continue;
    if (!all_equal(g, in->inputs[1], r.groups, 1.0) || !all_equal(g, in->inputs[2], r.groups, 0.0))
      continue;
    r.eps = in->attrs.get_float("epsilon", 1e-5f);
    if (r.gamma != kNoValue && !channel_vector(g, r.gamma, r.x, r.channels)) continue;
    if (r.beta != kNoValue && !channel_vector(g, r.beta, r.x, r.channels)) continue;
    r.consumed = std::move(m.consumed);
    return r;
  }
  return std::nullopt;
}

bool group_norm(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const std::string& op = g.nodes()[i].op;
  if (op != "Add" && op != "Mul" && op != "Reshape") return false;
  auto r = match_group_norm(rw, i);
  if (!r) return false;
  if (reader_matches(rw, i, match_group_norm)) return false;
  const DType dt = dtype_of_value(g, r->x);
  auto param = [&](ValueId v, double fill, const char* suffix) -> std::optional<ValueId> {
    std::optional<Tensor> t =
        v != kNoValue ? channel_vector(g, v, r->x, r->channels)
                      : float_tensor(dt, {r->channels},
                                     std::vector<double>(static_cast<size_t>(r->channels), fill));
    if (!t) return std::nullopt;
    return g.add_constant(g.nodes()[i].name + suffix, std::move(*t));
  };
  const std::optional<ValueId> scale = param(r->gamma, 1.0, "_scale");
  const std::optional<ValueId> bias = param(r->beta, 0.0, "_bias");
  if (!scale || !bias) return false;
  Attributes attrs;
  attrs.set("epsilon", static_cast<float>(r->eps));
  attrs.set("num_groups", r->groups);
  for (size_t n : r->consumed) rw.remove(n);
  // Opset 21's meaning (the latest): scale and bias per channel.
  retarget(g.mutable_nodes()[i], "GroupNormalization", {r->x, *scale, *bias}, std::move(attrs));
  ctx.note("RecognizeComposites/GroupNormalization");
  return true;
}

Graph recognize_composites(Graph g, const PassContext& ctx) {
  apply_rules(g, {{nullptr, gelu}, {nullptr, hard_swish}, {nullptr, norm}, {nullptr, group_norm}},
              ctx);
  return g;
}

}  // namespace

void register_recognize_composites(PassRegistry& r) {
  r.add({"RecognizeComposites", recognize_composites,
         "replaces GELU (erf and tanh forms), LayerNorm, RMSNorm and GroupNorm spelled out in "
         "primitive ops by Gelu, LayerNormalization, RMSNormalization and GroupNormalization"});
}

}  // namespace pto::passes
