// Control flow whose subgraphs write their outputs where the node keeps them: the form of
// reference::run_control_flow (pto/reference.h) that the Executable's compiled control flow runs
// (src/runtime/control_flow.cpp). A Scan hands each iteration's body the slice of its stacked
// outputs that iteration fills (Executable::run_into), so no scan output is copied there.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "pto/graph.h"

namespace pto::reference {

// Runs one subgraph, as SubgraphRunner does, writing output k into outputs[k] where that is
// defined (Executable::run_into's contract: the result then holds outputs[k] itself, or a tensor
// of its own that the caller copies). `outputs` is empty or one entry per subgraph output.
using SubgraphRunnerInto =
    std::function<std::vector<Tensor>(const std::string& attr, const std::vector<Tensor>& inputs,
                                      const std::vector<Tensor>& outputs)>;

// run_control_flow with a runner that takes destinations.
std::vector<Tensor> run_control_flow_into(const Node& n, std::vector<Tensor> inputs,
                                          const SubgraphRunnerInto& run_sub);

}  // namespace pto::reference
