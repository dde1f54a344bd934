// ConvPrecision: what the float32 convolutions compute in, as PyTorch's
// torch.backends.mkldnn.conv.fp32_precision says for its CPU convolutions (PassContext::
// conv_precision, CompileOptions::conv_precision, pypto.optimize(conv_precision=...),
// pto --conv-precision), in torch.set_float32_matmul_precision's words:
//
//   "high"   (torch's "tf32"): %y = Conv(%x, %w, %b) -> %y = Conv(%x, %w, %b) {precision="bf16x3"}
//   "medium" (torch's "bf16"): %y = Conv(%x, %w, %b) -> %y = Conv(%x, %w, %b) {precision="bf16"}
//   ("highest", torch's "ieee" and the default, does not run the pass)
//
// As MatMulPrecision does for MatMul and Gemm: "bf16x3" (the products of X's and W's bf16 heads
// and tails, about 2^-16 relative error per product; op_params.h) where the CPU has AMX-BF16, on
// whose tiles the conv's implicit GEMM runs them; "bf16" (rounded operands, fp32 accumulation, as
// oneDNN computes PyTorch's CPU conv under "bf16") where it has AVX512_BF16. Elsewhere the
// convolutions stay float32 and the pass says so (a note). The bias, the activations and every
// other op stay float32.
//
// Not marked: convolutions of other types; depthwise ones (one input channel per group: memory
// bound, so neither form would make them faster; takes_reduced_products); under "high", convs
// with fewer than 128 output or input channels (pays_split). Runs after AutoMixedPrecision, whose
// marks win, and MatMulPrecision.
#include <cstdlib>
#include <cstring>

#include "passes/passes.h"
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

constexpr int64_t kMinSplitRows = 128, kMinSplitDepth = 128;

// Whether bf16x3 products make Conv `n` faster: its implicit GEMM has 128 rows (output channels
// per group) or more and a depth (input channels per group x kernel size) of 128 or more, so the
// heads and tails of its input, packed on every call, feed enough tile products. Measured on
// ResNet-50 (2-core Xeon with AMX, one thread): alone (bench/conv_bf16.py --precision bf16x3)
// its convs of 128 channels or more run 1.27-2.36x faster split, the 64-channel ones 1.08-1.24x
// and the 7x7 stem on 3 channels 0.95x; inside the model, where a split conv leaves level 3's
// blocked layout for the NCHW implicit GEMM, the 64-channel stage's convs ran 0.53-0.89x (their
// reorders included) and the whole model split everywhere 41.9 ms against 39.7 with this rule
// (fp32 53-55).
// PTO_CONV_SPLIT_ALL=1 drops the rule (every dense or grouped conv split: the per-layer A/B of
// bench/conv_bf16.py --precision bf16x3); unset or 0 keeps it; anything else is an error.
bool pays_split(const Graph& g, const Node& n) {
  if (const char* e = std::getenv("PTO_CONV_SPLIT_ALL"); e && *e && std::strcmp(e, "0") != 0) {
    if (std::strcmp(e, "1") != 0)
      throw ValueError(cat("PTO_CONV_SPLIT_ALL='", e, "': expected 0 or 1"));
    return true;
  }
  const std::optional<Dims> w = static_dims(g, n.inputs[1]);
  if (!w || w->size() < 3) return false;
  int64_t depth = 1;
  for (size_t d = 1; d < w->size(); ++d) depth *= (*w)[d];
  return (*w)[0] / n.attrs.get_int("group", 1) >= kMinSplitRows && depth >= kMinSplitDepth;
}

bool is_conv(const Graph& g, const Node& n) {
  return n.op == "Conv" && takes_reduced_products(g, n);
}

Graph conv_precision(Graph g, const PassContext& ctx) {
  mark_float32_products(g, ctx, ctx.conv_precision,
                        {"ConvPrecision", "Conv", is_conv, pays_split, "fewer than 128 channels"});
  return g;
}

}  // namespace

void register_conv_precision(PassRegistry& r) {
  r.add({"ConvPrecision", conv_precision,
         "float32 Conv as torch.backends.mkldnn.conv.fp32_precision says: \"high\" (tf32) bf16x3 "
         "on AMX, \"medium\" (bf16) bf16"});
}

}  // namespace pto::passes
