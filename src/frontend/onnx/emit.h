// The builder the importer's expansions share (contrib_ops.cpp, preview_ops.cpp): new standard
// nodes and values named after the node they stand for.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pto/error.h"
#include "pto/graph.h"
#include "pto/shape.h"

namespace pto::onnx {

// Builds the standard nodes of one op the importer expands. New nodes say opset 0, "the latest" (as
// the passes' nodes do): their semantics do not depend on the opset the model was exported at.
class Emit {
 public:
  Emit(Graph& g, std::string name, std::string where)
      : g_(g), name_(std::move(name)), where_(std::move(where)) {}

  Graph& graph() { return g_; }
  const std::string& where() const { return where_; }
  const std::string& name() const { return name_; }

  // A new value, named after the node and `what`.
  ValueId fresh(const std::string& what) {
    return g_.add_value(g_.unique_name(cat(name_, "/", what)));
  }
  // op(in) into `out` (a new value when kNoValue); returns the output.
  ValueId op(const std::string& op, std::vector<ValueId> in, Attributes a = {},
             ValueId out = kNoValue) {
    if (out == kNoValue) out = fresh(op);
    node(op, std::move(in), {out}, std::move(a));
    return out;
  }
  void node(const std::string& op, std::vector<ValueId> in, std::vector<ValueId> out,
            Attributes a = {}) {
    Node& n = g_.add_node(op, std::move(in), std::move(out), std::move(a),
                          cat(name_, "/", op, "_", count_++));
    n.opset = 0;
  }

  ValueId ints(const std::vector<int64_t>& v) {
    return g_.add_constant(name_ + "/ints",
                           Tensor::from_vector(v, {static_cast<int64_t>(v.size())}));
  }
  ValueId int_scalar(int64_t v) { return g_.add_constant(name_ + "/int", Tensor::scalar(v)); }
  ValueId float_scalar(float v) { return g_.add_constant(name_ + "/float", Tensor::scalar(v)); }
  ValueId weight(Tensor t) { return g_.add_constant(name_ + "/weight", std::move(t)); }

  // Dimension `axis` of v as an int64 scalar.
  ValueId dim(ValueId v, int64_t axis) {
    Attributes a;
    a.set("start", axis);
    a.set("end", axis + 1);
    return op("Squeeze", {op("Shape", {v}, a), ints({0})});
  }

  // The shape of v as far as it is known, inferring the types of the nodes so far when v is the
  // output of one (the importer infers the whole graph only at the end).
  const std::optional<Shape>& shape(ValueId v) {
    if (!g_.value(v).type.shape) infer_types(g_);
    return g_.value(v).type.shape;
  }
  int64_t rank(ValueId v, const std::string& what) {
    const auto& s = shape(v);
    if (!s)
      throw UnsupportedError(cat(where_, ": the rank of ", what, " is unknown; PyPTO needs it"));
    return static_cast<int64_t>(s->size());
  }
  // The constant data of v (an initializer), or nullptr.
  const Tensor* constant(ValueId v) const { return g_.initializer(v); }

  [[noreturn]] void unsupported(const std::string& what) const {
    throw UnsupportedError(cat(where_, ": ", what, " is not supported"));
  }

 private:
  Graph& g_;
  std::string name_, where_;
  int count_ = 0;
};

// Input i of an expanded node, or kNoValue when it is absent.
inline ValueId in(const std::vector<ValueId>& v, size_t i) {
  return i < v.size() ? v[i] : kNoValue;
}

}  // namespace pto::onnx
