// Clients reconnect by themselves: when kvtierd goes away and a new one comes up on the same
// socket, a client connects again within ClientOptions::reconnectInterval of the daemon's return
// however often it calls — a loop that never pauses included — in both threading modes, over the
// fast lane and over Cap'n Proto. Spaces opened before work again (opened anew on the new
// daemon); handles from before fail cleanly and let go of what they held.
#include <signal.h>
#include <sys/mman.h>

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <numeric>

#include "tests/test_support.h"
#include "tools/synthetic_kv.h"

namespace kvtier {
namespace {

using test::DaemonProcess;
using Clock = std::chrono::steady_clock;

std::vector<uint32_t> tokens(size_t n, uint32_t first) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

struct Mode {
  ClientThreading threading;
  bool lane;
};

class Reconnect : public ::testing::TestWithParam<Mode> {
 protected:
  std::unique_ptr<Client> connect(const std::string& socket) {
    auto c = Client::connect({.socketPath = socket,
                              .clientName = "reconnect-test",
                              .threading = GetParam().threading,
                              .lane = GetParam().lane});
    EXPECT_TRUE(c.ok()) << c.error();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  // Kills the daemon as a crash would, and removes what it left (its pool's names).
  static void crash(std::unique_ptr<DaemonProcess>& daemon) {
    const std::string prefix = daemon->segmentPrefix();
    daemon->stop(SIGKILL);
    for (const auto& name : test::shmSegments(prefix)) ::shm_unlink(("/" + name).c_str());
    daemon.reset();
  }
};

TEST_P(Reconnect, AClientCallingWithoutPauseIsBackWithinTheIntervalOfTheDaemonsReturn) {
  auto first = std::make_unique<DaemonProcess>();
  const std::string dataDir = first->dataDir(), socket = first->socket();
  auto client = connect(socket);
  ASSERT_NE(client, nullptr);
  const Layout layout = test::testLayout();
  auto space = client->open(layout).value();
  const auto t = tokens(48, 100);
  const auto kv = synthetic::packedKv(layout, t, 0, 48);
  ASSERT_TRUE(space->put("a", 0, t, kv.data(), kv.size()).ok());
  auto before = space->lookup(t).value();  // a handle from before the crash
  ASSERT_EQ(before.matchedTokens(), 48u);
  crash(first);
  // Calls fail, fast, while no daemon is there: hundreds of them, none pushes the next attempt.
  uint64_t failed = 0;
  const auto gone = Clock::now();
  while (Clock::now() - gone < std::chrono::milliseconds(600)) {
    auto r = space->lookup(t);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.code(), ErrorCode::kUnavailable) << r.error();
    ++failed;
  }
  EXPECT_GT(failed, 20u);
  DaemonProcess second(64 << 20, dataDir);
  const auto back = Clock::now();
  Result<ReadHandle> hit = makeError(ErrorCode::kUnavailable, "not yet");
  uint64_t calls = 0;
  while (!hit.ok() && Clock::now() - back < std::chrono::seconds(10)) {
    hit = space->lookup(t);
    ++calls;
  }
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - back).count();
  ASSERT_TRUE(hit.ok()) << "no reconnection in 10 s of " << calls << " calls: " << hit.error();
  // Attempts are 250 ms apart at most: the first after the daemon's return is within that (and
  // a loaded machine's scheduling).
  EXPECT_LE(ms, 1000) << calls << " calls";
  EXPECT_EQ(client->reconnects(), 1u);
  // A new daemon: its pool is empty (a miss), and the space works on it as before.
  EXPECT_EQ(hit->matchedTokens(), 0u);
  hit->release();
  ASSERT_TRUE(space->put("a", 0, t, kv.data(), kv.size()).ok());
  auto again = space->lookup(t).value();
  EXPECT_EQ(again.matchedTokens(), 48u);
  std::vector<uint8_t> out(kv.size());
  ASSERT_TRUE(again.copyTo(0, 48, out.data(), out.size()).ok());
  EXPECT_EQ(out, kv);
  // The handle from before: its bytes are still readable where it mapped them, and releasing it
  // goes to the daemon it came from (gone) without disturbing the new one.
  ASSERT_TRUE(before.copyTo(0, 48, out.data(), out.size()).ok());
  EXPECT_EQ(out, kv);
  before.release();
  again.release();
  auto stats = client->stats().value();
  EXPECT_EQ(stats.readLeases, 0u);
  EXPECT_EQ(stats.clients, 1u);
  // A space opened after the reconnection, and the client's own calls, work too.
  auto other = client->open(layout).value();
  EXPECT_EQ(other->lookup(t).value().matchedTokens(), 48u);
}

TEST_P(Reconnect, WithoutReconnectionEveryCallAfterTheLossFails) {
  auto first = std::make_unique<DaemonProcess>();
  const std::string dataDir = first->dataDir(), socket = first->socket();
  auto c = Client::connect({.socketPath = socket,
                            .clientName = "reconnect-test",
                            .threading = GetParam().threading,
                            .lane = GetParam().lane,
                            .reconnect = false});
  ASSERT_TRUE(c.ok()) << c.error();
  auto space = (*c)->open(test::testLayout()).value();
  crash(first);
  DaemonProcess second(64 << 20, dataDir);
  const auto t = tokens(16, 5);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(space->lookup(t).code(), ErrorCode::kUnavailable);
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_EQ((*c)->reconnects(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Modes, Reconnect,
                         ::testing::Values(Mode{ClientThreading::kOwnThread, true},
                                           Mode{ClientThreading::kOwnThread, false},
                                           Mode{ClientThreading::kCallerThread, true},
                                           Mode{ClientThreading::kCallerThread, false}),
                         [](const auto& info) {
                           return std::string(info.param.threading == ClientThreading::kOwnThread
                                                  ? "OwnThread"
                                                  : "CallerThread") +
                                  (info.param.lane ? "Lane" : "CapnProto");
                         });

}  // namespace
}  // namespace kvtier
