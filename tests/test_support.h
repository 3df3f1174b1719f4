// Support for integration tests: a real kvtierd process per test, peer client processes, and the
// small layout the tests share with the peer executable.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/client.h"
#include "kvtier/layout.h"

namespace kvtier::test {

// 4 layers, 2 KV heads, head dim 32, fp16, 16 tokens per block: 1 KiB per token, 16 KiB blocks.
inline Layout testLayout() { return Layout{"test/tiny", 4, 2, 32, DType::kFloat16, 16, {}}; }

// A kvtierd started in a fresh temporary data directory; stopped (SIGTERM) by the destructor.
class DaemonProcess {
 public:
  // The cold tier and GPU pools are off unless `extraArgs` turn them on ("--cold-tier", "on",
  // "--gpus", "0", ...). So are huge pages ("--huge-pages", "auto"|"on"): what a test sees does
  // not depend on the machine's free huge pages, and no test's daemon takes pages that another
  // test reserved for its own (tests/huge_page_reservation.h).
  explicit DaemonProcess(uint64_t hostPoolBytes = 64 << 20, std::string dataDir = "",
                         std::vector<std::string> extraArgs = {});
  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  const std::string& socket() const { return socket_; }
  const std::string& dataDir() const { return dataDir_; }
  const std::string& segmentPrefix() const { return segmentPrefix_; }
  const std::string& metricsAddr() const { return metricsAddr_; }  // "off" unless asked for
  const std::string& peerAddr() const { return peerAddr_; }  // HOST:PORT, "off" outside a cluster
  const std::string& nodeId() const { return nodeId_; }      // "-" outside a cluster
  pid_t pid() const { return pid_; }
  // The line the daemon printed when it became ready ("kvtierd ready socket=... pool_pages=...").
  const std::string& readyLine() const { return readyLine_; }
  // Sends `signal` and waits; returns the wait status. The daemon is gone afterwards.
  int stop(int signal);

  std::unique_ptr<Client> connect(bool mapPool = true) const;

 private:
  std::string dataDir_, socket_, segmentPrefix_, metricsAddr_, peerAddr_, nodeId_, readyLine_;
  pid_t pid_ = -1;
};

// Starts a kvtierd as DaemonProcess does, for a test that expects it not to start: waits for it to
// exit and returns its exit code, with everything it wrote (stdout and stderr) in `output`. If it
// becomes ready after all, it is stopped and the answer is -1.
int runDaemonExpectingFailure(uint64_t hostPoolBytes, const std::vector<std::string>& extraArgs,
                              std::string* output);

// A peer process (tests/test_peer.cc) with stdout piped back to the test.
class PeerProcess {
 public:
  // `withStderr`: output() has the program's standard error too.
  explicit PeerProcess(const std::vector<std::string>& args, std::string program = "",
                       bool withStderr = false);
  ~PeerProcess();
  // Reads stdout until a line starting with `prefix` (bounded by a deadline); returns the line.
  std::string waitForLine(const std::string& prefix);
  // Waits for exit; returns the exit code (or 128 + signal).
  int wait();
  void kill(int signal);
  pid_t pid() const { return pid_; }
  // Everything read from stdout so far.
  const std::string& output() const { return output_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  bool reaped_ = false;
  std::string output_;
};

// Runs a peer to completion and returns its exit code.
int runPeer(const std::vector<std::string>& args, std::string* output = nullptr);
// Runs the `kvtier` command-line tool to completion and returns its exit code.
int runTool(const std::vector<std::string>& args, std::string* output = nullptr,
            bool withStderr = false);

// Names of /dev/shm entries starting with `prefix`.
std::vector<std::string> shmSegments(const std::string& prefix);

// Polls `client.stats()` until pred(stats) holds or 10 s pass; returns the last stats.
template <typename Pred>
Stats waitForStats(Client& client, Pred pred);

std::string peerPath();

// A plain HTTP/1.1 GET to HOST:PORT (a daemon's metrics address); the whole response, "" when
// nothing answers.
std::string httpGet(const std::string& addr, const std::string& path);

}  // namespace kvtier::test

#include "tests/test_support_inl.h"
