#include "backend/cpu/kernel.h"

namespace pto::cpu {

void register_movement_kernels(KernelRegistry& r) {}

}  // namespace pto::cpu
