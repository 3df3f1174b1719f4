// Structured one-line logs on stderr: "ts=<unix ms> level=<l> event=<e> <key=value ...>".
#pragma once

#include <string>
#include <string_view>

namespace kvtier {

void logInfo(std::string_view event, std::string_view fields = {});
void logWarn(std::string_view event, std::string_view fields = {});

}  // namespace kvtier
