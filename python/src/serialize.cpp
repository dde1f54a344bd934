// pypto._C.save_executable / load_executable (pto/serialize.h) and graph pictures
// (pto/graph_dot.h): thin wrappers, the file format and the checks are in C++.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <optional>

#include "bindings.h"
#include "pto/graph_dot.h"
#include "pto/serialize.h"

namespace pto::python {

void bind_serialize(nb::module_& m) {
  m.def(
      "save_executable",
      [](const Executable& exe, const std::string& path, const std::string& metadata) {
        nb::gil_scoped_release unlocked;
        save_executable(exe, path, metadata);
      },
      nb::arg("exe"), nb::arg("path"), nb::arg("metadata") = "",
      "Writes a compiled model to `path`; `metadata` is text given back by load_executable.");
  m.def(
      "load_executable",
      [](const std::string& path) {
        LoadedExecutable* m = nullptr;
        {
          nb::gil_scoped_release unlocked;
          m = new LoadedExecutable(load_executable(path));
        }
        std::unique_ptr<LoadedExecutable> owned(m);
        nb::dict info;
        info["format"] = owned->info.format;
        info["pypto_version"] = owned->info.pypto_version;
        info["isa"] = owned->info.isa;
        info["cpu_features"] = owned->info.cpu_features;
        info["threads"] = owned->info.threads;
        info["level"] = owned->info.options.level;
        info["payload_bytes"] = owned->info.payload_bytes;
        std::string metadata = owned->info.metadata;
        return std::make_tuple(std::move(owned->exe), metadata, info);
      },
      nb::arg("path"),
      "Reads a saved model without compiling again: (Executable, metadata, info dict). "
      "ValueError for another format version, a truncated or corrupt file, or an ISA this CPU "
      "or process lacks.");
  m.def("is_saved_model", &is_saved_model, nb::arg("path"),
        "Whether the file starts like a saved model.");
  m.def(
      "graph_dot",
      [](const Executable& exe, const std::string& title) {
        DotOptions o;
        o.title = title;
        return to_dot(exe, o);
      },
      nb::arg("exe"), nb::arg("title") = "",
      "Graphviz DOT of the compiled graph, each fused kernel a cluster around its nodes.");
  m.def(
      "graph_dot_after_pass",
      [](const Graph& g, int level, const std::string& pass, const std::string& title) {
        DotOptions d;
        d.title = title;
        return to_dot(graph_after_pass(g, level, pass), nullptr, d);
      },
      nb::arg("graph"), nb::arg("level"), nb::arg("pass_name"), nb::arg("title") = "",
      "Graphviz DOT of `graph` as pass `pass_name` of the level's pipeline left it.");
}

}  // namespace pto::python
