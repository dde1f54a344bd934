// EliminateCommonSubexpressions: merges nodes that compute the same thing. First, identical small
// constants (same dtype, shape and bytes, at most kMaxMergedBytes) become one, so that nodes
// reading copies of a constant read the same value. Then one forward sweep hash-conses the nodes:
// the key is (domain, op, opset, input values, output count); among nodes with the same key, one
// whose attributes are deeply equal (same_attributes: tensor attributes by bytes) is the same
// computation, and the later node's outputs are replaced by the earlier one's. Nodes of
// kNondeterministic ops are never merged: two random draws are two values.
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "passes/passes.h"
#include "passes/rewrite_util.h"
#include "pto/op_registry.h"

namespace pto::passes {
namespace {

constexpr size_t kMaxMergedBytes = 4096;

std::string constant_key(const Tensor& t) {
  Tensor c = t.contiguous();
  std::string key = cat(dtype_name(c.dtype()), dims_str(c.shape()), ":");
  key.append(static_cast<const char*>(c.raw_data()), c.nbytes());
  return key;
}

// Replaces every later copy of an identical small constant by the first one.
int merge_constants(Graph& g) {
  std::unordered_map<std::string, ValueId> first;
  std::vector<ValueId> order;
  for (const auto& [v, t] : g.initializers()) order.push_back(v);
  std::sort(order.begin(), order.end());  // deterministic: the lowest id is kept
  int merged = 0;
  for (ValueId v : order) {
    const Tensor* t = constant_of(g, v);
    if (!t || t->nbytes() > kMaxMergedBytes) continue;
    auto [it, inserted] = first.emplace(constant_key(*t), v);
    if (inserted || !can_replace(g, v, it->second) || g.is_output(v)) continue;
    g.replace_uses(v, it->second);
    ++merged;
  }
  return merged;
}

std::string node_key(const Node& n) {
  std::string key = cat(n.domain, "|", n.op, "|", n.opset, "|", n.outputs.size(), "|");
  for (ValueId v : n.inputs) key += cat(v, ",");
  key += "|";
  for (ValueId o : n.outputs) key += o == kNoValue ? "_" : "o";
  return key;
}

Graph eliminate_common_subexpressions(Graph g, const PassContext& ctx) {
  if (int merged = merge_constants(g)) ctx.note("EliminateCommonSubexpressions/constant", merged);
  std::unordered_map<std::string, std::vector<size_t>> seen;
  std::vector<bool> removed(g.nodes().size(), false);
  int count = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (!n.def || n.def->has(kNondeterministic) || n.outputs.empty()) continue;
    std::vector<size_t>& bucket = seen[node_key(n)];
    bool merged = false;
    for (size_t j : bucket) {
      const Node& m = g.nodes()[j];
      if (!same_attributes(n.attrs, m.attrs)) continue;
      bool ok = true;
      for (size_t k = 0; k < n.outputs.size(); ++k)
        ok = ok && (n.outputs[k] == kNoValue || can_replace(g, n.outputs[k], m.outputs[k]));
      if (!ok) continue;
      for (size_t k = 0; k < n.outputs.size(); ++k)
        if (n.outputs[k] != kNoValue) g.replace_uses(n.outputs[k], m.outputs[k]);
      removed[i] = true;
      merged = true;
      ++count;
      ctx.note("EliminateCommonSubexpressions/" + n.op);
      break;
    }
    if (!merged) bucket.push_back(i);
  }
  if (count) g.remove_nodes(removed);
  return g;
}

}  // namespace

void register_eliminate_common_subexpressions(PassRegistry& r) {
  r.add({"EliminateCommonSubexpressions", eliminate_common_subexpressions,
         "merges identical small constants, then nodes with the same op, inputs and attributes"});
}

}  // namespace pto::passes
