// pypto._C.Graph: the Tensor Graph as frontends build it from Python (the torch importer, @jit).
// Values are integer ids; attributes are plain Python values; initializers wrap the caller's
// arrays (module parameters stay shared with torch, never copied).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>

#include "bindings.h"
#include "pto/graph.h"
#include "pto/op_registry.h"

namespace pto::python {

namespace {

// A Python shape: a list of ints (known), strings (symbols) and None (unknown); None: rank unknown.
std::optional<Shape> shape_from_python(nb::handle h, const std::string& what) {
  if (h.is_none()) return std::nullopt;
  Shape s;
  for (nb::handle d : h) {
    if (d.is_none())
      s.push_back(Dim::unknown());
    else if (nb::isinstance<nb::str>(d))
      s.push_back(Dim::sym(nb::cast<std::string>(d)));
    else if (nb::isinstance<nb::int_>(d))
      s.push_back(Dim(nb::cast<int64_t>(d)));
    else
      throw TypeError(cat(what, ": a dimension must be an int, a str (symbol) or None"));
  }
  return s;
}

nb::object shape_to_python(const std::optional<Shape>& s) {
  if (!s) return nb::none();
  nb::list out;
  for (const Dim& d : *s) {
    if (d.is_known())
      out.append(d.value);
    else if (d.is_symbolic())
      out.append(d.symbol);
    else
      out.append(nb::none());
  }
  return out;
}

Attribute attribute_from_python(nb::handle v, const std::string& what) {
  if (nb::isinstance<nb::bool_>(v) || nb::isinstance<nb::int_>(v)) return nb::cast<int64_t>(v);
  if (nb::isinstance<nb::float_>(v)) return nb::cast<double>(v);
  if (nb::isinstance<nb::str>(v)) return nb::cast<std::string>(v);
  if (nb::isinstance<nb::list>(v) || nb::isinstance<nb::tuple>(v)) {
    bool any_float = false, any_str = false;
    for (nb::handle x : v) {
      any_float |= nb::isinstance<nb::float_>(x);
      any_str |= nb::isinstance<nb::str>(x);
    }
    if (any_str) return nb::cast<std::vector<std::string>>(v);
    if (any_float) return nb::cast<std::vector<double>>(v);
    return nb::cast<std::vector<int64_t>>(v);
  }
  return tensor_from_python(v, what);
}

}  // namespace

void bind_graph(nb::module_& m) {
  nb::class_<Graph>(m, "Graph", "A Tensor Graph under construction (values are integer ids).")
      .def(nb::init<>())
      .def_rw("name", &Graph::name)
      .def(
          "add_input",
          [](Graph& g, std::string name, const std::string& dtype, nb::handle shape) {
            TensorType t{dtype_from_name(dtype), shape_from_python(shape, "input '" + name + "'")};
            return g.add_input(std::move(name), std::move(t));
          },
          nb::arg("name"), nb::arg("dtype"), nb::arg("shape").none(),
          "Declares a graph input; shape holds ints, symbol names and None (unknown).")
      .def(
          "add_initializer",
          [](Graph& g, std::string name, nb::handle array) {
            Tensor t = tensor_from_python(array, "initializer '" + name + "'");
            ValueId v = g.add_value(std::move(name));
            g.set_initializer(v, std::move(t));
            return v;
          },
          nb::arg("name"), nb::arg("array"),
          "Binds constant data (no copy: the graph keeps a reference to the array).")
      .def(
          "add_node",
          [](Graph& g, std::string op, const std::vector<ValueId>& inputs, size_t num_outputs,
             nb::dict attrs, std::string name, int opset) {
            Attributes a;
            for (auto [k, v] : attrs) {
              std::string key = nb::cast<std::string>(k);
              a.set(key, attribute_from_python(v, cat("[", op, "] attribute '", key, "'")));
            }
            std::vector<ValueId> outputs;
            for (size_t i = 0; i < num_outputs; ++i)
              outputs.push_back(g.add_value(name.empty() || i == 0 ? name : cat(name, ":", i)));
            g.add_node(std::move(op), inputs, outputs, std::move(a), std::move(name), opset);
            return outputs;
          },
          nb::arg("op"), nb::arg("inputs"), nb::arg("num_outputs") = 1,
          nb::arg("attrs") = nb::dict(), nb::arg("name") = "", nb::arg("opset") = 0,
          "Appends a node (inputs by id, -1 for a missing optional one); returns its output ids.")
      .def("add_output", &Graph::add_output, nb::arg("value"))
      .def(
          "set_symbol_range",
          [](Graph& g, const std::string& symbol, int64_t lo, int64_t hi) {
            g.symbol_ranges[symbol] = DimRange{lo, hi};
          },
          nb::arg("symbol"), nb::arg("min"), nb::arg("max"))
      .def(
          "set_type",
          [](Graph& g, ValueId v, const std::string& dtype, nb::handle shape) {
            Value& val = g.value(v);
            val.type = {dtype_from_name(dtype),
                        shape_from_python(shape, "value '" + val.name + "'")};
          },
          nb::arg("value"), nb::arg("dtype"), nb::arg("shape").none(),
          "Declares a value's type (inference checks and refines it).")
      .def(
          "type",
          [](const Graph& g, ValueId v) {
            const TensorType& t = g.value(v).type;
            return nb::make_tuple(std::string(dtype_name(t.dtype)), shape_to_python(t.shape));
          },
          nb::arg("value"), "(dtype name, shape) of a value; shape None when the rank is unknown.")
      .def(
          "initializer",
          [](const Graph& g, const std::string& name) -> nb::object {
            auto v = g.find_value(name);
            const Tensor* t = v ? g.initializer(*v) : nullptr;
            if (t == nullptr) throw ValueError(cat("graph: no initializer named '", name, "'"));
            return tensor_to_python(*t);
          },
          nb::arg("name"), "An initializer's data as an array sharing its memory.")
      .def_prop_ro("initializer_names",
                   [](const Graph& g) {
                     std::vector<std::string> names;
                     for (const auto& [v, t] : g.initializers()) names.push_back(g.value(v).name);
                     std::sort(names.begin(), names.end());
                     return names;
                   })
      .def("value_name", [](const Graph& g, ValueId v) { return g.value(v).name; })
      .def_prop_ro("inputs", &Graph::inputs)
      .def_prop_ro("outputs", &Graph::outputs)
      .def_prop_ro("num_nodes", [](const Graph& g) { return g.nodes().size(); })
      .def_prop_ro("ops",
                   [](const Graph& g) {
                     std::vector<std::string> ops;
                     for (const Node& n : g.nodes()) ops.push_back(n.op);
                     return ops;
                   })
      .def("infer_types", static_cast<void (*)(Graph&)>(&infer_types),
           "Runs shape and dtype inference over the graph.")
      .def("verify", &verify)
      .def("__str__", [](const Graph& g) { return print(g); });

  m.def(
      "has_op", [](const std::string& op) { return OpRegistry::global().find(op) != nullptr; },
      nb::arg("op"), "Whether the Tensor Graph has an op of this name.");
}

}  // namespace pto::python
