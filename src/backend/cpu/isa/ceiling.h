// The register-only FMA loops of fma_impl.h, one per ISA: what pto::fma_ceiling() (ceiling.cpp)
// and pto_bench measure the arithmetic ceiling with.
#pragma once

#include <cstdint>

#include "backend/cpu/isa/isa.h"

namespace pto::cpu {

PTO_ISA_DECLARE(float fma_chains(int64_t iterations, float mul, float add);
                int64_t fma_flops_per_iteration();)

// The bf16 dot-product chains (VDPBF16PS), in the avx512 build: run only where
// has_ext(Ext::kAvx512Bf16).
namespace avx512 {
float dpbf16_chains(int64_t iterations, float mul);
int64_t dpbf16_flops_per_iteration();
// The AMX tile products (TDPBF16PS into four independent tiles, gemm_amx_avx512.cpp): run only
// where has_ext(Ext::kAmxBf16).
float tdpbf16_chains(int64_t iterations);
int64_t tdpbf16_flops_per_iteration();
// The same products as a GEMM with short K runs them: an m x n fp32 C (rows n floats apart, both
// multiples of 32) in 32 x 32 blocks, each `chunks` chunks of 32 values of K on L1-resident A
// and B, then stored by its four tile stores (or, with `half`, through an L1 buffer as bf16
// into c's first m x n halves). What a short K costs once C's lines are not in L1:
// 2 * 32 * 32 * 32 * chunks FLOPs a block.
float tdpbf16_stores(int64_t chunks, float* c, int64_t m, int64_t n, bool half);
}  // namespace avx512

// fma_chains / fma_flops_per_iteration of `isa`'s build.
float run_fma_chains(Isa isa, int64_t iterations, float mul, float add);
int64_t fma_flops_per_iteration(Isa isa);

}  // namespace pto::cpu
