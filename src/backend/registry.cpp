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
  const std::string name = backend->name();
  backends_.add(name, std::move(backend));
}

const Backend* BackendRegistry::find(const std::string& name) const {
  const std::unique_ptr<Backend>* b = backends_.find(name);
  return b ? b->get() : nullptr;
}

std::vector<const Backend*> BackendRegistry::backends() const {
  std::vector<const Backend*> out;
  for (size_t i = 0; i < backends_.size(); ++i) out.push_back(backends_.at(i).get());
  return out;
}

}  // namespace pto
