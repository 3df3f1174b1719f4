// kvtier-bench's shared harness (see harness.h).
#include "bench/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tools/json_string.h"

extern char** environ;

namespace kvtier::bench {

volatile std::sig_atomic_t gInterrupted = 0;

double seconds(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double>(t1 - t0).count();
}

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string lastLines(const std::string& path, size_t maxBytes) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.size() > maxBytes ? "..." + text.substr(text.size() - maxBytes) : text;
}

Layout benchLayout() { return Layout{"bench/256k", 8, 8, 64, DType::kFloat16, 16, {}}; }

// ---------------------------------------------------------------------------------------------
// Processes and directories.

Result<TempDir> TempDir::create() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base && *base ? base : "/tmp") + "/kvtier-bench-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    return unavailable("cannot create a temporary directory from ", pattern, ": ",
                       std::strerror(errno));
  }
  return TempDir(pattern);
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

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

Result<ChildProcess> ChildProcess::spawn(const std::vector<std::string>& argv,
                                         const std::string& logPath, bool pipeStdout,
                                         const std::optional<std::vector<std::string>>& env) {
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

ChildProcess::~ChildProcess() {
  stop();
  if (stdout_ >= 0) ::close(stdout_);
}

Result<std::string> ChildProcess::waitForLine(std::string_view prefix,
                                              std::chrono::milliseconds timeout) {
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

std::optional<int> ChildProcess::poll() {
  if (pid_ < 0) return exitStatus_;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) != pid_) return std::nullopt;
  pid_ = -1;
  exitStatus_ = status;
  return exitStatus_;
}

bool ChildProcess::waitExit(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!poll()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

void ChildProcess::stop(std::chrono::milliseconds timeout) {
  if (pid_ < 0 || poll()) return;
  const pid_t pid = pid_;
  ::kill(pid_, SIGTERM);
  if (waitExit(timeout)) {
    // A clean stop is exit 0: anything else is worth a line (and the log says why).
    const int status = *exitStatus_;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "kvtier-bench: pid %d stopped with %s %d; the end of its log:\n", pid,
                   WIFSIGNALED(status) ? "signal" : "exit status",
                   WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
      std::ifstream in(log_);
      std::deque<std::string> tail;
      for (std::string line; std::getline(in, line);) {
        tail.push_back(line);
        if (tail.size() > 8) tail.pop_front();
      }
      for (const auto& line : tail) std::fprintf(stderr, "  %s\n", line.c_str());
    }
    return;
  }
  std::fprintf(stderr, "kvtier-bench: pid %d ignored SIGTERM for %.1f s, killing it\n", pid_,
               std::chrono::duration<double>(timeout).count());
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

SegmentSweeper::~SegmentSweeper() {
  if (prefix_.empty()) return;
  std::error_code ec;
  size_t removed = 0;
  std::string names;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(prefix_) && std::filesystem::remove(entry.path(), ec)) {
      ++removed;
      names += " " + name;
    }
  }
  if (removed > 0) {
    std::fprintf(stderr, "kvtier-bench: removed %zu shared-memory segment(s) kvtierd left:%s\n",
                 removed, names.c_str());
  }
}

void SegmentSweeper::watchReadyLine(std::string_view line) {
  constexpr std::string_view kField = " segments=";
  const size_t at = line.find(kField);
  if (at == std::string_view::npos) return;
  const std::string_view value = line.substr(at + kField.size());
  const std::string prefix(value.substr(0, value.find(' ')));
  // Only names kvtierd makes, and never an empty or bare prefix that would match others'.
  if (prefix.starts_with("kvtier-") && prefix.size() > 8 && prefix.find('/') == std::string::npos) {
    prefix_ = prefix;
  }
}

Status BenchDaemon::start(const std::string& exe, const TempDir& dir, const std::string& socket,
                          const std::vector<std::string>& flags,
                          const std::optional<std::vector<std::string>>& env,
                          std::chrono::milliseconds timeout) {
  process_.reset();
  std::vector<std::string> argv = {exe, "--data-dir", dir.path(), "--socket", socket};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto child = ChildProcess::spawn(argv, dir.file("kvtierd.log"), true, env);
  if (!child) return child.error();
  process_.emplace(std::move(child).value());
  auto ready = process_->waitForLine("kvtierd ready", timeout);
  if (!ready) {
    return unavailable(exe, ": ", ready.error().message(), "; its log:\n",
                       lastLines(process_->logPath()));
  }
  sweeper_.watchReadyLine(*ready);
  return {};
}

namespace {

// Two ends of one TCP connection over 127.0.0.1 (a listener on an ephemeral port, gone after).
Status loopbackTcpPair(int fds[2]) {
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
ssize_t readPolling(int fd, uint8_t* p, size_t n, std::chrono::microseconds window) {
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

bool writeAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// The echo peer's child: only async-signal-safe calls, then _exit.
[[noreturn]] void echoLoop(int fd, std::chrono::microseconds busyPoll) {
  uint8_t buf[4096];
  for (;;) {
    const ssize_t n = readPolling(fd, buf, sizeof buf, busyPoll);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || !writeAll(fd, buf, static_cast<size_t>(n))) ::_exit(0);
  }
}

}  // namespace

Result<EchoPeer> EchoPeer::start(std::chrono::microseconds busyPoll, bool tcp) {
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

EchoPeer::~EchoPeer() {
  if (fd_ >= 0) ::close(fd_);  // the child reads end-of-file and exits
  if (pid_ > 0) {
    // A child forked later holds a copy of this socket, so end-of-file may not come: stop it.
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

bool EchoPeer::pingPong(uint8_t* buf, size_t bytes) {
  if (!writeAll(fd_, buf, bytes)) return false;
  for (size_t got = 0; got < bytes;) {
    const ssize_t n = readPolling(fd_, buf + got, bytes - got, busyPoll_);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

Result<std::unique_ptr<RedisServer>> RedisServer::start(const std::string& exe,
                                                        const TempDir& dir) {
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

RedisServer::~RedisServer() {
  if (context_) {
    // The server closes the connection instead of answering.
    freeReplyObject(redisCommand(context_.get(), "SHUTDOWN NOSAVE"));
    context_.reset();
    child_.waitExit(kStopTimeout);
  }
  // child_'s destructor sends SIGTERM if it still runs.
}

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

std::string versionOf(const std::vector<std::string>& argv, std::string_view prefix) {
  auto dir = TempDir::create();
  if (!dir) return "unknown";
  auto child = ChildProcess::spawn(argv, dir->file("version.log"), true);
  if (!child) return "unknown";
  auto line = child->waitForLine(prefix, std::chrono::seconds(10));
  return line ? line->substr(prefix.size()) : "unknown";
}

// ---------------------------------------------------------------------------------------------
// Measuring.

HostBuffer::HostBuffer(size_t bytes) : bytes_(bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  data_.reset(static_cast<uint8_t*>(std::aligned_alloc(page, (bytes + page - 1) / page * page)));
  if (!data_) throw std::bad_alloc();
  std::memset(data_.get(), 0, bytes_);
}

void HostBuffer::Free::operator()(uint8_t* p) const { std::free(p); }

namespace {

volatile uint64_t gFlushSink;  // the sum CacheFlusher::flush reads, so that its loads stay

size_t flushBytes() {
  const long llc = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::max<size_t>(size_t{64} << 20, llc > 0 ? 2 * static_cast<size_t>(llc) : 0);
}

}  // namespace

CacheFlusher::CacheFlusher() : buffer_(flushBytes()) {}

void CacheFlusher::flush() {
  // One word of each line read: the lines come in clean, so none is written back during the call
  // that follows.
  uint64_t sum = 0;
  for (size_t i = 0; i < buffer_.size(); i += 64) {
    uint64_t word;
    std::memcpy(&word, buffer_.data() + i, sizeof(word));
    sum += word;
  }
  gFlushSink = sum;
}

Status expectMatched(const ReadHandle& hit, uint64_t tokens) {
  if (hit.matchedTokens() == tokens) return {};
  return makeError(ErrorCode::kInternal, "lookup matched ", hit.matchedTokens(),
                   " tokens, expected ", tokens, " (was the prefix evicted?)");
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

Status waitForStats(Client& client, const std::function<bool(const Stats&)>& done,
                    const std::string& what) {
  const auto deadline = Clock::now() + kStatsWaitTimeout;
  for (;;) {
    auto stats = client.stats();
    if (!stats) return stats.error();
    if (done(*stats)) return {};
    if (gInterrupted) return unavailable("interrupted");
    if (Clock::now() >= deadline) return unavailable("timed out waiting for ", what);
    std::this_thread::sleep_for(kStatsPollInterval);
  }
}

double medianOf(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double upper = v[mid];
  return (upper + *std::max_element(v.begin(), v.begin() + mid)) / 2;
}

Spread spreadOf(const std::vector<double>& v) {
  if (v.empty()) return {};
  return {medianOf(v), *std::min_element(v.begin(), v.end()),
          *std::max_element(v.begin(), v.end())};
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p * double(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

// ---------------------------------------------------------------------------------------------
// Reporting.

std::vector<double> RatioReport::ratios() const {
  std::vector<double> r;
  for (size_t i = 0; i < kvtier.perRep.size() && i < anchor.perRep.size(); ++i) {
    r.push_back(kvtier.perRep[i] / anchor.perRep[i]);
  }
  return r;
}

bool RatioReport::pass() const {
  const double m = spreadOf(ratios()).median;
  return measured() && target && (higherIsBetter ? m >= *target : m <= *target);
}

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
  } else if (unit == "tokens/s") {
    std::snprintf(buf, sizeof buf, "%.1f M tokens/s", value / 1e6);
  } else if (unit == "count") {
    std::snprintf(buf, sizeof buf, "%.0f", value);
  } else if (unit == "1/s") {
    // A rate that is one over a time (so that a ratio of two is a speedup): shown as the time.
    std::snprintf(buf, sizeof buf, "%.1f ms", 1e3 / value);
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

void printChecks(const NamedSeries& series, int nameWidth) {
  for (const auto& [name, v] : series) {
    const Spread s = spreadOf(v);
    std::printf("  %-*s %10.3f  [%.3f-%.3f]\n", nameWidth, name.c_str(), s.median, s.min, s.max);
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

std::string jsonSpreadOf(const std::vector<double>& v) {
  const Spread s = spreadOf(v);
  return "{\"median\": " + jsonNumber(s.median) + ", \"min\": " + jsonNumber(s.min) +
         ", \"max\": " + jsonNumber(s.max) + ", \"per_rep\": " + jsonArray(v) + "}";
}

std::string jsonSeriesMember(const std::string& name, const NamedSeries& series) {
  std::string out = jsonString(name) + ": {";
  for (size_t i = 0; i < series.size(); ++i) {
    out += std::string(i ? ",\n    " : "\n    ") + jsonString(series[i].first) + ": " +
           jsonSpreadOf(series[i].second);
  }
  return out + "}";
}

namespace {

std::string jsonFigure(const Figure& f) {
  const Spread s = spreadOf(f.perRep);
  return "{\"what\": " + jsonString(f.what) + ", \"unit\": " + jsonString(f.unit) +
         ", \"median\": " + jsonNumber(s.median) + ", \"min\": " + jsonNumber(s.min) +
         ", \"max\": " + jsonNumber(s.max) + ", \"per_rep\": " + jsonArray(f.perRep) + "}";
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

}  // namespace

RunInfo runInfoOf(std::string suite, const Options& options,
                  std::vector<std::pair<std::string, std::string>> versions) {
  return RunInfo{std::move(suite),    options.reps, threadingName(options.threading),
                 std::move(versions), {},           options.busyPollMicros};
}

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

Status writeReport(const Options& options, const std::vector<RatioReport>& reports,
                   const Breakdown& breakdown, const RunInfo& info) {
  if (options.json.empty()) return {};
  if (auto s = writeFile(options.json, toJson(reports, breakdown, info)); !s) return s;
  std::printf("\nwrote %s\n", options.json.c_str());
  return {};
}

// ---------------------------------------------------------------------------------------------
// Options and clients.

std::vector<std::string> Options::daemonFlags(std::vector<std::string> flags) const {
  if (busyPollMicros) {
    flags.push_back("--busy-poll-us");
    flags.push_back(std::to_string(*busyPollMicros));
  }
  return flags;
}

Result<std::unique_ptr<Client>> startClient(const std::string& socket, const Options& options,
                                            ClientThreading threading, const std::string& name) {
  ClientOptions o{.socketPath = socket, .clientName = name, .threading = threading};
  if (options.busyPollMicros) o.busyPoll = std::chrono::microseconds(*options.busyPollMicros);
  return Client::connect(o);
}

const char* threadingName(ClientThreading t) {
  return t == ClientThreading::kOwnThread ? "own" : "caller";
}

}  // namespace kvtier::bench
