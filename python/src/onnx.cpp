// pypto._C.onnx_*: ONNX files and bytes to Tensor Graphs and back.
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "pto/onnx.h"

namespace pto::python {

void bind_onnx(nb::module_& m) {
  m.def("onnx_load", &onnx::load, nb::arg("path"),
        "Loads an ONNX model file into a Tensor Graph (external data relative to its folder).");
  m.def(
      "onnx_load_bytes",
      [](nb::bytes b, const std::string& source) {
        return onnx::load_from_bytes(std::string_view(b.c_str(), b.size()), "", source);
      },
      nb::arg("data"), nb::arg("source") = "<bytes>", "Loads a serialized ONNX model.");
  m.def("onnx_save", &onnx::save, nb::arg("graph"), nb::arg("path"),
        "Writes a Tensor Graph as an ONNX model file.");
  m.def(
      "onnx_save_bytes",
      [](const Graph& g) {
        std::string b = onnx::save_to_bytes(g);
        return nb::bytes(b.data(), b.size());
      },
      nb::arg("graph"), "Serializes a Tensor Graph as ONNX model bytes.");
  m.def("onnx_max_opset", &onnx::max_opset);
}

}  // namespace pto::python
