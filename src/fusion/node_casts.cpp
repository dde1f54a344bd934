#include "fusion/node_casts.h"

#include <algorithm>

#include "pto/op_registry.h"

namespace pto::fusion {
namespace {

bool is_half(DType t) {
  return t == DType::kBF16 || t == DType::kF16;
}

// `n` as a Cast of one float type to another: its source and target types.
std::optional<std::pair<DType, DType>> float_cast(const Graph& g, const Node& n) {
  if (n.op != "Cast" || !n.domain.empty() || n.inputs.size() != 1 || n.outputs.size() != 1 ||
      n.inputs[0] == kNoValue || n.outputs[0] == kNoValue)
    return std::nullopt;
  return std::pair{g.value(n.inputs[0]).type.dtype, g.value(n.outputs[0]).type.dtype};
}

}  // namespace

std::vector<int32_t> NodeCasts::nodes() const {
  std::vector<int32_t> out = {node};
  if (widen >= 0) out.push_back(widen);
  if (narrow >= 0) out.push_back(narrow);
  std::sort(out.begin(), out.end());
  return out;
}

std::string NodeCasts::rule(const Graph& g) const {
  return cat(widen >= 0 ? "Cast+" : "", g.nodes()[node].op, narrow >= 0 ? "+Cast" : "");
}

std::optional<NodeCasts> match_casts(const Graph& g, int32_t node, const ReaderIndex& readers) {
  const Node& n = g.nodes()[node];
  if (!n.domain.empty() || !n.def || n.def->is_elementwise() || n.inputs.empty() ||
      n.inputs[0] == kNoValue || n.outputs.empty() || n.outputs[0] == kNoValue)
    return std::nullopt;
  for (size_t o = 1; o < n.outputs.size(); ++o)
    if (n.outputs[o] != kNoValue) return std::nullopt;
  const ValueId x = n.inputs[0], y = n.outputs[0];
  if (g.value(x).type.dtype != DType::kF32 || g.value(y).type.dtype != DType::kF32)
    return std::nullopt;
  NodeCasts c;
  c.node = node;
  c.input = x;
  const int32_t p = g.value(x).producer;
  if (p >= 0 && readers.single_reader(x) == node) {
    auto t = float_cast(g, g.nodes()[p]);
    if (t && is_half(t->first)) {
      c.widen = p;
      c.input = g.nodes()[p].inputs[0];
    }
  }
  if (const int32_t r = readers.single_reader(y); r >= 0)
    if (std::optional<DType> half = narrows_to_half(g, g.nodes()[r])) {
      c.narrow = r;
      c.store = *half;
    }
  if (c.widen < 0 && c.narrow < 0) return std::nullopt;
  return c;
}

std::optional<DType> narrows_to_half(const Graph& g, const Node& n) {
  auto t = float_cast(g, n);
  if (!t || t->first != DType::kF32 || !is_half(t->second)) return std::nullopt;
  return t->second;
}

std::optional<NodeCasts> casts_of_group(const Graph& g, const std::vector<int32_t>& nodes,
                                        int32_t anchor) {
  if (nodes.size() < 2 || anchor < 0) return std::nullopt;
  auto c = match_casts(g, anchor, ReaderIndex(g));
  if (!c || c->nodes() != nodes) return std::nullopt;
  return c;
}

}  // namespace pto::fusion
