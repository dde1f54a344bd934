// Random inputs for running a model without data: `pto run`, `check`, `bench` and
// PTO_VERIFY_PASSES make them from the declared shapes.
#pragma once

#include <random>

#include "pto/tensor.h"

namespace pto {

// A tensor of random values: floats uniform in [-1, 1), integers uniform in [0, 10), bools
// uniform. Deterministic for a given generator state on every platform.
Tensor random_tensor(DType dtype, const Dims& shape, std::mt19937_64& rng);

}  // namespace pto
