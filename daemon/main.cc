// kvtierd: the node's KV-cache daemon. Wires config, host pool, engine and RPC server together.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kj/async-unix.h>
#include <kj/debug.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "daemon/cold_service.h"
#include "daemon/config.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/server.h"
#include "kernels/rope.h"
#include "store/engine.h"
#include "transport/host_pool.h"

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

// Segment names carry a digest of the data directory, so daemons with different data directories
// never collide and a restarted one finds what its predecessor left.
std::string segmentPrefix(const std::filesystem::path& dataDir) {
  Sha256 sha;
  sha.begin();
  const std::string abs = std::filesystem::absolute(dataDir).lexically_normal().string();
  sha.update(abs.data(), abs.size());
  auto digest = sha.finish();
  Key128 k;
  std::memcpy(k.bytes.data(), digest.data(), k.bytes.size());
  return "kvtier-" + k.hex().substr(0, 12) + "-";
}

int run(const DaemonConfig& config) {
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
  auto pool = HostPool::create(prefix, config.hostPoolBytes, config.extentBytes);
  if (!pool) {
    logWarn("startup_failed", "reason=\"" + pool.error().message() + "\"");
    return 1;
  }
  BlockPool blocks((*pool)->extents());
  kernels::CpuKeyRotator rotator;
  Engine engine(blocks, **pool, nullptr, &rotator);

  const std::string socketPath = config.effectiveSocketPath();
  ::unlink(socketPath.c_str());  // we hold the lock: any socket file here is a dead daemon's

  kj::UnixEventPort::captureSignal(SIGTERM);
  kj::UnixEventPort::captureSignal(SIGINT);
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

  std::unique_ptr<ColdService> cold;
  if (config.coldTier) {
    auto tier = ColdTier::open({.path = config.dataDir + "/cold",
                                .capacityBytes = config.diskBytes,
                                .fileSystem = nullptr});
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
  Server server(engine, **pool, cold.get());
  logInfo("ready", "socket=" + socketPath +
                       " host_pool_bytes=" + std::to_string(config.hostPoolBytes) +
                       " extents=" + std::to_string((*pool)->extentCount()) +
                       " pid=" + std::to_string(::getpid()));
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
  std::printf("kvtierd ready socket=%s metrics=%s segments=%s\n", socketPath.c_str(),
              metricsAt.c_str(), prefix.c_str());
  std::fflush(stdout);

  auto stop = io.unixEventPort.onSignal(SIGTERM).exclusiveJoin(io.unixEventPort.onSignal(SIGINT));
  kj::Promise<void> accepting = server.acceptLoop(*listener);
  if (metricsServer) {
    accepting = accepting.exclusiveJoin(metricsServer->listenHttp(*metricsListener));
  }
  auto serving = accepting.then([]() -> siginfo_t { KJ_UNREACHABLE; });
  const siginfo_t signal = stop.exclusiveJoin(kj::mv(serving)).wait(io.waitScope);
  logInfo("shutdown", "signal=" + std::to_string(signal.si_signo) +
                          " sessions=" + std::to_string(server.sessions()));
  listener = nullptr;
  metricsServer = nullptr;
  metricsListener = nullptr;
  ::unlink(socketPath.c_str());
  if (cold && config.flushOnExit) cold->flushAll(io.waitScope);
  return 0;
  // Server (connections and their leases), engine, then pool (segments removed) are destroyed here.
}

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) {
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
  return kvtier::run(*config);
}
