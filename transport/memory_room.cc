#include "transport/memory_room.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

namespace kvtier {
namespace {

// The first line of `path` as a number of bytes; false when missing or not a number ("max": no
// limit, also false).
bool readBytes(const std::string& path, uint64_t& out) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word.empty() || word.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  try {
    out = std::stoull(word);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// The room one cgroup directory leaves under its limit, folded into `room`.
void foldLimit(const std::string& dir, const std::string& name, const char* limitFile,
               const char* usageFile, MemoryRoom& room) {
  uint64_t limit = 0, used = 0;
  if (!readBytes(dir + "/" + limitFile, limit)) return;
  // cgroup v1 says "no limit" with a huge number (PAGE_COUNTER_MAX pages).
  if (limit >= (uint64_t{1} << 60)) return;
  readBytes(dir + "/" + usageFile, used);
  const uint64_t left = limit > used ? limit - used : 0;
  if (!room.detail.empty()) room.detail += ", ";
  room.detail += "cgroup " + name + " " + limitFile + " " + formatBytes(limit) + " (used " +
                 formatBytes(used) + ")";
  room.bytes = std::min(room.bytes, left);
}

}  // namespace

std::string formatBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  }
  return buf;
}

MemoryRoom memoryRoom(const MemorySources& sources) {
  MemoryRoom room;
  {
    std::ifstream in(sources.meminfo);
    std::string line;
    while (std::getline(in, line)) {
      unsigned long long kib = 0;
      if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1) {
        room.bytes = kib * 1024;
        room.detail = "MemAvailable " + formatBytes(room.bytes);
        break;
      }
    }
  }
  // "0::/path" (v2) or "N:memory:/path" (v1, possibly "N:cpu,memory:/path"). Every cgroup from
  // the process's up to the root limits it.
  std::ifstream in(sources.selfCgroup);
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    const bool v2 = line.compare(0, a, "0") == 0 && controllers.empty();
    bool v1 = false;
    std::stringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');) v1 = v1 || c == "memory";
    if (!v2 && !v1) continue;
    const std::string base = sources.cgroupRoot + (v2 ? "" : "/memory");
    for (;;) {
      const std::string name = path.empty() ? "/" : path;
      if (v2) {
        foldLimit(base + path, name, "memory.max", "memory.current", room);
      } else {
        foldLimit(base + path, name, "memory.limit_in_bytes", "memory.usage_in_bytes", room);
      }
      if (path.empty() || path == "/") break;
      const size_t slash = path.rfind('/');
      path = slash == std::string::npos || slash == 0 ? "" : path.substr(0, slash);
    }
  }
  return room;
}

}  // namespace kvtier
