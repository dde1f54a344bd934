// The text form of a Tensor Graph: stable (attributes sorted, values in order) so two dumps diff.
#include <sstream>

#include "pto/graph.h"

namespace pto {
namespace {

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
          os << '"' << x << '"';
        } else if constexpr (std::is_same_v<T, Tensor>) {
          os << "tensor<" << x.str() << ">";
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          os << "[";
          for (size_t i = 0; i < x.size(); ++i) os << (i ? ", " : "") << '"' << x[i] << '"';
          os << "]";
        } else if constexpr (std::is_arithmetic_v<T>) {
          os << x;
        } else {
          print_list(os, x);
        }
      },
      a);
}

}  // namespace

std::string print(const Graph& g) {
  std::ostringstream os;
  auto ref = [&](ValueId v) { return v == kNoValue ? std::string("_") : "%" + g.value(v).name; };
  os << "graph " << (g.name.empty() ? "main" : g.name) << " (opset " << g.opset << ")\n";
  for (ValueId v : g.inputs()) os << "  input  " << ref(v) << ": " << g.value(v).type.str() << "\n";
  for (ValueId v = 0; v < static_cast<ValueId>(g.values().size()); ++v)
    if (const Tensor* t = g.initializer(v)) os << "  const  " << ref(v) << ": " << t->str() << "\n";
  for (const Node& n : g.nodes()) {
    os << "  ";
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      os << (i ? ", " : "") << ref(n.outputs[i]);
      if (n.outputs[i] != kNoValue) os << ": " << g.value(n.outputs[i]).type.str();
    }
    os << " = " << n.op << "(";
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
  }
  os << "  return ";
  for (size_t i = 0; i < g.outputs().size(); ++i) os << (i ? ", " : "") << ref(g.outputs()[i]);
  os << "\n";
  return os.str();
}

}  // namespace pto
