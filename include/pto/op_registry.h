// The OpDef registry: every op is defined once, with its arity, properties that passes query, and
// shape/dtype inference. Passes ask the registry (def.is_elementwise()), never keep op-name lists.
#pragma once

#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "pto/graph.h"
#include "pto/registry.h"

namespace pto {

struct ShapeValue;

enum OpProperty : uint32_t {
  kElementwise = 1u << 0,  // output[i] depends on input[i] only (after broadcasting)
  kBroadcast = 1u << 1,    // inputs broadcast numpy-style
  kReduction = 1u << 2,    // reduces one or more axes
  kInjective = 1u << 3,    // each output element reads at most one element per input (reshape,
                           // transpose, slice, gather, concat, ...)
  kCommutative = 1u << 4,  // two inputs that may be swapped
  kInPlace = 1u << 5,      // output may reuse the first input's buffer
  kShapeOnly = 1u << 6,    // the output depends on input shapes only, never data (Shape, Size)
  kOpaque = 1u << 7,       // none of the above: heavy or irregular (Conv, MatMul, TopK)
  kView = 1u << 8,         // an output may share input 0's storage (Reshape, Transpose, Slice):
                           // the memory planner keeps input 0's buffer alive as long as it
  // Draws random numbers (RandomNormal, Bernoulli, ...): two nodes alike are two different
  // values, and constant folding must not evaluate it.
  kNondeterministic = 1u << 9,
  // Reads or writes ONNX's other values, sequences and optionals (TensorType::is_tensor, and
  // Tensor's containers): the sequence ops, Identity and control flow. Only these may see one;
  // every other op is declared to take and make tensors alone.
  kNonTensorValues = 1u << 10,
};

// What an inference function sees: the node, its inputs' types, constant input data where the
// value is an initializer (nullptr elsewhere), and the outputs to fill in.
struct InferContext {
  const Node& node;
  std::vector<TensorType> inputs;        // DType::kUndefined for a missing optional input
  std::vector<const Tensor*> constants;  // same length as inputs
  std::vector<TensorType> outputs;       // pre-sized to the node's output count
  // The symbolic contents of small integer inputs (shape arithmetic; pto/shape_value.h), nullptr
  // where not known; empty when the caller does not propagate them.
  std::vector<const ShapeValue*> values;
  // Subgraph attributes (control flow) the inference re-typed from the node's input types, by
  // attribute name: infer_types stores them back in the node.
  std::map<std::string, GraphAttr> subgraphs;

  size_t num_inputs() const { return inputs.size(); }
  bool has_input(size_t i) const {
    return i < inputs.size() && inputs[i].dtype != DType::kUndefined;
  }
  const TensorType& input(size_t i) const;  // throws ValueError when the input is missing
  const Attributes& attrs() const { return node.attrs; }
  std::string where() const { return node.where(); }
};

using InferFn = std::function<void(InferContext&)>;

// The kind of value an attribute holds: one per Attribute alternative, plus kDType, an ONNX element
// type given as its code (Cast's `to`) or, as Cast-1 wrote it, its name ("FLOAT"), and kType, a
// value type (Optional's `type`) as a string the parser reads ("seq<f32[5]>", parse_type), and
// kBool, an int of 0 or 1.
enum class AttrKind : uint8_t {
  kInt,
  kFloat,
  kString,
  kInts,
  kFloats,
  kStrings,
  kTensor,
  kGraph,
  kDType,
  kType,  // a value type (ONNX TypeProto), held as the string TensorType::str writes
  kBool,  // an int that must be 0 or 1 (ONNX's boolean attributes: keepdims, ceil_mode, transA)
};
const char* attr_kind_name(AttrKind k);  // "int", "float", "ints", "dtype", ...

// Whether a node must give an attribute, and what an absent one means.
enum class AttrUse : uint8_t {
  kRequired,  // absent: the verifier rejects the node
  kDefault,   // absent: AttrDef::default_value (what Node::attr_int and friends return)
  kOptional,  // absent means something no constant says (derived from the inputs, the opset, ...)
};

// One attribute an op accepts (ONNX's schema, across the opsets the importer reads).
struct AttrDef {
  std::string name;
  AttrKind kind = AttrKind::kInt;
  AttrUse use = AttrUse::kOptional;
  Attribute default_value;  // meaningful when use == kDefault
  std::string doc;          // one line, may be empty

  // Optional with a default; the kind is the default's ({"axis", int64_t{1}}, {"mode", "nearest"}).
  AttrDef(std::string name, Attribute default_value, std::string doc = {});
  AttrDef(std::string name, AttrKind kind, AttrUse use, std::string doc = {});
};

inline AttrDef required_attr(std::string name, AttrKind kind, std::string doc = {}) {
  return AttrDef(std::move(name), kind, AttrUse::kRequired, std::move(doc));
}
inline AttrDef optional_attr(std::string name, AttrKind kind, std::string doc = {}) {
  return AttrDef(std::move(name), kind, AttrUse::kOptional, std::move(doc));
}
// A boolean attribute: an int the verifier accepts only as 0 or 1, as ONNX defines them
// (onnxruntime reads keepdims=2 as false, transA=2 as true and refuses CumSum's exclusive=2).
inline AttrDef bool_attr(std::string name, bool default_value, std::string doc = {}) {
  AttrDef d(std::move(name), int64_t{default_value}, std::move(doc));
  d.kind = AttrKind::kBool;
  return d;
}

// The attributes an op accepts. An op registered without one (a user's op of its own domain) is
// not checked; every built-in op declares one, possibly empty (AttrSchema::none()).
class AttrSchema {
 public:
  AttrSchema() = default;  // not declared: the verifier does not check the op's attributes
  AttrSchema(std::initializer_list<AttrDef> defs) : declared_(true), defs_(defs) {}
  AttrSchema(std::vector<AttrDef> defs) : declared_(true), defs_(std::move(defs)) {}
  static AttrSchema none() { return AttrSchema(std::vector<AttrDef>{}); }  // declared, empty

  bool declared() const { return declared_; }
  const std::vector<AttrDef>& defs() const { return defs_; }
  const AttrDef* find(std::string_view name) const;
  // The schema plus `more` (families that share attributes: Conv's for QLinearConv).
  AttrSchema with(std::initializer_list<AttrDef> more) const;

 private:
  bool declared_ = false;
  std::vector<AttrDef> defs_;
};

// "axis=-1, epsilon=1e-05, to (required), kernel_shape (optional)": a schema in one line, in
// declaration order ("-" when empty, "?" when not declared).
std::string attr_schema_str(const AttrSchema& s);

// Checks a node's attributes against its op's schema: an attribute the op does not have, one of the
// wrong kind and a required one that is missing are ValueErrors naming the node, the op and the
// attribute (an unknown one also lists the accepted ones). A node of an op without a declared
// schema passes. Called by verify() for every node.
void check_attributes(const Node& n);

struct OpDef {
  std::string name;
  // Dense, 0 to OpRegistry::size() - 1 in registration order, set by OpRegistry::add: tables
  // indexed by op can be vectors, and hot paths compare ids instead of names (node.def->id).
  int32_t id = -1;
  int min_inputs = 0;
  int max_inputs = 0;  // -1: variadic
  int min_outputs = 1;
  int max_outputs = 1;
  uint32_t properties = 0;
  AttrSchema attrs;  // the attributes nodes of this op may carry, with their defaults
  InferFn infer;     // may leave output shapes unknown, never throws on unknown input shapes
  std::string doc;
  // A pass that rewrites nodes of the op into other ops, which run on their own kernels, and
  // when ("LowerQLinearOps at level >= 2, per-tensor scales"): for the coverage table.
  std::string lowered_by;

  bool has(OpProperty p) const { return (properties & p) != 0; }
  bool is_elementwise() const { return has(kElementwise); }
  bool is_broadcast() const { return has(kBroadcast); }
  bool is_reduction() const { return has(kReduction); }
  bool is_injective() const { return has(kInjective); }
  bool is_commutative() const { return has(kCommutative); }
  bool is_view() const { return has(kView); }
};

// Checks that a node of an op without kNonTensorValues neither reads nor makes a value typed as a
// sequence or an optional: UnsupportedError naming the node and the value. Called by verify().
void check_tensor_values(const Graph& g, const Node& n);

class OpRegistry {
 public:
  static OpRegistry& global();  // filled with every built-in op on first use

  void add(OpDef def);  // a second definition of the same name is an InternalError
  const OpDef* find(std::string_view name) const { return defs_.find(name); }
  std::vector<std::string> names() const { return defs_.names(); }  // sorted
  size_t size() const { return defs_.size(); }
  const OpDef& by_id(int32_t id) const;  // 0 <= id < size()

 private:
  Registry<OpDef> defs_{"op"};  // an OpDef never moves; its id is its registration index
};

// Each op family registers itself here (src/ir/ops/*.cpp). Explicit calls rather than static
// initializers, so that linking a static library can never drop a family.
void register_elementwise_ops(OpRegistry& r);
void register_nn_ops(OpRegistry& r);
void register_tensor_ops(OpRegistry& r);
void register_reduction_ops(OpRegistry& r);
void register_indexing_ops(OpRegistry& r);
void register_attention_ops(OpRegistry& r);
void register_quantization_ops(OpRegistry& r);
void register_loss_ops(OpRegistry& r);
void register_image_ops(OpRegistry& r);
void register_signal_ops(OpRegistry& r);
void register_recurrent_ops(OpRegistry& r);
void register_control_flow_ops(OpRegistry& r);
void register_sequence_ops(OpRegistry& r);
void register_ml_ops(OpRegistry& r);  // ai.onnx.ml: tree ensembles, linear models, ...

}  // namespace pto
