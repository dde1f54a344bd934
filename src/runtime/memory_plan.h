// The memory plan (level 4 of DESIGN.md): every intermediate buffer whose size is known gets an
// offset in one arena, chosen from liveness so that buffers whose lifetimes do not overlap share
// bytes. Graph outputs (and what they are views of) are never placed in the arena: they leave the
// run. Planned per concrete shape signature when dimensions are symbolic.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "pto/liveness.h"

namespace pto {

struct MemoryPlan {
  struct Slot {
    ValueId value = kNoValue;
    size_t bytes = 0;  // rounded up to kTensorAlignment
    size_t offset = 0;
  };
  std::vector<std::vector<Slot>> step_slots;  // per step: where its outputs go
  size_t arena_bytes = 0;                     // the arena: the planned peak of intermediate memory
  size_t unplanned_bytes = 0;                 // every planned buffer in its own allocation
  size_t live_peak_bytes = 0;   // the most bytes live at one step (no plan can do better)
  size_t unplanned_values = 0;  // intermediates left to the pool (size unknown, or escaping)
  // The stages the plan was made for: stage i holds steps [stage_begin[i], stage_begin[i + 1]).
  std::vector<size_t> stage_begin;
  size_t concurrent_stages = 0;  // stages of more than one step
  size_t concurrent_steps = 0;   // steps in them
  // Per stage (the profiler's memory counter): planned bytes live, and the end of the highest
  // buffer live in it (their maxima are live_peak_bytes and arena_bytes).
  std::vector<size_t> stage_live_bytes, stage_arena_top;
};

// Whether kernel k may write its one output over an input that dies there (each element read
// before the same element is written): one elementwise node of a kInPlace op, or an elementwise
// tile program. `g` is the graph the kernel graph was made from.
bool may_run_in_place(const Graph& g, const KernelGroup& k);

// `g` must carry the concrete shapes of this run (infer_types with concrete inputs; its nodes may
// differ from the kernel graph's, as constant folding of the concrete shapes removes some: only
// value types are read). `in_place[s]`: may_run_in_place for step s (empty: none). `stage_of[s]`:
// the stage of step s, non-decreasing (empty: every step a stage of its own); steps of one stage
// may run at the same time, so the plan takes a stage as one point in time. `reuse_distance`:
// MemoryPolicy::reuse_distance (nullopt: the process-wide policy's).
MemoryPlan plan_memory(const Graph& g, const KernelGraph& kg, const Liveness& live,
                       const std::vector<bool>& in_place = {},
                       const std::vector<int32_t>& stage_of = {},
                       std::optional<int> reuse_distance = std::nullopt);

}  // namespace pto
