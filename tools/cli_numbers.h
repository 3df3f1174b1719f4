// Numbers on kvtier's command lines, parsed strictly: decimal digits only — no sign (std::stoull
// takes "-5" and wraps it to 18446744073709551611), no leading space, nothing after the digits —
// within the range the argument allows. The error names the argument and says what it wants.
#pragma once

#include <charconv>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kvtier/error.h"

namespace kvtier::cli {

inline Result<uint64_t> parseCount(std::string_view text, std::string_view what, uint64_t min = 0,
                                   uint64_t max = UINT64_MAX) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  const auto [at, ec] = std::from_chars(text.data(), end, value);
  if (!digits || ec != std::errc() || at != end || value < min || value > max) {
    return makeError(ErrorCode::kInvalidArgument, what, " wants a whole number from ", min, " to ",
                     max, ", not '", text, "'");
  }
  return value;
}

// For parsers written with exceptions: the number, or std::invalid_argument with that message.
inline uint64_t countOrThrow(std::string_view text, std::string_view what, uint64_t min = 0,
                             uint64_t max = UINT64_MAX) {
  auto v = parseCount(text, what, min, max);
  if (!v) throw std::invalid_argument(v.error().message());
  return *v;
}

}  // namespace kvtier::cli
