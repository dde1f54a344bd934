// The per-ISA FMA loops of fma_impl.h, as seen from the rest of pto_bench.
#pragma once

#include <cstdint>

#include "backend/cpu/isa/isa.h"

namespace pto::bench {

PTO_ISA_DECLARE(float fma_chains(int64_t iterations, float mul, float add);
                int64_t fma_flops_per_iteration();)

}  // namespace pto::bench
