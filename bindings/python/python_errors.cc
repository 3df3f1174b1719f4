#include "python_errors.h"

#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace kvtier::python {
namespace {

// Raises the kvtier.errors class `cls` with `message` (GIL held). The module is imported on each
// error rather than cached: errors are not a hot path, and a cached module object would outlive
// the interpreter at exit.
void raise(const py::object& cls, const std::string& message) {
  py::object error = cls(message);
  PyErr_SetObject(cls.ptr(), error.ptr());
}

void setSdkError(const SdkError& e) {
  py::object error = exceptionOf(e.error());
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
}

void setPackageError(const PackageError& e) {
  py::module_ errors = py::module_::import("kvtier.errors");
  const char* name = e.kind() == PackageError::Kind::kBufferInUse ? "BufferInUse" : "UsedAfterFork";
  raise(errors.attr(name), e.what());
}

}  // namespace

py::object exceptionOf(const Error& error) {
  py::module_ errors = py::module_::import("kvtier.errors");
  const int code = static_cast<int>(error.code());
  py::object cls = errors.attr("error_class")(code);
  py::object exception = cls(error.toString());
  // A code this package has no class for is kvtier.Error carrying the number.
  if (cls.is(errors.attr("Error"))) exception.attr("code") = code;
  return exception;
}

void setPythonError() {
  try {
    try {
      throw;
    } catch (const SdkError& e) {
      setSdkError(e);
    } catch (const PackageError& e) {
      setPackageError(e);
    } catch (py::error_already_set& e) {
      e.restore();
    } catch (const py::builtin_exception& e) {
      e.set_error();
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  } catch (py::error_already_set& e) {
    e.restore();  // kvtier.errors itself failed to import or to build the exception
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "kvtier: unexpected C++ exception");
  }
}

void registerErrorTranslator() {
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const SdkError&) {
      setPythonError();
    } catch (const PackageError&) {
      setPythonError();
    }
    // Anything else propagates to pybind11's own translators.
  });
}

}  // namespace kvtier::python
