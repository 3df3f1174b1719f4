// What the cluster tests (tests/cluster_test.cc, cluster_faults_test.cc, cluster_copy_test.cc)
// share: N kvtierd daemons on loopback joined by static peers or by a real etcd, and prompts put on
// one node and looked up on another with their bytes compared.
#pragma once

#include <signal.h>
#include <sys/mman.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/etcd_process.h"
#include "tests/temp_dir.h"
#include "tests/test_support.h"
#include "tools/synthetic_kv.h"

namespace kvtier::test {

using Clock = std::chrono::steady_clock;

inline const std::string kToken = "kvtier-cluster-test-token-0123456789abcdef";

// Waits for `pred` with a deadline (the event itself, polled); returns whether it came.
inline bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (!pred()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// Sets an environment variable for the daemons started in its scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (value) ::setenv(name, value, 1);
  }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

struct NodeSpec {
  std::vector<std::string> extraArgs = {};
  std::string token = kToken;
  bool coldTier = false;
  uint64_t poolBytes = 64 << 20;
};

// N daemons on loopback, each listing the others (static membership) or registered in etcd.
class Cluster {
 public:
  // Starts the first `started` nodes (all by default); start(i) starts the others later.
  explicit Cluster(std::vector<NodeSpec> specs, const std::string& etcd = "",
                   size_t started = SIZE_MAX)
      : specs_(specs) {
    for (size_t i = 0; i < specs.size(); ++i) {
      ports_.push_back(freePort());
      dirs_.push_back(std::make_unique<TempDir>());
      tokenFiles_.push_back(dirs_.back()->file("token"));
      std::ofstream(tokenFiles_.back()) << specs[i].token;
    }
    etcd_ = etcd;
    for (size_t i = 0; i < specs.size() && i < started; ++i) start(i);
  }

  void start(size_t i) {
    std::vector<std::string> args = {"--listen",
                                     "127.0.0.1:" + std::to_string(ports_[i]),
                                     "--node-id",
                                     "n" + std::to_string(i),
                                     "--cluster-token-file",
                                     tokenFiles_[i],
                                     "--peer-timeout-ms",
                                     "1000",
                                     "--cold-tier",
                                     specs_[i].coldTier ? "on" : "off"};
    if (etcd_.empty()) {
      std::string peers;
      for (size_t j = 0; j < ports_.size(); ++j) {
        if (j == i) continue;
        peers += (peers.empty() ? "" : ",") + std::string("127.0.0.1:") + std::to_string(ports_[j]);
      }
      if (!peers.empty()) args.insert(args.end(), {"--peers", peers});
    } else {
      args.insert(args.end(), {"--etcd", etcd_, "--cluster", "test", "--etcd-lease-ttl", "2"});
    }
    args.insert(args.end(), specs_[i].extraArgs.begin(), specs_[i].extraArgs.end());
    if (daemons_.size() <= i) daemons_.resize(i + 1);
    daemons_[i] =
        std::make_unique<DaemonProcess>(specs_[i].poolBytes, dirs_[i]->path() + "/data", args);
  }

  // Every daemon stopped; segments of those that were killed removed.
  ~Cluster() {
    for (auto& d : daemons_) {
      if (!d) continue;
      const std::string prefix = d->segmentPrefix();
      d.reset();
      for (const auto& name : shmSegments(prefix)) ::shm_unlink(("/" + name).c_str());
    }
  }

  DaemonProcess& operator[](size_t i) { return *daemons_[i]; }
  size_t size() const { return daemons_.size(); }

  // Every node sees `n` live members.
  bool formed(size_t n, std::chrono::milliseconds limit = std::chrono::seconds(15)) {
    return eventually(
        [&] {
          for (auto& d : daemons_) {
            if (!d || d->pid() <= 0) continue;  // not started, or stopped
            if (d->connect()->stats().value().clusterMembersUp != n) return false;
          }
          return true;
        },
        limit);
  }

  // Node i has sent every key it holds to its home.
  bool published(size_t i) {
    auto client = daemons_[i]->connect();
    return eventually([&] { return client->stats().value().publishBacklog == 0; },
                      std::chrono::seconds(10));
  }

 private:
  std::vector<NodeSpec> specs_;
  std::vector<uint16_t> ports_;
  std::vector<std::unique_ptr<TempDir>> dirs_;
  std::vector<std::string> tokenFiles_;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
  std::string etcd_;
};

inline std::vector<NodeSpec> nodes(size_t n) { return std::vector<NodeSpec>(n); }

inline void putPrompt(DaemonProcess& d, const std::string& seq, uint64_t seed, size_t tokens) {
  const Layout layout = testLayout();
  auto client = d.connect();
  auto space = client->open(layout).value();
  const auto t = synthetic::tokens(seed, tokens);
  const auto kv = synthetic::packedKv(layout, t, 0, t.size());
  ASSERT_TRUE(space->put(seq, 0, t, kv.data(), kv.size()).ok());
}

struct Hit {
  uint64_t matched = 0;
  bool identical = false;
};

// Looks up tokens(seed, n) and compares the matched prefix with the KV that made them.
inline Hit lookupPrompt(Client& client, uint64_t seed, size_t tokens,
                        RemoteMode mode = RemoteMode::kFetch) {
  const Layout layout = testLayout();
  auto space = client.open(layout).value();
  const auto t = synthetic::tokens(seed, tokens);
  auto hit = space->lookup(t, LookupOptions{.remote = mode});
  EXPECT_TRUE(hit.ok()) << hit.error().toString();
  if (!hit) return {};
  Hit out{hit->matchedTokens(), false};
  std::vector<uint8_t> got(out.matched * layout.tokenKvBytes());
  EXPECT_TRUE(hit->copyTo(0, out.matched, got.data(), got.size()).ok());
  out.identical = got == synthetic::packedKv(layout, t, 0, out.matched);
  return out;
}

// Nothing pinned or held unsealed once every handle is released: every used block is a sealed,
// cached one.
inline void expectNoLeakedBlocks(DaemonProcess& d) {
  auto client = d.connect();
  const Stats s = waitForStats(*client, [](const Stats& s) {
    return s.blocksPinned == 0 && s.blocksUsed == s.blocksCached;
  });
  EXPECT_EQ(s.blocksPinned, 0u);
  EXPECT_EQ(s.blocksUsed, s.blocksCached);
  EXPECT_EQ(s.writeLeases, 0u);
}

}  // namespace kvtier::test
