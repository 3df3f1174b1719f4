// GPU pools across processes, with real kvtierd processes and GPU client processes
// (tests/gpu_peer.cc). Needs a GPU: without one every test skips and says why.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>

#include "kernels/gpu.h"
#include "tests/huge_page_reservation.h"
#include "tests/test_support.h"

namespace kvtier::test {
namespace {

#define SKIP_WITHOUT_GPU()                            \
  do {                                                \
    if (kernels::gpu::deviceCount() == 0) {           \
      GTEST_SKIP() << kernels::gpu::noDeviceReason(); \
    }                                                 \
  } while (0)

std::string gpuPeer() { return KVTIER_GPU_PEER_PATH; }

int runGpuPeer(const std::vector<std::string>& args, std::string* output) {
  PeerProcess p(args, gpuPeer());
  const int rc = p.wait();
  if (output) *output = p.output();
  return rc;
}

std::vector<std::string> gpuDaemonArgs(const std::string& poolBytes) {
  return {"--gpus", "0", "--gpu-pool-bytes", poolBytes};
}

// Process A scatters a prompt from its paged cache into the GPU pool through its IPC mapping and
// commits; process B maps the same pool and gathers identical bytes into its own paged cache.
TEST(GpuIntegration, BytesScatteredByOneProcessAreGatheredIdenticallyByAnother) {
  SKIP_WITHOUT_GPU();
  DaemonProcess daemon(64 << 20, "", gpuDaemonArgs("64M"));
  std::string out;
  ASSERT_EQ(runGpuPeer({"put-paged", daemon.socket(), "a", "11", "100"}, &out), 0) << out;
  EXPECT_NE(out.find("OK sealed=6 gpu_used=7"), std::string::npos) << out;
  ASSERT_EQ(runGpuPeer({"verify-paged", daemon.socket(), "11", "100", "96"}, &out), 0) << out;
  auto client = daemon.connect();
  const Stats s = client->stats().value();
  EXPECT_GE(s.gpuBlocksUsed, 6u) << "the blocks live in the GPU pool";
  EXPECT_EQ(s.blocksPinned, 0u);
}

// A GPU client SIGKILLed while it holds a read lease on GPU blocks and an uncommitted GPU write:
// the daemon releases both and frees the uncommitted blocks.
TEST(GpuIntegration, AKilledGpuClientLeaksNothing) {
  SKIP_WITHOUT_GPU();
  DaemonProcess daemon(64 << 20, "", gpuDaemonArgs("64M"));
  std::string out;
  ASSERT_EQ(runGpuPeer({"put-paged", daemon.socket(), "a", "5", "64"}, &out), 0) << out;
  auto client = daemon.connect();
  // The baseline once only this test's own session is left (the peer's close may lag its exit).
  const Stats before = waitForStats(*client, [](const Stats& s) { return s.clients == 1; });
  ASSERT_EQ(before.clients, 1u);
  PeerProcess holder({"hold-gpu", daemon.socket(), "5", "64"}, gpuPeer());
  ASSERT_EQ(holder.waitForLine("READY"), "READY 4");
  const Stats held = client->stats().value();
  EXPECT_GT(held.blocksPinned, 0u);
  EXPECT_GT(held.gpuBlocksUsed, before.gpuBlocksUsed) << "the uncommitted write holds GPU blocks";
  holder.kill(SIGKILL);
  const Stats after = waitForStats(*client, [&](const Stats& s) {
    return s.blocksPinned == 0 && s.writeLeases == 0 && s.gpuBlocksUsed == before.gpuBlocksUsed;
  });
  EXPECT_EQ(after.blocksPinned, 0u);
  EXPECT_EQ(after.writeLeases, 0u);
  EXPECT_EQ(after.gpuBlocksUsed, before.gpuBlocksUsed);
  ASSERT_EQ(runGpuPeer({"verify-paged", daemon.socket(), "5", "64", "64"}, &out), 0) << out;
}

// More prompts than the GPU pool holds: the oldest are demoted to the host pool, and a later
// lookup promotes them back; every prompt gathers identical bytes, from a GPU session and from a
// host session alike. `hostPoolArgs`: how the host pool is made (--huge-pages).
void demoteAndPromote(const std::vector<std::string>& hostPoolArgs) {
  // 2 MiB of GPU pool: 128 blocks of 16 KiB; 12 prompts of 16 blocks each do not fit.
  std::vector<std::string> args = gpuDaemonArgs("2M");
  args.insert(args.end(), hostPoolArgs.begin(), hostPoolArgs.end());
  DaemonProcess daemon(64 << 20, "", args);
  std::string out;
  for (int p = 0; p < 12; ++p) {
    ASSERT_EQ(runGpuPeer({"put-paged", daemon.socket(), "p" + std::to_string(p),
                          std::to_string(100 + p), "256"},
                         &out),
              0)
        << out;
  }
  auto client = daemon.connect();
  const Stats s = waitForStats(*client, [](const Stats& st) { return st.gpuDemoted > 0; });
  EXPECT_GT(s.gpuDemoted, 0u);
  EXPECT_LE(s.gpuBlocksUsed, s.gpuBlocksTotal);
  for (int p = 0; p < 12; ++p) {
    ASSERT_EQ(
        runGpuPeer({"verify-paged", daemon.socket(), std::to_string(100 + p), "256", "256"}, &out),
        0)
        << "prompt " << p << ": " << out;
  }
  EXPECT_GT(client->stats().value().gpuPromoted, 0u);
  // A host session reads the same prompts from the host pool.
  for (int p = 0; p < 12; p += 5) {
    ASSERT_EQ(
        runPeer({"verify", daemon.socket(), std::to_string(100 + p), "256", "256", "256"}, &out), 0)
        << "host read of prompt " << p << ": " << out;
  }
}

TEST(GpuIntegration, DemotionToHostAndPromotionBackKeepTheBytes) {
  SKIP_WITHOUT_GPU();
  demoteAndPromote({});
}

// The same with the host pool on 2 MiB hugetlb pages: the daemon registers it with
// cudaHostRegister for its moves, and GPU clients register their own mapping of it.
TEST(GpuIntegration, AHostPoolOnHugePagesStagesBlocksBothWays) {
  SKIP_WITHOUT_GPU();
  auto reservation = HugePageReservation::reserve(32);  // the 64 MiB host pool
  if (!reservation) GTEST_SKIP() << "cannot reserve 32 huge pages: " << reservation.error();
  demoteAndPromote({"--huge-pages", "on"});
}

// SIGTERM stops a daemon with GPU pools cleanly (exit 0: socket and segments removed) after GPU
// clients came and went. Before, the CUDA driver's threads, started before the daemon blocked
// the signal, took it with its default action and ended the process, leaving the host pool's
// segment behind.
TEST(GpuIntegration, SigtermStopsAGpuDaemonCleanly) {
  SKIP_WITHOUT_GPU();
  DaemonProcess daemon(64 << 20, "", gpuDaemonArgs("64M"));
  std::string out;
  ASSERT_EQ(runGpuPeer({"put-paged", daemon.socket(), "a", "7", "64"}, &out), 0) << out;
  ASSERT_EQ(runGpuPeer({"verify-paged", daemon.socket(), "7", "64", "64"}, &out), 0) << out;
  const std::string prefix = daemon.segmentPrefix();
  const std::string socket = daemon.socket();
  ASSERT_FALSE(shmSegments(prefix).empty());
  const int status = daemon.stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
  EXPECT_FALSE(std::filesystem::exists(socket));
  EXPECT_TRUE(shmSegments(prefix).empty());
}

}  // namespace
}  // namespace kvtier::test
