// EliminateDeadCode: removes nodes none of whose outputs reach a graph output, and initializers
// nothing reads. One backward sweep over the topologically ordered nodes marks the live values
// (graph outputs, then the inputs of every node with a live output); everything unmarked goes.
#include "passes/passes.h"

namespace pto::passes {
namespace {

Graph eliminate_dead_code(Graph g, const PassContext& ctx) {
  std::vector<bool> live(g.values().size(), false);
  for (ValueId v : g.outputs()) live[v] = true;
  const auto& nodes = g.nodes();
  std::vector<bool> dead(nodes.size(), false);
  int removed = 0;
  for (size_t i = nodes.size(); i-- > 0;) {
    bool used = false;
    for (ValueId o : nodes[i].outputs) used = used || (o != kNoValue && live[o]);
    if (!used) {
      dead[i] = true;
      ++removed;
      continue;
    }
    for (ValueId v : nodes[i].inputs)
      if (v != kNoValue) live[v] = true;
  }
  if (removed) {
    g.remove_nodes(dead);
    ctx.note("EliminateDeadCode/node", removed);
  }
  std::vector<ValueId> unused;
  std::vector<bool> is_input(g.values().size(), false);
  for (ValueId v : g.inputs()) is_input[v] = true;  // an input's default stays: callers see it
  for (const auto& [v, t] : g.initializers())
    if (!live[v] && !is_input[v]) unused.push_back(v);
  for (ValueId v : unused) g.remove_initializer(v);
  if (!unused.empty()) ctx.note("EliminateDeadCode/initializer", static_cast<int>(unused.size()));
  return g;
}

}  // namespace

void register_eliminate_dead_code(PassRegistry& r) {
  r.add({"EliminateDeadCode", eliminate_dead_code,
         "removes nodes whose outputs reach no graph output, and unread initializers"});
}

}  // namespace pto::passes
