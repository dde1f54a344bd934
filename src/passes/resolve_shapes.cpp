// ResolveShapes: shape arithmetic on symbolic dimensions, so a Reshape or Expand whose target is
// computed from Shape() at run time gets a constant target even when the batch is symbolic.
//
// One forward sweep gives every small integer vector it can a symbolic value, one Dim an element
// (pto/shape_value.h, the evaluation type inference also uses): constants, Shape(x) of a value
// whose rank is known, and what Gather, Slice, Concat, Unsqueeze, Squeeze, Cast, Identity and
// integer arithmetic make of them. Then each Reshape
// whose target is such a vector gets a constant target: a known element stays, an element equal
// to the input's dimension at the same position becomes 0 (copy it), and one remaining element
// becomes -1. Expand likewise, with 1 for a dimension the input already has. And every int64
// value whose elements are all known (Gather(Shape(x), 3) of x = [batch, 12, seq, 64], and what
// arithmetic makes of it: the TorchScript exporter's x.shape[-1] // 2 before rotate_half's
// Slice) becomes a constant, so the ops that read it see a literal (a Slice's bounds, a
// Reshape's target). The shape computations left without readers go.
#include <algorithm>
#include <unordered_map>

#include "passes/passes.h"
#include "passes/rewrite_util.h"
#include "pto/shape_value.h"

namespace pto::passes {
namespace {

using ShapeValues = std::unordered_map<ValueId, ShapeValue>;

const ShapeValue* find(const ShapeValues& sv, ValueId v) {
  auto it = sv.find(v);
  return it == sv.end() ? nullptr : &it->second;
}

// Whether axis `axis` of x is the same dimension as axis `of_axis` of `of`: the same value, or x
// made from it by Identity and Unsqueeze (constant axes; repeat_kv's Unsqueeze(kv, 2)).
bool same_dimension(const Graph& g, ValueId x, int64_t axis, ValueId of, int64_t of_axis) {
  for (int hops = 0; hops < 8; ++hops) {
    if (x == of) return axis == of_axis;
    const Node* n = producer(g, x);
    if (!n || !n->domain.empty() || n->outputs.size() != 1 || n->inputs.empty()) return false;
    if (n->op == "Unsqueeze") {
      const std::optional<Shape>& xs = g.value(x).type.shape;
      std::optional<std::vector<int64_t>> axes =
          n->inputs.size() > 1 ? constant_ints(g, *n, 1) : n->attrs.get_ints("axes", {});
      if (!xs || !axes || axes->empty()) return false;
      const auto rank = static_cast<int64_t>(xs->size());
      for (int64_t& a : *axes) a = a < 0 ? a + rank : a;
      if (std::find(axes->begin(), axes->end(), axis) != axes->end()) return false;  // a new axis
      axis -= std::count_if(axes->begin(), axes->end(), [&](int64_t a) { return a < axis; });
    } else if (n->op != "Identity") {
      return false;
    }
    x = n->inputs[0];
  }
  return false;
}

// Whether element i of s is x's dimension `axis`: the same known size or symbol, or an element
// of Shape() of the tensor whose dimension it is (an unnamed length).
bool is_dimension(const Graph& g, const ShapeValue& s, size_t i, ValueId x, int64_t axis) {
  const Dim& d = s.dims[i];
  const std::optional<Shape>& xs = g.value(x).type.shape;
  if (xs && d.is_symbolic() && (*xs)[axis] == d) return true;
  const ShapeValue::Element& e = s.elements[i];
  return !d.is_known() && e.tensor != kNoValue && same_dimension(g, x, axis, e.tensor, e.axis);
}

// Reshape's target as constants, or nullopt when more than one element stays unknown.
std::optional<std::vector<int64_t>> reshape_target(const Graph& g, const ShapeValue& s, ValueId x) {
  const std::optional<Shape>& xs = g.value(x).type.shape;
  std::vector<int64_t> out;
  int unresolved = 0;
  for (size_t i = 0; i < s.dims.size(); ++i) {
    const Dim& d = s.dims[i];
    if (d.is_known()) {
      if (d.value == -1) ++unresolved;
      out.push_back(d.value);
    } else if (xs && i < xs->size() && is_dimension(g, s, i, x, static_cast<int64_t>(i))) {
      out.push_back(0);  // copy the input's dimension
    } else {
      ++unresolved;
      out.push_back(-1);
    }
  }
  if (unresolved > 1) return std::nullopt;
  return out;
}

// Expand's target as constants: 1 keeps a dimension the input has (right-aligned).
std::optional<std::vector<int64_t>> expand_target(const Graph& g, const ShapeValue& s, ValueId x) {
  const std::optional<Shape>& xs = g.value(x).type.shape;
  if (!xs) return std::nullopt;
  std::vector<int64_t> out;
  const size_t rank = s.dims.size(), xrank = xs->size();
  for (size_t i = 0; i < rank; ++i) {
    if (s.dims[i].is_known()) {
      out.push_back(s.dims[i].value);
      continue;
    }
    if (i + xrank < rank || !is_dimension(g, s, i, x, static_cast<int64_t>(i + xrank - rank)))
      return std::nullopt;
    out.push_back(1);
  }
  return out;
}

// One forward sweep: the targets and known values it can prove now; whether it changed anything.
bool resolve_once(Graph& g, const PassContext& ctx) {
  const std::vector<int> uses = g.use_counts();
  ShapeValues sv;
  for (const auto& [v, t] : g.initializers())
    if (auto c = shape_value_of_constant(t)) sv[v] = *c;
  std::vector<std::pair<size_t, std::vector<int64_t>>> targets;  // node, new input 1
  std::vector<ValueId> known;  // computed int64 values whose every element is known
  const auto& nodes = g.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.outputs.size() == 1 && n.outputs[0] != kNoValue) {
      std::vector<TensorType> types;
      std::vector<const ShapeValue*> values;
      for (ValueId v : n.inputs) {
        types.push_back(v == kNoValue ? TensorType{} : g.value(v).type);
        values.push_back(v == kNoValue ? nullptr : find(sv, v));
      }
      if (auto r = evaluate_shape_value(n, types, values)) {
        const ValueId y = n.outputs[0];
        if (r->literal() && n.op != "Constant" && !g.initializer(y) && !g.is_output(y) &&
            uses[y] > 0 && dtype_of_value(g, y) == DType::kI64)
          known.push_back(y);
        sv[y] = std::move(*r);
      }
    }
    if ((n.op != "Reshape" && n.op != "Expand") || n.inputs.size() < 2) continue;
    if (constant_of(g, n.inputs[1])) continue;  // already constant
    const ShapeValue* s = find(sv, n.inputs[1]);
    if (!s || s->scalar) continue;
    std::optional<std::vector<int64_t>> t;
    if (n.op == "Reshape" && n.attrs.get_int("allowzero", 0) == 0)
      t = reshape_target(g, *s, n.inputs[0]);
    else if (n.op == "Expand")
      t = expand_target(g, *s, n.inputs[0]);
    if (t) targets.push_back({i, std::move(*t)});
  }
  bool known_replaced = false;
  for (const ValueId y : known) {
    const ShapeValue& v = sv.at(y);
    std::vector<int64_t> data;
    for (const Dim& d : v.dims) data.push_back(d.value);
    const TensorType& t = g.value(y).type;
    const Dims dims = v.scalar ? Dims{} : Dims{static_cast<int64_t>(data.size())};
    if (!t.shape || to_shape(dims) != *t.shape) continue;  // a type that says otherwise: leave it
    g.replace_uses(y, g.add_constant(g.value(y).name + "_known", Tensor::from_vector(data, dims)));
    ctx.note("ResolveShapes/Known");
    known_replaced = true;
  }
  const bool changed = known_replaced || !targets.empty();
  for (auto& [i, t] : targets) {
    Node& n = g.mutable_nodes()[i];
    const auto len = static_cast<int64_t>(t.size());
    n.inputs[1] = g.add_constant(n.name + "_shape", Tensor::from_vector<int64_t>(t, {len}));
    ctx.note(cat("ResolveShapes/", n.op));
  }
  return changed;
}

Graph resolve_shapes(Graph g, const PassContext& ctx) {
  // A constant found in one sweep sharpens the types after it (a Slice's end, known now, gives
  // its result a known last dim, whose Shape() the TorchScript exporter's rotate_half reads):
  // sweep again with the types inferred anew while that finds more, a few times at most.
  for (int round = 0; round < 4 && resolve_once(g, ctx); ++round) infer_types(g);
  // The shape arithmetic the constants left unread goes now, not only at EliminateDeadCode: a
  // Shape(v) nobody reads would still count as a reader of v for the passes between (a
  // single-reader check such as RecognizeAttention's on repeat_kv).
  if (const int removed = remove_unread_shape_arithmetic(g))
    ctx.note("ResolveShapes/unread", removed);
  return g;
}

}  // namespace

void register_resolve_shapes(PassRegistry& r) {
  r.add({"ResolveShapes", resolve_shapes,
         "gives Reshape and Expand constant targets computed from Shape() with symbolic dims"});
}

}  // namespace pto::passes
