// SimplifyTransposes: merges chains of layout ops whose intermediate value has no other use.
//   Transpose(Transpose(x, p), q)        -> Transpose(x, r) with r[i] = p[q[i]], or x when r is
//                                           the identity
//   Reshape-like(Reshape-like(x)) with a static result shape
//                                        -> Reshape(x, constant shape) (Reshape, Flatten, Squeeze,
//                                           Unsqueeze: all only relabel the row-major elements)
//   Transpose(x, p) moving only axes of size 1 (static shapes)
//                                        -> Reshape(x, constant shape)
//   Reshape(Transpose(Reshape(x), p), s) that merges x's k leading axes, permutes the others
//   (p[0] = 0) and splits the leading ones back (shapes proved, symbols included)
//                                        -> Transpose(x, [0..k-1, k-1+p[1], ...]) (the dynamo
//                                           exporter's batched-matmul form of K^T)
//   Cast(Cast(x, T1), T2) where x -> T1 is lossless
//                                        -> Cast(x, T2), or x when T2 is x's dtype
// One forward sweep, rewriting the outer node in place: a chain of three collapses as it goes,
// since the rewritten node is the inner one of the next pair. The inner node, now unused, goes.
#include <algorithm>
#include <numeric>

#include "passes/passes.h"
#include "passes/rewrite_util.h"
#include "pto/op_registry.h"

namespace pto::passes {
namespace {

struct Sweep {
  Graph& g;
  const PassContext& ctx;
  std::vector<int> uses;
  std::vector<bool> removed;

  // The producer of `v` when it is op `op`-like (by `pred`), unremoved, and `v` has one use.
  template <class Pred>
  int single_use_producer(ValueId v, Pred pred) const {
    if (v == kNoValue || uses[v] != 1 || g.is_output(v)) return -1;
    int p = g.value(v).producer;
    if (p < 0 || removed[p] || !pred(g.nodes()[p])) return -1;
    if (g.nodes()[p].outputs.size() != 1 || !g.nodes()[p].domain.empty()) return -1;
    return p;
  }

  void drop(int p) {
    removed[p] = true;
    for (ValueId v : g.nodes()[p].inputs)
      if (v != kNoValue) --uses[v];
  }

  // The outer node `i` now reads `x` in place of `inner`'s output, which loses its only use.
  void rewire(size_t i, int inner, ValueId x) {
    g.mutable_nodes()[i].inputs[0] = x;
    ++uses[x];
    uses[g.nodes()[inner].outputs[0]] = 0;
    drop(inner);
  }

  // Replaces the outer node `i` by `x` entirely (when can_replace allows); true when done.
  bool bypass(size_t i, ValueId x) {
    ValueId out = g.nodes()[i].outputs[0];
    if (!can_replace(g, out, x)) return false;
    uses[x] += uses[out];
    uses[out] = 0;
    drop(static_cast<int>(i));
    g.replace_uses(out, x);
    return true;
  }

  static std::optional<std::vector<int64_t>> perm_of(const Graph& g, const Node& n) {
    if (n.attrs.has("perm")) return n.attrs.get_ints("perm");
    const TensorType& t = g.value(n.inputs[0]).type;
    if (!t.shape) return std::nullopt;
    std::vector<int64_t> p(t.shape->size());
    std::iota(p.rbegin(), p.rend(), 0);  // the default reverses the axes
    return p;
  }

  void transposes(size_t i) {
    const Node& outer = g.nodes()[i];
    int inner =
        single_use_producer(outer.inputs[0], [](const Node& n) { return n.op == "Transpose"; });
    if (inner < 0) return;
    const Node& in = g.nodes()[inner];
    std::optional<std::vector<int64_t>> p = perm_of(g, in), q = perm_of(g, outer);
    if (!p || !q || p->size() != q->size()) return;
    std::vector<int64_t> r(q->size());
    for (size_t k = 0; k < q->size(); ++k) {
      int64_t a = (*q)[k];
      if (a < 0 || a >= static_cast<int64_t>(p->size())) return;
      r[k] = (*p)[static_cast<size_t>(a)];
    }
    ValueId x = in.inputs[0];
    bool identity = true;
    for (size_t k = 0; k < r.size(); ++k) identity = identity && r[k] == static_cast<int64_t>(k);
    if (identity && bypass(i, x)) {
      drop(inner);
      uses[g.nodes()[inner].outputs[0]] = 0;
      ctx.note("SimplifyTransposes/Transpose-Transpose=identity");
      return;
    }
    g.mutable_nodes()[i].attrs.set("perm", r);
    rewire(i, inner, x);
    ctx.note("SimplifyTransposes/Transpose-Transpose");
  }

  // Node i becomes op `op` of its input 0 alone, no attributes; its other inputs lose a reader.
  Node& become(size_t i, const char* op) {
    Node& n = g.mutable_nodes()[i];
    for (size_t k = 1; k < n.inputs.size(); ++k)
      if (n.inputs[k] != kNoValue) --uses[n.inputs[k]];
    n.op = op;
    n.def = OpRegistry::global().find(op);
    n.attrs = Attributes();
    n.attrs.where = n.where();
    n.inputs = {n.inputs[0]};
    return n;
  }

  // Node i becomes Reshape(its input 0, constant `dims`).
  void make_reshape(size_t i, const Dims& dims) {
    const ValueId shape =
        g.add_constant(g.value(g.nodes()[i].outputs[0]).name + "_shape",
                       Tensor::from_vector(dims, {static_cast<int64_t>(dims.size())}));
    uses.push_back(1);
    become(i, "Reshape").inputs.push_back(shape);
  }

  // A Transpose that moves only axes of size 1 keeps the row-major order of the elements: it is
  // a Reshape (a view, no copy), merged with a Reshape-like node before it. A decode step's head
  // split is one: [1, 1, 12, 64] -> [1, 12, 1, 64].
  void unit_moves(size_t i) {
    const Node& n = g.nodes()[i];
    const std::optional<Dims> in = static_dims(g, n.inputs[0]), out = static_dims(g, n.outputs[0]);
    const std::optional<std::vector<int64_t>> p = perm_of(g, n);
    if (!in || !out || !p || p->size() != in->size() || n.inputs.size() != 1) return;
    if (std::find(out->begin(), out->end(), 0) != out->end()) return;  // Reshape's 0 copies
    int64_t last = -1;
    for (const int64_t a : *p) {
      if (a < 0 || a >= static_cast<int64_t>(in->size())) return;
      if ((*in)[static_cast<size_t>(a)] == 1) continue;
      if (a < last) return;
      last = a;
    }
    make_reshape(i, *out);
    ctx.note("SimplifyTransposes/Transpose=Reshape");
    reshapes(i);
  }

  // Reshape(Transpose(Reshape(x, [d0*..*dk-1, rest]), p), [d0, .., dk-1, p(rest)]) with p[0] = 0:
  // the leading axes only ride along, so it is one Transpose of x. The dynamo exporter writes
  // K^T of a [b, h, L, d] key that way: [b*h, L, d] -> [b*h, d, L] -> [b, h, d, L].
  bool grouped_transpose(size_t i) {
    const Node& outer = g.nodes()[i];
    const int t =
        single_use_producer(outer.inputs[0], [](const Node& n) { return n.op == "Transpose"; });
    if (t < 0 || (outer.opset > 0 && outer.opset < 5)) return false;
    const int r = single_use_producer(g.nodes()[t].inputs[0],
                                      [](const Node& n) { return n.op == "Reshape"; });
    if (r < 0) return false;
    const ValueId x = g.nodes()[r].inputs[0];
    const std::optional<Shape>&xs = g.value(x).type.shape,
          &merged = g.value(g.nodes()[r].outputs[0]).type.shape,
          &ys = g.value(outer.outputs[0]).type.shape;
    const std::optional<std::vector<int64_t>> p = perm_of(g, g.nodes()[t]);
    if (!xs || !merged || !ys || !p || ys->size() != xs->size() || merged->empty() ||
        p->size() != merged->size() || (*p)[0] != 0)
      return false;
    const size_t n = xs->size(), m = merged->size(), k = n - m + 1;
    if (k < 2 || k > n) return false;
    auto named = [](const Dim& d) { return d.is_known() || d.is_symbolic(); };
    Dim lead(1);
    for (size_t a = 0; a < k; ++a) {
      if (!named((*xs)[a]) || !((*ys)[a] == (*xs)[a])) return false;
      lead = dim_mul(lead, (*xs)[a]);
    }
    if (!named(lead) || !((*merged)[0] == lead)) return false;
    std::vector<int64_t> perm(n);
    std::iota(perm.begin(), perm.begin() + static_cast<std::ptrdiff_t>(k), 0);
    for (size_t j = 1; j < m; ++j) {
      const int64_t from = (*p)[j];
      if (from < 1 || from >= static_cast<int64_t>(m)) return false;
      const auto src = static_cast<size_t>(from);
      if (!named((*merged)[j]) || !((*merged)[j] == (*xs)[k - 1 + j]) ||
          !((*ys)[k - 1 + j] == (*merged)[src]))
        return false;
      perm[k - 1 + j] = static_cast<int64_t>(k - 1 + src);
    }
    become(i, "Transpose").attrs.set("perm", perm);
    rewire(i, t, x);
    uses[g.nodes()[r].outputs[0]] = 0;
    drop(r);
    ctx.note("SimplifyTransposes/Reshape-Transpose-Reshape");
    return true;
  }

  static bool reshape_like(const Node& n) {
    return n.op == "Reshape" || n.op == "Flatten" || n.op == "Squeeze" || n.op == "Unsqueeze";
  }

  void reshapes(size_t i) {
    const Node& outer = g.nodes()[i];
    int inner = single_use_producer(outer.inputs[0], reshape_like);
    if (inner < 0) return;
    std::optional<Dims> dims = static_dims(g, outer.outputs[0]);
    // A 0 in a Reshape shape means "copy the input's dim" unless allowzero; not worth the risk.
    if (!dims || std::find(dims->begin(), dims->end(), 0) != dims->end()) return;
    if (outer.opset > 0 && outer.opset < 5) return;  // Reshape-1 took its shape as an attribute
    ValueId x = g.nodes()[inner].inputs[0];
    make_reshape(i, *dims);
    rewire(i, inner, x);
    ctx.note("SimplifyTransposes/Reshape-Reshape");
  }

  // Whether every value of `from` is exactly a value of `to`, so that casting through `to`
  // changes nothing on the way.
  static bool lossless(DType from, DType to) {
    if (from == to || from == DType::kBool) return to != DType::kUndefined;
    auto bits = [](DType d) -> int {  // value bits of an integer type (sign excluded)
      switch (d) {
        case DType::kI8:
          return 7;
        case DType::kU8:
          return 8;
        case DType::kI16:
          return 15;
        case DType::kU16:
          return 16;
        case DType::kI32:
          return 31;
        case DType::kU32:
          return 32;
        case DType::kI64:
          return 63;
        case DType::kU64:
          return 64;
        default:
          return -1;
      }
    };
    auto mantissa = [](DType d) -> int {  // significand bits, implicit bit included
      switch (d) {
        case DType::kF16:
          return 11;
        case DType::kBF16:
          return 8;
        case DType::kF32:
          return 24;
        case DType::kF64:
          return 53;
        default:
          return -1;
      }
    };
    if (is_floating(from))  // f16 and bf16 widen into f32 and f64, f32 into f64
      return (to == DType::kF64 && from != DType::kF64) ||
             (to == DType::kF32 && (from == DType::kF16 || from == DType::kBF16));
    if (is_integral(from) && is_integral(to)) {
      if (is_signed(from) && !is_signed(to)) return false;
      return bits(to) >= bits(from);
    }
    if (is_integral(from) && is_floating(to)) return mantissa(to) >= bits(from);
    return false;
  }

  void casts(size_t i) {
    const Node& outer = g.nodes()[i];
    if (outer.inputs.size() != 1) return;
    int inner = single_use_producer(outer.inputs[0], [](const Node& n) {
      return n.op == "Cast" && n.inputs.size() == 1 && n.inputs[0] != kNoValue;
    });
    if (inner < 0) return;
    const Node& in = g.nodes()[inner];
    ValueId x = in.inputs[0];
    DType from = g.value(x).type.dtype;
    DType mid = g.value(in.outputs[0]).type.dtype;
    DType to = g.value(outer.outputs[0]).type.dtype;
    if (from == DType::kUndefined || !lossless(from, mid)) return;
    if (from == to && bypass(i, x)) {
      drop(inner);
      uses[g.nodes()[inner].outputs[0]] = 0;
      ctx.note("SimplifyTransposes/Cast-Cast=identity");
      return;
    }
    rewire(i, inner, x);
    ctx.note("SimplifyTransposes/Cast-Cast");
  }

  void run() {
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const Node& n = g.nodes()[i];
      if (removed[i] || n.inputs.empty() || n.inputs[0] == kNoValue || n.outputs.size() != 1 ||
          n.outputs[0] == kNoValue || !n.domain.empty())
        continue;
      try {
        if (n.op == "Transpose") {
          transposes(i);
          if (!removed[i] && g.nodes()[i].op == "Transpose") unit_moves(i);
        } else if (n.op == "Reshape" && grouped_transpose(i)) {
          transposes(i);  // with a Transpose before x
        } else if (reshape_like(n)) {
          reshapes(i);
        } else if (n.op == "Cast") {
          casts(i);
        }
      } catch (const Error&) {  // a malformed attribute: no match
      }
    }
  }
};

Graph simplify_transposes(Graph g, const PassContext& ctx) {
  Sweep s{g, ctx, g.use_counts(), std::vector<bool>(g.nodes().size(), false)};
  s.run();
  if (std::find(s.removed.begin(), s.removed.end(), true) != s.removed.end())
    g.remove_nodes(s.removed);
  // The targets of the Reshapes a rule dropped: gone now, so they count as no one's reader.
  if (const int removed = remove_unread_shape_arithmetic(g))
    ctx.note("SimplifyTransposes/unread", removed);
  return g;
}

}  // namespace

void register_simplify_transposes(PassRegistry& r) {
  r.add({"SimplifyTransposes", simplify_transposes,
         "merges Transpose, Reshape-like and lossless Cast chains into one node"});
}

}  // namespace pto::passes
