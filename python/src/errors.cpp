// pto::Error subclasses become the Python exceptions DESIGN.md names.
#include "bindings.h"
#include "pto/error.h"

namespace pto::python {

void bind_errors(nb::module_& m) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const UnsupportedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    } catch (const TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const InternalError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
}

}  // namespace pto::python
