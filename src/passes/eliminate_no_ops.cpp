// EliminateNoOps: removes nodes whose output equals their first input bit for bit, replacing every
// use of the output by the input. A table of rules (op -> matcher returning the value that replaces
// output 0, or "no match") is applied in forward sweeps until a sweep changes nothing. A node whose
// output is a graph output is kept when the replacement is not an intermediate value (a graph input
// or a constant), so that the outputs callers see keep their names (can_replace).
#include <cmath>
#include <functional>

#include "passes/passes.h"
#include "passes/rewrite_util.h"
#include "pto/op_registry.h"

namespace pto::passes {
namespace {

using Match = std::optional<ValueId>;

struct RuleInput {
  const Graph& g;
  const Node& n;
  const std::vector<int>& uses;
};

// The same dtype and the same shape, each dim known or the same symbol (equal at run time).
bool same_static_type(const Graph& g, ValueId a, ValueId b) {
  if (a == kNoValue || b == kNoValue) return false;
  return same_shape(g, a, b) && g.value(a).type.dtype == g.value(b).type.dtype;
}

// Output 0 is its input 0 whenever it has that input's shape (and dtype): Reshape,
// Flatten, Squeeze, Unsqueeze and Expand only rearrange or repeat, so an unchanged shape is
// an unchanged tensor.
Match keeps_shape(const RuleInput& r) {
  if (r.n.inputs.empty() || r.n.outputs.size() != 1) return std::nullopt;
  if (!same_static_type(r.g, r.n.inputs[0], r.n.outputs[0])) return std::nullopt;
  return r.n.inputs[0];
}

Match identity(const RuleInput& r) {
  if (r.n.inputs.empty() || r.n.inputs[0] == kNoValue) return std::nullopt;
  return r.n.inputs[0];
}

// Dropout at inference is the identity; its mask output (if any) must be unused, and it must not
// be in training mode (input 2 absent or a constant false).
Match dropout(const RuleInput& r) {
  if (r.n.outputs.size() > 1 && r.n.outputs[1] != kNoValue && r.uses[r.n.outputs[1]] > 0)
    return std::nullopt;
  if (r.n.inputs.size() > 2 && r.n.inputs[2] != kNoValue) {
    const Tensor* t = constant_of(r.g, r.n.inputs[2]);
    if (!t || t->numel() != 1 || t->item_as_double(0) != 0) return std::nullopt;
  }
  return identity(r);
}

Match cast(const RuleInput& r) {
  if (r.n.inputs.empty() || r.n.inputs[0] == kNoValue || r.n.outputs.size() != 1)
    return std::nullopt;
  if (!r.n.attrs.has("to")) return std::nullopt;
  DType to;
  try {
    to = r.n.attrs.get_dtype("to");
  } catch (const Error&) {
    return std::nullopt;
  }
  if (r.g.value(r.n.inputs[0]).type.dtype != to) return std::nullopt;
  return r.n.inputs[0];
}

Match cast_like(const RuleInput& r) {
  if (r.n.inputs.size() != 2 || r.n.inputs[0] == kNoValue || r.n.inputs[1] == kNoValue)
    return std::nullopt;
  DType from = r.g.value(r.n.inputs[0]).type.dtype;
  if (from == DType::kUndefined || from != r.g.value(r.n.inputs[1]).type.dtype) return std::nullopt;
  return r.n.inputs[0];
}

Match transpose(const RuleInput& r) {
  if (r.n.inputs.empty() || r.n.inputs[0] == kNoValue) return std::nullopt;
  const TensorType& t = r.g.value(r.n.inputs[0]).type;
  if (!r.n.attrs.has("perm")) {  // the default reverses the axes: the identity up to rank 1
    if (t.shape && t.shape->size() <= 1) return r.n.inputs[0];
    return std::nullopt;
  }
  std::vector<int64_t> perm = r.n.attrs.get_ints("perm", {});
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return std::nullopt;
  return r.n.inputs[0];
}

// A Slice with steps all positive (absent, or constant) that keeps the static shape takes every
// element in order: an axis of size d sliced to size d with step s > 0 starts at 0 and, when
// d > 1, has s = 1. A negative step would reverse the axis with the same shape.
Match slice(const RuleInput& r) {
  if (r.n.inputs.size() > 4 && r.n.inputs[4] != kNoValue) {
    std::optional<std::vector<int64_t>> steps = constant_ints(r.g, r.n, 4);
    if (!steps) return std::nullopt;
    for (int64_t s : *steps)
      if (s <= 0) return std::nullopt;
  }
  return keeps_shape(r);
}

// Pad with every pad zero (attribute before opset 11, input 1 after). Equal shapes would not be
// enough: pads (1, -1) shift the data.
Match pad(const RuleInput& r) {
  std::optional<std::vector<int64_t>> pads;
  if (r.n.attrs.has("pads"))
    pads = r.n.attrs.get_ints("pads", {});
  else
    pads = constant_ints(r.g, r.n, 1);
  if (!pads) return std::nullopt;
  for (int64_t p : *pads)
    if (p != 0) return std::nullopt;
  if (!same_static_type(r.g, r.n.inputs[0], r.n.outputs[0])) return std::nullopt;
  return r.n.inputs[0];
}

// Concat, Sum, Max, Min and Mean of a single input are that input.
Match single_input(const RuleInput& r) {
  if (r.n.inputs.size() != 1 || r.n.outputs.size() != 1) return std::nullopt;
  if (!same_static_type(r.g, r.n.inputs[0], r.n.outputs[0])) {
    const TensorType& a = r.g.value(r.n.inputs[0]).type;
    const TensorType& b = r.g.value(r.n.outputs[0]).type;
    if (a.dtype != b.dtype || a.dtype == DType::kUndefined) return std::nullopt;
  }
  return r.n.inputs[0];
}

// Whether every element of `t` passes `pred` (given the element as double and its sign bit).
bool all_elements(const Tensor& t, const std::function<bool(double, bool)>& pred) {
  if (t.dtype() == DType::kBool) return false;
  for (int64_t i = 0; i < t.numel(); ++i) {
    double x = t.item_as_double(i);
    if (!pred(x, std::signbit(x))) return false;
  }
  return true;
}

// x op c == x exactly, for the constant side `c` of a binary op whose result has x's dtype and
// static shape (so c broadcasts into x and changes neither dtype nor shape). `right_only`: c must
// be the second input (Sub, Div); otherwise either side (Mul, Add commute).
Match binary_with_constant(const RuleInput& r, bool right_only,
                           const std::function<bool(double, bool)>& neutral) {
  if (r.n.inputs.size() != 2 || r.n.outputs.size() != 1) return std::nullopt;
  for (size_t side = right_only ? 1 : 0; side < 2; ++side) {
    ValueId c = r.n.inputs[side], x = r.n.inputs[1 - side];
    const Tensor* t = constant_of(r.g, c);
    if (!t || x == kNoValue || !same_static_type(r.g, x, r.n.outputs[0])) continue;
    if (t->dtype() != r.g.value(x).type.dtype) continue;
    if (all_elements(*t, neutral)) return x;
  }
  return std::nullopt;
}

// x * 1 and x / 1 are x for every x, -0, inf and NaN included, in floats and integers alike.
Match mul_one(const RuleInput& r) {
  return binary_with_constant(r, false, [](double v, bool) { return v == 1; });
}
Match div_one(const RuleInput& r) {
  return binary_with_constant(r, true, [](double v, bool) { return v == 1; });
}
// Exactness of adding zero in IEEE arithmetic: (-0) + (+0) = +0, so x + (+0) is NOT x when x is
// -0; x + (-0) is x for every x. Hence Add folds only a constant of -0.0 (or integer 0: item
// -0.0 has its sign bit, integer 0 does not, so integer dtypes are checked by value).
Match add_zero(const RuleInput& r) {
  const bool fp = is_floating(r.g.value(r.n.outputs[0]).type.dtype);
  return binary_with_constant(r, false,
                              [fp](double v, bool neg) { return v == 0 && (neg || !fp); });
}
// x - (+0) is x for every x (-0 - +0 = -0), while x - (-0) = x + (+0) turns -0 into +0. Integer
// zero has no sign.
Match sub_zero(const RuleInput& r) {
  const bool fp = is_floating(r.g.value(r.n.outputs[0]).type.dtype);
  return binary_with_constant(r, true,
                              [fp](double v, bool neg) { return v == 0 && (!neg || !fp); });
}

struct NoOpRule {
  const char* op;
  Match (*match)(const RuleInput&);
};

// (op, matcher) pairs; several rules may share an op, the first that matches wins.
const NoOpRule kRules[] = {
    {"Identity", identity},   {"Dropout", dropout},       {"Cast", cast},
    {"CastLike", cast_like},  {"Reshape", keeps_shape},   {"Flatten", keeps_shape},
    {"Squeeze", keeps_shape}, {"Unsqueeze", keeps_shape}, {"Expand", keeps_shape},
    {"Transpose", transpose}, {"Slice", slice},           {"Pad", pad},
    {"Concat", single_input}, {"Sum", single_input},      {"Max", single_input},
    {"Min", single_input},    {"Mean", single_input},     {"Mul", mul_one},
    {"Div", div_one},         {"Add", add_zero},          {"Sub", sub_zero},
};

Graph eliminate_no_ops(Graph g, const PassContext& ctx) {
  std::vector<bool> removed(g.nodes().size(), false);
  std::vector<int> uses = g.use_counts();
  bool changed = true;
  int total = 0;
  while (changed) {
    changed = false;
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      if (removed[i]) continue;
      const Node& n = g.nodes()[i];
      if (n.outputs.empty() || n.outputs[0] == kNoValue || !n.domain.empty()) continue;
      for (const NoOpRule& rule : kRules) {
        if (n.op != rule.op) continue;
        Match m;
        try {
          m = rule.match({g, n, uses});
        } catch (const Error&) {  // a malformed attribute: not this rule's business
          m = std::nullopt;
        }
        ValueId out = n.outputs[0];
        if (!m || *m == out || !can_replace(g, out, *m)) continue;
        uses[*m] += uses[out];
        uses[out] = 0;
        for (ValueId v : n.inputs)
          if (v != kNoValue) --uses[v];
        g.replace_uses(out, *m);
        removed[i] = true;
        changed = true;
        ++total;
        ctx.note(cat("EliminateNoOps/", rule.op));
        break;
      }
    }
  }
  if (total) g.remove_nodes(removed);
  return g;
}

}  // namespace

void register_eliminate_no_ops(PassRegistry& r) {
  r.add({"EliminateNoOps", eliminate_no_ops,
         "removes nodes whose output equals their input (Identity, x*1, same-shape Reshape, ...)"});
}

}  // namespace pto::passes
