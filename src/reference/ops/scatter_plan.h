// What ScatterElements (and its old name Scatter) and ScatterND compute, apart from the copying:
// the reduction attribute, how one update combines with the value it meets, and the element
// offset in data of each update slice with every index checked. The reference kernels
// (scatter.cpp) and the CPU kernels (backend/cpu/movement/scatter.cpp) both apply updates from
// these, so they agree on every value and error.
#pragma once

#include <cmath>
#include <type_traits>
#include <vector>

#include "index_math.h"

namespace pto::reference {

enum class ScatterReduction { kNone, kAdd, kMul, kMax, kMin };

// The node's reduction (Scatter has none: it always replaces); ValueError on an unknown one.
ScatterReduction scatter_reduction(const KernelContext& c);

// An update combined with the value it meets: add and mul wrap on integers; max and min propagate
// NaN like numpy.
template <class T>
T scatter_combine(ScatterReduction r, T old, T update) {
  using C = compute_t<T>;
  const C a = static_cast<C>(old), b = static_cast<C>(update);
  switch (r) {
    case ScatterReduction::kNone:
      return update;
    case ScatterReduction::kAdd:
      return wrap_add(old, update);
    case ScatterReduction::kMul:
      return wrap_mul(old, update);
    case ScatterReduction::kMax:
      if constexpr (std::is_floating_point_v<C>)
        if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? old : update;
      return a >= b ? old : update;
    case ScatterReduction::kMin:
      if constexpr (std::is_floating_point_v<C>)
        if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? old : update;
      return a <= b ? old : update;
  }
  return update;
}

// ScatterElements, Scatter or ScatterND node `c`: the offset in data of each update slice, in
// the updates' row-major order (update slice i is elements [i * slice, (i + 1) * slice) of
// updates), into `offsets` (resized; its capacity is reused), after checking the updates' dtype
// and shape and every index (negative ones counted from the end); the slice's element count (1
// for ScatterElements) through `slice`.
void scatter_offsets(const KernelContext& c, int64_t* slice, std::vector<int64_t>& offsets);

}  // namespace pto::reference
