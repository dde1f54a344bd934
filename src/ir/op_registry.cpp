#include "pto/op_registry.h"

#include <charconv>
#include <iterator>
#include <type_traits>
#include <variant>

namespace pto {

const TensorType& InferContext::input(size_t i) const {
  if (!has_input(i)) throw ValueError(cat(where(), ": required input ", i, " is missing"));
  return inputs[i];
}

const char* attr_kind_name(AttrKind k) {
  switch (k) {
    case AttrKind::kInt:
      return "int";
    case AttrKind::kFloat:
      return "float";
    case AttrKind::kString:
      return "string";
    case AttrKind::kInts:
      return "ints";
    case AttrKind::kFloats:
      return "floats";
    case AttrKind::kStrings:
      return "strings";
    case AttrKind::kTensor:
      return "tensor";
    case AttrKind::kGraph:
      return "graph";
    case AttrKind::kDType:
      return "dtype";
    case AttrKind::kType:
      return "type";
    case AttrKind::kBool:
      return "bool";
  }
  return "?";
}

namespace {

// The kind of a value, in the order of Attribute's alternatives.
AttrKind kind_of(const Attribute& a) {
  static constexpr AttrKind kKinds[] = {AttrKind::kInt,    AttrKind::kFloat,  AttrKind::kString,
                                        AttrKind::kInts,   AttrKind::kFloats, AttrKind::kStrings,
                                        AttrKind::kTensor, AttrKind::kGraph};
  static_assert(std::size(kKinds) == std::variant_size_v<Attribute>);
  return kKinds[a.index()];
}

bool is_list(AttrKind k) {
  return k == AttrKind::kInts || k == AttrKind::kFloats || k == AttrKind::kStrings;
}

bool is_empty_list(const Attribute& a) {
  return std::visit(
      [](const auto& v) {
        if constexpr (requires { v.empty(); } &&
                      !std::is_same_v<std::decay_t<decltype(v)>, std::string>)
          return v.empty();
        else
          return false;
      },
      a);
}

// Whether a value of kind `given` may stand for an attribute of kind `want`: the same kind; an int
// for a float or a dtype code; a type name for a dtype; an empty list for any list (an empty list
// written in text or Python has no element type).
bool fits(AttrKind want, const Attribute& value) {
  const AttrKind given = kind_of(value);
  if (given == want) return true;
  switch (want) {
    case AttrKind::kFloat:
      return given == AttrKind::kInt;
    case AttrKind::kDType:
      return given == AttrKind::kInt || given == AttrKind::kString;
    case AttrKind::kBool:
      return given == AttrKind::kInt;
    case AttrKind::kType:
      return given == AttrKind::kString;
    default:
      return is_list(want) && is_list(given) && is_empty_list(value);
  }
}

}  // namespace

AttrDef::AttrDef(std::string name_, Attribute default_value_, std::string doc_)
    : name(std::move(name_)),
      kind(kind_of(default_value_)),
      use(AttrUse::kDefault),
      default_value(std::move(default_value_)),
      doc(std::move(doc_)) {}

AttrDef::AttrDef(std::string name_, AttrKind kind_, AttrUse use_, std::string doc_)
    : name(std::move(name_)), kind(kind_), use(use_), doc(std::move(doc_)) {
  PTO_CHECK(use != AttrUse::kDefault) << "attribute '" << name << "': a default needs a value";
}

const AttrDef* AttrSchema::find(std::string_view name) const {
  for (const AttrDef& d : defs_)
    if (d.name == name) return &d;
  return nullptr;
}

AttrSchema AttrSchema::with(std::initializer_list<AttrDef> more) const {
  std::vector<AttrDef> defs = defs_;
  defs.insert(defs.end(), more.begin(), more.end());
  return AttrSchema(std::move(defs));
}

std::string attr_schema_str(const AttrSchema& s) {
  if (!s.declared()) return "?";
  if (s.defs().empty()) return "-";
  std::string out;
  for (const AttrDef& d : s.defs()) {
    out += out.empty() ? "" : ", ";
    switch (d.use) {
      case AttrUse::kDefault: {
        // A double default is the kernels' constant, not a float ONNX stored: its shortest form.
        const double* x = std::get_if<double>(&d.default_value);
        char buf[32];
        out += cat(d.name, "=",
                   x ? std::string(buf, std::to_chars(buf, buf + sizeof buf, *x).ptr)
                     : attribute_str(d.default_value));
        break;
      }
      case AttrUse::kRequired:
        out += cat(d.name, " (required)");
        break;
      case AttrUse::kOptional:
        out += cat(d.name, " (optional)");
        break;
    }
  }
  return out;
}

void check_tensor_values(const Graph& g, const Node& n) {
  if (!n.def || n.def->has(kNonTensorValues)) return;
  auto check = [&](const std::vector<ValueId>& ids, const char* what) {
    for (ValueId v : ids)
      if (v != kNoValue && !g.value(v).type.is_tensor())
        throw UnsupportedError(cat(n.where(), ": ", what, " '", g.value(v).name, "' is ",
                                   g.value(v).type.kind_name(), " (", g.value(v).type.str(),
                                   "); the op takes and makes tensors only"));
  };
  check(n.inputs, "input");
  check(n.outputs, "output");
}

void check_attributes(const Node& n) {
  if (!n.def || !n.def->attrs.declared()) return;
  const AttrSchema& schema = n.def->attrs;
  for (const auto& [name, value] : n.attrs.all()) {
    const AttrDef* d = schema.find(name);
    if (!d) {
      std::string accepted;
      for (const AttrDef& a : schema.defs()) accepted += cat(accepted.empty() ? "" : ", ", a.name);
      throw ValueError(cat(n.where(), ": unrecognized attribute '", name, "' for operator ", n.op,
                           "; it accepts ", accepted.empty() ? "no attributes" : accepted));
    }
    if (!fits(d->kind, value))
      throw ValueError(cat(n.where(), ": attribute '", name, "' of operator ", n.op,
                           " should be of kind ", attr_kind_name(d->kind), ", got ",
                           attr_kind_name(kind_of(value))));
    if (d->kind == AttrKind::kBool) {
      const int64_t v = std::get<int64_t>(value);
      if (v != 0 && v != 1)
        throw ValueError(cat(n.where(), ": attribute '", name, "' of operator ", n.op,
                             " is a boolean and must be 0 or 1, got ", v));
    }
  }
  for (const AttrDef& d : schema.defs())
    if (d.use == AttrUse::kRequired && !n.attrs.has(d.name))
      throw ValueError(cat(n.where(), ": required attribute '", d.name, "' (",
                           attr_kind_name(d.kind), ") of operator ", n.op, " is missing"));
}

OpRegistry& OpRegistry::global() {
  static OpRegistry* registry = [] {
    auto* r = new OpRegistry();
    register_elementwise_ops(*r);
    register_nn_ops(*r);
    register_tensor_ops(*r);
    register_reduction_ops(*r);
    register_indexing_ops(*r);
    register_attention_ops(*r);
    register_quantization_ops(*r);
    register_loss_ops(*r);
    register_image_ops(*r);
    register_signal_ops(*r);
    register_recurrent_ops(*r);
    register_control_flow_ops(*r);
    register_sequence_ops(*r);
    register_ml_ops(*r);
    return r;
  }();
  return *registry;
}

void OpRegistry::add(OpDef def) {
  def.id = static_cast<int32_t>(defs_.size());
  const std::string name = def.name;
  defs_.add(name, std::move(def));
}

const OpDef& OpRegistry::by_id(int32_t id) const {
  PTO_CHECK(id >= 0) << "no op with id " << id;
  return defs_.at(static_cast<size_t>(id));
}

}  // namespace pto
