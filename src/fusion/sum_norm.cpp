#include "fusion/sum_norm.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "fusion/node_casts.h"
#include "pto/reader_index.h"

namespace pto::fusion {

std::string SumNorm::rule(const Graph& g) const {
  return cat("Add+", g.nodes()[norm].op, narrow >= 0 ? "+Cast" : "");
}

bool is_sum_norm_rule(const std::string& rule) {
  for (const char* norm : {"Add+LayerNormalization", "Add+RMSNormalization"})
    if (rule == norm || rule == cat(norm, "+Cast")) return true;
  return false;
}

namespace {

// The Cast storing the norm's Y in bf16 or f16 that ends `nodes` (Y's only reader): its node
// and type, or {-1, f32}.
std::pair<int32_t, DType> narrowing_cast(const Graph& g, const std::vector<int32_t>& nodes) {
  const Node& n = g.nodes()[nodes.back()];
  const std::optional<DType> half = nodes.size() >= 3 ? narrows_to_half(g, n) : std::nullopt;
  if (!half) return {-1, DType::kF32};
  const ValueId y = n.inputs[0];
  if (g.value(y).producer != nodes[nodes.size() - 2] || g.is_output(y) ||
      ReaderIndex(g).single_reader(y) != nodes.back())  // only groups ending in a Cast get here
    return {-1, DType::kF32};
  return {nodes.back(), *half};
}

}  // namespace

std::optional<SumNorm> sum_norm_of_group(const Graph& g, const std::vector<int32_t>& group) {
  std::vector<int32_t> nodes = group;
  SumNorm s;
  std::tie(s.narrow, s.store) = narrowing_cast(g, group);
  if (s.narrow >= 0) nodes.pop_back();
  if (nodes.size() < 2) return std::nullopt;
  const auto& all = g.nodes();
  const Node& norm = all[nodes.back()];  // the norm reads every Add's result: it comes last
  if (!norm.domain.empty() || (norm.op != "LayerNormalization" && norm.op != "RMSNormalization") ||
      norm.inputs.size() < 2 || norm.outputs.empty() || norm.outputs[0] == kNoValue)
    return std::nullopt;
  for (size_t o = 1; o < norm.outputs.size(); ++o)
    if (norm.outputs[o] != kNoValue) return std::nullopt;
  s.norm = nodes.back();
  std::map<ValueId, int> made;  // an Add's result -> its term (-1 - index)
  auto term = [&](ValueId v) {
    if (auto it = made.find(v); it != made.end()) return it->second;
    auto it = std::find(s.operands.begin(), s.operands.end(), v);
    if (it == s.operands.end()) it = s.operands.insert(it, v);
    return static_cast<int>(it - s.operands.begin());
  };
  for (size_t k = 0; k + 1 < nodes.size(); ++k) {
    const Node& n = all[nodes[k]];
    if (n.op != "Add" || !n.domain.empty() || n.inputs.size() != 2 || n.outputs.size() != 1 ||
        n.inputs[0] == kNoValue || n.inputs[1] == kNoValue || n.outputs[0] == kNoValue)
      return std::nullopt;
    s.adds.push_back({nodes[k], term(n.inputs[0]), term(n.inputs[1])});
    made[n.outputs[0]] = -static_cast<int>(s.adds.size());
  }
  // Every Add's result feeds the sum; the norm's other inputs (scale, bias) come from outside.
  if (made.find(norm.inputs[0]) == made.end() ||
      made[norm.inputs[0]] != -static_cast<int>(s.adds.size()))
    return std::nullopt;
  for (size_t i = 1; i < norm.inputs.size(); ++i)
    if (made.count(norm.inputs[i])) return std::nullopt;
  return s;
}

}  // namespace pto::fusion
