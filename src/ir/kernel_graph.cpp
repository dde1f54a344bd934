// The Kernel Graph data structure (level 2): one kernel per node (levels 0 and 1), a group's
// boundary values, printing. The partitioning algorithm is src/fusion/fuse_kernels.cpp.
#include <algorithm>
#include <sstream>

#include "pto/kernel_graph.h"

namespace pto {

void finish_group(const Graph& g, KernelGroup& group) {
  const auto& nodes = g.nodes();
  std::vector<char> inside(nodes.size(), 0);
  for (int32_t i : group.nodes) inside[i] = 1;
  std::vector<char> produced(g.values().size(), 0), seen(g.values().size(), 0);
  group.inputs.clear();
  group.outputs.clear();
  for (int32_t i : group.nodes) {
    for (ValueId v : nodes[i].inputs)
      if (v != kNoValue && !produced[v] && !seen[v]) {
        seen[v] = 1;
        group.inputs.push_back(v);
      }
    for (ValueId o : nodes[i].outputs)
      if (o != kNoValue) produced[o] = 1;
  }
  // A produced value leaves the group when a node outside reads it or it is a graph output.
  std::vector<char> used_outside(g.values().size(), 0);
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (inside[i]) continue;
    for (ValueId v : nodes[i].inputs)
      if (v != kNoValue) used_outside[v] = 1;
  }
  for (ValueId v : g.outputs()) used_outside[v] = 1;
  for (int32_t i : group.nodes)
    for (ValueId o : nodes[i].outputs)
      if (o != kNoValue && used_outside[o]) group.outputs.push_back(o);
}

KernelGraph single_node_kernels(const Graph& g) {
  KernelGraph kg;
  kg.kernels.reserve(g.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    KernelGroup group;
    group.nodes = {static_cast<int32_t>(i)};
    finish_group(g, group);
    // A single node's outputs are all its defined outputs, used or not (kernels produce them).
    group.outputs.clear();
    for (ValueId o : g.nodes()[i].outputs)
      if (o != kNoValue) group.outputs.push_back(o);
    kg.kernels.push_back(std::move(group));
  }
  return kg;
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
