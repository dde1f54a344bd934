// The NN kernel family: conv.cpp, pool.cpp, norm.cpp, softmax.cpp, matmul.cpp, einsum.cpp and
// blocked_layout.cpp.
#include "nn_kernels.h"

namespace pto::reference {

void register_nn_kernels(KernelRegistry& r) {
  register_conv_kernels(r);
  register_pool_kernels(r);
  register_norm_kernels(r);
  register_softmax_kernels(r);
  register_matmul_kernels(r);
  register_einsum_kernels(r);
  register_blocked_layout_kernels(r);
}

}  // namespace pto::reference
