// The verifier: structural invariants of a Tensor Graph. Cheap; run after import and, in debug
// builds, after every pass. It is where node attributes meet their op's schema (OpDef::attrs):
// every graph, however it was built (ONNX import, the torch frontend, parse_graph, a pass, C++),
// passes through here before it is compiled or run.
#include <vector>

#include "ir/ops/control_flow.h"
#include "pto/op_registry.h"

namespace pto {

void verify(const Graph& g) {
  const auto n_values = static_cast<ValueId>(g.values().size());
  std::vector<char> defined(g.values().size(), 0);
  auto check_id = [&](ValueId v, const std::string& where) {
    if (v < 0 || v >= n_values)
      throw ValueError(cat(where, ": refers to value id ", v, " that does not exist"));
  };
  for (ValueId v : g.inputs()) {
    check_id(v, "graph input");
    defined[v] = 1;
  }
  for (const auto& [v, t] : g.initializers()) {
    check_id(v, "initializer");
    defined[v] = 1;
  }
  for (ValueId v : g.released()) {
    check_id(v, "released initializer");
    defined[v] = 1;
  }
  for (const Node& n : g.nodes()) {
    if (!n.def || n.def->name != n.op)
      throw ValueError(cat(n.where(), ": operator is not registered"));
    const OpDef& d = *n.def;
    check_attributes(n);
    if (!control_flow::subgraphs(n).empty()) control_flow::verify_subgraphs(n);
    auto n_in = static_cast<int>(n.inputs.size());
    auto n_out = static_cast<int>(n.outputs.size());
    if (n_in < d.min_inputs || (d.max_inputs >= 0 && n_in > d.max_inputs))
      throw ValueError(cat(n.where(), ": has ", n_in, " inputs, expected ", d.min_inputs,
                           d.max_inputs < 0 ? " or more" : cat(" to ", d.max_inputs)));
    if (n_out < d.min_outputs || n_out > d.max_outputs)
      throw ValueError(cat(n.where(), ": has ", n_out, " outputs, expected ", d.min_outputs, " to ",
                           d.max_outputs));
    for (int i = 0; i < n_in; ++i) {
      ValueId v = n.inputs[i];
      if (v == kNoValue) {
        if (i < d.min_inputs)
          throw ValueError(cat(n.where(), ": required input ", i, " is missing"));
        // A variadic list (Sum's, Concat's, Einsum's) has no holes; only ops whose leading
        // inputs are all optional (Loop's M and cond) may omit some.
        if (d.max_inputs < 0 && d.min_inputs > 0)
          throw ValueError(cat(n.where(), ": input ", i, " is missing: ", n.op,
                               "'s variadic inputs cannot be omitted"));
        continue;
      }
      check_id(v, n.where());
      if (!defined[v])
        throw ValueError(cat(n.where(), ": input '", g.value(v).name,
                             "' is used before it is defined (or never defined)"));
    }
    for (ValueId v : n.outputs) {
      if (v == kNoValue) continue;
      check_id(v, n.where());
      if (defined[v])
        throw ValueError(cat(n.where(), ": output '", g.value(v).name, "' is defined twice"));
      defined[v] = 1;
    }
    check_tensor_values(g, n);
  }
  if (g.outputs().empty()) throw ValueError("graph: has no outputs");
  for (ValueId v : g.outputs()) {
    check_id(v, "graph output");
    if (!defined[v])
      throw ValueError(cat("graph: output '", g.value(v).name, "' is never computed"));
  }
}

}  // namespace pto
