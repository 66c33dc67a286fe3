// Error values for every Kiln API: no exceptions cross the runtime API.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace kiln {

/// What went wrong, by class. Every non-Ok Error also carries a human-readable message.
enum class ErrorCode {
  Ok = 0,
  InvalidProgram,          ///< malformed, truncated or hostile program file
  NotFound,                ///< missing method, missing/unavailable backend, missing file
  OperatorMissing,         ///< an op with no kernel in this runtime
  InvalidArgument,         ///< wrong input count, dtype or shape; bad attribute
  NotSupported,            ///< a valid request this build cannot serve (dtype, attribute, ...)
  MemoryAllocationFailed,  ///< arena or buffer allocation failed or was too small
  Internal,                ///< a bug in Kiln
};

/// Name of an ErrorCode, e.g. "InvalidArgument".
const char* error_code_name(ErrorCode code);

/// An error value: a code and a message (empty when Ok).
class [[nodiscard]] Error {
 public:
  Error() = default;
  Error(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Error success() { return {}; }

  bool ok() const { return code_ == ErrorCode::Ok; }
  explicit operator bool() const { return !ok(); }  ///< true when this is an error
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "InvalidArgument: input 'x': expected ... got ...".
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::Ok;
  std::string message_;
};

/// A value of type T or an Error (never both). Access to value() on an error aborts in debug.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Error& error() const {
    static const Error kOk;
    return ok() ? kOk : std::get<Error>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Error> v_;
};

}  // namespace kiln

/// Returns the Error from the enclosing function when `expr` (an Error) is not ok.
#define KILN_RETURN_IF_ERROR(expr)                 \
  do {                                             \
    ::kiln::Error kiln_err_ = (expr);              \
    if (!kiln_err_.ok()) return kiln_err_;         \
  } while (0)

/// Returns an Error(code, message) from the enclosing function when `cond` is false.
#define KILN_CHECK_OR_RETURN(cond, code, message)                         \
  do {                                                                    \
    if (!(cond)) return ::kiln::Error(::kiln::ErrorCode::code, (message)); \
  } while (0)
