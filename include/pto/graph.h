// The Tensor Graph (level 1): SSA values, nodes in topological order, graph inputs, outputs and
// initializers. Values are referred to by index (ValueId); kNoValue marks a missing optional input.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "pto/shape.h"
#include "pto/tensor.h"

namespace pto {

struct OpDef;
class Graph;

using ValueId = int32_t;
inline constexpr ValueId kNoValue = -1;

// What a value is: its dtype and, when known, its (possibly symbolic) shape. A value may also be
// one of ONNX's other kinds, a sequence of tensors or an optional (of a tensor or a sequence):
// then dtype and shape describe the tensor (of the sequence's elements) inside. The flags are the
// whole difference, so the code that deals in tensors only (nearly all of it) reads dtype and
// shape as before, and the few places that must not see a non-tensor ask is_tensor().
struct TensorType {
  DType dtype = DType::kUndefined;
  std::optional<Shape> shape;  // nullopt: rank unknown
  bool sequence = false;       // seq(tensor): dtype and shape are the elements'
  bool optional = false;       // optional(tensor) or, with `sequence`, optional(seq(tensor))

  bool is_tensor() const { return !sequence && !optional; }
  // "f32[batch, 3, 224, 224]", "f32[*]"; "seq<f32[*]>", "opt<f32[2]>", "opt<seq<i64[*]>>".
  std::string str() const;
  // "a sequence", "an optional": for errors about a value that is not a tensor.
  const char* kind_name() const;
};

// The sizes a symbolic dimension may take, as its frontend declared them (inclusive).
struct DimRange {
  int64_t min = 0;
  int64_t max = INT64_MAX;
};

struct Value {
  std::string name;
  TensorType type;
  int32_t producer = -1;  // node index, -1 for graph inputs, initializers and constants
};

// A subgraph (the body of a control-flow node: If's branches, Loop's and Scan's body). Shared and
// immutable: a pass that changes one builds a new graph.
using GraphAttr = std::shared_ptr<const Graph>;

// The order of the alternatives is part of the saved-model format (src/runtime/serialize.cpp).
using Attribute = std::variant<int64_t, double, std::string, std::vector<int64_t>,
                               std::vector<double>, std::vector<std::string>, Tensor, GraphAttr>;

// Named node attributes with typed getters whose errors name the node and the attribute.
class Attributes {
 public:
  void set(const std::string& name, Attribute value) { map_[name] = std::move(value); }
  bool has(const std::string& name) const { return map_.count(name) != 0; }
  const std::map<std::string, Attribute>& all() const { return map_; }

  int64_t get_int(const std::string& name) const;
  int64_t get_int(const std::string& name, int64_t fallback) const;
  double get_float(const std::string& name) const;
  double get_float(const std::string& name, double fallback) const;
  std::string get_string(const std::string& name) const;
  std::string get_string(const std::string& name, const std::string& fallback) const;
  std::vector<int64_t> get_ints(const std::string& name) const;
  std::vector<int64_t> get_ints(const std::string& name, std::vector<int64_t> fallback) const;
  std::vector<double> get_floats(const std::string& name) const;
  std::vector<double> get_floats(const std::string& name, std::vector<double> fallback) const;
  std::vector<std::string> get_strings(const std::string& name) const;
  const Tensor& get_tensor(const std::string& name) const;
  const Graph& get_graph(const std::string& name) const;
  // A dtype attribute: an ONNX element-type code (Cast's `to`), or the type name Cast-1 used
  // ("FLOAT", "INT64", ...).
  DType get_dtype(const std::string& name) const;

  // Prefix for error messages, e.g. "[Conv] node 'conv1'"; set by the graph when a node is added.
  std::string where;

 private:
  const Attribute& get(const std::string& name, const char* kind) const;
  std::map<std::string, Attribute> map_;
};

struct Node {
  std::string name;
  std::string op;      // "Conv", "MatMul", ...
  std::string domain;  // "" for the ONNX default domain
  int opset = 0;       // the opset version of `domain` the node was written against
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  Attributes attrs;
  const OpDef* def = nullptr;  // set by Graph::add_node from the registry

  // "[Conv] node 'conv1'": how errors about this node start.
  std::string where() const;

  // The attribute `name`, or its default from the op's schema (OpDef::attrs): the one place a
  // default is written. Asking for an attribute the schema does not declare is an InternalError;
  // an absent attribute without a default (required, or optional with no constant default) is a
  // ValueError naming the node. A wrong kind is a ValueError, as Attributes' getters say.
  int64_t attr_int(const std::string& name) const;
  double attr_float(const std::string& name) const;
  std::string attr_string(const std::string& name) const;
  std::vector<int64_t> attr_ints(const std::string& name) const;
  std::vector<double> attr_floats(const std::string& name) const;

 private:
  // The attributes to read `name` from: attrs when it is there, else a one-entry copy of the
  // schema's default in `scratch`, else attrs (whose getter then reports it missing).
  const Attributes& attr_source(const std::string& name, Attributes& scratch) const;
};

class Graph {
 public:
  Graph() = default;

  ValueId add_value(std::string name, TensorType type = {});
  ValueId add_input(std::string name, TensorType type);
  void add_output(ValueId v);
  // Binds constant data to a value (an initializer); also sets the value's type from the tensor.
  void set_initializer(ValueId v, Tensor t);
  // Appends a node; looks the op up in the registry and throws UnsupportedError if it is absent.
  Node& add_node(std::string op, std::vector<ValueId> inputs, std::vector<ValueId> outputs,
                 Attributes attrs = {}, std::string name = "", int opset = 0);

  const std::vector<Value>& values() const { return values_; }
  Value& value(ValueId v);
  const Value& value(ValueId v) const;
  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& mutable_nodes() { return nodes_; }
  const std::vector<ValueId>& inputs() const { return inputs_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  const std::unordered_map<ValueId, Tensor>& initializers() const { return initializers_; }
  const Tensor* initializer(ValueId v) const;
  // Drops an initializer's data while the value stays defined, with its type: for a compiled
  // graph whose kernels keep their own copy of a weight (packed into GEMM panels), so that the
  // weight is not held twice. initializer(v) is then nullptr; the Executable gives it back.
  void release_initializer(ValueId v);
  bool is_released(ValueId v) const { return released_.count(v) != 0; }
  const std::unordered_set<ValueId>& released() const { return released_; }
  std::optional<ValueId> find_value(const std::string& name) const;
  bool is_output(ValueId v) const;

  // ---- Rewriting, for passes (src/passes). Nodes stay in topological order. ----
  // A value name not yet used, from `base` ("conv1_folded", "conv1_folded_1", ...).
  std::string unique_name(const std::string& base) const;
  // A new initializer holding `t`.
  ValueId add_constant(const std::string& base_name, Tensor t);
  void remove_initializer(ValueId v);
  // Every use of `from` (node inputs, graph outputs) becomes `to`. When `from` is a graph output
  // and `to` is an intermediate, `to` takes over `from`'s name, so outputs keep the names users
  // see.
  void replace_uses(ValueId from, ValueId to);
  // Inserts a node before position `pos` (its inputs must be defined before `pos`).
  Node& insert_node(size_t pos, std::string op, std::vector<ValueId> inputs,
                    std::vector<ValueId> outputs, Attributes attrs = {}, std::string name = "");
  // Removes the nodes whose flag is set; their outputs are left without a producer.
  void remove_nodes(const std::vector<bool>& remove);
  // How many node inputs and graph outputs read each value.
  std::vector<int> use_counts() const;

  std::string name;
  int opset = 0;  // default-domain opset the graph was imported with (0: not from ONNX)
  // The model file it was imported from ("<bytes>" for a model given as bytes), or empty: errors
  // compiling or running it start with it, as its import errors do ("model.onnx: [Conv] ...").
  std::string source;
  // For a subgraph (a control-flow node's attribute): how many of its inputs, the last ones, are
  // captures: values of the enclosing graph the subgraph reads. The node lists the same values as
  // its last inputs, in the same order, so that liveness, use counts and rewrites see those
  // reads like any other (docs/architecture.md, "Control flow").
  int num_captures = 0;
  // Declared ranges of symbolic dimensions ("batch" -> [1, 64]); a symbol absent here is >= 0.
  std::map<std::string, DimRange> symbol_ranges;

 private:
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<ValueId> inputs_;
  std::vector<ValueId> outputs_;
  std::unordered_map<ValueId, Tensor> initializers_;
  std::unordered_set<ValueId> released_;  // initializers whose data a compiled kernel holds
  std::unordered_map<std::string, ValueId> by_name_;
};

// Copies the nodes of subgraph `sub` into `g` before node position `pos` (g.nodes().size():
// at the end), its inputs bound to `inputs` (one per input of `sub`, its captures included), its
// initializers made constants; new nodes and values are named `prefix`/their name in `sub`.
// Returns the values of sub's outputs. For a control-flow branch taken at compile time and a
// modifier subgraph the importer splices in.
std::vector<ValueId> inline_subgraph(Graph& g, size_t pos, const Graph& sub,
                                     const std::vector<ValueId>& inputs, const std::string& prefix);

// Checks structure: every op is registered, arities are within the OpDef's range, every value is
// defined once and before it is used, outputs exist. Throws ValueError naming the node.
void verify(const Graph& g);

// Runs each node's shape and dtype inference in order and stores the results in the values.
// Where an op cannot infer (data-dependent shapes), the result is left with an unknown shape.
void infer_types(Graph& g);

// Evaluates a node for infer_types' folding, given its input types, the data of those inputs
// known before running (nullptr elsewhere) and its inferred output types. Returns the outputs'
// data, or nullopt to leave them unknown.
using NodeFolder = std::function<std::optional<std::vector<Tensor>>(
    const Node& n, const std::vector<TensorType>& input_types,
    const std::vector<const Tensor*>& constants, const std::vector<TensorType>& output_types)>;

// infer_types that also asks `fold` for the data of each node, in the same sweep: a value it
// returns counts as known for the nodes after it (their types and shapes), as constant folding
// would make it, but the graph's nodes and initializers stay as they are. One sweep where
// folding and inferring in turn would take several (the runtime's per-shape memory plan).
void infer_types(Graph& g, const NodeFolder& fold);

// A stable, readable text form, one node a line:
//   %3: f32[1, 64, 112, 112] = Conv(%x, %w, %b) {kernel_shape=[7, 7], strides=[2, 2]}
// Names that are not plain ([A-Za-z0-9_.:/@+%-]) print quoted (%"a b"); a float attribute prints
// the shortest decimal of its float when a float holds it exactly ("1e-05", "1.0"; ONNX attributes
// are single precision), else its shortest exact double with a "d" suffix ("0.1d"); a node of
// another domain prints as "domain.Op"; constants and tensor attributes of at most 16 elements
// print their data:
//   const  %w: f32[2] = [1, 2.5]          {value=tensor<i64[1] = [3]>}
std::string print(const Graph& g);

// Reads the text `print` writes back into a graph, so that print(parse_graph(t)) == t. Also
// accepted, for hand-written graphs: blank lines and lines starting with "//"; a node output
// without a type (then types are inferred for the whole graph, as infer_types does); a node line
// without "# name" (named like add_node). A constant printed without its data (more than 16
// elements) reads back as zeros: its structure round-trips, its data does not. Node opsets are
// not printed; parsed nodes take the graph's opset. Throws ValueError "parse_graph: line N: ...".
Graph parse_graph(const std::string& text);
// One type as TensorType::str writes it ("f32[2, ?]", "opt<seq<i64[*]>>"); ValueError otherwise.
TensorType parse_type(const std::string& text);

// Whether `a` and `b` compute the same thing the same way: the same ops (and domains) with equal
// attributes (tensor attributes by dtype, shape and bytes), wired the same way, with the same
// input types, the same constant data (by dtype, shape and bytes) and the same outputs in order,
// and the same node output types. Value and node names, node order and node opsets do not count:
// nodes are matched by walking back from the outputs (then unreached nodes pairwise in order).
// On a difference returns false and, when `why` is given, says where the graphs first differ.
bool structurally_equal(const Graph& a, const Graph& b, std::string* why = nullptr);

// Deep equality of attributes, as structurally_equal compares them: tensor attributes by dtype,
// shape and bytes, floats by bits (any NaN equals any NaN), empty lists of any element type equal.
bool same_attribute(const Attribute& a, const Attribute& b);
// One attribute value as print() writes it: -1, 1e-05, "none", [0, 2, 3].
std::string attribute_str(const Attribute& a);
bool same_attributes(const Attributes& a, const Attributes& b);

}  // namespace pto
