#include "pto/graph.h"

#include <algorithm>

#include "pto/op_registry.h"

namespace pto {

std::string TensorType::str() const {
  std::string s = std::string(dtype_name(dtype)) + (shape ? shape_str(*shape) : "[*]");
  if (sequence) s = "seq<" + s + ">";
  return optional ? "opt<" + s + ">" : s;
}

const char* TensorType::kind_name() const {
  return optional ? "an optional" : sequence ? "a sequence" : "a tensor";
}

// ---- Attributes ----

const Attribute& Attributes::get(const std::string& name, const char* kind) const {
  auto it = map_.find(name);
  if (it == map_.end())
    throw ValueError(cat(where, ": required attribute '", name, "' (", kind, ") is missing"));
  return it->second;
}

namespace {

template <class T>
const T& typed(const Attribute& a, const std::string& where, const std::string& name,
               const char* kind) {
  if (const T* v = std::get_if<T>(&a)) return *v;
  throw ValueError(cat(where, ": attribute '", name, "' should be ", kind));
}

}  // namespace

int64_t Attributes::get_int(const std::string& name) const {
  return typed<int64_t>(get(name, "int"), where, name, "an int");
}
int64_t Attributes::get_int(const std::string& name, int64_t fallback) const {
  return has(name) ? get_int(name) : fallback;
}
double Attributes::get_float(const std::string& name) const {
  const Attribute& a = get(name, "float");
  if (const int64_t* i = std::get_if<int64_t>(&a)) return static_cast<double>(*i);
  return typed<double>(a, where, name, "a float");
}
double Attributes::get_float(const std::string& name, double fallback) const {
  return has(name) ? get_float(name) : fallback;
}
std::string Attributes::get_string(const std::string& name) const {
  return typed<std::string>(get(name, "string"), where, name, "a string");
}
std::string Attributes::get_string(const std::string& name, const std::string& fallback) const {
  return has(name) ? get_string(name) : fallback;
}
std::vector<int64_t> Attributes::get_ints(const std::string& name) const {
  return typed<std::vector<int64_t>>(get(name, "ints"), where, name, "a list of ints");
}
std::vector<int64_t> Attributes::get_ints(const std::string& name,
                                          std::vector<int64_t> fallback) const {
  return has(name) ? get_ints(name) : fallback;
}
std::vector<double> Attributes::get_floats(const std::string& name) const {
  return typed<std::vector<double>>(get(name, "floats"), where, name, "a list of floats");
}
std::vector<double> Attributes::get_floats(const std::string& name,
                                           std::vector<double> fallback) const {
  return has(name) ? get_floats(name) : fallback;
}
std::vector<std::string> Attributes::get_strings(const std::string& name) const {
  return typed<std::vector<std::string>>(get(name, "strings"), where, name, "a list of strings");
}
const Tensor& Attributes::get_tensor(const std::string& name) const {
  return typed<Tensor>(get(name, "tensor"), where, name, "a tensor");
}

const Graph& Attributes::get_graph(const std::string& name) const {
  const GraphAttr& g = typed<GraphAttr>(get(name, "graph"), where, name, "a graph");
  if (!g) throw ValueError(cat(where, ": attribute '", name, "' is an empty graph"));
  return *g;
}

DType Attributes::get_dtype(const std::string& name) const {
  const Attribute& a = get(name, "dtype");
  if (const auto* s = std::get_if<std::string>(&a)) {
    static const std::pair<const char*, int> kNames[] = {
        {"FLOAT", 1},   {"UINT8", 2},   {"INT8", 3},     {"UINT16", 4},   {"INT16", 5},
        {"INT32", 6},   {"INT64", 7},   {"BOOL", 9},     {"FLOAT16", 10}, {"DOUBLE", 11},
        {"UINT32", 12}, {"UINT64", 13}, {"BFLOAT16", 16}};
    for (const auto& [type_name, code] : kNames)
      if (*s == type_name) return dtype_from_onnx_code(code, where);
    throw UnsupportedError(
        cat(where, ": attribute '", name, "': type '", *s, "' is not supported"));
  }
  return dtype_from_onnx_code(get_int(name), where);
}

// ---- Node and Graph ----

std::string Node::where() const {
  // Kernels call this on every run (for their error messages): plain appends, no stream.
  std::string s;
  s.reserve(op.size() + name.size() + 11);
  s.append("[").append(op).append("] node '").append(name).append("'");
  return s;
}

const Attributes& Node::attr_source(const std::string& name, Attributes& scratch) const {
  if (attrs.has(name) || !def || !def->attrs.declared()) return attrs;
  const AttrDef* d = def->attrs.find(name);
  PTO_CHECK(d) << where() << ": reads attribute '" << name << "', which " << op
               << "'s schema does not declare";
  if (d->use != AttrUse::kDefault) return attrs;
  scratch.where = attrs.where;
  scratch.set(name, d->default_value);
  return scratch;
}

int64_t Node::attr_int(const std::string& name) const {
  Attributes scratch;
  return attr_source(name, scratch).get_int(name);
}
double Node::attr_float(const std::string& name) const {
  Attributes scratch;
  return attr_source(name, scratch).get_float(name);
}
std::string Node::attr_string(const std::string& name) const {
  Attributes scratch;
  return attr_source(name, scratch).get_string(name);
}
std::vector<int64_t> Node::attr_ints(const std::string& name) const {
  Attributes scratch;
  return attr_source(name, scratch).get_ints(name);
}
std::vector<double> Node::attr_floats(const std::string& name) const {
  Attributes scratch;
  return attr_source(name, scratch).get_floats(name);
}

ValueId Graph::add_value(std::string name, TensorType type) {
  auto id = static_cast<ValueId>(values_.size());
  if (name.empty()) name = cat("%", id);
  if (!by_name_.emplace(name, id).second)
    throw ValueError(cat("graph: value '", name, "' is defined twice"));
  values_.push_back({std::move(name), std::move(type), -1});
  return id;
}

ValueId Graph::add_input(std::string name, TensorType type) {
  ValueId v = add_value(std::move(name), std::move(type));
  inputs_.push_back(v);
  return v;
}

void Graph::add_output(ValueId v) {
  PTO_CHECK(v >= 0 && v < static_cast<ValueId>(values_.size())) << "bad output value " << v;
  outputs_.push_back(v);
}

void Graph::set_initializer(ValueId v, Tensor t) {
  Value& val = value(v);
  val.type.dtype = t.dtype();
  val.type.shape = to_shape(t.shape());
  initializers_[v] = std::move(t);
  released_.erase(v);
}

void Graph::release_initializer(ValueId v) {
  PTO_CHECK(initializers_.erase(v) == 1)
      << "release_initializer: value " << v << " is not an initializer";
  released_.insert(v);
}

Node& Graph::add_node(std::string op, std::vector<ValueId> inputs, std::vector<ValueId> outputs,
                      Attributes attrs, std::string name, int node_opset) {
  Node n;
  n.def = OpRegistry::global().find(op);
  if (name.empty()) name = cat(op, "_", nodes_.size());
  n.name = std::move(name);
  n.op = std::move(op);
  n.opset = node_opset ? node_opset : opset;
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  n.attrs = std::move(attrs);
  n.attrs.where = n.where();
  if (!n.def) throw UnsupportedError(cat(n.where(), ": operator '", n.op, "' is not supported"));
  auto index = static_cast<int32_t>(nodes_.size());
  for (ValueId o : n.outputs) {
    if (o == kNoValue) continue;
    Value& v = value(o);
    if (v.producer != -1 || initializers_.count(o) || released_.count(o))
      throw ValueError(cat(n.where(), ": output '", v.name, "' is already defined"));
    v.producer = index;
  }
  nodes_.push_back(std::move(n));
  return nodes_.back();
}

Value& Graph::value(ValueId v) {
  PTO_CHECK(v >= 0 && v < static_cast<ValueId>(values_.size())) << "bad value id " << v;
  return values_[v];
}
const Value& Graph::value(ValueId v) const {
  PTO_CHECK(v >= 0 && v < static_cast<ValueId>(values_.size())) << "bad value id " << v;
  return values_[v];
}

const Tensor* Graph::initializer(ValueId v) const {
  auto it = initializers_.find(v);
  return it == initializers_.end() ? nullptr : &it->second;
}

std::optional<ValueId> Graph::find_value(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

bool Graph::is_output(ValueId v) const {
  for (ValueId o : outputs_)
    if (o == v) return true;
  return false;
}

// ---- Rewriting ----

std::string Graph::unique_name(const std::string& base) const {
  if (!by_name_.count(base)) return base;
  for (int i = 1;; ++i) {
    std::string name = cat(base, "_", i);
    if (!by_name_.count(name)) return name;
  }
}

ValueId Graph::add_constant(const std::string& base_name, Tensor t) {
  ValueId v = add_value(unique_name(base_name));
  set_initializer(v, std::move(t));
  return v;
}

void Graph::remove_initializer(ValueId v) {
  initializers_.erase(v);
  released_.erase(v);
}

void Graph::replace_uses(ValueId from, ValueId to) {
  if (from == to) return;
  const bool from_is_output = is_output(from);
  // Keep the user-facing output name: an intermediate `to` takes it over (and gives `from` its
  // own); a graph input, an initializer or another output keeps its name.
  if (from_is_output && value(to).producer >= 0 && !initializers_.count(to) && !is_output(to)) {
    std::swap(values_[from].name, values_[to].name);
    by_name_[values_[from].name] = from;
    by_name_[values_[to].name] = to;
  }
  for (Node& n : nodes_)
    for (ValueId& v : n.inputs)
      if (v == from) v = to;
  for (ValueId& v : outputs_)
    if (v == from) v = to;
}

Node& Graph::insert_node(size_t pos, std::string op, std::vector<ValueId> inputs,
                         std::vector<ValueId> outputs, Attributes attrs, std::string name) {
  PTO_CHECK(pos <= nodes_.size()) << "insert_node: position " << pos << " out of range";
  add_node(std::move(op), std::move(inputs), std::move(outputs), std::move(attrs),
           name.empty() ? "" : std::move(name));
  if (pos != nodes_.size() - 1) {
    std::rotate(nodes_.begin() + static_cast<std::ptrdiff_t>(pos), nodes_.end() - 1, nodes_.end());
    for (size_t i = pos; i < nodes_.size(); ++i)
      for (ValueId o : nodes_[i].outputs)
        if (o != kNoValue) values_[o].producer = static_cast<int32_t>(i);
  }
  return nodes_[pos];
}

void Graph::remove_nodes(const std::vector<bool>& remove) {
  std::vector<Node> kept;
  kept.reserve(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) {
    bool drop = i < remove.size() && remove[i];
    for (ValueId o : nodes_[i].outputs)
      if (o != kNoValue) values_[o].producer = drop ? -1 : static_cast<int32_t>(kept.size());
    if (!drop) kept.push_back(std::move(nodes_[i]));
  }
  nodes_ = std::move(kept);
}

std::vector<int> Graph::use_counts() const {
  std::vector<int> uses(values_.size(), 0);
  for (const Node& n : nodes_)
    for (ValueId v : n.inputs)
      if (v != kNoValue) ++uses[v];
  for (ValueId v : outputs_) ++uses[v];
  return uses;
}

std::vector<ValueId> inline_subgraph(Graph& g, size_t pos, const Graph& sub,
                                     const std::vector<ValueId>& inputs,
                                     const std::string& prefix) {
  PTO_CHECK(inputs.size() == sub.inputs().size() && pos <= g.nodes().size())
      << "inline_subgraph: " << inputs.size() << " inputs for " << sub.inputs().size();
  std::vector<ValueId> map(sub.values().size(), kNoValue);
  for (size_t i = 0; i < inputs.size(); ++i) map[sub.inputs()[i]] = inputs[i];
  for (const auto& [v, t] : sub.initializers())
    map[v] = g.add_constant(prefix + "/" + sub.value(v).name, t);
  auto mapped = [&](ValueId v) { return v == kNoValue ? kNoValue : map[v]; };
  size_t at = pos;
  for (const Node& n : sub.nodes()) {
    std::vector<ValueId> ins, outs;
    for (ValueId v : n.inputs) ins.push_back(mapped(v));
    for (ValueId v : n.outputs) {
      if (v != kNoValue)
        map[v] = g.add_value(g.unique_name(prefix + "/" + sub.value(v).name), sub.value(v).type);
      outs.push_back(mapped(v));
    }
    Node& m =
        g.insert_node(at++, n.op, std::move(ins), std::move(outs), n.attrs, prefix + "/" + n.name);
    m.domain = n.domain;
    m.opset = n.opset;
  }
  std::vector<ValueId> out;
  for (ValueId v : sub.outputs()) out.push_back(mapped(v));
  return out;
}

}  // namespace pto
