// Control-flow op definitions: If, Loop, Scan and SequenceMap. Their bodies are subgraph attributes
// whose outer-scope reads are explicit captures (control_flow.h). Type inference types each
// subgraph from the node's input types (InferContext::subgraphs hands the typed copies back to
// infer_types) and reads the node's output types off the subgraph's outputs.
#include "ir/ops/control_flow.h"

#include <limits>

#include "infer_util.h"

namespace pto {
namespace control_flow {

std::vector<const Graph*> subgraphs(const Node& n) {
  std::vector<const Graph*> out;
  for (const auto& [k, a] : n.attrs.all())
    if (const auto* g = std::get_if<GraphAttr>(&a); g && *g) out.push_back(g->get());
  return out;
}

int num_captures(const Node& n) {
  const std::vector<const Graph*> subs = subgraphs(n);
  return subs.empty() ? 0 : subs.front()->num_captures;
}

namespace {

bool is_scan8(const Node& n) {
  return n.op == "Scan" && n.opset != 0 && n.opset < 9;
}

// The node's inputs before its captures.
size_t formal_inputs(const Node& n) {
  const auto c = static_cast<size_t>(num_captures(n));
  if (c > n.inputs.size())
    throw ValueError(cat(n.where(), ": its subgraphs read ", c, " outer values but the node has ",
                         n.inputs.size(), " inputs"));
  return n.inputs.size() - c;
}

}  // namespace

Arity loop_arity(const Node& n) {
  const Graph& body = n.attrs.get_graph("body");
  const size_t formal = formal_inputs(n);
  if (formal < 2)
    throw ValueError(cat(n.where(), ": needs the inputs M and cond (either may be empty)"));
  Arity a;
  a.carried = formal - 2;
  if (n.outputs.size() < a.carried)
    throw ValueError(cat(n.where(), ": has ", n.outputs.size(), " outputs, fewer than its ",
                         a.carried, " loop-carried values"));
  a.scan_outputs = n.outputs.size() - a.carried;
  if (body.inputs().size() != n.inputs.size())
    throw ValueError(cat(n.where(), ": the body has ", body.inputs().size(),
                         " inputs; expected 2 + ", a.carried, " loop-carried + ", body.num_captures,
                         " captured"));
  if (body.outputs().size() != 1 + a.carried + a.scan_outputs)
    throw ValueError(cat(n.where(), ": the body has ", body.outputs().size(),
                         " outputs; expected cond + ", a.carried, " loop-carried + ",
                         a.scan_outputs, " scan outputs"));
  return a;
}

Arity scan_arity(const Node& n) {
  const Graph& body = n.attrs.get_graph("body");
  const size_t first = is_scan8(n) ? 1 : 0;  // opset 8: sequence_lens
  const size_t formal = formal_inputs(n);
  const int64_t m = n.attr_int("num_scan_inputs");
  if (m < 1 || first + static_cast<size_t>(m) > formal)
    throw ValueError(
        cat(n.where(), ": num_scan_inputs ", m, " does not fit its ", formal - first, " inputs"));
  Arity a;
  a.scan_inputs = static_cast<size_t>(m);
  a.carried = formal - first - a.scan_inputs;
  if (n.outputs.size() < a.carried)
    throw ValueError(cat(n.where(), ": has ", n.outputs.size(), " outputs, fewer than its ",
                         a.carried, " states"));
  a.scan_outputs = n.outputs.size() - a.carried;
  if (body.inputs().size() != n.inputs.size() - first)
    throw ValueError(cat(n.where(), ": the body has ", body.inputs().size(), " inputs; expected ",
                         a.carried, " states + ", a.scan_inputs, " scan inputs + ",
                         body.num_captures, " captured"));
  if (body.outputs().size() != n.outputs.size())
    throw ValueError(cat(n.where(), ": the body has ", body.outputs().size(), " outputs; expected ",
                         n.outputs.size()));
  return a;
}

void verify_subgraphs(const Node& n) {
  const std::vector<const Graph*> subs = subgraphs(n);
  for (const Graph* g : subs) {
    try {
      verify(*g);
    } catch (const ValueError& e) {
      throw ValueError(cat(n.where(), ": subgraph '", g->name, "': ", e.what()));
    }
    if (g->num_captures != subs.front()->num_captures)
      throw ValueError(cat(n.where(), ": its subgraphs disagree on the outer values they read"));
  }
  const size_t formal = formal_inputs(n);
  for (size_t i = formal; i < n.inputs.size(); ++i)
    if (n.inputs[i] == kNoValue)
      throw ValueError(cat(n.where(), ": captured input ", i, " is empty"));
  if (n.op == "If") {
    for (const Graph* g : subs)
      if (g->inputs().size() != static_cast<size_t>(g->num_captures) || formal != 1)
        throw ValueError(cat(n.where(),
                             ": a branch takes no inputs but its captures, and the node ",
                             "takes cond and the captures"));
    for (const Graph* g : subs)
      if (g->outputs().size() != n.outputs.size())
        throw ValueError(cat(n.where(), ": branch '", g->name, "' has ", g->outputs().size(),
                             " outputs, the node ", n.outputs.size()));
  } else if (n.op == "Loop") {
    loop_arity(n);
  } else if (n.op == "Scan") {
    scan_arity(n);
  } else if (n.op == "SequenceMap") {
    const Graph& body = *subs.front();
    if (body.inputs().size() != n.inputs.size() || body.outputs().size() != n.outputs.size())
      throw ValueError(cat(n.where(), ": the body has ", body.inputs().size(), " inputs and ",
                           body.outputs().size(), " outputs; expected ", n.inputs.size(), " and ",
                           n.outputs.size(), " (one per input and output of the node)"));
  }
}

ScanAxes scan_axes(const Node& n, const std::vector<int64_t>& in_ranks,
                   const std::vector<int64_t>& out_ranks) {
  ScanAxes s;
  auto list = [&](const char* name, size_t count) {
    std::vector<int64_t> v = n.attrs.has(name) ? n.attrs.get_ints(name) : std::vector<int64_t>{};
    if (v.empty()) v.assign(count, 0);
    if (v.size() != count)
      throw ValueError(cat(n.where(), ": ", name, " has ", v.size(), " entries, expected ", count));
    return v;
  };
  const bool v8 = is_scan8(n);
  const std::vector<int64_t> in_dirs =
      list(v8 ? "directions" : "scan_input_directions", in_ranks.size());
  const std::vector<int64_t> out_dirs = v8 ? std::vector<int64_t>(out_ranks.size(), 0)
                                           : list("scan_output_directions", out_ranks.size());
  const std::vector<int64_t> in_axes =
      v8 ? std::vector<int64_t>(in_ranks.size(), 0) : list("scan_input_axes", in_ranks.size());
  const std::vector<int64_t> out_axes =
      v8 ? std::vector<int64_t>(out_ranks.size(), 0) : list("scan_output_axes", out_ranks.size());
  for (size_t i = 0; i < in_ranks.size(); ++i) {
    s.in_axes.push_back(normalize_axis(in_axes[i], in_ranks[i], n.where()));
    s.in_reverse.push_back(in_dirs[i] != 0);
  }
  for (size_t j = 0; j < out_ranks.size(); ++j) {
    s.out_axes.push_back(out_ranks[j] < 0 ? out_axes[j]
                                          : normalize_axis(out_axes[j], out_ranks[j], n.where()));
    s.out_reverse.push_back(out_dirs[j] != 0);
  }
  return s;
}

}  // namespace control_flow

namespace {

// A copy of `sub` with its inputs typed `types` and its other values inferred again from them.
// `fresh`: forget the node outputs' types first (a Loop body whose carried shapes were
// generalized must not keep the dims of a first pass).
// An error inferring it names the node and the subgraph's attribute ("[Scan] node 's': subgraph
// 'body': [Add] node 'a': ...").
std::shared_ptr<Graph> typed_copy(const InferContext& c, const char* attr,
                                  const std::vector<TensorType>& types, bool fresh) {
  const Graph& sub = c.attrs().get_graph(attr);
  auto g = std::make_shared<Graph>(sub);
  for (size_t i = 0; i < types.size() && i < g->inputs().size(); ++i) {
    TensorType& t = g->value(g->inputs()[i]).type;
    if (!types[i].is_tensor()) t.sequence = types[i].sequence, t.optional = types[i].optional;
    if (types[i].dtype != DType::kUndefined) t.dtype = types[i].dtype;
    if (types[i].shape || types[i].dtype != DType::kUndefined) t.shape = types[i].shape;
  }
  if (fresh)
    for (const Node& n : g->nodes())
      for (ValueId v : n.outputs)
        if (v != kNoValue) g->value(v).type.shape.reset();
  try {
    infer_types(*g);
  } catch (const Error&) {
    rethrow_with(cat(c.where(), ": subgraph '", attr, "': "));
  }
  return g;
}

// The common type of `a` and `b`: the dims where they agree, unknown elsewhere. A sequence or
// an optional on either side stays one (an If branch may yield an empty optional's element type).
TensorType join(const TensorType& a, const TensorType& b) {
  TensorType t;
  t.sequence = a.sequence || b.sequence;
  t.optional = a.optional || b.optional;
  t.dtype = a.dtype == b.dtype ? a.dtype : DType::kUndefined;
  if (!a.shape || !b.shape || a.shape->size() != b.shape->size()) return t;
  Shape s = *a.shape;
  for (size_t d = 0; d < s.size(); ++d)
    if (s[d] != (*b.shape)[d]) s[d] = Dim::unknown();
  t.shape = std::move(s);
  return t;
}

std::vector<TensorType> tail_types(const InferContext& c, size_t from) {
  return std::vector<TensorType>(c.inputs.begin() + static_cast<std::ptrdiff_t>(from),
                                 c.inputs.end());
}

const TensorType& output_type(const Graph& g, size_t i) {
  return g.value(g.outputs()[i]).type;
}

// The If's cond when inference knows it: a constant, or shape arithmetic on static shapes
// (Equal(Shape(x)[-1], 1) once x's shape is known).
std::optional<bool> known_cond(const InferContext& c) {
  if (!c.constants.empty() && c.constants[0] && c.constants[0]->numel() == 1 &&
      c.constants[0]->dtype() == DType::kBool)
    return c.constants[0]->contiguous().data<bool>()[0];
  if (!c.values.empty() && c.values[0] && c.values[0]->dims.size() == 1 && c.values[0]->is_exact(0))
    return c.values[0]->dims[0].value != 0;
  return std::nullopt;
}

void infer_if(InferContext& c) {
  control_flow::verify_subgraphs(c.node);
  const std::vector<TensorType> captures = tail_types(c, 1);
  // A branch that cannot run on these types is no error when the cond is known not to take it
  // (ONNX runs the taken branch only): Silero VAD's else_branch squeezes a last dim that is 1
  // only when the then_branch is taken. The node then has the taken branch's types, and the
  // other branch is kept as it was (FoldConstants replaces the If by the taken branch).
  const std::optional<bool> cond = known_cond(c);
  auto typed_or_kept = [&](const char* attr, bool taken) -> std::shared_ptr<Graph> {
    if (!cond || taken) return typed_copy(c, attr, captures, false);
    try {
      return typed_copy(c, attr, captures, false);
    } catch (const ValueError&) {
    } catch (const TypeError&) {
    } catch (const UnsupportedError&) {
    }
    return std::make_shared<Graph>(c.attrs().get_graph(attr));
  };
  auto then_g = typed_or_kept("then_branch", cond.value_or(true));
  auto else_g = typed_or_kept("else_branch", !cond.value_or(false));
  if (cond) {
    const Graph& taken = *cond ? *then_g : *else_g;
    for (size_t i = 0; i < c.outputs.size(); ++i) c.outputs[i] = output_type(taken, i);
    c.subgraphs["then_branch"] = then_g;
    c.subgraphs["else_branch"] = else_g;
    return;
  }
  for (size_t i = 0; i < c.outputs.size(); ++i) {
    const TensorType &a = output_type(*then_g, i), &b = output_type(*else_g, i);
    if (a.dtype != b.dtype && a.dtype != DType::kUndefined && b.dtype != DType::kUndefined)
      throw TypeError(cat(c.where(), ": output ", i, " is ", dtype_name(a.dtype),
                          " in then_branch but ", dtype_name(b.dtype), " in else_branch"));
    TensorType t = join(a, b);
    if (t.dtype == DType::kUndefined) t.dtype = a.dtype != DType::kUndefined ? a.dtype : b.dtype;
    c.outputs[i] = t;
  }
  c.subgraphs["then_branch"] = then_g;
  c.subgraphs["else_branch"] = else_g;
}

// A stacked output: `t` with `count` inserted at `axis` (unknown rank stays unknown).
TensorType stacked(const TensorType& t, Dim count, int64_t axis, const std::string& where) {
  TensorType out{t.dtype, std::nullopt};
  if (!t.is_tensor())  // ONNX stacks tensors only
    throw UnsupportedError(cat(where, ": a scan output is ", t.kind_name(), " (", t.str(), ")"));
  if (!t.shape) return out;
  Shape s = *t.shape;
  axis = std::clamp<int64_t>(axis < 0 ? axis + static_cast<int64_t>(s.size()) + 1 : axis, 0,
                             static_cast<int64_t>(s.size()));
  s.insert(s.begin() + axis, count);
  out.shape = std::move(s);
  return out;
}

void infer_loop(InferContext& c) {
  control_flow::verify_subgraphs(c.node);
  const control_flow::Arity a = control_flow::loop_arity(c.node);
  std::vector<TensorType> types{{DType::kI64, Shape{}}, {DType::kBool, Shape{}}};
  for (size_t i = 2; i < c.inputs.size(); ++i) types.push_back(c.inputs[i]);
  auto g = typed_copy(c, "body", types, false);
  // Carried values whose type the body changes (a growing sequence) get the common type.
  bool changed = false;
  for (size_t i = 0; i < a.carried; ++i) {
    TensorType j = join(types[2 + i], output_type(*g, 1 + i));
    if (j.dtype == DType::kUndefined) j.dtype = types[2 + i].dtype;
    if (j.dtype != types[2 + i].dtype || j.shape != types[2 + i].shape ||
        j.sequence != types[2 + i].sequence || j.optional != types[2 + i].optional) {
      types[2 + i] = j;
      changed = true;
    }
  }
  if (changed) g = typed_copy(c, "body", types, true);
  Dim trips = Dim::unknown();
  if (!c.has_input(1))
    if (auto m = infer::constant_ints(c, 0); m && m->size() == 1 && (*m)[0] >= 0)
      trips = Dim((*m)[0]);
  for (size_t i = 0; i < a.carried; ++i) c.outputs[i] = types[2 + i];
  for (size_t k = 0; k < a.scan_outputs; ++k)
    c.outputs[a.carried + k] = stacked(output_type(*g, 1 + a.carried + k), trips, 0, c.where());
  c.subgraphs["body"] = g;
}

void infer_scan(InferContext& c) {
  control_flow::verify_subgraphs(c.node);
  const control_flow::Arity a = control_flow::scan_arity(c.node);
  const bool v8 = c.node.opset != 0 && c.node.opset < 9;
  const size_t first = v8 ? 1 : 0;
  const size_t batch_dims = v8 ? 1 : 0;  // opset 8: axis 0 is the batch, the scan axis is 1
  std::vector<int64_t> in_ranks, out_ranks;
  for (size_t i = 0; i < a.scan_inputs; ++i) {
    const TensorType& t = c.inputs[first + a.carried + i];
    if (!t.shape) {  // an unknown rank: no axes to slice along
      for (size_t o = 0; o < c.outputs.size(); ++o) c.outputs[o].dtype = DType::kUndefined;
      return;
    }
    in_ranks.push_back(static_cast<int64_t>(t.shape->size()) - static_cast<int64_t>(batch_dims));
  }
  std::vector<TensorType> types;
  for (size_t i = 0; i < a.carried; ++i) {
    TensorType t = c.inputs[first + i];
    if (v8 && t.shape && !t.shape->empty()) t.shape->erase(t.shape->begin());
    types.push_back(t);
  }
  out_ranks.assign(a.scan_outputs, -1);  // the stacked ranks are known once the body is typed
  const control_flow::ScanAxes axes = control_flow::scan_axes(c.node, in_ranks, out_ranks);
  Dim length = Dim::unknown();
  for (size_t i = 0; i < a.scan_inputs; ++i) {
    TensorType t = c.inputs[first + a.carried + i];
    const auto axis = static_cast<std::ptrdiff_t>(axes.in_axes[i] + batch_dims);
    if (i == 0) length = (*t.shape)[axis];
    t.shape->erase(t.shape->begin() + axis);
    if (v8) t.shape->erase(t.shape->begin());
    types.push_back(t);
  }
  for (size_t i = first + a.carried + a.scan_inputs; i < c.inputs.size(); ++i)
    types.push_back(c.inputs[i]);
  auto g = typed_copy(c, "body", types, false);
  const Dim batch = v8 && c.inputs[first].shape && !c.inputs[first].shape->empty()
                        ? c.inputs[first].shape->front()
                        : Dim::unknown();
  for (size_t i = 0; i < c.outputs.size(); ++i) {
    TensorType t = output_type(*g, i);
    if (i >= a.carried) t = stacked(t, length, axes.out_axes[i - a.carried], c.where());
    if (v8 && t.shape) t.shape->insert(t.shape->begin(), batch);
    c.outputs[i] = t;
  }
  c.subgraphs["body"] = g;
}

// SequenceMap: the body runs once per element; a sequence input gives it that element, any other
// input is passed whole, and each body output is collected into a sequence.
void infer_sequence_map(InferContext& c) {
  control_flow::verify_subgraphs(c.node);
  std::vector<TensorType> types = c.inputs;
  const size_t formal = c.inputs.size() - static_cast<size_t>(control_flow::num_captures(c.node));
  if (!types[0].sequence || types[0].optional)
    throw TypeError(cat(c.where(), ": input 0 should be a sequence, got ", types[0].str()));
  for (size_t i = 0; i < formal; ++i) types[i].sequence = false;
  auto g = typed_copy(c, "body", types, false);
  for (size_t i = 0; i < c.outputs.size(); ++i) {
    TensorType t = output_type(*g, i);
    if (!t.is_tensor())
      throw UnsupportedError(cat(c.where(), ": body output ", i, " is ", t.kind_name()));
    t.sequence = true;
    c.outputs[i] = t;
  }
  c.subgraphs["body"] = g;
}

void add_control_flow(OpRegistry& r, const std::string& name, int min_inputs, AttrSchema attrs,
                      InferFn infer, std::string doc) {
  r.add({.name = name,
         .min_inputs = min_inputs,
         .max_inputs = -1,
         .min_outputs = 1,
         .max_outputs = std::numeric_limits<int>::max(),
         .properties = kOpaque | kNonTensorValues,
         .attrs = std::move(attrs),
         .infer = std::move(infer),
         .doc = std::move(doc)});
}

}  // namespace

void register_control_flow_ops(OpRegistry& r) {
  add_control_flow(r, "If", 1,
                   {required_attr("then_branch", AttrKind::kGraph),
                    required_attr("else_branch", AttrKind::kGraph)},
                   infer_if, "runs then_branch or else_branch as cond says");
  add_control_flow(r, "Loop", 0, {required_attr("body", AttrKind::kGraph)}, infer_loop,
                   "runs body up to M times while cond holds; carries values, stacks scan outputs");
  add_control_flow(
      r, "Scan", 0,
      {required_attr("body", AttrKind::kGraph), required_attr("num_scan_inputs", AttrKind::kInt),
       optional_attr("scan_input_directions", AttrKind::kInts),
       optional_attr("scan_output_directions", AttrKind::kInts),
       optional_attr("scan_input_axes", AttrKind::kInts),
       optional_attr("scan_output_axes", AttrKind::kInts),
       optional_attr("directions", AttrKind::kInts, "opset 8")},
      infer_scan, "runs body on each slice of the scan inputs, carrying states");
  add_control_flow(r, "SequenceMap", 1, {required_attr("body", AttrKind::kGraph)},
                   infer_sequence_map,
                   "runs body on each element of the input sequences; collects the outputs into "
                   "sequences");
}

}  // namespace pto
