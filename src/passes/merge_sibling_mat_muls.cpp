// MergeSiblingMatMuls: matrix products of one activation by constant weights (attention's Q, K
// and V projections) become one product by the weights concatenated along N, split back into the
// original results:
//
//   y_i = MatMul(x, W_i) [+ b_i]   (or Gemm(x, W_i [, c_i]), transB either way)
//     -> Split(Add(MatMul(x, concat(W_i)), concat(b_i)), [N_1, .., N_n], axis=-1) -> y_1 .. y_n
//
// (for a 2-D x, Gemm(x, concat(W_i), concat(b_i)), with transB when every member had it).
//
// One [M, K] x [K, sum N_i] GEMM packs x once and gives the threads n times the columns to share
// (issue 13 measured BERT's 128x768x768 projections scaling poorly from 1 to 2 threads). A member
// without a bias gets zeros (x + 0 is x). Members are the readers of x, in graph order, with x as
// the left operand, a constant 2-D weight of x's dtype (floating) and the same `precision`; Gemm
// only with alpha = 1, beta = 1, transA = 0 and a constant [N] or [1, N] bias. A bias is an Add of
// a constant whose shape is [N] with leading ones, the product's only reader. A member whose result
// feeds an elementwise op (through views too) is left alone: that op fuses into the GEMM's epilogue
// now and would not after the Split. Each element is the same dot product as before, so the
// reference gives the same bits; the CPU GEMM's blocking may move it by rounding (level 2). Split
// copies its outputs: what that costs against what the merge buys is in docs/passes.md.
#include "ir/ops/op_params.h"
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

struct Member {
  size_t node;                     // the MatMul or Gemm
  size_t bias_node = SIZE_MAX;     // the bias Add, when there is one
  ValueId result = kNoValue;       // what the Split gives back
  const Tensor* weight = nullptr;  // [K, N], or [N, K] when trans_b
  bool trans_b = false;
  ValueId bias = kNoValue;  // a constant of N values, or kNoValue
  int64_t n = 0;
};

// Whether v is a constant holding N values along its last axis (leading axes of size 1).
bool is_bias(const Graph& g, ValueId v, int64_t n, DType dt) {
  const Tensor* b = constant(g, v);
  return b && b->dtype() == dt && b->rank() >= 1 && b->numel() == n && b->dim(b->rank() - 1) == n;
}

// Whether an elementwise op reads y, directly or through views (Reshape ...): it would fuse into
// the product's epilogue, as the epilogue chain follows views.
bool feeds_elementwise(const Graph& g, const ReaderIndex& readers, ValueId y, int depth = 4) {
  for (int32_t r : readers.readers(y)) {
    const Node& n = g.nodes()[static_cast<size_t>(r)];
    if (n.def && n.def->is_elementwise()) return true;
    if (n.def && n.def->is_view() && n.outputs.size() == 1 && depth > 0 &&
        feeds_elementwise(g, readers, n.outputs[0], depth - 1))
      return true;
  }
  return false;
}

// Node `i` as a member for activation x with K rows of weight, or nullopt.
std::optional<Member> member(Rewrite& rw, size_t i, ValueId x, int64_t k) {
  const Graph& g = rw.graph();
  const Node& n = g.nodes()[i];
  const DType dt = dtype_of_value(g, x);
  if (rw.removed(i) || !n.domain.empty() || n.outputs.size() != 1 || n.inputs.size() < 2 ||
      n.inputs[0] != x || n.inputs[1] == x)
    return std::nullopt;
  bool trans_b = false;
  ValueId c = kNoValue;
  if (n.op == "Gemm") {
    const params::Gemm p = params::gemm(n);
    if (p.alpha != 1.0 || p.trans_a || (n.inputs.size() > 2 && p.beta != 1.0)) return std::nullopt;
    trans_b = p.trans_b;
    if (n.inputs.size() > 2) c = n.inputs[2];
  } else if (n.op != "MatMul") {
    return std::nullopt;
  }
  const Tensor* w = constant(g, n.inputs[1]);
  if (!w || w->rank() != 2 || w->dtype() != dt || w->dim(trans_b ? 1 : 0) != k) return std::nullopt;
  Member m{i};
  m.weight = w;
  m.trans_b = trans_b;
  m.n = w->dim(trans_b ? 0 : 1);
  if (c != kNoValue && !is_bias(g, c, m.n, dt)) return std::nullopt;
  m.bias = c;
  m.result = n.outputs[0];
  const ReaderIndex& readers = rw.readers();
  const int32_t add = readers.single_reader(m.result);
  if (c == kNoValue && add >= 0 && g.nodes()[static_cast<size_t>(add)].op == "Add") {
    const Node& a = g.nodes()[static_cast<size_t>(add)];
    const size_t side = a.inputs[0] == m.result ? 1 : 0;
    const auto &bs = g.value(a.inputs[side]).type.shape, &ys = g.value(m.result).type.shape;
    if (a.inputs.size() == 2 && a.inputs[1 - side] == m.result &&
        is_bias(g, a.inputs[side], m.n, dt) && bs && ys && bs->size() <= ys->size()) {
      m.bias = a.inputs[side];
      m.bias_node = static_cast<size_t>(add);
      m.result = a.outputs[0];
    }
  }
  if (feeds_elementwise(g, readers, m.result)) return std::nullopt;
  return m;
}

bool merge_siblings(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const Node& first = g.nodes()[i];
  if ((first.op != "MatMul" && first.op != "Gemm") || first.inputs.size() < 2) return false;
  const ValueId x = first.inputs[0];
  const DType dt = dtype_of_value(g, x);
  const auto& xs = g.value(x).type.shape;
  if (!is_floating(dt) || !xs || xs->size() < 2 || !xs->back().is_known()) return false;
  const int64_t k = xs->back().value;
  const bool two_d = xs->size() == 2;
  // The siblings, in graph order; node i must be the first of them, so that the merged product
  // can stand where it is (x is defined there, every result's readers come after).
  std::vector<Member> members;
  std::vector<int32_t> readers(rw.readers().readers(x).begin(), rw.readers().readers(x).end());
  readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
  for (int32_t r : readers) {
    const Node& n = g.nodes()[static_cast<size_t>(r)];
    if (n.op == "Gemm" && !two_d) continue;
    if (n.attrs.get_string("precision", "") != first.attrs.get_string("precision", "")) continue;
    if (auto m = member(rw, static_cast<size_t>(r), x, k)) members.push_back(std::move(*m));
  }
  if (members.size() < 2 || members[0].node != i) return false;

  int64_t total = 0;
  bool any_bias = false, all_trans_b = two_d;
  for (const Member& m : members) {
    total += m.n;
    any_bias = any_bias || m.bias != kNoValue;
    all_trans_b = all_trans_b && m.trans_b;
  }
  // concat(W_i), read only now that the merge happens: [sum N_i, K] (the rows one after another)
  // when every member is a Gemm with transB, else [K, sum N_i]; concat(b_i) likewise.
  std::vector<double> w(static_cast<size_t>(k * total)), b(static_cast<size_t>(total), 0.0);
  int64_t col = 0;
  for (const Member& m : members) {
    const std::vector<double> mw = to_doubles(*m.weight);
    if (all_trans_b) {
      std::copy(mw.begin(), mw.end(), w.begin() + col * k);
    } else {
      for (int64_t r = 0; r < k; ++r)
        for (int64_t c = 0; c < m.n; ++c)
          w[static_cast<size_t>(r * total + col + c)] =
              mw[static_cast<size_t>(m.trans_b ? c * k + r : r * m.n + c)];
    }
    if (m.bias != kNoValue) {
      const std::vector<double> mb = to_doubles(*constant(g, m.bias));
      std::copy(mb.begin(), mb.end(), b.begin() + col);
    }
    col += m.n;
  }
  auto wt = float_tensor(dt, all_trans_b ? Dims{total, k} : Dims{k, total}, w);
  auto bt = float_tensor(dt, {total}, b);
  if (!wt || !bt) return false;

  // A 2-D activation gets a Gemm (bias in C), as the exporters write a Linear layer; a batched
  // one MatMul and an Add, which the GEMM's epilogue fuses.
  const std::string name = first.name.empty() ? "merged" : first.name + "_merged";
  Attributes attrs = with_precision_of(first);
  const ValueId wid = g.add_constant(name + "_weight", std::move(*wt));
  const ValueId bid = any_bias ? g.add_constant(name + "_bias", std::move(*bt)) : kNoValue;
  size_t at = i;
  ValueId y = g.add_value(g.unique_name(name), TensorType{dt, std::nullopt});
  if (two_d) {
    if (all_trans_b) attrs.set("transB", int64_t{1});
    std::vector<ValueId> in = {x, wid};
    if (any_bias) in.push_back(bid);
    rw.insert(at++, "Gemm", std::move(in), {y}, std::move(attrs), name);
  } else {
    rw.insert(at++, "MatMul", {x, wid}, {y}, std::move(attrs), name);
    if (any_bias) {
      const ValueId biased =
          g.add_value(g.unique_name(name + "_biased"), TensorType{dt, std::nullopt});
      rw.insert(at++, "Add", {y, bid}, {biased}, {}, name + "_bias");
      y = biased;
    }
  }
  std::vector<int64_t> sizes;
  std::vector<ValueId> outs;
  for (const Member& m : members) {
    sizes.push_back(m.n);
    outs.push_back(g.add_value(g.unique_name(name + "_part"), TensorType{dt, std::nullopt}));
  }
  Tensor split_sizes = Tensor::empty(DType::kI64, {static_cast<int64_t>(sizes.size())});
  std::copy(sizes.begin(), sizes.end(), split_sizes.data<int64_t>());
  const ValueId sid = g.add_constant(name + "_split", std::move(split_sizes));
  Attributes split_attrs;
  split_attrs.set("axis", int64_t{-1});
  const size_t split = at;
  rw.insert(at++, "Split", {y, sid}, outs, std::move(split_attrs), name + "_split");
  const size_t shift = at - i;
  for (size_t s = 0; s < members.size(); ++s) {
    const Member& m = members[s];
    rw.remove(m.node + shift);
    if (m.bias_node != SIZE_MAX) rw.remove(m.bias_node + shift);
    rw.move_output(split, s, m.result);
  }
  ctx.note(cat("MergeSiblingMatMuls/", members.size(), "Products"));
  return true;
}

Graph merge_sibling_mat_muls(Graph g, const PassContext& ctx) {
  apply_rules(g, {{nullptr, merge_siblings}}, ctx);
  return g;
}

}  // namespace

void register_merge_sibling_mat_muls(PassRegistry& r) {
  r.add({"MergeSiblingMatMuls", merge_sibling_mat_muls,
         "merges matrix products of one activation by constant weights (attention's Q, K, V) "
         "into one product by the concatenated weights, split back into the results"});
}

}  // namespace pto::passes
