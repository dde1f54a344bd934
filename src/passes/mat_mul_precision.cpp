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

bool is_product(const Graph&, const Node& n) {
  return n.op == "MatMul" || n.op == "Gemm";
}

bool enough_rows(const Graph& g, const Node& n) {
  const int64_t rows = static_rows(g, n);
  return rows < 0 || rows >= kMinSplitRows;
}

Graph mat_mul_precision(Graph g, const PassContext& ctx) {
  mark_float32_products(
      g, ctx, ctx.matmul_precision,
      {"MatMulPrecision", "MatMul/Gemm", is_product, enough_rows, "fewer than 16 rows"});
  return g;
}

}  // namespace

void register_mat_mul_precision(PassRegistry& r) {
  r.add({"MatMulPrecision", mat_mul_precision,
         "float32 MatMul/Gemm as torch's float32 matmul precision says: \"high\" bf16x3 on AMX, "
         "\"medium\" bf16"});
}

}  // namespace pto::passes
