// The float32 FFT under the CPU DFT and STFT kernels (dft.cpp): a plan per transform length,
// built once (twiddles in double, rounded to float), and the per-ISA transform of a group of
// lines (fft_{avx512,avx2,generic}.cpp), one line per vector lane.
//
// A length whose prime factors are all at most kMaxRadix runs as a self-sorting (Stockham)
// mixed-radix FFT: a stage of radix p turns the L-point transforms of the p interleaved
// subsequences into (L p)-point ones, with radix-4, -2 and -3 butterflies and a direct p-point sum
// for 5, 7, 11 and 13. Any other length is Bluestein's chirp-z transform: a circular convolution
// of power-of-two length m >= 2 n - 1 on the same FFT. Both are O(n log n), and the error grows
// with the number of stages (log n), not with n.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/isa/isa.h"

namespace pto::cpu {

inline constexpr int kMaxRadix = 13;

// The per-ISA code reads plans through raw pointers and plain fields only (isa.h: no standard
// containers there); the vectors that own the tables are for fft_plan.cpp.
struct FftStage {
  int radix = 1;
  int64_t l = 1;  // the length of the transforms the stage starts from
  int64_t m = 1;  // the interleaved transforms the stage leaves: n / (l * radix)
  // w_{l radix}^(v k) for k < l, 1 <= v < radix, as (re, im) pairs at [(k (radix - 1) + v - 1) 2].
  const float* twiddles = nullptr;
  const float* roots = nullptr;  // w_radix^j for j < radix, (re, im) pairs: the direct sum's
};

// The forward transform X[k] = sum_t x[t] exp(-2 pi i k t / n); an inverse is the conjugate of
// the forward transform of the conjugate (dft.cpp). Not copyable: the pointers are into its own
// vectors.
struct FftPlan {
  int64_t n = 1;
  const FftStage* stages = nullptr;  // Stockham; none for n = 1 and for Bluestein
  int64_t num_stages = 0;
  // Bluestein (n has a prime factor above kMaxRadix): chirp[t] = exp(-pi i t^2 / n) for t < n,
  // kernel = FFT_m(conj(chirp) placed circularly) / m, both (re, im) pairs, and the m-point plan.
  int64_t m = 0;
  const float* chirp = nullptr;
  const float* kernel = nullptr;
  const FftPlan* sub = nullptr;

  // Complex points each of the three buffers fft_run takes must hold.
  int64_t work_points() const { return m > 0 ? m : n; }

  FftPlan() = default;
  FftPlan(const FftPlan&) = delete;
  FftPlan& operator=(const FftPlan&) = delete;

  // What the pointers above point into.
  std::vector<FftStage> stage_list;
  std::vector<float> tables;
  std::shared_ptr<const FftPlan> sub_plan;
};

// The plan of an n-point transform (n >= 1).
std::shared_ptr<const FftPlan> make_fft_plan(int64_t n);

// Buffers hold complex points of fft_lanes() lines each: point t's real parts in floats
// [2 W t, 2 W t + W) and its imaginary parts in the next W (W = the lanes). `a` holds the n input
// points; `b` and `c` are scratch of work_points() points. Returns the buffer holding the n output
// points (a, b or c).
PTO_ISA_DECLARE(float* fft_run(const FftPlan& plan, float* a, float* b, float* c);
                int fft_vector_lanes();)

// The fft_run for a plan and its lanes (the lines it transforms at once), chosen once per run: the
// active ISA's, or the generic one-lane kernel when the buffers of a vector of lines would pass
// kMaxLaneBytes (long transforms: a thread's three buffers of 2^20 points take 24 MiB at one lane,
// 384 MiB at AVX-512's sixteen).
inline constexpr int64_t kMaxLaneBytes = int64_t{16} << 20;
struct FftKernel {
  float* (*run)(const FftPlan& plan, float* a, float* b, float* c);
  int lanes;
};
FftKernel fft_kernel(const FftPlan& plan);

}  // namespace pto::cpu
