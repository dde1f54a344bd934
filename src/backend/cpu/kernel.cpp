#include "backend/cpu/kernel.h"

#include "pto/op_registry.h"

namespace pto::cpu {

// tree_ensemble.cpp: TreeEnsemble, TreeEnsembleRegressor, TreeEnsembleClassifier (ai.onnx.ml).
// Declared here rather than in kernel.h, which every kernel file includes.
void register_tree_ensemble_kernels(KernelRegistry& r);

KernelRegistry& KernelRegistry::global() {
  static KernelRegistry* registry = [] {
    auto* r = new KernelRegistry();
    register_gemm_kernels(*r);
    register_gather_matmul_kernel(*r);
    register_conv_kernels(*r);
    register_elementwise_kernels(*r);
    register_reduce_kernels(*r);
    register_movement_kernels(*r);
    register_attention_kernels(*r);
    register_quant_kernels(*r);
    register_generate_kernels(*r);
    register_resize_kernels(*r);
    register_recurrent_kernels(*r);
    register_linear_attention_kernels(*r);
    register_topk_kernels(*r);
    register_grid_sample_kernels(*r);
    register_axis_kernels(*r);
    register_detect_kernels(*r);
    register_nbits_kernels(*r);
    register_dft_kernels(*r);
    register_tree_ensemble_kernels(*r);
    return r;
  }();
  return *registry;
}

void KernelRegistry::add(const std::string& op, Kernel k) {
  PTO_CHECK(OpRegistry::global().find(op) != nullptr)
      << "CPU kernel for '" << op << "' has no OpDef";
  PTO_CHECK(static_cast<bool>(k.run)) << "CPU kernel '" << op << "' has no run function";
  kernels_.add(op, std::move(k));
}

std::vector<Tensor> run_reference(const KernelContext& c) {
  return (*reference::KernelRegistry::global().find(c.node))(c);
}

}  // namespace pto::cpu
