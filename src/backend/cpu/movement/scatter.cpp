// ScatterElements (and Scatter) and ScatterND on the CPU, any dtype. The update offsets, the
// reduction and every error come from the reference's code (reference/ops/scatter_plan.h), so
// the result is the reference's: data is copied (in parallel), then each update slice is combined
// into the copy in the updates' row-major order (with duplicate indices the last write wins, and
// reductions see their operands in the reference's order). In parallel, each task owns a range of
// the output and applies the rows that land in it, still in order: no sort, no atomics.
#include <algorithm>
#include <cstring>

#include "backend/cpu/movement/movement.h"
#include "backend/cpu/movement/strided_copy.h"
#include "pto/parallel.h"
#include "reference/ops/scatter_plan.h"

namespace pto::cpu {
namespace {

std::vector<Tensor> scatter(const KernelContext& c) {
  int64_t slice = 0;
  // Kept by the calling thread (no page faults for the next run's); the tasks read it through
  // this reference (a thread_local named in a task would be the task thread's own).
  thread_local std::vector<int64_t> kept;
  reference::scatter_offsets(c, &slice, kept);
  const std::vector<int64_t>& offsets = kept;
  const reference::ScatterReduction red = reference::scatter_reduction(c);
  const Tensor& updates = c.input(2);
  Tensor y = pack(c.input(0));
  const auto rows = static_cast<int64_t>(offsets.size());
  if (rows == 0 || slice == 0) return {y};
  // Task t owns the output slices [t * per, (t + 1) * per) (whole slices: the offsets are
  // multiples of the slice length) and applies, in the updates' order, the rows that land there.
  const int64_t slices = y.numel() / slice;
  const int64_t bytes = rows * slice * static_cast<int64_t>(y.itemsize());
  const int64_t tasks =
      std::clamp<int64_t>(bytes / kCopyGrainBytes, 1, std::min<int64_t>(num_threads(), slices));
  const int64_t per = (slices + tasks - 1) / tasks * slice;
  auto apply = [&]<class T>(auto&& combine) {
    T* o = static_cast<T*>(y.raw_data());
    const T* u = static_cast<const T*>(updates.raw_data());
    parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
      const int64_t lo = t0 * per, hi = t1 * per;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t off = offsets[static_cast<size_t>(r)];
        if (off < lo || off >= hi) continue;
        T* to = o + off;
        const T* from = u + r * slice;
        for (int64_t e = 0; e < slice; ++e) to[e] = combine(to[e], from[e]);
      }
    });
  };
  if (red == reference::ScatterReduction::kNone)  // a copy: only the element size matters
    with_element_size(y.itemsize(),
                      [&]<class U>() { apply.template operator()<U>([](U, U v) { return v; }); });
  else
    dispatch(y.dtype(), kAllTypes, c.where(), [&]<class T>() {
      apply.template operator()<T>(
          [red](T a, T b) { return reference::scatter_combine(red, a, b); });
    });
  return {y};
}

bool accepts(const NodeInfo& n) {
  const size_t size = dtype_size(n.dtype(0));
  return size == 1 || size == 2 || size == 4 || size == 8;
}

}  // namespace

void register_scatter_kernels(KernelRegistry& r) {
  for (const char* op : {"Scatter", "ScatterElements", "ScatterND"})
    r.add(op, {.accepts = accepts, .run = scatter});
}

}  // namespace pto::cpu
