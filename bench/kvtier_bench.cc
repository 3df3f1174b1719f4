// kvtier-bench: kvtier's local data and control paths, and its cold tier, each quoted as a ratio
// against an anchor measured in the same run on the same machine (absolute times on small shared
// machines are noise).
//
//   kvtier-bench --suite local --json bench/results/local.json [--reps N] [--daemon PATH]
//   kvtier-bench --suite cold --json bench/results/cold.json [--reps N] [--daemon PATH]
//   kvtier-bench --suite cluster --json bench/results/cluster.json [--reps N] [--daemon PATH]
//
// The cold suite (runColdSuite below) starts a fresh kvtierd with the cold tier on and a 64 MiB
// pool for every repetition, and runs Debian's db_bench (rocksdb-tools) as its anchor. The cluster
// suite (runClusterSuite) starts five kvtierds of its own (two 2-node clusters on loopback and a
// lone one) and runs ucx_perftest (ucx-utils) as its anchor.
//
// The bench starts its own kvtierd (a fresh temporary data directory, a 256 MiB pool) and, when
// redis-server is on PATH, its own redis-server on a Unix socket in the same directory; both are
// stopped at the end, on failure too. After one warm-up repetition, every repetition measures each
// kvtier figure next to its anchor; a ratio is computed per repetition and reported as the median
// and min-max over repetitions, in a table and as JSON. The exit status is 0 whenever the
// measurements ran, targets met or not: this is a measurement, not a test.
#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <capnp/ez-rpc.h>

#include "tools/json_string.h"
#include "kvtier/client.h"
#include "schemas/peer.capnp.h"
#include "tools/synthetic_kv.h"
#include "transport/busy_poll.h"
#ifdef KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/gpu.h"
#endif

extern char** environ;

namespace kvtier {
namespace {

using Clock = std::chrono::steady_clock;

const char* kUsage =
    "usage: kvtier-bench --suite local|cold|gpu|cluster [--json FILE] [--reps N] [--daemon PATH]\n"
    "  --suite local   the local suite: shared-pool get/put vs memcpy, lookup round trip vs a\n"
    "                  Unix-socket ping-pong, get/put vs redis-server\n"
    "  --suite cold    the cold suite: blocks spilled to and promoted from the RocksDB cold tier\n"
    "                  vs db_bench fillrandom/readrandom, hot lookup p99 while spilling vs idle\n"
    "  --suite gpu     the GPU suite (GPU 0): paged KV gather/scatter kernels vs cudaMemcpy D2D,\n"
    "                  host->GPU pool promotion vs pinned cudaMemcpy H2D (null without a GPU)\n"
    "  --suite cluster the cluster suite: remote hits between two daemons on loopback vs\n"
    "                  ucx_perftest ucp_get (UCX_TLS=tcp and UCX's defaults), a lookup missing\n"
    "                  everywhere vs a local miss, puts on a member vs on a lone daemon\n"
    "  --json FILE     also write the figures as JSON (e.g. bench/results/local.json)\n"
    "  --reps N        measured repetitions after one warm-up (default 7)\n"
    "  --daemon PATH   the kvtierd to start (default: the one built with this binary)\n"
    "  --threading M   SDK mode: caller (default; no thread hop per call) or own\n"
    "  --busy-poll-us N  busy polling of kvtierd and the bench's clients (default: theirs, 50)\n"
    "  --hot-samples FILE  cold suite: also write every measured hot lookup as a line\n"
    "                  'REP idle|spilling START_S LATENCY_US' (START_S: CLOCK_MONOTONIC, the\n"
    "                  clock of 'perf record -k CLOCK_MONOTONIC', to line traces up)\n";

// The suite's shapes. 8 layers x 8 KV heads x head dim 64 x fp16 = 1 KiB per token and layer, so
// 16 KiB of K and V per token and 256 KiB per 16-token block; the prefix is 64 blocks, 16 MiB.
Layout benchLayout() { return Layout{"bench/256k", 8, 8, 64, DType::kFloat16, 16, {}}; }
constexpr uint64_t kPrefixTokens = 1024;
constexpr uint32_t kPrefixBlocks = 64;
constexpr const char* kPoolBytes = "256M";
// A repetition is kRounds rounds; a round runs every measurement once, back to back. Per
// repetition that is 32 gets, puts and memcpys of 16 MiB, 8 pipelined redis batches each way, and
// 2000 round trips of each kind (a repetition's round-trip figure is their median).
constexpr int kRounds = 8;
constexpr int kBandwidthIterationsPerRound = 4;
constexpr int kRttIterationsPerRound = 250;
// Iterations of the per-step breakdown printed after the ratios (it is not part of any ratio).
constexpr int kBreakdownIterations = 16;
constexpr size_t kPingBytes = 64;
// How long a child server may take to say it is ready, and to exit after SIGTERM.
constexpr auto kStartTimeout = std::chrono::seconds(15);
constexpr auto kStopTimeout = std::chrono::seconds(5);

// Set by SIGINT and SIGTERM. The suite stops at the next round and cleans up (daemon, redis, temp
// directory) instead of leaving its servers running. A global because a signal handler needs one.
volatile std::sig_atomic_t gInterrupted = 0;

extern "C" void onInterrupt(int) { gInterrupted = 1; }

double seconds(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double>(t1 - t0).count();
}

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Error unavailable(auto&&... args) { return makeError(ErrorCode::kUnavailable, args...); }

std::string lastLines(const std::string& path, size_t maxBytes = 2000) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.size() > maxBytes ? "..." + text.substr(text.size() - maxBytes) : text;
}

// ---------------------------------------------------------------------------------------------
// Processes and directories the bench owns.

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  static Result<TempDir> create() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/kvtier-bench-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      return unavailable("cannot create a temporary directory from ", pattern, ": ",
                         std::strerror(errno));
    }
    return TempDir(pattern);
  }
  TempDir(TempDir&& o) noexcept : path_(std::exchange(o.path_, {})) {}
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(std::string_view name) const { return path_ + "/" + std::string(name); }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// This process's environment with `name` removed, then set to `value` when there is one.
std::vector<std::string> environmentWith(std::string_view name,
                                         const std::optional<std::string>& value) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (!(entry.starts_with(name) && entry.size() > name.size() && entry[name.size()] == '=')) {
      env.emplace_back(entry);
    }
  }
  if (value) env.push_back(std::string(name) + "=" + *value);
  return env;
}

// A child process started with posix_spawn: stdin from /dev/null, stdout into a pipe this process
// reads (or into the log), stderr appended to a log file; the bench's environment, or `env`.
// Destruction sends SIGTERM and reaps it (SIGKILL after kStopTimeout), so a failing bench never
// leaves a server behind.
class ChildProcess {
 public:
  static Result<ChildProcess> spawn(const std::vector<std::string>& argv,
                                    const std::string& logPath, bool pipeStdout,
                                    const std::optional<std::vector<std::string>>& env = {}) {
    int pipeFds[2] = {-1, -1};
    if (pipeStdout && ::pipe2(pipeFds, O_CLOEXEC) != 0)
      return unavailable("pipe: ", std::strerror(errno));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, logPath.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (pipeStdout) {
      posix_spawn_file_actions_adddup2(&actions, pipeFds[1], STDOUT_FILENO);
    } else {
      posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
    }
    // The bench ignores SIGPIPE; its servers start with the default disposition.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t defaults;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);

    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<char*> envp;
    if (env) {
      for (const auto& e : *env) envp.push_back(const_cast<char*>(e.c_str()));
      envp.push_back(nullptr);
    }
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, argv[0].c_str(), &actions, &attr, args.data(),
                                 env ? envp.data() : environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (pipeStdout) ::close(pipeFds[1]);
    if (rc != 0) {
      if (pipeStdout) ::close(pipeFds[0]);
      return unavailable("cannot start ", argv[0], ": ", std::strerror(rc));
    }
    return ChildProcess(pid, pipeFds[0], logPath);
  }

  ChildProcess(ChildProcess&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)),
        stdout_(std::exchange(o.stdout_, -1)),
        log_(std::move(o.log_)) {}
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() {
    stop();
    if (stdout_ >= 0) ::close(stdout_);
  }

  const std::string& logPath() const { return log_; }

  // Reads the child's stdout until a line starting with `prefix`; returns that line. UNAVAILABLE
  // if the child closes its stdout (exits) first or `timeout` passes.
  Result<std::string> waitForLine(std::string_view prefix, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    std::string pending;
    for (;;) {
      for (size_t eol; (eol = pending.find('\n')) != std::string::npos; pending.erase(0, eol + 1)) {
        if (std::string_view(pending).substr(0, eol).starts_with(prefix))
          return pending.substr(0, eol);
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0)
        return unavailable("no '", prefix, "' line within ", timeout.count(), " ms");
      pollfd p{stdout_, POLLIN, 0};
      const int n = ::poll(&p, 1, static_cast<int>(left.count()));
      if (n < 0 && errno != EINTR) return unavailable("poll: ", std::strerror(errno));
      if (n <= 0) continue;
      char buf[4096];
      const ssize_t got = ::read(stdout_, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return unavailable("exited before printing '", prefix, "'");
      pending.append(buf, static_cast<size_t>(got));
    }
  }

  // Exit status once the child has exited (reaping it), nullopt while it runs.
  std::optional<int> poll() {
    if (pid_ < 0) return exitStatus_;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) != pid_) return std::nullopt;
    pid_ = -1;
    exitStatus_ = status;
    return exitStatus_;
  }

  // Waits up to `timeout` for the child to exit on its own (after a shutdown request).
  bool waitExit(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (!poll()) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  // SIGTERM, then reap; SIGKILL if it has not exited within kStopTimeout. Idempotent.
  void stop() {
    if (pid_ < 0 || poll()) return;
    ::kill(pid_, SIGTERM);
    if (waitExit(kStopTimeout)) return;
    std::fprintf(stderr, "kvtier-bench: pid %d ignored SIGTERM for %lld s, killing it\n", pid_,
                 static_cast<long long>(kStopTimeout.count()));
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  ChildProcess(pid_t pid, int stdoutFd, std::string log)
      : pid_(pid), stdout_(stdoutFd), log_(std::move(log)) {}
  pid_t pid_;
  int stdout_;
  std::string log_;
  std::optional<int> exitStatus_;
};

// Removes the shared-memory segments of a daemon that could not remove them itself (killed,
// crashed): no later kvtierd reuses this run's temporary data directory, so nothing else would
// ever free them. Declare it before the daemon's ChildProcess, so it runs once the daemon is gone.
class SegmentSweeper {
 public:
  SegmentSweeper() = default;
  SegmentSweeper(const SegmentSweeper&) = delete;
  SegmentSweeper& operator=(const SegmentSweeper&) = delete;
  ~SegmentSweeper() {
    if (prefix_.empty()) return;
    std::error_code ec;
    size_t removed = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
      if (entry.path().filename().string().starts_with(prefix_)) {
        removed += std::filesystem::remove(entry.path(), ec) ? 1 : 0;
      }
    }
    if (removed > 0) {
      std::fprintf(stderr, "kvtier-bench: removed %zu shared-memory segment(s) kvtierd left\n",
                   removed);
    }
  }

  // Takes the prefix from kvtierd's ready line ("... segments=kvtier-<digest>-"); a line without
  // one leaves nothing to sweep.
  void watchReadyLine(std::string_view line) {
    constexpr std::string_view kField = " segments=";
    const size_t at = line.find(kField);
    if (at == std::string_view::npos) return;
    const std::string_view value = line.substr(at + kField.size());
    const std::string prefix(value.substr(0, value.find(' ')));
    // Only names kvtierd makes, and never an empty or bare prefix that would match others'.
    if (prefix.starts_with("kvtier-") && prefix.size() > 8 &&
        prefix.find('/') == std::string::npos) {
      prefix_ = prefix;
    }
  }

 private:
  std::string prefix_;
};

// A kvtierd the bench started in its temporary directory: stopped (SIGTERM, then reaped) on
// destruction, and its shared-memory segments swept once it is gone.
class BenchDaemon {
 public:
  Status start(const std::string& exe, const TempDir& dir, const std::string& socket,
               const std::vector<std::string>& flags,
               const std::optional<std::vector<std::string>>& env = {}) {
    std::vector<std::string> argv = {exe, "--data-dir", dir.path(), "--socket", socket};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto child = ChildProcess::spawn(argv, dir.file("kvtierd.log"), true, env);
    if (!child) return child.error();
    process_.emplace(std::move(child).value());
    auto ready = process_->waitForLine("kvtierd ready", kStartTimeout);
    if (!ready) {
      return unavailable(exe, ": ", ready.error().message(), "; its log:\n",
                         lastLines(process_->logPath()));
    }
    sweeper_.watchReadyLine(*ready);
    return {};
  }

 private:
  SegmentSweeper sweeper_;  // declared first: destroyed after the process is stopped
  std::optional<ChildProcess> process_;
};

// The anchor for one control-plane round trip: a forked child that echoes whatever arrives on its
// end of a socketpair(AF_UNIX, SOCK_STREAM), or with `tcp` of a TCP connection over loopback
// (TCP_NODELAY, as peers talk). Start it before any thread exists (fork). With a `busyPoll`
// window, both ends poll that long for the next message before they block, the policy kvtierd and
// the SDK follow (transport/busy_poll.h): the floor for a polling round trip.
class EchoPeer {
 public:
  static Result<EchoPeer> start(std::chrono::microseconds busyPoll = {}, bool tcp = false) {
    int fds[2];
    if (tcp) {
      if (auto s = loopbackTcpPair(fds); !s) return s.error();
    } else if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      return unavailable("socketpair: ", std::strerror(errno));
    }
    const pid_t pid = ::fork();
    if (pid < 0) return unavailable("fork: ", std::strerror(errno));
    if (pid == 0) {
      ::close(fds[0]);
      echoLoop(fds[1], busyPoll);
    }
    ::close(fds[1]);
    return EchoPeer(pid, fds[0], busyPoll);
  }
  EchoPeer(EchoPeer&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)), fd_(std::exchange(o.fd_, -1)), busyPoll_(o.busyPoll_) {}
  EchoPeer(const EchoPeer&) = delete;
  EchoPeer& operator=(const EchoPeer&) = delete;
  ~EchoPeer() {
    if (fd_ >= 0) ::close(fd_);  // the child reads end-of-file and exits
    if (pid_ > 0) {
      // A child forked later holds a copy of this socket, so end-of-file may not come: stop it.
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }

  std::chrono::microseconds busyPoll() const { return busyPoll_; }

  // One round trip of `bytes` bytes from `buf`; false if the peer is gone.
  bool pingPong(uint8_t* buf, size_t bytes) {
    if (!writeAll(fd_, buf, bytes)) return false;
    for (size_t got = 0; got < bytes;) {
      const ssize_t n = readPolling(fd_, buf + got, bytes - got, busyPoll_);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      got += static_cast<size_t>(n);
    }
    return true;
  }

 private:
  EchoPeer(pid_t pid, int fd, std::chrono::microseconds busyPoll)
      : pid_(pid), fd_(fd), busyPoll_(busyPoll) {}

  // Two ends of one TCP connection over 127.0.0.1 (a listener on an ephemeral port, gone after).
  static Status loopbackTcpPair(int fds[2]) {
    const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0) return unavailable("socket: ", std::strerror(errno));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    const int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int server = -1;
    if (client >= 0 && ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        ::listen(listener, 1) == 0 &&
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
        ::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      server = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    }
    const int err = errno;
    ::close(listener);
    if (server < 0) {
      if (client >= 0) ::close(client);
      return unavailable("loopback TCP connection: ", std::strerror(err));
    }
    const int one = 1;
    ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fds[0] = client;
    fds[1] = server;
    return {};
  }

  // read(2), first polling with MSG_DONTWAIT for up to `window` (async-signal-safe calls only).
  static ssize_t readPolling(int fd, uint8_t* p, size_t n, std::chrono::microseconds window) {
    if (window.count() > 0) {
      timespec now{};
      ::clock_gettime(CLOCK_MONOTONIC, &now);
      const int64_t deadline = now.tv_sec * 1000000000LL + now.tv_nsec + window.count() * 1000;
      do {
        const ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
        if (got >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return got;
        ::clock_gettime(CLOCK_MONOTONIC, &now);
      } while (now.tv_sec * 1000000000LL + now.tv_nsec < deadline);
    }
    return ::read(fd, p, n);
  }

  static bool writeAll(int fd, const uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }

  // The child: only async-signal-safe calls, then _exit.
  [[noreturn]] static void echoLoop(int fd, std::chrono::microseconds busyPoll) {
    uint8_t buf[4096];
    for (;;) {
      const ssize_t n = readPolling(fd, buf, sizeof buf, busyPoll);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || !writeAll(fd, buf, static_cast<size_t>(n))) ::_exit(0);
    }
  }

  pid_t pid_;
  int fd_;
  std::chrono::microseconds busyPoll_;
};

struct RedisFree {
  void operator()(redisContext* c) const { redisFree(c); }
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using RedisContextPtr = std::unique_ptr<redisContext, RedisFree>;
using RedisReplyPtr = std::unique_ptr<redisReply, RedisFree>;

// Debian's redis-server on a Unix socket in the bench's directory, nothing persisted, and one
// hiredis connection to it. Destruction asks it to SHUTDOWN NOSAVE, then SIGTERM as a fallback.
class RedisServer {
 public:
  static Result<std::unique_ptr<RedisServer>> start(const std::string& exe, const TempDir& dir) {
    const std::string socket = dir.file("redis.sock");
    auto child = ChildProcess::spawn({exe, "--port", "0", "--unixsocket", socket, "--save", "",
                                      "--appendonly", "no", "--dir", dir.path()},
                                     dir.file("redis.log"), false);
    if (!child) return child.error();
    auto server = std::unique_ptr<RedisServer>(new RedisServer(std::move(child).value()));
    // redis-server has no readiness line on a pipe we can rely on: poll with PING until it answers.
    const auto deadline = Clock::now() + kStartTimeout;
    for (;;) {
      RedisContextPtr c(redisConnectUnix(socket.c_str()));
      if (c && c->err == 0) {
        RedisReplyPtr pong(static_cast<redisReply*>(redisCommand(c.get(), "PING")));
        if (pong && pong->type == REDIS_REPLY_STATUS &&
            std::string_view(pong->str, pong->len) == "PONG") {
          server->context_ = std::move(c);
          break;
        }
      }
      if (server->child_.poll()) {
        return unavailable("redis-server exited at startup; its log:\n",
                           lastLines(server->child_.logPath()));
      }
      if (Clock::now() >= deadline)
        return unavailable("redis-server did not answer PING on ", socket);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    RedisReplyPtr info(static_cast<redisReply*>(redisCommand(server->context(), "INFO server")));
    if (info && info->type == REDIS_REPLY_STRING) {
      const std::string_view text(info->str, info->len);
      const auto at = text.find("redis_version:");
      if (at != std::string_view::npos) {
        const auto value = text.substr(at + 14);
        server->version_ = std::string(value.substr(0, value.find_first_of("\r\n")));
      }
    }
    return server;
  }

  ~RedisServer() {
    if (context_) {
      // The server closes the connection instead of answering.
      freeReplyObject(redisCommand(context_.get(), "SHUTDOWN NOSAVE"));
      context_.reset();
      child_.waitExit(kStopTimeout);
    }
    // child_'s destructor sends SIGTERM if it still runs.
  }

  redisContext* context() { return context_.get(); }
  const std::string& version() const { return version_; }

 private:
  explicit RedisServer(ChildProcess child) : child_(std::move(child)) {}
  ChildProcess child_;
  RedisContextPtr context_;
  std::string version_ = "unknown";
};

std::optional<std::string> findOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream in(path ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(in, dir, ':');) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// The measurements. Each runs some iterations and returns their seconds (or adds per-call
// samples); an error means the bench cannot go on.

// A page-aligned host buffer, written in full at construction so no page fault lands in a timed
// window. Page-aligned like the pinned buffers engines hand kvtier, and so that every copy in the
// suite has mutually aligned source and destination: with glibc 2.36 on AMD EPYC, memcpy of
// 16-256 KiB runs (rep movsb) is ~2x slower when destination and source differ by 16 bytes mod
// 64, which would otherwise let malloc's placement decide the figures.
class HostBuffer {
 public:
  explicit HostBuffer(size_t bytes) : bytes_(bytes) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    data_.reset(static_cast<uint8_t*>(std::aligned_alloc(page, (bytes + page - 1) / page * page)));
    if (!data_) throw std::bad_alloc();
    std::memset(data_.get(), 0, bytes_);
  }
  uint8_t* data() const { return data_.get(); }
  size_t size() const { return bytes_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  size_t bytes_;
  std::unique_ptr<uint8_t, Free> data_;
};

// The suite's data: the prompt, its packed KV (also the memcpy source) and the reader's buffer
// (also the memcpy destination).
struct Workload {
  Workload() {
    const auto packed = synthetic::packedKv(layout, tokens, 0, kPrefixTokens);
    std::memcpy(kv.data(), packed.data(), kv.size());
  }
  size_t bytes() const { return kv.size(); }

  Layout layout = benchLayout();
  std::vector<uint32_t> tokens = synthetic::tokens(2024, kPrefixTokens);
  std::vector<uint32_t> firstBlock =
      std::vector<uint32_t>(tokens.begin(), tokens.begin() + layout.blockTokens);
  HostBuffer kv{kPrefixTokens * layout.tokenKvBytes()};
  HostBuffer out{kPrefixTokens * layout.tokenKvBytes()};
};

// The anchor for bytes: one core's memcpy of the same 16 MiB.
double timeMemcpy(Workload& w, int iterations) {
  const auto t0 = Clock::now();
  for (int i = 0; i < iterations; ++i) {
    std::memcpy(w.out.data(), w.kv.data(), w.bytes());
    // Keep the compiler from treating the copies as dead or merging them.
    asm volatile("" : : "r"(w.out.data()) : "memory");
  }
  return secondsSince(t0);
}

Status expectMatched(const ReadHandle& hit, uint64_t tokens) {
  if (hit.matchedTokens() == tokens) return {};
  return makeError(ErrorCode::kInternal, "lookup matched ", hit.matchedTokens(),
                   " tokens, expected ", tokens, " (was the prefix evicted?)");
}

// A reader's whole path: lookup of the 1024-token prompt (one round trip, 64 blocks pinned),
// copyTo of all of it out of the shared pool into its own buffer, release (one round trip).
Result<double> timeGet(Space& space, Workload& w, int iterations) {
  const auto t0 = Clock::now();
  for (int i = 0; i < iterations; ++i) {
    auto hit = space.lookup(w.tokens);
    if (!hit) return hit.error();
    if (auto s = expectMatched(*hit, kPrefixTokens); !s) return s.error();
    if (auto s = hit->copyTo(0, kPrefixTokens, w.out.data(), w.out.size()); !s) return s.error();
    hit->release();
  }
  return secondsSince(t0);
}

// A writer's whole path: put of the 1024-token prompt at position 0 of one sequence (lease round
// trip, 16 MiB written into 64 freshly granted pool blocks, commit round trip). Each put replaces
// the sequence's previous contents, so no separate remove is needed; the commit then finds the
// blocks already indexed and dedups them, freeing the fresh ones for the next put. The 16 MiB are
// still written into the pool every time, which is what is measured.
Result<double> timePut(Space& space, Workload& w, int iterations) {
  const auto t0 = Clock::now();
  for (int i = 0; i < iterations; ++i) {
    auto info = space.put("bench-put", 0, w.tokens, w.kv.data(), w.kv.size());
    if (!info) return info.error();
    if (info->sealedBlocks != kPrefixBlocks) {
      return makeError(ErrorCode::kInternal, "put sealed ", info->sealedBlocks,
                       " blocks, expected ", kPrefixBlocks);
    }
  }
  return secondsSince(t0);
}

// Seconds of each lookup that hits exactly one block, its ReadHandle dropped right after (the drop
// sends the release without waiting for an answer).
Status sampleLookups(Space& space, const Workload& w, int iterations, std::vector<double>& out) {
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = Clock::now();
    {
      auto hit = space.lookup(w.firstBlock);
      if (!hit) return hit.error();
      if (auto s = expectMatched(*hit, w.layout.blockTokens); !s) return s;
    }
    out.push_back(secondsSince(t0));
  }
  return {};
}

Status samplePings(EchoPeer& echo, int iterations, std::vector<double>& out) {
  uint8_t message[kPingBytes];
  std::memset(message, 0x6b, sizeof message);
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = Clock::now();
    if (!echo.pingPong(message, sizeof message)) return unavailable("echo peer is gone");
    out.push_back(secondsSince(t0));
  }
  return {};
}

std::string redisKey(uint32_t i) { return "kvtier-bench:" + std::to_string(i); }

// The same 64 chunks of 256 KiB as SETs, pipelined: 64 commands appended, then 64 replies read.
Result<double> timeRedisSet(redisContext* c, const Workload& w) {
  const size_t chunk = w.bytes() / kPrefixBlocks;
  const auto t0 = Clock::now();
  for (uint32_t i = 0; i < kPrefixBlocks; ++i) {
    const std::string key = redisKey(i);
    if (redisAppendCommand(c, "SET %b %b", key.data(), key.size(), w.kv.data() + i * chunk,
                           chunk) != REDIS_OK) {
      return unavailable("redis: ", c->errstr);
    }
  }
  for (uint32_t i = 0; i < kPrefixBlocks; ++i) {
    void* raw = nullptr;
    if (redisGetReply(c, &raw) != REDIS_OK) return unavailable("redis: ", c->errstr);
    RedisReplyPtr reply(static_cast<redisReply*>(raw));
    if (reply->type != REDIS_REPLY_STATUS) {
      return unavailable("redis SET answered type ", reply->type);
    }
  }
  return secondsSince(t0);
}

// GET of the same 64 chunks, pipelined. The bytes end in hiredis' reply buffers and are not copied
// further, which favours redis: kvtier's figure includes the copy into the reader's own buffer.
Result<double> timeRedisGet(redisContext* c, const Workload& w, bool verify) {
  const size_t chunk = w.bytes() / kPrefixBlocks;
  const auto t0 = Clock::now();
  for (uint32_t i = 0; i < kPrefixBlocks; ++i) {
    const std::string key = redisKey(i);
    if (redisAppendCommand(c, "GET %b", key.data(), key.size()) != REDIS_OK) {
      return unavailable("redis: ", c->errstr);
    }
  }
  for (uint32_t i = 0; i < kPrefixBlocks; ++i) {
    void* raw = nullptr;
    if (redisGetReply(c, &raw) != REDIS_OK) return unavailable("redis: ", c->errstr);
    RedisReplyPtr reply(static_cast<redisReply*>(raw));
    if (reply->type != REDIS_REPLY_STRING || static_cast<size_t>(reply->len) != chunk) {
      return unavailable("redis GET ", redisKey(i), " answered type ", reply->type, " of ",
                         reply->len, " bytes");
    }
    if (verify && std::memcmp(reply->str, w.kv.data() + i * chunk, chunk) != 0) {
      return unavailable("redis GET ", redisKey(i), " returned different bytes");
    }
  }
  return secondsSince(t0);
}

double medianOf(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double upper = v[mid];
  return (upper + *std::max_element(v.begin(), v.begin() + mid)) / 2;
}

// One repetition's figures: bytes/s for the bandwidths, median seconds for the round trips.
struct RepFigures {
  double memcpy = 0, get = 0, put = 0, lookupRtt = 0, echoRtt = 0;
  std::optional<double> redisSet, redisGet;
};

// One repetition is kRounds rounds of every measurement back to back, so a change in the shared
// machine's load hits kvtier and its anchors alike instead of whichever ran at the time.
Result<RepFigures> measureRepetition(Space& space, Workload& w, EchoPeer& echo, redisContext* redis,
                                     bool verify) {
  double memcpySeconds = 0, getSeconds = 0, putSeconds = 0, setSeconds = 0, redisGetSeconds = 0;
  std::vector<double> lookups, pings;
  for (int round = 0; round < kRounds; ++round) {
    if (gInterrupted) return unavailable("interrupted");
    memcpySeconds += timeMemcpy(w, kBandwidthIterationsPerRound);
    auto get = timeGet(space, w, kBandwidthIterationsPerRound);
    if (!get) return get.error();
    getSeconds += *get;
    auto put = timePut(space, w, kBandwidthIterationsPerRound);
    if (!put) return put.error();
    putSeconds += *put;
    if (redis) {
      auto set = timeRedisSet(redis, w);
      if (!set) return set.error();
      setSeconds += *set;
      auto got = timeRedisGet(redis, w, verify && round == 0);
      if (!got) return got.error();
      redisGetSeconds += *got;
    }
    if (auto s = sampleLookups(space, w, kRttIterationsPerRound, lookups); !s) return s.error();
    if (auto s = samplePings(echo, kRttIterationsPerRound, pings); !s) return s.error();
  }
  const double bandwidthBytes = double(w.bytes()) * kBandwidthIterationsPerRound * kRounds;
  const double redisBytes = double(w.bytes()) * kRounds;
  RepFigures f;
  f.memcpy = bandwidthBytes / memcpySeconds;
  f.get = bandwidthBytes / getSeconds;
  f.put = bandwidthBytes / putSeconds;
  f.lookupRtt = medianOf(std::move(lookups));
  f.echoRtt = medianOf(std::move(pings));
  if (redis) {
    f.redisSet = redisBytes / setSeconds;
    f.redisGet = redisBytes / redisGetSeconds;
  }
  return f;
}

// Where one get, one put and one small call spend their time: medians over kBreakdownIterations
// of each step on its own, for whoever chases a missed target. Not part of any ratio.
struct Breakdown {
  std::vector<std::pair<std::string, double>> steps;  // name, median seconds
};

Result<Breakdown> measureBreakdown(Space& space, Workload& w, EchoPeer& pollingEcho) {
  std::vector<double> lookup, copy, release, begin, write, commit, bare, lookup1, drop, copies;
  for (int i = 0; i < kBreakdownIterations; ++i) {
    auto t0 = Clock::now();
    auto hit = space.lookup(w.tokens);
    if (!hit) return hit.error();
    auto t1 = Clock::now();
    if (auto s = hit->copyTo(0, kPrefixTokens, w.out.data(), w.out.size()); !s) return s.error();
    auto t2 = Clock::now();
    hit->release();
    auto t3 = Clock::now();
    lookup.push_back(seconds(t0, t1));
    copy.push_back(seconds(t1, t2));
    release.push_back(seconds(t2, t3));

    t0 = Clock::now();
    auto lease = space.beginPut("bench-put", 0, w.tokens);
    if (!lease) return lease.error();
    t1 = Clock::now();
    if (auto s = lease->write(0, kPrefixTokens, w.kv.data(), w.kv.size()); !s) return s.error();
    t2 = Clock::now();
    if (auto s = lease->commit(); !s) return s.error();
    t3 = Clock::now();
    begin.push_back(seconds(t0, t1));
    write.push_back(seconds(t1, t2));
    commit.push_back(seconds(t2, t3));

    copies.push_back(timeMemcpy(w, 1));
  }
  for (int i = 0; i < kBreakdownIterations * 8; ++i) {
    const auto t0 = Clock::now();
    if (auto s = space.length("bench-prefix"); !s) return s.error();
    const auto t1 = Clock::now();
    auto hit = space.lookup(w.firstBlock);
    if (!hit) return hit.error();
    const auto t2 = Clock::now();
    { ReadHandle dropped = std::move(*hit); }
    const auto t3 = Clock::now();
    bare.push_back(seconds(t0, t1));
    lookup1.push_back(seconds(t1, t2));
    drop.push_back(seconds(t2, t3));
  }
  std::vector<double> pings;
  if (auto s = samplePings(pollingEcho, kBreakdownIterations * 8, pings); !s) return s.error();
  Breakdown b;
  b.steps = {
      {"memcpy 16 MiB", medianOf(copies)},
      {"get: lookup 64 blocks", medianOf(lookup)},
      {"get: copyTo 16 MiB", medianOf(copy)},
      {"get: release", medianOf(release)},
      {"put: beginPut 64 blocks", medianOf(begin)},
      {"put: write 16 MiB", medianOf(write)},
      {"put: commit", medianOf(commit)},
      {"length() (smallest call)", medianOf(bare)},
      {"lookup 1 block", medianOf(lookup1)},
      {"drop of its ReadHandle", medianOf(drop)},
      {"uds ping-pong, both polling " + std::to_string(pollingEcho.busyPoll().count()) + " us",
       medianOf(pings)}};
  return b;
}

// ---------------------------------------------------------------------------------------------
// Reporting

struct Spread {
  double median = std::nan(""), min = std::nan(""), max = std::nan("");
};

Spread spreadOf(const std::vector<double>& v) {
  if (v.empty()) return {};
  return {medianOf(v), *std::min_element(v.begin(), v.end()),
          *std::max_element(v.begin(), v.end())};
}

struct Figure {
  std::string what;
  std::string unit;  // "bytes/s" or "s"
  std::vector<double> perRep;
};

struct RatioReport {
  std::string name;
  Figure kvtier, anchor;
  bool higherIsBetter = true;    // ratio >= target passes; else ratio <= target passes
  std::optional<double> target;  // none: reported, not judged
  std::string skipped;           // why it was not measured; empty if it was

  std::vector<double> ratios() const {
    std::vector<double> r;
    for (size_t i = 0; i < kvtier.perRep.size() && i < anchor.perRep.size(); ++i) {
      r.push_back(kvtier.perRep[i] / anchor.perRep[i]);
    }
    return r;
  }
  bool measured() const { return skipped.empty() && !kvtier.perRep.empty(); }
  bool pass() const {
    const double m = spreadOf(ratios()).median;
    return measured() && target && (higherIsBetter ? m >= *target : m <= *target);
  }
};

// An empty report of one ratio: what kvtier and its anchor measure, and the target.
RatioReport newReport(std::string name, std::string kvtierWhat, std::string anchorWhat,
                      std::string unit, bool higherIsBetter, std::optional<double> target) {
  RatioReport r;
  r.name = std::move(name);
  r.kvtier = {std::move(kvtierWhat), unit, {}};
  r.anchor = {std::move(anchorWhat), unit, {}};
  r.higherIsBetter = higherIsBetter;
  r.target = target;
  return r;
}

std::string human(double value, const std::string& unit) {
  char buf[64];
  if (std::isnan(value)) return "-";
  if (unit == "bytes/s") {
    std::snprintf(buf, sizeof buf, "%.2f GB/s", value / 1e9);
  } else if (unit == "blocks/s") {
    std::snprintf(buf, sizeof buf, "%.0f blocks/s", value);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f us", value * 1e6);
  }
  return buf;
}

void printTable(const std::string& suite, const std::vector<RatioReport>& reports, int reps) {
  std::printf(
      "\nkvtier-bench --suite %s: %d repetitions after 1 warm-up; each ratio is computed per "
      "repetition,\nthen reported as median [min-max]. kvtier and anchor columns are medians.\n\n",
      suite.c_str(), reps);
  // Columns as wide as their widest entry, at least as wide as the local suite's.
  int nameWidth = 16, kvtierWidth = 28, anchorWidth = 34;
  for (const auto& r : reports) {
    if (!r.measured()) continue;
    const Spread k = spreadOf(r.kvtier.perRep), a = spreadOf(r.anchor.perRep);
    nameWidth = std::max(nameWidth, static_cast<int>(r.name.size()));
    kvtierWidth =
        std::max(kvtierWidth,
                 static_cast<int>((human(k.median, r.kvtier.unit) + " " + r.kvtier.what).size()));
    anchorWidth =
        std::max(anchorWidth,
                 static_cast<int>((human(a.median, r.anchor.unit) + " " + r.anchor.what).size()));
  }
  std::printf("%-*s %-*s %-*s %7s  %-15s %-7s %s\n", nameWidth, "name", kvtierWidth, "kvtier",
              anchorWidth, "anchor", "ratio", "min-max", "target", "result");
  for (const auto& r : reports) {
    const std::string target =
        !r.target ? std::string("none") : std::string(r.higherIsBetter ? ">= " : "<= ") + [&] {
          char b[16];
          std::snprintf(b, sizeof b, "%g", *r.target);
          return std::string(b);
        }();
    if (!r.measured()) {
      std::printf("%-*s %-*s %-*s %7s  %-15s %-7s %s\n", nameWidth, r.name.c_str(), kvtierWidth,
                  "-", anchorWidth, "-", "null", "-", target.c_str(), "skipped");
      continue;
    }
    const Spread k = spreadOf(r.kvtier.perRep), a = spreadOf(r.anchor.perRep),
                 q = spreadOf(r.ratios());
    char range[32];
    std::snprintf(range, sizeof range, "%.2f-%.2f", q.min, q.max);
    std::printf("%-*s %-*s %-*s %7.3f  %-15s %-7s %s\n", nameWidth, r.name.c_str(), kvtierWidth,
                (human(k.median, r.kvtier.unit) + " " + r.kvtier.what).c_str(), anchorWidth,
                (human(a.median, r.anchor.unit) + " " + r.anchor.what).c_str(), q.median, range,
                target.c_str(),
                !r.target  ? "-"
                : r.pass() ? "pass"
                           : "MISS");
  }
  for (const auto& r : reports) {
    if (!r.skipped.empty())
      std::printf("  %s: not measured: %s\n", r.name.c_str(), r.skipped.c_str());
  }
}

void printBreakdown(const Breakdown& b) {
  std::printf("\nwhere the time goes (median of each step alone, not part of the ratios):\n");
  for (const auto& [name, seconds] : b.steps) {
    std::printf("  %-28s %9.1f us\n", name.c_str(), seconds * 1e6);
  }
}


std::string jsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string jsonArray(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + jsonNumber(v[i]);
  return out + "]";
}

std::string jsonFigure(const Figure& f) {
  const Spread s = spreadOf(f.perRep);
  return "{\"what\": " + jsonString(f.what) + ", \"unit\": " + jsonString(f.unit) +
         ", \"median\": " + jsonNumber(s.median) + ", \"min\": " + jsonNumber(s.min) +
         ", \"max\": " + jsonNumber(s.max) + ", \"per_rep\": " + jsonArray(f.perRep) + "}";
}

struct RunInfo {
  std::string suite;
  int reps = 0;
  std::string threading;
  // Name and JSON value of each program measured, kvtierd first.
  std::vector<std::pair<std::string, std::string>> versions;
  // More top-level members, already JSON ("\"name\": value" each), after the breakdown.
  std::vector<std::string> extra;
  std::optional<uint32_t> busyPollMicros;  // --busy-poll-us; unset: the programs' defaults
};

std::string toJson(const std::vector<RatioReport>& reports, const Breakdown& breakdown,
                   const RunInfo& info) {
  utsname u{};
  ::uname(&u);
  std::ostringstream o;
  o << "{\n  \"suite\": " << jsonString(info.suite) << ",\n  \"reps\": " << info.reps
    << ",\n  \"warmup_reps\": 1,\n";
  o << "  \"client_threading\": " << jsonString(info.threading) << ",\n";
  o << "  \"busy_poll_us\": "
    << (info.busyPollMicros ? std::to_string(*info.busyPollMicros) : "\"default\"") << ",\n";
  o << "  \"machine\": {\"nproc\": " << ::sysconf(_SC_NPROCESSORS_ONLN) << ", \"uname\": "
    << jsonString(std::string(u.sysname) + " " + u.release + " " + u.version + " " + u.machine)
    << "},\n";
  o << "  \"versions\": {";
  for (size_t i = 0; i < info.versions.size(); ++i) {
    o << (i ? ", " : "") << jsonString(info.versions[i].first) << ": " << info.versions[i].second;
  }
  o << "},\n";
  o << "  \"ratios\": {";
  for (size_t i = 0; i < reports.size(); ++i) {
    const auto& r = reports[i];
    o << (i ? ", " : "") << jsonString(r.name) << ": "
      << (r.measured() ? jsonNumber(spreadOf(r.ratios()).median) : "null");
  }
  o << "},\n  \"details\": {\n";
  for (size_t i = 0; i < reports.size(); ++i) {
    const auto& r = reports[i];
    const Spread q = spreadOf(r.ratios());
    o << "    " << jsonString(r.name) << ": {";
    if (r.measured()) {
      o << "\"median\": " << jsonNumber(q.median) << ", \"min\": " << jsonNumber(q.min)
        << ", \"max\": " << jsonNumber(q.max) << ", ";
    } else {
      o << "\"median\": null, \"min\": null, \"max\": null, \"skipped\": " << jsonString(r.skipped)
        << ", ";
    }
    o << "\"target\": " << (r.target ? jsonNumber(*r.target) : "null") << ", \"target_is\": \""
      << (r.higherIsBetter ? "min" : "max") << "\", \"pass\": "
      << (!r.measured() || !r.target ? "null"
          : r.pass()                 ? "true"
                                     : "false")
      << ",\n      \"per_rep\": " << jsonArray(r.ratios())
      << ",\n      \"kvtier\": " << jsonFigure(r.kvtier)
      << ",\n      \"anchor\": " << jsonFigure(r.anchor) << "}"
      << (i + 1 < reports.size() ? "," : "") << "\n";
  }
  o << "  }";
  if (!breakdown.steps.empty()) {
    o << ",\n  \"breakdown_us\": {";
    for (size_t i = 0; i < breakdown.steps.size(); ++i) {
      o << (i ? ", " : "") << jsonString(breakdown.steps[i].first) << ": "
        << jsonNumber(breakdown.steps[i].second * 1e6);
    }
    o << "}";
  }
  for (const auto& member : info.extra) o << ",\n  " << member;
  o << "\n}\n";
  return o.str();
}

Status writeFile(const std::string& path, const std::string& text) {
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return unavailable("cannot write ", path);
  return {};
}

// ---------------------------------------------------------------------------------------------

struct Options {
  std::string suite = "local";
  std::string json;
  int reps = 7;
  std::string daemon = KVTIER_DAEMON_PATH;
  // The SDK's caller-thread mode is what a serving engine's scheduler thread uses; "own" measures
  // the default mode, whose calls hop to the client's event-loop thread and back.
  ClientThreading threading = ClientThreading::kCallerThread;
  // Busy polling of the daemon (--busy-poll-us) and of the bench's clients; unset: their defaults.
  std::optional<uint32_t> busyPollMicros;
  std::string hotSamples;  // --hot-samples: the cold suite's hot lookups, one line each

  // The daemon's flags: the suite's own, then --busy-poll-us when set.
  std::vector<std::string> daemonFlags(std::vector<std::string> flags) const {
    if (busyPollMicros) {
      flags.push_back("--busy-poll-us");
      flags.push_back(std::to_string(*busyPollMicros));
    }
    return flags;
  }
};

Result<std::unique_ptr<Client>> startClient(const std::string& socket, const Options& options,
                                            ClientThreading threading,
                                            const std::string& name = "kvtier-bench") {
  ClientOptions o{.socketPath = socket, .clientName = name, .threading = threading};
  if (options.busyPollMicros) o.busyPoll = std::chrono::microseconds(*options.busyPollMicros);
  return Client::connect(o);
}

const char* threadingName(ClientThreading t) {
  return t == ClientThreading::kOwnThread ? "own" : "caller";
}

// Everything the suite owns lives in this function's scope, so any early return stops the
// daemon, redis and the echo peer and removes the temporary directory.
Status runLocalSuite(const Options& options) {
  auto echo = EchoPeer::start();  // first: fork while this process has no threads
  if (!echo) return echo.error();
  // For the breakdown only: the same ping-pong polling like kvtier does.
  const std::chrono::microseconds busyPoll =
      std::chrono::microseconds(options.busyPollMicros.value_or(ClientOptions{}.busyPoll.count()));
  auto pollingEcho = EchoPeer::start(busyPoll);
  if (!pollingEcho) return pollingEcho.error();
  auto dir = TempDir::create();
  if (!dir) return dir.error();

  const std::string socket = dir->file("kvtierd.sock");
  BenchDaemon daemon;
  if (auto s = daemon.start(options.daemon, *dir, socket,
                            options.daemonFlags({"--host-pool-bytes", kPoolBytes}));
      !s)
    return s;

  std::unique_ptr<RedisServer> redis;
  std::string redisSkipped;
  if (auto exe = findOnPath("redis-server")) {
    auto started = RedisServer::start(*exe, *dir);
    if (started) {
      redis = std::move(started).value();
    } else {
      redisSkipped = started.error().message();
    }
  } else {
    redisSkipped = "redis-server is not on PATH (scripts/install-deps.sh installs it)";
  }
  if (!redisSkipped.empty())
    std::fprintf(stderr, "kvtier-bench: %s; get/put_vs_redis are null\n", redisSkipped.c_str());

  auto client = startClient(socket, options, options.threading);
  if (!client) return client.error();
  Workload w;
  auto space = (*client)->open(w.layout);
  if (!space) return space.error();
  if (!(*client)->mapped()) {
    return unavailable(
        "the client could not map the daemon's pool; the local suite measures the mapped path");
  }
  if (w.layout.blockBytes() * kPrefixBlocks != w.bytes())
    return makeError(ErrorCode::kInternal, "bad workload size");

  // The prefix every reader looks up, checked once end to end before anything is timed.
  if (auto info = (*space)->put("bench-prefix", 0, w.tokens, w.kv.data(), w.kv.size()); !info)
    return info.error();
  {
    auto hit = (*space)->lookup(w.tokens);
    if (!hit) return hit.error();
    if (hit->matchedTokens() != kPrefixTokens) {
      return makeError(ErrorCode::kInternal, "fresh prefix matched only ", hit->matchedTokens(),
                       " tokens");
    }
    if (auto s = hit->copyTo(0, kPrefixTokens, w.out.data(), w.out.size()); !s) return s.error();
    if (std::memcmp(w.out.data(), w.kv.data(), w.bytes()) != 0) {
      return makeError(ErrorCode::kInternal, "bytes read back differ from the bytes put");
    }
  }

  const auto report = newReport;
  RatioReport getMem = report("get_vs_memcpy", "lookup+copyTo", "memcpy", "bytes/s", true, 0.8);
  RatioReport putMem = report("put_vs_memcpy", "put+commit", "memcpy", "bytes/s", true, 0.8);
  RatioReport rtt =
      report("rpc_vs_uds_rtt", "lookup 1 block", "uds ping-pong 64 B", "s", false, 2.0);
  RatioReport getRedis =
      report("get_vs_redis", "lookup+copyTo", "redis GET x64", "bytes/s", true, 5);
  RatioReport putRedis = report("put_vs_redis", "put+commit", "redis SET x64", "bytes/s", true, 5);
  getRedis.skipped = putRedis.skipped = redisSkipped;

  // Repetition 0 is the warm-up: it faults in the client's view of the blocks it uses, fills
  // caches and redis' keyspace, checks redis' bytes, and is not reported.
  for (int rep = 0; rep <= options.reps; ++rep) {
    const bool warmup = rep == 0;
    const auto t0 = Clock::now();
    auto f = measureRepetition(**space, w, *echo, redis ? redis->context() : nullptr, warmup);
    if (!f) return f.error();
    std::fprintf(stderr,
                 "%s %d: memcpy %s, get %s, put %s, redis GET %s SET %s, lookup rtt %s, uds rtt %s "
                 "(%.1f s)\n",
                 warmup ? "warm-up" : "rep", rep, human(f->memcpy, "bytes/s").c_str(),
                 human(f->get, "bytes/s").c_str(), human(f->put, "bytes/s").c_str(),
                 human(f->redisGet.value_or(std::nan("")), "bytes/s").c_str(),
                 human(f->redisSet.value_or(std::nan("")), "bytes/s").c_str(),
                 human(f->lookupRtt, "s").c_str(), human(f->echoRtt, "s").c_str(),
                 secondsSince(t0));
    if (warmup) continue;
    getMem.kvtier.perRep.push_back(f->get);
    getMem.anchor.perRep.push_back(f->memcpy);
    putMem.kvtier.perRep.push_back(f->put);
    putMem.anchor.perRep.push_back(f->memcpy);
    rtt.kvtier.perRep.push_back(f->lookupRtt);
    rtt.anchor.perRep.push_back(f->echoRtt);
    if (redis) {
      getRedis.kvtier.perRep.push_back(f->get);
      getRedis.anchor.perRep.push_back(*f->redisGet);
      putRedis.kvtier.perRep.push_back(f->put);
      putRedis.anchor.perRep.push_back(*f->redisSet);
    }
  }
  auto breakdown = measureBreakdown(**space, w, *pollingEcho);
  if (!breakdown) return breakdown.error();

  const std::vector<RatioReport> reports = {getMem, putMem, rtt, getRedis, putRedis};
  printTable("local", reports, options.reps);
  printBreakdown(*breakdown);
  if (!options.json.empty()) {
    RunInfo info{"local",
                 options.reps,
                 threadingName(options.threading),
                 {{"kvtierd", jsonString((*client)->daemonVersion())},
                  {"redis", redis ? jsonString(redis->version()) : "null"}},
                 {},
                 options.busyPollMicros};
    if (auto s = writeFile(options.json, toJson(reports, *breakdown, info)); !s) return s;
    std::printf("\nwrote %s\n", options.json.c_str());
  }
  return {};
}

// ---------------------------------------------------------------------------------------------
// The cold suite: blocks spilled to and promoted from the RocksDB cold tier against RocksDB's own
// db_bench (fillrandom, readrandom) with the same value size, and hot lookups while the spiller
// runs against the same lookups on an idle daemon. Every repetition starts from nothing: a fresh
// temporary directory, a fresh db_bench database and a fresh kvtierd (cold tier on, a 64 MiB pool).

// Blocks are the local suite's (256 KiB: 16 tokens of 8 layers x 8 heads x 64 x fp16, K and V).
// A prompt is 16 blocks (256 tokens, 4 MiB).
constexpr uint32_t kColdPromptBlocks = 16;
constexpr uint64_t kColdPromptTokens = 256;
// The pool is 64 MiB, 256 blocks; the hot prefix holds 16 of them for the whole repetition.
constexpr const char* kColdPoolBytes = "64M";
constexpr uint64_t kColdPoolBlocks = 256;
// The spill phase writes 96 prompts, 1536 blocks (384 MiB, 6x the pool). The promote phase looks
// up the middle third, prompts 32-63 (512 blocks): whichever end of the spilled prompts the
// eviction policy keeps in memory (the first ones, or the last 240 blocks), the middle ones are
// only on disk by then.
constexpr uint32_t kSpillPrompts = 96;
constexpr uint32_t kPromoteFirst = kSpillPrompts / 3;
constexpr uint32_t kPromotePrompts = kSpillPrompts / 3;
constexpr uint64_t kSpillBlocks = uint64_t{kSpillPrompts} * kColdPromptBlocks;
// Hot lookups, one every 500 us (an engine's scheduler asking at a steady pace: the same offered
// load idle and spilling), in kHotWindows idle windows alternating with as many spilling ones, so
// that whatever else the shared machine runs meanwhile falls on both sides. 2000 lookups of each
// kind per repetition: p99 is about the 20th slowest.
constexpr int kHotSamples = 2000;
constexpr int kHotWindows = 4;
constexpr int kHotWarmupLookups = 100;
constexpr auto kHotInterval = std::chrono::microseconds(500);
// An idle window starts once the daemon's spilled count has not moved for this long.
constexpr auto kSpillQuiet = std::chrono::milliseconds(200);
// db_bench: as many records as kvtier spills (so as many memtable flushes), and readrandom reads
// of which about 63% find a key (fillrandom draws its keys with replacement).
constexpr int kDbBenchReads = 800;
constexpr auto kDbBenchTimeout = std::chrono::seconds(60);
// Bound on any one phase waiting for the daemon (a spill that never completes is an error).
constexpr auto kColdPhaseTimeout = std::chrono::seconds(60);
constexpr auto kStatsPollInterval = std::chrono::microseconds(500);

// The suite's data, made once: the hot prompt and the spill prompts with their packed KV.
struct ColdWorkload {
  ColdWorkload() {
    hotTokens = synthetic::tokens(77, kColdPromptTokens);
    const auto hot = synthetic::packedKv(layout, hotTokens, 0, kColdPromptTokens);
    hotKv = std::make_unique<HostBuffer>(hot.size());
    std::memcpy(hotKv->data(), hot.data(), hot.size());
    for (uint32_t i = 0; i < kSpillPrompts; ++i) {
      tokens.push_back(synthetic::tokens(5000 + i, kColdPromptTokens));
      const auto packed = synthetic::packedKv(layout, tokens.back(), 0, kColdPromptTokens);
      kv.push_back(std::make_unique<HostBuffer>(packed.size()));
      std::memcpy(kv.back()->data(), packed.data(), packed.size());
    }
  }
  uint64_t blockBytes() const { return layout.blockBytes(); }

  Layout layout = benchLayout();
  std::vector<uint32_t> hotTokens;
  std::unique_ptr<HostBuffer> hotKv;
  std::vector<std::vector<uint32_t>> tokens;    // spill prompt i
  std::vector<std::unique_ptr<HostBuffer>> kv;  // its packed KV, 4 MiB
};

// One db_bench benchmark's summary line, e.g.
//   "readrandom   :     581.715 micros/op 1718 ops/sec 0.233 seconds 400 operations; ... (234 of
//   400 found)".
struct DbBenchFigure {
  double opsPerSec = 0, seconds = 0;
  uint64_t ops = 0;
  std::optional<uint64_t> found;  // readrandom: reads that found their key
  // Records per second actually written or read: for readrandom only the reads that found a
  // record count (a miss reads no 256 KiB value and costs a small fraction of a hit).
  double recordsPerSec() const { return found ? double(*found) / seconds : opsPerSec; }
};

Result<DbBenchFigure> parseDbBenchLine(const std::string& line) {
  const size_t colon = line.find(':');
  DbBenchFigure f;
  double micros = 0;
  unsigned long long ops = 0;
  if (colon == std::string::npos ||
      std::sscanf(line.c_str() + colon + 1,
                  " %lf micros/op %lf ops/sec %lf seconds %llu operations", &micros, &f.opsPerSec,
                  &f.seconds, &ops) != 4 ||
      f.seconds <= 0) {
    return unavailable("cannot parse db_bench's line '", line, "'");
  }
  f.ops = ops;
  unsigned long long found = 0, of = 0;
  if (const size_t at = line.rfind('(');
      at != std::string::npos &&
      std::sscanf(line.c_str() + at, "(%llu of %llu found)", &found, &of) == 2) {
    f.found = found;
  }
  return f;
}

// The db_bench flags both anchors share: kvtier's value and key sizes, its integrated BlobDB
// settings (daemon/cold_tier.cc), no compression, one thread, WAL on and no sync as kvtier writes.
std::vector<std::string> dbBenchFlags(const std::string& db, uint64_t valueBytes) {
  return {"--db=" + db,
          "--num=" + std::to_string(kSpillBlocks),
          "--value_size=" + std::to_string(valueBytes),
          "--key_size=40",
          "--compression_type=none",
          "--threads=1",
          "--enable_blob_files=true",
          "--min_blob_size=4096",
          "--enable_blob_garbage_collection=true"};
}

Result<DbBenchFigure> runDbBench(const std::string& exe, const TempDir& dir,
                                 const std::string& benchmark, std::vector<std::string> flags) {
  std::vector<std::string> argv = {exe, "--benchmarks=" + benchmark};
  argv.insert(argv.end(), flags.begin(), flags.end());
  const std::string log = dir.file("db_bench.log");
  auto child = ChildProcess::spawn(argv, log, true);
  if (!child) return child.error();
  auto line = child->waitForLine(benchmark + " ", kDbBenchTimeout);
  if (!line) {
    return unavailable("db_bench ", benchmark, ": ", line.error().message(), "; its log:\n",
                       lastLines(log));
  }
  if (!child->waitExit(kDbBenchTimeout)) return unavailable("db_bench ", benchmark, " hangs");
  const int status = *child->poll();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return unavailable("db_bench ", benchmark, " exited with status ", status, "; its log:\n",
                       lastLines(log));
  }
  return parseDbBenchLine(*line);
}

// The rest of the first line `argv` prints that starts with `prefix`, or "unknown".
std::string versionOf(const std::vector<std::string>& argv, std::string_view prefix) {
  auto dir = TempDir::create();
  if (!dir) return "unknown";
  auto child = ChildProcess::spawn(argv, dir->file("version.log"), true);
  if (!child) return "unknown";
  auto line = child->waitForLine(prefix, std::chrono::seconds(10));
  return line ? line->substr(prefix.size()) : "unknown";
}

std::string dbBenchVersion(const std::string& exe) {
  return versionOf({exe, "--version"}, "db_bench version ");
}

// Nearest-rank percentile.
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p * double(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

// A second client that puts prompts through the pool as fast as the daemon takes them: each at
// position 0 of one sequence, the sequence removed right after, so its blocks become evictable
// and the daemon's write-behind spiller has to write them before their memory can be reused.
struct Spiller {
  Status status;
  Clock::time_point firstPut{}, lastPutDone{};
  uint64_t fullRetries = 0;          // puts the daemon answered FULL after its own waiting
  std::atomic<uint64_t> prompts{0};  // put and removed so far
  std::atomic<bool> pause{false};    // set: park before the next put
  std::atomic<bool> parked{false};   // parked, or gone
  std::atomic<bool> exited{false};   // gone (done, stopped or failed): `status` is final
  std::atomic<bool> stop{false};
};

// Runs on its own thread (a caller-thread client belongs to the thread that connects it). Puts
// `count` prompts (or until `stop`); prompt i has the tokens `tokensOf(i)` and spill prompt i %
// kSpillPrompts' bytes. Whoever resumes it after a pause waits for `prompts` to move before
// pausing it again, so `parked` is never stale.
void runSpiller(const std::string& socket, const Options& options, const ColdWorkload& w,
                const std::function<std::vector<uint32_t>(uint64_t)>& tokensOf, uint64_t count,
                Spiller& out) {
  out.status = [&]() -> Status {
    auto client = startClient(socket, options, options.threading, "kvtier-bench-spiller");
    if (!client) return client.error();
    auto space = (*client)->open(w.layout);
    if (!space) return space.error();
    for (uint64_t i = 0; i < count; ++i) {
      while (out.pause.load() && !out.stop.load() && !gInterrupted) {
        out.parked.store(true);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      out.parked.store(false);
      if (out.stop.load() || gInterrupted) break;
      const std::vector<uint32_t> tokens = tokensOf(i);
      const HostBuffer& kv = *w.kv[i % kSpillPrompts];
      if (i == 0) out.firstPut = Clock::now();
      const auto deadline = Clock::now() + kColdPhaseTimeout;
      for (;;) {
        auto info = (*space)->put("bench-spill", 0, tokens, kv.data(), kv.size());
        if (info) {
          if (info->sealedBlocks != kColdPromptBlocks) {
            return makeError(ErrorCode::kInternal, "spill put sealed ", info->sealedBlocks,
                             " blocks, expected ", kColdPromptBlocks);
          }
          break;
        }
        // FULL: the daemon already waited for its spiller (32 batches) and gave up; try again.
        if (info.error().code() != ErrorCode::kFull || Clock::now() >= deadline) {
          return info.error();
        }
        ++out.fullRetries;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (auto s = (*space)->remove("bench-spill", 0); !s) return s;
      out.lastPutDone = Clock::now();
      out.prompts.fetch_add(1);
    }
    return {};
  }();
  // Also on failure: nobody waits for a spiller that is gone.
  out.parked.store(true);
  out.exited.store(true);
}

// Waits until `done()` holds, up to kColdPhaseTimeout.
template <typename Done>
Status waitUntil(Done&& done, const char* what) {
  const auto deadline = Clock::now() + kColdPhaseTimeout;
  while (!done()) {
    if (Clock::now() >= deadline) return unavailable("timed out waiting for ", what);
    if (gInterrupted) return unavailable("interrupted");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return {};
}

// Waits until the daemon's spilled count has not moved for kSpillQuiet: nothing left to spill.
Status waitSpillQuiet(Client& client) {
  const auto deadline = Clock::now() + kColdPhaseTimeout;
  uint64_t last = UINT64_MAX;
  auto since = Clock::now();
  for (;;) {
    auto stats = client.stats();
    if (!stats) return stats.error();
    const auto now = Clock::now();
    if (stats->spilled != last) {
      last = stats->spilled;
      since = now;
    } else if (now - since >= kSpillQuiet) {
      return {};
    }
    if (now >= deadline) return unavailable("the daemon never stopped spilling");
    if (gInterrupted) return unavailable("interrupted");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Waits (polling the daemon's counters) until its spilled count reaches `target`; returns when.
Result<Clock::time_point> waitSpilled(Client& client, uint64_t target) {
  const auto deadline = Clock::now() + kColdPhaseTimeout;
  for (;;) {
    auto stats = client.stats();
    if (!stats) return stats.error();
    const auto now = Clock::now();
    if (stats->spilled >= target) return now;
    if (gInterrupted) return unavailable("interrupted");
    if (now >= deadline) {
      return unavailable("the daemon spilled ", stats->spilled, " blocks, not ", target, " within ",
                         kColdPhaseTimeout.count(), " s (spill errors ", stats->spillErrors, ")");
    }
    std::this_thread::sleep_for(kStatsPollInterval);
  }
}

// One hot lookup: taken while spilling or idle, its start (seconds of the steady clock,
// CLOCK_MONOTONIC) and its seconds (lookup, then dropping its handle, which releases without
// waiting).
struct HotSample {
  bool spilling;
  double start, seconds;
};

// The seconds of the samples of one kind.
std::vector<double> secondsOf(const std::vector<HotSample>& samples, bool spilling) {
  std::vector<double> out;
  for (const auto& h : samples) {
    if (h.spilling == spilling) out.push_back(h.seconds);
  }
  return out;
}

// Lookups of the hot prefix, each kHotInterval after the previous one started (right after it, if
// it took longer: a slow lookup is not followed by a burst that catches up), appended to `out`.
Status sampleHot(Space& space, const ColdWorkload& w, int samples, bool spilling,
                 std::vector<HotSample>& out) {
  auto next = Clock::now();
  for (int i = 0; i < samples; ++i) {
    if (gInterrupted) return unavailable("interrupted");
    std::this_thread::sleep_until(next);
    const auto t0 = Clock::now();
    next = t0 + kHotInterval;
    {
      auto hit = space.lookup(w.hotTokens);
      if (!hit) return hit.error();
      if (auto s = expectMatched(*hit, kColdPromptTokens); !s) return s;
    }
    out.push_back(
        {spilling, std::chrono::duration<double>(t0.time_since_epoch()).count(), secondsSince(t0)});
  }
  return {};
}

// One repetition's figures; seconds of each phase go to `phases`.
struct ColdRep {
  std::optional<DbBenchFigure> fill, read;
  double spillRate = 0, promoteRate = 0, hotIdleP99 = 0, hotSpillP99 = 0;
  double hotIdleP50 = 0, hotSpillP50 = 0;
  uint64_t promoted = 0, promoteLookedUp = 0, fullRetries = 0;
  double spillWindowRate = 0;         // blocks/s the daemon spilled while the hot lookups ran
  std::vector<HotSample> hotSamples;  // every measured hot lookup, in the order taken
  std::vector<std::pair<std::string, double>> phases;
  std::string daemonVersion;
};

Result<ColdRep> measureColdRepetition(const Options& options, const ColdWorkload& w,
                                      const std::optional<std::string>& dbBench, bool verify) {
  ColdRep r;
  auto dir = TempDir::create();
  if (!dir) return dir.error();
  auto phase = [&](const char* name, Clock::time_point t0) {
    r.phases.emplace_back(name, secondsSince(t0));
  };

  // The anchors first, while nothing else runs; their database is gone before kvtierd starts.
  if (dbBench) {
    const std::string db = dir->file("db_bench");
    auto t0 = Clock::now();
    auto fill = runDbBench(*dbBench, *dir, "fillrandom", dbBenchFlags(db, w.blockBytes()));
    if (!fill) return fill.error();
    phase("db_bench fillrandom (run)", t0);
    auto flags = dbBenchFlags(db, w.blockBytes());
    flags.push_back("--use_existing_db=1");
    flags.push_back("--reads=" + std::to_string(kDbBenchReads));
    t0 = Clock::now();
    auto read = runDbBench(*dbBench, *dir, "readrandom", flags);
    if (!read) return read.error();
    phase("db_bench readrandom (run)", t0);
    r.fill = *fill;
    r.read = *read;
    std::error_code ec;
    std::filesystem::remove_all(db, ec);
  }

  auto t0 = Clock::now();
  const std::string socket = dir->file("kvtierd.sock");
  BenchDaemon daemon;
  if (auto s = daemon.start(options.daemon, *dir, socket,
                            options.daemonFlags({"--host-pool-bytes", kColdPoolBytes, "--cold-tier",
                                                 "on", "--flush-on-exit", "off"}));
      !s) {
    return s.error();
  }
  auto client = startClient(socket, options, options.threading);
  if (!client) return client.error();
  r.daemonVersion = (*client)->daemonVersion();
  auto space = (*client)->open(w.layout);
  if (!space) return space.error();
  if (w.blockBytes() * kColdPromptBlocks != w.hotKv->size())
    return makeError(ErrorCode::kInternal, "bad cold workload size");
  {
    auto s0 = (*client)->stats();
    if (!s0) return s0.error();
    if (s0->blocksTotal != kColdPoolBlocks) {
      return makeError(ErrorCode::kInternal, "the pool has ", s0->blocksTotal, " blocks, expected ",
                       kColdPoolBlocks);
    }
  }
  // The hot prefix: held by a live sequence of this client, so it is never evicted or spilled.
  if (auto info = (*space)->put("bench-hot", 0, w.hotTokens, w.hotKv->data(), w.hotKv->size());
      !info) {
    return info.error();
  }
  phase("kvtierd start + hot put", t0);

  std::vector<HotSample> scratch;
  if (auto s = sampleHot(**space, w, kHotWarmupLookups, false, scratch); !s) return s.error();

  // Spill: wall time from the first put until the daemon has written every block of the phase.
  auto before = (*client)->stats();
  if (!before) return before.error();
  {
    Spiller spiller;
    std::thread thread(
        runSpiller, socket, std::cref(options), std::cref(w),
        [&w](uint64_t i) { return w.tokens[i]; }, kSpillPrompts, std::ref(spiller));
    thread.join();
    if (!spiller.status) return spiller.status.error();
    auto done = waitSpilled(**client, before->spilled + kSpillBlocks);
    if (!done) return done.error();
    r.spillRate = double(kSpillBlocks) / seconds(spiller.firstPut, *done);
    r.phases.emplace_back("spill: puts", seconds(spiller.firstPut, spiller.lastPutDone));
    r.phases.emplace_back("spill: after the last put", seconds(spiller.lastPutDone, *done));
    r.fullRetries += spiller.fullRetries;
  }

  // Promote: lookups of prompts whose blocks are only on disk; the daemon reads them back into
  // the pool before it answers.
  before = (*client)->stats();
  if (!before) return before.error();
  t0 = Clock::now();
  std::optional<HostBuffer> check;
  if (verify) check.emplace(w.kv[0]->size());
  for (uint32_t i = kPromoteFirst; i < kPromoteFirst + kPromotePrompts; ++i) {
    auto hit = (*space)->lookup(w.tokens[i]);
    if (!hit) return hit.error();
    r.promoteLookedUp += kColdPromptBlocks;
    if (verify) {  // the warm-up checks the bytes that came back
      if (auto s = expectMatched(*hit, kColdPromptTokens); !s) return s.error();
      if (auto s = hit->copyTo(0, kColdPromptTokens, check->data(), check->size()); !s)
        return s.error();
      if (std::memcmp(check->data(), w.kv[i]->data(), check->size()) != 0)
        return makeError(ErrorCode::kInternal, "promoted bytes of prompt ", i, " differ");
    }
  }
  const double promoteSeconds = secondsSince(t0);
  auto after = (*client)->stats();
  if (!after) return after.error();
  r.promoted = after->promoted - before->promoted;
  r.promoteRate = double(r.promoted) / promoteSeconds;
  r.phases.emplace_back("promote", promoteSeconds);

  // Hot lookups, idle windows alternating with windows while another client keeps the spiller
  // busy the whole time.
  t0 = Clock::now();
  {
    Spiller spiller;
    spiller.pause.store(true);
    std::thread thread(
        runSpiller, socket, std::cref(options), std::cref(w),
        [](uint64_t i) { return synthetic::tokens(900000 + i, kColdPromptTokens); }, UINT64_MAX,
        std::ref(spiller));
    auto sampleWindow = [&](bool spillingWindow) {
      return sampleHot(**space, w, kHotSamples / kHotWindows, spillingWindow, r.hotSamples);
    };
    uint64_t windowSpilled = 0;
    double windowSeconds = 0;
    const Status sampled = [&]() -> Status {
      for (int window = 0; window < 2 * kHotWindows; ++window) {
        if (window % 2 == 0) {  // idle: the spiller parked, the daemon done writing
          spiller.pause.store(true);
          if (auto s = waitUntil([&] { return spiller.parked.load(); }, "the spiller to pause"); !s)
            return s;
          if (spiller.exited.load()) {
            return spiller.status ? unavailable("the spiller stopped") : spiller.status;
          }
          if (auto s = waitSpillQuiet(**client); !s) return s;
          if (auto s = sampleWindow(false); !s) return s;
          continue;
        }
        // Spilling: resumed, and its first prompt in (so its blocks are being written).
        const uint64_t p0 = spiller.prompts.load();
        spiller.pause.store(false);
        if (auto s = waitUntil([&] { return spiller.prompts.load() > p0 || spiller.exited.load(); },
                               "the spiller to start");
            !s)
          return s;
        if (spiller.exited.load()) {
          return spiller.status ? unavailable("the spiller stopped") : spiller.status;
        }
        auto s0 = (*client)->stats();
        if (!s0) return s0.error();
        const auto w0 = Clock::now();
        if (auto s = sampleWindow(true); !s) return s;
        auto s1 = (*client)->stats();
        if (!s1) return s1.error();
        windowSeconds += secondsSince(w0);
        windowSpilled += s1->spilled - s0->spilled;
      }
      return {};
    }();
    spiller.stop.store(true);
    thread.join();
    if (!sampled) return sampled.error();
    if (!spiller.status) return spiller.status.error();
    const std::vector<double> idle = secondsOf(r.hotSamples, false);
    const std::vector<double> spilling = secondsOf(r.hotSamples, true);
    r.hotIdleP99 = percentile(idle, 0.99);
    r.hotIdleP50 = percentile(idle, 0.50);
    r.hotSpillP99 = percentile(spilling, 0.99);
    r.hotSpillP50 = percentile(spilling, 0.50);
    r.spillWindowRate = double(windowSpilled) / windowSeconds;
    r.fullRetries += spiller.fullRetries;
  }
  phase("hot lookups, idle and spilling", t0);
  return r;
}

std::string jsonSpreadOf(const std::vector<double>& v) {
  const Spread s = spreadOf(v);
  return "{\"median\": " + jsonNumber(s.median) + ", \"min\": " + jsonNumber(s.min) +
         ", \"max\": " + jsonNumber(s.max) + ", \"per_rep\": " + jsonArray(v) + "}";
}

Status runColdSuite(const Options& options) {
  const std::optional<std::string> dbBench = findOnPath("db_bench");
  std::string dbBenchSkipped;
  if (!dbBench) {
    dbBenchSkipped = "db_bench is not on PATH (rocksdb-tools; scripts/install-deps.sh installs it)";
    std::fprintf(stderr, "kvtier-bench: %s; spill/promote_vs_dbbench are null\n",
                 dbBenchSkipped.c_str());
  }
  const std::string dbVersion = dbBench ? dbBenchVersion(*dbBench) : "";
  const ColdWorkload w;

  const auto report = newReport;
  RatioReport spill =
      report("spill_vs_dbbench", "spill", "db_bench fillrandom", "blocks/s", true, 0.5);
  RatioReport promote =
      report("promote_vs_dbbench", "promote", "db_bench readrandom (found)", "blocks/s", true, 0.5);
  RatioReport hot = report("hot_p99_under_spill", "hot lookup p99, spilling",
                           "hot lookup p99, idle", "s", false, 1.5);
  spill.skipped = promote.skipped = dbBenchSkipped;

  // Per-repetition figures that are not ratios but say whether the ratios mean what they claim.
  std::vector<std::pair<std::string, std::vector<double>>> checks = {
      {"promoted_fraction", {}},
      {"put_full_retries", {}},
      {"dbbench_fill_ops_per_s", {}},
      {"dbbench_read_ops_per_s", {}},
      {"dbbench_read_found_fraction", {}},
      {"spill_blocks_per_s_during_hot", {}},
      {"hot_p50_idle_us", {}},
      {"hot_p50_spilling_us", {}}};
  std::vector<std::pair<std::string, std::vector<double>>> phases;
  std::string daemonVersion = "unknown";
  std::unique_ptr<FILE, int (*)(FILE*)> hotSamples(nullptr, &std::fclose);
  if (!options.hotSamples.empty()) {
    hotSamples.reset(std::fopen(options.hotSamples.c_str(), "w"));
    if (!hotSamples) {
      return makeError(ErrorCode::kInvalidArgument, "cannot write --hot-samples ",
                       options.hotSamples, ": ", std::strerror(errno));
    }
  }

  for (int rep = 0; rep <= options.reps; ++rep) {
    if (gInterrupted) return unavailable("interrupted");
    const bool warmup = rep == 0;
    const auto t0 = Clock::now();
    auto f = measureColdRepetition(options, w, dbBench, warmup);
    if (!f) return f.error();
    const double repSeconds = secondsSince(t0);
    daemonVersion = f->daemonVersion;
    std::fprintf(stderr,
                 "%s %d: spill %.0f blocks/s vs fillrandom %.0f, promote %.0f blocks/s (%llu of "
                 "%llu) vs readrandom %.0f, hot p99 %.1f us spilling vs %.1f us idle (%.1f s)\n",
                 warmup ? "warm-up" : "rep", rep, f->spillRate,
                 f->fill ? f->fill->recordsPerSec() : std::nan(""), f->promoteRate,
                 static_cast<unsigned long long>(f->promoted),
                 static_cast<unsigned long long>(f->promoteLookedUp),
                 f->read ? f->read->recordsPerSec() : std::nan(""), f->hotSpillP99 * 1e6,
                 f->hotIdleP99 * 1e6, repSeconds);
    if (warmup) continue;
    if (f->fill && f->read) {
      spill.kvtier.perRep.push_back(f->spillRate);
      spill.anchor.perRep.push_back(f->fill->recordsPerSec());
      promote.kvtier.perRep.push_back(f->promoteRate);
      promote.anchor.perRep.push_back(f->read->recordsPerSec());
    }
    hot.kvtier.perRep.push_back(f->hotSpillP99);
    if (hotSamples) {
      for (const auto& h : f->hotSamples) {
        std::fprintf(hotSamples.get(), "%d %s %.6f %.1f\n", rep, h.spilling ? "spilling" : "idle",
                     h.start, h.seconds * 1e6);
      }
    }
    hot.anchor.perRep.push_back(f->hotIdleP99);
    const double nan = std::nan("");
    const double values[] = {
        double(f->promoted) / double(f->promoteLookedUp),
        double(f->fullRetries),
        f->fill ? f->fill->opsPerSec : nan,
        f->read ? f->read->opsPerSec : nan,
        f->read && f->read->found ? double(*f->read->found) / double(f->read->ops) : nan,
        f->spillWindowRate,
        f->hotIdleP50 * 1e6,
        f->hotSpillP50 * 1e6};
    for (size_t i = 0; i < checks.size(); ++i) checks[i].second.push_back(values[i]);
    f->phases.emplace_back("repetition", repSeconds);
    if (phases.empty()) {
      for (const auto& [name, s] : f->phases) phases.push_back({name, {}});
    }
    for (size_t i = 0; i < phases.size() && i < f->phases.size(); ++i) {
      phases[i].second.push_back(f->phases[i].second);
    }
  }
  const std::vector<RatioReport> reports = {spill, promote, hot};
  printTable("cold", reports, options.reps);
  std::printf(
      "\nsetup: %llu KiB blocks, %s pool (%llu blocks, %u held by the hot prefix), cold tier on; "
      "per repetition\n%llu blocks spilled (%u prompts of %u blocks, each sequence removed after "
      "its put), %u blocks looked\nup from disk, %d hot lookups of %u blocks (one every %lld us) "
      "idle and as many while another\nclient spills, in %d alternating windows of each. spill = "
      "blocks / (first put -> spilled count\nreached); promote = promoted / lookup wall time. "
      "db_bench %s: same value size, %llu records,\nblob files, no compression, 1 thread; "
      "readrandom counts only the reads that found a record.\n",
      static_cast<unsigned long long>(w.blockBytes() >> 10), kColdPoolBytes,
      static_cast<unsigned long long>(kColdPoolBlocks), kColdPromptBlocks,
      static_cast<unsigned long long>(kSpillBlocks), kSpillPrompts, kColdPromptBlocks,
      kPromotePrompts * kColdPromptBlocks, kHotSamples, kColdPromptBlocks,
      static_cast<long long>(kHotInterval.count()), kHotWindows,
      dbBench ? dbVersion.c_str() : "(absent)", static_cast<unsigned long long>(kSpillBlocks));
  std::printf("\nchecks (median [min-max] per repetition):\n");
  for (const auto& [name, v] : checks) {
    const Spread s = spreadOf(v);
    std::printf("  %-32s %10.3f  [%.3f-%.3f]\n", name.c_str(), s.median, s.min, s.max);
  }
  std::printf("\nwhere the time goes (median [min-max] seconds per repetition):\n");
  for (const auto& [name, v] : phases) {
    const Spread s = spreadOf(v);
    std::printf("  %-32s %8.3f s  [%.3f-%.3f]\n", name.c_str(), s.median, s.min, s.max);
  }

  if (!options.json.empty()) {
    std::string dbFlags;
    for (const auto& f : dbBenchFlags("<tmp>/db_bench", w.blockBytes())) {
      dbFlags += (dbFlags.empty() ? "" : " ") + f;
    }
    RunInfo info{"cold",
                 options.reps,
                 threadingName(options.threading),
                 {{"kvtierd", jsonString(daemonVersion)},
                  {"db_bench", dbBench ? jsonString(dbVersion) : "null"}},
                 {},
                 options.busyPollMicros};
    std::ostringstream setup;
    setup << "\"setup\": {\"block_bytes\": " << w.blockBytes()
          << ", \"host_pool_bytes\": " << (kColdPoolBlocks * w.blockBytes())
          << ", \"pool_blocks\": " << kColdPoolBlocks
          << ", \"hot_prefix_blocks\": " << kColdPromptBlocks
          << ", \"prompt_blocks\": " << kColdPromptBlocks << ", \"spill_blocks\": " << kSpillBlocks
          << ", \"promote_blocks\": " << kPromotePrompts * kColdPromptBlocks
          << ", \"hot_samples\": " << kHotSamples
          << ", \"hot_interval_us\": " << kHotInterval.count()
          << ", \"hot_windows_each\": " << kHotWindows << ", \"daemon_flags\": "
          << jsonString(std::string("--host-pool-bytes ") + kColdPoolBytes +
                        " --cold-tier on --flush-on-exit off")
          << ",\n    \"spill_rate\": "
          << jsonString(
                 "spill_blocks / wall time from the first put until stats().spilled has "
                 "grown by spill_blocks (puts included)")
          << ",\n    \"promote_rate\": "
          << jsonString("stats().promoted delta / wall time of lookups of prompts only on disk")
          << ",\n    \"hot_p99\": "
          << jsonString(
                 "nearest-rank p99 of lookup of a 16-block prefix held by a live sequence, "
                 "paced; idle windows alternate with windows while another client puts and removes "
                 "prompts as fast as it can")
          << ",\n    \"db_bench\": {\"fill\": " << jsonString("--benchmarks=fillrandom " + dbFlags)
          << ", \"read\": "
          << jsonString("--benchmarks=readrandom " + dbFlags +
                        " --use_existing_db=1 --reads=" + std::to_string(kDbBenchReads))
          << ", \"fill_anchor\": \"ops/sec\", \"read_anchor\": \"found reads / seconds\"}}";
    info.extra.push_back(setup.str());
    std::string checksJson = "\"checks\": {";
    for (size_t i = 0; i < checks.size(); ++i) {
      checksJson += std::string(i ? ",\n    " : "\n    ") + jsonString(checks[i].first) + ": " +
                    jsonSpreadOf(checks[i].second);
    }
    info.extra.push_back(checksJson + "}");
    std::string phasesJson = "\"phases_s\": {";
    for (size_t i = 0; i < phases.size(); ++i) {
      phasesJson += std::string(i ? ",\n    " : "\n    ") + jsonString(phases[i].first) + ": " +
                    jsonSpreadOf(phases[i].second);
    }
    info.extra.push_back(phasesJson + "}");
    if (auto s = writeFile(options.json, toJson(reports, Breakdown{}, info)); !s) return s;
    std::printf("\nwrote %s\n", options.json.c_str());
  }
  return {};
}

// ---------------------------------------------------------------------------------------------
// The cluster suite: kvtierds on loopback in clusters of two (static peers). A remote hit (a
// lookup on B of a prompt only A holds: the keys' homes asked who holds them, the blocks pinned
// on A, read with UCX into fresh blocks of B, checked with xxh3 and sealed before the answer)
// against ucx_perftest's ucp_get bandwidth with the same transports and message size; a lookup
// that misses everywhere against the same lookup kept local, and its extra time against a TCP
// loopback round trip; puts on a member against puts on a daemon in no cluster.
//
// Two pairs run side by side for the whole suite, one whose daemons (and its ucx_perftest) run
// with UCX_TLS=tcp and one with UCX's default transports, so that every repetition measures both
// next to their anchors without restarting a daemon; a fifth daemon, started without --listen,
// takes the lone puts. Each has a 512 MiB pool (256 blocks) and the cold tier off.

// Blocks of 2 MiB: 32 layers x 8 KV heads x head dim 128 x fp16 = 128 KiB of K and V per token,
// 16 tokens per block. A prompt is 64 blocks (1024 tokens, 128 MiB).
Layout clusterLayout() { return Layout{"bench/2m", 32, 8, 128, DType::kFloat16, 16, {}}; }
constexpr uint32_t kClusterPromptBlocks = 64;
constexpr uint64_t kClusterPromptTokens = 1024;
constexpr const char* kClusterPoolBytes = "512M";
constexpr uint64_t kClusterPoolBlocks = 256;
// Per repetition and pair: kFetchesPerRep remote hits, half before and half after two
// ucx_perftest runs of kPerftestIterations gets of one block's size: the anchor, with up to
// kPerftestOutstanding gets in flight (as a fetch has) on endpoints with peer failure handling
// (as the daemon's are), and for the record one get at a time without it; then kFetchesPerRep
// snapshot restores across nodes of the same size.
constexpr int kFetchesPerRep = 4;
constexpr int kPerftestIterations = 200;
constexpr int kPerftestOutstanding = 64;
constexpr auto kPerftestTimeout = std::chrono::seconds(60);
// Per repetition: kMissesPerRep lookups that miss everywhere in each mode (alternating), a TCP
// ping-pong after each pair; kPutRounds rounds of kPutsPerRound puts on the member, then as many on
// the lone daemon (the order alternating between rounds).
constexpr int kMissesPerRep = 100;
constexpr int kPutRounds = 6;
constexpr int kPutsPerRound = 4;
// Before the first repetition every daemon takes this many fresh prompts, so every block of its
// pool has been written once (no first-touch page faults in a timed window).
constexpr int kPrefaultPrompts = kClusterPoolBlocks / kClusterPromptBlocks + 1;

// The suite's bytes: one prompt's packed KV (put for every prompt: blocks are keyed by their
// tokens, and the daemons do not check the bytes against them) and a reader's buffer.
struct ClusterWorkload {
  ClusterWorkload() {
    const auto packed =
        synthetic::packedKv(layout, tokens(0, kClusterPromptTokens), 0, kClusterPromptTokens);
    std::memcpy(kv.data(), packed.data(), kv.size());
  }
  // Fresh tokens for every seed: no daemon holds a prompt before the bench puts it.
  std::vector<uint32_t> tokens(uint64_t seed, uint64_t count) const {
    return synthetic::tokens(seed, count);
  }
  uint64_t bytesOf(uint64_t tokens) const { return tokens * layout.tokenKvBytes(); }

  Layout layout = clusterLayout();
  HostBuffer kv{kClusterPromptTokens * layout.tokenKvBytes()};
  HostBuffer out{kClusterPromptTokens * layout.tokenKvBytes()};
  uint64_t nextSeed = 1;  // the next fresh prompt
};

// `count` distinct TCP ports free on 127.0.0.1 right now (bound together, then released).
Result<std::vector<uint16_t>> freeLoopbackPorts(size_t count) {
  std::vector<int> fds;
  std::vector<uint16_t> ports;
  Status status;
  for (size_t i = 0; i < count && status; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      status = unavailable("cannot bind a loopback port: ", std::strerror(errno));
    } else {
      ports.push_back(ntohs(addr.sin_port));
    }
    if (fd >= 0) fds.push_back(fd);
  }
  for (const int fd : fds) ::close(fd);
  if (!status) return status.error();
  return ports;
}

// Whether a TCP socket listens on `port` (any address), from /proc/net/tcp and tcp6: the bench
// waits for ucx_perftest's server this way, without a connection that server would take for its
// client's.
bool tcpListening(uint16_t port) {
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      // "  0: 0100007F:3449 00000000:0000 0A ...": local address:port, remote, state (0A: LISTEN)
      char local[64], remote[64];
      unsigned localPort = 0, state = 0;
      if (std::sscanf(line.c_str(), " %*u: %63[0-9A-Fa-f]:%x %63[0-9A-Fa-f]:%*x %x", local,
                      &localPort, remote, &state) == 4 &&
          localPort == port && state == 0x0A) {
        return true;
      }
    }
  }
  return false;
}

// ucx_perftest's ucp_get bandwidth on loopback: its server, then its client reading
// kPerftestIterations messages of `bytes` each (with `outstanding`, up to that many in flight),
// both with UCX_TLS=`tls` (UCX's defaults when unset). Bytes per second: the client's "Final:"
// overall bandwidth, whose MB are 2^20 bytes.
Result<double> runUcxPerftest(const std::string& exe, const TempDir& dir,
                              const std::optional<std::string>& tls, uint64_t bytes,
                              int outstanding = 0, bool errorHandling = false) {
  auto ports = freeLoopbackPorts(1);
  if (!ports) return ports.error();
  const uint16_t port = ports->front();
  const auto env = environmentWith("UCX_TLS", tls);
  const std::string log = dir.file("ucx_perftest.log");
  auto server = ChildProcess::spawn({exe, "-p", std::to_string(port)}, log, false, env);
  if (!server) return server.error();
  const auto deadline = Clock::now() + kStartTimeout;
  while (!tcpListening(port)) {
    if (server->poll())
      return unavailable("ucx_perftest's server exited at startup; its log:\n", lastLines(log));
    if (Clock::now() >= deadline)
      return unavailable("ucx_perftest's server is not listening on port ", port);
    if (gInterrupted) return unavailable("interrupted");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::vector<std::string> argv = {
      exe,  "127.0.0.1",           "-t", "ucp_get",
      "-s", std::to_string(bytes), "-n", std::to_string(kPerftestIterations),
      "-p", std::to_string(port)};
  if (outstanding > 0) {
    argv.push_back("-O");
    argv.push_back(std::to_string(outstanding));
  }
  if (errorHandling) argv.push_back("-e");
  auto client = ChildProcess::spawn(argv, log, true, env);
  if (!client) return client.error();
  auto line = client->waitForLine("Final:", kPerftestTimeout);
  if (!line)
    return unavailable("ucx_perftest: ", line.error().message(), "; its log:\n", lastLines(log));
  if (!client->waitExit(kStopTimeout)) return unavailable("ucx_perftest's client hangs");
  if (const int status = *client->poll(); !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return unavailable("ucx_perftest's client exited with status ", status, "; its log:\n",
                       lastLines(log));
  }
  server->waitExit(kStopTimeout);  // it exits after its one test; its destructor stops it if not
  // "Final: ITERS LAT50 LAT_AVG LAT_OVERALL BW_AVG BW_OVERALL MSGRATE_AVG MSGRATE_OVERALL"
  double iterations = 0, lat50 = 0, latAvg = 0, latAll = 0, bwAvg = 0, bwAll = 0, mrAvg = 0,
         mrAll = 0;
  if (std::sscanf(line->c_str(), "Final: %lf %lf %lf %lf %lf %lf %lf %lf", &iterations, &lat50,
                  &latAvg, &latAll, &bwAvg, &bwAll, &mrAvg, &mrAll) != 8 ||
      bwAll <= 0) {
    return unavailable("cannot parse ucx_perftest's line '", *line, "'");
  }
  return bwAll * 1048576.0;
}

// One kvtierd of the suite: its own directory, the bench's client and its space. Members are
// destroyed in reverse: client first, the daemon stopped, then its directory removed. A thread
// can hold only one caller-thread client: that of the node whose misses are timed (the second
// pair's B) follows --threading; the others run their own thread, whose hop per call is noise
// next to the 128 MiB each of their timed calls moves.
struct ClusterNode {
  std::string name;
  std::string peerAddr;  // HOST:PORT of its peer listener (members only)
  ClientThreading threading = ClientThreading::kOwnThread;
  std::optional<TempDir> dir;
  BenchDaemon daemon;
  std::unique_ptr<Client> client;
  std::unique_ptr<Space> space;
};

Status startNode(ClusterNode& node, const Options& options, const ClusterWorkload& w,
                 std::vector<std::string> clusterFlags, const std::optional<std::string>& ucxTls) {
  auto dir = TempDir::create();
  if (!dir) return dir.error();
  node.dir.emplace(std::move(dir).value());
  std::vector<std::string> flags = {"--host-pool-bytes", kClusterPoolBytes, "--cold-tier", "off"};
  flags.insert(flags.end(), clusterFlags.begin(), clusterFlags.end());
  const std::string socket = node.dir->file("kvtierd.sock");
  if (auto s = node.daemon.start(options.daemon, *node.dir, socket, options.daemonFlags(flags),
                                 environmentWith("UCX_TLS", ucxTls));
      !s) {
    return makeError(s.error().code(), node.name, ": ", s.error().message());
  }
  auto client = startClient(socket, options, node.threading, "kvtier-bench-" + node.name);
  if (!client) return client.error();
  node.client = std::move(client).value();
  auto space = node.client->open(w.layout);
  if (!space) return space.error();
  node.space = std::move(space).value();
  if (!node.client->mapped())
    return unavailable(node.name, ": the client could not map the daemon's pool");
  return {};
}

// Polls `client`'s counters until `done` holds, up to kColdPhaseTimeout.
Status waitForStats(Client& client, const std::function<bool(const Stats&)>& done,
                    const std::string& what) {
  const auto deadline = Clock::now() + kColdPhaseTimeout;
  for (;;) {
    auto stats = client.stats();
    if (!stats) return stats.error();
    if (done(*stats)) return {};
    if (gInterrupted) return unavailable("interrupted");
    if (Clock::now() >= deadline) return unavailable("timed out waiting for ", what);
    std::this_thread::sleep_for(kStatsPollInterval);
  }
}

// Two members that list each other as static peers, their UCX on `ucxTls` (defaults if unset).
struct ClusterPair {
  std::optional<std::string> ucxTls;
  ClusterNode a, b;
  std::string transports() const { return ucxTls ? "UCX_TLS=" + *ucxTls : "UCX defaults"; }
};

Status startPair(ClusterPair& pair, const Options& options, const ClusterWorkload& w) {
  auto ports = freeLoopbackPorts(2);
  if (!ports) return ports.error();
  const std::string tag = pair.ucxTls.value_or("default");
  const std::string addrA = "127.0.0.1:" + std::to_string((*ports)[0]);
  const std::string addrB = "127.0.0.1:" + std::to_string((*ports)[1]);
  pair.a.name = tag + "-a";
  pair.b.name = tag + "-b";
  pair.a.peerAddr = addrA;
  pair.b.peerAddr = addrB;
  if (auto s =
          startNode(pair.a, options, w,
                    {"--listen", addrA, "--peers", addrB, "--node-id", pair.a.name}, pair.ucxTls);
      !s)
    return s;
  if (auto s =
          startNode(pair.b, options, w,
                    {"--listen", addrB, "--peers", addrA, "--node-id", pair.b.name}, pair.ucxTls);
      !s)
    return s;
  for (ClusterNode* node : {&pair.a, &pair.b}) {
    if (auto s = waitForStats(
            *node->client, [](const Stats& st) { return st.clusterMembersUp == 2; },
            node->name + " to see both members up");
        !s)
      return s;
  }
  return {};
}

// Puts `prompts` fresh prompts of `tokens` tokens on `node`, each at position 0 of one sequence
// (replacing the previous prompt's blocks, which stay cached and evictable); returns the seconds
// of the puts alone (the tokens are made before the clock starts).
Result<double> timeFreshPuts(ClusterNode& node, ClusterWorkload& w, int prompts, uint64_t tokens,
                             const char* seq) {
  std::vector<std::vector<uint32_t>> all;
  for (int i = 0; i < prompts; ++i) all.push_back(w.tokens(w.nextSeed++, tokens));
  const uint32_t blocks = static_cast<uint32_t>(tokens / w.layout.blockTokens);
  const auto t0 = Clock::now();
  for (const auto& t : all) {
    auto info = node.space->put(seq, 0, t, w.kv.data(), w.bytesOf(tokens));
    if (!info) return info.error();
    if (info->sealedBlocks != blocks) {
      return makeError(ErrorCode::kInternal, node.name, ": put sealed ", info->sealedBlocks,
                       " blocks, expected ", blocks);
    }
  }
  return secondsSince(t0);
}

// One remote hit: a fresh prompt of `tokens` tokens put on pair.a (untimed) and published (a's
// publish backlog drained: its homes have acknowledged the keys), then looked up on pair.b, which
// holds none of it. Returns the seconds of that lookup alone. `verify`: also compare the bytes b
// hands out with those put.
Result<double> timeRemoteHit(ClusterPair& pair, ClusterWorkload& w, uint64_t tokens, bool verify) {
  const auto prompt = w.tokens(w.nextSeed, tokens);  // the prompt timeFreshPuts puts next
  if (auto put = timeFreshPuts(pair.a, w, 1, tokens, "bench-remote"); !put) return put.error();
  if (auto s = waitForStats(
          *pair.a.client, [](const Stats& st) { return st.publishBacklog == 0; },
          pair.a.name + "'s publish backlog to drain");
      !s)
    return s.error();
  const auto t0 = Clock::now();
  auto hit = pair.b.space->lookup(prompt);  // RemoteMode::kFetch, the default
  const double elapsed = secondsSince(t0);
  if (!hit) return hit.error();
  if (hit->matchedTokens() != tokens) {
    return makeError(ErrorCode::kInternal, pair.b.name, " matched ", hit->matchedTokens(), " of ",
                     tokens, " tokens that ", pair.a.name,
                     " holds (see stats' fetch* counters and both logs)");
  }
  if (verify) {
    if (auto s = hit->copyTo(0, tokens, w.out.data(), w.bytesOf(tokens)); !s) return s.error();
    if (std::memcmp(w.out.data(), w.kv.data(), w.bytesOf(tokens)) != 0)
      return makeError(ErrorCode::kInternal, "fetched bytes differ from the bytes put");
  }
  return elapsed;
}

// One restore across nodes: a fresh prompt put on pair.a and snapshotted there (untimed), then
// restored on pair.b from a's snapshot (the manifest and every block pulled and checked). Returns
// the seconds of the restore alone; both sides are cleaned up after.
Result<double> timeRemoteRestore(ClusterPair& pair, ClusterWorkload& w, uint64_t tokens) {
  if (auto put = timeFreshPuts(pair.a, w, 1, tokens, "bench-snap"); !put) return put.error();
  auto snap = pair.a.space->snapshot("bench-snap", 0);
  if (!snap) return snap.error();
  const auto t0 = Clock::now();
  Status restored = pair.b.space->restore("bench-restored", snap->id, tokens, {}, snap->node);
  const double elapsed = secondsSince(t0);
  if (!restored) return restored.error();
  auto length = pair.b.space->length("bench-restored");
  if (!length || length->value_or(0) != tokens) {
    return makeError(ErrorCode::kInternal, pair.b.name, ": the restored sequence is not whole");
  }
  if (auto s = pair.b.space->remove("bench-restored", 0); !s) return s.error();
  if (auto s = pair.a.space->dropSnapshot(snap->id); !s) return s.error();
  return elapsed;
}

// Seconds of one lookup on `node` of a fresh prompt nobody holds, asking the cluster or not.
Result<double> timeMiss(ClusterNode& node, ClusterWorkload& w, RemoteMode mode) {
  const auto prompt = w.tokens(w.nextSeed++, kClusterPromptTokens);
  LookupOptions o;
  o.remote = mode;
  const auto t0 = Clock::now();
  auto hit = node.space->lookup(prompt, o);
  const double elapsed = secondsSince(t0);
  if (!hit) return hit.error();
  if (hit->matchedTokens() != 0)
    return makeError(ErrorCode::kInternal, "a prompt nobody holds matched ", hit->matchedTokens());
  return elapsed;
}

// One repetition's figures, per pair where there are two (tcp first, then defaults).
struct ClusterRep {
  double fetch[2] = {0, 0};                      // bytes/s of remote hits
  double restore[2] = {0, 0};                    // bytes/s of snapshot restores across nodes
  std::vector<double> fetchSeconds[2];           // each remote hit
  std::optional<double> perftest[2];             // ucx_perftest, bytes/s
  std::optional<double> perftestOutstanding[2];  // one get in flight, no failure handling
  double hitBlocksPerFetch[2] = {0, 0};          // b's remoteHitBlocks delta / fetches
  double missRemote = 0, missLocal = 0;          // median seconds
  double remoteLookupsPerMiss = 0;               // b's remoteLookups delta / kFetch misses
  double tcpRtt = 0;                             // median seconds
  double peerRtt = 0;       // median Peer.ping round trip to the asker's peer (seconds)
  double heartbeatRtt = 0;  // the asker's own median heartbeat round trip (kvtier stats)
  double putCluster = 0, putLone = 0;            // bytes/s
};

// Median round trip of `n` Peer.ping calls to the daemon listening at `addr`, made as another
// daemon makes them (authenticated over the peer protocol; the suite's daemons listen on loopback
// without a token), one at a time, from a thread of its own (its own event loop).
Result<double> samplePeerPings(const std::string& addr, int n) {
  std::vector<double> out;
  std::string error;
  std::thread t([&] {
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] {
                   capnp::EzRpcClient rpc(addr);
                   auto& ws = rpc.getWaitScope();
                   auto auth = rpc.getMain<rpc::peer::PeerGate>().authenticateRequest();
                   auth.setProtocolVersion(rpc::peer::PEER_PROTOCOL_VERSION);
                   auth.setNodeId("kvtier-bench");
                   auto peer = auth.send().wait(ws).getPeer();
                   for (int i = 0; i < n; ++i) {
                     const auto t0 = Clock::now();
                     peer.pingRequest().send().wait(ws);
                     out.push_back(secondsSince(t0));
                     // As far apart as the misses: the daemon's loop sleeps in between.
                     std::this_thread::sleep_for(std::chrono::microseconds(200));
                   }
                 })) {
      error = e->getDescription().cStr();
    }
  });
  t.join();
  if (!error.empty()) return unavailable("peer pings to ", addr, ": ", error);
  return medianOf(out);
}

Result<ClusterRep> measureClusterRepetition(ClusterPair (&pairs)[2], ClusterNode& lone,
                                            ClusterWorkload& w, EchoPeer& tcpEcho,
                                            const std::optional<std::string>& perftest,
                                            const TempDir& scratch, bool verify) {
  ClusterRep r;
  const double promptBytes = double(w.bytesOf(kClusterPromptTokens));
  for (int p = 0; p < 2; ++p) {
    ClusterPair& pair = pairs[p];
    auto before = pair.b.client->stats();
    if (!before) return before.error();
    double seconds = 0;
    for (int i = 0; i < kFetchesPerRep; ++i) {
      if (gInterrupted) return unavailable("interrupted");
      if (i == kFetchesPerRep / 2 && perftest) {
        // The anchor: gets as the daemon issues them (all of a prompt's blocks in flight at
        // once) on endpoints with peer failure handling, as the daemon's are.
        auto bw = runUcxPerftest(*perftest, scratch, pair.ucxTls, w.layout.blockBytes(),
                                 kPerftestOutstanding, /*errorHandling=*/true);
        if (!bw) return bw.error();
        r.perftest[p] = *bw;
        // For the record: one get at a time, without failure handling (with UCX's defaults on
        // one host that is shared memory, which no failure-handling endpoint gets in UCX 1.13).
        bw = runUcxPerftest(*perftest, scratch, pair.ucxTls, w.layout.blockBytes());
        if (!bw) return bw.error();
        r.perftestOutstanding[p] = *bw;
      }
      auto t = timeRemoteHit(pair, w, kClusterPromptTokens, verify && i == 0);
      if (!t) return t.error();
      seconds += *t;
      r.fetchSeconds[p].push_back(*t);
    }
    auto after = pair.b.client->stats();
    if (!after) return after.error();
    r.fetch[p] = promptBytes * kFetchesPerRep / seconds;
    r.hitBlocksPerFetch[p] =
        double(after->remoteHitBlocks - before->remoteHitBlocks) / kFetchesPerRep;
    double restoreSeconds = 0;
    for (int i = 0; i < kFetchesPerRep; ++i) {
      if (gInterrupted) return unavailable("interrupted");
      auto t = timeRemoteRestore(pair, w, kClusterPromptTokens);
      if (!t) return t.error();
      restoreSeconds += *t;
    }
    r.restore[p] = promptBytes * kFetchesPerRep / restoreSeconds;
  }

  // Misses on the second pair's b (no bytes move: the transports do not matter).
  ClusterNode& asker = pairs[1].b;
  std::vector<double> remote, local, pings;
  auto before = asker.client->stats();
  if (!before) return before.error();
  // A ping-pong after every pair of misses: the machine's state (which core sleeps, what else
  // runs) changes over a repetition, and both figures should see the same states.
  for (int i = 0; i < kMissesPerRep; ++i) {
    if (gInterrupted) return unavailable("interrupted");
    for (const RemoteMode mode : i % 2 ? std::array{RemoteMode::kLocal, RemoteMode::kFetch}
                                       : std::array{RemoteMode::kFetch, RemoteMode::kLocal}) {
      auto t = timeMiss(asker, w, mode);
      if (!t) return t.error();
      (mode == RemoteMode::kFetch ? remote : local).push_back(*t);
    }
    if (auto s = samplePings(tcpEcho, 1, pings); !s) return s.error();
  }
  auto after = asker.client->stats();
  if (!after) return after.error();
  r.missRemote = medianOf(remote);
  r.missLocal = medianOf(local);
  r.remoteLookupsPerMiss = double(after->remoteLookups - before->remoteLookups) / kMissesPerRep;
  r.tcpRtt = medianOf(pings);
  r.heartbeatRtt = after->peerRttMicros * 1e-6;
  // The asker's peer (the home of about half of each miss's keys), pinged as the asker would.
  auto rtt = samplePeerPings(pairs[1].a.peerAddr, kMissesPerRep);
  if (!rtt) return rtt.error();
  r.peerRtt = *rtt;

  // Puts on the first member of the second pair and on the lone daemon. The member's publishing
  // of its last round is waited for before the lone daemon's puts are timed, so it does not land
  // on them.
  ClusterNode& member = pairs[1].a;
  double memberSeconds = 0, loneSeconds = 0;
  for (int round = 0; round < kPutRounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      if (gInterrupted) return unavailable("interrupted");
      const bool onMember = (round + k) % 2 == 0;
      auto t = timeFreshPuts(onMember ? member : lone, w, kPutsPerRound, kClusterPromptTokens,
                             "bench-put");
      if (!t) return t.error();
      (onMember ? memberSeconds : loneSeconds) += *t;
      if (auto s = waitForStats(
              *member.client, [](const Stats& st) { return st.publishBacklog == 0; },
              member.name + "'s publish backlog to drain");
          !s)
        return s.error();
    }
  }
  r.putCluster = promptBytes * kPutRounds * kPutsPerRound / memberSeconds;
  r.putLone = promptBytes * kPutRounds * kPutsPerRound / loneSeconds;
  return r;
}

// Where a remote hit's time goes, from the client's side: the same hit of one block (the fixed
// cost: who-holds, pin, UCX set-up and one get, seal), and what the bench's own core takes to
// hash (xxh3, as the holder does when it pins and the asker when it checks) and to copy the
// prompt's bytes.
Result<Breakdown> measureClusterBreakdown(ClusterPair (&pairs)[2], ClusterWorkload& w,
                                          const std::vector<double> (&fetchSeconds)[2]) {
  Breakdown b;
  for (int p = 0; p < 2; ++p) {
    std::vector<double> one;
    for (int i = 0; i < kBreakdownIterations; ++i) {
      auto t = timeRemoteHit(pairs[p], w, w.layout.blockTokens, false);
      if (!t) return t.error();
      one.push_back(*t);
    }
    b.steps.emplace_back("remote hit 64 blocks, " + pairs[p].transports(),
                         medianOf(fetchSeconds[p]));
    b.steps.emplace_back("remote hit 1 block, " + pairs[p].transports(), medianOf(one));
  }
  std::vector<double> hash, copy;
  uint64_t sink = 0;
  for (int i = 0; i < kBreakdownIterations; ++i) {
    auto t0 = Clock::now();
    for (uint32_t k = 0; k < kClusterPromptBlocks; ++k)
      sink ^= XXH3_64bits(w.kv.data() + k * w.layout.blockBytes(), w.layout.blockBytes());
    hash.push_back(secondsSince(t0));
    t0 = Clock::now();
    std::memcpy(w.out.data(), w.kv.data(), w.kv.size());
    asm volatile("" : : "r"(w.out.data()), "r"(sink) : "memory");
    copy.push_back(secondsSince(t0));
  }
  b.steps.emplace_back("xxh3 of 64 blocks (bench)", medianOf(hash));
  b.steps.emplace_back("memcpy of 64 blocks (bench)", medianOf(copy));
  return b;
}

Status runClusterSuite(const Options& options) {
  auto tcpEcho = EchoPeer::start({}, /*tcp=*/true);  // first: fork while there are no threads
  if (!tcpEcho) return tcpEcho.error();
  auto scratch = TempDir::create();
  if (!scratch) return scratch.error();
  const std::optional<std::string> perftest = findOnPath("ucx_perftest");
  std::string perftestSkipped;
  if (!perftest) {
    perftestSkipped = "ucx_perftest is not on PATH (ucx-utils; scripts/install-deps.sh)";
    std::fprintf(stderr, "kvtier-bench: %s; fetch_vs_ucx_* are null\n", perftestSkipped.c_str());
  }
  const std::optional<std::string> ucxInfo = findOnPath("ucx_info");
  const std::string ucxVersion = ucxInfo ? versionOf({*ucxInfo, "-v"}, "# Version ") : "unknown";
  ClusterWorkload w;
  if (w.layout.blockBytes() != (2u << 20) ||
      w.bytesOf(kClusterPromptTokens) != w.layout.blockBytes() * kClusterPromptBlocks) {
    return makeError(ErrorCode::kInternal, "bad cluster workload size");
  }

  ClusterPair pairs[2];
  pairs[0].ucxTls = "tcp";
  pairs[1].b.threading = options.threading;  // the node whose misses are timed
  ClusterNode lone;
  lone.name = "lone";
  for (ClusterPair& pair : pairs) {
    if (auto s = startPair(pair, options, w); !s) return s;
  }
  if (auto s = startNode(lone, options, w, {}, std::nullopt); !s) return s;
  std::string daemonVersion = lone.client->daemonVersion();
  for (ClusterNode* node : {&pairs[0].a, &pairs[0].b, &pairs[1].a, &pairs[1].b, &lone}) {
    auto s = node->client->stats();
    if (!s) return s.error();
    const bool member = node != &lone;
    if (s->blocksTotal != kClusterPoolBlocks || (s->clusterMembers != 0) != member) {
      return makeError(ErrorCode::kInternal, node->name, ": ", s->blocksTotal,
                       " pool blocks (expected ", kClusterPoolBlocks, "), ", s->clusterMembers,
                       " cluster members");
    }
    if (auto t = timeFreshPuts(*node, w, kPrefaultPrompts, kClusterPromptTokens, "bench-prefault");
        !t)
      return t.error();
    if (auto r = node->space->remove("bench-prefault", 0); !r) return r;
  }

  const auto report = newReport;
  RatioReport fetchTcp = report("fetch_vs_ucx_tcp", "remote hit, UCX_TLS=tcp",
                                "ucx_perftest get 2 MiB -O64 -e, tcp", "bytes/s", true, 0.8);
  RatioReport fetchDefault = report("fetch_vs_ucx_default", "remote hit, UCX defaults",
                                    "ucx_perftest get 2 MiB -O64 -e, defaults", "bytes/s", true,
                                    0.8);
  RatioReport restoreTcp = report("restore_vs_ucx_tcp", "snapshot restore across nodes, tcp",
                                  "ucx_perftest get 2 MiB -O64 -e, tcp", "bytes/s", true, 0.8);
  RatioReport restoreDefault =
      report("restore_vs_ucx_default", "snapshot restore across nodes, defaults",
             "ucx_perftest get 2 MiB -O64 -e, defaults", "bytes/s", true, 0.8);
  RatioReport miss = report("remote_miss_overhead", "miss, remote=fetch", "miss, remote=local", "s",
                            false, std::nullopt);
  RatioReport missRtt = report("remote_miss_extra_vs_peer_rtt", "extra of remote=fetch",
                               "peer round trip (Peer.ping)", "s", false, 2.0);
  RatioReport put = report("put_cluster_vs_local", "put on a member", "put on a lone daemon",
                           "bytes/s", true, 0.95);
  fetchTcp.skipped = fetchDefault.skipped = restoreTcp.skipped = restoreDefault.skipped =
      perftestSkipped;
  std::vector<std::pair<std::string, std::vector<double>>> checks = {
      {"remote_hit_blocks_per_fetch_tcp", {}},
      {"remote_hit_blocks_per_fetch_default", {}},
      {"remote_hit_ms_tcp", {}},
      {"remote_hit_ms_default", {}},
      {"ucx_perftest_MBps_tcp", {}},
      {"ucx_perftest_MBps_default", {}},
      {"ucx_perftest_O1_no_errhandling_MBps_tcp", {}},
      {"ucx_perftest_O1_no_errhandling_MBps_default", {}},
      {"fetch_vs_ucx_O1_no_errhandling_tcp", {}},
      {"fetch_vs_ucx_O1_no_errhandling_default", {}},
      {"miss_remote_fetch_us", {}},
      {"miss_remote_local_us", {}},
      {"miss_extra_us", {}},
      {"tcp_rtt_us", {}},
      {"miss_extra_vs_tcp_rtt", {}},
      {"heartbeat_rtt_us", {}},
      {"remote_lookups_per_fetch_miss", {}}};
  std::vector<double> allFetchSeconds[2];

  for (int rep = 0; rep <= options.reps; ++rep) {
    if (gInterrupted) return unavailable("interrupted");
    const bool warmup = rep == 0;
    const auto t0 = Clock::now();
    auto f = measureClusterRepetition(pairs, lone, w, *tcpEcho, perftest, *scratch, warmup);
    if (!f) return f.error();
    const double nan = std::nan("");
    std::fprintf(stderr,
                 "%s %d: remote hit %s (tcp) vs perftest %s, %s (defaults) vs %s; miss %s vs %s "
                 "local, peer rtt %s, tcp rtt %s; put %s member vs %s lone (%.1f s)\n",
                 warmup ? "warm-up" : "rep", rep, human(f->fetch[0], "bytes/s").c_str(),
                 human(f->perftest[0].value_or(nan), "bytes/s").c_str(),
                 human(f->fetch[1], "bytes/s").c_str(),
                 human(f->perftest[1].value_or(nan), "bytes/s").c_str(),
                 human(f->missRemote, "s").c_str(), human(f->missLocal, "s").c_str(),
                 human(f->peerRtt, "s").c_str(), human(f->tcpRtt, "s").c_str(),
                 human(f->putCluster, "bytes/s").c_str(),
                 human(f->putLone, "bytes/s").c_str(), secondsSince(t0));
    if (warmup) continue;
    RatioReport* fetches[2] = {&fetchTcp, &fetchDefault};
    RatioReport* restores[2] = {&restoreTcp, &restoreDefault};
    for (int p = 0; p < 2; ++p) {
      if (f->perftest[p]) {
        fetches[p]->kvtier.perRep.push_back(f->fetch[p]);
        fetches[p]->anchor.perRep.push_back(*f->perftest[p]);
        restores[p]->kvtier.perRep.push_back(f->restore[p]);
        restores[p]->anchor.perRep.push_back(*f->perftest[p]);
      }
      allFetchSeconds[p].insert(allFetchSeconds[p].end(), f->fetchSeconds[p].begin(),
                                f->fetchSeconds[p].end());
    }
    miss.kvtier.perRep.push_back(f->missRemote);
    miss.anchor.perRep.push_back(f->missLocal);
    missRtt.kvtier.perRep.push_back(f->missRemote - f->missLocal);
    missRtt.anchor.perRep.push_back(f->peerRtt);
    put.kvtier.perRep.push_back(f->putCluster);
    put.anchor.perRep.push_back(f->putLone);
    const double values[] = {f->hitBlocksPerFetch[0],
                             f->hitBlocksPerFetch[1],
                             medianOf(f->fetchSeconds[0]) * 1e3,
                             medianOf(f->fetchSeconds[1]) * 1e3,
                             f->perftest[0].value_or(nan) / 1048576.0,
                             f->perftest[1].value_or(nan) / 1048576.0,
                             f->perftestOutstanding[0].value_or(nan) / 1048576.0,
                             f->perftestOutstanding[1].value_or(nan) / 1048576.0,
                             f->fetch[0] / f->perftestOutstanding[0].value_or(nan),
                             f->fetch[1] / f->perftestOutstanding[1].value_or(nan),
                             f->missRemote * 1e6,
                             f->missLocal * 1e6,
                             (f->missRemote - f->missLocal) * 1e6,
                             f->tcpRtt * 1e6,
                             (f->missRemote - f->missLocal) / f->tcpRtt,
                             f->heartbeatRtt * 1e6,
                             f->remoteLookupsPerMiss};
    for (size_t i = 0; i < checks.size(); ++i) checks[i].second.push_back(values[i]);
  }
  auto breakdown = measureClusterBreakdown(pairs, w, allFetchSeconds);
  if (!breakdown) return breakdown.error();

  const std::vector<RatioReport> reports = {fetchTcp, fetchDefault, restoreTcp, restoreDefault,
                                            miss, missRtt, put};
  printTable("cluster", reports, options.reps);
  std::printf(
      "\nsetup: two 2-node clusters on loopback (static peers; one with UCX_TLS=tcp, one with "
      "UCX's "
      "defaults)\nand a lone daemon, %s pools of %llu blocks of %llu KiB, cold tier off. Per "
      "repetition and\ncluster, %d remote hits of a fresh %u-block prompt put on A beforehand "
      "(lookup on B, timed to its\nanswer) around one ucx_perftest ucp_get run (%d x %llu bytes, "
      "same UCX_TLS); %d misses each way\non B of fresh %u-block prompts, as many TCP loopback "
      "ping-pongs; %d puts of fresh %u-block\nprompts on a member and as many on the lone daemon. "
      "UCX %s.\n",
      kClusterPoolBytes, static_cast<unsigned long long>(kClusterPoolBlocks),
      static_cast<unsigned long long>(w.layout.blockBytes() >> 10), kFetchesPerRep,
      kClusterPromptBlocks, kPerftestIterations,
      static_cast<unsigned long long>(w.layout.blockBytes()), kMissesPerRep, kClusterPromptBlocks,
      kPutRounds * kPutsPerRound, kClusterPromptBlocks, ucxVersion.c_str());
  std::printf("\nchecks (median [min-max] per repetition):\n");
  for (const auto& [name, v] : checks) {
    const Spread s = spreadOf(v);
    std::printf("  %-36s %10.3f  [%.3f-%.3f]\n", name.c_str(), s.median, s.min, s.max);
  }
  printBreakdown(*breakdown);

  if (!options.json.empty()) {
    RunInfo info{"cluster",
                 options.reps,
                 threadingName(options.threading),
                 {{"kvtierd", jsonString(daemonVersion)}, {"ucx", jsonString(ucxVersion)}},
                 {},
                 options.busyPollMicros};
    std::ostringstream setup;
    setup << "\"setup\": {\"block_bytes\": " << w.layout.blockBytes()
          << ", \"prompt_blocks\": " << kClusterPromptBlocks
          << ", \"pool_blocks\": " << kClusterPoolBlocks
          << ", \"fetches_per_rep\": " << kFetchesPerRep
          << ", \"misses_per_rep\": " << kMissesPerRep
          << ", \"puts_per_rep\": " << kPutRounds * kPutsPerRound << ", \"daemon_flags\": "
          << jsonString(std::string("--host-pool-bytes ") + kClusterPoolBytes +
                        " --cold-tier off --listen 127.0.0.1:P --peers 127.0.0.1:Q --node-id ID "
                        "(lone: no cluster flags); env UCX_TLS=tcp or unset")
          << ",\n    \"ucx_perftest\": "
          << jsonString(
                 "server: ucx_perftest -p PORT; client: ucx_perftest 127.0.0.1 -t ucp_get "
                 "-s " +
                 std::to_string(w.layout.blockBytes()) + " -n " +
                 std::to_string(kPerftestIterations) +
                 " -p PORT -O " + std::to_string(kPerftestOutstanding) +
                 " -e (as many gets in flight as a fetch has, endpoints with peer failure "
                 "handling like the daemon's); the Final line's overall bandwidth (MB = 2^20 "
                 "bytes); the O1_no_errhandling checks drop -O and -e")
          << ",\n    \"remote_hit\": "
          << jsonString(
                 "bytes of a fresh 64-block prompt / seconds of one lookup on B (remote = "
                 "fetch) of a prompt A put and published beforehand, untimed")
          << ",\n    \"miss\": "
          << jsonString(
                 "median seconds of a lookup on B of a fresh 64-block prompt nobody "
                 "holds, remote = fetch vs remote = local, alternating")
          << ",\n    \"put\": "
          << jsonString(
                 "bytes / seconds of puts of fresh 64-block prompts at position 0 of one "
                 "sequence; rounds alternate member and lone; the member's publish backlog "
                 "drained between")
          << ",\n    \"client_threading\": "
          << jsonString(
                 "as above for the node whose misses are timed (the default pair's B); the "
                 "other clients run their own thread")
          << "}";
    info.extra.push_back(setup.str());
    std::string checksJson = "\"checks\": {";
    for (size_t i = 0; i < checks.size(); ++i) {
      checksJson += std::string(i ? ",\n    " : "\n    ") + jsonString(checks[i].first) + ": " +
                    jsonSpreadOf(checks[i].second);
    }
    info.extra.push_back(checksJson + "}");
    if (auto s = writeFile(options.json, toJson(reports, *breakdown, info)); !s) return s;
    std::printf("\nwrote %s\n", options.json.c_str());
  }
  return {};
}

Result<Options> parseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> Result<std::string> {
      if (i + 1 >= argc) return makeError(ErrorCode::kInvalidArgument, a, " needs a value");
      return std::string(argv[++i]);
    };
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--suite" || a == "--json" || a == "--reps" || a == "--daemon" ||
               a == "--threading" || a == "--busy-poll-us" || a == "--hot-samples") {
      auto v = value();
      if (!v) return v.error();
      // A whole number from lo to hi, or a typed error naming the flag.
      auto number = [&](long lo, long hi) -> Result<long> {
        char* end = nullptr;
        const long n = std::strtol(v->c_str(), &end, 10);
        if (end == v->c_str() || *end != '\0' || n < lo || n > hi) {
          return makeError(ErrorCode::kInvalidArgument, a, " wants a number from ", lo, " to ", hi,
                           ", not '", *v, "'");
        }
        return n;
      };
      if (a == "--busy-poll-us") {
        auto us = number(0, kMaxBusyPoll.count());
        if (!us) return us.error();
        o.busyPollMicros = static_cast<uint32_t>(*us);
      } else if (a == "--threading") {
        if (*v != "caller" && *v != "own") {
          return makeError(ErrorCode::kInvalidArgument, "--threading is caller or own, not '", *v,
                           "'");
        }
        o.threading = *v == "own" ? ClientThreading::kOwnThread : ClientThreading::kCallerThread;
      } else if (a == "--suite") {
        o.suite = *v;
      } else if (a == "--json") {
        o.json = *v;
      } else if (a == "--hot-samples") {
        o.hotSamples = *v;
      } else if (a == "--daemon") {
        o.daemon = *v;
      } else {
        auto reps = number(1, 1000);
        if (!reps) return reps.error();
        o.reps = static_cast<int>(*reps);
      }
    } else {
      return makeError(ErrorCode::kInvalidArgument, "unknown argument '", a, "'");
    }
  }
  if (o.suite != "local" && o.suite != "cold" && o.suite != "gpu" && o.suite != "cluster")
    return makeError(ErrorCode::kInvalidArgument, "unknown suite '", o.suite, "'");
  return o;
}

// ---------------------------------------------------------------------------------------------
// The GPU suite: the paged KV kernels against cudaMemcpy device-to-device of the same bytes, and
// host -> GPU pool promotion against a pinned cudaMemcpy host-to-device, on GPU 0 with a daemon
// whose GPU pool is there. Each kvtier figure and its anchor are timed back to back in every
// repetition (wall clock, each ending with a stream synchronize). Without CUDA or a GPU every
// ratio is null, with the reason.

// 256 blocks of the local suite's 256 KiB: a 64 MiB prefix (4096 tokens).
constexpr uint64_t kGpuPrefixBlocks = 256;

#ifdef KVTIER_HAVE_CUDA
// The engine's paged cache on GPU 0 for the suite's layout: 16-token blocks, a shuffled table.
struct GpuPagedCache {
  PagedKvCache view;
  std::vector<int32_t> table;
  uint64_t bytesPerTensor = 0;

  static Result<GpuPagedCache> create(const Layout& layout, uint64_t tokens) {
    GpuPagedCache c;
    c.view.blockTokens = 16;
    const uint64_t blocks = (tokens + 15) / 16;
    c.bytesPerTensor = blocks * 16 * layout.tokenBytes();
    for (uint32_t i = 0; i < 2 * layout.numLayers; ++i) {
      void* p = nullptr;
      if (cudaMalloc(&p, c.bytesPerTensor) != cudaSuccess) {
        return unavailable("cudaMalloc of the paged cache failed");
      }
      (i % 2 ? c.view.values : c.view.keys).push_back(p);
    }
    for (uint64_t b = 0; b < blocks; ++b) c.table.push_back(static_cast<int32_t>(b));
    std::mt19937 rng(7);
    std::shuffle(c.table.begin(), c.table.end(), rng);
    return c;
  }
  void free() {
    for (void* p : view.keys) cudaFree(p);
    for (void* p : view.values) cudaFree(p);
    view.keys.clear();
    view.values.clear();
  }
};

template <typename F>
Result<double> timedOnStream(cudaStream_t stream, F&& f) {
  const auto t0 = Clock::now();
  if (auto s = f(); !s) return s.error();
  if (cudaStreamSynchronize(stream) != cudaSuccess) return unavailable("stream failed");
  return secondsSince(t0);
}

Status runGpuMeasurements(const Options& options, std::vector<RatioReport>& reports,
                          std::string& daemonVersion) {
  auto dir = TempDir::create();
  if (!dir) return dir.error();
  const std::string socket = dir->file("kvtierd.sock");
  BenchDaemon daemon;
  if (auto s = daemon.start(options.daemon, *dir, socket,
                            options.daemonFlags({"--host-pool-bytes", "1G", "--gpus", "0",
                                                 "--gpu-pool-bytes", "1G"}));
      !s)
    return s;
  auto gpuClient = startClient(socket, options, options.threading);
  if (!gpuClient) return gpuClient.error();
  auto hostClient = startClient(socket, options, ClientThreading::kOwnThread, "kvtier-bench-host");
  if (!hostClient) return hostClient.error();
  daemonVersion = (*gpuClient)->daemonVersion();
  Workload w;  // the local suite's layout
  auto gpuSpace = (*gpuClient)->open(w.layout, OpenOptions{.device = 0});
  if (!gpuSpace) return gpuSpace.error();
  auto hostSpace = (*hostClient)->open(w.layout);
  if (!hostSpace) return hostSpace.error();

  const uint64_t tokens = kGpuPrefixBlocks * w.layout.blockTokens;
  const uint64_t bytes = tokens * w.layout.tokenKvBytes();
  const auto prompt = synthetic::tokens(4242, tokens);
  const auto promotePrompt = synthetic::tokens(4343, tokens);
  const auto kv = synthetic::packedKv(w.layout, prompt, 0, tokens);
  auto cache = GpuPagedCache::create(w.layout, tokens);
  if (!cache) return cache.error();
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    return unavailable("cudaStreamCreate failed");
  }
  void *d2dSrc = nullptr, *d2dDst = nullptr, *pinned = nullptr;
  if (cudaMalloc(&d2dSrc, bytes) != cudaSuccess || cudaMalloc(&d2dDst, bytes) != cudaSuccess ||
      cudaMallocHost(&pinned, bytes) != cudaSuccess) {
    return unavailable("cannot allocate the anchors' buffers");
  }
  std::memcpy(pinned, kv.data(), bytes);
  auto cleanup = [&] {
    cudaFree(d2dSrc);
    cudaFree(d2dDst);
    cudaFreeHost(pinned);
    cudaStreamDestroy(stream);
    cache->free();
  };

  // The prefix on the GPU: put from the paged cache (after filling it), checked once end to end.
  Status result = [&]() -> Status {
    // Fill the paged cache through the pool: the host writes the prefix, a GPU gather reads it.
    if (auto r = (*hostSpace)->put("fill", 0, prompt, kv.data(), kv.size()); !r) return r.error();
    {
      auto hit = (*gpuSpace)->lookup(prompt);
      if (!hit) return hit.error();
      if (hit->matchedTokens() != tokens) return makeError(ErrorCode::kInternal, "fill missed");
      if (auto s = (*gpuSpace)->gatherTo(*hit, 0, tokens, cache->view, cache->table, stream); !s)
        return s;
    }
    // Host copies of promotePrompt's blocks: each repetition moves them to the GPU and back.
    const auto promoteKv = synthetic::packedKv(w.layout, promotePrompt, 0, tokens);
    if (auto r = (*hostSpace)->put("promote", 0, promotePrompt, promoteKv.data(), promoteKv.size());
        !r)
      return r.error();
    if (auto r = (*hostSpace)->remove("promote", 0); !r) return r.error();
    if (auto r = (*hostSpace)->remove("fill", 0); !r) return r.error();

    auto& gather = reports[0];
    auto& scatter = reports[1];
    auto& promote = reports[2];
    // Other tokens than the prefix, so that the commit below keeps the scattered blocks (the same
    // tokens would share the prefix's indexed blocks instead).
    const auto scatterTokens = synthetic::tokens(4545, tokens);
    auto write = (*gpuSpace)->beginPut("scatter-target", 0, scatterTokens);
    if (!write) return write.error();
    for (int rep = 0; rep <= options.reps; ++rep) {
      if (gInterrupted) return makeError(ErrorCode::kUnavailable, "interrupted");
      const bool warmup = rep == 0;
      // gather: the held prefix into the paged cache; anchor: D2D of the same bytes.
      auto hit = (*gpuSpace)->lookup(prompt);
      if (!hit) return hit.error();
      auto g = timedOnStream(stream, [&] {
        return (*gpuSpace)->gatherTo(*hit, 0, tokens, cache->view, cache->table, stream);
      });
      if (!g) return g.error();
      hit->release();
      auto d2d = timedOnStream(stream, [&]() -> Status {
        if (cudaMemcpyAsync(d2dDst, d2dSrc, bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess)
          return unavailable("cudaMemcpyAsync D2D failed");
        return {};
      });
      if (!d2d) return d2d.error();
      // scatter: the paged cache into the granted pool blocks.
      auto sc = timedOnStream(stream, [&] {
        return (*gpuSpace)->scatterTo(*write, 0, tokens, cache->view, cache->table, stream);
      });
      if (!sc) return sc.error();
      // promote: a host session's lookup takes the blocks to the host pool (untimed), then a GPU
      // session's lookup brings them back; anchor: pinned H2D of the same bytes.
      auto pinnedBefore = (*gpuClient)->stats();  // the scatter target's lease pins blocks
      if (!pinnedBefore) return pinnedBefore.error();
      {
        auto back = (*hostSpace)->lookup(promotePrompt);
        if (!back) return back.error();
      }
      // That release travels on the other connection: wait until it has landed, so that the
      // blocks are free to move when the timed lookup asks.
      for (int i = 0; i < 10000; ++i) {
        auto st = (*gpuClient)->stats();
        if (!st) return st.error();
        if (st->blocksPinned <= pinnedBefore->blocksPinned) break;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      const auto t0 = Clock::now();
      auto up = (*gpuSpace)->lookup(promotePrompt);
      if (!up) return up.error();
      const double promoteSeconds = secondsSince(t0);
      if (up->matchedTokens() != tokens) {
        return makeError(ErrorCode::kInternal, "promote prefix matched ", up->matchedTokens());
      }
      up->release();
      auto h2d = timedOnStream(stream, [&]() -> Status {
        if (cudaMemcpyAsync(d2dDst, pinned, bytes, cudaMemcpyHostToDevice, stream) != cudaSuccess)
          return unavailable("cudaMemcpyAsync H2D failed");
        return {};
      });
      if (!h2d) return h2d.error();
      std::fprintf(stderr, "%s %d: gather %s, scatter %s, d2d %s, promote %s, h2d %s\n",
                   warmup ? "warm-up" : "rep", rep, human(bytes / *g, "bytes/s").c_str(),
                   human(bytes / *sc, "bytes/s").c_str(), human(bytes / *d2d, "bytes/s").c_str(),
                   human(bytes / promoteSeconds, "bytes/s").c_str(),
                   human(bytes / *h2d, "bytes/s").c_str());
      if (warmup) continue;
      gather.kvtier.perRep.push_back(bytes / *g);
      gather.anchor.perRep.push_back(bytes / *d2d);
      scatter.kvtier.perRep.push_back(bytes / *sc);
      scatter.anchor.perRep.push_back(bytes / *d2d);
      promote.kvtier.perRep.push_back(bytes / promoteSeconds);
      promote.anchor.perRep.push_back(bytes / *h2d);
    }
    // The last scatter's bytes must be the prefix's: commit, end the sequence (its blocks stay
    // cached), and read them on the host (the lookup brings them to the host pool).
    if (auto c = write->commit(); !c) return c.error();
    if (auto r = (*gpuSpace)->remove("scatter-target", 0); !r) return r.error();
    auto check = (*hostSpace)->lookup(scatterTokens);
    if (!check) return check.error();
    if (check->matchedTokens() != tokens) {
      return makeError(ErrorCode::kInternal, "scattered prefix matched ", check->matchedTokens());
    }
    std::vector<uint8_t> back(kv.size());
    if (auto s = check->copyTo(0, tokens, back.data(), back.size()); !s) return s;
    if (back != kv) return makeError(ErrorCode::kInternal, "scattered bytes differ");
    auto stats = (*gpuClient)->stats();
    if (stats && stats->gpuPromoted == 0) {
      return makeError(ErrorCode::kInternal, "no block was promoted to the GPU");
    }
    return {};
  }();
  cleanup();
  return result;
}
#endif

Status runGpuSuite(const Options& options) {
  const auto report = newReport;
  std::vector<RatioReport> reports = {
      report("gather_vs_d2d", "Space::gatherTo 64 MiB into a paged cache", "cudaMemcpy D2D 64 MiB",
             "bytes/s", true, 0.8),
      report("scatter_vs_d2d", "Space::scatterTo 64 MiB from a paged cache",
             "cudaMemcpy D2D 64 MiB", "bytes/s", true, 0.8),
      report("promote_vs_h2d", "lookup promoting 64 MiB host->GPU pool",
             "pinned cudaMemcpy H2D 64 MiB", "bytes/s", true, 0.8)};
  std::string daemonVersion;
#ifdef KVTIER_HAVE_CUDA
  if (const std::string why = kernels::gpu::noDeviceReason(); !why.empty()) {
    for (auto& r : reports) r.skipped = why;
  } else if (auto s = runGpuMeasurements(options, reports, daemonVersion); !s) {
    return s;
  }
#else
  for (auto& r : reports) r.skipped = "kvtier-bench was built without CUDA";
#endif
  if (!reports[0].skipped.empty()) {
    std::fprintf(stderr, "kvtier-bench: GPU suite skipped: %s\n", reports[0].skipped.c_str());
  }
  printTable("gpu", reports, options.reps);
  if (!options.json.empty()) {
    RunInfo info{"gpu",
                 options.reps,
                 threadingName(options.threading),
                 {{"kvtierd", daemonVersion.empty() ? "null" : jsonString(daemonVersion)}},
                 {},
                 options.busyPollMicros};
    if (auto s = writeFile(options.json, toJson(reports, Breakdown{}, info)); !s) return s;
    std::printf("\nwrote %s\n", options.json.c_str());
  }
  return {};
}

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) {
  // A server that dies mid-write must show up as an error, not kill the bench.
  ::signal(SIGPIPE, SIG_IGN);
  struct sigaction interrupt {};
  interrupt.sa_handler = kvtier::onInterrupt;
  interrupt.sa_flags = SA_RESTART;
  sigemptyset(&interrupt.sa_mask);
  ::sigaction(SIGINT, &interrupt, nullptr);
  ::sigaction(SIGTERM, &interrupt, nullptr);
  auto options = kvtier::parseArgs(argc, argv);
  if (!options) {
    std::fprintf(stderr, "kvtier-bench: %s\n%s", options.error().message().c_str(), kvtier::kUsage);
    return 2;
  }
  if (options->reps < 5) std::fprintf(stderr, "kvtier-bench: note: fewer than 5 repetitions\n");
  // Caught (not left to std::terminate) so that the stack unwinds and every server a suite
  // started is stopped and its directory removed.
  auto status = [&]() -> kvtier::Status {
    try {
      return options->suite == "cold"      ? kvtier::runColdSuite(*options)
             : options->suite == "gpu"     ? kvtier::runGpuSuite(*options)
             : options->suite == "cluster" ? kvtier::runClusterSuite(*options)
                                           : kvtier::runLocalSuite(*options);
    } catch (const std::exception& e) {
      return kvtier::makeError(kvtier::ErrorCode::kInternal, "exception: ", e.what());
    }
  }();
  if (!status) {
    std::fprintf(stderr, "kvtier-bench: %s\n", status.error().toString().c_str());
    return 1;
  }
  return 0;
}
