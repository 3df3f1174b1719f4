// Small helpers shared by the engine's implementation files (engine*.cc); not part of its API.
#pragma once

#include <cstdint>
#include <string_view>

#include "kvtier/error.h"
#include "store/limits.h"

namespace kvtier::engine_util {

inline Error invalid(auto&&... args) { return makeError(ErrorCode::kInvalidArgument, args...); }

inline Status checkName(std::string_view name, const char* what) {
  if (name.empty()) return invalid(what, " name is empty");
  if (name.size() > kMaxSeqNameBytes) {
    return invalid(what, " name of ", name.size(), " bytes exceeds ", kMaxSeqNameBytes);
  }
  return {};
}

inline uint64_t ceilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

}  // namespace kvtier::engine_util
