#include "backend/cpu/kernel.h"

namespace pto::cpu {

void register_gemm_kernels(KernelRegistry& r) {}

}  // namespace pto::cpu
