// ONNX ModelProto -> Tensor Graph. Checks everything a malformed file could get wrong (opsets,
// domains, names, attribute kinds, tensor sizes) and reports it as a pto::Error that names the
// file, the node and the op.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_set>

#include <google/protobuf/unknown_field_set.h>

#include "contrib_ops.h"
#include "functions.h"
#include "ir/ops/qlinear_ops.h"
#include "ml_ops.h"
#include "preview_ops.h"
#include "proto_util.h"
#include "pto/log.h"
#include "pto/onnx.h"
#include "pto/op_registry.h"

namespace pto::onnx {
namespace {

namespace fs = std::filesystem;

bool is_default_domain(const std::string& d) {
  return d.empty() || d == "ai.onnx";
}

// What to do about an op of another domain (for com.microsoft: one PyPTO does not read;
// qlinear_ops.h lists those it does).
std::string unsupported_domain_hint(const std::string& domain, const std::string& op) {
  if (domain == kMlDomain) return ml_unsupported_hint(op);
  if (domain == "com.microsoft.nchwc")
    return cat(" (", op,
               ": not among the NCHWc ops PyPTO reads (Conv, ReorderInput, ReorderOutput, the "
               "pools, Upsample); save the onnxruntime-optimized model at ORT_ENABLE_EXTENDED, "
               "which writes no NCHWc ops, or load it as exported)");
  if (domain != "com.microsoft") return "";
  if (op == "QAttention" || op == "QEmbedLayerNormalization")
    return cat(" (", op,
               ": what quantize_dynamic writes for a model onnxruntime.transformers.optimizer "
               "fused first; quantize the unfused model instead: its MatMuls become "
               "DynamicQuantizeLinear + MatMulInteger, which run on PyPTO's int8 kernels)");
  if (op == "DynamicQuantizeLSTM")
    return " (DynamicQuantizeLSTM: what quantize_dynamic writes for an LSTM; load the float model "
           "the file was quantized from, or quantize it again keeping the LSTM float with "
           "op_types_to_quantize=['MatMul', 'Gemm', 'Conv'])";
  if (op.starts_with("QLinear")) {  // QLinearReduceMean, QLinearLayerNorm, ...
    std::string read = "QGemm";
    for (const std::string& q : qlinear::form_ops()) read += ", " + q;
    return cat(" (", op, ": not among the QOperator ops PyPTO reads (", read,
               "); quantize in the QDQ format, QuantFormat.QDQ, instead)");
  }
  return cat(" (", op,
             ": an onnxruntime contrib op, as onnxruntime.transformers.optimizer writes them; "
             "load the model as exported, before the optimizer fuses it)");
}

// What to do about an op PyPTO has no definition of, from the converter that wrote the file.
// tf2onnx keeps a TensorFlow op it has no conversion for under its TensorFlow name, in the
// default domain, and only warns ("Tensorflow op [...] is not supported"): no ONNX runtime
// reads the file. Keras 3's exact GELU (activation="gelu") is one: TensorFlow computes it with
// Erfc, which tf2onnx 1.17 does not convert.
std::string unknown_op_hint(const std::string& producer, const std::string& op) {
  if (producer != "tf2onnx") return "";
  std::string hint =
      cat(" (the file is tf2onnx's: where tf2onnx warned 'Tensorflow op [...: ", op,
          "] is not supported' as it converted, this is that TensorFlow op, left in the file under "
          "its TensorFlow name; onnxruntime refuses the file too. Convert a model without it");
  if (op == "Erfc")
    hint +=
        ": Keras' exact GELU computes Erfc; use keras.activations.gelu(x, approximate=True) "
        "or 0.5 * x * (1 + tf.math.erf(x / sqrt(2))), which tf2onnx writes as Tanh or Erf";
  return hint + ")";
}

// Dimensions the exporters of other frameworks write that the ONNX spec does not define, read as
// onnxruntime reads them. Each kind is reported once per model, naming where it was seen.
class DimGuesses {
 public:
  enum Kind { kMinusOne, kZero, kAnonymous, kKinds };

  void note(Kind k, const std::string& where, size_t axis) {
    if (seen_[k]++ < 3) places_[k] += cat(places_[k].empty() ? "" : ", ", where, " dim ", axis);
  }
  void report(const std::string& src) const {
    static const char* kWhat[kKinds] = {
        "dim_value -1 read as an unknown dimension (Paddle2ONNX writes -1 for a dynamic size)",
        "dim_value 0 on a graph input, output or value_info read as an unknown dimension (some "
        "exporters write 0 for a dynamic size; initializers and Constants keep real zero sizes)",
        "dim_param '?' or '' read as a fresh unknown dimension each time, not one shared symbol"};
    for (int k = 0; k < kKinds; ++k)
      if (seen_[k])
        log(LogLevel::kWarn, cat(src, ": ", kWhat[k], ": ", places_[k], seen_[k] > 3 ? ", ..." : "",
                                 " (", seen_[k], seen_[k] == 1 ? " dim)" : " dims)"));
  }

 private:
  int seen_[kKinds] = {};
  std::string places_[kKinds];
};

// `what` names the value ("input 'x'"), `src` the file.
TensorType type_from_proto(const ::onnx::TypeProto& tp, const std::string& src,
                           const std::string& what, DimGuesses& guesses) {
  const std::string where = cat(src, ": ", what);
  TensorType out;
  // seq(tensor), optional(tensor) and optional(seq(tensor)): the tensor type inside, flagged.
  if (tp.has_optional_type() && tp.optional_type().has_elem_type()) {
    const auto& elem = tp.optional_type().elem_type();
    if (elem.has_tensor_type() || elem.has_sequence_type()) {
      out = type_from_proto(elem, src, what, guesses);
      out.optional = true;
      return out;
    }
  }
  if (tp.has_sequence_type() && tp.sequence_type().has_elem_type() &&
      tp.sequence_type().elem_type().has_tensor_type()) {
    out = type_from_proto(tp.sequence_type().elem_type(), src, what, guesses);
    out.sequence = true;
    return out;
  }
  if (!tp.has_tensor_type()) {
    if (tp.value_case() == ::onnx::TypeProto::VALUE_NOT_SET) return out;  // untyped
    throw UnsupportedError(cat(where,
                               ": only tensors, sequences of tensors and optionals of these are "
                               "supported (maps, sparse tensors and other nestings are not)"));
  }
  const auto& tt = tp.tensor_type();
  if (tt.has_elem_type()) out.dtype = dtype_from_onnx(tt.elem_type(), where);
  if (tt.has_shape()) {
    Shape s;
    for (const auto& d : tt.shape().dim()) {
      const size_t axis = s.size();
      if (d.has_dim_value() && d.dim_value() > 0) {
        s.emplace_back(d.dim_value());
      } else if (d.has_dim_value()) {
        if (d.dim_value() < -1)
          throw ValueError(cat(where, ": negative dimension ", d.dim_value()));
        guesses.note(d.dim_value() == 0 ? DimGuesses::kZero : DimGuesses::kMinusOne, what, axis);
        s.push_back(Dim::unknown());
      } else if (d.has_dim_param() && !d.dim_param().empty() && d.dim_param() != "?") {
        s.push_back(Dim::sym(d.dim_param()));
      } else {
        if (d.has_dim_param()) guesses.note(DimGuesses::kAnonymous, what, axis);
        s.push_back(Dim::unknown());  // unknown dims are independent of each other
      }
    }
    out.shape = std::move(s);
  }
  return out;
}

Attribute attribute_from_proto(const ::onnx::AttributeProto& a, const std::string& base_dir,
                               const std::string& where) {
  using AP = ::onnx::AttributeProto;
  std::string w = cat(where, " attribute '", a.name(), "'");
  AP::AttributeType type = a.type();
  if (type == AP::UNDEFINED) {  // very old models leave the discriminator unset
    if (a.has_f())
      type = AP::FLOAT;
    else if (a.has_i())
      type = AP::INT;
    else if (a.has_s())
      type = AP::STRING;
    else if (a.has_t())
      type = AP::TENSOR;
    else if (a.has_g())
      type = AP::GRAPH;
    else if (a.floats_size())
      type = AP::FLOATS;
    else if (a.ints_size())
      type = AP::INTS;
    else if (a.strings_size())
      type = AP::STRINGS;
  }
  if (!a.ref_attr_name().empty())
    throw UnsupportedError(cat(w, ": references to function attributes are not supported"));
  switch (type) {
    case AP::FLOAT:
      return static_cast<double>(a.f());
    case AP::INT:
      return a.i();
    case AP::STRING:
      return a.s();
    case AP::TENSOR:
      return tensor_from_proto(a.t(), base_dir, w);
    case AP::FLOATS:
      return std::vector<double>(a.floats().begin(), a.floats().end());
    case AP::INTS:
      return std::vector<int64_t>(a.ints().begin(), a.ints().end());
    case AP::STRINGS:
      return std::vector<std::string>(a.strings().begin(), a.strings().end());
    case AP::TYPE_PROTO: {  // Optional's `type`: kept as the text TensorType::str writes
      DimGuesses guesses;
      return type_from_proto(a.tp(), "", w, guesses).str();
    }
    case AP::GRAPH:  // one with a graph is read by Converter::convert_node
      throw ValueError(cat(w, ": a GRAPH attribute without a graph"));
    case AP::GRAPHS:
      throw UnsupportedError(cat(w, ": lists of subgraphs (GRAPHS) are not supported"));
    default:
      throw UnsupportedError(cat(w, ": attribute type ",
                                 AP::AttributeType_IsValid(type)
                                     ? AP::AttributeType_Name(type)
                                     : std::to_string(static_cast<int>(type)),
                                 " is not supported"));
  }
}

int default_opset(const ::onnx::ModelProto& m, const std::string& src) {
  int64_t opset = -1;  // compared as read: a huge version must not wrap into the valid range
  for (const auto& o : m.opset_import())
    if (is_default_domain(o.domain())) opset = o.version();
  if (opset < 0) {
    if (m.opset_import_size() != 0) return 0;  // only other domains
    opset = 1;  // IR version 2 models had no opset_import: opset 1, older than we support
  }
  if (opset < kMinOpset || opset > max_opset())
    throw UnsupportedError(cat(src, ": opset ", opset,
                               " of the default domain is not supported "
                               "(supported: ",
                               kMinOpset, " to ", max_opset(), ")"));
  return static_cast<int>(opset);
}

// The opset of ai.onnx.ml the model imports; 0 when it imports none.
int64_t ml_opset(const ::onnx::ModelProto& m) {
  for (const auto& o : m.opset_import())
    if (o.domain() == kMlDomain) return o.version();
  return 0;
}

// Builds the graph; each initializer's raw bytes are freed once copied into its tensor, so a model
// is held about once while it loads, not twice.

// " (read by [Op] node 'name', ...)": the nodes that read value `name`, for an error about it (an
// INT4 weight is a DequantizeLinear's), or "".
std::string readers(const ::onnx::GraphProto& gp, const std::string& name) {
  std::string out;
  int count = 0;
  for (int i = 0; i < gp.node_size(); ++i) {
    const auto& np = gp.node(i);
    if (std::find(np.input().begin(), np.input().end(), name) == np.input().end()) continue;
    if (count++ == 3) {
      out += ", ...";
      break;
    }
    out += cat(out.empty() ? " (read by " : ", ", "[", np.op_type(), "] node '",
               np.name().empty() ? cat(np.op_type(), "_", i) : np.name(), "'");
  }
  return out.empty() ? out : out + ")";
}

// The names a graph reads without defining them (its inputs, initializers and node outputs),
// its nested subgraphs' included (a node's subgraphs in attribute-name order), in order of first
// use: what a subgraph captures from the enclosing scopes.
std::vector<std::string> free_names(const ::onnx::GraphProto& gp) {
  std::unordered_set<std::string> defined, seen;
  std::vector<std::string> out;
  for (const auto& vi : gp.input()) defined.insert(vi.name());
  for (const auto& t : gp.initializer()) defined.insert(t.name());
  auto use = [&](const std::string& name) {
    if (!name.empty() && !defined.count(name) && seen.insert(name).second) out.push_back(name);
  };
  for (const auto& np : gp.node()) {
    for (const auto& in : np.input()) use(in);
    std::map<std::string, const ::onnx::GraphProto*> subgraphs;  // in attribute-name order
    for (const auto& a : np.attribute())
      if (a.has_g()) subgraphs[a.name()] = &a.g();
    for (const auto& [key, sub] : subgraphs)
      for (const std::string& name : free_names(*sub)) use(name);
    for (const auto& o : np.output()) defined.insert(o);
  }
  for (const auto& vi : gp.output()) use(vi.name());
  return out;
}

// The NCHWc convs' filter shapes in `gp` (those with an initializer filter).
std::vector<NchwcConvShape> nchwc_convs(const ::onnx::GraphProto& gp) {
  std::unordered_map<std::string, const ::onnx::TensorProto*> inits;
  for (const auto& t : gp.initializer()) inits[t.name()] = &t;
  std::vector<NchwcConvShape> out;
  for (const auto& np : gp.node()) {
    if (np.domain() != "com.microsoft.nchwc" || np.op_type() != "Conv" || np.input_size() < 2)
      continue;
    auto it = inits.find(np.input(1));
    if (it == inits.end() || it->second->dims_size() != 4) continue;
    NchwcConvShape c{it->second->dims(0), it->second->dims(1), 1};
    for (const auto& a : np.attribute())
      if (a.name() == "group") c.group = a.i();
    out.push_back(c);
  }
  return out;
}

struct Converter {
  const std::string& base_dir;
  const std::string& src;
  int opset;
  int64_t ml_opset;      // of domain ai.onnx.ml, 0 when not imported
  std::string producer;  // ModelProto.producer_name ("tf2onnx", "pytorch", ...)
  DimGuesses guesses;
  std::unordered_map<const Graph*, NchwcState> nchwc;  // per graph, made at its first NCHWc op
  // The top graph's value_info element types, to compare with what its nodes make once types are
  // inferred (load_model).
  const Graph* top = nullptr;
  std::vector<std::pair<std::string, DType>> declared;

  // Fills `g` from `gp`. `captures` (a subgraph's): the outer values it reads, with their types,
  // added as its last inputs under their outer names.
  void convert_graph(::onnx::GraphProto& gp, Graph& g,
                     const std::vector<std::pair<std::string, TensorType>>& captures) {
    g.opset = opset;
    g.name = gp.name();
    std::unordered_set<std::string> init_names;
    for (const auto& t : gp.initializer()) init_names.insert(t.name());
    if (gp.sparse_initializer_size())
      throw UnsupportedError(cat(src, ": sparse initializers are not supported"));

    // Graph inputs that are not initializers are what the caller feeds.
    for (const auto& vi : gp.input()) {
      if (init_names.count(vi.name())) continue;
      if (vi.name().empty()) throw ValueError(cat(src, ": a graph input has no name"));
      if (g.find_value(vi.name()))
        throw ValueError(cat(src, ": graph input '", vi.name(), "' is declared twice"));
      try {
        g.add_input(vi.name(),
                    type_from_proto(vi.type(), src, cat("input '", vi.name(), "'"), guesses));
      } catch (const UnsupportedError& e) {
        throw UnsupportedError(cat(e.what(), readers(gp, vi.name())));
      }
    }
    for (const auto& [name, type] : captures) {
      if (g.find_value(name))
        throw ValueError(cat(src, ": subgraph '", gp.name(), "' reads outer value '", name,
                             "' and also declares it"));
      g.add_input(name, type);
      ++g.num_captures;
    }
    for (auto& t : *gp.mutable_initializer()) {
      if (t.name().empty()) throw ValueError(cat(src, ": an initializer has no name"));
      if (g.find_value(t.name()))
        throw ValueError(cat(src, ": initializer '", t.name(), "' is defined twice"));
      std::string where = cat(src, ": initializer");
      ValueId v = g.add_value(t.name());
      try {
        g.set_initializer(v, tensor_from_proto(t, base_dir, where));
      } catch (const UnsupportedError& e) {
        throw UnsupportedError(cat(e.what(), readers(gp, t.name())));
      }
      if (t.has_raw_data()) {
        t.mutable_raw_data()->clear();
        t.mutable_raw_data()->shrink_to_fit();
      }
    }

    for (int i = 0; i < gp.node_size(); ++i) convert_node(gp, i, g);

    for (const auto& vi : gp.output()) {
      auto v = g.find_value(vi.name());
      if (!v) throw ValueError(cat(src, ": graph output '", vi.name(), "' is never defined"));
      TensorType declared =
          type_from_proto(vi.type(), src, cat("output '", vi.name(), "'"), guesses);
      Value& val = g.value(*v);
      if (val.type.dtype == DType::kUndefined) val.type.dtype = declared.dtype;
      if (!val.type.shape) val.type.shape = declared.shape;
      if (val.type.is_tensor()) val.type.sequence = declared.sequence;
      if (val.type.is_tensor()) val.type.optional = declared.optional;
      g.add_output(*v);
    }
    for (const auto& vi : gp.value_info()) {
      auto v = g.find_value(vi.name());
      if (!v || g.initializer(*v)) continue;
      try {
        TensorType t =
            type_from_proto(vi.type(), src, cat("value_info '", vi.name(), "'"), guesses);
        if (&g == top && t.dtype != DType::kUndefined) declared.emplace_back(vi.name(), t.dtype);
        Value& val = g.value(*v);
        if (val.type.dtype == DType::kUndefined) val.type.dtype = t.dtype;
        if (!val.type.shape) val.type.shape = t.shape;
        if (val.type.is_tensor()) val.type.sequence = t.sequence, val.type.optional = t.optional;
      } catch (const UnsupportedError&) {
        // value_info is a hint; an unusual type there does not stop the import
      }
    }
  }

  ValueId defined(const Graph& g, const std::string& name, const std::string& where) {
    auto v = g.find_value(name);
    if (!v) throw ValueError(cat(where, ": input '", name, "' is not defined before this node"));
    return *v;
  }

  void convert_node(::onnx::GraphProto& gp, int i, Graph& g) {
    auto& np = *gp.mutable_node(i);
    std::string name = np.name().empty() ? cat(np.op_type(), "_", i) : np.name();
    std::string where = cat(src, ": [", np.op_type(), "] node '", name, "'");
    // QGemm and the QLinear ops, and MatMulNBits (its weight stays in 2/4/8-bit blocks).
    const bool contrib = np.domain() == "com.microsoft" &&
                         (qlinear::is_contrib_op(np.op_type()) || np.op_type() == "MatMulNBits");
    const bool expanded = is_expanded_contrib_op(np.domain(), np.op_type());
    const bool blocked = is_nchwc_op(np.domain(), np.op_type());
    const bool preview = is_preview_op(np.domain(), np.op_type());
    const bool ml = np.domain() == kMlDomain && is_ml_op(np.op_type());
    if (!is_default_domain(np.domain()) && !contrib && !expanded && !blocked && !preview && !ml)
      throw UnsupportedError(cat(where, ": operator domain '", np.domain(), "' is not supported",
                                 unsupported_domain_hint(np.domain(), np.op_type())));
    if (np.op_type().empty()) throw ValueError(cat(where, ": node has no op_type"));
    if (ml) check_ml_opset(np.op_type(), ml_opset, where);
    if (is_default_domain(np.domain()) && is_ml_op(np.op_type()))
      throw ValueError(cat(where, ": ", np.op_type(),
                           " is an op of domain ai.onnx.ml; the node "
                           "names the default domain"));
    std::vector<ValueId> inputs;
    for (const auto& in : np.input())
      inputs.push_back(in.empty() ? kNoValue : defined(g, in, where));
    // Subgraphs: the outer values any of them reads (the union, in order of first use, the
    // subgraphs taken in attribute-name order as Attributes keeps them, so that an exported and
    // re-imported node gets the same order) become the node's last inputs and every subgraph's
    // last inputs.
    std::map<std::string, const ::onnx::GraphProto*> by_name;
    for (const auto& a : np.attribute()) {
      if (a.type() == ::onnx::AttributeProto::GRAPHS || a.graphs_size())
        throw UnsupportedError(cat(where, " attribute '", a.name(),
                                   "': lists of subgraphs (GRAPHS) are not supported"));
      if (a.has_g()) by_name[a.name()] = &a.g();
    }
    std::vector<std::string> captured;
    std::unordered_set<std::string> seen;
    for (const auto& [key, sub] : by_name)
      for (const std::string& n : free_names(*sub))
        if (seen.insert(n).second) captured.push_back(n);
    std::vector<std::pair<std::string, TensorType>> captures;
    for (const std::string& n : captured) {
      const ValueId v = defined(g, n, cat(where, ": a subgraph's"));
      inputs.push_back(v);
      captures.emplace_back(n, g.value(v).type);
    }
    std::vector<ValueId> outputs;
    for (const auto& out : np.output()) {
      if (out.empty()) {
        outputs.push_back(kNoValue);
        continue;
      }
      if (g.find_value(out)) throw ValueError(cat(where, ": output '", out, "' is defined twice"));
      outputs.push_back(g.add_value(out));
    }
    Attributes attrs;
    for (auto& a : *np.mutable_attribute()) {
      if (a.name().empty()) throw ValueError(cat(where, ": an attribute has no name"));
      if (a.has_g() && (a.type() == ::onnx::AttributeProto::GRAPH ||
                        a.type() == ::onnx::AttributeProto::UNDEFINED)) {
        auto sub = std::make_shared<Graph>();
        try {
          convert_graph(*a.mutable_g(), *sub, captures);
        } catch (const InternalError&) {
          throw;
        } catch (const Error& e) {
          // The inner message starts with the file too: said once.
          std::string msg = e.what();
          if (msg.starts_with(src + ": ")) msg.erase(0, src.size() + 2);
          msg = cat(where, " subgraph '", a.name(), "': ", msg);
          if (dynamic_cast<const UnsupportedError*>(&e)) throw UnsupportedError(msg);
          if (dynamic_cast<const TypeError*>(&e)) throw TypeError(msg);
          throw ValueError(msg);
        }
        attrs.set(a.name(), GraphAttr(std::move(sub)));
        continue;
      }
      attrs.set(a.name(), attribute_from_proto(a, base_dir, where));
    }
    if (expanded) {  // `where` names the file already
      expand_contrib_op(g, np.op_type(), inputs, outputs, attrs, name, where);
      return;
    }
    if (preview) {
      expand_preview_op(g, np.op_type(), inputs, outputs, attrs, name, where);
      return;
    }
    if (blocked) {
      NchwcState& st = nchwc[&g];
      if (st.block == 0) st.block = nchwc_block_size(nchwc_convs(gp), src);
      expand_nchwc_op(g, st, np.op_type(), inputs, outputs, attrs, name, where);
      return;
    }
    try {
      Node& n =
          g.add_node(np.op_type(), std::move(inputs), std::move(outputs), std::move(attrs), name);
      if (contrib) {  // every com.microsoft op PyPTO reads is version 1 of that domain
        n.domain = np.domain();
        n.opset = 1;
      } else if (ml) {
        n.domain = np.domain();
        n.opset = static_cast<int>(ml_opset);
      }
    } catch (const UnsupportedError& e) {
      const bool unknown = !OpRegistry::global().find(np.op_type());
      throw UnsupportedError(
          cat(src, ": ", e.what(), unknown ? unknown_op_hint(producer, np.op_type()) : ""));
    }
  }
};

// `declared`: the top graph's value_info element types.
Graph convert(::onnx::ModelProto& m, const std::string& base_dir, const std::string& src,
              std::vector<std::pair<std::string, DType>>& declared) {
  Converter c{base_dir, src, default_opset(m, src), ml_opset(m), m.producer_name(), {}};
  inline_functions(m, src);
  Graph g;
  c.top = &g;
  c.convert_graph(*m.mutable_graph(), g, {});
  c.guesses.report(src);
  declared = std::move(c.declared);
  return g;
}

// value_info is a hint: where it names another element type than the value's node makes (as
// onnxconverter-common's fp16 conversion writes for some Casts, a file ONNX Runtime refuses to
// load), the node's type stands, with one warning.
void report_declared_types(const Graph& g, const std::vector<std::pair<std::string, DType>>& d,
                           const std::string& src) {
  int count = 0;
  std::string places;
  for (const auto& [name, dtype] : d) {
    const std::optional<ValueId> v = g.find_value(name);
    if (!v) continue;
    const DType made = g.value(*v).type.dtype;
    if (made == DType::kUndefined || made == dtype) continue;
    if (count++ < 3)
      places += cat(places.empty() ? "" : ", ", "'", name, "' ", dtype_name(dtype), " (made ",
                    dtype_name(made), ")");
  }
  if (count)
    log(LogLevel::kWarn,
        cat(src,
            ": value_info declares another element type than the node makes; the node's is "
            "used (ONNX Runtime refuses such a file): ",
            places, count > 3 ? ", ..." : "", " (", count, count == 1 ? " value)" : " values)"));
}

}  // namespace

int max_opset() {
  return PTO_ONNX_MAX_OPSET;
}

namespace {

[[noreturn]] void not_onnx(const std::string& source) {
  throw ValueError(cat(source,
                       ": not a valid ONNX model (protobuf parsing failed: the file "
                       "is truncated, corrupted or not ONNX)"));
}

void check_size(size_t bytes, const std::string& source) {
  if (bytes > static_cast<size_t>(std::numeric_limits<int>::max()))
    throw ValueError(cat(source, ": model is larger than 2 GB; store weights as external data"));
}

Graph load_model(::onnx::ModelProto& m, const std::string& base_dir, const std::string& source) {
  if (!m.has_graph()) throw ValueError(cat(source, ": the model has no graph"));
  std::vector<std::pair<std::string, DType>> declared;
  Graph g = convert(m, base_dir, source, declared);
  g.source = source;
  try {
    verify(g);
    infer_types(g);
  } catch (const InternalError&) {
    throw;
  } catch (const Error&) {
    rethrow_with(source + ": ");
  }
  report_declared_types(g, declared, source);
  return g;
}

}  // namespace

Graph load_from_bytes(std::string_view bytes, const std::string& base_dir,
                      const std::string& source) {
  check_size(bytes.size(), source);
  ::onnx::ModelProto m;
  if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) not_onnx(source);
  return load_model(m, base_dir, source);
}

// Parsed straight from the file (no copy of its bytes beside the parsed model).
Graph load(const std::string& path) {
  if (fs::is_directory(path)) throw ValueError(cat(path, ": is a folder, not an ONNX model file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ValueError(cat(path, ": cannot open the model file"));
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (!ec) check_size(size, path);
  ::onnx::ModelProto m;
  if (!m.ParseFromIstream(&in)) not_onnx(path);
  std::string dir = fs::absolute(fs::path(path)).parent_path().string();
  return load_model(m, dir, path);
}

namespace {

// A SequenceProto or OptionalProto (onnx-data.proto) of `type`, read field by field: that schema
// cannot be generated beside onnx.proto (it imports onnx-ml.proto, which defines the same
// messages). Both keep a tensor in field 3 (tensor_values, tensor_value) and an OptionalProto its
// sequence in field 5 (sequence_value).
Tensor value_from_bytes(const std::string& bytes, const TensorType& type, const std::string& dir,
                        const std::string& where) {
  if (type.is_tensor()) {
    ::onnx::TensorProto t;
    if (!t.ParseFromString(bytes)) throw ValueError(cat(where, ": not a valid TensorProto"));
    return tensor_from_proto(t, dir, where);
  }
  google::protobuf::UnknownFieldSet fields;
  if (!fields.ParseFromString(bytes))
    throw ValueError(
        cat(where, ": not a valid ", type.optional ? "OptionalProto" : "SequenceProto"));
  TensorType inner = type;
  (type.optional ? inner.optional : inner.sequence) = false;
  std::vector<Tensor> items;
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& f = fields.field(i);
    if (f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    if (f.number() == 3 && inner.is_tensor())
      items.push_back(value_from_bytes(f.length_delimited(), inner, dir, where));
    else if (f.number() == 5 && type.optional && inner.sequence)
      items.push_back(value_from_bytes(f.length_delimited(), inner, dir, where));
    else if (f.number() != 1)  // 1 is the name
      throw UnsupportedError(cat(where, ": field ", f.number(), " of a ", type.str(),
                                 " (only tensors, sequences of tensors and optionals of these)"));
  }
  if (type.sequence && !type.optional) return Tensor::sequence(std::move(items));
  if (items.size() > 1)
    throw ValueError(cat(where, ": an optional with ", items.size(), " values"));
  return items.empty() ? Tensor::none() : items[0];
}

}  // namespace

Tensor load_value(const std::string& path, const TensorType& type) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ValueError(cat(path, ": cannot open the value file"));
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string dir = fs::absolute(fs::path(path)).parent_path().string();
  return value_from_bytes(ss.str(), type, dir, path);
}

Tensor load_tensor(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ValueError(cat(path, ": cannot open the tensor file"));
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string bytes = ss.str();
  ::onnx::TensorProto t;
  if (!t.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    throw ValueError(cat(path, ": not a valid serialized TensorProto"));
  std::string dir = fs::absolute(fs::path(path)).parent_path().string();
  return tensor_from_proto(t, dir, path);
}

}  // namespace pto::onnx
