// Cold tier with real kvtierd processes: spill past memory, promote on lookup, keep the cache and
// the snapshots across restarts (graceful and SIGKILL), and never serve a corrupt record.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>

#include <algorithm>
#include <optional>

#include "daemon/cold_tier.h"
#include "tests/test_support.h"
#include "tools/synthetic_kv.h"

namespace kvtier {
namespace {

using test::DaemonProcess;
using test::testLayout;

constexpr uint64_t kBlockBytes = 16 << 10;  // testLayout()'s block
constexpr uint64_t kPromptTokens = 64;      // 4 blocks

std::vector<std::string> coldOn() { return {"--cold-tier", "on"}; }

std::vector<uint32_t> prompt(uint64_t i) { return synthetic::tokens(1000 + i, kPromptTokens); }

// Puts prompt i and drops its sequence: its sealed blocks stay cached, held by nothing.
void putPrompt(Space& space, uint64_t i) {
  const auto t = prompt(i);
  const auto kv = synthetic::packedKv(testLayout(), t, 0, t.size());
  auto r = space.put("p", 0, t, kv.data(), kv.size());
  ASSERT_TRUE(r.ok()) << "prompt " << i << ": " << r.error();
  ASSERT_TRUE(space.remove("p", 0).ok());
}

// Looks prompt i up; returns the tokens matched, after checking their bytes are the right ones.
uint64_t matchedWithRightBytes(Space& space, uint64_t i) {
  const auto t = prompt(i);
  auto hit = space.lookup(t);
  EXPECT_TRUE(hit.ok()) << hit.error();
  if (!hit) return 0;
  const uint64_t n = hit->matchedTokens();
  std::vector<uint8_t> got(n * testLayout().tokenKvBytes());
  EXPECT_TRUE(hit->copyTo(0, n, got.data(), got.size()).ok());
  EXPECT_EQ(got, synthetic::packedKv(testLayout(), t, 0, n)) << "wrong bytes for prompt " << i;
  EXPECT_EQ(n % testLayout().blockTokens, 0u);
  return n;
}

TEST(ColdIntegration, FillingFarPastMemoryEveryPrefixStillHitsFromDisk) {
  DaemonProcess daemon(16 * kBlockBytes, "", coldOn());  // 16 blocks of memory
  auto client = daemon.connect();
  auto space = client->open(testLayout()).value();
  constexpr uint64_t kPrompts = 30;  // 120 blocks: 7.5x the pool
  for (uint64_t i = 0; i < kPrompts; ++i) putPrompt(*space, i);
  for (uint64_t i = 0; i < kPrompts; ++i) {
    EXPECT_EQ(matchedWithRightBytes(*space, i), kPromptTokens) << "prompt " << i;
  }
  const Stats s = client->stats().value();
  EXPECT_GE(s.spilled, kPrompts * 4 - 16);
  EXPECT_GT(s.promoted, 0u);
  EXPECT_EQ(s.corruptDropped, 0u);
  EXPECT_EQ(s.evictedUnspilled, 0u);
}

// A prompt read back from disk and then used again and again stays in memory: its record is
// never read again and becomes the oldest on disk. Over --disk-bytes, records of blocks held only
// on disk go first, so that when the prompt is finally evicted, its record is still there.
TEST(ColdIntegration, ABlockHotInMemoryKeepsItsDiskRecordUnderTheBound) {
  // 16 blocks of memory (LRU order), 24 of disk; prompts of 4 blocks. Each put waits until every
  // block written is on disk: eviction then follows the LRU order alone (it drops only blocks
  // with a record).
  DaemonProcess daemon(
      16 * kBlockBytes, "",
      {"--cold-tier", "on", "--disk-bytes", std::to_string(24 * kBlockBytes), "--eviction", "lru"});
  auto client = daemon.connect();
  auto space = client->open(testLayout()).value();
  uint64_t written = 0;
  auto putAndSpill = [&](uint64_t i) {
    putPrompt(*space, i);
    written += kPromptTokens / testLayout().blockTokens;
    test::waitForStats(*client, [&](const Stats& s) { return s.spilled >= written; });
  };
  constexpr uint64_t kHot = 0;
  for (uint64_t i = 0; i <= 5; ++i) putAndSpill(i);  // the hot prompt is evicted; 24 on disk
  EXPECT_EQ(matchedWithRightBytes(*space, kHot), kPromptTokens);
  ASSERT_EQ(client->stats().value().promoted, 4u) << "read back from disk";
  for (uint64_t i = 6; i <= 13; ++i) {
    // In use while other prompts come and go: the disk goes over its bound several times, and
    // the hot prompt's record, read at the start, is the oldest there.
    EXPECT_EQ(matchedWithRightBytes(*space, kHot), kPromptTokens) << "before " << i;
    putAndSpill(i);
  }
  ASSERT_EQ(client->stats().value().promoted, 4u) << "the hot prompt stayed in memory";
  for (uint64_t i = 14; i <= 17; ++i) putAndSpill(i);  // not used: evicted at last
  EXPECT_EQ(matchedWithRightBytes(*space, kHot), kPromptTokens)
      << "its record went while it was in memory";
  const Stats s = client->stats().value();
  EXPECT_EQ(s.promoted, 8u) << "read back from disk again";
  EXPECT_GT(s.coldEvicted, 0u);
  EXPECT_LE(s.coldBytes, 24 * kBlockBytes);
  EXPECT_EQ(s.evictedUnspilled, 0u);
}

// A block's record carries the checksum its writer took, not one taken at spill: bytes that
// changed in the pool between the put and the spill (a stray write, bad memory) fail the check
// when the block comes back from disk — a miss, counted, never the changed bytes.
TEST(ColdIntegration, BytesChangedInThePoolBeforeTheSpillMissWhenPromoted) {
  DaemonProcess daemon(16 * kBlockBytes, "", coldOn());
  auto client = daemon.connect();
  auto space = client->open(testLayout()).value();
  const auto t = prompt(0);
  const auto kv = synthetic::packedKv(testLayout(), t, 0, t.size());
  ASSERT_TRUE(space->put("p", 0, t, kv.data(), kv.size()).ok());
  {
    // Held by the sequence, the blocks are not spilled yet: change block 1 in place.
    auto held = space->get("p", 0, kPromptTokens);
    ASSERT_TRUE(held.ok());
    const_cast<uint8_t*>(held->block(1).data())[100] ^= 0x01;  // the SDK maps the pool read-write
  }
  ASSERT_TRUE(space->remove("p", 0).ok());
  for (uint64_t i = 1; i < 30; ++i) putPrompt(*space, i);  // prompt 0 leaves memory
  EXPECT_EQ(matchedWithRightBytes(*space, 0), testLayout().blockTokens);
  const Stats s = client->stats().value();
  EXPECT_EQ(s.corruptDropped, 1u);
  // The bad record is gone: asked again, the same miss, without another corrupt read.
  EXPECT_EQ(matchedWithRightBytes(*space, 0), testLayout().blockTokens);
  EXPECT_EQ(client->stats().value().corruptDropped, 1u);
}

// A writer handed block 1 of its grant (WriteHandle::block) writes the whole grant with write(),
// then puts block 1's final bytes through the view: the commit's checksum is of those, so block 1
// is spilled and promoted whole (a checksum of write()'s bytes would drop it as corrupt).
TEST(ColdIntegration, BytesPutThroughAHandedOutBlockAfterAWriteAreTheOnesChecked) {
  DaemonProcess daemon(16 * kBlockBytes, "", coldOn());
  auto client = daemon.connect();
  auto space = client->open(testLayout()).value();
  ASSERT_TRUE(client->mapped()) << "the test writes through the pool";
  const Layout layout = testLayout();
  const uint32_t bt = layout.blockTokens;
  const auto t = prompt(0);
  auto h = space->beginPut("p", 0, t);
  ASSERT_TRUE(h.ok()) << h.error();
  const std::span<uint8_t> view = h->block(1);
  const auto other = synthetic::packedKv(layout, prompt(7), 0, t.size());
  ASSERT_TRUE(h->write(0, t.size(), other.data(), other.size()).ok());  // not the prompt's bytes
  const auto head = synthetic::packedKv(layout, t, 0, bt);
  const auto tail = synthetic::packedKv(layout, t, 2 * bt, t.size());
  ASSERT_TRUE(h->write(0, bt, head.data(), head.size()).ok());
  ASSERT_TRUE(h->write(2 * bt, t.size(), tail.data(), tail.size()).ok());
  const auto block1 = synthetic::packedKv(layout, t, bt, 2 * bt);
  for (uint32_t lkv = 0; lkv < 2 * layout.numLayers; ++lkv) {
    for (uint32_t slot = 0; slot < bt; ++slot) {
      std::memcpy(view.data() + layout.slotOffset(lkv / 2, lkv % 2, slot),
                  block1.data() + (uint64_t{lkv} * bt + slot) * layout.tokenBytes(),
                  layout.tokenBytes());
    }
  }
  ASSERT_TRUE(h->commit().ok());
  ASSERT_TRUE(space->remove("p", 0).ok());
  for (uint64_t i = 1; i < 30; ++i) putPrompt(*space, i);  // prompt 0 leaves memory
  EXPECT_EQ(matchedWithRightBytes(*space, 0), t.size());
  EXPECT_EQ(client->stats().value().corruptDropped, 0u);
}

// A batch of puts far past memory: the daemon grants an item only once the spiller has made room,
// while the client's commit of the item before is answered first — putMany waits for each answer
// by its id. Every item is stored, with its bytes, and the earlier ones hit from disk.
TEST(ColdIntegration, PutManyFarPastMemoryWaitsForRoomAndStoresEveryItem) {
  DaemonProcess daemon(24 * kBlockBytes, "", coldOn());  // 24 blocks of memory
  auto client = daemon.connect();
  auto space = client->open(testLayout()).value();
  constexpr uint64_t kPrompts = 30;  // 120 blocks: 5x the pool
  const std::string names[] = {"a", "b", "c"};
  std::vector<std::vector<uint32_t>> tokens;
  std::vector<std::vector<uint8_t>> kv;
  std::vector<PutItem> items;
  for (uint64_t i = 0; i < kPrompts; ++i) {
    tokens.push_back(prompt(i));
    kv.push_back(synthetic::packedKv(testLayout(), tokens[i], 0, kPromptTokens));
  }
  for (uint64_t i = 0; i < kPrompts; ++i) {
    // Each item replaces the sequence's contents of three items before: those blocks stay cached,
    // and may go once on disk.
    items.push_back({names[i % 3], 0, tokens[i], kv[i].data(), kv[i].size()});
  }
  const uint64_t lanePuts = client->stats().value().lanePuts;
  auto results = space->putMany(items);
  ASSERT_EQ(results.size(), kPrompts);
  for (uint64_t i = 0; i < kPrompts; ++i) {
    ASSERT_TRUE(results[i].ok()) << "item " << i << ": " << results[i].error();
    EXPECT_EQ(results[i]->length, kPromptTokens);
  }
  const Stats s = client->stats().value();
  EXPECT_EQ(s.lanePuts, lanePuts + kPrompts);
  EXPECT_GT(s.spilled, 0u);
  EXPECT_EQ(s.writeLeases, 0u);
  for (uint64_t i = kPrompts - 3; i < kPrompts; ++i) {
    auto held = space->get(names[i % 3]).value();
    std::vector<uint8_t> got(kPromptTokens * testLayout().tokenKvBytes());
    ASSERT_TRUE(held.copyTo(0, kPromptTokens, got.data(), got.size()).ok());
    EXPECT_EQ(got, kv[i]) << "sequence " << names[i % 3];
  }
  for (uint64_t i = 0; i < kPrompts; ++i) {
    EXPECT_EQ(matchedWithRightBytes(*space, i), kPromptTokens) << "prompt " << i;
  }
}

TEST(ColdIntegration, GracefulRestartServesEverythingWrittenBefore) {
  std::string dataDir;
  {
    DaemonProcess first(16 * kBlockBytes, "", coldOn());
    dataDir = first.dataDir();
    auto client = first.connect();
    auto space = client->open(testLayout()).value();
    for (uint64_t i = 0; i < 10; ++i) putPrompt(*space, i);
    // One prompt still held by a live detached sequence: flushed at shutdown.
    const auto t = prompt(99);
    const auto kv = synthetic::packedKv(testLayout(), t, 0, t.size());
    ASSERT_TRUE(space->put("held", 0, t, kv.data(), kv.size(), {.detached = true}).ok());
    space.reset();
    client.reset();
    const int status = first.stop(SIGTERM);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  DaemonProcess second(16 * kBlockBytes, dataDir, coldOn());
  auto client = second.connect();
  auto space = client->open(testLayout()).value();
  for (uint64_t i = 0; i < 10; ++i) EXPECT_EQ(matchedWithRightBytes(*space, i), kPromptTokens);
  EXPECT_EQ(matchedWithRightBytes(*space, 99), kPromptTokens);
}

TEST(ColdIntegration, SigkillWhileSpillingLeavesHitsOrMissesNeverWrongBytes) {
  std::string dataDir;
  {
    DaemonProcess first(16 * kBlockBytes, "", coldOn());
    dataDir = first.dataDir();
    auto client = first.connect();
    auto space = client->open(testLayout()).value();
    for (uint64_t i = 0; i < 20; ++i) putPrompt(*space, i);
    // Killed with spill batches likely still in flight and blocks only in memory.
    first.stop(SIGKILL);
  }
  DaemonProcess second(16 * kBlockBytes, dataDir, coldOn());
  auto client = second.connect();
  auto space = client->open(testLayout()).value();
  uint64_t hits = 0;
  for (uint64_t i = 0; i < 20; ++i) hits += matchedWithRightBytes(*space, i) > 0;
  // The pool could not hold them all, so most had to be on disk before the kill.
  EXPECT_GE(hits, 10u);
}

TEST(ColdIntegration, CorruptRecordsOnDiskMissAndAreCounted) {
  std::string dataDir;
  {
    DaemonProcess first(16 * kBlockBytes, "", coldOn());
    dataDir = first.dataDir();
    auto client = first.connect();
    auto space = client->open(testLayout()).value();
    for (uint64_t i = 0; i < 6; ++i) putPrompt(*space, i);
    space.reset();
    client.reset();
    ASSERT_EQ(first.stop(SIGTERM), 0);
  }
  // Flip one payload byte in half of the records, through RocksDB itself.
  uint64_t flipped = 0;
  {
    auto tier =
        ColdTier::open({.path = dataDir + "/cold", .capacityBytes = 0, .fileSystem = nullptr})
            .value();
    auto* db = tier->rawDb();
    std::unique_ptr<rocksdb::Iterator> it(
        db->NewIterator(rocksdb::ReadOptions(), tier->blocksFamily()));
    std::vector<std::pair<std::string, std::string>> edits;
    uint64_t n = 0;
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      if (it->key().size() != 40) continue;  // a size entry (cold_tier.cc), not a record
      if (n++ % 2 != 0) continue;
      std::string value = it->value().ToString();
      value[value.size() - 1] ^= 0x40;
      edits.emplace_back(it->key().ToString(), std::move(value));
    }
    it.reset();
    for (const auto& [k, v] : edits) {
      ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), tier->blocksFamily(), k, v).ok());
    }
    flipped = edits.size();
    ASSERT_GT(flipped, 0u);
  }
  DaemonProcess second(16 * kBlockBytes, dataDir, coldOn());
  auto client = second.connect();
  auto space = client->open(testLayout()).value();
  uint64_t full = 0;
  for (uint64_t i = 0; i < 6; ++i) full += matchedWithRightBytes(*space, i) == kPromptTokens;
  EXPECT_LT(full, 6u) << "some prompts lost a block to corruption";
  const Stats s = client->stats().value();
  EXPECT_GT(s.corruptDropped, 0u);
  EXPECT_LE(s.corruptDropped, flipped);
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

TEST(ColdIntegration, KvtierStatsPrintsTheCountersAsJson) {
  DaemonProcess daemon(16 * kBlockBytes, "", coldOn());
  {
    auto client = daemon.connect();
    auto space = client->open(testLayout()).value();
    for (uint64_t i = 0; i < 8; ++i) putPrompt(*space, i);  // 32 blocks through 16: spills
    EXPECT_EQ(matchedWithRightBytes(*space, 0), kPromptTokens);
  }
  std::string out;
  ASSERT_EQ(test::runTool({"--socket", daemon.socket(), "stats"}, &out), 0) << out;
  for (const char* key :
       {"\"blocks\": {\"total\": 16",
        "\"used\":", "\"pinned\":", "\"hits\":", "\"misses\":", "\"evictions\":", "\"clients\": 1",
        "\"bytes\":", "\"cold\": {\"spilled\":", "\"promoted\":", "\"corrupt_dropped\": 0",
        "\"spill_errors\": 0"}) {
    EXPECT_NE(out.find(key), std::string::npos) << key << " missing from: " << out;
  }
  EXPECT_EQ(out.find("\"spilled\": 0,"), std::string::npos) << out;
  // What the spilled records take on disk: there, and at least their bytes.
  const auto number = [&](const std::string& key) {
    const size_t at = out.find("\"" + key + "\": ", out.find("\"cold\""));
    EXPECT_NE(at, std::string::npos) << key << " missing from: " << out;
    return at == std::string::npos ? 0 : std::stoull(out.substr(at + key.size() + 4));
  };
  EXPECT_GT(number("bytes"), 0u);
  EXPECT_GE(number("disk_bytes"), number("bytes"));
  // A daemon that is not there: a clear error and a non-zero exit.
  EXPECT_NE(test::runTool({"--socket", "/tmp/kvtier-nothing-here.sock", "stats"}, &out), 0);
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

using test::httpGet;

TEST(ColdIntegration, MetricsEndpointServesPrometheusText) {
  DaemonProcess daemon(16 * kBlockBytes, "",
                       {"--cold-tier", "on", "--metrics-addr", "127.0.0.1:0"});
  ASSERT_NE(daemon.metricsAddr(), "off");
  {
    auto client = daemon.connect();
    auto space = client->open(testLayout()).value();
    for (uint64_t i = 0; i < 8; ++i) putPrompt(*space, i);
    EXPECT_EQ(matchedWithRightBytes(*space, 0), kPromptTokens);
  }
  const std::string page = httpGet(daemon.metricsAddr(), "/metrics");
  ASSERT_NE(page.find("200 OK"), std::string::npos) << page;
  for (const char* line :
       {"# TYPE kvtier_blocks_total gauge", "kvtier_blocks_total 16",
        "# TYPE kvtier_spilled_blocks_total counter", "kvtier_cold_records ",
        "# TYPE kvtier_cold_disk_bytes gauge", "kvtier_cold_corrupt_dropped_total 0",
        "kvtier_promoted_blocks_total ", "# TYPE kvtier_eviction_following gauge",
        "\nkvtier_eviction_following{policy=\"adaptive\",following=\"",
        "# TYPE kvtier_eviction_switches_total counter", "\nkvtier_eviction_switches_total "}) {
    EXPECT_NE(page.find(line), std::string::npos) << line << " missing from:\n" << page;
  }
  EXPECT_NE(httpGet(daemon.metricsAddr(), "/other").find("404"), std::string::npos);
}

}  // namespace
}  // namespace kvtier

// ---------------------------------------------------------------------------------------------
// Snapshots across restarts: their manifests and the blocks they need are on disk (write-behind,
// and flushed on SIGTERM), restores after a restart serve the same bytes, ids stay unique, and a
// snapshot whose manifest or records are damaged or gone fails cleanly.

namespace kvtier {
namespace {

constexpr uint64_t kSnapPool = 64 * kBlockBytes;

std::vector<uint32_t> chatTokens() { return synthetic::tokens(7, 40); }  // 2 blocks + 8 tokens
std::vector<uint32_t> recurrentTokens() { return synthetic::tokens(8, 24); }

std::vector<uint32_t> chatPrefix(uint64_t n) {
  const auto t = chatTokens();
  return std::vector<uint32_t>(t.begin(), t.begin() + static_cast<ptrdiff_t>(n));
}

std::vector<uint8_t> stateBytes() {
  std::vector<uint8_t> v(3000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 13 + 5);
  return v;
}

void putAll(Space& space, std::string_view seq, const std::vector<uint32_t>& t) {
  const auto kv = synthetic::packedKv(testLayout(), t, 0, t.size());
  auto r = space.put(seq, 0, t, kv.data(), kv.size(), {.detached = true});
  ASSERT_TRUE(r.ok()) << seq << ": " << r.error();
}

// The packed KV of [0, length) of seq; empty if it cannot be read.
std::vector<uint8_t> bytesOf(Space& space, std::string_view seq) {
  auto g = space.get(seq);
  if (!g) {
    ADD_FAILURE() << "get " << seq << ": " << g.error();
    return {};
  }
  std::vector<uint8_t> out(g->end() * testLayout().tokenKvBytes());
  EXPECT_TRUE(g->copyTo(0, g->end(), out.data(), out.size()).ok());
  return out;
}

std::vector<uint8_t> kvOf(const std::vector<uint32_t>& t) {
  return synthetic::packedKv(testLayout(), t, 0, t.size());
}

struct Taken {
  SnapshotInfo whole, tail, recurrent;
};

// Three snapshots: of a sequence ending in a partial block, of its tail from inside a block, and
// of a recurrent sequence with a state checkpoint.
Taken takeSnapshots(Space& space) {
  Taken t;
  putAll(space, "chat", chatTokens());
  putAll(space, "rec", recurrentTokens());
  const auto state = stateBytes();
  EXPECT_TRUE(space.putCheckpoint("rec", 24, state.data(), state.size()).ok());
  t.whole = space.snapshot("chat", 0).value();
  t.tail = space.snapshot("chat", 20).value();
  t.recurrent = space.snapshot("rec", 0).value();
  EXPECT_EQ(t.recurrent.checkpoints, std::vector<uint64_t>{24});
  return t;
}

// Restores the three after a restart, from a client that never saw them, and checks the bytes.
void expectRestored(Space& space, const Taken& t) {
  ASSERT_TRUE(space.restore("r1", t.whole.id, 40).ok());
  EXPECT_EQ(bytesOf(space, "r1"), kvOf(chatTokens())) << "whole snapshot";

  auto info = space.snapshotInfo(t.tail.id);
  ASSERT_TRUE(info.ok()) << info.error();
  EXPECT_EQ(info->from, 20u);
  EXPECT_EQ(info->to, 40u);
  const auto prefix = chatPrefix(20);
  putAll(space, "r2", prefix);
  ASSERT_TRUE(space.restore("r2", t.tail.id, 40).ok());
  EXPECT_EQ(bytesOf(space, "r2"), kvOf(chatTokens())) << "tail snapshot onto its prefix";

  auto restored = space.restore("r3", t.recurrent.id, 24);
  ASSERT_TRUE(restored.ok()) << restored.error();
  EXPECT_EQ(bytesOf(space, "r3"), kvOf(recurrentTokens()));
  auto cp = space.getCheckpoint("r3", 24);
  ASSERT_TRUE(cp.ok()) << cp.error();
  EXPECT_EQ(std::vector<uint8_t>(cp->data().begin(), cp->data().end()), stateBytes());
}

TEST(ColdIntegration, SnapshotsSurviveAGracefulRestart) {
  std::string dataDir;
  Taken taken;
  {
    DaemonProcess first(kSnapPool, "", coldOn());
    dataDir = first.dataDir();
    auto client = first.connect();
    auto space = client->open(testLayout()).value();
    taken = takeSnapshots(*space);
    // The bytes as served before the restart: the restore after must give the same.
    ASSERT_TRUE(space->restore("before", taken.whole.id, 40).ok());
    ASSERT_EQ(bytesOf(*space, "before"), kvOf(chatTokens()));
    space.reset();
    client.reset();
    const int status = first.stop(SIGTERM);  // --flush-on-exit is on by default
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  DaemonProcess second(kSnapPool, dataDir, coldOn());
  auto client = second.connect();
  EXPECT_EQ(client->stats().value().coldSnapshots, 3u);
  auto space = client->open(testLayout()).value();
  expectRestored(*space, taken);
  // A split and a merge of a snapshot from before the restart.
  auto halves = space->splitSnapshot(taken.whole.id, 25);
  ASSERT_TRUE(halves.ok()) << halves.error();
  auto merged = space->mergeSnapshots(halves->first.id, halves->second.id);
  ASSERT_TRUE(merged.ok()) << merged.error();
  ASSERT_TRUE(space->restore("r4", merged->id, 40).ok());
  EXPECT_EQ(bytesOf(*space, "r4"), kvOf(chatTokens()));
  // New ids differ from every id handed out before the restart.
  for (uint64_t id : {halves->first.id, halves->second.id, merged->id}) {
    EXPECT_GT(id, std::max({taken.whole.id, taken.tail.id, taken.recurrent.id}));
  }
  // Dropped after the restart: gone from disk too.
  ASSERT_TRUE(space->dropSnapshot(taken.tail.id).ok());
  EXPECT_EQ(space->snapshotInfo(taken.tail.id).code(), ErrorCode::kNotFound);
  EXPECT_EQ(space->dropSnapshot(taken.tail.id).code(), ErrorCode::kNotFound);
  const Stats s = test::waitForStats(*client, [](const Stats& s) { return s.coldSnapshots == 5; });
  EXPECT_EQ(s.coldSnapshots, 5u) << "3 before, one dropped, 3 new";
  EXPECT_EQ(s.coldSnapshotsDropped, 0u);
}

TEST(ColdIntegration, SnapshotsWrittenBeforeASigkillAreRestoredWithTheSameBytes) {
  std::string dataDir;
  Taken taken;
  {
    DaemonProcess first(kSnapPool, "", coldOn());
    dataDir = first.dataDir();
    auto client = first.connect();
    auto space = client->open(testLayout()).value();
    taken = takeSnapshots(*space);
    // Write-behind: wait until all three are on disk, then kill without a flush.
    const Stats s =
        test::waitForStats(*client, [](const Stats& s) { return s.coldSnapshots == 3; });
    ASSERT_EQ(s.coldSnapshots, 3u);
    first.stop(SIGKILL);
  }
  DaemonProcess second(kSnapPool, dataDir, coldOn());
  auto client = second.connect();
  auto space = client->open(testLayout()).value();
  expectRestored(*space, taken);
  EXPECT_EQ(client->stats().value().coldSnapshotsDropped, 0u);
}

TEST(ColdIntegration, ASigkillRightAfterASnapshotLeavesItWholeOrNotFoundAndItsIdUnused) {
  std::string dataDir;
  std::vector<uint64_t> ids;
  {
    DaemonProcess first(kSnapPool, "", coldOn());
    dataDir = first.dataDir();
    auto client = first.connect();
    auto space = client->open(testLayout()).value();
    putAll(*space, "chat", chatTokens());
    for (uint64_t from : {0, 5, 17, 33}) ids.push_back(space->snapshot("chat", from).value().id);
    first.stop(SIGKILL);  // the writes may or may not have happened
  }
  DaemonProcess second(kSnapPool, dataDir, coldOn());
  auto client = second.connect();
  auto space = client->open(testLayout()).value();
  for (uint64_t id : ids) {
    SCOPED_TRACE(::testing::Message() << "snapshot " << id);
    auto info = space->snapshotInfo(id);
    if (!info.ok()) {
      EXPECT_EQ(info.code(), ErrorCode::kNotFound);
      EXPECT_EQ(space->restore("r", id, 40).code(), ErrorCode::kNotFound);
      continue;
    }
    const std::string seq = "r" + std::to_string(id);
    const auto prefix = chatPrefix(info->from);
    if (!prefix.empty()) putAll(*space, seq, prefix);
    ASSERT_TRUE(space->restore(seq, id, 40).ok());
    EXPECT_EQ(bytesOf(*space, seq), kvOf(chatTokens())) << "never wrong bytes";
  }
  // Ids are reserved on disk before they are handed out: none is handed out again.
  putAll(*space, "new", chatTokens());
  const uint64_t fresh = space->snapshot("new", 0).value().id;
  for (uint64_t id : ids) EXPECT_NE(fresh, id);
  EXPECT_GT(fresh, *std::max_element(ids.begin(), ids.end()));
  EXPECT_EQ(client->stats().value().coldSnapshotsDropped, 0u);
}

// Flips one byte of a value in the snapshots column family: the manifest whose id is `id`
// (manifest) or that snapshot's own record `slot`.
void corruptSnapshotValue(const std::string& dataDir, uint64_t id, std::optional<uint32_t> slot) {
  auto tier = ColdTier::open({.path = dataDir + "/cold", .capacityBytes = 0, .fileSystem = nullptr})
                  .value();
  const SnapshotKey key{testLayout().fingerprint(), saltFor("uid:" + std::to_string(getuid())), id};
  ASSERT_TRUE(tier->hasSnapshot(key)) << "snapshot " << id << " is not on disk";
  const std::string k = slot ? key.recordKey(*slot) : key.manifestKey();
  auto* db = tier->rawDb();
  std::string value;
  ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), tier->snapshotsFamily(), k, &value).ok());
  value[value.size() - 3] ^= 0x10;
  ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), tier->snapshotsFamily(), k, value).ok());
}

TEST(ColdIntegration, ACorruptManifestOrRecordFailsCleanlyChangesNothingAndIsCounted) {
  std::string dataDir;
  Taken taken;
  {
    DaemonProcess first(kSnapPool, "", coldOn());
    dataDir = first.dataDir();
    auto client = first.connect();
    auto space = client->open(testLayout()).value();
    taken = takeSnapshots(*space);
    space.reset();
    client.reset();
    ASSERT_EQ(first.stop(SIGTERM), 0);
  }
  corruptSnapshotValue(dataDir, taken.whole.id, std::nullopt);           // the manifest
  corruptSnapshotValue(dataDir, taken.recurrent.id, checkpointSlot(0));  // the state record
  DaemonProcess second(kSnapPool, dataDir, coldOn());
  auto client = second.connect();
  auto space = client->open(testLayout()).value();
  putAll(*space, "keep", chatTokens());
  const auto before = bytesOf(*space, "keep");

  EXPECT_EQ(space->restore("keep", taken.whole.id, 40).code(), ErrorCode::kChecksumMismatch);
  EXPECT_EQ(space->restore("keep", taken.recurrent.id, 24).code(), ErrorCode::kChecksumMismatch);
  EXPECT_EQ(bytesOf(*space, "keep"), before) << "a failed restore changes nothing";
  EXPECT_EQ(space->length("keep").value().value_or(0), 40u);
  // Dropped, not retried: they are gone now.
  EXPECT_EQ(space->snapshotInfo(taken.whole.id).code(), ErrorCode::kNotFound);
  EXPECT_EQ(space->restore("keep", taken.recurrent.id, 24).code(), ErrorCode::kNotFound);
  const Stats s = client->stats().value();
  EXPECT_EQ(s.coldSnapshotsDropped, 2u);
  EXPECT_EQ(s.coldSnapshots, 1u);
  EXPECT_GE(s.corruptDropped, 1u) << "the corrupt record";
  EXPECT_EQ(s.blocksPinned, 0u);
  // The undamaged one still restores.
  const auto prefix = chatPrefix(20);
  putAll(*space, "t", prefix);
  ASSERT_TRUE(space->restore("t", taken.tail.id, 40).ok());
  EXPECT_EQ(bytesOf(*space, "t"), kvOf(chatTokens()));
}

// The cold tier keeps 4 blocks: prompts written after a snapshot push its block records out.
std::vector<std::string> smallDisk() {
  return {"--cold-tier", "on", "--disk-bytes", std::to_string(4 * kBlockBytes)};
}

// Takes a snapshot, waits until it is on disk, then writes 3 prompts (12 block records) and waits
// until the disk bound has evicted records (not the snapshot's: a manifest's records are kept
// until it is dropped). Stops the daemon with `signal`.
void snapshotThenEvictItsBlocks(int signal, std::string* dataDir, SnapshotInfo* snap) {
  DaemonProcess first(kSnapPool, "", smallDisk());
  *dataDir = first.dataDir();
  auto client = first.connect();
  auto space = client->open(testLayout()).value();
  putAll(*space, "chat", chatTokens());
  *snap = space->snapshot("chat", 0).value();
  ASSERT_EQ(test::waitForStats(*client, [](const Stats& s) { return s.coldSnapshots == 1; })
                .coldSnapshots,
            1u);
  for (uint64_t i = 0; i < 3; ++i) putPrompt(*space, i);
  ASSERT_GE(
      test::waitForStats(*client, [](const Stats& s) { return s.coldEvicted >= 2; }).coldEvicted,
      2u);
  space.reset();
  client.reset();
  first.stop(signal);
}

// After snapshotThenEvictItsBlocks and a stop by `signal`, a new daemon restores the snapshot
// with the same bytes, and nothing was dropped.
void restoresAfterTheDiskBoundEvictedAroundIt(int signal) {
  std::string dataDir;
  SnapshotInfo snap;
  snapshotThenEvictItsBlocks(signal, &dataDir, &snap);
  DaemonProcess second(kSnapPool, dataDir, smallDisk());
  auto client = second.connect();
  auto space = client->open(testLayout()).value();
  auto restored = space->restore("r", snap.id, 40);
  ASSERT_TRUE(restored.ok()) << restored.error();
  EXPECT_EQ(bytesOf(*space, "r"), kvOf(chatTokens()));
  const Stats s = client->stats().value();
  EXPECT_EQ(s.coldSnapshotsDropped, 0u);
  EXPECT_EQ(s.coldSnapshots, 1u);
}

// The disk bound evicts oldest access first, but never a record a snapshot's manifest names:
// after a SIGKILL (no flush could write anything again) the snapshot still restores.
TEST(ColdIntegration, TheDiskBoundNeverEvictsTheBlocksOfASnapshot) {
  restoresAfterTheDiskBoundEvictedAroundIt(SIGKILL);
}

TEST(ColdIntegration, ASnapshotUnderTheDiskBoundSurvivesAGracefulRestart) {
  restoresAfterTheDiskBoundEvictedAroundIt(SIGTERM);
}

TEST(ColdIntegration, SnapshotCountersInStatsJsonAndMetrics) {
  DaemonProcess daemon(kSnapPool, "", {"--cold-tier", "on", "--metrics-addr", "127.0.0.1:0"});
  auto client = daemon.connect();
  auto space = client->open(testLayout()).value();
  putAll(*space, "chat", chatTokens());
  ASSERT_TRUE(space->snapshot("chat", 0).ok());
  const Stats s = test::waitForStats(*client, [](const Stats& s) { return s.coldSnapshots == 1; });
  EXPECT_NE(s.toJson().find("\"snapshots\": 1, \"snapshots_dropped\": 0"), std::string::npos)
      << s.toJson();
  const std::string page = httpGet(daemon.metricsAddr(), "/metrics");
  EXPECT_NE(page.find("kvtier_cold_snapshots 1"), std::string::npos) << page;
  EXPECT_NE(page.find("kvtier_cold_snapshots_dropped_total 0"), std::string::npos) << page;
}

}  // namespace
}  // namespace kvtier
