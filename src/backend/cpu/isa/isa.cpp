#include "backend/cpu/isa/isa.h"

#include <atomic>

#include "pto/device_info.h"
#include "pto/error.h"

namespace pto::cpu {
namespace {

// The override is global rather than thread-local so that pool workers running tiles of a kernel
// see the same ISA as the thread that started it. -1: none.
std::atomic<int> g_override{-1};

Isa from_name(const std::string& name) {
  if (name == "avx512") return Isa::kAvx512;
  if (name == "avx2") return Isa::kAvx2;
  return Isa::kGeneric;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    default:
      return "generic";
  }
}

Isa active_isa() {
  int o = g_override.load(std::memory_order_relaxed);
  if (o >= 0) return static_cast<Isa>(o);
  static const Isa chosen = from_name(device_info().isa);
  return chosen;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  const DeviceInfo& d = device_info();
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kGeneric})
    if (supports_isa(d, isa_name(isa))) out.push_back(isa);
  return out;
}

IsaScope::IsaScope(Isa isa) {
  if (!supports_isa(device_info(), isa_name(isa)))
    throw UnsupportedError(cat("this CPU cannot run the ", isa_name(isa), " kernels"));
  saved_ = g_override.exchange(static_cast<int>(isa));
}

IsaScope::~IsaScope() {
  g_override.store(saved_);
}

}  // namespace pto::cpu
