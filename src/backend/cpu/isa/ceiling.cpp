// pto::fma_ceiling(): the FMA throughput of one core on the active ISA and the clock it ran at.
#include "backend/cpu/isa/ceiling.h"

#include <time.h>
#include <algorithm>
#include <cmath>

#include "pto/device_info.h"

namespace pto::cpu {

float run_fma_chains(Isa isa, int64_t iterations, float mul, float add) {
  switch (isa) {
    case Isa::kAvx512:
      return avx512::fma_chains(iterations, mul, add);
    case Isa::kAvx2:
      return avx2::fma_chains(iterations, mul, add);
    default:
      return generic::fma_chains(iterations, mul, add);
  }
}

int64_t fma_flops_per_iteration(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return avx512::fma_flops_per_iteration();
    case Isa::kAvx2:
      return avx2::fma_flops_per_iteration();
    default:
      return generic::fma_flops_per_iteration();
  }
}

namespace {

// This thread's CPU time in seconds: a round the OS preempts (another process on the core) does
// not count the time it waited, so the rate is the core's, not the share it got.
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The best of `rounds` runs of `fn` (work units per CPU second), each about 5 ms.
template <typename Fn>
double best_rate(int rounds, int64_t units, Fn fn) {
  double best = 0;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = thread_seconds();
    fn();
    best = std::max(best, static_cast<double>(units) / std::max(thread_seconds() - t0, 1e-9));
  }
  return best;
}

// Cycles per second, from a chain of dependent register-register adds: one cycle each on every
// x86-64 core. Not `add $1`: Intel cores since Golden Cove fold small immediate adds at rename,
// so a chain of them runs several per cycle (a Xeon here read 17.6 GHz).
double measure_hz() {
#if defined(__x86_64__)
  constexpr int64_t kSteps = 1 << 17;  // of 64 adds: 8.4 M cycles, about 3 ms
  return best_rate(5, kSteps * 64, [] {
    uint64_t x = 0, step = 1;
    for (int64_t i = 0; i < kSteps; ++i)
      __asm__ volatile(".rept 64\n\taddq %1, %0\n\t.endr" : "+r"(x), "+r"(step));
  });
#else
  return 0;
#endif
}

FmaCeiling measure_ceiling() {
  const Isa isa = active_isa();
  FmaCeiling c;
  c.isa = isa_name(isa);
  c.vector_bits = isa == Isa::kAvx512 ? 512 : isa == Isa::kAvx2 ? 256 : 32;
  volatile float mul = 0.9999f, add = 1e-4f;  // opaque to the optimizer
  constexpr int64_t kIterations = 1 << 18;    // 134 MFLOP on AVX-512: about 1 ms
  volatile float sink = 0;
  const double flops = static_cast<double>(fma_flops_per_iteration(isa) * kIterations);
  auto chains = [&] { sink = sink + run_fma_chains(isa, kIterations, mul, add); };
  // A warm-up run first, then the best of 10: the first milliseconds of wide vector code can run
  // at half rate while the core powers its 512-bit units up (seen on Zen 5: 1 of 4 cold
  // `pto info` runs reported 1 x 512-bit FMA per cycle instead of 2).
  chains();
  c.gflops = best_rate(10, 1, chains) * flops / 1e9;
  c.ghz = measure_hz() / 1e9;
  if (c.ghz > 0) {
    c.flops_per_cycle = c.gflops / c.ghz;
    // Two flops per lane per FMA; the scalar path has no FMA instruction to count.
    if (c.vector_bits > 32)
      c.fma_units = static_cast<int>(std::lround(c.flops_per_cycle / (2.0 * c.vector_bits / 32)));
  }
  return c;
}

}  // namespace
}  // namespace pto::cpu

namespace pto {

const FmaCeiling& fma_ceiling() {
  static const FmaCeiling c = cpu::measure_ceiling();
  return c;
}

}  // namespace pto
