// Gather on the CPU: out[outer, j, inner] = data[outer, indices[j], inner]. The indices are read
// and checked by the reference's code (same errors); then each (outer, j) row is one memcpy of
// `inner` elements, or an element copy when rows are too short for memcpy to pay.
#include <cstring>

#include "backend/cpu/movement/movement.h"
#include "backend/cpu/movement/strided_copy.h"
#include "pto/parallel.h"
#include "reference/ops/layout_params.h"

namespace pto::cpu {
namespace {

std::vector<Tensor> gather(const KernelContext& c) {
  const Tensor& data = c.input(0);
  int64_t axis = 0;
  Dims out_shape;
  const std::vector<int64_t> idx = reference::gather_indices(c, &axis, &out_shape);
  Tensor y = Tensor::empty(data.dtype(), out_shape);
  if (y.numel() == 0) return {y};
  const Dims& d = data.shape();
  const int64_t n = d[axis], m = static_cast<int64_t>(idx.size());
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < axis; ++k) outer *= d[k];
  for (size_t k = axis + 1; k < d.size(); ++k) inner *= d[k];
  const int64_t row_bytes = inner * static_cast<int64_t>(data.itemsize());
  const int64_t grain = std::max<int64_t>(1, kCopyGrainBytes / row_bytes);
  with_element_size(data.itemsize(), [&]<class U>() {
    const U* src = static_cast<const U*>(data.raw_data());
    U* dst = static_cast<U*>(y.raw_data());
    parallel_for(0, outer * m, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const U* from = src + ((r / m) * n + idx[r % m]) * inner;
        U* to = dst + r * inner;
        if (row_bytes >= 32)
          std::memcpy(to, from, static_cast<size_t>(row_bytes));
        else
          for (int64_t i = 0; i < inner; ++i) to[i] = from[i];
      }
    });
  });
  return {y};
}

}  // namespace

void register_gather_kernels(KernelRegistry& r) {
  r.add("Gather", {.run = gather});
}

}  // namespace pto::cpu
