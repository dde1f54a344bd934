// What TopK computes, apart from the sorting: k (input or attribute), the axis and the direction
// read and checked, and the order values are ranked in. The reference kernel
// (reduction_scan.cpp) and the CPU kernel (backend/cpu/topk.cpp) both rank by these, so they
// agree on every value, index (ties: the lower index first) and error.
#pragma once

#include <cmath>
#include <type_traits>

#include "pto/reference.h"

namespace pto::reference {

struct TopKPlan {
  int64_t k = 0, axis = 0;
  int64_t outer = 1, n = 0, inner = 1;  // the input viewed as [outer, n, inner], n along the axis
  bool largest = true;
  Dims out_shape;  // the input's shape with k along the axis
};

TopKPlan topk_plan(const KernelContext& c);

// Strict weak order "a ranks before b": larger (largest) or smaller first, NaN above every number
// and equal to NaN (the ONNX reference's lexsort).
template <class C>
bool topk_before(bool largest, C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (std::isnan(a) || std::isnan(b))
      return largest ? std::isnan(a) && !std::isnan(b) : !std::isnan(a) && std::isnan(b);
  }
  return largest ? a > b : a < b;
}

}  // namespace pto::reference
