// plan_memory: greedy best fit by size (the algorithm TFLite's arena planner uses).
//
// Buffers are the outputs of steps that own their storage (not views), with a static size and a
// lifetime [def step, last step reading them or a view of them]. Taken largest first, each buffer
// goes into the smallest gap between already placed buffers whose lifetimes overlap its own, or
// after the last of them. Outputs of one step with the same size share the longest of their
// lifetimes, because the kernel may hand them out in either order.
//
// In place: a step that is one elementwise node of a kInPlace op, or an elementwise tile program,
// with one output, writes that output over an input of the same dtype and size whose buffer
// ends at this step (each element is read before the same element is written). The two become
// one buffer with the longer lifetime, so a chain of such steps runs in one buffer.
//
// Reuse distance (MemoryPolicy::reuse_distance k > 0): a buffer goes where a buffer that died in
// the k stages before it began lay, when it fits there without growing the arena and that buffer
// was no larger than L2: the first kernel to write it finds the lines in cache. Otherwise, and
// with k = 0, best fit as above. A plan so made whose arena is more than 5% larger than the
// best-fit one is dropped for that one.
//
// Stages: steps of one stage may run at the same time, so lifetimes are measured in stages, not
// steps (a buffer read last in a stage and one made in it overlap), and a step writes in place
// only over a buffer no other step of its stage reads.
#include "runtime/memory_plan.h"

#include <algorithm>
#include <map>

#include "pto/device_info.h"
#include "pto/memory_policy.h"
#include "pto/op_registry.h"

namespace pto {
namespace {

size_t align_up(size_t n) {
  return (n + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
}

// Bytes of a value's buffer, or 0 when its shape or dtype is not known or it is not a tensor.
size_t static_bytes(const TensorType& t) {
  // A sequence or an optional has no buffer of its own (its elements are made by the kernel).
  if (!t.shape || t.dtype == DType::kUndefined || !t.is_tensor()) return 0;
  size_t n = dtype_size(t.dtype);
  for (const Dim& d : *t.shape) {
    if (!d.is_known()) return 0;
    n *= static_cast<size_t>(d.value);
  }
  return n;
}

struct Buffer {
  ValueId value;
  int32_t step, begin, end;
  size_t bytes;
  size_t offset = 0;
  std::vector<std::pair<ValueId, int32_t>> in_place;  // later values written over it, and steps
};

// reuse_distance k > 0: the offset of the placed buffer that died most recently in the k stages
// before `buf` begins (its bytes are likely still in cache: at most `cache` of them), among those
// whose place `buf` can take without touching a live buffer (`busy`, sorted) or growing the arena
// past `top`; ties go to the smaller (the tighter fit). SIZE_MAX: none.
size_t recently_freed(const std::vector<Buffer>& buffers, const std::vector<size_t>& placed,
                      const Buffer& buf, const std::vector<std::pair<size_t, size_t>>& busy, int k,
                      size_t cache, size_t top) {
  size_t found = SIZE_MAX;
  const Buffer* best = nullptr;
  for (size_t j : placed) {
    const Buffer& p = buffers[j];
    if (p.end >= buf.begin || p.end < buf.begin - k || p.bytes > cache) continue;
    if (p.offset + buf.bytes > top) continue;
    if (best && (p.end < best->end || (p.end == best->end && p.bytes >= best->bytes))) continue;
    const size_t lo = p.offset, hi = p.offset + buf.bytes;
    const bool free = std::none_of(busy.begin(), busy.end(),
                                   [&](const auto& b) { return b.first < hi && lo < b.second; });
    if (!free) continue;
    best = &p;
    found = p.offset;
  }
  return found;
}

// Sets every buffer's offset, taking them in `order`; returns the arena's size.
size_t place(std::vector<Buffer>& buffers, const std::vector<size_t>& order, int reuse_distance) {
  size_t arena = 0;
  std::vector<size_t> placed;
  for (size_t i : order) {
    Buffer& buf = buffers[i];
    std::vector<std::pair<size_t, size_t>> busy;  // [offset, end) of overlapping placed buffers
    for (size_t j : placed) {
      const Buffer& p = buffers[j];
      if (p.begin <= buf.end && buf.begin <= p.end) busy.push_back({p.offset, p.offset + p.bytes});
    }
    std::sort(busy.begin(), busy.end());
    size_t best = SIZE_MAX, best_gap = SIZE_MAX, cursor = 0;
    for (const auto& [lo, hi] : busy) {
      if (lo > cursor && lo - cursor >= buf.bytes && lo - cursor < best_gap) {
        best = cursor;
        best_gap = lo - cursor;
      }
      cursor = std::max(cursor, hi);
    }
    buf.offset = best != SIZE_MAX ? best : cursor;
    if (reuse_distance > 0) {
      const size_t warm =
          recently_freed(buffers, placed, buf, busy, reuse_distance, device_info().l2_bytes, arena);
      if (warm != SIZE_MAX) buf.offset = warm;
    }
    arena = std::max(arena, buf.offset + buf.bytes);
    placed.push_back(i);
  }
  return arena;
}

}  // namespace

bool may_run_in_place(const Graph& g, const KernelGroup& k) {
  if (k.outputs.size() != 1) return false;
  if (k.nodes.size() == 1) {
    const OpDef& d = *g.nodes()[k.nodes[0]].def;
    return d.has(kInPlace) && d.is_elementwise();
  }
  return k.rule == "Elementwise";
}

MemoryPlan plan_memory(const Graph& g, const KernelGraph& kg, const Liveness& live,
                       const std::vector<bool>& in_place, const std::vector<int32_t>& stage_of,
                       std::optional<int> reuse) {
  const int reuse_distance = reuse ? *reuse : memory_policy().reuse_distance;
  auto stage = [&](int32_t s) { return stage_of.empty() ? s : stage_of.at(s); };
  MemoryPlan plan;
  plan.step_slots.resize(kg.kernels.size());
  std::vector<Buffer> buffers;
  std::vector<int32_t> buffer_of(g.values().size(), -1);  // a root value's buffer
  for (size_t s = 0; s < kg.kernels.size(); ++s) {
    std::map<size_t, int32_t> end_by_size;  // same-size outputs of this step share a lifetime
    const size_t first = buffers.size();
    std::vector<ValueId> roots;  // the buffers this step makes: its outputs' roots it defines
    for (ValueId o : kg.kernels[s].outputs) {
      const ValueId r = live.root[o];
      if (live.def[r] == static_cast<int32_t>(s) &&
          std::find(roots.begin(), roots.end(), r) == roots.end())
        roots.push_back(r);
    }
    // The step's allocator hands the arena's slots out by size, in the order the kernel asks
    // (StepAllocator): an output left to the pool (a graph output, a size known only at run
    // time) could take the slot of a planned output of its size, which then dies with that
    // output's lifetime while the graph still holds it. So a planned output shares no size with
    // an unplanned one of its step (none at all when one's size is dynamic).
    std::vector<size_t> pool_sizes;
    bool pool_any_size = false;
    for (ValueId o : roots) {
      const size_t bytes = align_up(static_bytes(g.value(o).type));
      if (bytes == 0) pool_any_size = true;
      if (live.buffer_end[o] == Liveness::kForever) pool_sizes.push_back(bytes);
    }
    for (ValueId o : roots) {
      const size_t bytes = align_up(static_bytes(g.value(o).type));
      const int32_t end = live.buffer_end[o];
      if (bytes == 0 || end == Liveness::kForever ||
          (roots.size() > 1 && (pool_any_size || std::find(pool_sizes.begin(), pool_sizes.end(),
                                                           bytes) != pool_sizes.end()))) {
        ++plan.unplanned_values;
        continue;
      }
      const auto step = static_cast<int32_t>(s);
      if (roots.size() == 1 && s < in_place.size() && in_place[s]) {
        // Whether an earlier step of this stage reads buffer b (a later one cannot: b ends here).
        auto sibling_reads = [&](int32_t b) {
          for (int32_t t = step - 1; t >= 0 && stage(t) == stage(step); --t)
            for (ValueId in : kg.kernels[t].inputs)
              if (in != kNoValue && buffer_of.at(live.root.at(in)) == b) return true;
          return false;
        };
        int32_t host = -1;
        for (ValueId in : kg.kernels[s].inputs) {
          const int32_t b = in == kNoValue || live.root.at(in) != in ? -1 : buffer_of.at(in);
          // The exact sizes, not the aligned ones: an input broadcast to a larger output of the
          // same aligned size ([7, 1] bools to [7, 7]) is still read after its slots are written.
          if (b >= 0 && buffers.at(b).end == step && buffers[b].bytes == bytes &&
              static_bytes(g.value(in).type) == static_bytes(g.value(o).type) &&
              g.value(in).type.dtype == g.value(o).type.dtype && !sibling_reads(b)) {
            host = b;
            break;
          }
        }
        if (host >= 0) {
          buffers[host].end = std::max(end, step);
          buffers[host].in_place.push_back({o, step});
          buffer_of[o] = host;
          continue;
        }
      }
      buffer_of[o] = static_cast<int32_t>(buffers.size());
      buffers.push_back({o, step, step, std::max(end, step), bytes});
      int32_t& e = end_by_size[bytes];
      e = std::max(e, buffers.back().end);
    }
    for (size_t b = first; b < buffers.size(); ++b) buffers[b].end = end_by_size[buffers[b].bytes];
  }
  for (Buffer& b : buffers) {  // lifetimes in stages from here on
    b.begin = stage(b.begin);
    b.end = stage(b.end);
  }

  std::vector<size_t> order(buffers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return buffers[a].bytes > buffers[b].bytes; });
  plan.arena_bytes = place(buffers, order, 0);
  if (reuse_distance > 0) {  // kept only within 5% of the best-fit arena
    const std::vector<Buffer> best_fit = buffers;
    const size_t arena = place(buffers, order, reuse_distance);
    if (arena * 20 <= plan.arena_bytes * 21)
      plan.arena_bytes = arena;
    else
      buffers = best_fit;
  }

  std::vector<size_t> live_bytes(kg.kernels.size() + 1, 0);  // per stage
  std::vector<size_t> arena_top(kg.kernels.size() + 1, 0);
  for (const Buffer& b : buffers) {
    plan.unplanned_bytes += b.bytes;
    plan.step_slots[b.step].push_back({b.value, b.bytes, b.offset});
    for (const auto& [v, step] : b.in_place) {
      plan.unplanned_bytes += b.bytes;
      plan.step_slots[step].push_back({v, b.bytes, b.offset});
    }
    for (int32_t s = b.begin; s <= b.end && s < static_cast<int32_t>(live_bytes.size()); ++s) {
      live_bytes[s] += b.bytes;
      arena_top[s] = std::max(arena_top[s], b.offset + b.bytes);
    }
  }
  for (size_t b : live_bytes) plan.live_peak_bytes = std::max(plan.live_peak_bytes, b);
  plan.stage_live_bytes = std::move(live_bytes);
  plan.stage_arena_top = std::move(arena_top);
  for (size_t s = 0; s <= kg.kernels.size(); ++s) {
    const auto step = static_cast<int32_t>(s);
    if (s == 0 || s == kg.kernels.size() || stage(step) != stage(step - 1)) {
      if (!plan.stage_begin.empty() && s - plan.stage_begin.back() > 1) {
        ++plan.concurrent_stages;
        plan.concurrent_steps += s - plan.stage_begin.back();
      }
      plan.stage_begin.push_back(s);
    }
  }
  return plan;
}

}  // namespace pto
