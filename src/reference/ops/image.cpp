#include "kernel_util.h"

namespace pto::reference {

void register_image_kernels(KernelRegistry& r) { (void)r; }

}  // namespace pto::reference
