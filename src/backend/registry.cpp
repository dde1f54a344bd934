// The built-in backends, in the order the runtime asks them: cpu, then the reference interpreter
// (which has a kernel for every op, so every single node runs somewhere).
#include <algorithm>

#include "backend/cpu/kernel.h"
#include "pto/backend.h"
#include "pto/reference.h"

namespace pto {

BackendRegistry& BackendRegistry::global() {
  static BackendRegistry* registry = [] {
    auto* r = new BackendRegistry();
    r->add(cpu::make_backend());
    r->add(reference::make_backend());
    return r;
  }();
  return *registry;
}

void BackendRegistry::add(std::unique_ptr<Backend> backend) {
  PTO_CHECK(find(backend->name()) == nullptr)
      << "backend '" << backend->name() << "' registered twice";
  backends_.push_back(std::move(backend));
}

const Backend* BackendRegistry::find(const std::string& name) const {
  for (const auto& b : backends_)
    if (b->name() == name) return b.get();
  return nullptr;
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

}  // namespace pto
