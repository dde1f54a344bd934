// Errors. Two channels, never mixed (DESIGN.md "Errors"):
//  - a user's mistake throws a typed pto::Error subclass whose message starts with where it
//    happened ("[Conv] node 'conv1': ...") and says what was expected and what was found;
//  - a broken internal invariant fails PTO_CHECK(cond) << msg, on in release builds.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace pto {

// Base of every exception PyPTO throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad value: malformed model file, shape mismatch, out-of-range attribute. Python: ValueError.
class ValueError : public Error {
 public:
  using Error::Error;
};

// Wrong dtype or kind of argument. Python: TypeError.
class TypeError : public Error {
 public:
  using Error::Error;
};

// An op, dtype or feature PyPTO does not implement. Python: NotImplementedError.
class UnsupportedError : public Error {
 public:
  using Error::Error;
};

// A PTO_CHECK failed: a bug in PyPTO, not in the user's input.
class InternalError : public Error {
 public:
  using Error::Error;
};

// Concatenates anything streamable into one string: cat("[Conv] expected ", 4, " dims").
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Inside a catch block: throws the error being handled again with its message prefixed
// ("model.onnx: " + "[Conv] node 'c': ..."), as the same ValueError, TypeError or
// UnsupportedError. An InternalError, another exception, or a message that starts with `prefix`
// already is thrown again as it is.
[[noreturn]] void rethrow_with(const std::string& prefix);

namespace detail {

// Collects the message of a failed PTO_CHECK and throws InternalError when the statement ends.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond) {
    os_ << file << ":" << line << ": check failed: " << cond << ": ";
  }
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  [[noreturn]] ~CheckFailure() noexcept(false) { throw InternalError(os_.str()); }

  template <class T>
  CheckFailure& operator<<(const T& value) {
    os_ << value;
    return *this;
  }

 private:
  std::ostringstream os_;
};

}  // namespace detail
}  // namespace pto

// Internal invariant, checked in every build type: PTO_CHECK(n >= 0) << "n=" << n;
#define PTO_CHECK(cond) \
  if (cond) {           \
  } else                \
    ::pto::detail::CheckFailure(__FILE__, __LINE__, #cond)
