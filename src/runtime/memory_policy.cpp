// The process-wide MemoryPolicy (include/pto/memory_policy.h): one atomic word per field, so the
// kernels that read it on every run take no lock.
#include "pto/memory_policy.h"

#include <atomic>

#include "pto/device_info.h"
#include "pto/error.h"

namespace pto {
namespace {

std::atomic<int> g_prefetch{-1};
std::atomic<int> g_reuse{0};
std::atomic<int> g_nontemporal{static_cast<int>(MemoryPolicy::NonTemporal::kAuto)};

}  // namespace

void set_memory_policy(const MemoryPolicy& p) {
  if (p.prefetch_distance < -1 || p.prefetch_distance > 1024)
    throw ValueError(cat("[memory policy] prefetch_distance must be -1 (built-in), 0 (off) or ",
                         "1..1024 cache lines, got ", p.prefetch_distance));
  if (p.reuse_distance < 0 || p.reuse_distance > 64)
    throw ValueError(
        cat("[memory policy] reuse_distance must be 0..64 stages, got ", p.reuse_distance));
  const int nt = static_cast<int>(p.nontemporal);
  if (nt < 0 || nt > static_cast<int>(MemoryPolicy::NonTemporal::kAlways))
    throw ValueError(cat("[memory policy] nontemporal: no mode ", nt));
  g_prefetch.store(p.prefetch_distance, std::memory_order_relaxed);
  g_reuse.store(p.reuse_distance, std::memory_order_relaxed);
  g_nontemporal.store(nt, std::memory_order_relaxed);
}

MemoryPolicy memory_policy() {
  MemoryPolicy p;
  p.prefetch_distance = g_prefetch.load(std::memory_order_relaxed);
  p.reuse_distance = g_reuse.load(std::memory_order_relaxed);
  p.nontemporal =
      static_cast<MemoryPolicy::NonTemporal>(g_nontemporal.load(std::memory_order_relaxed));
  return p;
}

bool stream_stores_for(size_t output_bytes, bool in_auto) {
  switch (static_cast<MemoryPolicy::NonTemporal>(g_nontemporal.load(std::memory_order_relaxed))) {
    case MemoryPolicy::NonTemporal::kNever:
      return false;
    case MemoryPolicy::NonTemporal::kAlways:
      return true;
    case MemoryPolicy::NonTemporal::kAuto:
      break;
  }
  return in_auto && output_bytes > device_info().l3_bytes;
}

}  // namespace pto
