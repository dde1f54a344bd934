// The FMA ceiling of one ISA path: every thread runs kChains independent multiply-add chains held
// in registers, enough to cover the FMA latency times the number of FMA ports (AVX-512 on two
// ports with 4-cycle latency needs 8 in flight; AVX2 the same with half the lanes), so the loop is
// limited by throughput, not by dependencies. Included by fma_avx512.cpp, fma_avx2.cpp and
// fma_generic.cpp, each compiled with its ISA's flags (see isa.h). ceiling.h declares them.
//
// The generic path is scalar mul + add (x86-64 baseline has no FMA; the function is compiled
// without auto-vectorization, which would measure SSE instead): 2 flops per chain step, like an
// FMA.
#pragma once

#include <cstdint>

#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
#include "backend/cpu/isa/simd.h"
#endif

namespace pto::cpu::PTO_ISA_NS {

#if defined(PTO_ISA_AVX512)
constexpr int kChains = 16;  // of 32 zmm registers
constexpr int kLanes = 16;
#elif defined(PTO_ISA_AVX2)
constexpr int kChains = 12;  // of 16 ymm registers, two hold the operands
constexpr int kLanes = 8;
#else
constexpr int kChains = 14;  // of 16 xmm registers; a step is a mul and a dependent add
constexpr int kLanes = 1;
#endif

// Floating-point operations one call of fma_chains does per iteration.
int64_t fma_flops_per_iteration() {
  return int64_t{2} * kChains * kLanes;
}

// Runs `iterations` steps of every chain; returns a checksum so that nothing is optimized away.
#if !defined(PTO_ISA_AVX512) && !defined(PTO_ISA_AVX2)
__attribute__((optimize("no-tree-vectorize", "no-tree-slp-vectorize")))
#endif
float fma_chains(int64_t iterations, float mul, float add) {
#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
  using pto::cpu::PTO_ISA_NS::Vec;
  Vec acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = Vec::set1(static_cast<float>(c));
  Vec m = Vec::set1(mul), a = Vec::set1(add);
  for (int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = pto::cpu::PTO_ISA_NS::fma(acc[c], m, a);
  Vec sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = sum + acc[c];
  float lanes[kLanes];
  sum.store(lanes);
  float total = 0;
  for (float v : lanes) total += v;
  return total;
#else
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = static_cast<float>(c);
  for (int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * mul + add;
  float total = 0;
  for (float v : acc) total += v;
  return total;
#endif
}

#if defined(PTO_ISA_AVX512)
// The bf16 dot-product ceiling: the same chains on VDPBF16PS, each lane adding two products per
// step (4 flops, as a bf16 GEMM counts them). Only where has_ext(Ext::kAvx512Bf16).
int64_t dpbf16_flops_per_iteration() {
  return int64_t{4} * kChains * kLanes;
}

__attribute__((target("avx512bf16"))) float dpbf16_chains(int64_t iterations, float mul) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512bh m = _mm512_cvtne2ps_pbh(_mm512_set1_ps(mul), _mm512_set1_ps(mul));
  for (int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], m, m);
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return _mm512_reduce_add_ps(sum);
}
#endif

}  // namespace pto::cpu::PTO_ISA_NS
