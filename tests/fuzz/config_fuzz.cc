// Fuzz harness: kvtierd's command line (daemon/config.h). An operator's flags are input too:
// every argument list must be answered with a config or INVALID_ARGUMENT, never a crash.
//
// Input: arguments separated by NUL bytes (at most kMaxArgs). Properties checked besides "no
// crash": a refused list is INVALID_ARGUMENT; an accepted config has a socket path; parseByteSize
// of each argument is a value or INVALID_ARGUMENT, and a value it accepts is printed back the same
// when it carries no suffix.
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "daemon/config.h"

namespace {

// Arguments per input: far above any real command line.
constexpr size_t kMaxArgs = 256;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "kvtier fuzz: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier;
  std::vector<std::string> args;
  const char* text = reinterpret_cast<const char*>(data);
  for (size_t from = 0; from <= size && args.size() < kMaxArgs;) {
    size_t end = from;
    while (end < size && text[end] != '\0') ++end;
    args.emplace_back(text + from, end - from);
    from = end + 1;
  }
  auto config = parseDaemonArgs(args);
  if (config) {
    check(!config->effectiveSocketPath().empty(), "an accepted config has no socket path");
  } else {
    check(config.error().code() == ErrorCode::kInvalidArgument,
          "a refused command line is not INVALID_ARGUMENT");
  }
  for (const auto& arg : args) {
    auto bytes = parseByteSize(arg);
    if (!bytes) {
      check(bytes.error().code() == ErrorCode::kInvalidArgument,
            "a refused size is not INVALID_ARGUMENT");
      continue;
    }
    uint64_t plain = 0;
    auto [end, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), plain);
    if (ec == std::errc() && end == arg.data() + arg.size()) {
      check(*bytes == plain, "a size without a suffix is not its number");
    }
  }
  return 0;
}
