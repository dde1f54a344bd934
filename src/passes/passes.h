// Each pass file registers its pass through one function here (explicit calls, not static
// initializers, so that linking the static library can never drop one). The pipelines of the
// optimization levels are in pass_manager.cpp.
#pragma once

#include "pto/passes.h"

namespace pto::passes {

void register_eliminate_dead_code(PassRegistry& r);
void register_canonicalize_ops(PassRegistry& r);
void register_fold_batch_norm(PassRegistry& r);
void register_fold_transpose_into_gemm(PassRegistry& r);
void register_recognize_composites(PassRegistry& r);
void register_recognize_attention(PassRegistry& r);
void register_recognize_rotary_embedding(PassRegistry& r);
void register_fold_constants(PassRegistry& r);
void register_eliminate_no_ops(PassRegistry& r);
void register_simplify_transposes(PassRegistry& r);
void register_eliminate_common_subexpressions(PassRegistry& r);
void register_resolve_shapes(PassRegistry& r);
void register_unflatten_mat_mul(PassRegistry& r);
void register_assign_layouts(PassRegistry& r);
void register_fuse_blocked_convs(PassRegistry& r);
void register_auto_mixed_precision(PassRegistry& r);
void register_mat_mul_precision(PassRegistry& r);
void register_conv_precision(PassRegistry& r);
void register_promote_half(PassRegistry& r);
void register_fuse_dynamic_quantization(PassRegistry& r);
void register_lower_qdq_to_integer(PassRegistry& r);
void register_store_half_operands(PassRegistry& r);
void register_lower_qlinear_ops(PassRegistry& r);
void register_merge_sibling_mat_muls(PassRegistry& r);
void register_fold_attention_heads(PassRegistry& r);
void register_lower_conv3d(PassRegistry& r);
void register_lower_einsum(PassRegistry& r);
void register_fuse_gather_mat_mul(PassRegistry& r);
void register_fuse_channel_moves(PassRegistry& r);
// Whether `g` has bf16 or f16 values (PromoteHalf then runs first, at any level).
bool has_half_values(const Graph& g);

}  // namespace pto::passes
