// Fuzz harness: the trace `kvtier replay` reads (tools/replay.h). A trace file is input: every line
// must be answered with a request or INVALID_ARGUMENT, within the bounds replay.h names.
//
// Input: a trace file's bytes. Each line goes to parseTraceLine; the whole input goes to loadTrace
// (through a memfd, as a file). Properties checked besides "no crash": an accepted request has 1
// to kMaxBlocksPerRequest hash ids; loadTrace accepts exactly when every non-blank line parses;
// the accepted requests route to a node in range and play through the offline LRU models with
// hits no larger than the request.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "tools/replay.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "kvtier fuzz: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier;
  using namespace kvtier::replay;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<TraceRequest> parsed;
  bool allParse = true, tooLong = false;
  for (size_t from = 0; from < text.size();) {
    size_t end = text.find('\n', from);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(from, end - from);
    from = end + 1;
    if (line.size() > kMaxTraceLineBytes) tooLong = true;
    auto r = parseTraceLine(line);
    if (r) {
      check(!r->hashIds.empty() && r->hashIds.size() <= kMaxBlocksPerRequest,
            "an accepted request's hash ids are out of bounds");
      parsed.push_back(std::move(r).value());
    } else {
      check(r.error().code() == ErrorCode::kInvalidArgument,
            "a refused line is not INVALID_ARGUMENT");
      if (line.find_first_not_of(" \t\r") != std::string_view::npos) allParse = false;
    }
  }

  // The same bytes as a file.
  const int fd = ::memfd_create("trace", MFD_CLOEXEC);
  check(fd >= 0, "memfd_create failed");
  check(::write(fd, data, size) == static_cast<ssize_t>(size), "memfd write failed");
  auto loaded = loadTrace("/proc/self/fd/" + std::to_string(fd));
  ::close(fd);
  if (!tooLong) {
    check(loaded.ok() == (allParse && !parsed.empty()),
          "loadTrace disagrees with parseTraceLine on the same lines");
  }
  if (loaded) check(loaded->size() == parsed.size(), "loadTrace kept another number of requests");

  std::vector<LruCache> nodes(3, LruCache(64));
  LruCache one(64);
  for (size_t i = 0; i < parsed.size(); ++i) {
    const TraceRequest& r = parsed[i];
    for (Route route : {Route::kRoundRobin, Route::kSession}) {
      check(routeRequest(route, i, r, nodes.size()) < nodes.size(), "a request routed nowhere");
    }
    check(one.access(r.hashIds) <= r.hashIds.size(), "more LRU hits than blocks");
    check(one.size() <= one.capacity(), "the LRU grew past its capacity");
    const size_t at = routeRequest(Route::kSession, i, r, nodes.size());
    check(clusterModelAccess(nodes, at, r.hashIds, i % 2 == 1) <= r.hashIds.size(),
          "more cluster-model hits than blocks");
  }
  return 0;
}
