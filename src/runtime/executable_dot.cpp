// to_dot(Executable) (include/pto/graph_dot.h): the compiled graph with the plan's steps as the
// kernels, in the order they run.
#include "pto/executable.h"
#include "pto/graph_dot.h"

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

}  // namespace pto
