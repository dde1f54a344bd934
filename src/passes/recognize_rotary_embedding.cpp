// RecognizeRotaryEmbedding: finds the rotary position embedding as transformers writes it for
// Llama, Mistral, Qwen, Gemma, Phi-3 and GPT-NeoX (apply_rotary_pos_emb with rotate_half), and as
// the ONNX exporters keep it, and replaces it by one ONNX RotaryEmbedding:
//
//   Add(Mul(x, cos), Mul(Concat(Neg(Slice(x, h:D)), Slice(x, 0:h), axis=-1), sin))
//     -> RotaryEmbedding(x, cos[..., :h] as [B, S, h], sin[..., :h] as [B, S, h])
//
// for x = [B, H, S, D] float32 (D even, h = D / 2), cos and sin [B, 1, S, D] (the heads axis
// broadcast, transformers' unsqueeze(1)) or [S, D] with B = 1. Eleven small kernels a layer
// (two rotations of five ops: the Slices, Neg, Concat and the Muls and Add) become two; in a
// decode step they were ~10% of the time outside the weight products.
//
// The one fact the rewrite needs beyond the shapes: RotaryEmbedding rotates the pair (k, k + h)
// by one angle, cos[k] and sin[k], where the spelled-out form multiplies x[k + h] by cos[k + h].
// The two agree only when each cache's halves are equal, which transformers' caches are by
// construction: emb = cat(freqs, freqs); cos = emb.cos() * scaling. The pass proves it on the
// graph, not by name: the cache must come from Concat(f, f) on its last axis through ops that
// keep equal halves equal (Cos, Sin and other one-input elementwise ops, a Mul, Div, Add or Sub
// by a one-element constant, Unsqueeze and Reshape that keep the last axis, Expand and Cast).
// A cache computed any other way (an input, a table of another form) is left as it was.
//
// Matching is backwards from the Add; either operand order of the Add and of each Mul. Every
// intermediate must be read only inside the pattern; x, cos and sin may have other readers (the
// same cos and sin serve Q and K in every layer). The arithmetic is the same products and sums
// (x1 cos - x2 sin is x1 cos + (-x2) sin exactly): results agree to the bit, or to an ulp where a
// compiler contracts a product and a sum.
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

// Whether the last axis of v is two equal halves, proved through at most `depth` producers.
bool halves_equal(const Graph& g, ValueId v, int depth = 12) {
  const Node* n = producer(g, v);
  if (!n || depth == 0 || !n->domain.empty() || n->outputs.size() != 1) return false;
  const TensorType& t = g.value(v).type;
  if (!t.shape || t.shape->empty()) return false;
  const auto rank = static_cast<int64_t>(t.shape->size());
  const std::string& op = n->op;
  if (op == "Concat") {
    const int64_t axis = n->attrs.get_int("axis", 0);
    return n->inputs.size() == 2 && n->inputs[0] == n->inputs[1] &&
           (axis == -1 || axis == rank - 1);
  }
  static const char* const kUnary[] = {"Cos",   "Sin",  "Neg", "Cast", "Identity", "Exp",
                                       "Sqrt",  "Relu", "Abs", "Tanh", "Sigmoid",  "Reciprocal",
                                       "Floor", "Ceil", "Erf", "Log"};
  for (const char* u : kUnary)
    if (op == u) return n->inputs.size() == 1 && halves_equal(g, n->inputs[0], depth - 1);
  if (op == "Mul" || op == "Div" || op == "Add" || op == "Sub") {
    if (n->inputs.size() != 2) return false;
    for (int k : {0, 1}) {
      const Tensor* c = constant(g, n->inputs[k]);
      const bool one =
          c ? c->numel() == 1 && c->rank() <= rank : scalar_constant(g, n->inputs[k]).has_value();
      if (one) return halves_equal(g, n->inputs[1 - k], depth - 1);
    }
    return false;
  }
  // Shape ops: the last axis must be the input's, whole (the same size, known).
  const ValueId x = n->inputs.empty() ? kNoValue : n->inputs[0];
  if (x == kNoValue) return false;
  const TensorType& xt = g.value(x).type;
  if (!xt.shape || xt.shape->empty()) return false;
  const Dim &last = t.shape->back(), &in_last = xt.shape->back();
  if (!last.is_known() || !same_dim(last, in_last)) return false;
  if (op == "Unsqueeze") {
    std::optional<std::vector<int64_t>> axes = constant_ints(g, *n, 1);
    if (!axes) axes = n->attrs.get_ints("axes", {});
    for (int64_t a : *axes)
      if (a == -1 || a == rank - 1) return false;
    return halves_equal(g, x, depth - 1);
  }
  if (op == "Reshape" || op == "Expand") {
    // The last axis keeps its size: a Reshape moves no element within a row of it only when
    // the rows stay whole, which equal sizes of the last axis give (rows of one length in
    // row-major order); an Expand copies whole rows.
    return halves_equal(g, x, depth - 1);
  }
  return false;
}

// Slice(x, [lo], [hi], [last axis]) with step 1: the half [begin, end) of x's last axis of size
// d; nullopt otherwise.
std::optional<std::pair<int64_t, int64_t>> last_axis_range(const Graph& g, const Node& s,
                                                           int64_t rank, int64_t d) {
  if (s.op != "Slice" || !s.domain.empty() || s.inputs.size() < 4) return std::nullopt;
  const auto starts = constant_ints(g, s, 1), ends = constant_ints(g, s, 2),
             axes = constant_ints(g, s, 3);
  if (!starts || !ends || !axes || starts->size() != 1 || ends->size() != 1 || axes->size() != 1)
    return std::nullopt;
  if ((*axes)[0] != -1 && (*axes)[0] != rank - 1) return std::nullopt;
  if (s.inputs.size() > 4 && s.inputs[4] != kNoValue) {
    const auto steps = constant_ints(g, s, 4);
    if (!steps || steps->size() != 1 || (*steps)[0] != 1) return std::nullopt;
  }
  auto clamp = [d](int64_t v) { return std::clamp(v < 0 ? v + d : v, int64_t{0}, d); };
  return std::pair{clamp((*starts)[0]), clamp((*ends)[0])};
}

struct Match {
  ValueId x = kNoValue, cos = kNoValue, sin = kNoValue;
  std::vector<size_t> consumed;
};

// The producer of v when it is `op`, read once, not an output; recorded as consumed.
const Node* single(const Graph& g, const std::vector<int>& uses, ValueId v, const char* op,
                   Match& m) {
  const Node* n = producer(g, v);
  if (!n || n->op != op || !n->domain.empty() || n->outputs.size() != 1 || uses[v] != 1 ||
      g.is_output(v))
    return nullptr;
  m.consumed.push_back(static_cast<size_t>(g.value(v).producer));
  return n;
}

// rotate_half(x) * sin, either order of the Mul: fills x and sin.
bool rotated_term(const Graph& g, const std::vector<int>& uses, ValueId v, Match& m) {
  const size_t mark = m.consumed.size();
  const Node* mul = single(g, uses, v, "Mul", m);
  if (!mul || mul->inputs.size() != 2) return false;
  for (int k : {0, 1}) {
    m.consumed.resize(mark + 1);
    const Node* cat = single(g, uses, mul->inputs[k], "Concat", m);
    if (!cat || cat->inputs.size() != 2) continue;
    const Node* neg = single(g, uses, cat->inputs[0], "Neg", m);
    const Node* hi = neg ? single(g, uses, neg->inputs[0], "Slice", m) : nullptr;
    const Node* lo = hi ? single(g, uses, cat->inputs[1], "Slice", m) : nullptr;
    if (!lo || lo->inputs[0] != hi->inputs[0]) continue;
    const ValueId x = lo->inputs[0];
    const TensorType& t = g.value(x).type;
    if (t.dtype != DType::kF32 || !t.shape || t.shape->size() != 4 || !t.shape->back().is_known())
      continue;
    const int64_t d = t.shape->back().value, h = d / 2;
    const int64_t axis = cat->attrs.get_int("axis", 0);
    if (d == 0 || d % 2 || (axis != -1 && axis != 3)) continue;
    if (last_axis_range(g, *lo, 4, d) != std::pair{int64_t{0}, h} ||
        last_axis_range(g, *hi, 4, d) != std::pair{h, d})
      continue;
    m.x = x;
    m.sin = mul->inputs[1 - k];
    return true;
  }
  m.consumed.resize(mark);
  return false;
}

// Whether a cache of this shape broadcasts over x = [B, H, S, D] as one row per (batch,
// position): [B, 1, S, D], or [S, D] with B = 1.
bool cache_shape_fits(const Graph& g, ValueId c, const Shape& x) {
  const TensorType& t = g.value(c).type;
  if (t.dtype != DType::kF32 || !t.shape) return false;
  const Shape& s = *t.shape;
  if (s.size() == 4)
    return same_dim(s[0], x[0]) && s[1].is_known() && s[1].value == 1 && same_dim(s[2], x[2]) &&
           same_dim(s[3], x[3]);
  if (s.size() == 2)
    return x[0].is_known() && x[0].value == 1 && same_dim(s[0], x[2]) && same_dim(s[1], x[3]);
  return false;
}

std::optional<Match> match(const Graph& g, const std::vector<int>& uses, const Node& add) {
  if (add.op != "Add" || !add.domain.empty() || add.inputs.size() != 2 || add.outputs.size() != 1)
    return std::nullopt;
  for (int k : {0, 1}) {
    Match m;
    if (!rotated_term(g, uses, add.inputs[1 - k], m)) continue;
    const Node* mul = single(g, uses, add.inputs[k], "Mul", m);
    if (!mul || mul->inputs.size() != 2) continue;
    for (int j : {0, 1}) {
      if (mul->inputs[j] != m.x) continue;
      m.cos = mul->inputs[1 - j];
      const Shape& xs = *g.value(m.x).type.shape;
      if (cache_shape_fits(g, m.cos, xs) && cache_shape_fits(g, m.sin, xs) &&
          g.value(m.cos).type.shape->size() == g.value(m.sin).type.shape->size() &&
          halves_equal(g, m.cos) && halves_equal(g, m.sin))
        return m;
    }
  }
  return std::nullopt;
}

// cache[..., :h] as RotaryEmbedding's [B, S, h]: Slice, then Squeeze of the heads axis (4-D) or
// Unsqueeze of a batch axis (2-D). Inserted at `at`; returns the new value.
ValueId half_cache(Rewrite& rw, size_t& at, ValueId cache, int64_t h, const std::string& name) {
  Graph& g = rw.graph();
  const bool four = g.value(cache).type.shape->size() == 4;
  auto ints = [&](const char* what, std::vector<int64_t> v) {
    const auto n = static_cast<int64_t>(v.size());
    return g.add_constant(name + what, Tensor::from_vector<int64_t>(v, {n}));
  };
  const ValueId half = g.add_value(g.unique_name(name + "_half"), {DType::kF32, std::nullopt});
  rw.insert(at++, "Slice", {cache, ints("_starts", {0}), ints("_ends", {h}), ints("_axes", {-1})},
            {half}, {}, name + "_half");
  const ValueId rows = g.add_value(g.unique_name(name + "_rows"), {DType::kF32, std::nullopt});
  rw.insert(at++, four ? "Squeeze" : "Unsqueeze", {half, ints("_axis", {four ? 1 : 0})}, {rows}, {},
            name + "_rows");
  return rows;
}

bool rotary(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const std::optional<Match> m = match(g, rw.uses(), g.nodes()[i]);
  if (!m) return false;
  const int64_t h = g.value(m->x).type.shape->back().value / 2;
  const std::string name = g.nodes()[i].name;
  size_t at = i;
  const ValueId cos = half_cache(rw, at, m->cos, h, name + "_cos");
  const ValueId sin = half_cache(rw, at, m->sin, h, name + "_sin");
  for (size_t n : m->consumed) rw.remove(n < i ? n : n + (at - i));
  retarget(g.mutable_nodes()[at], "RotaryEmbedding", {m->x, cos, sin});
  ctx.note("RecognizeRotaryEmbedding/RotateHalf");
  return true;
}

Graph recognize_rotary_embedding(Graph g, const PassContext& ctx) {
  apply_rules(g, {{nullptr, rotary}}, ctx);
  return g;
}

}  // namespace

void register_recognize_rotary_embedding(PassRegistry& r) {
  r.add({"RecognizeRotaryEmbedding", recognize_rotary_embedding,
         "replaces x * cos + rotate_half(x) * sin (transformers' form, caches with equal halves) "
         "by one RotaryEmbedding op"});
}

}  // namespace pto::passes
