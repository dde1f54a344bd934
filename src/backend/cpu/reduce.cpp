#include "backend/cpu/kernel.h"

namespace pto::cpu {

void register_reduce_kernels(KernelRegistry& r) {}

}  // namespace pto::cpu
