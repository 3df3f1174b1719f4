// How much ordinary (4 KiB-page) memory this process can still have: what kvtierd checks a host
// pool against before it allocates one, so that a pool too large is refused with the figures
// instead of the kernel's OOM killer ending the daemon while it faults the pool in (and leaving
// its segments behind). Two sources, the smaller wins: the kernel's estimate of memory available
// without swapping (MemAvailable in /proc/meminfo), and the memory limits of the process's cgroup
// and of each cgroup above it (v2: memory.max less memory.current; v1: memory.limit_in_bytes less
// memory.usage_in_bytes). Shared memory counts against both. Plain file reads; thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace kvtier {

// Where the figures are read (a test points these at files of its own).
struct MemorySources {
  std::string meminfo = "/proc/meminfo";
  std::string selfCgroup = "/proc/self/cgroup";
  std::string cgroupRoot = "/sys/fs/cgroup";
};

struct MemoryRoom {
  uint64_t bytes = UINT64_MAX;  // UINT64_MAX: no source could say
  std::string detail;  // "MemAvailable 21.3 GiB, cgroup /a/b memory.max 8 GiB (used 1 GiB)"
};

MemoryRoom memoryRoom(const MemorySources& sources = {});

// Memory a daemon keeps free beside its pool (its index, the cold tier's caches, its stacks).
inline constexpr uint64_t kPoolHeadroomBytes = uint64_t{64} << 20;

// "21.3 GiB", "512 MiB", "4096 B".
std::string formatBytes(uint64_t bytes);

}  // namespace kvtier
