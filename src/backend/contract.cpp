// The helpers of the execution contract (pto/backend.h) that every backend shares. Apart from the
// registry (registry.cpp), which knows the backends, so that a backend can use them without
// depending on every other backend.
#include <algorithm>

#include "pto/backend.h"

namespace pto {

std::string CompiledKernel::algorithm(const std::vector<Dims>& inputs) const {
  (void)inputs;
  std::string d = describe();
  return d.find('\n') == std::string::npos && d.size() < 64 ? d : std::string();
}

Tensor CompiledKernel::unpack_constant(ValueId v) const {
  throw InternalError(cat("unpack_constant: value ", v, " is not one this kernel packed"));
}

std::vector<int> node_input_slots(const Node& n, const KernelGroup& group) {
  std::vector<int> slots;
  for (ValueId v : n.inputs) {
    auto it = std::find(group.inputs.begin(), group.inputs.end(), v);
    slots.push_back(v == kNoValue || it == group.inputs.end()
                        ? -1
                        : static_cast<int>(it - group.inputs.begin()));
  }
  return slots;
}

std::vector<Tensor> gather_node_inputs(const std::vector<int>& slots,
                                       const std::vector<Tensor>& group_inputs) {
  std::vector<Tensor> out;
  out.reserve(slots.size());
  for (int s : slots) out.push_back(s < 0 ? Tensor() : group_inputs[s]);
  return out;
}

bool reads_in_order(const std::vector<int>& slots, size_t num_group_inputs) {
  if (slots.size() != num_group_inputs) return false;
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i] != static_cast<int>(i)) return false;
  return true;
}

}  // namespace pto
