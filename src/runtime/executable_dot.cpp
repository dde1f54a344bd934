// to_dot(Executable) (include/pto/graph_dot.h): the compiled graph with the plan's steps as the
// kernels, in the order they run; graph_after_pass, the graph a picture of a pass draws.
#include <algorithm>
#include <optional>

#include "pto/executable.h"
#include "pto/graph_dot.h"
#include "pto/passes.h"

namespace pto {

namespace {

KernelGraph steps_of(const Executable& exe) {
  KernelGraph kg;
  for (size_t i = 0; i < exe.num_steps(); ++i) {
    const StepInfo& s = exe.step(i);
    KernelGroup k;
    k.nodes = s.nodes;
    k.rule = s.rule;
    kg.kernels.push_back(std::move(k));
  }
  return kg;
}

// The compiled subgraphs of exe's control-flow nodes, each with its own.
std::vector<DotSubgraph> subgraphs_of(const Executable& exe) {
  std::vector<DotSubgraph> out;
  for (size_t i = 0; i < exe.graph().nodes().size(); ++i) {
    const Node& n = exe.graph().nodes()[i];
    for (const auto& [attr, sub] : exe.subgraphs(i))
      out.push_back({static_cast<int32_t>(i), cat(n.name.empty() ? n.op : n.name, ": ", attr),
                     &sub->graph(), steps_of(*sub), subgraphs_of(*sub)});
  }
  return out;
}

}  // namespace

std::string to_dot(const Executable& exe, const DotOptions& options) {
  const KernelGraph kg = steps_of(exe);
  return to_dot(exe.graph(), &kg, options, subgraphs_of(exe));
}

void check_pass_runs(int level, const std::string& pass) {
  const std::vector<std::string> names = pipeline(level);
  if (std::find(names.begin(), names.end(), pass) != names.end()) return;
  std::string known;
  for (const std::string& n : names) known += " " + n;
  throw ValueError(cat("pass '", pass, "' does not run at level ", level,
                       " (its passes:", known.empty() ? " none" : known, ")"));
}

Graph graph_after_pass(Graph g, int level, const std::string& pass) {
  check_pass_runs(level, pass);
  std::optional<Graph> after;
  PassOptions o;
  o.level = level;
  o.after_pass = [&](const std::string& name, size_t, size_t, const Graph& now) {
    if (name == pass) after = now;
  };
  verify(g);
  infer_types(g);
  run_passes(std::move(g), o);
  PTO_CHECK(after) << "pass " << pass << " of level " << level << " did not report";
  return std::move(*after);
}

}  // namespace pto
