#include "kernel_util.h"

namespace pto::reference {

void register_indexing_kernels(KernelRegistry& r) {
  (void)r;
}

}  // namespace pto::reference
