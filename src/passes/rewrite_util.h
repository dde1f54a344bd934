// What the local-rewrite passes share: a rule table applied until nothing changes, and small
// questions about the graph (which node produces a value, is it a constant, how many read it).
// A rule returns false ("no match") on anything it does not recognise; it never throws on a graph
// it cannot handle, and leaves such a graph as it was.
#pragma once

#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "passes/passes.h"
#include "pto/op_registry.h"
#include "pto/reader_index.h"

namespace pto::passes {

// The node that produces v, or nullptr for graph inputs, initializers and missing values.
const Node* producer(const Graph& g, ValueId v);

// The constant data of v: an initializer that is not also a graph input (an input's default can
// be overridden by the caller, so it is not a constant), or the `value` of a Constant node.
const Tensor* constant(const Graph& g, ValueId v);

// The one element of a constant with a single element (or a Constant node's value_float or
// value_int), as a double.
std::optional<double> scalar_constant(const Graph& g, ValueId v);

// A Relu's or Clip's constant bounds (Clip's attributes before opset 11, scalar inputs after; an
// absent bound is infinite); nullopt for other nodes and bounds that are not constants.
std::optional<std::pair<double, double>> clamp_bounds(const Graph& g, const Node& n);

// Every element of t, in row-major order, as doubles.
std::vector<double> to_doubles(const Tensor& t);

// A contiguous tensor of a floating dtype holding `v` (rounded to the dtype); nullopt when `dt`
// is not floating.
std::optional<Tensor> float_tensor(DType dt, const Dims& shape, const std::vector<double>& v);

// The dtype of v if known.
inline DType dtype_of_value(const Graph& g, ValueId v) {
  return v == kNoValue ? DType::kUndefined : g.value(v).type.dtype;
}

// Whether two dims are known to be equal: the same size, or the same symbol.
inline bool same_dim(const Dim& a, const Dim& b) {
  return a == b && (a.is_known() || a.is_symbolic());
}

// Whether a and b are known to have one shape (every dimension known or the same symbol). A
// rewrite that drops a broadcasting operand (x * 0.5 -> Gelu(x)) must check that it did not grow x.
bool same_shape(const Graph& g, ValueId a, ValueId b);

// Makes node `n` another op in place (op, inputs, attributes), keeping its name, outputs and
// position; `opset` 0 means "the latest".
void retarget(Node& n, const std::string& op, std::vector<ValueId> inputs, Attributes attrs = {},
              int opset = 0);

// An inference BatchNormalization per channel, y = scale * (x - mean) + shift, from its constant
// parameters (scale = gamma / sqrt(var + eps), in double); nullopt for a training-mode BN
// (batch statistics), spatial=0, or parameters that are not constant vectors of one length.
struct BnAffine {
  std::vector<double> scale, shift, mean;
};
std::optional<BnAffine> bn_affine(const Graph& g, const Node& bn);

// A copy of `a` without the attribute `name`.
Attributes without(const Attributes& a, const std::string& name);

// `attrs` with the `precision` of the matrix product `from` (AutoMixedPrecision, PromoteHalf):
// a rewrite that makes a new MatMul or Gemm out of one keeps what its products compute in.
inline Attributes with_precision_of(const Node& from, Attributes attrs = {}) {
  if (from.attrs.has("precision")) attrs.set("precision", from.attrs.get_string("precision"));
  return attrs;
}

// Whether AutoMixedPrecision and PromoteHalf give node `n` reduced products (precision="bf16" or
// "f16"):
// MatMul, Gemm and Conv, but not a depthwise Conv (one input channel per group: memory bound, its
// CPU kernel computes in fp32 at the speed of memory either way).
bool takes_reduced_products(const Graph& g, const Node& n);

// Whether this machine's bf16 products run on AMX tiles (AMX-BF16 on the avx512 kernels, neither
// it nor AVX512_BF16 turned off: pto/device_info.h).
bool machine_has_amx_bf16();
// Whether the machine runs bf16 products as VDPBF16PS pairs (AVX512_BF16, not turned off).
bool machine_has_avx512_bf16();

// What MatMulPrecision and ConvPrecision share: under `setting` "high" the float32 products that
// `takes` selects (both operands float32, no precision yet) get precision="bf16x3" where the
// machine has AMX-BF16 and `pays` accepts them, under "medium" "bf16" where it has AVX512_BF16;
// the rest stay float32. Notes "<pass>/<precision> <what>", "<pass>/float32: <few>" for those
// `pays` rejected and "<pass>/float32: no AMX-BF16" (AVX512_BF16) where the machine lacks it.
struct ProductMarking {
  const char* pass;
  const char* what;  // the ops, for the note: "MatMul/Gemm"
  bool (*takes)(const Graph&, const Node&);
  bool (*pays)(const Graph&, const Node&);  // under "high"
  const char* few;
};
void mark_float32_products(Graph& g, const PassContext& ctx, const std::string& setting,
                           const ProductMarking& m);

// One sweep's bookkeeping: nodes marked for removal go at the end of the sweep. Rules insert
// nodes through insert() so that the marks follow the nodes they were put on.
class Rewrite {
 public:
  explicit Rewrite(Graph& g) : g_(g), doomed_(g.nodes().size(), false) {}
  Graph& graph() { return g_; }
  // Graph::use_counts, kept from one rule firing to the next (rules read it before they change
  // the graph; apply_rules calls changed() after each firing). Nodes marked for removal still
  // count as readers until the sweep ends.
  const std::vector<int>& uses();
  // The readers of every value (pto/reader_index.h), kept like uses().
  const ReaderIndex& readers();
  void changed() {
    uses_valid_ = false;
    readers_.reset();
  }
  void remove(size_t node) { doomed_.at(node) = true; }
  bool removed(size_t node) const { return node < doomed_.size() && doomed_[node]; }
  // Graph::insert_node, keeping the marks in step; the new node gets `opset` (0: the latest).
  Node& insert(size_t pos, const std::string& op, std::vector<ValueId> inputs,
               std::vector<ValueId> outputs, Attributes attrs = {}, std::string name = "",
               int opset = 0);
  // Node `node` now produces `v` as its output `slot` (v's old producer must be marked for
  // removal); its old output is left with no producer and no reader.
  void move_output(size_t node, size_t slot, ValueId v);
  // Removes the marked nodes; returns how many.
  int finish();

 private:
  Graph& g_;
  std::vector<bool> doomed_;
  std::vector<int> uses_;
  bool uses_valid_ = false;
  std::optional<ReaderIndex> readers_;
};

struct Rule {
  const char* name;  // what note() records ("CanonicalizeOps/PowSquare"); nullptr: the rule notes
  bool (*apply)(Rewrite& rw, size_t node, const PassContext& ctx);
};

// Applies the rules to every node, in order, sweep after sweep until a sweep changes nothing (at
// most `max_sweeps`). A rule may insert nodes before `node` and must then leave the node it
// matched at its new position; it may mark nodes for removal.
void apply_rules(Graph& g, const std::vector<Rule>& rules, const PassContext& ctx,
                 int max_sweeps = 8);

// ---- Value queries of the level-1 clean-up passes (FoldConstants, EliminateNoOps, ...) ----

// The concrete shape of `v` when its type knows every dimension.
inline std::optional<Dims> static_dims(const Graph& g, ValueId v) {
  if (v == kNoValue) return std::nullopt;
  const TensorType& t = g.value(v).type;
  if (!t.shape || !is_static(*t.shape)) return std::nullopt;
  return to_dims(*t.shape);
}

inline bool is_graph_input(const Graph& g, ValueId v) {
  for (ValueId in : g.inputs())
    if (in == v) return true;
  return false;
}

// The data of `v` when it is a constant: an initializer that is not also a graph input (a graph
// input's initializer is only a default the caller may override).
inline const Tensor* constant_of(const Graph& g, ValueId v) {
  if (v == kNoValue) return nullptr;
  const Tensor* t = g.initializer(v);
  return t && !is_graph_input(g, v) ? t : nullptr;
}

// Input i of `n` as int64 values, when it is a constant of an integer type.
inline std::optional<std::vector<int64_t>> constant_ints(const Graph& g, const Node& n, size_t i) {
  if (i >= n.inputs.size()) return std::nullopt;
  const Tensor* t = constant_of(g, n.inputs[i]);
  if (!t || !is_integral(t->dtype())) return std::nullopt;
  std::vector<int64_t> out;
  Tensor c = t->contiguous();
  dispatch(c.dtype(), kIntTypes, "constant_ints", [&]<class T>() {
    for (int64_t k = 0; k < c.numel(); ++k) out.push_back(static_cast<int64_t>(c.data<T>()[k]));
  });
  return out;
}

// Removes the shape arithmetic nobody reads any more (Shape, and nodes whose one output is an
// integer vector of rank <= 1 with no reader and not a graph output), transitively; the count
// removed. A pass that made such a computation dead calls it so that the passes after it do not
// count the dead Shape(v) as a reader of v (single-reader checks), before EliminateDeadCode.
int remove_unread_shape_arithmetic(Graph& g);

// Whether every use of `from` may become a use of `to`. A graph output keeps the name callers
// see only when `to` is an intermediate value (replace_uses then renames it); a graph input, a
// constant or another output would show up under its own name, so such a rewrite is refused.
inline bool can_replace(const Graph& g, ValueId from, ValueId to) {
  if (!g.is_output(from)) return true;
  return to != kNoValue && g.value(to).producer >= 0 && !g.initializer(to) && !g.is_output(to);
}

}  // namespace pto::passes
