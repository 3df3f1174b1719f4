// Integration tests: a real kvtierd process, clients in this process and in separate peer
// processes, bytes through the shared pool.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "tests/temp_dir.h"
#include "tests/test_support.h"
#include "tools/synthetic_kv.h"
#include "transport/shm_segment.h"

namespace kvtier {
namespace {

using test::DaemonProcess;
using test::PeerProcess;
using test::runPeer;
using test::testLayout;

constexpr uint64_t kBlockBytes = 16 << 10;  // testLayout()'s block

std::vector<uint8_t> kvFor(const std::vector<uint32_t>& tokens, uint64_t from, uint64_t to) {
  return synthetic::packedKv(testLayout(), tokens, from, to);
}

std::vector<uint8_t> readAll(const ReadHandle& h) {
  std::vector<uint8_t> out((h.end() - h.begin()) * testLayout().tokenKvBytes());
  h.copyTo(h.begin(), h.end(), out.data(), out.size()).value();
  return out;
}

TEST(Integration, BytesWrittenByOneProcessAreReadIdenticallyByAnother) {
  DaemonProcess daemon;
  std::string out;
  ASSERT_EQ(runPeer({"put", daemon.socket(), "prompt-1", "1", "100"}, &out), 0) << out;
  EXPECT_NE(out.find("sealed=6"), std::string::npos) << out;
  // A second process looks the same prompt up: the 6 full blocks (96 tokens) match, byte for byte.
  ASSERT_EQ(runPeer({"verify", daemon.socket(), "1", "100", "100", "96"}, &out), 0) << out;
  EXPECT_NE(out.find("MATCHED 96 identical"), std::string::npos) << out;
}

TEST(Integration, LookupFromAnotherProcessFindsLongestBlockAlignedPrefix) {
  DaemonProcess daemon;
  ASSERT_EQ(runPeer({"put", daemon.socket(), "prompt-2", "2", "100"}), 0);
  // Diverging at d keeps the d / 16 blocks before it, whatever the alignment of d.
  for (uint64_t diverge : {0, 1, 15, 16, 17, 40, 95, 96, 100}) {
    const uint64_t expected = std::min<uint64_t>(diverge, 100) / 16 * 16;
    std::string out;
    EXPECT_EQ(runPeer({"verify", daemon.socket(), "2", "100", std::to_string(diverge),
                       std::to_string(expected)},
                      &out),
              0)
        << "diverge at " << diverge << ": " << out;
  }
}

TEST(Integration, InProcessAndInlineClientsAgreeWithMappedOnes) {
  DaemonProcess daemon;
  auto mapped = daemon.connect(true);
  auto inlined = daemon.connect(false);
  auto ms = mapped->open(testLayout()).value();  // the pool is mapped on first open
  auto is = inlined->open(testLayout()).value();
  ASSERT_TRUE(mapped->mapped());
  ASSERT_FALSE(inlined->mapped());

  const auto a = synthetic::tokens(10, 70), b = synthetic::tokens(11, 70);
  const auto kva = kvFor(a, 0, 70), kvb = kvFor(b, 0, 70);
  ASSERT_TRUE(ms->put("a", 0, a, kva.data(), kva.size()).ok());
  ASSERT_TRUE(is->put("b", 0, b, kvb.data(), kvb.size()).ok());  // written inline through the RPC

  auto viaInline = is->lookup(a).value();  // mapped writer, inline reader
  EXPECT_EQ(viaInline.matchedTokens(), 64u);
  EXPECT_TRUE(viaInline.inlineData());
  EXPECT_EQ(readAll(viaInline), kvFor(a, 0, 64));
  auto viaMapped = ms->lookup(b).value();  // inline writer, mapped reader
  EXPECT_EQ(viaMapped.matchedTokens(), 64u);
  EXPECT_EQ(readAll(viaMapped), kvFor(b, 0, 64));
  // get covers the partial last block too.
  auto whole = is->get("b").value();
  EXPECT_EQ(whole.end(), 70u);
  EXPECT_EQ(readAll(whole), kvb);
}

TEST(Integration, AppendsAcrossCallsAndPartialRewritesKeepBytes) {
  DaemonProcess daemon;
  auto client = daemon.connect();
  auto space = client->open(testLayout()).value();
  const auto tokens = synthetic::tokens(20, 90);
  const auto kv = kvFor(tokens, 0, 90);
  // Decode-style appends of uneven sizes, including inside a partial block.
  uint64_t pos = 0;
  for (uint64_t step : {5, 11, 1, 23, 16, 34}) {
    const auto chunk = kvFor(tokens, pos, pos + step);
    auto info =
        space->put("s", pos, std::span(tokens).subspan(pos, step), chunk.data(), chunk.size());
    ASSERT_TRUE(info.ok()) << info.error();
    pos += step;
    EXPECT_EQ(info->length, pos);
  }
  auto all = space->get("s").value();
  EXPECT_EQ(readAll(all), kv);
  all.release();
  // The full blocks were sealed as they filled: a lookup finds all 5 of them.
  EXPECT_EQ(space->lookup(tokens).value().matchedTokens(), 80u);
}

TEST(Integration, ClientKilledWithLeasesReleasesPinsAndFreesUncommittedBlocks) {
  DaemonProcess daemon;
  auto client = daemon.connect();
  auto space = client->open(testLayout()).value();
  ASSERT_EQ(runPeer({"put", daemon.socket(), "prompt-3", "3", "64"}), 0);
  // The peer has exited, but the daemon may not have seen its connection close yet: the baseline
  // is taken once only this test's own session is left.
  const Stats before = test::waitForStats(*client, [](const Stats& s) { return s.clients == 1; });
  ASSERT_EQ(before.clients, 1u);
  ASSERT_EQ(before.blocksPinned, 0u);

  PeerProcess holder({"hold", daemon.socket(), "3", "64"});
  ASSERT_EQ(holder.waitForLine("READY"), "READY 4") << holder.output();
  const Stats holding = client->stats().value();
  EXPECT_EQ(holding.laneLookups, before.laneLookups + 1);  // its read lease is the lane's
  EXPECT_EQ(holding.lanePuts, before.lanePuts + 1);        // and its write lease too
  EXPECT_EQ(holding.blocksPinned, 4u + 4u);  // 4 read-pinned, 4 granted to the open write lease
  EXPECT_EQ(holding.readLeases, 1u);
  EXPECT_EQ(holding.writeLeases, 1u);
  EXPECT_EQ(holding.blocksUsed, before.blocksUsed + 4);

  holder.kill(SIGKILL);
  EXPECT_EQ(holder.wait(), 128 + SIGKILL);
  const Stats after =
      test::waitForStats(*client, [&](const Stats& s) { return s.clients == before.clients; });
  EXPECT_EQ(after.clients, before.clients);
  EXPECT_EQ(after.blocksPinned, 0u);
  EXPECT_EQ(after.readLeases, 0u);
  EXPECT_EQ(after.writeLeases, 0u);
  EXPECT_EQ(after.blocksUsed, before.blocksUsed);
  // The uncommitted write is visible to nobody, then or now.
  EXPECT_EQ(space->length("uncommitted").value(), std::nullopt);
  EXPECT_EQ(space->lookup(synthetic::tokens(1003, 64)).value().matchedTokens(), 0u);
  // What was committed before is intact.
  std::string out;
  EXPECT_EQ(runPeer({"verify", daemon.socket(), "3", "64", "64", "64"}, &out), 0) << out;
}

TEST(Integration, SessionEndRemovesOwnedSequencesButDetachedOnesSurvive) {
  DaemonProcess daemon;
  ASSERT_EQ(runPeer({"put", daemon.socket(), "owned", "4", "40"}), 0);
  ASSERT_EQ(runPeer({"put", daemon.socket(), "handoff", "5", "40", "detached"}), 0);
  auto client = daemon.connect();
  auto space = client->open(testLayout()).value();
  EXPECT_EQ(space->length("owned").value(), std::nullopt);
  EXPECT_EQ(space->length("handoff").value(), std::optional<uint64_t>(40));
  // The owned sequence's sealed blocks outlive it in the prefix index.
  EXPECT_EQ(space->lookup(synthetic::tokens(4, 40)).value().matchedTokens(), 32u);
  // A "decode" process continues the detached sequence a "prefill" process wrote.
  std::string out;
  EXPECT_EQ(runPeer({"verify-seq", daemon.socket(), "handoff", "5", "40"}, &out), 0) << out;
}

TEST(Integration, PoolFullWithNothingEvictableAnswersFullAndStoresNothing) {
  DaemonProcess daemon(16 * kBlockBytes);  // 16 blocks
  auto client = daemon.connect();
  auto space = client->open(testLayout()).value();
  const auto a = synthetic::tokens(30, 12 * 16);
  const auto kva = kvFor(a, 0, a.size());
  ASSERT_TRUE(space->put("a", 0, a, kva.data(), kva.size()).ok());  // 12 blocks held by "a"
  const Stats before = client->stats().value();
  ASSERT_EQ(before.blocksTotal, 16u);

  const auto b = synthetic::tokens(31, 8 * 16);
  const auto kvb = kvFor(b, 0, b.size());
  auto full = space->put("b", 0, b, kvb.data(), kvb.size());
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.code(), ErrorCode::kFull);
  const Stats after = client->stats().value();
  EXPECT_EQ(after.blocksUsed, before.blocksUsed);
  EXPECT_EQ(after.writeLeases, 0u);
  EXPECT_EQ(space->length("b").value(), std::nullopt);
  EXPECT_EQ(readAll(space->get("a").value()), kva);
}

TEST(Integration, EvictionUnderPressureNeverTouchesPinnedBlocks) {
  DaemonProcess daemon(16 * kBlockBytes);
  auto client = daemon.connect();
  auto space = client->open(testLayout()).value();
  const auto p = synthetic::tokens(40, 64);
  const auto kvp = kvFor(p, 0, 64);
  ASSERT_TRUE(space->put("p", 0, p, kvp.data(), kvp.size()).ok());
  ASSERT_TRUE(space->remove("p", 0).ok());  // sealed blocks stay cached, held by nothing
  auto pinned = space->lookup(p).value();
  ASSERT_EQ(pinned.matchedTokens(), 64u);

  // Churn: 20 prompts of 4 blocks through the 12 unpinned blocks.
  for (uint64_t i = 0; i < 20; ++i) {
    const auto t = synthetic::tokens(100 + i, 64);
    const auto kv = kvFor(t, 0, 64);
    auto r = space->put("churn", 0, t, kv.data(), kv.size());
    ASSERT_TRUE(r.ok()) << "prompt " << i << ": " << r.error();
    ASSERT_TRUE(space->remove("churn", 0).ok());
  }
  const Stats s = client->stats().value();
  EXPECT_GT(s.evictions, 0u);
  // The pinned prefix kept its blocks and its bytes, and still hits.
  EXPECT_EQ(readAll(pinned), kvp);
  EXPECT_EQ(space->lookup(p).value().matchedTokens(), 64u);
  pinned.release();
  // Unpinned, it is evictable like the rest: enough churn pushes it out. The churn is reused
  // (each prompt put twice), as the prefix was: the default policy (2Q while it learns) keeps
  // reused blocks ahead of blocks used once, which one-time churn would never push out.
  for (uint64_t i = 0; i < 4; ++i) {
    const auto t = synthetic::tokens(200 + i, 64);
    const auto kv = kvFor(t, 0, 64);
    for (int use = 0; use < 2; ++use) {
      ASSERT_TRUE(space->put("churn", 0, t, kv.data(), kv.size()).ok());
      ASSERT_TRUE(space->remove("churn", 0).ok());
    }
  }
  EXPECT_LT(space->lookup(p).value().matchedTokens(), 64u);
}

// Stats say which eviction policy the daemon runs and which policy orders its blocks now: the
// adaptive default follows 2Q until it has measured the workload; a fixed policy, itself. The
// `kvtier stats` JSON carries the same.
TEST(Integration, StatsSayWhichEvictionPolicyOrdersTheBlocks) {
  {
    DaemonProcess daemon(16 * kBlockBytes);
    const Stats s = daemon.connect()->stats().value();
    EXPECT_EQ(s.evictionPolicy, "adaptive");
    EXPECT_EQ(s.evictionFollowing, "2q");
    EXPECT_EQ(s.evictionSwitches, 0u);
    EXPECT_NE(
        s.toJson().find(R"("eviction": {"policy": "adaptive", "following": "2q", "switches": 0})"),
        std::string::npos)
        << s.toJson();
  }
  DaemonProcess daemon(16 * kBlockBytes, "", {"--eviction", "sieve"});
  auto client = daemon.connect();
  auto space = client->open(testLayout()).value();
  for (uint64_t i = 0; i < 8; ++i) {  // evicts: a fixed policy never changes
    const auto t = synthetic::tokens(300 + i, 64);
    const auto kv = kvFor(t, 0, 64);
    ASSERT_TRUE(space->put("p", 0, t, kv.data(), kv.size()).ok());
    ASSERT_TRUE(space->remove("p", 0).ok());
  }
  const Stats s = client->stats().value();
  EXPECT_GT(s.evictions, 0u);
  EXPECT_EQ(s.evictionPolicy, "sieve");
  EXPECT_EQ(s.evictionFollowing, "sieve");
  EXPECT_EQ(s.evictionSwitches, 0u);
}

TEST(Integration, StaleBlockReferenceIsRefusedNeverServed) {
  DaemonProcess daemon(8 * kBlockBytes);
  auto client = daemon.connect();
  auto space = client->open(testLayout()).value();
  const auto p = synthetic::tokens(50, 32);
  const auto kvp = kvFor(p, 0, 32);
  ASSERT_TRUE(space->put("p", 0, p, kvp.data(), kvp.size()).ok());
  std::vector<BlockRef> refs;
  {
    auto hit = space->lookup(p).value();
    refs = hit.refs();
  }
  ASSERT_EQ(refs.size(), 2u);
  auto fresh = space->readRefs(refs);
  ASSERT_TRUE(fresh.ok()) << fresh.error();
  EXPECT_EQ(fresh->size(), 2u);
  // Evict and reuse every block: the references' generations are now stale.
  ASSERT_TRUE(space->remove("p", 0).ok());
  const auto filler = synthetic::tokens(300, 128);  // all 8 blocks of the pool
  const auto kvf = kvFor(filler, 0, 128);
  ASSERT_TRUE(space->put("filler", 0, filler, kvf.data(), kvf.size()).ok());
  ASSERT_EQ(client->stats().value().evictions, 2u);
  auto stale = space->readRefs(refs);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.code(), ErrorCode::kStaleReference);
  BlockRef garbage{0, 12345, static_cast<uint32_t>(kBlockBytes), 1};
  EXPECT_EQ(space->readRefs(std::span(&garbage, 1)).code(), ErrorCode::kInvalidArgument);
}

TEST(Integration, PeerOfAnotherUserIsRefusedByItsCredentials) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a peer as another user";
  DaemonProcess daemon;
  // Open the file-system path to everyone, so that only the daemon's own check can refuse.
  ASSERT_EQ(chmod(daemon.dataDir().c_str(), 0755), 0);
  ASSERT_EQ(chmod(daemon.socket().c_str(), 0666), 0);
  std::string out;
  // "nobody" is not the daemon's user or group: the daemon refuses it by its Unix credentials.
  ASSERT_EQ(runPeer({"connect-as", "65534", daemon.socket()}, &out), 0) << out;
  EXPECT_NE(out.find("CONNECT PERMISSION_DENIED"), std::string::npos) << out;
}

TEST(Integration, SigtermRemovesSocketAndSegments) {
  DaemonProcess daemon;
  {
    auto client = daemon.connect();
    auto space = client->open(testLayout()).value();
  }
  const std::string prefix = daemon.segmentPrefix();
  ASSERT_FALSE(test::shmSegments(prefix).empty());
  ASSERT_TRUE(std::filesystem::exists(daemon.socket()));
  struct stat st {};
  ASSERT_EQ(stat(daemon.socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  const std::string socket = daemon.socket();
  const int status = daemon.stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_FALSE(std::filesystem::exists(socket));
  EXPECT_TRUE(test::shmSegments(prefix).empty());
}

TEST(Integration, RestartAfterCrashReplacesStaleSegments) {
  std::string dataDir;
  std::string prefix;
  {
    DaemonProcess crashed;
    dataDir = crashed.dataDir();
    prefix = crashed.segmentPrefix();
    crashed.stop(SIGKILL);
  }
  // The crashed daemon's segment is still there; scribble on it.
  const auto left = test::shmSegments(prefix);
  ASSERT_EQ(left.size(), 1u);
  {
    auto seg = ShmSegment::open(left[0], 4096).value();
    std::memset(seg->data(), 0xAB, 4096);
  }
  DaemonProcess restarted(64 << 20, dataDir);
  EXPECT_EQ(restarted.segmentPrefix(), prefix);
  auto seg = ShmSegment::open(left[0], 4096).value();
  EXPECT_EQ(seg->data()[0], 0) << "the stale segment was reused instead of replaced";
  auto client = restarted.connect();
  EXPECT_TRUE(client->open(testLayout()).ok());
}

TEST(Integration, SecondDaemonOnTheSameDataDirRefusesToStart) {
  DaemonProcess first;
  EXPECT_THROW(DaemonProcess second(64 << 20, first.dataDir()), std::runtime_error);
  auto client = first.connect();  // the first one is unharmed
  EXPECT_TRUE(client->stats().ok());
}

// --socket may lie outside the data directory, where the lock does not reach: a daemon of another
// data directory naming a socket a live daemon serves refuses to start (the first stays
// reachable), and a path that is not a socket is refused and left as it is.
TEST(Integration, ADaemonRefusesALiveSocketOrAPathThatIsNotOne) {
  DaemonProcess first;
  std::string out;
  EXPECT_EQ(test::runDaemonExpectingFailure(64 << 20, {"--socket", first.socket()}, &out), 1)
      << out;
  EXPECT_NE(out.find("another process serves " + first.socket()), std::string::npos) << out;
  EXPECT_TRUE(first.connect()->stats().ok()) << "the first daemon lost its socket";
  test::TempDir dir;
  const std::string file = dir.file("notes.txt");
  std::ofstream(file) << "keep me";
  EXPECT_EQ(test::runDaemonExpectingFailure(64 << 20, {"--socket", file}, &out), 1) << out;
  EXPECT_NE(out.find(file + " exists and is not a socket"), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::exists(file));
}

// A cluster token file is read up to its bound, never whole: one that never ends is refused.
TEST(Integration, AnEndlessClusterTokenFileIsRefused) {
  std::string out;
  EXPECT_EQ(
      test::runDaemonExpectingFailure(64 << 20, {"--cluster-token-file", "/dev/zero"}, &out), 1)
      << out;
  EXPECT_NE(out.find("over 4096 bytes"), std::string::npos) << out;
}

TEST(Integration, ConnectToMissingDaemonIsUnavailable) {
  auto client = Client::connect({.socketPath = "/tmp/kvtier-no-such-daemon.sock"});
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.code(), ErrorCode::kUnavailable);
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

TEST(Integration, AnOwnThreadClientReleasesDroppedHandlesBeforeItsNextCallAndWithoutOne) {
  test::DaemonProcess daemon;
  auto client = daemon.connect();  // the default: the SDK's own loop thread
  auto space = client->open(test::testLayout()).value();
  const auto t = synthetic::tokens(61, 40);
  const auto kv = synthetic::packedKv(test::testLayout(), t, 0, 40);
  ASSERT_TRUE(space->put("c", 0, t, kv.data(), kv.size()).ok());
  {
    auto hit = space->lookup(t).value();
    EXPECT_EQ(hit.matchedTokens(), 32u);
    EXPECT_EQ(client->stats().value().blocksPinned, 2u);
  }  // dropped: the caller does not wait for the release
  // Released before this client's next call is sent.
  EXPECT_EQ(client->stats().value().blocksPinned, 0u);

  // Handles dropped on several threads at once.
  std::vector<std::thread> threads;
  std::atomic<int> hits{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < 50; ++j) {
        auto hit = space->lookup(t);
        if (hit.ok() && hit->matchedTokens() == 32u) ++hits;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(hits.load(), 200);
  const Stats after = client->stats().value();
  EXPECT_EQ(after.blocksPinned, 0u);
  EXPECT_EQ(after.readLeases, 0u);

  // And with no later call from this client: another one sees the pins go.
  { auto hit = space->lookup(t).value(); }
  auto watcher = daemon.connect();
  EXPECT_EQ(
      test::waitForStats(*watcher, [](const Stats& s) { return s.blocksPinned == 0; }).blocksPinned,
      0u);
}

TEST(Integration, HandlesDroppedOnManyThreadsAtOnceAreAllReleasedWithoutALaterCall) {
  test::DaemonProcess daemon;
  auto client = daemon.connect();
  auto space = client->open(test::testLayout()).value();
  const auto t = synthetic::tokens(62, 40);
  const auto kv = synthetic::packedKv(test::testLayout(), t, 0, 40);
  ASSERT_TRUE(space->put("c", 0, t, kv.data(), kv.size()).ok());
  auto watcher = daemon.connect();
  for (int round = 0; round < 20; ++round) {
    constexpr int kThreads = 4;
    std::atomic<int> holding{0};
    std::atomic<bool> drop{false};
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&] {
        auto hit = space->lookup(t);
        ++holding;
        while (!drop) std::this_thread::yield();
      });  // every handle dropped at about the same moment
    }
    while (holding < kThreads) std::this_thread::yield();
    drop = true;
    for (auto& thread : threads) thread.join();
    // No later call from `client`: the releases must still all go out.
    const Stats s =
        test::waitForStats(*watcher, [](const Stats& x) { return x.blocksPinned == 0; });
    ASSERT_EQ(s.blocksPinned, 0u) << "round " << round;
    ASSERT_EQ(s.readLeases, 0u) << "round " << round;
  }
}

// Own-thread clients destroyed right after connect(), or right after one call, and calls racing
// from several threads into a fresh client: every destructor returns (the stop is never missed
// by a loop thread that has not armed its wake-up yet) and every call gets its answer.
TEST(Integration, OwnThreadClientsStopWhateverTheyWereDoing) {
  test::DaemonProcess daemon;
  for (int i = 0; i < 100; ++i) {
    auto client = daemon.connect();
    if (i % 2) {
      EXPECT_TRUE(client->stats().ok());
    }
  }
  for (int i = 0; i < 10; ++i) {
    auto client = daemon.connect();
    std::vector<std::thread> threads;
    std::atomic<int> answered{0};
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int j = 0; j < 5; ++j) answered += client->stats().ok() ? 1 : 0;
      });
    }
    for (auto& thread : threads) thread.join();
    EXPECT_EQ(answered.load(), 20);
  }
}

// Puts take the fast lane too, in both threading modes: what a lane put stores is what a reader
// over Cap'n Proto reads, byte for byte, and the other way round; a commit past the grant leaves
// the lease open for another try; a dropped handle's abort goes over the lane and is served before
// the client's next Cap'n Proto call.
TEST(Integration, PutsTakeTheFastLaneAndStoreWhatCapnProtoStores) {
  test::DaemonProcess daemon;
  const Layout layout = test::testLayout();
  auto plain = Client::connect({.socketPath = daemon.socket(), .lane = false}).value();
  auto plainSpace = plain->open(layout).value();
  const Stats start = plain->stats().value();
  uint32_t seed = 80;
  for (auto threading : {ClientThreading::kOwnThread, ClientThreading::kCallerThread}) {
    auto client = Client::connect({.socketPath = daemon.socket(), .threading = threading}).value();
    auto space = client->open(layout).value();
    const uint64_t lanePuts = client->stats().value().lanePuts;
    const auto t = synthetic::tokens(++seed, 70);
    const auto kv = synthetic::packedKv(layout, t, 0, 70);
    auto info = space->put("lane", 0, t, kv.data(), kv.size());
    ASSERT_TRUE(info.ok()) << info.error();
    EXPECT_EQ(info->length, 70u);
    EXPECT_EQ(info->sealedBlocks, 4u);
    EXPECT_EQ(client->stats().value().lanePuts, lanePuts + 1);
    EXPECT_EQ(readAll(plainSpace->get("lane").value()), kv);
    EXPECT_EQ(readAll(plainSpace->lookup(t).value()), synthetic::packedKv(layout, t, 0, 64));

    // A put over Cap'n Proto reads back the same over the lane.
    const auto u = synthetic::tokens(++seed, 40);
    const auto ukv = synthetic::packedKv(layout, u, 0, 40);
    ASSERT_TRUE(plainSpace->put("plain", 0, u, ukv.data(), ukv.size()).ok());
    EXPECT_EQ(readAll(space->get("plain").value()), ukv);
    EXPECT_EQ(plain->stats().value().lanePuts, lanePuts + 1);

    // A commit past the grant is refused and the lease stays open; the next commit succeeds.
    const auto v = synthetic::tokens(++seed, 20);
    auto handle = space->beginPut("retry", 0, v).value();
    const auto vkv = synthetic::packedKv(layout, v, 0, 20);
    ASSERT_TRUE(handle.write(0, 20, vkv.data(), vkv.size()).ok());
    auto past = handle.commit(21);
    ASSERT_FALSE(past.ok());
    EXPECT_EQ(past.code(), ErrorCode::kInvalidArgument);
    auto done = handle.commit(20);
    ASSERT_TRUE(done.ok()) << done.error();
    EXPECT_EQ(done->length, 20u);
    EXPECT_EQ(readAll(plainSpace->get("retry").value()), vkv);
    EXPECT_EQ(handle.commit().code(), ErrorCode::kReleased);

    // A dropped handle, and an explicit abort, leave nothing: no sequence, lease or block.
    const Stats settled = client->stats().value();
    { auto dropped = space->beginPut("dropped", 0, synthetic::tokens(++seed, 40)).value(); }
    auto aborted = space->beginPut("aborted", 0, synthetic::tokens(++seed, 40)).value();
    EXPECT_TRUE(aborted.abort().ok());
    EXPECT_EQ(aborted.abort().code(), ErrorCode::kReleased);
    const Stats after = client->stats().value();
    EXPECT_EQ(after.writeLeases, 0u);
    EXPECT_EQ(after.blocksUsed, settled.blocksUsed);
    EXPECT_EQ(after.lanePuts, settled.lanePuts + 2);
    EXPECT_FALSE(plainSpace->length("dropped").value().has_value());
    EXPECT_FALSE(plainSpace->length("aborted").value().has_value());
    ASSERT_TRUE(space->remove("lane", 0).ok());
    ASSERT_TRUE(space->remove("plain", 0).ok());
    ASSERT_TRUE(space->remove("retry", 0).ok());
  }
  EXPECT_EQ(plain->stats().value().lanePuts, start.lanePuts + 8);  // 4 in each mode
}

// putMany stores each item as put() would — with the lane pipelining the grants behind the copies,
// and without a lane one put after another: the same results, the same bytes. An item that fails
// (bad size, a put past its sequence's end) fails alone; items of one sequence follow each other.
TEST(Integration, PutManyStoresEachItemAsPutWould) {
  test::DaemonProcess daemon;
  const Layout layout = test::testLayout();
  auto reader = Client::connect({.socketPath = daemon.socket(), .lane = false}).value();
  auto readerSpace = reader->open(layout).value();
  for (bool withLane : {true, false}) {
    auto client = Client::connect({.socketPath = daemon.socket(), .lane = withLane}).value();
    auto space = client->open(layout).value();
    const std::string tag = withLane ? "lane-" : "plain-";
    const uint64_t lanePuts = client->stats().value().lanePuts;
    std::vector<std::vector<uint32_t>> tokens;
    std::vector<std::vector<uint8_t>> kv;
    for (uint32_t i = 0; i < 4; ++i) {
      tokens.push_back(synthetic::tokens(100 + i + (withLane ? 0 : 50), 40 + 8 * i));
      kv.push_back(synthetic::packedKv(layout, tokens.back(), 0, tokens.back().size()));
    }
    const auto whole = synthetic::tokens(120 + (withLane ? 0 : 50), 48);
    const auto wholeKv = synthetic::packedKv(layout, whole, 0, 48);
    const auto head = std::span(whole).first(32), tail = std::span(whole).subspan(32);
    const auto headKv = synthetic::packedKv(layout, whole, 0, 32);
    const auto tailKv = synthetic::packedKv(layout, whole, 32, 48);
    const std::string names[] = {tag + "0", tag + "1", tag + "2", tag + "3", tag + "grown"};
    std::vector<PutItem> items = {
        {names[0], 0, tokens[0], kv[0].data(), kv[0].size()},
        {names[1], 0, tokens[1], kv[1].data(), kv[1].size() - 1},  // one byte short
        {names[2], 0, tokens[2], kv[2].data(), kv[2].size()},
        {names[4], 0, head, headKv.data(), headKv.size()},
        {names[4], 32, tail, tailKv.data(), tailKv.size()},    // waits for the commit before it
        {names[3], 5, tokens[3], kv[3].data(), kv[3].size()},  // past the end of a new sequence
        {names[1], 0, tokens[1], kv[1].data(), kv[1].size()},
    };
    auto results = space->putMany(items);
    ASSERT_EQ(results.size(), items.size());
    const std::vector<std::pair<ErrorCode, uint64_t>> expected = {
        {ErrorCode::kOk, 40}, {ErrorCode::kInvalidArgument, 0},
        {ErrorCode::kOk, 56}, {ErrorCode::kOk, 32},
        {ErrorCode::kOk, 48}, {ErrorCode::kInvalidArgument, 0},
        {ErrorCode::kOk, 48}};
    for (size_t i = 0; i < items.size(); ++i) {
      const ErrorCode code = results[i].ok() ? ErrorCode::kOk : results[i].code();
      EXPECT_EQ(code, expected[i].first) << tag << "item " << i;
      if (results[i].ok()) {
        EXPECT_EQ(results[i]->length, expected[i].second) << tag << "item " << i;
      }
    }
    EXPECT_EQ(readAll(readerSpace->get(names[0]).value()), kv[0]);
    EXPECT_EQ(readAll(readerSpace->get(names[1]).value()), kv[1]);
    EXPECT_EQ(readAll(readerSpace->get(names[2]).value()), kv[2]);
    EXPECT_EQ(readAll(readerSpace->get(names[4]).value()), wholeKv);
    EXPECT_FALSE(readerSpace->length(names[3]).value().has_value());
    // Five items reached the daemon; over the lane when there is one.
    const Stats after = client->stats().value();
    EXPECT_EQ(after.lanePuts, lanePuts + (withLane ? 5 : 0));
    EXPECT_EQ(after.writeLeases, 0u);
    EXPECT_TRUE(space->putMany({}).empty());
  }
}

// Lookups take the session's fast lane (ClientOptions::lane, on by default) in both threading
// modes: the same blocks and bytes as over Cap'n Proto, and a dropped handle's release is served
// before the client's next Cap'n Proto call although it went over the other connection.
TEST(Integration, LookupsTakeTheFastLaneAndAnswerWhatCapnProtoAnswers) {
  test::DaemonProcess daemon;
  const auto t = synthetic::tokens(63, 70);
  const auto kv = synthetic::packedKv(test::testLayout(), t, 0, 64);
  auto writer = daemon.connect();
  auto writerSpace = writer->open(test::testLayout()).value();
  ASSERT_TRUE(writerSpace
                  ->put("p", 0, t, synthetic::packedKv(test::testLayout(), t, 0, 70).data(),
                        70 * test::testLayout().tokenKvBytes())
                  .ok());
  auto plain = Client::connect({.socketPath = daemon.socket(), .lane = false}).value();
  auto plainSpace = plain->open(test::testLayout()).value();
  const std::vector<BlockRef> refs = plainSpace->lookup(t).value().refs();
  ASSERT_EQ(refs.size(), 4u);
  const Stats start = plain->stats().value();
  EXPECT_EQ(start.lanesAttached, 1u);  // the writer's; `plain` asked for none

  for (auto threading : {ClientThreading::kOwnThread, ClientThreading::kCallerThread}) {
    auto client = Client::connect({.socketPath = daemon.socket(), .threading = threading}).value();
    auto space = client->open(test::testLayout()).value();
    const uint64_t laneLookups = client->stats().value().laneLookups;
    for (int i = 0; i < 20; ++i) {
      {
        auto hit = space->lookup(t).value();
        ASSERT_EQ(hit.matchedTokens(), 64u);
        EXPECT_EQ(readAll(hit), kv);
        ASSERT_EQ(hit.refs().size(), refs.size());
        for (size_t b = 0; b < refs.size(); ++b) {
          EXPECT_EQ(hit.refs()[b].extent, refs[b].extent);
          EXPECT_EQ(hit.refs()[b].offset, refs[b].offset);
          EXPECT_EQ(hit.refs()[b].generation, refs[b].generation);
        }
      }
      // The drop's release went over the lane; this call goes over Cap'n Proto and sees it.
      const Stats s = client->stats().value();
      ASSERT_EQ(s.readLeases, 0u) << "lookup " << i;
      ASSERT_EQ(s.blocksPinned, 0u) << "lookup " << i;
    }
    const Stats after = client->stats().value();
    EXPECT_EQ(after.laneLookups, laneLookups + 20);
    EXPECT_EQ(after.lanesAttached, 2u);
    // A miss grants nothing to release.
    EXPECT_EQ(space->lookup(synthetic::tokens(64, 32)).value().matchedTokens(), 0u);
    EXPECT_EQ(client->stats().value().readLeases, 0u);
  }
  // The lane-less client's lookups stay on Cap'n Proto.
  const uint64_t before = plain->stats().value().laneLookups;
  EXPECT_EQ(readAll(plainSpace->lookup(t).value()), kv);
  EXPECT_EQ(plain->stats().value().laneLookups, before);
  EXPECT_EQ(plain->stats().value().lanesAttached, 1u);
}

TEST(Integration, CallerThreadClientWorksOnItsThreadAndRefusesOthers) {
  test::DaemonProcess daemon;
  auto client =
      Client::connect({.socketPath = daemon.socket(), .threading = ClientThreading::kCallerThread})
          .value();
  auto space = client->open(test::testLayout()).value();
  const auto t = synthetic::tokens(60, 40);
  const auto kv = synthetic::packedKv(test::testLayout(), t, 0, 40);
  ASSERT_TRUE(space->put("c", 0, t, kv.data(), kv.size()).ok());
  {
    auto hit = space->lookup(t).value();
    EXPECT_EQ(hit.matchedTokens(), 32u);
    hit.release();  // flushed to the daemon without waiting
  }
  EXPECT_EQ(client->stats().value().blocksPinned, 0u);
  Status fromOther;
  std::thread other([&] { fromOther = space->truncate("c", 10); });
  other.join();
  EXPECT_EQ(fromOther.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(space->length("c").value(), std::optional<uint64_t>(40));
  // A handle dropped on another thread (which has no event loop of this client's) is released
  // with the client's next call on its own thread.
  auto held = space->get("c", 0, 40);
  ASSERT_TRUE(held.ok()) << held.error();
  EXPECT_GT(client->stats().value().blocksPinned, 0u);
  std::thread dropper([h = std::move(held).value()]() mutable { ReadHandle gone = std::move(h); });
  dropper.join();
  EXPECT_EQ(client->stats().value().blocksPinned, 0u);
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

TEST(Integration, SnapshotTakenByOneProcessIsRestoredByAnother) {
  test::DaemonProcess daemon;
  std::string out;
  // The peer writes 70 tokens, snapshots [20, 70), removes its sequence and exits.
  ASSERT_EQ(test::runPeer({"snapshot", daemon.socket(), "origin", "70", "70", "20"}, &out), 0)
      << out;
  const uint64_t id = std::stoull(out.substr(out.find("SNAPSHOT ") + 9));
  auto client = daemon.connect();
  auto space = client->open(test::testLayout()).value();
  auto info = space->snapshotInfo(id).value();
  EXPECT_EQ(info.from, 20u);
  EXPECT_EQ(info.to, 70u);
  // This process has the same first 20 tokens (its own KV for them) and restores the rest.
  const auto tokens = synthetic::tokens(70, 70);
  const auto kv = synthetic::packedKv(test::testLayout(), tokens, 0, 20);
  ASSERT_TRUE(space->put("mine", 0, std::span(tokens).first(20), kv.data(), kv.size()).ok());
  ASSERT_TRUE(space->restore("mine", id, 70).ok());
  auto all = space->get("mine").value();
  EXPECT_EQ(all.end(), 70u);
  EXPECT_EQ(readAll(all), synthetic::packedKv(test::testLayout(), tokens, 0, 70));
  all.release();
  // Restoring onto a sequence that lacks the snapshot's prefix is refused and changes nothing.
  EXPECT_EQ(space->restore("empty", id, 70).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(space->length("empty").value(), std::nullopt);
}

TEST(Integration, DecodeProcessContinuesTheSequenceAPrefillProcessWrote) {
  test::DaemonProcess daemon;
  ASSERT_EQ(test::runPeer({"put", daemon.socket(), "req-9", "90", "50", "detached"}), 0);
  std::string out;
  ASSERT_EQ(test::runPeer({"continue", daemon.socket(), "req-9", "90", "50", "30"}, &out), 0)
      << out;
  EXPECT_NE(out.find("CONTINUED 80"), std::string::npos) << out;
  // A third process reads the whole 80 tokens back, byte for byte.
  EXPECT_EQ(test::runPeer({"verify-seq", daemon.socket(), "req-9", "90", "80"}, &out), 0) << out;
}

TEST(Integration, CheckpointsAndEntriesTravelThroughThePoolAndInline) {
  test::DaemonProcess daemon;
  for (bool mapPool : {true, false}) {
    auto client = daemon.connect(mapPool);
    auto space = client->open(test::testLayout()).value();
    const std::string seq = mapPool ? "rec-mapped" : "rec-inline";
    const auto t = synthetic::tokens(80, 24);
    const auto kv = synthetic::packedKv(test::testLayout(), t, 0, 24);
    ASSERT_TRUE(space->put(seq, 0, t, kv.data(), kv.size()).ok());
    std::vector<uint8_t> state(10000);
    for (size_t i = 0; i < state.size(); ++i) state[i] = static_cast<uint8_t>(i * 7 + mapPool);
    ASSERT_TRUE(space->putCheckpoint(seq, 24, state.data(), state.size()).ok());
    auto got = space->getCheckpoint(seq, 24).value();
    EXPECT_EQ(std::vector<uint8_t>(got.data().begin(), got.data().end()), state);
    EXPECT_EQ(space->getCheckpoint(seq, 10).code(), ErrorCode::kNotFound);
    EXPECT_EQ(space->checkpoints(seq).value(), std::vector<uint64_t>{24});

    std::vector<uint8_t> image(50000, static_cast<uint8_t>(mapPool ? 3 : 4));
    const Key128 key = contentKey(image.data(), image.size());
    ASSERT_TRUE(space->putEntry(key, image.data(), image.size()).ok());
    auto entry = space->getEntry(key).value();
    EXPECT_EQ(std::vector<uint8_t>(entry.data().begin(), entry.data().end()), image);
    Key128 other = key;
    other.bytes[0] ^= 1;
    EXPECT_EQ(space->getEntry(other).code(), ErrorCode::kNotFound);
  }
}

// A space opened on a GPU device the daemon has no pool for (here: a daemon started with --gpus
// none) is refused, typed: INVALID_ARGUMENT from the daemon, or NOT_SUPPORTED from a client built
// without CUDA. Needs no GPU.
TEST(Integration, OpeningASpaceOnADeviceWithoutAPoolIsRefused) {
  test::DaemonProcess daemon;
  auto client = daemon.connect();
  EXPECT_TRUE(client->devices().empty());
  auto space = client->open(test::testLayout(), OpenOptions{.device = 0});
  ASSERT_FALSE(space.ok());
#ifdef KVTIER_HAVE_CUDA
  EXPECT_EQ(space.error().code(), ErrorCode::kInvalidArgument) << space.error();
#else
  EXPECT_EQ(space.error().code(), ErrorCode::kNotSupported) << space.error();
#endif
  EXPECT_EQ(client->stats().value().gpuBlocksTotal, 0u);
  // The session still works on the host pool.
  EXPECT_TRUE(client->open(test::testLayout()).ok());
}

}  // namespace
}  // namespace kvtier
