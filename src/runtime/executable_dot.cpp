// to_dot(Executable) (include/pto/graph_dot.h): the compiled graph with the plan's steps as the
// kernels, in the order they run; graph_after_pass, the graph a picture of a pass draws.
#include <algorithm>
#include <optional>

#include "pto/executable.h"
#include "pto/graph_dot.h"
#include "pto/passes.h"

namespace pto {

std::string to_dot(const Executable& exe, const DotOptions& options) {
  KernelGraph kg;
  for (size_t i = 0; i < exe.num_steps(); ++i) {
    const StepInfo& s = exe.step(i);
    KernelGroup k;
    k.nodes = s.nodes;
    k.rule = s.rule;
    kg.kernels.push_back(std::move(k));
  }
  return to_dot(exe.graph(), &kg, options);
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
