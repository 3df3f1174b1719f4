// Error codes and the Result type used inside store/, transport/ and the client SDK.
//
// Codes are stable and numbered; they are the same numbers as rpc::ErrorCode in
// schemas/kvtier.capnp and travel across the RPC boundary inside kj::Exception descriptions
// ("kvtier error <n> (<NAME>): <message>").
#pragma once

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <variant>

namespace kvtier {

enum class ErrorCode : uint16_t {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,
  kFull = 3,
  kNotSupported = 4,
  kStaleReference = 5,
  kChecksumMismatch = 6,
  kPermissionDenied = 7,
  kUnavailable = 8,
  kConflict = 9,
  kProtocolMismatch = 10,
  kInternal = 11,
  kReleased = 12,
};

// "INVALID_ARGUMENT" etc.; "UNKNOWN" for a number this build does not know.
const char* errorName(ErrorCode code);

// True where a caller may retry the same call later (FULL, UNAVAILABLE, CONFLICT).
bool isRetryable(ErrorCode code);

class Error {
 public:
  Error(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "FULL: pool has no evictable block of 262144 bytes"
  std::string toString() const;

 private:
  ErrorCode code_;
  std::string message_;
};

std::ostream& operator<<(std::ostream& os, const Error& error);

// A value or an Error. Never ignored silently: [[nodiscard]].
// value() on an error is a bug in the caller and aborts with the error's text.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : state_(std::move(error)) {}  // NOLINT

  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    checkOk();
    return std::get<0>(state_);
  }
  const T& value() const& {
    checkOk();
    return std::get<0>(state_);
  }
  T&& value() && {
    checkOk();
    return std::get<0>(std::move(state_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

  const Error& error() const { return std::get<1>(state_); }
  ErrorCode code() const { return ok() ? ErrorCode::kOk : error().code(); }

 private:
  void checkOk() const;
  std::variant<T, Error> state_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)) {}  // NOLINT

  bool ok() const { return !error_.has_value(); }
  explicit operator bool() const { return ok(); }
  void value() const;
  const Error& error() const { return *error_; }
  ErrorCode code() const { return ok() ? ErrorCode::kOk : error_->code(); }

 private:
  std::optional<Error> error_;
};

using Status = Result<void>;

[[noreturn]] void abortOnError(const Error& error);

template <typename T>
void Result<T>::checkOk() const {
  if (!ok()) abortOnError(error());
}

inline void Result<void>::value() const {
  if (!ok()) abortOnError(*error_);
}

// Shorthands for building errors: return invalidArgument("begin ", b, " is past the end");
template <typename... Args>
Error makeError(ErrorCode code, Args&&... args) {
  std::string message;
  ((message +=
    [](auto&& a) {
      if constexpr (std::is_convertible_v<decltype(a), std::string_view>) {
        return std::string(std::string_view(a));
      } else {
        return std::to_string(a);
      }
    }(args)),
   ...);
  return Error(code, std::move(message));
}

}  // namespace kvtier
