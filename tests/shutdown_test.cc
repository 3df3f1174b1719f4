// A bounded stop: SIGTERM ends kvtierd within --shutdown-timeout-ms whatever it is doing. On a
// slow disk the flush cannot write everything: it writes the most useful blocks first and leaves
// the rest, and the restart serves what it wrote with the writer's bytes.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>

#include "tests/test_support.h"
#include "tools/synthetic_kv.h"

namespace kvtier {
namespace {

using test::DaemonProcess;
using test::testLayout;

std::vector<uint32_t> prompt(uint64_t i, size_t tokens) {
  return synthetic::tokens(5000 + i, tokens);
}

void putPrompt(Space& space, uint64_t i, size_t tokens) {
  const auto t = prompt(i, tokens);
  const auto kv = synthetic::packedKv(testLayout(), t, 0, t.size());
  ASSERT_TRUE(space.put("p", 0, t, kv.data(), kv.size()).ok()) << i;
  ASSERT_TRUE(space.remove("p", 0).ok());
}

// Tokens of prompt i a lookup matches, its bytes checked.
uint64_t matched(Space& space, uint64_t i, size_t tokens) {
  const auto t = prompt(i, tokens);
  auto hit = space.lookup(t);
  EXPECT_TRUE(hit.ok()) << hit.error();
  if (!hit) return 0;
  const uint64_t n = hit->matchedTokens();
  std::vector<uint8_t> got(n * testLayout().tokenKvBytes());
  EXPECT_TRUE(hit->copyTo(0, n, got.data(), got.size()).ok());
  EXPECT_EQ(got, synthetic::packedKv(testLayout(), t, 0, n)) << "wrong bytes for prompt " << i;
  return n;
}

TEST(Shutdown, AStopOnASlowDiskEndsWithinItsBoundWritingTheMostUsefulBlocksFirst) {
  constexpr size_t kUseful = 256;   // tokens: 16 blocks of 16 KiB
  constexpr size_t kFiller = 1024;  // 64 blocks: 1 MiB
  constexpr int kFillers = 24;
  constexpr int kTimeoutMs = 3000;
  std::string dataDir;
  {
    // A disk that takes 2 MB a second: 24 MiB would take 12 s to write.
    DaemonProcess first(64 << 20, "",
                        {"--cold-tier", "on", "--disk-write-rate", "2M", "--shutdown-timeout-ms",
                         std::to_string(kTimeoutMs)});
    dataDir = first.dataDir();
    auto client = first.connect();
    auto space = client->open(testLayout()).value();
    // Fillers first (the background spill writes the oldest first), then two prompts that are
    // used again and again: the most useful blocks of the pool, the newest, not written yet.
    for (int i = 0; i < kFillers; ++i) putPrompt(*space, 100 + i, kFiller);
    for (int i = 0; i < 2; ++i) putPrompt(*space, i, kUseful);
    for (int round = 0; round < 3; ++round) {
      for (int i = 0; i < 2; ++i) ASSERT_EQ(matched(*space, i, kUseful), kUseful);
    }
    space.reset();
    client.reset();
    const auto t0 = std::chrono::steady_clock::now();
    const int status = first.stop(SIGTERM);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    EXPECT_LE(ms, kTimeoutMs + 1500) << "the stop took " << ms << " ms";
  }
  DaemonProcess second(64 << 20, dataDir, {"--cold-tier", "on"});
  auto client = second.connect();
  auto space = client->open(testLayout()).value();
  for (int i = 0; i < 2; ++i) EXPECT_EQ(matched(*space, i, kUseful), kUseful) << "prompt " << i;
  int whole = 0;
  for (int i = 0; i < kFillers; ++i) whole += matched(*space, 100 + i, kFiller) == kFiller;
  EXPECT_LT(whole, kFillers) << "every block was written: the disk was not slow enough to tell";
}

}  // namespace
}  // namespace kvtier
