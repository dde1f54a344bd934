// ResolveShapes: shape arithmetic on symbolic dimensions, so a Reshape or Expand whose target is
// computed from Shape() at run time gets a constant target even when the batch is symbolic.
//
// One forward sweep gives every small integer vector it can a symbolic value, one Dim an element:
// constants, Shape(x) of a value whose rank is known (its dims, symbols included), and what
// Gather, Slice, Concat, Unsqueeze, Squeeze, Cast and Identity make of them. Then each Reshape
// whose target is such a vector gets a constant target: a known element stays, an element equal
// to the input's dimension at the same position becomes 0 (copy it), and one remaining element
// becomes -1. Expand likewise, with 1 for a dimension the input already has. The shape
// computations left without readers go with EliminateDeadCode.
#include <unordered_map>

#include "passes/passes.h"
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

struct ShapeValue {
  std::vector<Dim> dims;
  bool scalar = false;  // a 0-D tensor (a Gather by a scalar index)
};

using ShapeValues = std::unordered_map<ValueId, ShapeValue>;

const ShapeValue* find(const ShapeValues& sv, ValueId v) {
  auto it = sv.find(v);
  return it == sv.end() ? nullptr : &it->second;
}

std::optional<int64_t> attr_or_const(const Graph& g, const Node& n, size_t input,
                                     const char* attr) {
  if (auto c = constant_ints(g, n, input); c && c->size() == 1) return (*c)[0];
  if (n.attrs.has(attr)) {
    auto v = n.attrs.get_ints(attr, {});
    if (v.size() == 1) return v[0];
  }
  return std::nullopt;
}

// The symbolic value of a node's output from its inputs', when the op is one of the few that
// shape arithmetic uses.
std::optional<ShapeValue> evaluate(const Graph& g, const Node& n, const ShapeValues& sv) {
  auto in = [&](size_t i) { return i < n.inputs.size() ? find(sv, n.inputs[i]) : nullptr; };
  if (n.op == "Shape") {
    const TensorType& t = g.value(n.inputs[0]).type;
    if (!t.shape) return std::nullopt;
    const auto rank = static_cast<int64_t>(t.shape->size());
    int64_t start = n.attrs.get_int("start", 0), end = n.attrs.get_int("end", rank);
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = std::clamp<int64_t>(start, 0, rank);
    end = std::clamp<int64_t>(end, start, rank);
    return ShapeValue{{t.shape->begin() + start, t.shape->begin() + end}, false};
  }
  if (n.op == "Identity" || n.op == "Cast") {
    if (!in(0) || (n.op == "Cast" && !is_integral(n.attrs.get_dtype("to")))) return std::nullopt;
    return *in(0);
  }
  if (n.op == "Gather" && in(0) && n.attrs.get_int("axis", 0) == 0) {
    const Tensor* idx = constant_of(g, n.inputs[1]);
    auto ids = constant_ints(g, n, 1);
    if (!idx || !ids || idx->rank() > 1) return std::nullopt;
    ShapeValue out{{}, idx->rank() == 0};
    const auto size = static_cast<int64_t>(in(0)->dims.size());
    for (int64_t i : *ids) {
      if (i < 0) i += size;
      if (i < 0 || i >= size) return std::nullopt;
      out.dims.push_back(in(0)->dims[i]);
    }
    return out;
  }
  if (n.op == "Slice" && in(0) && !in(0)->scalar) {
    auto start = attr_or_const(g, n, 1, "starts"), end = attr_or_const(g, n, 2, "ends");
    auto axis = n.inputs.size() > 3 ? attr_or_const(g, n, 3, "axes") : std::optional<int64_t>(0);
    auto step = n.inputs.size() > 4 ? attr_or_const(g, n, 4, "steps") : std::optional<int64_t>(1);
    if (!start || !end || !axis || *axis != 0 || !step || *step != 1) return std::nullopt;
    const auto size = static_cast<int64_t>(in(0)->dims.size());
    int64_t s = *start < 0 ? *start + size : *start, e = *end < 0 ? *end + size : *end;
    s = std::clamp<int64_t>(s, 0, size);
    e = std::clamp<int64_t>(e, s, size);
    return ShapeValue{{in(0)->dims.begin() + s, in(0)->dims.begin() + e}, false};
  }
  if (n.op == "Concat" && n.attrs.get_int("axis", 0) == 0) {
    ShapeValue out;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (!in(i) || in(i)->scalar) return std::nullopt;
      out.dims.insert(out.dims.end(), in(i)->dims.begin(), in(i)->dims.end());
    }
    return out;
  }
  if (n.op == "Unsqueeze" && in(0) && in(0)->scalar) {
    auto axes = constant_ints(g, n, 1);
    if (!axes && n.attrs.has("axes")) axes = n.attrs.get_ints("axes");
    if (!axes || axes->size() != 1 || ((*axes)[0] != 0 && (*axes)[0] != -1)) return std::nullopt;
    return ShapeValue{in(0)->dims, false};
  }
  if (n.op == "Squeeze" && in(0) && !in(0)->scalar && in(0)->dims.size() == 1)
    return ShapeValue{in(0)->dims, true};
  return std::nullopt;
}

// A constant integer vector as a shape value.
std::optional<ShapeValue> from_constant(const Graph& g, ValueId v) {
  const Tensor* t = constant_of(g, v);
  if (!t || !is_integral(t->dtype()) || t->rank() > 1 || t->numel() > 64) return std::nullopt;
  ShapeValue out{{}, t->rank() == 0};
  for (int64_t i = 0; i < t->numel(); ++i)
    out.dims.push_back(Dim(static_cast<int64_t>(t->item_as_double(i))));
  return out;
}

// Reshape's target as constants, or nullopt when more than one element stays unknown.
std::optional<std::vector<int64_t>> reshape_target(const ShapeValue& s, const TensorType& x) {
  std::vector<int64_t> out;
  int unresolved = 0;
  for (size_t i = 0; i < s.dims.size(); ++i) {
    const Dim& d = s.dims[i];
    if (d.is_known()) {
      if (d.value == -1) ++unresolved;
      out.push_back(d.value);
    } else if (d.is_symbolic() && x.shape && i < x.shape->size() && (*x.shape)[i] == d) {
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
std::optional<std::vector<int64_t>> expand_target(const ShapeValue& s, const TensorType& x) {
  if (!x.shape) return std::nullopt;
  std::vector<int64_t> out;
  const size_t rank = s.dims.size(), xrank = x.shape->size();
  for (size_t i = 0; i < rank; ++i) {
    const Dim& d = s.dims[i];
    if (d.is_known()) {
      out.push_back(d.value);
      continue;
    }
    if (i + xrank < rank || !d.is_symbolic() || !((*x.shape)[i + xrank - rank] == d))
      return std::nullopt;
    out.push_back(1);
  }
  return out;
}

Graph resolve_shapes(Graph g, const PassContext& ctx) {
  ShapeValues sv;
  for (const auto& [v, t] : g.initializers())
    if (auto c = from_constant(g, v)) sv[v] = *c;
  std::vector<std::pair<size_t, std::vector<int64_t>>> targets;  // node, new input 1
  const auto& nodes = g.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.outputs.size() == 1 && n.outputs[0] != kNoValue)
      if (auto r = evaluate(g, n, sv)) sv[n.outputs[0]] = std::move(*r);
    if ((n.op != "Reshape" && n.op != "Expand") || n.inputs.size() < 2) continue;
    if (constant_of(g, n.inputs[1])) continue;  // already constant
    const ShapeValue* s = find(sv, n.inputs[1]);
    if (!s || s->scalar) continue;
    const TensorType& x = g.value(n.inputs[0]).type;
    std::optional<std::vector<int64_t>> t;
    if (n.op == "Reshape" && n.attrs.get_int("allowzero", 0) == 0)
      t = reshape_target(*s, x);
    else if (n.op == "Expand")
      t = expand_target(*s, x);
    if (t) targets.push_back({i, std::move(*t)});
  }
  for (auto& [i, t] : targets) {
    Node& n = g.mutable_nodes()[i];
    const auto len = static_cast<int64_t>(t.size());
    n.inputs[1] = g.add_constant(n.name + "_shape", Tensor::from_vector<int64_t>(t, {len}));
    ctx.note(cat("ResolveShapes/", n.op));
  }
  return g;
}

}  // namespace

void register_resolve_shapes(PassRegistry& r) {
  r.add({"ResolveShapes", resolve_shapes,
         "gives Reshape and Expand constant targets computed from Shape() with symbolic dims"});
}

}  // namespace pto::passes
