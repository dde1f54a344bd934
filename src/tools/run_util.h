// Helpers of `pto run`: random inputs, output summaries and file names.
#pragma once

#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "pto/graph.h"
#include "pto/tensor.h"

namespace pto::cli {

// A tensor of random values: floats uniform in [-1, 1), integers uniform in [0, 10), bools
// uniform. Deterministic for a given generator state on every platform.
Tensor random_tensor(DType dtype, const Dims& shape, std::mt19937_64& rng);

// "f32[2, 3]  min -0.5  max 0.9  mean 0.1  std 0.4  values [0.1, ...]"; NaN and Inf are counted
// and left out of the statistics.
std::string summarize(const Tensor& t, int64_t max_values = 8);

// An output name as a file name: characters outside [A-Za-z0-9_.-] become '_'; an empty name,
// or one made only of dots, becomes "output_<index>".
std::string sanitize_file_name(const std::string& name, size_t index);

// bf16 has no numpy dtype: widen to f32 (exact) before saving.
Tensor bf16_to_f32(const Tensor& t);

std::string format_ms(double ms);

// Graph inputs in order: from .npy files where given (NAME, FILE), else random from the declared
// type (seeded), symbolic dimensions from `dims` or from the files (else 1, with a note). Prints
// where each input came from; ValueError for a name the model has no input of.
std::vector<Tensor> make_inputs(const Graph& g,
                                const std::vector<std::pair<std::string, std::string>>& given,
                                const std::map<std::string, int64_t>& given_dims, uint64_t seed);

}  // namespace pto::cli
