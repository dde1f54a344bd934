// Shared by the CPU conv tests: a conv's result against the reference interpreter's.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "pto/tensor.h"

namespace pto::testing {

// Inputs lie in [-1, 1], so each output is a sum of K products of magnitude <= 1.
inline void expect_close(const Tensor& got, const Tensor& want, int64_t k,
                         const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const double tol = 1e-5 + 2e-6 * static_cast<double>(k);
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double a = got.item_as_double(i), b = want.item_as_double(i);
    if (!(std::fabs(a - b) <= tol) && bad++ < 3)
      ADD_FAILURE() << what << ": element " << i << " is " << a << ", reference " << b;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.numel() << " elements differ";
}

}  // namespace pto::testing
