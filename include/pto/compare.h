// Comparing a computed tensor with a reference one, element by element, as torch.allclose does:
// an element is within tolerance when |got - want| <= atol + rtol * |want|. NaN matches only NaN
// and an infinity only the same infinity. `pto check` and PTO_VERIFY_PASSES report with it.
#pragma once

#include <cstdint>
#include <string>

#include "pto/tensor.h"

namespace pto {

struct TensorDiff {
  double max_abs = 0;          // largest |got - want| over finite pairs
  double max_rel = 0;          // largest |got - want| / |want| over finite pairs with want != 0
  int64_t mismatches = 0;      // elements beyond tolerance (NaN/Inf disagreements included)
  int64_t nan_mismatches = 0;  // one side NaN, the other not
  int64_t inf_mismatches = 0;  // one side infinite, the other not (or the other sign)
  int64_t worst = -1;          // flat index of the worst element (a disagreement first), or -1
  double worst_got = 0, worst_want = 0;
  int64_t numel = 0;
  bool ok() const { return mismatches == 0; }
};

// Compares `got` with `want`; a different dtype or shape is a ValueError naming `what`.
TensorDiff compare(const Tensor& got, const Tensor& want, double rtol, double atol,
                   const std::string& what = "compare");

// The flat row-major index `flat` of `shape` as "[i, j, k]".
std::string index_string(const Dims& shape, int64_t flat);

// "max abs error 0.5, max rel error 0.1, 3 of 100 elements beyond tolerance, worst at [0, 2]:
// 1.5 vs 1" (and the NaN/Inf disagreements when there are any).
std::string describe(const TensorDiff& d, const Dims& shape);

}  // namespace pto
