// kvtierd: the node's KV-cache daemon. Wires config, host pool, engine and RPC server together.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <kj/async-unix.h>
#include <kj/debug.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/cluster/cluster.h"
#include "daemon/cold_service.h"
#include "daemon/config.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/scheduling.h"
#include "daemon/server.h"
#include "daemon/shutdown_watchdog.h"
#include "kernels/rope.h"
#include "store/engine.h"
#include "transport/busy_poll.h"
#include "transport/host_pool.h"
#ifdef KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/gpu.h"
#include "transport/cuda_pool.h"
#endif

namespace kvtier {
namespace {

// Holds an exclusive flock on <dataDir>/kvtierd.lock: one daemon per data directory, and whatever
// segments or socket carry this directory's name were left by a dead one.
class InstanceLock {
 public:
  static Result<InstanceLock> acquire(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
      return makeError(ErrorCode::kUnavailable, "cannot open lock file ", path, ": ",
                       strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      return makeError(ErrorCode::kUnavailable, "another kvtierd holds ", path);
    }
    return InstanceLock(fd);
  }
  InstanceLock(InstanceLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  InstanceLock(const InstanceLock&) = delete;
  ~InstanceLock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  explicit InstanceLock(int fd) : fd_(fd) {}
  int fd_;
};

// Serves the metrics endpoint's connections: at most kMaxMetricsConnections at once (more are
// closed as they come), and a failed accept (out of descriptors) is logged and tried again — it
// never ends the daemon.
class MetricsAcceptor final : private kj::TaskSet::ErrorHandler {
 public:
  static constexpr size_t kMaxMetricsConnections = 64;
  MetricsAcceptor(kj::ConnectionReceiver& listener, kj::HttpServer& http, kj::Timer& timer)
      : listener_(listener), http_(http), timer_(timer), connections_(*this) {}
  kj::Promise<void> run() {
    // (kj's accept() throws at once when accept(2) fails: evalNow makes that a rejection too.)
    return kj::evalNow([this] { return listener_.accept(); }).then(
        [this](kj::Own<kj::AsyncIoStream> connection) {
          if (open_ < kMaxMetricsConnections) {
            ++open_;
            connections_.add(
                http_.listenHttp(kj::mv(connection)).attach(kj::defer([this] { --open_; })));
          }  // else dropped here: closed
          return run();
        },
        [this](kj::Exception&& e) {
          logWarn("accept_failed", "listener=metrics reason=\"" +
                                       std::string(e.getDescription().cStr()).substr(0, 200) +
                                       "\"");
          return timer_.afterDelay(kAcceptRetryDelay).then([this] { return run(); });
        });
  }

 private:
  void taskFailed(kj::Exception&&) override {}  // one connection's end: nothing to do
  kj::ConnectionReceiver& listener_;
  kj::HttpServer& http_;
  kj::Timer& timer_;
  size_t open_ = 0;
  kj::TaskSet connections_;
};

// The soft limit on open descriptors raised to the hard one: every client, peer and metrics
// connection takes one, and the usual soft limit of 1024 is a few hundred clients.
void raiseDescriptorLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// Whether something listens on the Unix socket at `path` now (without waiting: a listener whose
// backlog is full answers EAGAIN, and is there all the same).
bool socketServed(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  const bool served =
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 || errno == EAGAIN;
  ::close(fd);
  return served;
}

// Segment names carry a digest of the data directory — its path, and the device and inode it is
// on (two containers that mount other volumes at the same path, in one IPC namespace, get other
// names) — so daemons with different data directories never collide and a restarted one finds
// what its predecessor left.
std::string segmentPrefix(const std::filesystem::path& dataDir) {
  Sha256 sha;
  sha.begin();
  const std::string abs = std::filesystem::absolute(dataDir).lexically_normal().string();
  sha.update(abs.data(), abs.size());
  struct stat st{};
  if (::stat(abs.c_str(), &st) == 0) {
    const uint64_t where[2] = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
    sha.update(where, sizeof where);
  }
  auto digest = sha.finish();
  Key128 k;
  std::memcpy(k.bytes.data(), digest.data(), k.bytes.size());
  return "kvtier-" + k.hex().substr(0, 12) + "-";
}

// The GPU pools: with a CUDA build, one per chosen device (none on a machine without GPUs),
// the host pool registered with CUDA for asynchronous copies, and the tier service that moves
// blocks between them. Without CUDA, nothing: the host pool is the pool.
class GpuPools {
 public:
  Status open(const DaemonConfig& config, HostPool& host) {
#ifdef KVTIER_HAVE_CUDA
    if (config.gpuPoolBytes == 0 || (!config.allGpus && config.gpus.empty())) return {};
    const int present = kernels::gpu::deviceCount();
    std::vector<int> devices = config.gpus;
    if (config.allGpus) {
      for (int d = 0; d < present; ++d) devices.push_back(d);
      if (present == 0) logInfo("gpu_pools", "none=\"" + kernels::gpu::noDeviceReason() + "\"");
    }
    uint32_t nextId = static_cast<uint32_t>(host.extentCount());
    for (int d : devices) {
      if (d >= present) {
        return makeError(ErrorCode::kInvalidArgument, "--gpus names device ", d, " but ", present,
                         " are present");
      }
      auto pool = DevicePool::create(d, config.gpuPoolBytes, config.extentBytes, nextId);
      if (!pool) return pool.error();
      nextId += static_cast<uint32_t>((*pool)->extents().size());
      logInfo("gpu_pool", "device=" + std::to_string(d) +
                              " bytes=" + std::to_string(config.gpuPoolBytes) +
                              " extents=" + std::to_string((*pool)->extents().size()));
      devices_.push_back(std::move(pool).value());
    }
    if (devices_.empty()) return {};
    // Pinned host memory: host<->device moves are asynchronous DMA (best effort: pageable copies
    // still work, slower).
    for (uint32_t i = 0; i < host.extentCount(); ++i) {
      hostExtents_.push_back({host.segment(i).data(), host.segment(i).size()});
      auto reg = HostRegistration::create(host.segment(i).data(), host.segment(i).size());
      if (reg) {
        registrations_.push_back(std::move(reg).value());
      } else {
        logWarn("host_pool_not_pinned", reg.error().message());
      }
    }
    memory_ =
        std::make_unique<TieredMemory>(host, static_cast<uint32_t>(host.extentCount()), devices_);
#else
    if (!config.allGpus && !config.gpus.empty()) {
      return makeError(ErrorCode::kNotSupported, "--gpus: this kvtierd was built without CUDA");
    }
    (void)host;
#endif
    return {};
  }

  size_t count() const {
#ifdef KVTIER_HAVE_CUDA
    return devices_.size();
#else
    return 0;
#endif
  }

  std::vector<BlockPool::Extent> extents(HostPool& host) const {
    auto out = host.extents();
#ifdef KVTIER_HAVE_CUDA
    for (const auto& x : deviceExtents(devices_)) out.push_back(x);
#endif
    return out;
  }

  BlockMemory& memory(HostPool& host) {
    if (memory_) return *memory_;
    return host;
  }

  std::unique_ptr<TierService> tierService(Engine& engine) {
#ifdef KVTIER_HAVE_CUDA
    if (devices_.empty()) return nullptr;
    auto mover = std::make_shared<CudaBlockMover>(hostExtents_, devices_);
    std::vector<uint8_t> tiers;
    for (size_t i = 0; i < devices_.size(); ++i) tiers.push_back(BlockPool::gpuTier(i));
    return std::make_unique<TierService>(
        engine, [mover](std::span<const BlockCopy> copies) { return mover->copy(copies); },
        std::move(tiers));
#else
    (void)engine;
    return nullptr;
#endif
  }

  std::vector<GpuPoolExport> exports() const {
    std::vector<GpuPoolExport> out;
#ifdef KVTIER_HAVE_CUDA
    for (size_t i = 0; i < devices_.size(); ++i) {
      GpuPoolExport g;
      g.device = devices_[i]->device();
      g.pciBusId = pciBusId(g.device);
      g.tier = BlockPool::gpuTier(i);
      for (const auto& x : devices_[i]->extents()) {
        g.extents.push_back({x.id, x.bytes, {x.handle.begin(), x.handle.end()}});
      }
      out.push_back(std::move(g));
    }
#endif
    return out;
  }

 private:
  std::unique_ptr<BlockMemory> memory_;
#ifdef KVTIER_HAVE_CUDA
  // Freed only when run() returns: the engine, tier service and server (declared after this
  // object) are gone by then, and so is every client connection that could hold a mapping.
  std::vector<std::unique_ptr<DevicePool>> devices_;
  std::vector<MemoryRange> hostExtents_;  // for the tier mover: copies never cross extents
  std::vector<std::unique_ptr<HostRegistration>> registrations_;
#endif
};

// The cluster token from --cluster-token-file (trailing newlines dropped); empty without one.
Result<std::string> readClusterToken(const std::string& path) {
  if (path.empty()) return std::string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return makeError(ErrorCode::kInvalidArgument, "cannot read --cluster-token-file ", path);
  // At most one byte past the bound is read: a file that never ends (/dev/zero) is refused too.
  std::string token(4096 + 3, '\0');
  in.read(token.data(), static_cast<std::streamsize>(token.size()));
  token.resize(static_cast<size_t>(in.gcount()));
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (token.size() > 4096) {
    return makeError(ErrorCode::kInvalidArgument, "--cluster-token-file holds over 4096 bytes");
  }
  return token;
}

// `text` as a log field's value: in double quotes, any inside made single.
std::string quotedField(std::string text) {
  for (auto& c : text) {
    if (c == '"') c = '\'';
  }
  return "\"" + text + "\"";
}

std::string randomNodeId() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return std::string("node-") + buf;
}

int run(const DaemonConfig& config) {
  // SIGTERM and SIGINT are blocked now, before anything starts a thread: a thread inherits the
  // mask it starts with, and one started earlier (the CUDA driver's, when GPU pools open) would
  // take the signal with its default action and end the process without the clean stop that
  // removes the socket and the pool's segments.
  kj::UnixEventPort::captureSignal(SIGTERM);
  kj::UnixEventPort::captureSignal(SIGINT);
  raiseDescriptorLimit();
  // A cluster listener off loopback without a strong token is refused before anything starts.
  auto token = readClusterToken(config.clusterTokenFile);
  if (!token) {
    logWarn("startup_failed", "reason=\"" + token.error().message() + "\"");
    return 1;
  }
  if (!config.listen.empty()) {
    if (auto s = checkClusterToken(config.listen, *token); !s) {
      logWarn("startup_failed", "reason=\"" + s.error().message() + "\"");
      return 1;
    }
  }
  // Access control (docs/security.md): the allowed group, resolved before anything is made.
  AccessPolicy access{static_cast<int64_t>(::geteuid()), static_cast<int64_t>(::getegid())};
  if (!config.allowGroup.empty()) {
    auto gid = resolveGroup(config.allowGroup);
    if (!gid) {
      logWarn("startup_failed", "reason=\"" + gid.error().message() + "\"");
      return 1;
    }
    access.allowedGid = *gid;
  }
  std::error_code ec;
  std::filesystem::create_directories(config.dataDir, ec);
  if (ec) {
    logWarn("startup_failed",
            "reason=\"cannot create data dir " + config.dataDir + ": " + ec.message() + "\"");
    return 1;
  }
  auto lock = InstanceLock::acquire(config.dataDir + "/kvtierd.lock");
  if (!lock) {
    logWarn("startup_failed", "reason=\"" + lock.error().message() + "\"");
    return 1;
  }
  const std::string prefix = segmentPrefix(config.dataDir);
  if (size_t stale = removeStaleSegments(prefix); stale > 0) {
    logInfo("stale_segments_removed", "count=" + std::to_string(stale));
  }
  // Every page is allocated and faulted in here (transport/shm_segment.h): seconds for a large
  // pool, and a shortage of memory or huge pages is an error now rather than a SIGBUS later.
  auto pool = HostPool::create(HostPoolOptions{.prefix = prefix,
                                               .bytes = config.hostPoolBytes,
                                               .extentBytes = config.extentBytes,
                                               .hugePages = config.hugePages});
  if (!pool) {
    std::string why = pool.error().message();
    if (config.hugePages == HugePages::kOn) {
      why = "--huge-pages on: " + why +
            " (an operator reserves them: echo N > /proc/sys/vm/nr_hugepages)";
    }
    // Nothing of the pool is left behind: the segments made before the failure are removed.
    logWarn("startup_failed", "reason=" + quotedField(why) + " segments=" + prefix);
    return 1;
  }
  // Declared here, destroyed after everything made below it (the cold tier's close included)
  // and before the pool: the bound of a stop (made at the signal).
  std::optional<ShutdownWatchdog> watchdog;
  // The pool's pages, as the ready line, stats and metrics tell them.
  std::string poolPages = std::string(" pool_pages=") + pageKindName((*pool)->pages());
  if ((*pool)->pages() != PageKind::kHuge2M) {
    poolPages += " pool_pages_reason=" + quotedField((*pool)->pagesReason());
  }
  logInfo("host_pool", "bytes=" + std::to_string((*pool)->bytes()) +
                           " extents=" + std::to_string((*pool)->extentCount()) + poolPages);
  GpuPools gpus;
  if (auto s = gpus.open(config, **pool); !s) {
    logWarn("startup_failed", "reason=\"" + s.error().message() + "\"");
    return 1;
  }
  BlockPool blocks(gpus.extents(**pool));
  kernels::CpuKeyRotator rotator;
  Engine engine(blocks, gpus.memory(**pool), makeEvictionPolicy(config.eviction), &rotator);
  engine.setTenantQuota(config.effectiveTenantQuota());
  std::unique_ptr<TierService> tiers = gpus.tierService(engine);

  const std::string socketPath = config.effectiveSocketPath();
  // The lock covers the data directory, and --socket may lie outside it: a socket another daemon
  // serves there is not ours to take, and a path that is not a socket is not ours to remove.
  struct stat existing{};
  if (::lstat(socketPath.c_str(), &existing) == 0) {
    if (!S_ISSOCK(existing.st_mode)) {
      logWarn("startup_failed", "reason=\"" + socketPath + " exists and is not a socket\"");
      return 1;
    }
    if (socketServed(socketPath)) {
      logWarn("startup_failed",
              "reason=\"another process serves " + socketPath + " (another kvtierd?)\"");
      return 1;
    }
    ::unlink(socketPath.c_str());  // a dead daemon's
  }

  auto io = kj::setupAsyncIo();
  kj::Own<kj::ConnectionReceiver> listener;
  KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] {
                 auto address = io.provider->getNetwork()
                                    .parseAddress(kj::str("unix:", socketPath.c_str()))
                                    .wait(io.waitScope);
                 const mode_t old = ::umask(0117);  // the socket is created 0660
                 listener = address->listen();
                 ::umask(old);
               })) {
    logWarn("startup_failed",
            "reason=\"cannot listen on " + socketPath + ": " + e->getDescription().cStr() + "\"");
    return 1;
  }
  ::chmod(socketPath.c_str(), 0660);
  // The socket's group is the allowed group: its members can connect (rw-rw----), and are then
  // admitted by SO_PEERCRED / SO_PEERGROUPS (Server::accept). Changing it needs root or
  // membership of the group.
  if (!config.allowGroup.empty() && ::chown(socketPath.c_str(), static_cast<uid_t>(-1),
                                            static_cast<gid_t>(access.allowedGid)) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(socketPath.c_str());
    logWarn("startup_failed", "reason=\"cannot give " + socketPath + " to group " +
                                  std::to_string(access.allowedGid) + " (--allow-group): " + why +
                                  "\"");
    return 1;
  }

  std::unique_ptr<ColdService> cold;
  if (config.coldTier) {
    std::error_code error;
    auto tier = ColdTier::open({.path = config.dataDir + "/cold",
                                .capacityBytes = config.diskBytes,
                                .fileSystem = nullptr,
                                .checker = std::filesystem::read_symlink("/proc/self/exe", error),
                                .writeBytesPerSecond = config.diskWriteBytesPerSecond});
    if (!tier) {
      logWarn("startup_failed", "reason=\"" + tier.error().message() + "\"");
      return 1;
    }
    const ColdStats cs = (*tier)->stats();
    logInfo("cold_tier_open",
            "path=" + config.dataDir + "/cold records=" + std::to_string(cs.records) +
                " bytes=" + std::to_string(cs.bytes) + " node=" + (*tier)->nodeId());
    cold = std::make_unique<ColdService>(engine, std::move(tier).value(), io.provider->getTimer());
  }
  // The cluster, when asked for: before the server, which borrows it.
  std::unique_ptr<ClusterService> cluster;
  if (!config.listen.empty()) {
    ClusterOptions co;
    co.nodeId = !config.nodeId.empty() ? config.nodeId : randomNodeId();
    co.listen = config.listen;
    co.advertise = config.advertise;
    co.token = *token;
    co.peers = config.peers;
    co.etcd = config.etcd;
    co.clusterName = config.cluster;
    co.etcdLeaseTtlSeconds = config.etcdLeaseTtlSeconds;
    co.peerTimeout = config.peerTimeoutMs * kj::MILLISECONDS;
    co.pinLease = config.pinLeaseMs * kj::MILLISECONDS;
    const char* corrupt = std::getenv("KVTIER_TEST_CORRUPT_SERVED");
    co.corruptServedForTest = corrupt && std::string(corrupt) == "1";
    if (cold) co.placesFile = config.dataDir + "/cluster-places";
    cluster = std::make_unique<ClusterService>(engine, **pool, cold.get(), tiers.get(), io,
                                               std::move(co));
    if (auto s = cluster->start(); !s) {
      logWarn("startup_failed", "reason=\"" + s.error().message() + "\"");
      return 1;
    }
  }
  // Before the server, which borrows it: destroyed after it.
  BusyPoller poller(io.provider->getTimer(), std::chrono::microseconds(config.busyPollMicros));
  Server server(engine, **pool, cold.get(), tiers.get(), gpus.exports(), &poller, cluster.get());
  server.setAccess(access);
  // See daemon/scheduling.h. Measured on the 2-vCPU development VM: hot lookup p99 while spilling
  // 0.6 ms against 1.6-1.8 ms with the default slice.
  const bool shortSlice = requestSlice(kShortestSlice);
  logInfo("ready", "socket=" + socketPath + " host_pool_bytes=" + std::to_string((*pool)->bytes()) +
                       " extents=" + std::to_string((*pool)->extentCount()) + " gpus=" +
                       std::to_string(gpus.count()) + " pid=" + std::to_string(::getpid()) +
                       " busy_poll_us=" + std::to_string(config.busyPollMicros) +
                       " eviction=" + evictionName(config.eviction) +
                       " allowed_gid=" + std::to_string(access.allowedGid) +
                       " tenant_quota_bytes=" + std::to_string(config.effectiveTenantQuota()) +
                       " short_slice=" + (shortSlice ? "yes" : "no"));
  // Prometheus metrics over HTTP, when asked for.
  kj::HttpHeaderTable headerTable;
  MetricsService metrics(headerTable, [&server] { return server.metricsText(); });
  kj::Own<kj::ConnectionReceiver> metricsListener;
  kj::Own<kj::HttpServer> metricsServer;
  std::string metricsAt = "off";
  if (!config.metricsAddr.empty()) {
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] {
                   auto address = io.provider->getNetwork()
                                      .parseAddress(config.metricsAddr.c_str())
                                      .wait(io.waitScope);
                   metricsListener = address->listen();
                   metricsServer =
                       kj::heap<kj::HttpServer>(io.provider->getTimer(), headerTable, metrics);
                 })) {
      logWarn("startup_failed", "reason=\"cannot serve metrics on " + config.metricsAddr + ": " +
                                    e->getDescription().cStr() + "\"");
      return 1;
    }
    const std::string host = config.metricsAddr.substr(0, config.metricsAddr.rfind(':'));
    metricsAt = host + ":" + std::to_string(metricsListener->getPort());
  }
  // Tests and scripts wait for this line on stdout.
  const std::string peerAt = cluster ? cluster->address() : "off";
  const std::string nodeAt = cluster ? cluster->nodeId() : "-";
  std::printf("kvtierd ready socket=%s metrics=%s segments=%s peer=%s node=%s%s\n",
              socketPath.c_str(), metricsAt.c_str(), prefix.c_str(), peerAt.c_str(), nodeAt.c_str(),
              poolPages.c_str());
  std::fflush(stdout);

  auto stop = io.unixEventPort.onSignal(SIGTERM).exclusiveJoin(io.unixEventPort.onSignal(SIGINT));
  kj::Promise<void> accepting =
      server.acceptLoop(*listener, io.unixEventPort, io.provider->getTimer());
  kj::Own<MetricsAcceptor> metricsAcceptor;
  if (metricsServer) {
    metricsAcceptor =
        kj::heap<MetricsAcceptor>(*metricsListener, *metricsServer, io.provider->getTimer());
    accepting = accepting.exclusiveJoin(metricsAcceptor->run());
  }
  auto serving = accepting.then([]() -> siginfo_t { KJ_UNREACHABLE; });
  const siginfo_t signal = stop.exclusiveJoin(kj::mv(serving)).wait(io.waitScope);
  // The stop is bounded: the flush gets until a little before the deadline (the rest is for
  // closing the tier and the pool), and at the deadline the watchdog ends whatever still runs.
  const auto stopping = std::chrono::steady_clock::now();
  const std::chrono::milliseconds timeout(config.shutdownTimeoutMs);
  const auto deadline = stopping + timeout;
  const auto flushDeadline =
      deadline - std::min<std::chrono::milliseconds>(std::chrono::milliseconds(2000), timeout / 4);
  std::vector<std::string> segmentNames;
  for (size_t i = 0; i < (*pool)->extentCount(); ++i) {
    if (!(*pool)->segment(static_cast<uint32_t>(i)).anonymous()) {
      segmentNames.push_back((*pool)->segment(static_cast<uint32_t>(i)).name());
    }
  }
  watchdog.emplace(deadline, socketPath, std::move(segmentNames));
  logInfo("shutdown", "signal=" + std::to_string(signal.si_signo) +
                          " sessions=" + std::to_string(server.sessions()) +
                          " timeout_ms=" + std::to_string(config.shutdownTimeoutMs));
  listener = nullptr;
  metricsAcceptor = nullptr;
  metricsServer = nullptr;
  metricsListener = nullptr;
  ::unlink(socketPath.c_str());
  if (cluster) cluster->leave().wait(io.waitScope);  // etcd: the others see us go now
  if (cold && config.flushOnExit && !cold->flushAll(io.waitScope, flushDeadline)) {
    // A write still runs on the cold tier's worker, reading the pool: nothing may be destroyed
    // under it.
    watchdog->endNow("a cold-tier write in flight did not finish by the shutdown deadline");
  }
  logInfo("shutdown_flushed",
          "ms=" + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::steady_clock::now() - stopping)
                                     .count()));
  return 0;
  // Server (connections and their leases), engine, then pool (segments removed) are destroyed here.
}

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) {
  // The cold tier's table check, which kvtierd runs in a process of its own before it opens the
  // tier (ColdTier::verifyTables).
  if (argc == 3 && std::string_view(argv[1]) == "--check-cold-tier") {
    return kvtier::checkColdTables(argv[2], STDOUT_FILENO);
  }
  ::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  auto config = kvtier::parseDaemonArgs(args);
  if (!config) {
    std::fprintf(stderr, "kvtierd: %s\n%s", config.error().message().c_str(),
                 kvtier::daemonUsage());
    return 2;
  }
  if (config->showHelp) {
    std::fputs(kvtier::daemonUsage(), stdout);
    return 0;
  }
  if (config->showVersion) {
    std::printf("%s\n", kvtier::daemonVersion());
    return 0;
  }
  return kvtier::run(*config);
}
