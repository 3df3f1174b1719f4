#include "daemon/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include "transport/busy_poll.h"
#include "transport/pool_fds.h"

// The project's version, from the top CMakeLists.txt (daemon/CMakeLists.txt passes it).
#ifndef KVTIER_VERSION
#error "KVTIER_VERSION is not defined"
#endif

namespace kvtier {
namespace {
constexpr unsigned long kMaxBusyPollMicros = kMaxBusyPoll.count();
}  // namespace

Result<uint64_t> parseByteSize(std::string_view text) {
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) {
    return makeError(ErrorCode::kInvalidArgument, "'", text, "' is not a size (e.g. 512M, 4G)");
  }
  std::string suffix(end, text.data() + text.size());
  for (auto& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const char* tail : {"IB", "B", "I"}) {
    const std::string_view t(tail);
    if (suffix.size() > t.size() && suffix.ends_with(t)) {
      suffix.resize(suffix.size() - t.size());
      break;
    }
  }
  int shift = 0;
  if (suffix.empty() || suffix == "B")
    shift = 0;
  else if (suffix == "K")
    shift = 10;
  else if (suffix == "M")
    shift = 20;
  else if (suffix == "G")
    shift = 30;
  else if (suffix == "T")
    shift = 40;
  else
    return makeError(ErrorCode::kInvalidArgument, "unknown size suffix in '", text, "'");
  if (shift > 0 && value > (UINT64_MAX >> shift)) {
    return makeError(ErrorCode::kInvalidArgument, "size '", text, "' overflows");
  }
  return value << shift;
}

Result<DaemonConfig> parseDaemonArgs(const std::vector<std::string>& args) {
  DaemonConfig config;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    const bool hasInline = flag.find('=') != std::string::npos;
    if (hasInline) {
      value = flag.substr(flag.find('=') + 1);
      flag = flag.substr(0, flag.find('='));
    }
    if (flag == "-h" || flag == "--help") {
      config.showHelp = true;
      continue;
    }
    if (flag == "--version" && !hasInline) {
      config.showVersion = true;
      continue;
    }
    if (!hasInline) {
      if (i + 1 >= args.size())
        return makeError(ErrorCode::kInvalidArgument, flag, " needs a value");
      value = args[++i];
    }
    if (flag == "--socket") {
      if (value.empty()) return makeError(ErrorCode::kInvalidArgument, "--socket is empty");
      config.socketPath = value;
    } else if (flag == "--data-dir") {
      if (value.empty()) return makeError(ErrorCode::kInvalidArgument, "--data-dir is empty");
      config.dataDir = value;
    } else if (flag == "--cold-tier" || flag == "--flush-on-exit") {
      if (value != "on" && value != "off") {
        return makeError(ErrorCode::kInvalidArgument, flag, " is on or off, not '", value, "'");
      }
      (flag == "--cold-tier" ? config.coldTier : config.flushOnExit) = value == "on";
    } else if (flag == "--huge-pages") {
      if (value == "auto") {
        config.hugePages = HugePages::kAuto;
      } else if (value == "on") {
        config.hugePages = HugePages::kOn;
      } else if (value == "off") {
        config.hugePages = HugePages::kOff;
      } else {
        return makeError(ErrorCode::kInvalidArgument, "--huge-pages is auto, on or off, not '",
                         value, "'");
      }
    } else if (flag == "--eviction") {
      auto kind = parseEvictionKind(value);
      if (!kind) return makeError(ErrorCode::kInvalidArgument, "--eviction: ", kind.error().message());
      config.eviction = *kind;
    } else if (flag == "--metrics-addr") {
      if (value.empty() || value.find(':') == std::string::npos) {
        return makeError(ErrorCode::kInvalidArgument, "--metrics-addr wants HOST:PORT");
      }
      config.metricsAddr = value;
    } else if (flag == "--gpus") {
      config.gpus.clear();
      config.allGpus = value == "all";
      if (value != "all" && value != "none") {
        size_t start = 0;
        while (start <= value.size()) {
          const size_t comma = std::min(value.find(',', start), value.size());
          const std::string item = value.substr(start, comma - start);
          char* end = nullptr;
          const long d = std::strtol(item.c_str(), &end, 10);
          if (item.empty() || *end != '\0' || d < 0 || d > 255) {
            return makeError(ErrorCode::kInvalidArgument,
                             "--gpus wants all, none or device numbers like 0,1; not '", value,
                             "'");
          }
          config.gpus.push_back(static_cast<int>(d));
          start = comma + 1;
        }
      }
    } else if (flag == "--gpu-pool-bytes") {
      auto bytes = parseByteSize(value);
      if (!bytes)
        return makeError(ErrorCode::kInvalidArgument, flag, ": ", bytes.error().message());
      config.gpuPoolBytes = *bytes;
    } else if (flag == "--busy-poll-us") {
      char* end = nullptr;
      const unsigned long us = std::strtoul(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || value[0] == '-' || us > kMaxBusyPollMicros) {
        return makeError(ErrorCode::kInvalidArgument, "--busy-poll-us wants 0 to ",
                         kMaxBusyPollMicros, " microseconds, not '", value, "'");
      }
      config.busyPollMicros = static_cast<uint32_t>(us);
    } else if (flag == "--disk-bytes") {
      auto bytes = parseByteSize(value);
      if (!bytes)
        return makeError(ErrorCode::kInvalidArgument, flag, ": ", bytes.error().message());
      config.diskBytes = *bytes;
    } else if (flag == "--host-pool-bytes" || flag == "--extent-bytes") {
      auto bytes = parseByteSize(value);
      if (!bytes)
        return makeError(ErrorCode::kInvalidArgument, flag, ": ", bytes.error().message());
      if (*bytes == 0) return makeError(ErrorCode::kInvalidArgument, flag, " must be positive");
      (flag == "--host-pool-bytes" ? config.hostPoolBytes : config.extentBytes) = *bytes;
    } else if (flag == "--listen" || flag == "--advertise") {
      if (value.empty() || value.rfind(':') == std::string::npos || value.rfind(':') == 0 ||
          value.back() == ':') {
        return makeError(ErrorCode::kInvalidArgument, flag, " wants HOST:PORT, not '", value, "'");
      }
      (flag == "--listen" ? config.listen : config.advertise) = value;
    } else if (flag == "--cluster-token-file") {
      config.clusterTokenFile = value;
    } else if (flag == "--peers") {
      config.peers.clear();
      size_t start = 0;
      while (start < value.size()) {
        const size_t comma = std::min(value.find(',', start), value.size());
        const std::string item = value.substr(start, comma - start);
        if (item.rfind(':') == std::string::npos || item.rfind(':') == 0 || item.back() == ':') {
          return makeError(ErrorCode::kInvalidArgument, "--peers wants HOST:PORT,...; not '",
                           item, "'");
        }
        config.peers.push_back(item);
        start = comma + 1;
      }
    } else if (flag == "--etcd") {
      if (!value.starts_with("http://") || value.size() == 7) {
        return makeError(ErrorCode::kInvalidArgument, "--etcd wants http://HOST:PORT, not '",
                         value, "'");
      }
      config.etcd = value;
    } else if (flag == "--cluster" || flag == "--node-id") {
      const bool ok = !value.empty() && value.size() <= 64 &&
                      std::all_of(value.begin(), value.end(), [](unsigned char c) {
                        return std::isalnum(c) || c == '-' || c == '_' || c == '.';
                      });
      if (!ok) {
        return makeError(ErrorCode::kInvalidArgument, flag,
                         " wants 1 to 64 of [A-Za-z0-9._-], not '", value, "'");
      }
      (flag == "--cluster" ? config.cluster : config.nodeId) = value;
    } else if (flag == "--shutdown-timeout-ms") {
      char* end = nullptr;
      const unsigned long v = std::strtoul(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || !std::isdigit(static_cast<unsigned char>(value[0])) ||
          v < 1000 || v > 3600000) {
        return makeError(ErrorCode::kInvalidArgument, flag, " wants 1000 to 3600000, not '", value,
                         "'");
      }
      config.shutdownTimeoutMs = static_cast<uint32_t>(v);
    } else if (flag == "--disk-write-rate") {
      auto bytes = parseByteSize(value);
      if (!bytes) {
        return makeError(ErrorCode::kInvalidArgument, flag, " wants bytes per second (e.g. 200M; ",
                         "0: unlimited): ", bytes.error().message());
      }
      if (*bytes != 0 && *bytes < (uint64_t{64} << 10)) {
        return makeError(ErrorCode::kInvalidArgument, flag, " of ", *bytes,
                         " bytes per second is below 64K");
      }
      config.diskWriteBytesPerSecond = *bytes;
    } else if (flag == "--peer-timeout-ms" || flag == "--pin-lease-ms" ||
               flag == "--etcd-lease-ttl") {
      char* end = nullptr;
      const unsigned long v = std::strtoul(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || value[0] == '-' || v == 0 || v > 600000) {
        return makeError(ErrorCode::kInvalidArgument, flag, " wants 1 to 600000, not '", value,
                         "'");
      }
      if (flag == "--peer-timeout-ms") config.peerTimeoutMs = static_cast<uint32_t>(v);
      if (flag == "--pin-lease-ms") config.pinLeaseMs = static_cast<uint32_t>(v);
      if (flag == "--etcd-lease-ttl") config.etcdLeaseTtlSeconds = static_cast<uint32_t>(v);
    } else if (flag == "--allow-group") {
      // Resolved against the group database at start (resolveGroup, daemon/access.h).
      if (value.empty()) return makeError(ErrorCode::kInvalidArgument, "--allow-group is empty");
      config.allowGroup = value;
    } else if (flag == "--tenant-quota") {
      config.tenantQuotaBytes = 0;
      config.tenantQuotaPercent = 0;
      if (!value.empty() && value.back() == '%') {
        const std::string digits = value.substr(0, value.size() - 1);
        char* end = nullptr;
        const unsigned long pct = std::strtoul(digits.c_str(), &end, 10);
        if (digits.empty() || *end != '\0' || digits[0] == '-' || pct == 0 || pct > 100) {
          return makeError(ErrorCode::kInvalidArgument,
                           "--tenant-quota wants a size (e.g. 8G) or 1% to 100%, not '", value,
                           "'");
        }
        config.tenantQuotaPercent = static_cast<uint32_t>(pct);
      } else {
        auto bytes = parseByteSize(value);
        if (!bytes) {
          return makeError(ErrorCode::kInvalidArgument, "--tenant-quota wants a size (e.g. 8G) ",
                           "or a percentage (e.g. 25%): ", bytes.error().message());
        }
        if (*bytes == 0) {
          return makeError(ErrorCode::kInvalidArgument, "--tenant-quota must be positive");
        }
        config.tenantQuotaBytes = *bytes;
      }
    } else {
      return makeError(ErrorCode::kInvalidArgument, "unknown flag '", flag, "' (see --help)");
    }
  }
  if (config.listen.empty() && (!config.peers.empty() || !config.etcd.empty())) {
    return makeError(ErrorCode::kInvalidArgument,
                     "--peers and --etcd need --listen HOST:PORT (the peer listener)");
  }
  if (!config.peers.empty() && !config.etcd.empty()) {
    return makeError(ErrorCode::kInvalidArgument, "--peers and --etcd exclude each other");
  }
  // Clients map the pool extent by extent, and a pool on huge pages hands them a descriptor per
  // extent in one reply (transport/pool_fds.h): a bound on their number.
  if (const uint64_t extents = (config.hostPoolBytes + config.extentBytes - 1) / config.extentBytes;
      extents > pool_fds::kMaxExtents) {
    return makeError(ErrorCode::kInvalidArgument, "--host-pool-bytes ", config.hostPoolBytes,
                     " in extents of ", config.extentBytes, " bytes makes ", extents,
                     " extents, over ", pool_fds::kMaxExtents, ": give larger --extent-bytes");
  }
  return config;
}

const char* daemonVersion() { return "kvtierd " KVTIER_VERSION; }

const char* daemonUsage() {
  return "usage: kvtierd [flags]     (kvtierd --version: its version; --help: this)\n"
         "  --socket PATH           Unix socket to serve (default: <data-dir>/kvtierd.sock)\n"
         "  --data-dir DIR          lock file and socket live here (default: ./kvtier-data)\n"
         "  --host-pool-bytes N     host shared-memory pool size, K/M/G suffixes (default: 1G)\n"
         "  --extent-bytes N        size of one shared-memory extent (default: 1G)\n"
         "  --huge-pages auto|on|off\n"
         "                          the host pool on 2 MiB huge pages when enough are free\n"
         "                          (auto), or no start without them (on), or never (off)\n"
         "  --cold-tier on|off      spill evicted blocks to RocksDB under <data-dir>/cold (on)\n"
         "  --disk-bytes N          cold tier capacity: blocks held only on disk dropped first,\n"
         "                          those that left memory first first (64G; 0: none)\n"
         "  --flush-on-exit on|off  on SIGTERM, write blocks still only in memory (on)\n"
         "  --shutdown-timeout-ms N the longest a stop takes: snapshots, then the most useful\n"
         "                          blocks are written until shortly before it (20000)\n"
         "  --disk-write-rate N     the cold tier's write bandwidth per second (0: unlimited)\n"
         "  --eviction adaptive|arc|lru|2q|s3fifo|sieve\n"
         "                          which cached blocks go first when memory is full\n"
         "                          (adaptive: whichever of the others hits most here)\n"
         "  --metrics-addr H:P      serve GET /metrics (Prometheus text) on H:P (off)\n"
         "  --gpus all|none|0,1     CUDA devices that get a GPU pool (all; needs a CUDA build)\n"
         "  --gpu-pool-bytes N      GPU pool size per device, 2 MiB-aligned (1G; 0: none)\n"
         "  --busy-poll-us N        poll this long before the event loop sleeps (50; 0: "
         "never)\n"
         "access (docs/security.md):\n"
         "  --allow-group NAME|GID  members may connect besides root and the daemon's user;\n"
         "                          the socket is chgrp'd to it (default: the daemon's group)\n"
         "  --tenant-quota N|P%     most host-pool bytes one tenant (Unix user) may take\n"
         "                          (default: none)\n"
         "cluster (off unless --listen is given; docs/cluster.md):\n"
         "  --listen H:P            serve the peer protocol on H:P (port 0: any)\n"
         "  --advertise H:P         the address peers dial (default: the listener's)\n"
         "  --cluster-token-file F  the cluster token (>= 32 bytes; required off loopback)\n"
         "  --peers H:P,...         static membership: the other daemons' listeners\n"
         "  --etcd http://H:P       membership through etcd v3 instead (--cluster NAME)\n"
         "  --cluster NAME          cluster name under /kvtier/ in etcd (kvtier)\n"
         "  --node-id ID            this node's id (default: the cold tier's, or random)\n"
         "  --peer-timeout-ms N     deadline of every call to a peer (2000)\n"
         "  --pin-lease-ms N        longest a holder pins blocks for a fetch (5000)\n"
         "  --etcd-lease-ttl S      etcd lease TTL in seconds (5)\n"
         "Runs with no flags on these defaults. SIGTERM or SIGINT stop it cleanly.\n";
}

}  // namespace kvtier
