// Kernel signatures for the tuning cache (signature.h).
#include "tune/signature.h"

#include <algorithm>

#include "pto/error.h"
#include "pto/shape.h"

namespace pto::tune {
namespace {

// The type (symbolic dimensions by name) when its rank is known, else nullopt.
std::optional<std::string> known_type(const TensorType& t) {
  if (!t.shape) return std::nullopt;
  return t.str();
}

}  // namespace

std::string kernel_signature(const Graph& g, const KernelGroup& group) {
  std::string s = cat("rule=", group.rule, ";in=");
  for (size_t i = 0; i < group.inputs.size(); ++i) {
    const ValueId v = group.inputs[i];
    const std::optional<std::string> t = known_type(g.value(v).type);
    if (!t) return "";
    s += cat(i ? "," : "", *t, g.initializer(v) || g.is_released(v) ? "(const)" : "");
  }
  s += ";out=";
  for (size_t i = 0; i < group.outputs.size(); ++i) {
    const std::optional<std::string> t = known_type(g.value(group.outputs[i]).type);
    if (!t) return "";
    s += cat(i ? "," : "", *t);
  }
  s += ";nodes=";
  for (size_t j = 0; j < group.nodes.size(); ++j) {
    const Node& n = g.nodes()[group.nodes[j]];
    s += cat(j ? ";" : "", n.domain.empty() ? "" : n.domain + ".", n.op, "{");
    bool first = true;
    for (const auto& [name, a] : n.attrs.all()) {
      s += cat(first ? "" : ",", name, "=", attribute_str(a));
      first = false;
    }
    s += "}(";
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const ValueId v = n.inputs[i];
      std::string from = "-";
      if (auto it = std::find(group.inputs.begin(), group.inputs.end(), v);
          v != kNoValue && it != group.inputs.end())
        from = cat("in", it - group.inputs.begin());
      for (size_t p = 0; p < j && v != kNoValue; ++p) {
        const std::vector<ValueId>& outs = g.nodes()[group.nodes[p]].outputs;
        if (auto it = std::find(outs.begin(), outs.end(), v); it != outs.end())
          from = cat("n", p, ".", it - outs.begin());
      }
      s += cat(i ? "," : "", from);
    }
    s += ")";
  }
  return s;
}

void apply_knobs(KernelGroup& group, const Knobs& knobs) {
  for (const auto& [name, values] : knobs) {
    if (name == "tile")
      group.tile = values;
    else
      group.knobs[name] = values;
  }
}

std::string knobs_str(const Knobs& knobs) {
  if (knobs.empty()) return "planner";
  std::string s;
  for (const auto& [name, values] : knobs)
    s += cat(s.empty() ? "" : " ", name, "=", dims_str(values));
  return s;
}

}  // namespace pto::tune
