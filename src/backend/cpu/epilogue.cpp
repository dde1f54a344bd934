// apply_epilogue (gemm.h): dispatches to the active ISA's vector loop (epilogue_impl.h).
#include "backend/cpu/gemm/gemm.h"
#include "backend/cpu/isa/isa.h"

namespace pto::cpu {

PTO_ISA_DECLARE(void apply_epilogue(const Epilogue& ep, float* c, int64_t ldc, int64_t m0,
                                    int64_t m, int64_t n0, int64_t n);)

void apply_epilogue(const Epilogue& ep, float* c, int64_t ldc, int64_t m0, int64_t m, int64_t n0,
                    int64_t n) {
  if (ep.tile) return run_tile_epilogue(ep, c, ldc, m0, m, n0, n);
  PTO_ISA_DISPATCH(apply_epilogue, ep, c, ldc, m0, m, n0, n);
}

}  // namespace pto::cpu
