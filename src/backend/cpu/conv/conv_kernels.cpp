#include "backend/cpu/kernel.h"

namespace pto::cpu {

void register_conv_kernels(KernelRegistry& r) {}

}  // namespace pto::cpu
