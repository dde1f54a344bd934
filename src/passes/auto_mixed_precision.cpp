// AutoMixedPrecision: the matrix products of a float32 graph compute in bf16 or f16
// (PassContext::mixed_precision), everything else in float32 (CompileOptions::
// auto_mixed_precision, pypto.optimize(dtype=torch.bfloat16 or torch.float16)).
//
//   %y = MatMul(%a, %w)   ->   %y = MatMul(%a, %w) {precision="bf16"}   (or "f16")
//   %y = Conv(%x, %w, %b) ->   %y = Conv(%x, %w, %b) {precision="bf16"}
//   %y = Attention(%q, %k, %v) -> %y = Attention(%q, %k, %v) {precision="bf16"}
//
// "bf16" means: both operands rounded to bf16 (nearest even), the products accumulated in fp32,
// the result fp32 — what torch.autocast does to a matmul, less the rounding of its output; "f16"
// the same with IEEE half (values beyond 65504 become inf, as in torch's fp16 autocast). The
// ops autocast keeps in fp32 (softmax, the norms and their statistics, reductions, exp/log,
// losses) stay fp32 because only the products (MatMul, Gemm, Conv) are marked: they are the fp32
// islands, and the
// activations between them keep full precision. Convolutions are on autocast's lower-precision
// list too (conv1d/2d/3d, and conv_transpose, which PyPTO runs on the reference interpreter
// only, so it is not marked): a Conv's X and W are rounded, the bias added in fp32. The reference
// interpreter and the CPU kernels honour the attribute (VDPBF16PS where the CPU has it; fp16 via
// F16C conversions to fp32), and the ONNX exporter writes it as Casts.
//
// Attention is marked too, as autocast runs SDPA in bf16: both of its products round their
// operands (Q and K; the unnormalized probabilities and V), its softmax stays fp32.
//
// Not marked: products of integers or of other float types; depthwise convolutions (one input
// channel per group: memory bound, so bf16 products would not make them faster and their CPU
// kernel computes in fp32).
#include "ir/ops/op_params.h"
#include "passes/passes.h"
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

Graph auto_mixed_precision(Graph g, const PassContext& ctx) {
  const std::string precision = params::product_precision_name(ctx.mixed_precision);
  int marked = 0, convs = 0, attentions = 0;
  for (Node& n : g.mutable_nodes()) {
    if (!takes_reduced_products(g, n) || n.attrs.has("precision")) continue;
    bool f32 = n.inputs.size() >= 2;
    for (size_t i = 0; i < 2 && f32; ++i)
      f32 = n.inputs[i] != kNoValue && dtype_of_value(g, n.inputs[i]) == DType::kF32;
    if (!f32) continue;
    n.attrs.set("precision", precision);
    ++(n.op == "Conv" ? convs : n.op == "Attention" ? attentions : marked);
  }
  if (marked) ctx.note(cat("AutoMixedPrecision/", precision, " MatMul/Gemm"), marked);
  if (attentions) ctx.note(cat("AutoMixedPrecision/", precision, " Attention"), attentions);
  if (convs) ctx.note(cat("AutoMixedPrecision/", precision, " Conv"), convs);
  return g;
}

}  // namespace

void register_auto_mixed_precision(PassRegistry& r) {
  r.add({"AutoMixedPrecision", auto_mixed_precision,
         "marks float32 MatMul/Gemm/Conv to compute in bf16 or f16 (fp32 accumulation; the rest "
         "stays fp32)"});
}

}  // namespace pto::passes
