// Errors of the Python package as C++ exceptions, and how they become Python exceptions.
//
// SDK and daemon errors keep their stable kvtier::ErrorCode and are raised in Python as the
// kvtier.errors class for that code (kvtier.InvalidArgument, kvtier.NotFound, ...). Two conditions
// come from Python itself: a block still exported (kvtier.BufferInUse, no code) and an object used
// in a child process after fork (kvtier.UsedAfterFork, an InvalidArgument as in the C ABI).
#pragma once

#include <exception>
#include <string>
#include <utility>

#include <pybind11/pybind11.h>

#include "kvtier/error.h"

namespace kvtier::python {

// A kvtier::Error: raised in Python as the kvtier.Error subclass for its code.
class SdkError : public std::exception {
 public:
  explicit SdkError(Error error) : error_(std::move(error)), what_(error_.toString()) {}
  const Error& error() const { return error_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  Error error_;
  std::string what_;
};

// A condition of the Python package itself.
class PackageError : public std::exception {
 public:
  enum class Kind {
    kBufferInUse,    // kvtier.BufferInUse: a release refused while blocks are exported
    kUsedAfterFork,  // kvtier.UsedAfterFork: an object made before fork() used in the child
  };
  PackageError(Kind kind, std::string message) : kind_(kind), message_(std::move(message)) {}
  Kind kind() const { return kind_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  Kind kind_;
  std::string message_;
};

template <typename... Args>
[[noreturn]] void throwError(ErrorCode code, Args&&... args) {
  throw SdkError(makeError(code, std::forward<Args>(args)...));
}

// The value of `result`, or its error thrown as an SdkError.
template <typename T>
T unwrap(Result<T>&& result) {
  if (!result) throw SdkError(result.error());
  return std::move(result).value();
}
inline void unwrap(const Status& status) {
  if (!status) throw SdkError(status.error());
}

// The kvtier.errors exception for `error`, made but not raised (GIL held): for calls that return
// one error per item (Space.put_many) instead of raising.
pybind11::object exceptionOf(const Error& error);

// Sets the Python error for the exception being handled (call inside a catch block, with the GIL
// held): for C callbacks such as the buffer protocol, where pybind11 translates nothing.
void setPythonError();

// Registers the translation of SdkError and PackageError with pybind11 (module init).
void registerErrorTranslator();

}  // namespace kvtier::python
