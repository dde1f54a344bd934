#include "backend/cpu/kernel.h"

namespace pto::cpu {

void register_elementwise_kernels(KernelRegistry& r) {}

}  // namespace pto::cpu
