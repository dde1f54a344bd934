// The text form of a Tensor Graph: stable (attributes sorted, values in order) so two dumps diff,
// and exact, so that parse_graph (parser.cpp) reads it back: value names that are not plain are
// quoted, float attributes print their shortest exact decimal, and constants of at most
// kInlineElements elements print their data.
#include <charconv>
#include <cmath>
#include <sstream>

#include "pto/graph.h"

namespace pto {

std::string tensor_data_str(const Tensor& t);

namespace {

// Constants (and tensor attributes) this small print their data inline.
constexpr int64_t kInlineElements = 16;

bool is_plain_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == ':' ||
         c == '/' || c == '@' || c == '+' || c == '-' || c == '%';
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// A value reference: %name, or %"name" when the name has characters the parser stops at.
std::string ref_name(const std::string& name) {
  bool plain = !name.empty() && name.back() != ':';
  for (char c : name) plain = plain && is_plain_char(c);
  return "%" + (plain ? name : quoted(name));
}

// A float attribute. ONNX attributes are single precision, so a value a float holds exactly prints
// as the shortest decimal of that float ("1e-05", not "9.999999747378752e-06") and reads back
// through float; any other double prints its shortest exact decimal with a "d" suffix
// ("0.1d"). Always marked as a float ("1.0"), so that it never reads back as an int.
std::string float_str(double x) {
  char buf[64];
  const bool single = std::isnan(x) || static_cast<double>(static_cast<float>(x)) == x;
  auto r = single ? std::to_chars(buf, buf + sizeof(buf), static_cast<float>(x))
                  : std::to_chars(buf, buf + sizeof(buf), x);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eni") == std::string::npos) s += ".0";
  return single ? s : s + "d";
}

template <class T>
void print_list(std::ostream& os, const std::vector<T>& v) {
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
}

void print_attr(std::ostream& os, const Attribute& a) {
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          os << quoted(x);
        } else if constexpr (std::is_same_v<T, Tensor>) {
          os << "tensor<" << x.str();
          if (x.defined() && x.numel() <= kInlineElements) os << " = " << tensor_data_str(x);
          os << ">";
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          os << "[";
          for (size_t i = 0; i < x.size(); ++i) os << (i ? ", " : "") << quoted(x[i]);
          os << "]";
        } else if constexpr (std::is_same_v<T, double>) {
          os << float_str(x);
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          os << "[";
          for (size_t i = 0; i < x.size(); ++i) os << (i ? ", " : "") << float_str(x[i]);
          os << "]";
        } else if constexpr (std::is_same_v<T, GraphAttr>) {
          os << "graph";  // print() writes the graph itself as a block after the node line
        } else if constexpr (std::is_arithmetic_v<T>) {
          os << x;
        } else {
          print_list(os, x);
        }
      },
      a);
}

}  // namespace

std::string tensor_data_str(const Tensor& t) {
  std::string out = "[";
  Tensor c = t.contiguous();
  dispatch_with_storage(c.dtype(), kAllTypes | kStorageTypes, "print", [&]<class T>() {
    const T* p = c.data<T>();
    for (int64_t i = 0; i < c.numel(); ++i) {
      if (i) out += ", ";
      if constexpr (std::is_same_v<T, bool>) {
        out += p[i] ? "true" : "false";
      } else if constexpr (std::is_integral_v<T> || is_small_int_v<T>) {
        out += std::to_string(static_cast<compute_t<T>>(p[i]));
      } else {
        char buf[64];
        std::to_chars_result r;
        if constexpr (std::is_same_v<T, double>)
          r = std::to_chars(buf, buf + sizeof(buf), p[i]);
        else
          r = std::to_chars(buf, buf + sizeof(buf), static_cast<float>(p[i]));
        out.append(buf, r.ptr);
      }
    }
  });
  return out + "]";
}

std::string attribute_str(const Attribute& a) {
  std::ostringstream os;
  print_attr(os, a);
  return os.str();
}

namespace {

// Writes `g` with every line indented by `indent`; a subgraph's header starts with the name of the
// attribute that holds it ("body: graph loop_body (opset 17)"), and its lines are indented two
// more spaces than the node line that owns it.
void print_graph(std::ostream& os, const Graph& g, const std::string& indent,
                 const std::string& label) {
  auto ref = [&](ValueId v) {
    return v == kNoValue ? std::string("_") : ref_name(g.value(v).name);
  };
  const std::string in = indent + "  ";
  os << indent << label << (label.empty() ? "" : ": ") << "graph "
     << (g.name.empty() ? "main" : g.name) << " (opset " << g.opset << ")\n";
  const size_t first_capture = g.inputs().size() - static_cast<size_t>(g.num_captures);
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const ValueId v = g.inputs()[i];
    os << in << (i < first_capture ? "input  " : "capture ") << ref(v) << ": "
       << g.value(v).type.str() << "\n";
  }
  for (ValueId v = 0; v < static_cast<ValueId>(g.values().size()); ++v) {
    const Tensor* t = g.initializer(v);
    if (!t && g.is_released(v))
      os << in << "const  " << ref(v) << ": " << g.value(v).type.str()
         << " released (a kernel holds it packed)\n";
    if (!t) continue;
    os << in << "const  " << ref(v) << ": " << t->str();
    if (t->numel() <= kInlineElements) os << " = " << tensor_data_str(*t);
    os << "\n";
  }
  for (const Node& n : g.nodes()) {
    os << in;
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      os << (i ? ", " : "") << ref(n.outputs[i]);
      if (n.outputs[i] != kNoValue) os << ": " << g.value(n.outputs[i]).type.str();
    }
    os << " = " << (n.domain.empty() ? "" : n.domain + ".") << n.op << "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) os << (i ? ", " : "") << ref(n.inputs[i]);
    os << ")";
    if (!n.attrs.all().empty()) {
      os << " {";
      bool first = true;
      for (const auto& [k, a] : n.attrs.all()) {
        os << (first ? "" : ", ") << k << "=";
        print_attr(os, a);
        first = false;
      }
      os << "}";
    }
    os << "  # " << n.name << "\n";
    for (const auto& [k, a] : n.attrs.all())
      if (const auto* sub = std::get_if<GraphAttr>(&a); sub && *sub)
        print_graph(os, **sub, in + "  ", k);
  }
  os << in << "return ";
  for (size_t i = 0; i < g.outputs().size(); ++i) os << (i ? ", " : "") << ref(g.outputs()[i]);
  os << "\n";
}

}  // namespace

std::string print(const Graph& g) {
  std::ostringstream os;
  print_graph(os, g, "", "");
  return os.str();
}

}  // namespace pto
