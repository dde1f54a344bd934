// The built-in backends, in the order the runtime asks them: cpu, then the reference interpreter
// (which has a kernel for every op, so every single node runs somewhere).
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

}  // namespace pto
