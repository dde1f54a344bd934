// Random float32 tensors for the compiler tests: uniform in [-1, 1) from a fixed seed.
#pragma once

#include <random>

#include "pto/graph.h"
#include "pto/tensor.h"

namespace pto::testing {

inline Tensor random_tensor(Dims shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tensor t = Tensor::empty(DType::kF32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// A new initializer named `name` holding random_tensor(shape, seed).
inline ValueId constant(Graph& g, const std::string& name, Dims shape, uint32_t seed) {
  ValueId v = g.add_value(name);
  g.set_initializer(v, random_tensor(std::move(shape), seed));
  return v;
}

}  // namespace pto::testing
