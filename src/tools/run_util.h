// Helpers of `pto run` and `pto compile`: random inputs, output summaries, file names, progress.
#pragma once

#include <chrono>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "pto/executable.h"
#include "pto/progress.h"
#include "pto/random_tensor.h"  // random_tensor, shared with PTO_VERIFY_PASSES
#include "pto/tensor.h"

namespace pto::cli {

// CompileOptions::on_progress drawing on `bar` (a terminal only): the passes, then the kernels.
inline std::function<void(const CompileProgress&)> progress_on(ProgressBar& bar) {
  return [&bar](const CompileProgress& p) {
    bar.set_label(std::string(p.stage) == "pass" ? "compiling: passes" : "compiling: kernels");
    bar.update(p.done, p.total, p.name);
  };
}

// "f32[2, 3]  min -0.5  max 0.9  mean 0.1  std 0.4  values [0.1, ...]"; NaN and Inf are counted
// and left out of the statistics.
std::string summarize(const Tensor& t, int64_t max_values = 8);

// An output name as a file name: characters outside [A-Za-z0-9_.-] become '_'; an empty name,
// or one made only of dots, becomes "output_<index>".
std::string sanitize_file_name(const std::string& name, size_t index);

// bf16 has no numpy dtype: widen to f32 (exact) before saving.
Tensor bf16_to_f32(const Tensor& t);

std::string format_ms(double ms);

// Milliseconds since t0 on the steady clock.
inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace pto::cli
