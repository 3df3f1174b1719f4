// The cluster with real processes, moving data between nodes: snapshots restored on another node
// and moved there, a node drained for maintenance, and blocks copied and moved to another node.
#include <signal.h>

#include <gtest/gtest.h>

#include <atomic>
#include <span>
#include <thread>

#include "tests/cluster_support.h"
#include "tests/test_support.h"
#include "tools/synthetic_kv.h"

namespace kvtier::test {
namespace {

// --- snapshots across nodes: a prefill worker on one node snapshots a request, a decode worker on
// another restores it.

struct SnapshotCase {
  const Layout layout = testLayout();
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> kv;
  explicit SnapshotCase(uint64_t seed, size_t n)
      : tokens(synthetic::tokens(seed, n)), kv(synthetic::packedKv(layout, tokens, 0, n)) {}
  // Puts the tokens as `seq` on `d` and snapshots [from, end).
  SnapshotInfo prefill(DaemonProcess& d, const std::string& seq, uint64_t from) {
    auto client = d.connect();
    auto space = client->open(layout).value();
    EXPECT_TRUE(
        space->put(seq, 0, tokens, kv.data(), kv.size(), PutOptions{.detached = true}).ok());
    auto snap = space->snapshot(seq, from);
    EXPECT_TRUE(snap.ok()) << snap.error().toString();
    return snap.ok() ? *snap : SnapshotInfo{};
  }
  // `seq` on `client`'s daemon holds exactly tokens [0, n) with their KV.
  bool holds(Client& client, const std::string& seq, uint64_t n) {
    auto space = client.open(layout).value();
    auto held = space->get(seq);
    if (!held || held->end() != n) return false;
    std::vector<uint8_t> got(n * layout.tokenKvBytes());
    return held->copyTo(0, n, got.data(), got.size()).ok() &&
           got == synthetic::packedKv(layout, tokens, 0, n);
  }
};

TEST(ClusterSnapshots, ASnapshotRestoresOnAnotherNodeWithIdenticalBytes) {
  Cluster c(nodes(2));
  ASSERT_TRUE(c.formed(2));
  SnapshotCase sc(40, 150);  // 9 full blocks and a partial one
  const SnapshotInfo snap = sc.prefill(c[0], "prefill", 0);
  EXPECT_EQ(snap.node, "n0");
  auto decode = c[1].connect();
  auto space = decode->open(sc.layout).value();
  // A wrong node or id fails typed and changes nothing.
  EXPECT_EQ(space->restore("decode", snap.id + 100, 150, {}, "n0").code(), ErrorCode::kNotFound);
  EXPECT_FALSE(space->restore("decode", snap.id, 150, {}, "nobody").ok());
  EXPECT_FALSE(space->length("decode").value().has_value());
  // Restored whole, and to a shorter target.
  ASSERT_TRUE(space->restore("decode", snap.id, 150, {}, snap.node).ok());
  EXPECT_TRUE(sc.holds(*decode, "decode", 150));
  ASSERT_TRUE(space->restore("short", snap.id, 100, {}, snap.node).ok());
  EXPECT_EQ(space->length("short").value().value_or(0), 100u);
  EXPECT_GT(decode->stats().value().remoteHitBlocks, 0u);
  // The decode node goes on from there: its own put after the restored prefix.
  const auto more = synthetic::tokens(41, 10);
  std::vector<uint32_t> all = sc.tokens;
  all.insert(all.end(), more.begin(), more.end());
  const auto tail = synthetic::packedKv(sc.layout, all, 150, 160);
  EXPECT_TRUE(space->put("decode", 150, more, tail.data(), tail.size()).ok());
  EXPECT_EQ(space->length("decode").value().value_or(0), 160u);
}

TEST(ClusterSnapshots, ASnapshotOnlyOnTheHoldersDiskRestoresElsewhere) {
  std::vector<NodeSpec> specs = nodes(2);
  specs[0].coldTier = true;
  Cluster c(specs);
  ASSERT_TRUE(c.formed(2));
  SnapshotCase sc(42, 120);
  const SnapshotInfo snap = sc.prefill(c[0], "p", 16);
  ASSERT_TRUE(eventually([&] { return c[0].connect()->stats().value().coldSnapshots == 1; },
                         std::chrono::seconds(10)));
  c[0].stop(SIGTERM);  // the snapshot now lives on n0's disk only
  c.start(0);
  ASSERT_TRUE(c.formed(2));
  auto decode = c[1].connect();
  auto space = decode->open(sc.layout).value();
  // The restore needs [0, 16) of its own: put the head first, as a decode worker holding the
  // system prompt would.
  const std::span<const uint32_t> head(sc.tokens.data(), 16);
  const auto headKv = synthetic::packedKv(sc.layout, sc.tokens, 0, 16);
  ASSERT_TRUE(space->put("d", 0, head, headKv.data(), headKv.size()).ok());
  ASSERT_TRUE(space->restore("d", snap.id, 120, {}, "n0").ok());
  EXPECT_TRUE(sc.holds(*decode, "d", 120));
}

TEST(ClusterSnapshots, AHolderKilledDuringARestoreLeavesNothingHalfRestored) {
  std::vector<NodeSpec> specs = nodes(2);
  specs[0].poolBytes = specs[1].poolBytes = 96 << 20;
  Cluster c(specs);
  ASSERT_TRUE(c.formed(2));
  SnapshotCase sc(43, 4000 * 16);  // 4000 blocks: long enough to be killed in the middle
  const SnapshotInfo snap = sc.prefill(c[0], "big", 0);
  auto decode = c[1].connect();
  const Stats before = decode->stats().value();
  std::atomic<bool> done = false;
  Status restored;
  std::thread t([&] {
    auto client = c[1].connect();
    auto space = client->open(sc.layout).value();
    restored = space->restore("big", snap.id, sc.tokens.size(), {}, "n0");
    done = true;
  });
  eventually([&] { return done || decode->stats().value().blocksUsed > before.blocksUsed; },
             std::chrono::seconds(10));
  c[0].stop(SIGKILL);
  t.join();
  auto space = decode->open(sc.layout).value();
  if (restored.ok()) {
    EXPECT_TRUE(sc.holds(*decode, "big", sc.tokens.size()));  // it finished first: whole
  } else {
    EXPECT_FALSE(space->length("big").value().has_value()) << "nothing half-restored";
    const Stats s = waitForStats(*decode, [](const Stats& s) { return s.blocksPinned == 0; });
    EXPECT_EQ(s.snapshots, 0u);
    EXPECT_EQ(s.sequences, 0u);
  }
  expectNoLeakedBlocks(c[1]);
}

TEST(ClusterSnapshots, AMoveDropsTheSourceOnlyOnceTheDestinationHoldsIt) {
  std::vector<NodeSpec> specs = nodes(2);
  specs[1].poolBytes = 1 << 20;  // 64 blocks: too small for the first snapshot
  Cluster c(specs);
  ASSERT_TRUE(c.formed(2));
  SnapshotCase big(44, 100 * 16), small(45, 20 * 16), other(46, 10 * 16);
  const SnapshotInfo tooBig = big.prefill(c[0], "big", 0);
  const SnapshotInfo fits = small.prefill(c[0], "small", 0);
  const SnapshotInfo kept = other.prefill(c[0], "other", 0);
  auto dest = c[1].connect();
  auto destSpace = dest->open(big.layout).value();
  auto source = c[0].connect();
  auto sourceSpace = source->open(big.layout).value();
  // The destination cannot hold it: the move fails and the source keeps its snapshot.
  EXPECT_FALSE(destSpace->copySnapshot("n0", tooBig.id, /*move=*/true).ok());
  EXPECT_TRUE(sourceSpace->snapshotInfo(tooBig.id).ok());
  EXPECT_EQ(dest->stats().value().snapshots, 0u);
  // One that fits moves: the destination holds it under an id of its own, the source no more.
  auto moved = destSpace->copySnapshot("n0", fits.id, /*move=*/true);
  ASSERT_TRUE(moved.ok()) << moved.error().toString();
  EXPECT_EQ(moved->node, "n1");
  EXPECT_EQ(moved->to, 20u * 16);
  EXPECT_EQ(sourceSpace->snapshotInfo(fits.id).code(), ErrorCode::kNotFound);
  ASSERT_TRUE(destSpace->restore("r", moved->id, moved->to).ok());
  EXPECT_TRUE(small.holds(*dest, "r", 20 * 16));
  // A copy leaves the source's.
  auto copied = destSpace->copySnapshot("n0", kept.id, /*move=*/false);
  ASSERT_TRUE(copied.ok()) << copied.error().toString();
  EXPECT_TRUE(sourceSpace->snapshotInfo(kept.id).ok());
  EXPECT_NE(copied->id, moved->id);
}

TEST(ClusterDrain, ADrainInterruptedAndRunAgainHandsEverythingOver) {
  Cluster c(nodes(3));
  ASSERT_TRUE(c.formed(3));
  SnapshotCase a(50, 64), b(51, 80), d(52, 96);
  const SnapshotInfo sa = a.prefill(c[0], "a", 0), sb = b.prefill(c[0], "b", 16),
                     sd = d.prefill(c[0], "d", 0);
  putPrompt(c[0], "doc", 53, 100 * 16);  // 100 blocks
  auto node0 = c[0].connect();
  // A first step, cut short (as if the tool was interrupted after it).
  auto step = node0->drain(1, 20);
  ASSERT_TRUE(step.ok()) << step.error().toString();
  EXPECT_EQ(step->snapshotsMoved, 1u);
  EXPECT_EQ(step->snapshotsLeft, 2u);
  EXPECT_EQ(step->blocksCopied, 20u);
  EXPECT_GT(step->blocksLeft, 0u);
  // The tool, run again, finishes the job.
  std::string out;
  ASSERT_EQ(runTool({"--socket", c[0].socket(), "drain"}, &out), 0) << out;
  EXPECT_NE(out.find("\"left\": 0"), std::string::npos) << out;
  EXPECT_EQ(node0->stats().value().snapshots, 0u);
  uint64_t elsewhere = 0;
  for (size_t i : {1, 2}) elsewhere += c[i].connect()->stats().value().snapshots;
  EXPECT_EQ(elsewhere, 3u);
  // Run once more: nothing left, nothing done.
  auto again = node0->drain(16, 1024);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->snapshotsLeft + again->blocksLeft, 0u);
  EXPECT_EQ(again->snapshotsMoved + again->blocksCopied, 0u);
  // Node 0 goes for maintenance; every block is still served by the others.
  c[0].stop(SIGTERM);
  ASSERT_TRUE(c.formed(2));
  ASSERT_TRUE(c.published(1));  // the keys n0 was home for, re-homed
  ASSERT_TRUE(c.published(2));
  auto client = c[1].connect();
  const Hit hit = lookupPrompt(*client, 53, 100 * 16);
  EXPECT_EQ(hit.matched, 100u * 16);
  EXPECT_TRUE(hit.identical);
  (void)sa;
  (void)sb;
  (void)sd;
}

// --- blocks copied and moved to another node (Mooncake's copy and move)

// No block pinned or leased once every handle is released (sequences may hold blocks).
void expectNothingPinned(DaemonProcess& d) {
  auto client = d.connect();
  const Stats s = waitForStats(*client, [](const Stats& s) { return s.blocksPinned == 0; });
  EXPECT_EQ(s.blocksPinned, 0u);
  EXPECT_EQ(s.writeLeases, 0u);
}

// `seq` on `d`: tokens(seed, n) with their KV, detached (it outlives the call's session).
std::vector<uint32_t> putDetached(DaemonProcess& d, const std::string& seq, uint64_t seed, size_t n,
                                  std::vector<Key128> keys = {}) {
  const Layout layout = testLayout();
  auto client = d.connect();
  auto space = client->open(layout).value();
  const auto t = synthetic::tokens(seed, n);
  const auto kv = synthetic::packedKv(layout, t, 0, n);
  const auto put = space->put(seq, 0, t, kv.data(), kv.size(),
                              PutOptions{.detached = true, .keys = std::move(keys)});
  EXPECT_TRUE(put.ok()) << put.error().toString();
  return t;
}

TEST(ClusterCopy, ARangeCopiedToAnotherNodeIsALocalHitThereWithIdenticalBytes) {
  Cluster c(nodes(2));
  ASSERT_TRUE(c.formed(2));
  putDetached(c[0], "req", 60, 150);  // 9 full blocks and a partial one
  auto source = c[0].connect();
  auto space = source->open(testLayout()).value();
  // Bad input fails typed and changes nothing.
  EXPECT_EQ(space->copyRange("n0", "req").code(), ErrorCode::kInvalidArgument);  // itself
  EXPECT_EQ(space->copyRange("nobody", "req").code(), ErrorCode::kUnavailable);
  EXPECT_EQ(space->copyRange("n1", "absent").code(), ErrorCode::kNotFound);
  EXPECT_EQ(space->copyRange("n1", "req", 100, 50).code(), ErrorCode::kInvalidArgument);
  // A move cannot take the unfilled last block: refused before anything moves.
  EXPECT_EQ(space->copyRange("n1", "req", 0, kEndPosition, true).code(),
            ErrorCode::kInvalidArgument);
  auto dest = c[1].connect();
  EXPECT_EQ(lookupPrompt(*dest, 60, 150, RemoteMode::kLocal).matched, 0u);
  // A copy of blocks [2, 9) (positions 40..150: the partial block is skipped).
  auto copied = space->copyRange("n1", "req", 40);
  ASSERT_TRUE(copied.ok()) << copied.error().toString();
  EXPECT_EQ(copied->blocks, 7u);
  EXPECT_EQ(copied->held, 7u);
  EXPECT_EQ(copied->dropped, 0u);
  // n1 holds them but not the head: a local lookup there stops at block 0.
  EXPECT_EQ(lookupPrompt(*dest, 60, 150, RemoteMode::kLocal).matched, 0u);
  auto head = space->copyRange("n1", "req", 0, 32);
  ASSERT_TRUE(head.ok()) << head.error().toString();
  EXPECT_EQ(head->held, 2u);
  const Hit hit = lookupPrompt(*dest, 60, 150, RemoteMode::kLocal);
  EXPECT_EQ(hit.matched, 144u);
  EXPECT_TRUE(hit.identical);
  EXPECT_EQ(space->length("req").value().value_or(0), 150u);  // a copy leaves the source whole
  expectNothingPinned(c[0]);
  expectNothingPinned(c[1]);
}

TEST(ClusterCopy, AMoveLetsGoOfTheSourceOnlyOnceTheDestinationHoldsEverything) {
  std::vector<NodeSpec> specs = nodes(2);
  specs[1].poolBytes = 1 << 20;  // 64 blocks
  Cluster c(specs);
  ASSERT_TRUE(c.formed(2));
  putDetached(c[0], "big", 61, 100 * 16);
  putDetached(c[0], "small", 62, 20 * 16);
  auto source = c[0].connect();
  auto space = source->open(testLayout()).value();
  // The destination cannot hold 100 blocks: the move fails and the source keeps everything.
  auto tooBig = space->copyRange("n1", "big", 0, kEndPosition, true);
  EXPECT_EQ(tooBig.code(), ErrorCode::kUnavailable) << tooBig.error().toString();
  EXPECT_EQ(space->length("big").value().value_or(0), 100u * 16);
  Hit kept = lookupPrompt(*source, 61, 100 * 16, RemoteMode::kLocal);
  EXPECT_EQ(kept.matched, 100u * 16);
  EXPECT_TRUE(kept.identical);
  // One that fits moves: the destination holds it, the source neither in its sequence nor in
  // its cache.
  auto moved = space->copyRange("n1", "small", 0, kEndPosition, true);
  ASSERT_TRUE(moved.ok()) << moved.error().toString();
  EXPECT_EQ(moved->blocks, 20u);
  EXPECT_EQ(moved->held, 20u);
  EXPECT_EQ(moved->dropped, 20u);
  EXPECT_EQ(space->length("small").value().value_or(0), 0u);
  EXPECT_EQ(lookupPrompt(*source, 62, 20 * 16, RemoteMode::kLocal).matched, 0u);
  auto dest = c[1].connect();
  const Hit there = lookupPrompt(*dest, 62, 20 * 16, RemoteMode::kLocal);
  EXPECT_EQ(there.matched, 20u * 16);
  EXPECT_TRUE(there.identical);
  // And the cluster still serves it to the source, from its new holder.
  ASSERT_TRUE(c.published(1));
  const Hit back = lookupPrompt(*source, 62, 20 * 16);
  EXPECT_EQ(back.matched, 20u * 16);
  EXPECT_TRUE(back.identical);
  expectNothingPinned(c[0]);
  expectNoLeakedBlocks(c[1]);
}

TEST(ClusterCopy, KeyedBlocksMoveFromMemoryAndDiskAndAreGoneFromBoth) {
  std::vector<NodeSpec> specs = nodes(2);
  specs[0].coldTier = true;
  Cluster c(specs);
  ASSERT_TRUE(c.formed(2));
  std::vector<Key128> keys;
  for (uint8_t i = 0; i < 12; ++i) keys.push_back(contentKey(&i, 1));
  const auto tokens = putDetached(c[0], "keyed", 63, 12 * 16, keys);
  // Written to disk at shutdown, then the daemon restarted: the blocks are on n0's disk only.
  c[0].stop(SIGTERM);
  c.start(0);
  ASSERT_TRUE(c.formed(2));
  auto source = c[0].connect();
  ASSERT_EQ(source->stats().value().coldRecords, 12u);
  auto space = source->open(testLayout()).value();
  const std::span<const Key128> firstSix(keys.data(), 6);
  auto copied = space->copyKeys("n1", firstSix);
  ASSERT_TRUE(copied.ok()) << copied.error().toString();
  EXPECT_EQ(copied->held, 6u);
  auto moved = space->copyKeys("n1", keys, /*move=*/true);
  ASSERT_TRUE(moved.ok()) << moved.error().toString();
  EXPECT_EQ(moved->blocks, 12u);
  EXPECT_EQ(moved->held, 12u);
  EXPECT_EQ(moved->dropped, 12u);
  // The source holds none of them, in memory or on disk (after another restart as well).
  auto local = [&](Client& client) {
    auto sp = client.open(testLayout()).value();
    auto hit = sp->lookupKeys(keys, LookupOptions{.remote = RemoteMode::kLocal});
    return hit.ok() ? hit->matchedTokens() : 0;
  };
  EXPECT_EQ(local(*source), 0u);
  space.reset();
  source.reset();
  c[0].stop(SIGTERM);
  c.start(0);
  ASSERT_TRUE(c.formed(2));
  auto restarted = c[0].connect();
  EXPECT_EQ(local(*restarted), 0u);
  EXPECT_EQ(restarted->stats().value().coldRecords, 0u);
  // The destination serves them, byte for byte.
  auto dest = c[1].connect();
  auto destSpace = dest->open(testLayout()).value();
  auto hit = destSpace->lookupKeys(keys, LookupOptions{.remote = RemoteMode::kLocal});
  ASSERT_TRUE(hit.ok());
  ASSERT_EQ(hit->matchedTokens(), 12u * 16);
  std::vector<uint8_t> got(12 * 16 * testLayout().tokenKvBytes());
  ASSERT_TRUE(hit->copyTo(0, 12 * 16, got.data(), got.size()).ok());
  EXPECT_EQ(got, synthetic::packedKv(testLayout(), tokens, 0, 12 * 16));
}

TEST(ClusterCopy, ThePromptFormAndTheCliCopyToAnotherNode) {
  Cluster c(nodes(2));
  ASSERT_TRUE(c.formed(2));
  putPrompt(c[0], "p", 64, 64);  // released with its session: 4 cached blocks
  auto source = c[0].connect();
  auto space = source->open(testLayout()).value();
  const auto t = synthetic::tokens(64, 64);
  auto copied = space->copyPrompt("n1", t);
  ASSERT_TRUE(copied.ok()) << copied.error().toString();
  EXPECT_EQ(copied->held, 4u);
  auto dest = c[1].connect();
  EXPECT_EQ(lookupPrompt(*dest, 64, 64, RemoteMode::kLocal).matched, 64u);
  // The CLI: a range of a detached sequence, then a move of it.
  putDetached(c[0], "cli", 65, 48);
  const std::string layout = "test/tiny:4:2:32:f16:16";
  std::string out;
  ASSERT_EQ(
      runTool({"--socket", c[0].socket(), "--layout", layout, "copy-range", "n1", "cli"}, &out), 0)
      << out;
  EXPECT_NE(out.find("\"held\": 3"), std::string::npos) << out;
  ASSERT_EQ(
      runTool({"--socket", c[0].socket(), "--layout", layout, "move-range", "n1", "cli"}, &out), 0)
      << out;
  EXPECT_NE(out.find("\"dropped\": 3"), std::string::npos) << out;
  EXPECT_EQ(space->length("cli").value().value_or(0), 0u);
  EXPECT_NE(runTool({"--socket", c[0].socket(), "--layout", layout, "copy-keys", "n1", "zz"}, &out),
            0);
}

}  // namespace
}  // namespace kvtier::test
