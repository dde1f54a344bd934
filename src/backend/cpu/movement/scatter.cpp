// ScatterElements (and Scatter) and ScatterND on the CPU, any dtype. The update offsets, the
// reduction and every error come from the reference's code (reference/ops/scatter_plan.h), so
// the result is the reference's: data is copied (in parallel), then each update slice is combined
// into the copy. When no two slices meet the same output, the order of updates cannot matter and
// the slices are applied in parallel; otherwise in the updates' row-major order on one thread (the
// last write wins, and reductions see their operands in the reference's order).
#include <algorithm>
#include <cstring>

#include "backend/cpu/movement/movement.h"
#include "backend/cpu/movement/strided_copy.h"
#include "pto/parallel.h"
#include "reference/ops/scatter_plan.h"

namespace pto::cpu {
namespace {

// Whether some offset appears twice (the slices of one node all have the same length, and
// ScatterND's start at multiples of it, so distinct offsets mean disjoint slices).
bool has_duplicates(std::vector<int64_t> offsets) {
  std::sort(offsets.begin(), offsets.end());
  return std::adjacent_find(offsets.begin(), offsets.end()) != offsets.end();
}

std::vector<Tensor> scatter(const KernelContext& c) {
  int64_t slice = 0;
  const std::vector<int64_t> offsets = reference::scatter_offsets(c, &slice);
  const reference::ScatterReduction red = reference::scatter_reduction(c);
  const Tensor& updates = c.input(2);
  Tensor y = pack(c.input(0));
  const auto rows = static_cast<int64_t>(offsets.size());
  if (rows == 0 || slice == 0) return {y};
  const int64_t bytes = slice * static_cast<int64_t>(y.itemsize());
  const int64_t grain = has_duplicates(offsets)
                            ? rows  // one chunk: the updates' order
                            : std::max<int64_t>(1, kCopyGrainBytes / std::max<int64_t>(bytes, 1));
  auto apply = [&]<class T>(auto&& combine) {
    T* o = static_cast<T*>(y.raw_data());
    const T* u = static_cast<const T*>(updates.raw_data());
    parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        T* to = o + offsets[static_cast<size_t>(r)];
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
