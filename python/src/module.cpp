// pypto._C: the C++ core seen from Python. The package python/pypto builds on it.
#include "bindings.h"

NB_MODULE(_C, m) {
  m.doc() = "PyPTO's C++ core (graphs, ONNX import/export, compilation, execution)";
  using namespace pto::python;
  // Objects cached by Python code (compiled modules, jit caches) may outlive the interpreter's
  // teardown order; that is not a leak worth a report at every exit.
  nb::set_leak_warnings(false);
  bind_errors(m);
  bind_tensor(m);
  bind_graph(m);
  bind_runtime(m);
  bind_onnx(m);
  bind_device(m);
  bind_profiler(m);
  bind_serialize(m);
}
