#include "kvtier/error.h"

#include <cstdio>

namespace kvtier {

const char* errorName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "OK";
    case ErrorCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case ErrorCode::kNotFound:
      return "NOT_FOUND";
    case ErrorCode::kFull:
      return "FULL";
    case ErrorCode::kNotSupported:
      return "NOT_SUPPORTED";
    case ErrorCode::kStaleReference:
      return "STALE_REFERENCE";
    case ErrorCode::kChecksumMismatch:
      return "CHECKSUM_MISMATCH";
    case ErrorCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case ErrorCode::kUnavailable:
      return "UNAVAILABLE";
    case ErrorCode::kConflict:
      return "CONFLICT";
    case ErrorCode::kProtocolMismatch:
      return "PROTOCOL_MISMATCH";
    case ErrorCode::kInternal:
      return "INTERNAL";
    case ErrorCode::kReleased:
      return "RELEASED";
  }
  return "UNKNOWN";
}

bool isRetryable(ErrorCode code) {
  return code == ErrorCode::kFull || code == ErrorCode::kUnavailable ||
         code == ErrorCode::kConflict;
}

std::string Error::toString() const { return std::string(errorName(code_)) + ": " + message_; }

std::ostream& operator<<(std::ostream& os, const Error& error) { return os << error.toString(); }

void abortOnError(const Error& error) {
  std::fprintf(stderr, "kvtier: value() of a failed Result: %s\n", error.toString().c_str());
  std::abort();
}

}  // namespace kvtier
