// Expected failures come back as a Result carrying errno and a readable
// message; only broken invariants abort.
#pragma once

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace sluice {

/// An expected failure: errno (0 when none applies) and a one-line message
/// that names what was wrong, suitable for printing as is.
struct Error {
  int code = 0;
  std::string message;

  /// Builds an error from an errno value, appending strerror to the context.
  static Error fromErrno(int err, const std::string& context) {
    if (err < 0) err = -err;
    return Error{err, context + ": " + std::strerror(err)};
  }
  static Error msg(const std::string& message, int err = 0) { return Error{err, message}; }
};

/// Either a value or an Error.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() { return std::get<0>(v_); }
  const T& value() const { return std::get<0>(v_); }
  T& operator*() { return value(); }
  T* operator->() { return &value(); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

/// Result of an operation with no value.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : err_(std::move(error)) {}  // NOLINT: implicit by design
  static Status ok_() { return Status(); }

  bool ok() const { return !err_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Error& error() const { return *err_; }

 private:
  std::optional<Error> err_;
};

/// Propagates a failed Status/Result from the enclosing function.
#define SLUICE_TRY(expr)                                 \
  do {                                                   \
    auto&& sluice_try_r_ = (expr);                       \
    if (!sluice_try_r_.ok()) return sluice_try_r_.error(); \
  } while (0)

}  // namespace sluice
