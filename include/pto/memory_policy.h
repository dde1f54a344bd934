// The on-chip memory policy: how kernels and the memory planner use the caches. Process-wide;
// docs/python.md "Memory policy" has the measured effect of each knob.
//
//   pto::MemoryPolicy p;
//   p.nontemporal = pto::MemoryPolicy::NonTemporal::kNever;
//   pto::set_memory_policy(p);
//
// nontemporal and prefetch_distance are read by kernels when they run, so they take effect on the
// next run; reuse_distance is read by the memory planner, so it applies to plans made after it is
// set (an Executable plans at compile time and again for each new input-shape signature).
#pragma once

#include <cstddef>

namespace pto {

struct MemoryPolicy {
  enum class NonTemporal {
    kAuto,    // streaming stores for elementwise outputs larger than the last-level cache
    kNever,   // ordinary stores everywhere
    kAlways,  // streaming stores for every elementwise output (for measuring)
  };
  // Software prefetch: before a tile of an elementwise tile program runs, this many cache lines
  // of each contiguous input past the tile (the next tile's). -1 the built-in choice (off: no
  // distance was measured to help every kernel), 0 off, 1..1024 lines.
  int prefetch_distance = -1;
  // The planner: 0 places each buffer in the best-fitting free gap (the plan of old); k > 0
  // prefers a gap whose last occupant ended within k stages and was no larger than L2 (its lines
  // are still cached), 0..64.
  int reuse_distance = 0;
  NonTemporal nontemporal = NonTemporal::kAuto;

  bool operator==(const MemoryPolicy&) const = default;
};

// Throws ValueError for a field out of its range.
void set_memory_policy(const MemoryPolicy& policy);
MemoryPolicy memory_policy();

// Whether a kernel that writes `output_bytes` once, nothing reading them back before they would
// leave the cache, stores them past the cache under the current policy (kAuto: when they are
// larger than the last-level cache and `in_auto`, false for kernels where streaming was measured
// not to help).
bool stream_stores_for(size_t output_bytes, bool in_auto = true);

}  // namespace pto
