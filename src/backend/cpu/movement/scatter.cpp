// ScatterElements (and Scatter) and ScatterND on the CPU, any dtype. The update offsets, the
// reduction and every error come from the reference's code (reference/ops/scatter_plan.h), so
// the result is the reference's: data is copied (in parallel), then each update slice is combined
// into the copy, in parallel over groups of rows that meet disjoint outputs: each row its own group
// when no two slices meet, else the rows of each offset together, applied in the updates'
// row-major order (the last write wins, and reductions see their operands in the reference's
// order).
#include <algorithm>
#include <cstring>
#include <numeric>

#include "backend/cpu/movement/movement.h"
#include "backend/cpu/movement/strided_copy.h"
#include "pto/parallel.h"
#include "reference/ops/scatter_plan.h"

namespace pto::cpu {
namespace {

// The order the update rows are applied in, cut into groups that may run in parallel: with all
// offsets distinct, the rows as they are, one group each; otherwise the rows sorted by offset (a
// stable sort: each offset's rows keep the updates' order), one group per offset. The slices of
// one node all have the same length, and ScatterND's start at multiples of it, so distinct
// offsets mean disjoint slices.
struct Schedule {
  std::vector<int64_t> order;  // empty: the identity
  std::vector<int64_t> start;  // group g is order[start[g] .. start[g + 1]) (empty: one per row)
};

Schedule schedule(const std::vector<int64_t>& offsets) {
  Schedule s;
  std::vector<int64_t> sorted(offsets);
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) return s;
  s.order.resize(offsets.size());
  std::iota(s.order.begin(), s.order.end(), 0);
  std::stable_sort(s.order.begin(), s.order.end(),
                   [&](int64_t a, int64_t b) { return offsets[a] < offsets[b]; });
  for (size_t i = 0; i < s.order.size(); ++i)
    if (i == 0 || offsets[s.order[i]] != offsets[s.order[i - 1]])
      s.start.push_back(static_cast<int64_t>(i));
  s.start.push_back(static_cast<int64_t>(s.order.size()));
  return s;
}

std::vector<Tensor> scatter(const KernelContext& c) {
  int64_t slice = 0;
  const std::vector<int64_t> offsets = reference::scatter_offsets(c, &slice);
  const reference::ScatterReduction red = reference::scatter_reduction(c);
  const Tensor& updates = c.input(2);
  Tensor y = pack(c.input(0));
  const auto rows = static_cast<int64_t>(offsets.size());
  if (rows == 0 || slice == 0) return {y};
  const Schedule sched = schedule(offsets);
  const int64_t groups = sched.order.empty() ? rows : static_cast<int64_t>(sched.start.size()) - 1;
  const int64_t bytes = slice * static_cast<int64_t>(y.itemsize()) * rows / groups;
  const int64_t grain = std::max<int64_t>(1, kCopyGrainBytes / std::max<int64_t>(bytes, 1));
  auto apply = [&]<class T>(auto&& combine) {
    T* o = static_cast<T*>(y.raw_data());
    const T* u = static_cast<const T*>(updates.raw_data());
    auto row = [&](int64_t r) {
      T* to = o + offsets[static_cast<size_t>(r)];
      const T* from = u + r * slice;
      for (int64_t e = 0; e < slice; ++e) to[e] = combine(to[e], from[e]);
    };
    parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
      if (sched.order.empty()) {
        for (int64_t r = g0; r < g1; ++r) row(r);
      } else {
        for (int64_t i = sched.start[g0]; i < sched.start[g1]; ++i) row(sched.order[i]);
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
