// TopK on the CPU, any numeric dtype. k, the axis, the direction, the ranking (NaN first when
// largest) and every error are the reference's (reference/ops/topk_plan.h); ties go to the lower
// index, as the reference's stable sort orders them, so values and indices are identical. Each
// line along the axis is copied with its indices into a buffer and its best k are selected and
// sorted (std::partial_sort on value then index: O(n log k)); lines run in parallel.
#include <algorithm>
#include <utility>
#include <vector>

#include "backend/cpu/kernel.h"
#include "pto/parallel.h"
#include "reference/ops/topk_plan.h"

namespace pto::cpu {
namespace {

constexpr int64_t kGrainValues = 16384;  // values ranked per parallel chunk, at least

std::vector<Tensor> run_topk(const KernelContext& c) {
  const reference::TopKPlan p = reference::topk_plan(c);
  const Tensor& x = c.input(0);
  Tensor values = Tensor::empty(x.dtype(), p.out_shape);
  Tensor indices = Tensor::empty(DType::kI64, p.out_shape);
  if (values.numel() == 0) return {values, indices};
  const int64_t n = p.n, k = p.k, inner = p.inner, lines = p.outer * inner;
  const int64_t grain = std::max<int64_t>(1, kGrainValues / n);
  dispatch(x.dtype(), kNumericTypes, c.where(), [&]<class T>() {
    using C = compute_t<T>;
    const T* in = x.data<T>();
    T* pv = values.data<T>();
    int64_t* pi = indices.data<int64_t>();
    // A total order: the reference's ranking, then the lower index.
    auto before = [largest = p.largest](const std::pair<C, int64_t>& a,
                                        const std::pair<C, int64_t>& b) {
      if (reference::topk_before(largest, a.first, b.first)) return true;
      if (reference::topk_before(largest, b.first, a.first)) return false;
      return a.second < b.second;
    };
    parallel_for(0, lines, grain, [&](int64_t l0, int64_t l1) {
      std::vector<std::pair<C, int64_t>> line(static_cast<size_t>(n));
      for (int64_t l = l0; l < l1; ++l) {
        const int64_t o = l / inner, i = l % inner;
        const T* src = in + o * n * inner + i;
        for (int64_t j = 0; j < n; ++j) line[j] = {static_cast<C>(src[j * inner]), j};
        std::partial_sort(line.begin(), line.begin() + k, line.end(), before);
        for (int64_t j = 0; j < k; ++j) {
          const int64_t at = (o * k + j) * inner + i;
          pv[at] = src[line[j].second * inner];  // the input's bits (NaN payloads too)
          pi[at] = line[j].second;
        }
      }
    });
  });
  return {values, indices};
}

bool accepts_topk(const NodeInfo& n) {
  const DType dt = n.dtype(0);
  return dt != DType::kUndefined && dt != DType::kBool;
}

}  // namespace

void register_topk_kernels(KernelRegistry& r) {
  r.add("TopK", {.accepts = accepts_topk, .run = run_topk});
}

}  // namespace pto::cpu
