// Liveness over steps: one forward sweep records where each value is defined and last read and
// which root buffer it may share (through kView ops); a second pass folds the views' last uses
// into their roots, so a buffer outlives every view of it.
#include "pto/liveness.h"

#include <algorithm>

#include "pto/op_registry.h"

namespace pto {

Liveness analyze_liveness(const Graph& g, const KernelGraph& kg) {
  const size_t n_values = g.values().size();
  Liveness l;
  l.def.assign(n_values, -1);
  l.last_use.assign(n_values, -1);
  l.root.resize(n_values);
  for (size_t v = 0; v < n_values; ++v) l.root[v] = static_cast<ValueId>(v);
  l.release_after.resize(kg.kernels.size());

  for (size_t s = 0; s < kg.kernels.size(); ++s) {
    const KernelGroup& k = kg.kernels[s];
    const auto step = static_cast<int32_t>(s);
    for (ValueId v : k.inputs) l.last_use[v] = std::max(l.last_use[v], step);
    for (ValueId o : k.outputs) l.def[o] = step;
    // A view op inside a group hands its root on to the group's outputs that descend from it; a
    // root made inside the group (a product the group then reshapes) is defined by this step.
    // Made inside means by one of the group's nodes: a view of a view of an earlier step's
    // output (Unsqueeze(Flatten(y)), each its own kernel) reads neither the root nor makes it.
    for (int32_t i : k.nodes) {
      const Node& n = g.nodes()[i];
      if (!n.def || !n.def->is_view() || n.inputs.empty() || n.inputs[0] == kNoValue) continue;
      const ValueId root = l.root[n.inputs[0]];
      for (ValueId o : n.outputs)
        if (o != kNoValue) l.root[o] = root;
      const int32_t made_by = g.value(root).producer;
      if (made_by >= 0 && std::find(k.nodes.begin(), k.nodes.end(), made_by) != k.nodes.end())
        l.def[root] = step;
    }
  }
  std::vector<char> keep(n_values, 0);  // inputs, initializers and outputs are never released
  for (ValueId v : g.inputs()) keep[v] = 1;
  for (const auto& [v, t] : g.initializers()) keep[v] = 1;
  for (ValueId v : g.outputs()) keep[v] = 1;

  l.buffer_end.assign(n_values, -1);
  for (size_t v = 0; v < n_values; ++v) {
    int32_t end = keep[v] ? Liveness::kForever : std::max(l.last_use[v], l.def[v]);
    int32_t& root_end = l.buffer_end[l.root[v]];
    root_end = std::max(root_end, end);
    // Never read: dropped right after the step that made it.
    const int32_t release = l.last_use[v] >= 0 ? l.last_use[v] : l.def[v];
    if (!keep[v] && release >= 0) l.release_after[release].push_back(static_cast<ValueId>(v));
  }
  return l;
}

}  // namespace pto
