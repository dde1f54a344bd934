// The Kernel Graph data structure (level 2): one kernel per node (levels 0 and 1), a group's
// boundary values, printing. The partitioning algorithm is src/fusion/fuse_kernels.cpp.
#include <algorithm>
#include <queue>
#include <sstream>
#include <unordered_set>

#include "pto/kernel_graph.h"
#include "pto/op_registry.h"
#include "pto/reader_index.h"

namespace pto {

void finish_group(const Graph& g, KernelGroup& group, const ReaderIndex* readers) {
  if (!readers) {
    const ReaderIndex own(g);
    return finish_group(g, group, &own);
  }
  // Work of the group's size only: a graph of 32k Relus had every group scan every node (11 s
  // to compile).
  const auto& nodes = g.nodes();
  std::vector<int32_t> inside = group.nodes;
  std::sort(inside.begin(), inside.end());
  auto is_inside = [&](int32_t n) { return std::binary_search(inside.begin(), inside.end(), n); };
  group.inputs.clear();
  group.outputs.clear();
  std::unordered_set<ValueId> produced, seen;  // by the group's nodes so far; inputs found
  for (int32_t i : group.nodes) {
    for (ValueId v : nodes[i].inputs)
      if (v != kNoValue && !produced.contains(v) && seen.insert(v).second)
        group.inputs.push_back(v);
    for (ValueId o : nodes[i].outputs)
      if (o != kNoValue) produced.insert(o);
  }
  // A produced value leaves the group when a node outside reads it or it is a graph output.
  for (int32_t i : group.nodes)
    for (ValueId o : nodes[i].outputs) {
      if (o == kNoValue) continue;
      const auto r = readers->readers(o);
      if (readers->is_output(o) ||
          std::any_of(r.begin(), r.end(), [&](int32_t n) { return !is_inside(n); }))
        group.outputs.push_back(o);
    }
}

std::string kernel_label(const Graph& g, const KernelGroup& k) {
  if (!k.rule.empty()) return k.rule;
  for (int32_t n : k.nodes) {
    const Node& node = g.nodes()[n];
    if (!node.def || !node.def->is_view()) return node.op;
  }
  return g.nodes()[k.last_node()].op;
}

KernelGroup single_node_group(const Graph& g, int32_t n) {
  KernelGroup group;
  group.nodes = {n};
  const Node& node = g.nodes()[n];
  for (ValueId v : node.inputs)
    if (v != kNoValue &&
        std::find(group.inputs.begin(), group.inputs.end(), v) == group.inputs.end())
      group.inputs.push_back(v);
  for (ValueId o : node.outputs)
    if (o != kNoValue) group.outputs.push_back(o);
  return group;
}

KernelGraph single_node_kernels(const Graph& g) {
  KernelGraph kg;
  kg.kernels.reserve(g.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i)
    kg.kernels.push_back(single_node_group(g, static_cast<int32_t>(i)));
  return kg;
}

bool order_kernels(const Graph& g, KernelGraph& kg) {
  const size_t n = kg.kernels.size();
  std::vector<int64_t> made_by(g.values().size(), -1);
  for (size_t k = 0; k < n; ++k)
    for (int32_t node : kg.kernels[k].nodes)
      for (ValueId o : g.nodes()[node].outputs)
        if (o != kNoValue) made_by[o] = static_cast<int64_t>(k);
  std::vector<std::vector<size_t>> readers(n);
  std::vector<int> waiting(n, 0);
  for (size_t k = 0; k < n; ++k) {
    std::vector<size_t> deps;
    for (ValueId v : kg.kernels[k].inputs)
      if (made_by[v] >= 0 && static_cast<size_t>(made_by[v]) != k)
        deps.push_back(static_cast<size_t>(made_by[v]));
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    for (size_t d : deps) readers[d].push_back(k);
    waiting[k] = static_cast<int>(deps.size());
  }
  // Kahn's algorithm, always taking the ready kernel with the earliest last node.
  auto later = [&](size_t a, size_t b) {
    return kg.kernels[a].last_node() > kg.kernels[b].last_node();
  };
  std::priority_queue<size_t, std::vector<size_t>, decltype(later)> ready(later);
  for (size_t k = 0; k < n; ++k)
    if (waiting[k] == 0) ready.push(k);
  std::vector<size_t> order;
  while (!ready.empty()) {
    const size_t k = ready.top();
    ready.pop();
    order.push_back(k);
    for (size_t r : readers[k])
      if (--waiting[r] == 0) ready.push(r);
  }
  if (order.size() != n) return false;
  std::vector<KernelGroup> sorted;
  sorted.reserve(n);
  for (size_t k : order) sorted.push_back(std::move(kg.kernels[k]));
  kg.kernels = std::move(sorted);
  return true;
}

std::string print(const Graph& g, const KernelGraph& kg) {
  std::ostringstream os;
  auto names = [&](const std::vector<ValueId>& vs) {
    std::string s;
    for (ValueId v : vs) s += (s.empty() ? "" : ", ") + g.value(v).name;
    return s;
  };
  for (size_t k = 0; k < kg.kernels.size(); ++k) {
    const KernelGroup& group = kg.kernels[k];
    os << "k" << k << " " << (group.rule.empty() ? g.nodes()[group.nodes[0]].op : group.rule)
       << " [";
    for (size_t i = 0; i < group.nodes.size(); ++i)
      os << (i ? ", " : "") << g.nodes()[group.nodes[i]].name;
    os << "] (" << names(group.inputs) << ") -> (" << names(group.outputs) << ")\n";
  }
  return os.str();
}

}  // namespace pto
