// Contractions: Gemm, MatMul (numpy matmul), MatMulInteger and Einsum.
#include <map>

#include "einsum_equation.h"
#include "infer_util.h"
#include "op_params.h"

namespace pto {
namespace {

// numpy matmul's result shape; 1-D operands get a 1 prepended (A) or appended (B), then dropped.
std::optional<Shape> matmul_shape(const InferContext& c) {
  if (!c.has_input(0) || !c.has_input(1)) return std::nullopt;
  const std::optional<Shape>&a = c.inputs[0].shape, &b = c.inputs[1].shape;
  if (!a || !b) return std::nullopt;
  if (a->empty() || b->empty())
    throw ValueError(cat(c.where(), ": operands must have rank >= 1, got ", shape_str(*a), " and ",
                         shape_str(*b)));
  Shape sa = *a, sb = *b;
  if (sa.size() == 1) sa.insert(sa.begin(), Dim(1));
  if (sb.size() == 1) sb.push_back(Dim(1));
  const Dim &ka = sa.back(), &kb = sb[sb.size() - 2];
  if (ka.is_known() && kb.is_known() && ka.value != kb.value)
    throw ValueError(
        cat(c.where(), ": inner dimensions differ: ", shape_str(*a), " x ", shape_str(*b)));
  Shape batch =
      broadcast_shapes(Shape(sa.begin(), sa.end() - 2), Shape(sb.begin(), sb.end() - 2), c.where());
  if (a->size() > 1) batch.push_back(sa[sa.size() - 2]);
  if (b->size() > 1) batch.push_back(sb.back());
  return batch;
}

void infer_gemm(InferContext& c) {
  if (!c.has_input(0)) return;
  std::optional<Shape> y;
  const std::optional<Shape>&a = c.inputs[0].shape, &b = c.input(1).shape;
  if (a && b) {
    if (a->size() != 2 || b->size() != 2)
      throw ValueError(
          cat(c.where(), ": A and B must be 2-D, got ", shape_str(*a), " and ", shape_str(*b)));
    const params::Gemm p = params::gemm(c.node);
    const bool ta = p.trans_a, tb = p.trans_b;
    y = Shape{(*a)[ta ? 1 : 0], (*b)[tb ? 0 : 1]};
  }
  infer::set(c, 0, params::product_result_dtype(c.node, c.inputs[0].dtype), y);
}

void infer_einsum(InferContext& c) {
  if (!c.has_input(0)) return;
  std::vector<int64_t> ranks;
  bool all_static = true;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    if (!c.has_input(i) || !c.inputs[i].shape)
      return infer::set(c, 0, c.inputs[0].dtype, std::nullopt);
    ranks.push_back(static_cast<int64_t>(c.inputs[i].shape->size()));
    all_static = all_static && is_static(*c.inputs[i].shape);
  }
  einsum::Equation e = einsum::parse(c.attrs().get_string("equation"), ranks, c.where());
  Shape y;
  if (all_static) {
    std::vector<Dims> shapes;
    for (size_t i = 0; i < c.num_inputs(); ++i) shapes.push_back(to_dims(*c.inputs[i].shape));
    std::vector<int64_t> size = einsum::label_sizes(e, shapes, c.where());
    for (int l : e.output) y.push_back(size[l]);
  } else {
    // Each label's dim over the axes bearing it, broadcast as numpy broadcasts (a symbol kept:
    // an attention einsum over a symbolic batch stays [batch, ...], so LowerEinsum sees its
    // readers' batch as the same dim).
    std::map<int, Dim> size;
    for (size_t i = 0; i < e.inputs.size(); ++i)
      for (size_t j = 0; j < e.inputs[i].size(); ++j) {
        const Dim& d = (*c.inputs[i].shape)[j];
        auto [it, fresh] = size.emplace(e.inputs[i][j], d);
        if (!fresh) it->second = broadcast_shapes({it->second}, {d}, c.where())[0];
      }
    for (int l : e.output) y.push_back(size.at(l));
  }
  infer::set(c, 0, c.inputs[0].dtype, y);
}

// GatherMatMul(X [S, K], W [E, N, K] (or [E, K, N] with trans_w), I [S]) -> [S, N].
void infer_gather_matmul(InferContext& c) {
  if (!c.has_input(0)) return;
  std::optional<Shape> y;
  const std::optional<Shape>&x = c.inputs[0].shape, &w = c.input(1).shape, &i = c.input(2).shape;
  if (x && w && i) {
    if (x->size() != 2 || w->size() != 3 || i->size() != 1)
      throw ValueError(cat(c.where(), ": X, W and I must be [S, K], [E, N, K] and [S], got ",
                           shape_str(*x), ", ", shape_str(*w), " and ", shape_str(*i)));
    const bool trans = c.node.attr_int("trans_w") != 0;
    const Dim &k = (*w)[trans ? 1 : 2], &n = (*w)[trans ? 2 : 1];
    if (k.is_known() && (*x)[1].is_known() && k.value != (*x)[1].value)
      throw ValueError(cat(c.where(), ": X ", shape_str(*x), " does not fit W ", shape_str(*w)));
    y = Shape{(*x)[0], n};
  }
  if (c.has_input(2) && c.input(2).dtype != DType::kUndefined && c.input(2).dtype != DType::kI64 &&
      c.input(2).dtype != DType::kI32)
    throw TypeError(
        cat(c.where(), ": I must be int32 or int64, got ", dtype_name(c.input(2).dtype)));
  infer::set(c, 0, c.inputs[0].dtype, y);
}

}  // namespace

void register_nn_matmul_ops(OpRegistry& r) {
  r.add({.name = "MatMul",
         .min_inputs = 2,
         .max_inputs = 2,
         .properties = kOpaque,
         .attrs = {params::precision_attr()},
         .infer =
             [](InferContext& c) {
               if (c.has_input(0))
                 infer::set(c, 0, params::product_result_dtype(c.node, c.inputs[0].dtype),
                            matmul_shape(c));
             },
         .doc = "numpy matmul: batched, broadcasting, 1-D operands"});
  r.add({.name = "MatMulInteger",
         .min_inputs = 2,
         .max_inputs = 4,
         .properties = kOpaque,
         .attrs = AttrSchema::none(),
         .infer = [](InferContext& c) { infer::set(c, 0, DType::kI32, matmul_shape(c)); },
         .doc = "(A - a_zero_point) x (B - b_zero_point) on 8-bit integers, int32 result"});
  r.add({.name = "Gemm",
         .min_inputs = 2,
         .max_inputs = 3,
         .properties = kOpaque,
         .attrs = {{"alpha", 1.0},
                   {"beta", 1.0},
                   bool_attr("transA", false),
                   bool_attr("transB", false),
                   {"broadcast", int64_t{0}, "opset < 7: 1 to broadcast C"},
                   params::precision_attr()},
         .infer = infer_gemm,
         .doc = "alpha * A' B' + beta * C, with optional transposes and broadcast C"});
  r.add({.name = "GatherMatMul",
         .min_inputs = 3,
         .max_inputs = 3,
         .properties = kOpaque,
         .attrs = {{"trans_w", int64_t{0}, "1: W is [E, K, N] (Y[s] = X[s] W[I[s]])"}},
         .infer = infer_gather_matmul,
         .doc = "Y[s] = W[I[s]] X[s] for X [S, K], W [E, N, K], I [S]: each row by its own "
                "matrix (a mixture of experts' layer), made by FuseGatherMatMul"});
  r.add({.name = "Einsum",
         .min_inputs = 1,
         .max_inputs = -1,
         .properties = kOpaque,
         .attrs = {required_attr("equation", AttrKind::kString)},
         .infer = infer_einsum,
         .doc = "Einstein summation with diagonals, broadcasting and ellipsis",
         .lowered_by = "LowerEinsum at level >= 2 (one or two float operands; a repeated operand "
                       "label of known size as a strided Slice)"});
}

}  // namespace pto
