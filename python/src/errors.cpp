// pto::Error subclasses become the Python exceptions DESIGN.md names.
#include <cstring>

#include "bindings.h"
#include "pto/error.h"

namespace pto::python {
namespace {

// Raises `type` with the message as a str. Bytes that are not UTF-8 (a model's names are bytes to
// protobuf, and a message quotes them) are escaped, \xb4, where PyErr_SetString would raise a
// UnicodeDecodeError in place of the error and its message.
void set_error(PyObject* type, const char* what) {
  PyObject* message =
      PyUnicode_DecodeUTF8(what, static_cast<Py_ssize_t>(std::strlen(what)), "backslashreplace");
  if (!message) {
    PyErr_Clear();
    PyErr_SetString(type, "(a message that is not text)");
    return;
  }
  PyErr_SetObject(type, message);
  Py_DECREF(message);
}

}  // namespace

void bind_errors(nb::module_& m) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const UnsupportedError& e) {
      set_error(PyExc_NotImplementedError, e.what());
    } catch (const TypeError& e) {
      set_error(PyExc_TypeError, e.what());
    } catch (const ValueError& e) {
      set_error(PyExc_ValueError, e.what());
    } catch (const InternalError& e) {
      set_error(PyExc_RuntimeError, e.what());
    }
  });
}

}  // namespace pto::python
