// LowerEinsum: an Einsum of one or two floating operands as ReduceSum, Transpose, Reshape and
// MatMul, so that contractions run on the GEMM kernels instead of the reference interpreter's
// loops, and attention written as einsum ("bhqd,bhkd->bhqk", then "bhqk,bhkd->bhqd"), as
// exporters keep torch.einsum and Keras' EinsumDense, reaches RecognizeAttention as MatMuls.
//
// For A (labels a) and B (labels b) and the output's labels o, each label is one of:
//   batch  in a, b and o: leading axes of the product, broadcast as MatMul broadcasts them
//   M      in a and o only, N in b and o only: the product's rows and columns
//   K      in a and b, not o: the contraction
//   summed in one operand only, not o: summed out of that operand first (ReduceSum)
// A is transposed to [batch, M, K] and B to [batch, K, N] (o's order for batch, M and N; a's for
// K), several M, K or N labels are reshaped into one axis (batch axes copied with Reshape's 0),
// and the product [batch, M, N] is reshaped and transposed to o. One operand: ReduceSum and
// Transpose. Level 2: the GEMM sums in another order than the reference's loops.
//
// An operand that repeats a label (a diagonal: "ii->i", "ii->" (a trace), "bii->bi") first takes
// the diagonal of each repeated pair: a Transpose moving the pair last, a Reshape merging it into
// one axis of n * n and a Slice with step n + 1 (every (j, j) element), so it reaches the rest
// with distinct labels. The repeated axes' size must be known.
//
// Taken when the equation parses for the operands' ranks, the output repeats no label, repeated
// operand labels have one known size, K labels have one size in both operands, and at most one of
// the sizes a Reshape needs is unknown; other Einsums stay as they are.
#include <algorithm>

#include "ir/ops/einsum_equation.h"
#include "passes/passes.h"
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

bool has_repeats(const std::vector<int>& labels) {
  std::vector<int> s = labels;
  std::sort(s.begin(), s.end());
  return std::adjacent_find(s.begin(), s.end()) != s.end();
}

bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

int64_t position(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) - v.begin();
}

// The product of `dims` (1 when empty); unknown if any is.
Dim product(const Shape& dims) {
  int64_t p = 1;
  for (const Dim& d : dims) {
    if (!d.is_known()) return Dim::unknown();
    p *= d.value;
  }
  return p;
}

// Reshape targets for [batch..., groups...]: 0 for each batch axis, a known size or -1 (at most
// one) for each group; nullopt when two groups are unknown.
std::optional<std::vector<int64_t>> reshape_target(size_t batch, const std::vector<Dim>& groups) {
  std::vector<int64_t> t(batch, 0);
  bool unknown = false;
  for (const Dim& d : groups) {
    if (d.is_known()) {
      t.push_back(d.value);
    } else if (!unknown) {
      unknown = true;
      t.push_back(-1);
    } else {
      return std::nullopt;
    }
  }
  return t;
}

// The first label of `labels` that appears twice: its two positions, or nullopt.
std::optional<std::pair<size_t, size_t>> first_repeat(const std::vector<int>& labels) {
  for (size_t p = 0; p < labels.size(); ++p)
    for (size_t q = p + 1; q < labels.size(); ++q)
      if (labels[p] == labels[q]) return std::pair{p, q};
  return std::nullopt;
}

// One diagonal step on (labels, shape): the pair (p, q) replaced by one axis at the end. False
// when the pair's size is unknown or differs.
bool take_diagonal(std::vector<int>& labels, Shape& shape, size_t p, size_t q) {
  if (!shape[p].is_known() || !same_dim(shape[p], shape[q])) return false;
  std::vector<int> l;
  Shape s;
  for (size_t i = 0; i < labels.size(); ++i)
    if (i != p && i != q) {
      l.push_back(labels[i]);
      s.push_back(shape[i]);
    }
  l.push_back(labels[p]);
  s.push_back(shape[p]);
  labels = l;
  shape = s;
  return true;
}

class Lowering {
 public:
  Lowering(Graph& g, size_t at, const Node& n) : g_(g), at_(at) {
    base_ = n.name.empty() ? g.value(n.outputs[0]).name : n.name;
    dtype_ = g.value(n.outputs[0]).type.dtype;
  }

  ValueId value(const Shape& shape) {
    return g_.add_value(g_.unique_name(base_ + "_lowered"), TensorType{dtype_, shape});
  }
  ValueId ints(const std::vector<int64_t>& v) {
    return g_.add_constant(base_ + "_ints",
                           Tensor::from_vector<int64_t>(v, {static_cast<int64_t>(v.size())}));
  }
  ValueId add(const std::string& op, std::vector<ValueId> in, const Shape& shape,
              Attributes a = {}) {
    const ValueId out = value(shape);
    g_.insert_node(at_++, op, std::move(in), {out}, std::move(a), base_ + "_" + op);
    return out;
  }

  // The Einsum's readers read `result` (typed as the Einsum's output was), and the Einsum goes.
  void finish(ValueId result, ValueId einsum_output, const PassContext& ctx, const char* note) {
    g_.value(result).type = g_.value(einsum_output).type;
    g_.replace_uses(einsum_output, result);
    std::vector<bool> gone(g_.nodes().size(), false);
    gone[at_] = true;
    g_.remove_nodes(gone);
    ctx.note(note);
  }

  // x (labels, shape) with the labels not in `keep` summed out.
  ValueId sum_out(ValueId x, std::vector<int>& labels, Shape& shape, const std::vector<int>& keep) {
    std::vector<int64_t> axes;
    std::vector<int> kept_labels;
    Shape kept_shape;
    for (size_t i = 0; i < labels.size(); ++i) {
      if (contains(keep, labels[i])) {
        kept_labels.push_back(labels[i]);
        kept_shape.push_back(shape[i]);
      } else {
        axes.push_back(static_cast<int64_t>(i));
      }
    }
    if (axes.empty()) return x;
    Attributes a;
    a.set("keepdims", int64_t{0});
    labels = kept_labels;
    shape = kept_shape;
    return add("ReduceSum", {x, ints(axes)}, shape, a);
  }

  // x (labels, shape) with each repeated label's diagonal taken (take_diagonal, already checked
  // to apply): Transpose, Reshape and a Slice with step n + 1 per repeated pair.
  ValueId diagonals(ValueId x, std::vector<int>& labels, Shape& shape) {
    while (auto pq = first_repeat(labels)) {
      const auto [p, q] = *pq;
      const int64_t n = shape[p].value, rank = static_cast<int64_t>(labels.size());
      std::vector<int64_t> perm;
      for (int64_t i = 0; i < rank; ++i)
        if (i != int64_t(p) && i != int64_t(q)) perm.push_back(i);
      perm.push_back(static_cast<int64_t>(p));
      perm.push_back(static_cast<int64_t>(q));
      Shape moved;
      for (int64_t i : perm) moved.push_back(shape[i]);
      take_diagonal(labels, shape, p, q);
      bool identity = true;
      for (int64_t i = 0; i < rank; ++i) identity = identity && perm[i] == i;
      if (!identity) {
        Attributes a;
        a.set("perm", perm);
        x = add("Transpose", {x}, moved, a);
      }
      std::vector<int64_t> target(static_cast<size_t>(rank - 2), 0);
      target.push_back(n * n);
      Shape flat(moved.begin(), moved.end() - 2);
      flat.push_back(Dim(n * n));
      x = add("Reshape", {x, ints(target)}, flat);
      x = add("Slice", {x, ints({0}), ints({n * n}), ints({rank - 2}), ints({n + 1})}, shape);
    }
    return x;
  }

  // x (labels, shape) with its axes in the order of `order` (every label of x).
  ValueId transpose(ValueId x, std::vector<int>& labels, Shape& shape,
                    const std::vector<int>& order) {
    std::vector<int64_t> perm;
    Shape out;
    for (int l : order) {
      perm.push_back(position(labels, l));
      out.push_back(shape[perm.back()]);
    }
    labels = order;
    bool identity = true;
    for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == int64_t(i);
    if (identity) return x;
    shape = out;
    Attributes a;
    a.set("perm", perm);
    return add("Transpose", {x}, shape, a);
  }

 private:
  Graph& g_;
  size_t at_;
  std::string base_;
  DType dtype_;
};

// The dims of `labels` in an operand with labels `of` and shape `shape`.
Shape dims_of(const std::vector<int>& labels, const std::vector<int>& of, const Shape& shape) {
  Shape s;
  for (int l : labels) s.push_back(shape[position(of, l)]);
  return s;
}

// Lowers node i; false (and the graph unchanged) when it does not apply.
bool lower(Graph& g, size_t i, const PassContext& ctx) {
  const Node n = g.nodes()[i];  // a copy: inserting nodes moves the vector
  if (n.op != "Einsum" || n.outputs.size() != 1 || n.inputs.empty() || n.inputs.size() > 2)
    return false;
  if (!is_floating(g.value(n.outputs[0]).type.dtype)) return false;
  std::vector<Shape> shapes;
  std::vector<int64_t> ranks;
  for (ValueId v : n.inputs) {
    const TensorType& t = g.value(v).type;
    if (v == kNoValue || !t.shape || !is_floating(t.dtype)) return false;
    shapes.push_back(*t.shape);
    ranks.push_back(static_cast<int64_t>(t.shape->size()));
  }
  const TensorType yt = g.value(n.outputs[0]).type;  // a copy: add_value moves the values
  if (!yt.shape) return false;
  einsum::Equation e;
  try {
    e = einsum::parse(n.attrs.get_string("equation"), ranks, n.where());
  } catch (const Error&) {
    return false;  // the reference reports it
  }
  if (has_repeats(e.output)) return false;
  if (yt.shape->size() != e.output.size()) return false;
  // Each operand's labels and shape once its diagonals are taken, checked before anything is
  // inserted (the insertions follow the same steps).
  const std::vector<std::vector<int>> written = e.inputs;
  const std::vector<Shape> written_shapes = shapes;
  bool diagonal = false;
  for (size_t j = 0; j < e.inputs.size(); ++j)
    while (auto pq = first_repeat(e.inputs[j])) {
      diagonal = true;
      if (!take_diagonal(e.inputs[j], shapes[j], pq->first, pq->second)) return false;
    }

  Lowering low(g, i, n);
  // The operands as the rest reads them: their diagonals inserted once every check has passed.
  std::vector<ValueId> operands = n.inputs;
  auto undiagonal = [&] {
    for (size_t j = 0; j < operands.size(); ++j) {
      std::vector<int> l = written[j];
      Shape s = written_shapes[j];
      operands[j] = low.diagonals(operands[j], l, s);
    }
  };
  std::vector<int> la = e.inputs[0];
  Shape sa = shapes[0];
  if (n.inputs.size() == 1) {
    undiagonal();
    ValueId x = low.sum_out(operands[0], la, sa, e.output);
    x = low.transpose(x, la, sa, e.output);
    if (x == n.inputs[0]) x = low.add("Identity", {x}, sa);
    low.finish(x, n.outputs[0], ctx, diagonal ? "LowerEinsum/Diagonal" : "LowerEinsum/Reduce");
    return true;
  }
  std::vector<int> lb = e.inputs[1];
  Shape sb = shapes[1];
  const std::vector<int>& lo = e.output;
  std::vector<int> batch, m, nn, k;
  for (int l : lo) {
    const bool in_a = contains(la, l), in_b = contains(lb, l);
    (in_a && in_b ? batch : in_a ? m : nn).push_back(l);
  }
  for (int l : la)
    if (contains(lb, l) && !contains(lo, l)) k.push_back(l);
  // K labels must have one size in both operands (a broadcast contraction is left alone).
  for (int l : k)
    if (!same_dim(sa[position(la, l)], sb[position(lb, l)])) return false;
  for (int l : batch) {
    const Dim &da = sa[position(la, l)], &db = sb[position(lb, l)];
    if (!same_dim(da, db) && !(da.is_known() && da.value == 1) && !(db.is_known() && db.value == 1))
      return false;
  }
  // What the reshapes need, checked before anything is inserted.
  const Dim mg = product(dims_of(m, la, sa)), kg = product(dims_of(k, la, sa)),
            ng = product(dims_of(nn, lb, sb));
  const bool group_a = m.size() != 1 || k.size() != 1, group_b = k.size() != 1 || nn.size() != 1,
             group_y = m.size() != 1 || nn.size() != 1;
  if (group_a && !reshape_target(batch.size(), {mg, kg})) return false;
  if (group_b && !reshape_target(batch.size(), {kg, ng})) return false;
  std::vector<Dim> ygroups;
  for (int l : m) ygroups.push_back(sa[position(la, l)]);
  for (int l : nn) ygroups.push_back(sb[position(lb, l)]);
  if (group_y && !reshape_target(batch.size(), ygroups)) return false;

  std::vector<int> keep_a = lo, keep_b = lo;
  keep_a.insert(keep_a.end(), lb.begin(), lb.end());
  keep_b.insert(keep_b.end(), la.begin(), la.end());
  undiagonal();
  ValueId a = low.sum_out(operands[0], la, sa, keep_a);
  ValueId b = low.sum_out(operands[1], lb, sb, keep_b);
  std::vector<int> order_a = batch, order_b = batch;
  order_a.insert(order_a.end(), m.begin(), m.end());
  order_a.insert(order_a.end(), k.begin(), k.end());
  order_b.insert(order_b.end(), k.begin(), k.end());
  order_b.insert(order_b.end(), nn.begin(), nn.end());
  a = low.transpose(a, la, sa, order_a);
  b = low.transpose(b, lb, sb, order_b);
  Shape batch_a(sa.begin(), sa.begin() + batch.size()),
      batch_b(sb.begin(), sb.begin() + batch.size()), batch_y;
  for (size_t j = 0; j < batch.size(); ++j)
    batch_y.push_back(batch_a[j].is_known() && batch_a[j].value == 1 ? batch_b[j] : batch_a[j]);
  auto with = [](Shape s, std::initializer_list<Dim> more) {
    s.insert(s.end(), more);
    return s;
  };
  if (group_a)
    a = low.add("Reshape", {a, low.ints(*reshape_target(batch.size(), {mg, kg}))},
                with(batch_a, {mg, kg}));
  if (group_b)
    b = low.add("Reshape", {b, low.ints(*reshape_target(batch.size(), {kg, ng}))},
                with(batch_b, {kg, ng}));
  ValueId y = low.add("MatMul", {a, b}, with(batch_y, {mg, ng}));
  std::vector<int> ly = batch;
  ly.insert(ly.end(), m.begin(), m.end());
  ly.insert(ly.end(), nn.begin(), nn.end());
  Shape sy = batch_y;
  sy.insert(sy.end(), ygroups.begin(), ygroups.end());
  if (group_y) y = low.add("Reshape", {y, low.ints(*reshape_target(batch.size(), ygroups))}, sy);
  low.finish(low.transpose(y, ly, sy, lo), n.outputs[0], ctx, "LowerEinsum/MatMul");
  return true;
}

Graph lower_einsum(Graph g, const PassContext& ctx) {
  for (size_t i = 0; i < g.nodes().size(); ++i) lower(g, i, ctx);
  return g;
}

}  // namespace

void register_lower_einsum(PassRegistry& r) {
  r.add({"LowerEinsum", lower_einsum,
         "an Einsum of one or two float operands as ReduceSum, Transpose, Reshape and MatMul (the "
         "GEMM kernels)"});
}

}  // namespace pto::passes
