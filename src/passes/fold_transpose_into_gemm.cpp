// FoldTransposeIntoGemm: a 2-D transpose feeding a matrix product is absorbed by the product.
//   Gemm(Transpose(a), b)             -> Gemm(a, b) with transA flipped   (and likewise for B)
//   MatMul(a, Transpose(w)), a 2-D    -> Gemm(a, w, transB=1)             (w constant or not)
//   MatMul(Transpose(x), b), b 2-D    -> Gemm(x, b, transA=1)
//   MatMul(a, Transpose(w)), rank(a) > 2, w a constant 2-D weight
//                                     -> MatMul(a, w^T) with w^T a new constant
// The Transpose must be 2-D with perm [1, 0] (or none) and read by the product alone; it is
// removed. Only floating types (Gemm's integer form has extra conditions on alpha and beta).
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

// The input of a 2-D transpose that `v` is the single-use output of, or kNoValue.
ValueId transposed_2d(const Graph& g, ValueId v, const std::vector<int>& uses) {
  const Node* t = producer(g, v);
  if (!t || t->op != "Transpose" || t->inputs.size() != 1 || uses[v] != 1 || g.is_output(v))
    return kNoValue;
  const auto& shape = g.value(t->inputs[0]).type.shape;
  if (!shape || shape->size() != 2) return kNoValue;
  if (t->attrs.get_ints("perm", {1, 0}) != std::vector<int64_t>{1, 0}) return kNoValue;
  return t->inputs[0];
}

size_t producer_index(const Graph& g, ValueId v) {
  return static_cast<size_t>(g.value(v).producer);
}

bool rank_is(const Graph& g, ValueId v, size_t rank) {
  const auto& s = g.value(v).type.shape;
  return s && s->size() == rank;
}

bool gemm_transpose(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const Node& n = g.nodes()[i];
  if (n.op != "Gemm" || n.inputs.size() < 2 || !is_floating(dtype_of_value(g, n.inputs[0])))
    return false;
  const std::vector<int>& uses = rw.uses();
  bool done = false;
  for (size_t side = 0; side < 2; ++side) {
    const ValueId tv = g.nodes()[i].inputs[side];
    const ValueId src = transposed_2d(g, tv, uses);
    if (src == kNoValue) continue;
    Node& m = g.mutable_nodes()[i];
    const char* flag = side == 0 ? "transA" : "transB";
    m.attrs.set(flag, int64_t{m.attrs.get_int(flag, 0) != 0 ? 0 : 1});
    m.inputs[side] = src;
    rw.remove(producer_index(g, tv));
    ctx.note(side == 0 ? "FoldTransposeIntoGemm/GemmA" : "FoldTransposeIntoGemm/GemmB");
    done = true;
  }
  return done;
}

bool matmul_transpose(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const Node& n = g.nodes()[i];
  if (n.op != "MatMul" || n.inputs.size() != 2 || !is_floating(dtype_of_value(g, n.inputs[0])))
    return false;
  const std::vector<int>& uses = rw.uses();
  const ValueId a = n.inputs[0], b = n.inputs[1];
  const ValueId ta = transposed_2d(g, a, uses), tb = transposed_2d(g, b, uses);
  if (rank_is(g, a, 2) && rank_is(g, b, 2) && (ta != kNoValue || tb != kNoValue)) {
    Attributes attrs = with_precision_of(n);
    if (ta != kNoValue) attrs.set("transA", int64_t{1});
    if (tb != kNoValue) attrs.set("transB", int64_t{1});
    if (ta != kNoValue) rw.remove(producer_index(g, a));
    if (tb != kNoValue) rw.remove(producer_index(g, b));
    retarget(g.mutable_nodes()[i], "Gemm", {ta != kNoValue ? ta : a, tb != kNoValue ? tb : b},
             std::move(attrs));
    ctx.note("FoldTransposeIntoGemm/MatMulToGemm");
    return true;
  }
  // A batched product by a constant weight: transpose the weight once, now.
  const Tensor* w = tb != kNoValue ? constant(g, tb) : nullptr;
  const auto& as = g.value(a).type.shape;
  if (!w || !as || as->size() <= 2 || w->rank() != 2 || !is_floating(w->dtype())) return false;
  const int64_t rows = w->dim(0), cols = w->dim(1);
  std::vector<double> v = to_doubles(*w), t(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      t[static_cast<size_t>(c * rows + r)] = v[static_cast<size_t>(r * cols + c)];
  auto wt = float_tensor(w->dtype(), {cols, rows}, t);
  if (!wt) return false;
  const ValueId wid = g.add_constant(g.value(tb).name + "_t", std::move(*wt));
  rw.remove(producer_index(g, b));
  g.mutable_nodes()[i].inputs[1] = wid;
  ctx.note("FoldTransposeIntoGemm/ConstantWeight");
  return true;
}

Graph fold_transpose_into_gemm(Graph g, const PassContext& ctx) {
  apply_rules(g, {{nullptr, gemm_transpose}, {nullptr, matmul_transpose}}, ctx);
  return g;
}

}  // namespace

void register_fold_transpose_into_gemm(PassRegistry& r) {
  r.add({"FoldTransposeIntoGemm", fold_transpose_into_gemm,
         "absorbs 2-D transposes into Gemm's transA/transB, turns MatMul by a transposed "
         "matrix into Gemm, and pre-transposes constant weights of batched MatMuls"});
}

}  // namespace pto::passes
