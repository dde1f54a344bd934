// Tensor Graph -> ONNX ModelProto, the inverse of importer.cpp. Values keep their names (empty or
// repeated ones get generated, deterministic names); types become ValueInfos with symbolic dims
// as dim_param; initializers that a node or a graph output reads become little-endian raw_data
// TensorProtos (unused ones are dropped); attributes map one to one from the variant. ONNX has one
// opset per domain, so a node's opset becomes its domain's.
#include <algorithm>
#include <bit>
#include <fstream>
#include <limits>
#include <map>
#include <tuple>
#include <unordered_set>

#include "ir/ops/control_flow.h"
#include "ir/ops/op_params.h"
#include "proto_util.h"
#include "pto/onnx.h"
#include "pto/op_registry.h"

namespace pto::onnx {
namespace {

static_assert(std::endian::native == std::endian::little,
              "raw_data is little-endian; a big-endian host needs a byte swap here");

// The default-domain opset for a graph that names none (built in C++, not imported): the newest
// the schema knows, which is what the reference kernels assume for opset 0, but no newer than
// onnxruntime 1.32 (the test environment's) loads: it accepts 28 and refuses 29.
constexpr int kNewestExportOpset = 28;

bool is_default_domain(const std::string& d) {
  return d.empty() || d == "ai.onnx";
}

// The IR version of the onnx release that introduced `opset` (onnx.helper.VERSION_TABLE), so
// older runtimes can load what we write. At least 4: IR 3 required every initializer to be a
// graph input as well.
int64_t ir_version_for(int opset) {
  static constexpr std::pair<int, int64_t> kFirstIr[] = {
      {9, 4},   {10, 5},  {11, 6},  {12, 7},  {15, 8},  {19, 9},
      {21, 10}, {23, 11}, {24, 12}, {25, 13}, {28, 14},
  };
  int64_t ir = 4;
  for (const auto& [first_opset, version] : kFirstIr)
    if (opset >= first_opset) ir = version;
  return std::min<int64_t>(ir, ::onnx::IR_VERSION);
}

// The default-domain opset that introduced an op PyPTO's passes make (they say opset 0, "the
// latest"): BERT exported at opset 17 gains an Attention, which ONNX has from opset 23 only, so
// the file must say 23 or ONNX Runtime refuses it. 0 for every other op.
int introduced_in(const std::string& op) {
  static const std::map<std::string, int, std::less<>> kNewOps = {
      {"LayerNormalization", 17}, {"Gelu", 20}, {"Attention", 23}, {"RMSNormalization", 23},
      {"RotaryEmbedding", 23},
  };
  auto it = kNewOps.find(op);
  return it == kNewOps.end() ? 0 : it->second;
}

// The newest default-domain opset that an opset-0 node of `g` or of its subgraphs needs.
int newest_needed(const Graph& g) {
  int need = 0;
  for (const Node& n : g.nodes()) {
    if (is_default_domain(n.domain) && n.opset == 0) need = std::max(need, introduced_in(n.op));
    for (const auto& [key, a] : n.attrs.all())
      if (const auto* sub = std::get_if<GraphAttr>(&a); sub && *sub)
        need = std::max(need, newest_needed(**sub));
  }
  return need;
}

// Domain ("" for the default one) -> opset. Nodes that say opset 0 take their domain's opset;
// a domain none of whose nodes says gets g.opset (default domain) or 1. The default domain is
// raised to what the passes' new ops need; graph_to_proto upgrades the older nodes.
std::map<std::string, int> domain_opsets(const Graph& g) {
  std::map<std::string, const Node*> first;  // the first node with a nonzero opset, per domain
  std::map<std::string, int> out = {{"", 0}};
  for (const Node& n : g.nodes()) {
    std::string d = is_default_domain(n.domain) ? "" : n.domain;
    int& opset = out[d];
    if (n.opset == 0) continue;
    if (opset == 0) {
      opset = n.opset;
      first[d] = &n;
    } else if (opset != n.opset) {
      throw UnsupportedError(cat(n.where(), ": opset ", n.opset, " of domain '", d,
                                 "' differs from opset ", opset, " of node '", first[d]->name,
                                 "'; an ONNX model has one opset per domain"));
    }
  }
  for (auto& [d, opset] : out)
    if (opset == 0)
      opset = !d.empty() ? 1 : g.opset ? g.opset : std::min(max_opset(), kNewestExportOpset);
  out[""] = std::max(out[""], newest_needed(g));
  return out;
}

// Whether the file needs an opset of the default domain: not for a graph imported without one
// whose nodes are all of other domains (a classifier of ai.onnx.ml alone), which then reads back
// as it was.
bool uses_default_domain(const Graph& g) {
  for (const Node& n : g.nodes()) {
    if (is_default_domain(n.domain)) return true;
    for (const auto& [key, a] : n.attrs.all())
      if (const auto* sub = std::get_if<GraphAttr>(&a); sub && *sub && uses_default_domain(**sub))
        return true;
  }
  return false;
}
bool imports_default_domain(const Graph& g) {
  return g.opset != 0 || g.nodes().empty() || uses_default_domain(g);
}

// A node imported at an older opset than the one its graph is written at (domain_opsets raised
// it) in the newer form: the attribute that became input 1 (Reduce*'s axes at opset 18), or ""
// when none did. The IR reads both forms, so only the file changes. GridSample's mode names are
// renamed where written. Forms older than opset 13 (the attributes of Clip, Pad, Slice, Squeeze,
// Split, TopK ...) and GroupNormalization's change of meaning are not rewritten: an error.
std::string attribute_made_input(const Node& n, int to) {
  if (!is_default_domain(n.domain) || n.opset == 0 || n.opset >= to) return "";
  if (n.opset < 13)
    throw UnsupportedError(cat("onnx export: ", n.where(), " is opset ", n.opset,
                               ", but the graph is written at opset ", to, " for the ops ",
                               "PyPTO's passes made (Attention needs 23, Gelu 20); nodes older ",
                               "than opset 13 are not raised: convert the model to opset 13 or ",
                               "newer first (onnx.version_converter)"));
  if (n.op == "GroupNormalization" && n.opset < 21 && to >= 21)
    throw UnsupportedError(cat("onnx export: ", n.where(), ": GroupNormalization's scale and ",
                               "bias changed meaning at opset 21; it cannot be raised from opset ",
                               n.opset, " to ", to));
  const bool reduce = n.op.starts_with("Reduce") && n.op != "ReduceSum";
  return reduce && n.opset < 18 && to >= 18 && n.attrs.has("axes") ? "axes" : "";
}

// One unique, non-empty name per value, in value order: its own when free, else "<name>_<k>" (a
// repeated name) or "v<id>" (an empty one), skipping names any value already holds.
// One ONNX name per value. `fixed` names some values first (a subgraph's captures take the names
// of the outer values they stand for).
std::vector<std::string> unique_names(const Graph& g,
                                      const std::unordered_map<ValueId, std::string>& fixed = {}) {
  const auto& values = g.values();
  std::vector<std::string> names(values.size());
  std::unordered_set<std::string> taken;
  for (const auto& [v, name] : fixed) names[v] = name, taken.insert(name);
  for (size_t i = 0; i < values.size(); ++i)
    if (names[i].empty())
      if (!values[i].name.empty() && taken.insert(values[i].name).second) names[i] = values[i].name;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!names[i].empty()) continue;
    std::string base = values[i].name.empty() ? cat("v", i) : values[i].name;
    std::string name = base;
    for (int k = 1; !taken.insert(name).second; ++k) name = cat(base, "_", k);
    names[i] = std::move(name);
  }
  return names;
}

void type_to_proto(const TensorType& t, ::onnx::TypeProto& tp) {
  if (t.optional) {  // optional(tensor) or optional(seq(tensor)): the type inside, wrapped
    TensorType inner = t;
    inner.optional = false;
    return type_to_proto(inner, *tp.mutable_optional_type()->mutable_elem_type());
  }
  if (t.sequence) {
    TensorType element = t;
    element.sequence = false;
    return type_to_proto(element, *tp.mutable_sequence_type()->mutable_elem_type());
  }
  auto* tt = tp.mutable_tensor_type();
  if (t.dtype != DType::kUndefined) tt->set_elem_type(onnx_code(t.dtype));
  if (!t.shape) return;               // unknown rank: no shape field
  auto* shape = tt->mutable_shape();  // present even for a scalar (rank 0)
  for (const Dim& d : *t.shape) {
    auto* dim = shape->add_dim();
    if (d.is_known())
      dim->set_dim_value(d.value);
    else if (d.is_symbolic())
      dim->set_dim_param(d.symbol);
    // unknown: an empty Dimension
  }
}

void type_to_proto(const TensorType& t, ::onnx::ValueInfoProto& vi) {
  if (t.is_tensor() && t.dtype == DType::kUndefined && !t.shape)
    return;  // untyped, as the importer reads it
  type_to_proto(t, *vi.mutable_type());
}

void tensor_to_proto(const Tensor& t, const std::string& where, ::onnx::TensorProto& p) {
  if (!t.defined() || t.dtype() == DType::kUndefined)
    throw UnsupportedError(cat(where, ": an undefined tensor has no ONNX form"));
  p.set_data_type(onnx_code(t.dtype()));
  for (int64_t d : t.shape()) p.add_dims(d);
  Tensor c = t.contiguous();
  // raw_data is set even when empty, so a zero-element tensor still reads back as raw data.
  // 4- and 2-bit types are packed (one element per byte in memory).
  std::string* raw = p.mutable_raw_data();
  raw->assign(packed_nbytes(c.dtype(), c.numel()), '\0');
  if (!raw->empty())
    pack_elements(c.dtype(), c.raw_data(), c.numel(), reinterpret_cast<uint8_t*>(raw->data()));
}

void attribute_to_proto(const std::string& name, const Attribute& a, const std::string& where,
                        ::onnx::AttributeProto& p) {
  using AP = ::onnx::AttributeProto;
  p.set_name(name);
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          p.set_type(AP::INT), p.set_i(x);
        } else if constexpr (std::is_same_v<T, double>) {
          p.set_type(AP::FLOAT), p.set_f(static_cast<float>(x));
        } else if constexpr (std::is_same_v<T, std::string>) {
          p.set_type(AP::STRING), p.set_s(x);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          p.set_type(AP::INTS);
          for (int64_t i : x) p.add_ints(i);
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          p.set_type(AP::FLOATS);
          for (double f : x) p.add_floats(static_cast<float>(f));
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          p.set_type(AP::STRINGS);
          for (const auto& s : x) p.add_strings(s);
        } else if constexpr (std::is_same_v<T, GraphAttr>) {
          (void)x;  // written by graph_to_proto, which knows the outer names of the captures
          throw InternalError(cat(where, " attribute '", name, "': a subgraph outside a node"));
        } else {
          static_assert(std::is_same_v<T, Tensor>, "a new Attribute kind needs a case here");
          p.set_type(AP::TENSOR);
          tensor_to_proto(x, cat(where, " attribute '", name, "'"), *p.mutable_t());
        }
      },
      a);
}

// PyPTO's precision="bf16x3" on a MatMul, Gemm or Conv (MatMulPrecision, ConvPrecision) is not
// ONNX: the file splits A and B (a Conv's X and W) into bf16 heads, Cast(Cast(x, bfloat16),
// float), and tails, the same of x - head, and sums the three products the op sums,
// (Ah Bh) + ((Al Bh) + (Ah Bl)); a Gemm's C (beta) and a Conv's bias go with the first, the other
// attributes (alpha, transposes; strides, pads, groups) with all three.
void split_products_to_proto(const Node& n, const std::vector<std::string>& names,
                             std::unordered_set<std::string>& taken, ::onnx::GraphProto& gp) {
  const std::string base = n.name.empty() ? n.op : n.name;
  auto add = [&](const std::string& op, std::vector<std::string> ins, std::string out = "") {
    auto* p = gp.add_node();
    p->set_op_type(op);
    std::string name = cat(base, "/bf16x3/", op);
    while (!taken.insert(name).second) name += "_";
    p->set_name(name);
    for (const std::string& i : ins) p->add_input(i);
    p->add_output(out.empty() ? name : out);  // the node's fresh name, or the op's output
    return p;
  };
  auto cast = [&](const std::string& x, int64_t to) {
    auto* p = add("Cast", {x});
    auto* a = p->add_attribute();
    a->set_name("to");
    a->set_type(::onnx::AttributeProto::INT);
    a->set_i(to);
    return p->output(0);
  };
  auto round = [&](const std::string& x) {
    return cast(cast(x, onnx_code(DType::kBF16)), onnx_code(DType::kF32));
  };
  std::string head[2], tail[2];
  for (int i = 0; i < 2; ++i) {
    head[i] = round(names[n.inputs[i]]);
    tail[i] = round(add("Sub", {names[n.inputs[i]], head[i]})->output(0));
  }
  const bool has_c = n.op != "MatMul" && n.inputs.size() > 2 && n.inputs[2] != kNoValue;
  auto product = [&](const std::string& a, const std::string& b, bool with_c) {
    std::vector<std::string> ins{a, b};
    if (with_c) ins.push_back(names[n.inputs[2]]);
    auto* p = add(n.op, ins);
    for (const auto& [key, v] : n.attrs.all())
      if (key != "precision" && (with_c || key != "beta"))
        attribute_to_proto(key, v, n.where(), *p->add_attribute());
    return p->output(0);
  };
  const std::string hh = product(head[0], head[1], has_c), lh = product(tail[0], head[1], false),
                    hl = product(head[0], tail[1], false);
  add("Add", {hh, add("Add", {lh, hl})->output(0)}, names[n.outputs[0]]);
}

// `capture_names`: for a subgraph, the outer names of its captures, which are not written as
// inputs: ONNX subgraphs read outer values by name.
// `opset`: the default domain's, which nodes of an older one are written in the form of.
void graph_to_proto(const Graph& g, ::onnx::GraphProto& gp, int opset,
                    const std::vector<std::string>& capture_names = {}) {
  const size_t first_capture = g.inputs().size() - capture_names.size();
  std::unordered_map<ValueId, std::string> fixed;
  for (size_t i = 0; i < capture_names.size(); ++i)
    fixed[g.inputs()[first_capture + i]] = capture_names[i];
  const std::vector<std::string> names = unique_names(g, fixed);
  auto name_of = [&](ValueId v) { return v == kNoValue ? std::string() : names[v]; };
  gp.set_name(g.name.empty() ? "pypto_graph" : g.name);

  for (ValueId v : g.inputs()) {
    if (fixed.count(v)) continue;
    auto* vi = gp.add_input();
    vi->set_name(names[v]);
    type_to_proto(g.value(v).type, *vi);
  }
  // Only initializers something reads: a captured module's unused buffers (BatchNorm's
  // num_batches_tracked) would otherwise be written, and ONNX checkers warn about them.
  std::vector<bool> used(names.size(), false);
  for (const Node& n : g.nodes())
    for (ValueId v : n.inputs)
      if (v != kNoValue) used[v] = true;
  for (ValueId v : g.outputs()) used[v] = true;
  for (ValueId v = 0; v < static_cast<ValueId>(names.size()); ++v) {  // in value order: stable
    const Tensor* t = g.initializer(v);
    if (g.is_released(v) && used[v])
      throw ValueError(cat("onnx export: initializer '", names[v], "' was released after ",
                           "packing; export the Executable's graph_with_weights()"));
    if (!t || !used[v]) continue;
    auto* p = gp.add_initializer();
    p->set_name(names[v]);
    tensor_to_proto(*t, cat("initializer '", names[v], "'"), *p);
  }
  std::unordered_set<std::string> taken(names.begin(), names.end());
  // An int64 initializer the file needs but the graph holds as an attribute; returns its name.
  auto add_ints = [&](std::string name, const std::vector<int64_t>& values) {
    while (!taken.insert(name).second) name += "_";
    Tensor t = Tensor::empty(DType::kI64, {static_cast<int64_t>(values.size())});
    std::copy(values.begin(), values.end(), t.data<int64_t>());
    auto* ip = gp.add_initializer();
    ip->set_name(name);
    tensor_to_proto(t, cat("initializer '", name, "'"), *ip);
    return name;
  };
  for (const Node& n : g.nodes()) {
    if (n.domain.empty() && params::split_bf16_products(n)) {
      split_products_to_proto(n, names, taken, gp);
      continue;
    }
    // PyPTO's precision="bf16" / "f16" on MatMul/Gemm/Conv/Attention (AutoMixedPrecision) is not
    // ONNX: each product operand goes through Cast(to=bfloat16 or float16) and Cast(to=float)
    // instead, which rounds it the same way (Attention's probabilities excepted: op_params.h).
    const bool reduced =
        n.domain.empty() && params::has_precision_attr(n.op) && n.attrs.has("precision");
    const std::optional<DType> precision = params::product_precision(n);
    if (reduced && !precision)
      throw ValueError(cat("onnx export: ", n.where(), " has precision '",
                           n.attrs.get_string("precision"), "', which has no ONNX form"));
    const std::string h = reduced ? params::product_precision_name(*precision) : "";
    std::vector<std::string> inputs;
    // A control-flow node's captures are not ONNX inputs: its subgraphs name them.
    const size_t captures = static_cast<size_t>(control_flow::num_captures(n));
    std::vector<std::string> outer;
    for (size_t i = n.inputs.size() - captures; i < n.inputs.size(); ++i)
      outer.push_back(name_of(n.inputs[i]));
    for (size_t i = 0; i + captures < n.inputs.size(); ++i) {
      std::string in = name_of(n.inputs[i]);
      // Attention's products read Q, K, V (one input under qkv_split) and a cache's past K and
      // V (inputs 4 and 5).
      const bool qkv = i == 0 || ((i == 1 || i == 2) && !n.attrs.has("qkv_split"));
      const bool operand = n.op == "Attention" ? qkv || i == 4 || i == 5 : i < 2;
      if (reduced && operand && n.inputs[i] != kNoValue) {
        std::string half = cat(in, "_", h), rounded = cat(in, "_", h, "f");
        while (!taken.insert(half).second) half += "_";
        while (!taken.insert(rounded).second) rounded += "_";
        for (auto [from, to, dtype] : {std::tuple{in, half, onnx_code(*precision)},
                                       std::tuple{half, rounded, 1}}) {  // FLOAT
          auto* cp = gp.add_node();
          cp->set_op_type("Cast");
          cp->set_name(
              cat(n.name.empty() ? "node" : n.name, "/", h, "_", i, dtype == 1 ? "_f" : ""));
          cp->add_input(from);
          cp->add_output(to);
          auto* at = cp->add_attribute();
          at->set_name("to");
          at->set_type(::onnx::AttributeProto::INT);
          at->set_i(dtype);
        }
        in = rounded;
      }
      inputs.push_back(in);
    }
    // PyPTO's qkv_split on Attention (FoldAttentionHeads: Q, K and V read in place from one
    // input) is not ONNX: a Split on the last axis makes the three inputs of the 3-D form again.
    const bool packed_qkv = n.domain.empty() && n.op == "Attention" && n.attrs.has("qkv_split");
    if (packed_qkv) {
      const std::string base = n.name.empty() ? "attention" : n.name;
      const std::string sizes = add_ints(cat(base, "/qkv_split"), n.attrs.get_ints("qkv_split"));
      auto* sp = gp.add_node();
      sp->set_op_type("Split");
      sp->set_name(cat(base, "/qkv_split"));
      sp->add_input(inputs[0]);
      sp->add_input(sizes);
      for (size_t i = 0; i < 3; ++i) {
        std::string part = cat(base, "/", "qkv"[i]);
        while (!taken.insert(part).second) part += "_";
        sp->add_output(part);
        inputs[i] = part;
      }
      auto* ap = sp->add_attribute();
      ap->set_name("axis");
      ap->set_type(::onnx::AttributeProto::INT);
      ap->set_i(-1);
    }
    // Nodes the exporter adds in front of an Attention to make its inputs ONNX's: named after the
    // node, their outputs fresh names.
    const std::string att_base = n.name.empty() ? "attention" : n.name;
    auto fresh = [&](std::string name) {
      while (!taken.insert(name).second) name += "_";
      return name;
    };
    auto node = [&](const std::string& base, const std::string& op, std::vector<std::string> ins,
                    std::vector<std::pair<std::string, int64_t>> ints) {
      auto* p = gp.add_node();
      p->set_op_type(op);
      p->set_name(fresh(cat(base, "/", op)));
      for (const std::string& i : ins) p->add_input(i);
      const std::string out = fresh(cat(base, "/", op));
      p->add_output(out);
      for (const auto& [key, v] : ints) {
        auto* a = p->add_attribute();
        a->set_name(key);
        a->set_type(::onnx::AttributeProto::INT);
        a->set_i(v);
      }
      return out;
    };
    const bool has_mask =
        n.domain.empty() && n.op == "Attention" && n.inputs.size() > 3 && n.inputs[3] != kNoValue;
    // PyPTO's mask_broadcast (the mask's last axis broadcasts, where ONNX pads a shorter one) is
    // not ONNX: the file expands the mask's last axis to the keys' count (K's axis -2, in the 4-D
    // and the 3-D form), which fails where the mask would not broadcast, as the kernel does.
    const bool mask_broadcast = has_mask && n.attrs.get_int("mask_broadcast", 0) != 0;
    if (mask_broadcast) {
      const std::string base = cat(att_base, "/mask_keys");
      const std::string lead = node(base, "Shape", {inputs[3]}, {{"end", -1}});
      const std::string keys = node(base, "Shape", {inputs[1]}, {{"start", -2}, {"end", -1}});
      const std::string shape = node(base, "Concat", {lead, keys}, {{"axis", 0}});
      inputs[3] = node(base, "Expand", {inputs[3], shape}, {});
    }
    // A mask with one row for every query ([batch, 1, 1, keys]: a padding mask) is ONNX
    // (broadcast to [batch, heads, queries, keys]) and PyPTO's kernels read it as is, but
    // onnxruntime's Attention wants the query axis of the mask to be Q's sequence length when Q
    // is 3-D ([batch, seq, hidden]): the file expands the mask's rows to it there.
    if (has_mask) {
      const auto& mask = g.value(n.inputs[3]).type.shape;
      const auto& q = g.value(n.inputs[0]).type.shape;
      const int64_t q_rank = q ? static_cast<int64_t>(q->size()) : 0;
      const bool packed_q = packed_qkv || q_rank == 3;
      const Dim* q_seq = !q ? nullptr : packed_q ? &(*q)[1] : q_rank == 4 ? &(*q)[2] : nullptr;
      if (packed_q && mask && mask->size() >= 2 && (*mask)[mask->size() - 2] == Dim(1) && q_seq &&
          !(*q_seq == Dim(1))) {
        const std::string base = cat(att_base, "/mask_rows");
        const int64_t seq_axis = packed_q ? 1 : 2;
        const std::string seq =
            node(base, "Shape", {inputs[0]}, {{"start", seq_axis}, {"end", seq_axis + 1}});
        const std::string lead = node(base, "Shape", {inputs[3]}, {{"end", -2}});
        const std::string last = node(base, "Shape", {inputs[3]}, {{"start", -1}});
        const std::string shape = node(base, "Concat", {lead, seq, last}, {{"axis", 0}});
        inputs[3] = node(base, "Expand", {inputs[3], shape}, {});
      }
    }
    const std::string moved = attribute_made_input(n, opset);
    if (!moved.empty())
      inputs.push_back(
          add_ints(cat(n.name.empty() ? n.op : n.name, "/", moved), n.attrs.get_ints(moved)));
    const bool renamed_modes = n.op == "GridSample" && n.opset != 0 && n.opset < 20 && opset >= 20;
    auto* np = gp.add_node();
    np->set_op_type(n.op);
    if (!n.name.empty()) np->set_name(n.name);
    if (!is_default_domain(n.domain)) np->set_domain(n.domain);
    for (const std::string& in : inputs) np->add_input(in);
    for (ValueId v : n.outputs) np->add_output(name_of(v));
    for (const auto& [key, a] : n.attrs.all()) {
      if ((reduced && key == "precision") || (packed_qkv && key == "qkv_split") || key == moved ||
          (n.op == "Attention" && key == "mask_broadcast"))
        continue;
      auto* ap = np->add_attribute();
      if (const auto* sub = std::get_if<GraphAttr>(&a); sub && *sub) {
        ap->set_name(key);
        ap->set_type(::onnx::AttributeProto::GRAPH);
        graph_to_proto(**sub, *ap->mutable_g(), opset, outer);
      } else if (const AttrDef* d = n.def->attrs.find(key); d && d->kind == AttrKind::kType) {
        ap->set_name(key);  // a type attribute (Optional's) is a TypeProto in ONNX
        ap->set_type(::onnx::AttributeProto::TYPE_PROTO);
        type_to_proto(parse_type(std::get<std::string>(a)), *ap->mutable_tp());
      } else if (renamed_modes && key == "mode") {  // opset 20 renamed bilinear and bicubic
        const std::string& mode = std::get<std::string>(a);
        attribute_to_proto(key,
                           mode == "bilinear"  ? "linear"
                           : mode == "bicubic" ? "cubic"
                                               : mode,
                           n.where(), *ap);
      } else {
        attribute_to_proto(key, a, n.where(), *ap);
      }
    }
  }
  std::unordered_set<ValueId> is_output;
  for (ValueId v : g.outputs()) {
    auto* vi = gp.add_output();
    vi->set_name(names[v]);
    type_to_proto(g.value(v).type, *vi);
    is_output.insert(v);
  }
  // Types of intermediate values: inferred once here, they spare other tools a re-inference.
  for (const Node& n : g.nodes()) {
    for (ValueId v : n.outputs) {
      if (v == kNoValue || is_output.count(v) || g.value(v).type.dtype == DType::kUndefined)
        continue;
      auto* vi = gp.add_value_info();
      vi->set_name(names[v]);
      type_to_proto(g.value(v).type, *vi);
    }
  }
}

}  // namespace

std::string save_to_bytes(const Graph& g) {
  verify(g);
  ::onnx::ModelProto m;
  const std::map<std::string, int> opsets = domain_opsets(g);
  m.set_ir_version(ir_version_for(opsets.at("")));
  m.set_producer_name("pypto");
  for (const auto& [domain, version] : opsets) {
    if (domain.empty() && !imports_default_domain(g)) continue;
    auto* o = m.add_opset_import();
    o->set_domain(domain);
    o->set_version(version);
  }
  graph_to_proto(g, *m.mutable_graph(), opsets.at(""));
  if (m.ByteSizeLong() > static_cast<size_t>(std::numeric_limits<int>::max()))
    throw UnsupportedError(cat("graph '", g.name, "': the model exceeds protobuf's 2 GB limit ",
                               "and saving weights as external data is not supported yet"));
  return m.SerializeAsString();
}

void save(const Graph& g, const std::string& path) {
  std::string bytes;
  try {
    bytes = save_to_bytes(g);
  } catch (const InternalError&) {
    throw;
  } catch (const Error&) {
    rethrow_with(path + ": ");
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw ValueError(cat(path, ": cannot open the file for writing"));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw ValueError(cat(path, ": writing the model failed"));
}

}  // namespace pto::onnx
