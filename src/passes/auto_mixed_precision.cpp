// AutoMixedPrecision: the matrix products of a float32 graph compute in bf16 or f16
// (PassContext::mixed_precision), everything else in float32 (CompileOptions::
// auto_mixed_precision, pypto.optimize(dtype=torch.bfloat16 or torch.float16)).
//
//   %y = MatMul(%a, %w)   ->   %y = MatMul(%a, %w) {precision="bf16"}   (or "f16")
//
// "bf16" means: both operands rounded to bf16 (nearest even), the products accumulated in fp32,
// the result fp32 — what torch.autocast does to a matmul, less the rounding of its output; "f16"
// the same with IEEE half (values beyond 65504 become inf, as in torch's fp16 autocast). The
// ops autocast keeps in fp32 (softmax, the norms and their statistics, reductions, exp/log,
// losses) stay fp32 because only MatMul and Gemm are marked: they are the fp32 islands, and the
// activations between them keep full precision. The reference interpreter and the CPU kernels
// honour the attribute (VDPBF16PS where the CPU has it; fp16 via F16C conversions to fp32), and
// the ONNX exporter writes it as Casts.
//
// Not marked: products of integers or of other float types; convolutions (no bf16 convolution
// kernel yet), attention (its kernel computes in fp32).
#include "ir/ops/op_params.h"
#include "passes/passes.h"
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

Graph auto_mixed_precision(Graph g, const PassContext& ctx) {
  const std::string precision = params::product_precision_name(ctx.mixed_precision);
  int marked = 0;
  for (Node& n : g.mutable_nodes()) {
    if ((n.op != "MatMul" && n.op != "Gemm") || n.attrs.has("precision")) continue;
    bool f32 = n.inputs.size() >= 2;
    for (size_t i = 0; i < 2 && f32; ++i)
      f32 = n.inputs[i] != kNoValue && dtype_of_value(g, n.inputs[i]) == DType::kF32;
    if (!f32) continue;
    n.attrs.set("precision", precision);
    ++marked;
  }
  if (marked) ctx.note(cat("AutoMixedPrecision/", precision, " MatMul/Gemm"), marked);
  return g;
}

}  // namespace

void register_auto_mixed_precision(PassRegistry& r) {
  r.add({"AutoMixedPrecision", auto_mixed_precision,
         "marks float32 MatMul/Gemm to compute in bf16 or f16 (fp32 accumulation; the rest fp32)"});
}

}  // namespace pto::passes
