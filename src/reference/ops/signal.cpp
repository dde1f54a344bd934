#include "kernel_util.h"

namespace pto::reference {

void register_signal_kernels(KernelRegistry& r) { (void)r; }

}  // namespace pto::reference
