// Inlining of model-local functions (functions.h).
#include "functions.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "pto/error.h"

namespace pto::onnx {
namespace {

using FunctionKey = std::tuple<std::string, std::string, std::string>;  // domain, name, overload

// The most nodes model-local functions may inline to: 40 times the largest real ONNX graphs
// (~100k nodes); 4M nodes would take minutes to compile.
constexpr int64_t kMaxInlinedNodes = int64_t{1} << 22;

std::string domain_of(const std::string& d) {
  return d == "ai.onnx" ? "" : d;
}

class Inliner {
 public:
  Inliner(const ::onnx::ModelProto& m, const std::string& src) : src_(src) {
    for (const auto& f : m.functions()) {
      FunctionKey key{domain_of(f.domain()), f.name(), f.overload()};
      if (!functions_.emplace(key, &f).second)
        throw ValueError(cat(src, ": function '", f.domain(), ".", f.name(), "' is defined twice"));
    }
  }

  bool any() const { return !functions_.empty(); }

  // Refuses a model whose functions would inline to more than kMaxInlinedNodes nodes, before
  // inlining any: a function that calls another twice, nested 25 deep, is 1 KB of model and 2^24
  // nodes inlined (minutes, then out of memory). Names the call that passes the limit.
  void check_inlined_size(const ::onnx::GraphProto& g) {
    int64_t total = 0;
    for (const auto& n : g.node()) {
      const int64_t add = nodes_of(n);
      total = std::min(total + add, kMaxInlinedNodes + 1);
      if (total <= kMaxInlinedNodes) continue;
      const ::onnx::FunctionProto* f = find(n);
      throw ValueError(
          cat(src_, ": [", n.op_type(), "] node '", n.name(), "'",
              f ? cat(" (a call of function '", f->name(), "')") : std::string(),
              ": model-local functions would inline to more than ", kMaxInlinedNodes, " nodes",
              add > kMaxInlinedNodes ? " here" : cat(" in all with this node's ", add),
              " (the limit; functions that call others several times grow exponentially with their "
              "nesting)"));
    }
  }

  // Inlines the calls in `g`'s nodes and in their subgraphs.
  void graph(::onnx::GraphProto& g, int depth) {
    if (depth > 64)
      throw ValueError(cat(src_, ": model-local functions nest deeper than 64 calls (recursion?)"));
    google::protobuf::RepeatedPtrField<::onnx::NodeProto> out;
    for (auto& n : *g.mutable_node()) {
      const ::onnx::FunctionProto* f = find(n);
      if (!f) {
        subgraphs(n, depth);
        *out.Add() = std::move(n);
        continue;
      }
      ::onnx::GraphProto body;  // the expansion, itself inlined (calls inside the function)
      expand(n, *f, *body.mutable_node());
      graph(body, depth + 1);
      for (auto& b : *body.mutable_node()) *out.Add() = std::move(b);
    }
    g.mutable_node()->Swap(&out);
  }

 private:
  const ::onnx::FunctionProto* find(const ::onnx::NodeProto& n) const {
    auto it = functions_.find({domain_of(n.domain()), n.op_type(), n.overload()});
    return it == functions_.end() ? nullptr : it->second;
  }

  // The nodes `n` stands for once inlined (its subgraphs' included), at most kMaxInlinedNodes + 1;
  // each function counted once (memo). A function that calls itself counts 1 per call: graph()
  // refuses it by depth.
  int64_t nodes_of(const ::onnx::NodeProto& n) {
    const ::onnx::FunctionProto* f = find(n);
    if (!f) {
      int64_t count = 1;
      for (const auto& a : n.attribute()) {
        if (a.has_g()) count = std::min(count + nodes_of(a.g()), kMaxInlinedNodes + 1);
        for (const auto& sub : a.graphs())
          count = std::min(count + nodes_of(sub), kMaxInlinedNodes + 1);
      }
      return count;
    }
    auto [it, fresh] = sizes_.emplace(f, 1);  // 1 while being counted: a recursive call
    if (!fresh) return it->second;
    int64_t count = 0;
    for (const auto& b : f->node()) count = std::min(count + nodes_of(b), kMaxInlinedNodes + 1);
    sizes_[f] = count;
    return count;
  }
  int64_t nodes_of(const ::onnx::GraphProto& g) {
    int64_t count = 0;
    for (const auto& n : g.node()) count = std::min(count + nodes_of(n), kMaxInlinedNodes + 1);
    return count;
  }

  void subgraphs(::onnx::NodeProto& n, int depth) {
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_g()) graph(*a.mutable_g(), depth);
      for (auto& sub : *a.mutable_graphs()) graph(sub, depth);
    }
  }

  // The body of `f` for the call `call`, appended to `out`.
  void expand(const ::onnx::NodeProto& call, const ::onnx::FunctionProto& f,
              google::protobuf::RepeatedPtrField<::onnx::NodeProto>& out) {
    const std::string where = cat(src_, ": [", call.op_type(), "] node '", call.name(),
                                  "' (a call of function '", f.name(), "')");
    if (call.input_size() > f.input_size() || call.output_size() > f.output_size())
      throw ValueError(cat(where, ": ", call.input_size(), " inputs and ", call.output_size(),
                           " outputs, the function has ", f.input_size(), " and ",
                           f.output_size()));
    // An output the body never computes would be blamed on the node that reads it.
    std::unordered_set<std::string> made(f.input().begin(), f.input().end());
    for (const auto& node : f.node()) made.insert(node.output().begin(), node.output().end());
    for (int i = 0; i < call.output_size(); ++i)
      if (!call.output(i).empty() && !made.count(f.output(i)))
        throw ValueError(cat(where, ": output ", i, " ('", f.output(i),
                             "') of the function is not computed by its body"));
    std::unordered_map<std::string, std::string> names;  // body name -> graph name
    for (int i = 0; i < f.input_size(); ++i)
      names[f.input(i)] = i < call.input_size() ? call.input(i) : "";
    for (int i = 0; i < f.output_size(); ++i)
      names[f.output(i)] = i < call.output_size() ? call.output(i) : "";
    const std::string prefix =
        cat(call.name().empty() ? f.name() : call.name(), "/", ++calls_, "/");
    auto rename = [&](std::string& name) {
      if (name.empty()) return;
      auto it = names.find(name);
      if (it == names.end()) it = names.emplace(name, prefix + name).first;
      name = it->second;
    };
    // The call's attributes, then the function's defaults for the others it declares.
    std::map<std::string, const ::onnx::AttributeProto*> given;
    for (const auto& a : call.attribute()) given[a.name()] = &a;
    for (const auto& a : f.attribute_proto()) given.emplace(a.name(), &a);
    for (const auto& node : f.node()) {
      ::onnx::NodeProto n = node;
      n.set_name(prefix + (node.name().empty() ? node.op_type() : node.name()));
      for (auto& in : *n.mutable_input()) rename(in);
      for (auto& o : *n.mutable_output()) {
        // An output the call leaves out is still computed inside the body (another node may
        // read it): it gets a fresh name rather than none.
        if (!o.empty() && names.count(o) && names[o].empty()) names[o] = prefix + o;
        rename(o);
      }
      google::protobuf::RepeatedPtrField<::onnx::AttributeProto> attrs;
      for (auto& a : *n.mutable_attribute()) {
        if (!a.ref_attr_name().empty()) {
          auto it = given.find(a.ref_attr_name());
          if (it == given.end()) continue;  // not given and no default: the attribute is absent
          ::onnx::AttributeProto v = *it->second;
          v.set_name(a.name());
          *attrs.Add() = std::move(v);
          continue;
        }
        if (a.has_g()) rename_scope(*a.mutable_g(), rename);
        for (auto& sub : *a.mutable_graphs()) rename_scope(sub, rename);
        *attrs.Add() = std::move(a);
      }
      n.mutable_attribute()->Swap(&attrs);
      *out.Add() = std::move(n);
    }
  }

  // Renames a subgraph's reads of the body's values (a subgraph cannot redefine an outer name,
  // so every body name it mentions is the body's).
  template <class Rename>
  static void rename_scope(::onnx::GraphProto& g, Rename& rename) {
    std::unordered_set<std::string> own;
    for (const auto& vi : g.input()) own.insert(vi.name());
    for (const auto& t : g.initializer()) own.insert(t.name());
    for (const auto& n : g.node())
      for (const auto& o : n.output()) own.insert(o);
    for (auto& n : *g.mutable_node()) {
      for (auto& in : *n.mutable_input())
        if (!own.count(in)) rename(in);
      for (auto& a : *n.mutable_attribute()) {
        if (a.has_g()) rename_scope(*a.mutable_g(), rename);
        for (auto& sub : *a.mutable_graphs()) rename_scope(sub, rename);
      }
    }
    for (auto& vi : *g.mutable_output())
      if (!own.count(vi.name())) rename(*vi.mutable_name());
  }

  const std::string& src_;
  std::map<FunctionKey, const ::onnx::FunctionProto*> functions_;
  std::unordered_map<const ::onnx::FunctionProto*, int64_t> sizes_;  // nodes_of each function
  int calls_ = 0;
};

}  // namespace

void inline_functions(::onnx::ModelProto& m, const std::string& src) {
  Inliner inliner(m, src);
  if (!inliner.any()) return;
  inliner.check_inlined_size(m.graph());
  inliner.graph(*m.mutable_graph(), 0);
}

}  // namespace pto::onnx
