// kvtierd's configuration: embedded defaults, overridden by flags.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/error.h"
#include "store/eviction.h"
#include "transport/host_pool.h"

namespace kvtier {

struct DaemonConfig {
  // With no flags at all the daemon serves from the working directory: ./kvtier-data holds its
  // lock and socket, and a 1 GiB host pool lives in shared memory (on huge pages if enough are
  // free).
  std::string dataDir = "kvtier-data";
  std::string socketPath;  // empty: <dataDir>/kvtierd.sock
  uint64_t hostPoolBytes = uint64_t{1} << 30;
  uint64_t extentBytes = uint64_t{1} << 30;
  // The host pool's pages (docs/performance.md, "The pool's memory"): 2 MiB hugetlb pages when
  // enough are free (auto), always (on: no start without them) or never (off: 4 KiB pages).
  HugePages hugePages = HugePages::kAuto;
  // Cold tier: RocksDB under <dataDir>/cold; evicted blocks spill there and are promoted back.
  bool coldTier = true;
  uint64_t diskBytes = uint64_t{64} << 30;  // payload bytes kept on disk; 0: unbounded
  bool flushOnExit = true;  // SIGTERM/SIGINT write every sealed block still only in memory
  // The longest a stop takes, SIGTERM to exit: the flush writes snapshots first, then blocks
  // most useful first, until shortly before it; at it, whatever is still running is abandoned
  // (names removed, the process ends). Fits a 30 s grace period (Kubernetes' default).
  uint32_t shutdownTimeoutMs = 20000;
  // The cold tier's write bandwidth, bytes per second (0: unlimited): spills and flushes leave
  // the rest of the disk to others.
  uint64_t diskWriteBytesPerSecond = 0;
  // Which cached block memory drops first (docs/cache-policy.md): ARC made prefix-aware, or LRU.
  EvictionKind eviction = kDefaultEviction;
  std::string metricsAddr;  // HOST:PORT for GET /metrics (Prometheus); empty: off
  // GPU pools (a build with CUDA, on a machine with GPUs): `gpuPoolBytes` on each device of
  // `gpus` (empty with allGpus: every device; empty without: none).
  uint64_t gpuPoolBytes = uint64_t{1} << 30;
  bool allGpus = true;
  std::vector<int> gpus;
  // After the event loop runs out of work it polls for this long before it sleeps: the next
  // message of a conversation then finds it awake (see transport/busy_poll.h). 0: sleep at once.
  uint32_t busyPollMicros = 50;
  // Cluster (docs/cluster.md). Off unless `listen` is set: the peer RPC listener, HOST:PORT.
  std::string listen;
  std::string advertise;         // HOST:PORT peers dial; empty: `listen` (with its bound port)
  std::string clusterTokenFile;  // the shared cluster token; required off loopback (>= 32 bytes)
  std::vector<std::string> peers;  // static membership: the other daemons' HOST:PORT
  std::string etcd;                // http://HOST:PORT: membership through etcd v3 instead
  std::string cluster = "kvtier";  // the cluster's name under /kvtier/ in etcd
  std::string nodeId;              // empty: the cold tier's node id, or a random one
  uint32_t peerTimeoutMs = 2000;   // deadline of every call to a peer
  uint32_t pinLeaseMs = 5000;      // how long a holder keeps blocks pinned for a fetch, at most
  uint32_t etcdLeaseTtlSeconds = 5;
  // Access control (docs/security.md). `allowGroup`: a group name or gid whose members may use
  // the daemon besides root and its own user (empty: the daemon's group); the socket is chgrp'd
  // to it. Tenant quota: the most host-pool bytes one tenant's blocks may take, as bytes or as a
  // percentage of --host-pool-bytes (both 0: no quota).
  std::string allowGroup;
  uint64_t tenantQuotaBytes = 0;
  uint32_t tenantQuotaPercent = 0;
  bool showHelp = false;
  bool showVersion = false;  // --version

  // The tenant quota in bytes for this pool size (0: none).
  uint64_t effectiveTenantQuota() const {
    if (tenantQuotaPercent != 0) {
      return hostPoolBytes / 100 * tenantQuotaPercent + hostPoolBytes % 100 * tenantQuotaPercent / 100;
    }
    return tenantQuotaBytes;
  }
  std::string effectiveSocketPath() const {
    return socketPath.empty() ? dataDir + "/kvtierd.sock" : socketPath;
  }
};

// "64M" -> 67108864. Suffixes K, M, G, T (powers of 1024), optionally followed by "i" or "iB"/"B".
Result<uint64_t> parseByteSize(std::string_view text);

// Parses kvtierd's command line (argv[0] excluded). INVALID_ARGUMENT names the bad flag.
Result<DaemonConfig> parseDaemonArgs(const std::vector<std::string>& args);

const char* daemonUsage();

// "kvtierd 0.1.0": the project's version (the top CMakeLists.txt's project(VERSION)), as
// `kvtierd --version` prints it and every client's hello is answered with it.
const char* daemonVersion();

}  // namespace kvtier
