#include "tests/test_support.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "tests/temp_dir.h"

extern char** environ;

namespace kvtier::test {
namespace {

// Spawns argv with stdout on a pipe (returned in *out) and stderr inherited (or on the same pipe:
// `withStderr`). The child gets `deathSignal` when the thread that spawned it dies
// (PR_SET_PDEATHSIG): a test that crashes or is killed by ctest's timeout leaves no process
// behind.
pid_t spawnPiped(const std::vector<std::string>& args, int* out, int deathSignal,
                 bool withStderr = false) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  // exec's errno comes back on this pipe; it closes on a successful exec.
  int errs[2];
  if (pipe2(errs, O_CLOEXEC) != 0) {
    close(fds[0]);
    close(fds[1]);
    throw std::runtime_error("pipe2 failed");
  }
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Child: only async-signal-safe calls from here on.
    prctl(PR_SET_PDEATHSIG, deathSignal);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    dup2(fds[1], STDOUT_FILENO);
    if (withStderr) dup2(fds[1], STDERR_FILENO);
    execve(argv[0], argv.data(), environ);
    const int err = errno;
    (void)!write(errs[1], &err, sizeof err);
    _exit(127);
  }
  close(fds[1]);
  close(errs[1]);
  int err = 0;
  ssize_t n;
  while ((n = read(errs[0], &err, sizeof err)) < 0 && errno == EINTR) {
  }
  close(errs[0]);
  if (pid < 0 || n > 0) {
    close(fds[0]);
    if (pid > 0) waitpid(pid, nullptr, 0);
    throw std::runtime_error("cannot spawn " + args[0] + ": " +
                             std::strerror(pid < 0 ? errno : err));
  }
  *out = fds[0];
  return pid;
}

// Reads from fd into `buffer` until it holds a complete line starting with `prefix`, and returns
// that line; "" on end of file or after 20 s.
std::string readLine(int fd, std::string& buffer, const std::string& prefix) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (true) {
    for (size_t start = 0, nl; (nl = buffer.find('\n', start)) != std::string::npos;
         start = nl + 1) {
      if (buffer.compare(start, prefix.size(), prefix) == 0)
        return buffer.substr(start, nl - start);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return "";
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return "";
    char chunk[4096];
    const ssize_t n = read(fd, chunk, sizeof chunk);
    if (n <= 0) return "";
    buffer.append(chunk, static_cast<size_t>(n));
  }
}

// The data directories DaemonProcess made itself: a later daemon of the same test may reuse one
// (a restart), so they are removed when the test binary exits, not with their first daemon.
struct MadeDirs {
  std::vector<std::string> paths;
  ~MadeDirs() {
    for (const auto& p : paths) {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  }
};
MadeDirs& madeDirs() {
  static MadeDirs dirs;
  return dirs;
}

int exitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

// A plain HTTP/1.1 GET over a TCP socket to the daemon's metrics address; the whole response.
std::string httpGet(const std::string& addr, const std::string& path) {
  const size_t colon = addr.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
  inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) return "";
  // Read the headers, then exactly Content-Length bytes (the server may keep the connection open).
  std::string out;
  char buf[4096];
  size_t want = std::string::npos;
  while (want == std::string::npos || out.size() < want) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    const size_t end = out.find("\r\n\r\n");
    const size_t cl = out.find("Content-Length: ");
    if (want == std::string::npos && end != std::string::npos && cl != std::string::npos) {
      want = end + 4 + std::stoul(out.substr(cl + 16));
    }
  }
  close(fd);
  return out;
}

std::string peerPath() { return KVTIER_PEER_PATH; }

namespace {

// A test daemon's command line: its data directory and pool, no cold tier, no GPU, and a pool on
// 4 KiB pages unless `extraArgs` say otherwise (never the huge pages another test reserved).
// KVTIER_TEST_KVTIERD names another kvtierd binary (scripts that loop a test for a long time run
// a private copy, so that a rebuild meanwhile does not pull it from under them).
std::vector<std::string> daemonArgs(const std::string& dataDir, uint64_t hostPoolBytes,
                                    const std::vector<std::string>& extraArgs) {
  const char* binary = std::getenv("KVTIER_TEST_KVTIERD");
  std::vector<std::string> args = {binary && *binary ? binary : KVTIER_DAEMON_PATH,
                                   "--data-dir",        dataDir,
                                   "--host-pool-bytes", std::to_string(hostPoolBytes),
                                   "--cold-tier",       "off",
                                   "--gpus",            "none"};
  if (std::find(extraArgs.begin(), extraArgs.end(), "--huge-pages") == extraArgs.end()) {
    args.insert(args.end(), {"--huge-pages", "off"});
  }
  args.insert(args.end(), extraArgs.begin(), extraArgs.end());
  return args;
}

}  // namespace

DaemonProcess::DaemonProcess(uint64_t hostPoolBytes, std::string dataDir,
                             std::vector<std::string> extraArgs) {
  if (dataDir.empty()) {
    dataDir = makeTestDir();
    madeDirs().paths.push_back(dataDir);
  }
  dataDir_ = dataDir;
  socket_ = dataDir_ + "/kvtierd.sock";
  int out = -1;
  const std::vector<std::string> args = daemonArgs(dataDir_, hostPoolBytes, extraArgs);
  // SIGTERM: a daemon whose test died still removes its socket and segments.
  pid_ = spawnPiped(args, &out, SIGTERM);
  std::string buffer;
  const std::string line = readLine(out, buffer, "kvtierd ready");
  close(out);
  if (line.empty()) {
    stop(SIGKILL);
    throw std::runtime_error("kvtierd did not become ready");
  }
  readyLine_ = line;
  segmentPrefix_ = line.substr(line.find("segments=") + 9);
  segmentPrefix_ = segmentPrefix_.substr(0, segmentPrefix_.find(' '));
  const auto field = [&line](const std::string& name) {
    const size_t at = line.find(" " + name + "=");
    if (at == std::string::npos) return std::string();
    const size_t from = at + name.size() + 2;
    return line.substr(from, line.find(' ', from) - from);
  };
  metricsAddr_ = field("metrics");
  peerAddr_ = field("peer");
  nodeId_ = field("node");
}

int runDaemonExpectingFailure(uint64_t hostPoolBytes, const std::vector<std::string>& extraArgs,
                              std::string* output) {
  const std::string dataDir = makeTestDir();
  madeDirs().paths.push_back(dataDir);
  const std::vector<std::string> args = daemonArgs(dataDir, hostPoolBytes, extraArgs);
  int out = -1;
  const pid_t pid = spawnPiped(args, &out, SIGTERM, /*withStderr=*/true);
  std::string buffer;
  // Returns at the ready line, at end of file (the daemon exited) or after 20 s.
  const bool ready = !readLine(out, buffer, "kvtierd ready").empty();
  // Stopped if it became ready; killed if it hung (a daemon that exited is a zombie: no effect).
  ::kill(pid, ready ? SIGTERM : SIGKILL);
  char chunk[4096];
  ssize_t n;
  while ((n = read(out, chunk, sizeof chunk)) > 0) buffer.append(chunk, static_cast<size_t>(n));
  close(out);
  int status = 0;
  waitpid(pid, &status, 0);
  if (output) *output = buffer;
  return ready ? -1 : exitCode(status);
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) stop(SIGTERM);
}

int DaemonProcess::stop(int signal) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, signal);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

std::unique_ptr<Client> DaemonProcess::connect(bool mapPool) const {
  auto client = Client::connect({.socketPath = socket_, .clientName = "test", .mapPool = mapPool});
  if (!client) throw std::runtime_error("connect failed: " + client.error().toString());
  return std::move(client).value();
}

PeerProcess::PeerProcess(const std::vector<std::string>& args, std::string program,
                         bool withStderr) {
  std::vector<std::string> full = {program.empty() ? peerPath() : program};
  full.insert(full.end(), args.begin(), args.end());
  pid_ = spawnPiped(full, &out_, SIGKILL, withStderr);
}

PeerProcess::~PeerProcess() {
  if (!reaped_) {
    ::kill(pid_, SIGKILL);
    wait();
  }
  if (out_ >= 0) close(out_);
}

std::string PeerProcess::waitForLine(const std::string& prefix) {
  return readLine(out_, output_, prefix);
}

int PeerProcess::wait() {
  if (reaped_) return -1;
  // Drain stdout so the peer never blocks on a full pipe.
  char chunk[4096];
  ssize_t n;
  while ((n = read(out_, chunk, sizeof chunk)) > 0) output_.append(chunk, static_cast<size_t>(n));
  int status = 0;
  waitpid(pid_, &status, 0);
  reaped_ = true;
  return exitCode(status);
}

void PeerProcess::kill(int signal) { ::kill(pid_, signal); }

int runPeer(const std::vector<std::string>& args, std::string* output) {
  PeerProcess peer(args);
  const int rc = peer.wait();
  if (output) *output = peer.output();
  return rc;
}

int runTool(const std::vector<std::string>& args, std::string* output, bool withStderr) {
  PeerProcess tool(args, KVTIER_TOOL_PATH, withStderr);
  const int rc = tool.wait();
  if (output) *output = tool.output();
  return rc;
}

std::vector<std::string> shmSegments(const std::string& prefix) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  return names;
}

}  // namespace kvtier::test
