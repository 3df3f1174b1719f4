#include "daemon/log.h"

#include <chrono>
#include <cstdio>

namespace kvtier {
namespace {

void emit(const char* level, std::string_view event, std::string_view fields) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  std::fprintf(stderr, "ts=%lld level=%s event=%.*s%s%.*s\n", static_cast<long long>(ms), level,
               static_cast<int>(event.size()), event.data(), fields.empty() ? "" : " ",
               static_cast<int>(fields.size()), fields.data());
}

}  // namespace

void logInfo(std::string_view event, std::string_view fields) { emit("info", event, fields); }
void logWarn(std::string_view event, std::string_view fields) { emit("warn", event, fields); }

}  // namespace kvtier
