// JSON text for the tools and benchmarks that write their results as JSON.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace kvtier {

// `s` as a JSON string literal: quotes and backslashes escaped, control bytes as \u00XX.
inline std::string jsonString(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace kvtier
