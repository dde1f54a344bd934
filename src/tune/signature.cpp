// Kernel signatures for the tuning cache (signature.h).
#include "tune/signature.h"

#include <algorithm>
#include <unordered_map>

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
  // Where each value a node reads comes from: a group input or an earlier node's output (maps,
  // not scans of the earlier nodes: a chain of 32k Relus fused into one group was quadratic).
  std::unordered_map<ValueId, std::string> from_node;
  std::unordered_map<ValueId, size_t> input_at;
  for (size_t i = 0; i < group.inputs.size(); ++i) input_at.emplace(group.inputs[i], i);
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
      if (v != kNoValue) {
        if (auto it = from_node.find(v); it != from_node.end())
          from = it->second;
        else if (auto in = input_at.find(v); in != input_at.end())
          from = cat("in", in->second);
      }
      s += cat(i ? "," : "", from);
    }
    s += ")";
    for (size_t k = 0; k < n.outputs.size(); ++k)
      if (n.outputs[k] != kNoValue) from_node.emplace(n.outputs[k], cat("n", j, ".", k));
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
