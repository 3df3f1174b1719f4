// What the llama.cpp integration's end-to-end tests share: a real kvtierd, worker processes
// (kvtier_llama_worker) each running the real llama.cpp, and the logits they write compared bit
// for bit.
#pragma once

#include <sys/mman.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "tests/temp_dir.h"
#include "tests/test_support.h"

namespace kvtier::llama {

class WorkerTest : public ::testing::Test {
 protected:
  explicit WorkerTest(uint64_t poolBytes = 256 << 20, std::vector<std::string> daemonArgs = {})
      : daemon_(std::make_unique<test::DaemonProcess>(poolBytes, "", std::move(daemonArgs))) {}

  // A daemon a test killed could not remove its pool segments: they go here.
  void TearDown() override { stopDaemon(SIGTERM); }
  void stopDaemon(int signal) {
    if (!daemon_) return;
    daemon_->stop(signal);
    for (const auto& name : test::shmSegments(daemon_->segmentPrefix())) {
      ::shm_unlink(("/" + name).c_str());
    }
  }

  struct Run {
    int code = -1;
    std::string out;
  };
  // Runs a worker to its end: MODE --model M --socket S --logits DIR/NAME, then `extra`.
  Run worker(const std::string& mode, const std::string& modelPath, const std::string& logitsName,
             std::vector<std::string> extra) {
    std::vector<std::string> args = {
        mode, modelPath, "--socket", daemon_->socket(), "--logits", dir_.file(logitsName)};
    args.insert(args.begin() + 1, "--model");
    args.insert(args.end(), extra.begin(), extra.end());
    test::PeerProcess p(args, KVTIER_LLAMA_WORKER_PATH);
    Run r;
    r.code = p.wait();
    r.out = p.output();
    return r;
  }

  std::vector<float> logits(const std::string& name) {
    std::ifstream in(dir_.file(name), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    std::vector<float> out(bytes.size() / sizeof(float));
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
    return out;
  }

  // Bit-for-bit equal, with the largest difference in the message when not.
  void expectSameLogits(const std::string& a, const std::string& b) {
    auto x = logits(a), y = logits(b);
    ASSERT_FALSE(x.empty());
    ASSERT_EQ(x.size(), y.size());
    float worst = 0;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]));
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0)
        << a << " and " << b << " differ by up to " << worst;
  }

  static bool has(const std::string& out, const std::string& line) {
    return out.find(line + "\n") != std::string::npos;
  }

  std::unique_ptr<test::DaemonProcess> daemon_;
  test::TempDir dir_;
};

}  // namespace kvtier::llama
