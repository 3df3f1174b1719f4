// A real single-node etcd for tests: free loopback ports, a temporary data dir, killed and
// cleaned up by the destructor (also when a test fails). Standard library and POSIX only, so
// unit and integration tests can both use it.
//
//   if (!kvtier::test::EtcdProcess::available()) GTEST_SKIP() << "no " << kEtcdBinary;
//   kvtier::test::EtcdProcess etcd;         // started and healthy, or std::runtime_error
//   connect(etcd.endpoint());               // "http://127.0.0.1:PORT"
//   etcd.stop(); etcd.restart();            // same ports, same data
//
// Not thread-safe; use it from one thread. The child dies with the thread that started it
// (PR_SET_PDEATHSIG), so a crashed test leaves no etcd behind.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/temp_dir.h"

namespace kvtier::test {

inline constexpr const char* kEtcdBinary = "/usr/bin/etcd";

// A TCP port on 127.0.0.1 that is free right now, for test processes to listen on: picked at
// random below the kernel's ephemeral range, so that no port the kernel hands out on its own
// (outgoing connections, listeners on port 0 such as every daemon's UCX listener) can take it
// between this check and the test's own listen.
inline uint16_t freePort() {
  int ephemeralLow = 32768;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) range >> ephemeralLow;
  static std::mt19937 rng{std::random_device{}()};
  const bool below = ephemeralLow > 11000;
  std::uniform_int_distribution<int> pick(10000, below ? ephemeralLow - 1 : 10000);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error("socket failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(below ? static_cast<uint16_t>(pick(rng)) : 0);  // else: any
    socklen_t len = sizeof(addr);
    const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                       ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
    ::close(fd);
    if (bound) return ntohs(addr.sin_port);
  }
  throw std::runtime_error("no free port to bind");
}

class EtcdProcess {
 public:
  // How long start() and restart() wait for /health to say true.
  static constexpr std::chrono::seconds kReadyTimeout{15};
  // How long stop() waits after SIGTERM before SIGKILL.
  static constexpr std::chrono::seconds kStopTimeout{5};

  static bool available(const std::string& binary = kEtcdBinary) {
    return ::access(binary.c_str(), X_OK) == 0;
  }

  explicit EtcdProcess(std::string binary = kEtcdBinary) : binary_(std::move(binary)) {
    root_ = makeTestDir("kvtier-etcd-");
    try {
      clientPort_ = freePort();
      peerPort_ = freePort();
      while (peerPort_ == clientPort_) peerPort_ = freePort();
      endpoint_ = "http://127.0.0.1:" + std::to_string(clientPort_);
      start();
    } catch (...) {
      cleanup();
      throw;
    }
  }

  ~EtcdProcess() { cleanup(); }
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  uint16_t clientPort() const { return clientPort_; }
  std::string dataDir() const { return root_ + "/data"; }
  std::string logFile() const { return root_ + "/etcd.log"; }
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // SIGTERM, then SIGKILL after kStopTimeout; reaps the child. No-op when stopped.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + kStopTimeout;
    for (;;) {
      const pid_t done = ::waitpid(pid_, nullptr, WNOHANG);
      if (done == pid_ || (done < 0 && errno != EINTR)) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(pid_, SIGKILL);
        while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
  }

  // Starts etcd again on the same ports and data dir; waits until it is healthy.
  void restart() {
    stop();
    start();
  }

  // Last bytes of etcd's log, for failure messages.
  std::string logTail(size_t bytes = 4000) const {
    std::ifstream in(logFile());
    std::stringstream all;
    all << in.rdbuf();
    std::string text = all.str();
    return text.size() > bytes ? text.substr(text.size() - bytes) : text;
  }

 private:
  void start() {
    const std::string client = "http://127.0.0.1:" + std::to_string(clientPort_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peerPort_);
    std::vector<std::string> args = {binary_,
                                     "--name=kvtier-test",
                                     "--data-dir=" + dataDir(),
                                     "--listen-client-urls=" + client,
                                     "--advertise-client-urls=" + client,
                                     "--listen-peer-urls=" + peer,
                                     "--initial-advertise-peer-urls=" + peer,
                                     "--initial-cluster=kvtier-test=" + peer,
                                     "--initial-cluster-state=new"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);

    const int log = ::open(logFile().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log < 0) throw std::runtime_error("cannot open " + logFile());
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      ::close(log);
      throw std::runtime_error("fork failed");
    }
    if (pid == 0) {
      // Child: only async-signal-safe calls from here on.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(log, STDOUT_FILENO);
      ::dup2(log, STDERR_FILENO);
      const int null = ::open("/dev/null", O_RDONLY);
      if (null >= 0) ::dup2(null, STDIN_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(log);
    pid_ = pid;
    waitReady();
  }

  // Polls GET /health until {"health":"true"}, failing fast if etcd exits.
  void waitReady() {
    const auto deadline = std::chrono::steady_clock::now() + kReadyTimeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("etcd exited during startup; log:\n" + logTail());
      }
      if (healthy()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    stop();
    throw std::runtime_error("etcd not healthy within " + std::to_string(kReadyTimeout.count()) +
                             " s; log:\n" + logTail());
  }

  bool healthy() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    timeval timeout{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(clientPort_);
    std::string answer;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      const std::string request =
          "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
      if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size())) {
        char buffer[1024];
        // /health answers a few hundred bytes; 64 KiB is a generous bound.
        for (ssize_t n; answer.size() < 65536 && (n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0;) {
          answer.append(buffer, static_cast<size_t>(n));
        }
      }
    }
    ::close(fd);
    return answer.find("\"health\":\"true\"") != std::string::npos;
  }

  void cleanup() {
    stop();
    if (!root_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(root_, ignored);
      root_.clear();
    }
  }

  std::string binary_;
  std::string root_;  // holds data/ and etcd.log
  std::string endpoint_;
  uint16_t clientPort_ = 0;
  uint16_t peerPort_ = 0;
  pid_t pid_ = -1;
};

}  // namespace kvtier::test
