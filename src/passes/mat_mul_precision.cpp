// MatMulPrecision: what the float32 matrix products compute in, as PyTorch's
// torch.set_float32_matmul_precision says (PassContext::matmul_precision, CompileOptions::
// matmul_precision, pypto.optimize(matmul_precision=...), pto --matmul-precision).
//
//   "high":   %y = MatMul(%a, %w)  ->  %y = MatMul(%a, %w) {precision="bf16x3"}
//   "medium": %y = MatMul(%a, %w)  ->  %y = MatMul(%a, %w) {precision="bf16"}
//   (Gemm the same; "highest", the default, does not run the pass)
//
// PyTorch's "high" lets a float32 matmul treat each operand as the sum of two bfloat16 numbers
// where fast hardware makes that pay, and "medium" compute in bfloat16; otherwise it stays
// float32. So here: "bf16x3" (op_params.h: the products of the operands' bf16 heads and tails,
// Ah Bh + Al Bh + Ah Bl, about 2^-16 relative error per product against fp32's 2^-24) where the
// CPU has AMX-BF16, on whose tiles the three bf16 products take less time than one fp32 product
// on the FMA units; "bf16" (rounded operands, fp32 accumulation, as PyTorch's oneDNN computes a
// CPU matmul under "medium") where the CPU has AVX512_BF16. Elsewhere the products stay float32
// and the pass says so (a note), as PyTorch's do.
//
// Only the products change: activations, softmax, norms and every other op stay float32, and
// the operands and results stay float32 values (unlike AutoMixedPrecision, which runs first and
// whose marks this pass leaves as they are). Not marked under "high": products whose A has
// fewer than 16 rows where the shapes say so (a decode step's): too few rows for a tile, and
// streaming the weights' heads and tails then runs at 0.75-0.8x the fp32 product's speed.
#include "ir/ops/op_params.h"
#include "passes/passes.h"
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

// Rows of A in the GEMM a MatMul or Gemm runs when its shape is known (a MatMul against one 2-D
// B folds A's leading dims into the rows), else -1.
int64_t static_rows(const Graph& g, const Node& n) {
  const std::optional<Dims> a = static_dims(g, n.inputs[0]), b = static_dims(g, n.inputs[1]);
  if (!a || !b || a->empty()) return -1;
  if (n.op == "Gemm") return n.attrs.get_int("transA", 0) ? a->back() : a->front();
  if (a->size() == 1) return 1;
  if (b->size() > 2) return (*a)[a->size() - 2];
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < a->size(); ++i) rows *= (*a)[i];
  return rows;
}

constexpr int64_t kMinSplitRows = 16;  // an AMX tile's rows (gemm.cpp kAmxMinRows)

Graph mat_mul_precision(Graph g, const PassContext& ctx) {
  const bool split = ctx.matmul_precision == "high";
  if (!split && ctx.matmul_precision != "medium") return g;
  const bool fast = split ? machine_has_amx_bf16() : machine_has_avx512_bf16();
  const std::string precision = split ? params::kSplitBf16 : "bf16";
  int marked = 0, kept = 0, few_rows = 0;
  for (Node& n : g.mutable_nodes()) {
    if (!n.domain.empty() || (n.op != "MatMul" && n.op != "Gemm") || n.inputs.size() < 2 ||
        n.attrs.has("precision"))
      continue;
    if (dtype_of_value(g, n.inputs[0]) != DType::kF32 ||
        dtype_of_value(g, n.inputs[1]) != DType::kF32)
      continue;
    if (!fast) {
      ++kept;
      continue;
    }
    if (const int64_t rows = static_rows(g, n); split && rows >= 0 && rows < kMinSplitRows) {
      ++few_rows;
      continue;
    }
    n.attrs.set("precision", precision);
    ++marked;
  }
  if (marked) ctx.note(cat("MatMulPrecision/", precision, " MatMul/Gemm"), marked);
  if (few_rows) ctx.note("MatMulPrecision/float32: fewer than 16 rows", few_rows);
  if (kept)
    ctx.note(
        split ? "MatMulPrecision/float32: no AMX-BF16" : "MatMulPrecision/float32: no AVX512_BF16",
        kept);
  return g;
}

}  // namespace

void register_mat_mul_precision(PassRegistry& r) {
  r.add({"MatMulPrecision", mat_mul_precision,
         "float32 MatMul/Gemm as torch's float32 matmul precision says: \"high\" bf16x3 on AMX, "
         "\"medium\" bf16"});
}

}  // namespace pto::passes
