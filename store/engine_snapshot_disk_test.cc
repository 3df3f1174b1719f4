// Engine unit tests for snapshot persistence: the manifest a snapshot is written as, the pins a
// write holds, snapshot ids under a persisted limit, and a snapshot rebuilt from its manifest in a
// fresh engine (a restart) restoring the same bytes. The "disk" is a map in the test: the bytes
// move exactly as the daemon moves them (daemon/cold_service.cc), minus RocksDB.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "store/engine.h"
#include "store/engine_test_util.h"

namespace kvtier {

namespace {

using namespace test_util;  // smallLayout, Tags, writeTag, readTag, toks

constexpr uint32_t kBt = kTestBlockTokens;

// With a cold directory set, the engine queues new snapshots for writing. Nothing is on disk as
// far as eviction is concerned: the pools below are large enough never to evict.
class NothingOnDisk final : public ColdDirectory {
 public:
  bool contains(uint64_t, const Salt&, const Key128&) const override { return false; }
};

// What the cold tier would hold: block records by key, own records by (id, slot), manifests.
struct FakeDisk {
  std::map<std::string, std::vector<uint8_t>> blocks;
  std::map<std::pair<uint64_t, uint32_t>, std::vector<uint8_t>> own;
  std::map<uint64_t, SnapshotManifest> manifests;
};

// One engine over heap memory, as the daemon has one (fresh per "run" of the daemon).
struct Node {
  // `blocks` blocks of the layout, plus room for blobs (checkpoints).
  explicit Node(uint64_t blocks = 64, uint64_t blobBytes = 16 * 4096) {
    const Layout l = smallLayout();
    pool = std::make_unique<BlockPool>(
        std::vector<BlockPool::Extent>{{0, blocks * l.blockBytes() + blobBytes}});
    memory = std::make_unique<HeapBlockMemory>(pool->extents());
    engine = std::make_unique<Engine>(*pool, *memory);
    engine->setColdDirectory(&directory);
    space = engine->openSpace(l, saltFor("tenant-a")).value();
  }
  uint8_t* at(const BlockLocation& loc) { return memory->extentBase(loc.extent) + loc.offset; }

  ::testing::AssertionResult write(std::string_view seq, uint64_t begin,
                                   const std::vector<uint32_t>& tokens) {
    auto g = engine->put(kOwner, space, seq, begin, tokens, {}, SeqOptions{.detached = true});
    if (!g) return ::testing::AssertionFailure() << "put: " << g.error();
    for (size_t i = 0; i < tokens.size(); ++i) {
      const uint64_t pos = begin + i;
      writeTag(smallLayout(), at(g->blocks[(pos - g->firstPosition) / kBt]), pos % kBt, tokens[i]);
    }
    auto c = engine->commit(g->lease, kEnd);
    if (!c) return ::testing::AssertionFailure() << "commit: " << c.error();
    return ::testing::AssertionSuccess();
  }

  Status putCheckpoint(std::string_view seq, uint64_t pos, const std::vector<uint8_t>& bytes) {
    auto g = engine->putCheckpoint(space, seq, pos, bytes.size());
    if (!g) return g.error();
    std::memcpy(at(g->block), bytes.data(), bytes.size());
    auto c = engine->commit(g->lease, kEnd);
    if (!c) return c.error();
    return {};
  }

  Tags read(std::string_view seq) {
    auto g = engine->get(space, seq, 0, kEnd);
    if (!g) {
      ADD_FAILURE() << "get '" << seq << "': " << g.error();
      return {};
    }
    Tags out;
    for (uint64_t pos = 0; pos < g->end; ++pos) {
      out.push_back(
          readTag(smallLayout(), at(g->blocks[(pos - g->firstPosition) / kBt]), pos % kBt));
    }
    (void)engine->releaseRead(g->lease);
    return out;
  }

  // Writes every waiting snapshot to `disk`, as the daemon's worker does.
  size_t writeAll(FakeDisk& disk) {
    auto writes = engine->takeSnapshotWrites(SIZE_MAX);
    for (const auto& w : writes) {
      for (const auto& b : w.sealed) {
        disk.blocks[b.key.hex()].assign(at(b.location), at(b.location) + b.bytes);
      }
      for (const auto& b : w.own) {
        disk.own[{w.manifest.id, b.slot}].assign(at(b.location), at(b.location) + b.bytes);
      }
      disk.manifests[w.manifest.id] = w.manifest;
    }
    engine->finishSnapshotWrites(writes, true);
    return writes.size();
  }

  // Rebuilds snapshot `id` from `disk`; `lose` names a read to fail (a record gone).
  Result<SnapshotInfo> load(const FakeDisk& disk, SnapshotId id,
                            std::optional<size_t> lose = std::nullopt) {
    auto load = engine->beginSnapshotLoad(space, disk.manifests.at(id));
    if (!load) return load.error();
    std::vector<uint8_t> ok(load->reads.size(), 0);
    for (size_t i = 0; i < load->reads.size(); ++i) {
      const SnapshotRead& r = load->reads[i];
      if (lose == i) continue;
      const std::vector<uint8_t>& bytes =
          r.sealed ? disk.blocks.at(r.key.hex()) : disk.own.at({id, r.slot});
      EXPECT_EQ(bytes.size(), r.bytes);
      std::memcpy(at(r.dest), bytes.data(), r.bytes);
      ok[i] = 1;
    }
    return engine->finishSnapshotLoad(*load, ok);
  }

  uint64_t used() const { return engine->stats().blocksUsed; }
  uint64_t pinned() const { return engine->stats().blocksPinned; }

  NothingOnDisk directory;
  std::unique_ptr<BlockPool> pool;
  std::unique_ptr<HeapBlockMemory> memory;
  std::unique_ptr<Engine> engine;
  SpaceId space = 0;
};

Tags tagsOf(const std::vector<uint32_t>& tokens) { return Tags(tokens.begin(), tokens.end()); }

std::vector<uint8_t> stateBlob(uint8_t seed, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 41 + i * 7);
  return v;
}

TEST(SnapshotDisk, ManifestNamesSealedBlocksByKeyAndTheRestAsOwnRecords) {
  Node n;
  const auto t = toks(40, 1000);  // two sealed blocks and a partial one
  ASSERT_TRUE(n.write("s", 0, t));
  const auto snap = n.engine->snapshot(n.space, "s", 0).value();
  EXPECT_EQ(n.engine->snapshotWriteBacklog(), 1u);
  EXPECT_FALSE(n.engine->snapshotOnDisk(n.space, snap.id));

  auto writes = n.engine->takeSnapshotWrites(SIZE_MAX);
  ASSERT_EQ(writes.size(), 1u);
  const SnapshotManifest& m = writes[0].manifest;
  EXPECT_TRUE(checkManifest(m).ok());
  EXPECT_EQ(m.id, snap.id);
  EXPECT_EQ(m.fingerprint, n.engine->space(n.space).fingerprint);
  EXPECT_EQ(m.salt, saltFor("tenant-a"));
  EXPECT_EQ(m.blockTokens, kBt);
  EXPECT_EQ(m.blockBytes, smallLayout().blockBytes());
  EXPECT_EQ(m.from, 0u);
  EXPECT_EQ(m.to, 40u);
  EXPECT_EQ(m.tokens, t);
  ASSERT_EQ(m.keys.size(), 2u);
  EXPECT_TRUE(m.detached);
  ASSERT_EQ(m.blocks.size(), 3u);
  EXPECT_EQ(m.blocks[0].kind, ManifestBlock::Kind::kSealed);
  EXPECT_EQ(m.blocks[0].key, m.keys[0]);
  EXPECT_EQ(m.blocks[1].kind, ManifestBlock::Kind::kSealed);
  EXPECT_EQ(m.blocks[1].key, m.keys[1]);
  EXPECT_EQ(m.blocks[2].kind, ManifestBlock::Kind::kOwn);
  ASSERT_EQ(writes[0].sealed.size(), 2u);
  ASSERT_EQ(writes[0].own.size(), 1u);
  EXPECT_EQ(writes[0].own[0].slot, 2u);
  // Pinned while written: a drop of everything cannot free or reuse them under the writer.
  EXPECT_EQ(n.pinned(), 3u);
  EXPECT_TRUE(n.engine->snapshotOnDisk(n.space, snap.id)) << "being written counts: a drop deletes";
  n.engine->finishSnapshotWrites(writes, true);
  EXPECT_EQ(n.pinned(), 0u);
  EXPECT_TRUE(n.engine->snapshotOnDisk(n.space, snap.id));
  EXPECT_TRUE(n.engine->takeSnapshotWrites(SIZE_MAX).empty()) << "written once";
}

TEST(SnapshotDisk, AFailedWriteIsTriedAgainAndADroppedSnapshotIsSkipped) {
  Node n;
  ASSERT_TRUE(n.write("s", 0, toks(20, 1000)));
  const auto a = n.engine->snapshot(n.space, "s", 0).value();
  const auto b = n.engine->snapshot(n.space, "s", 5).value();
  auto first = n.engine->takeSnapshotWrites(1);  // at least one snapshot, even over the bound
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].manifest.id, a.id);
  n.engine->finishSnapshotWrites(first, false);
  EXPECT_EQ(n.pinned(), 0u);
  EXPECT_FALSE(n.engine->snapshotOnDisk(n.space, a.id));
  auto again = n.engine->takeSnapshotWrites(SIZE_MAX);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].manifest.id, a.id) << "a failed snapshot is first in line";
  EXPECT_EQ(again[1].manifest.id, b.id);

  // Dropped while its write is in flight: its blocks stay until the writer lets go.
  ASSERT_TRUE(n.engine->dropSnapshot(n.space, a.id).ok());
  ASSERT_TRUE(n.engine->dropSnapshot(n.space, b.id).ok());
  ASSERT_TRUE(n.engine->remove(n.space, "s", 0, kEnd).ok());
  EXPECT_GT(n.pinned(), 0u);
  n.engine->finishSnapshotWrites(again, true);
  EXPECT_EQ(n.pinned(), 0u);
  EXPECT_EQ(n.used(), 1u) << "the partial block is freed, the sealed one stays cached";
  EXPECT_TRUE(n.engine->takeSnapshotWrites(SIZE_MAX).empty());
}

TEST(SnapshotDisk, WrittenSnapshotsWhoseBlockRecordsAreGoneAreWrittenAgain) {
  Node n;
  ASSERT_TRUE(n.write("s", 0, toks(40, 1000)));
  const auto snap = n.engine->snapshot(n.space, "s", 0).value();
  auto none = [](SpaceId, const Key128&) { return true; };
  EXPECT_EQ(n.engine->rewriteSnapshotsMissing(none), 0u) << "not written yet: nothing to redo";
  FakeDisk disk;
  ASSERT_EQ(n.writeAll(disk), 1u);
  EXPECT_EQ(n.engine->rewriteSnapshotsMissing(none), 0u);
  const Key128 lost = disk.manifests.at(snap.id).blocks[1].key;
  EXPECT_EQ(
      n.engine->rewriteSnapshotsMissing([&](SpaceId, const Key128& key) { return !(key == lost); }),
      1u);
  auto again = n.engine->takeSnapshotWrites(SIZE_MAX);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].manifest, disk.manifests.at(snap.id));
  n.engine->finishSnapshotWrites(again, true);
}

TEST(SnapshotDisk, WithoutAColdTierNothingWaits) {
  Node n;
  n.engine->setColdDirectory(nullptr);
  ASSERT_TRUE(n.write("s", 0, toks(20, 1000)));
  const auto snap = n.engine->snapshot(n.space, "s", 0).value();
  EXPECT_EQ(n.engine->snapshotWriteBacklog(), 0u);
  EXPECT_TRUE(n.engine->takeSnapshotWrites(SIZE_MAX).empty());
  EXPECT_FALSE(n.engine->snapshotOnDisk(n.space, snap.id));
}

TEST(SnapshotDisk, IdsAreHandedOutOnlyBelowTheLimit) {
  Node n;
  ASSERT_TRUE(n.write("s", 0, toks(20, 1000)));
  n.engine->setSnapshotIds(100, 103);
  EXPECT_EQ(n.engine->snapshot(n.space, "s", 0).value().id, 100u);
  const auto b = n.engine->snapshot(n.space, "s", 10).value();
  EXPECT_EQ(b.id, 101u);
  EXPECT_EQ(n.engine->splitSnapshot(n.space, b.id, 15).code(), ErrorCode::kUnavailable)
      << "a split needs two ids, one is left";
  EXPECT_EQ(n.engine->stats().snapshots, 2u) << "nothing changed";
  EXPECT_EQ(n.engine->snapshot(n.space, "s", 0).value().id, 102u);
  EXPECT_EQ(n.engine->snapshot(n.space, "s", 0).code(), ErrorCode::kUnavailable);
  EXPECT_EQ(n.engine->mergeSnapshots(n.space, 100, b.id).code(), ErrorCode::kUnavailable);
  n.engine->setSnapshotIds(50, 200);  // never goes back
  EXPECT_EQ(n.engine->nextSnapshotId(), 103u);
  EXPECT_EQ(n.engine->snapshot(n.space, "s", 0).value().id, 103u);
}

TEST(SnapshotDisk, ARebuiltSnapshotRestoresTheSameBytesInAFreshEngine) {
  FakeDisk disk;
  const auto t = toks(40, 1000);
  const auto state = stateBlob(7, 3000);
  SnapshotInfo whole, tail, recurrent;
  SnapshotId next = 0;
  {
    Node before;
    ASSERT_TRUE(before.write("s", 0, t));
    whole = before.engine->snapshot(before.space, "s", 0).value();
    tail = before.engine->snapshot(before.space, "s", 20).value();  // starts inside a block
    ASSERT_TRUE(before.write("r", 0, toks(24, 5000)));
    ASSERT_TRUE(before.putCheckpoint("r", 24, state).ok());
    recurrent = before.engine->snapshot(before.space, "r", 0).value();
    ASSERT_EQ(recurrent.checkpoints, std::vector<uint64_t>{24});
    EXPECT_EQ(before.writeAll(disk), 3u);
    next = before.engine->nextSnapshotId();
  }
  Node after;  // a restart: new pool, new engine, the namespace renumbered or not
  after.engine->setSnapshotIds(next, next + 100);
  EXPECT_FALSE(after.engine->hasSnapshot(after.space, whole.id));
  auto info = after.load(disk, whole.id);
  ASSERT_TRUE(info.ok()) << info.error();
  EXPECT_EQ(info->from, 0u);
  EXPECT_EQ(info->to, 40u);
  EXPECT_EQ(after.pinned(), 0u);
  ASSERT_TRUE(after.engine->restore(kOwner, after.space, "x", whole.id, 40, {}).ok());
  EXPECT_EQ(after.read("x"), tagsOf(t));
  // The sealed blocks came back as promoted blocks: a lookup finds them.
  auto hit = after.engine->lookup(kOwner, after.space, t, {}, "", {});
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->matchedTokens, 32u);
  (void)after.engine->releaseRead(hit->lease);

  // A snapshot from inside a block restores onto a sequence holding its prefix.
  ASSERT_TRUE(after.load(disk, tail.id).ok());
  ASSERT_TRUE(after.write("y", 0, toks(20, 1000)));
  ASSERT_TRUE(after.engine->restore(kOwner, after.space, "y", tail.id, 40, {}).ok());
  EXPECT_EQ(after.read("y"), tagsOf(t));

  // Recurrent state comes back with its checkpoint.
  auto r = after.load(disk, recurrent.id);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->checkpoints, std::vector<uint64_t>{24});
  ASSERT_TRUE(after.engine->restore(kOwner, after.space, "z", recurrent.id, 24, {}).ok());
  auto cp = after.engine->getCheckpoint(after.space, "z", 24);
  ASSERT_TRUE(cp.ok()) << cp.error();
  ASSERT_EQ(cp->bytes, state.size());
  EXPECT_EQ(std::vector<uint8_t>(after.at(cp->block), after.at(cp->block) + cp->bytes), state);
  (void)after.engine->releaseRead(cp->lease);

  // Rebuilt snapshots are on disk already: nothing to write, a drop must delete them.
  EXPECT_TRUE(after.engine->takeSnapshotWrites(SIZE_MAX).empty());
  EXPECT_TRUE(after.engine->snapshotOnDisk(after.space, whole.id));
  EXPECT_EQ(after.engine->beginSnapshotLoad(after.space, disk.manifests.at(whole.id)).code(),
            ErrorCode::kConflict);
}

// A node snapshots a 40-token sequence (two sealed blocks and a partial one), writes it to `disk`
// and goes away.
void snapshotOnDisk(FakeDisk& disk, SnapshotInfo* snap) {
  Node before;
  ASSERT_TRUE(before.write("s", 0, toks(40, 1000)));
  *snap = before.engine->snapshot(before.space, "s", 0).value();
  before.writeAll(disk);
}

TEST(SnapshotDisk, AReadThatFailsChangesNothingButTheBlocksItPromoted) {
  FakeDisk disk;
  SnapshotInfo snap;
  ASSERT_NO_FATAL_FAILURE(snapshotOnDisk(disk, &snap));
  Node after;
  after.engine->setSnapshotIds(snap.id + 1, snap.id + 100);
  const uint64_t usedBefore = after.used();
  auto lost = after.load(disk, snap.id, /*lose=*/2);  // the partial block's own record
  EXPECT_EQ(lost.code(), ErrorCode::kNotFound);
  EXPECT_FALSE(after.engine->hasSnapshot(after.space, snap.id));
  EXPECT_EQ(after.pinned(), 0u);
  EXPECT_EQ(after.used(), usedBefore + 2) << "the two sealed blocks read stay cached";
  EXPECT_EQ(after.engine->stats().snapshots, 0u);
  // It can be tried again (the daemon drops it from disk instead; the engine does not care).
  ASSERT_TRUE(after.load(disk, snap.id).ok());
  EXPECT_EQ(after.used(), usedBefore + 3);
}

TEST(SnapshotDisk, AManifestThatDoesNotFitTheNamespaceIsRefusedAndChangesNothing) {
  FakeDisk disk;
  SnapshotInfo snap;
  ASSERT_NO_FATAL_FAILURE(snapshotOnDisk(disk, &snap));
  Node after(/*blocks=*/2, /*blobBytes=*/0);  // too small for the snapshot's three blocks
  after.engine->setSnapshotIds(snap.id + 1, snap.id + 100);
  const SnapshotManifest& m = disk.manifests.at(snap.id);
  // Another tenant's namespace never sees it, whatever id it asks for.
  const SpaceId other = after.engine->openSpace(smallLayout(), saltFor("tenant-b")).value();
  EXPECT_EQ(after.engine->beginSnapshotLoad(other, m).code(), ErrorCode::kInvalidArgument);
  auto wrongLayout = m;
  wrongLayout.blockBytes *= 2;
  EXPECT_EQ(after.engine->beginSnapshotLoad(after.space, wrongLayout).code(),
            ErrorCode::kInvalidArgument);
  auto inconsistent = m;
  inconsistent.blocks.pop_back();
  EXPECT_EQ(after.engine->beginSnapshotLoad(after.space, inconsistent).code(),
            ErrorCode::kInvalidArgument);
  auto hole = m;  // a block that names no bytes (a restore would put a hole in the sequence)
  hole.blocks[1] = ManifestBlock{};
  EXPECT_EQ(after.engine->beginSnapshotLoad(after.space, hole).code(),
            ErrorCode::kInvalidArgument);
  auto unissued = m;
  unissued.id = snap.id + 1;  // at the next id: it could be handed out again
  EXPECT_EQ(after.engine->beginSnapshotLoad(after.space, unissued).code(),
            ErrorCode::kInvalidArgument);
  auto bigState = m;
  bigState.checkpoints = {{40, 3000}};  // a blob class larger than this pool's extent
  EXPECT_EQ(after.engine->beginSnapshotLoad(after.space, bigState).code(), ErrorCode::kNotSupported)
      << "this pool's limit, not a bad manifest: the daemon keeps it";
  EXPECT_EQ(after.engine->beginSnapshotLoad(after.space, m).code(), ErrorCode::kFull);
  EXPECT_EQ(after.used(), 0u);
  EXPECT_EQ(after.pinned(), 0u);
}

TEST(SnapshotDisk, MergedSplitAndEmptySnapshotsAreWrittenToo) {
  FakeDisk disk;
  const auto t = toks(40, 1000);
  SnapshotInfo left, right, merged, empty;
  SnapshotId next = 0;
  {
    Node before;
    ASSERT_TRUE(before.write("s", 0, t));
    const auto whole = before.engine->snapshot(before.space, "s", 0).value();
    std::tie(left, right) = before.engine->splitSnapshot(before.space, whole.id, 25).value();
    merged = before.engine->mergeSnapshots(before.space, left.id, right.id).value();
    empty = before.engine->snapshot(before.space, "s", 40).value();
    EXPECT_EQ(before.writeAll(disk), 5u);
    next = before.engine->nextSnapshotId();
  }
  Node after;
  after.engine->setSnapshotIds(next, next + 100);
  ASSERT_TRUE(after.load(disk, merged.id).ok());
  ASSERT_TRUE(after.engine->restore(kOwner, after.space, "m", merged.id, 40, {}).ok());
  EXPECT_EQ(after.read("m"), tagsOf(t));
  auto e = after.load(disk, empty.id);
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_EQ(e->from, 40u);
  EXPECT_EQ(e->to, 40u);
}

TEST(SnapshotManifestCheck, RefusesWhatARestoreCouldNotUse) {
  SnapshotManifest m;
  m.id = 7;
  m.blockTokens = 16;
  m.blockBytes = 512;
  m.from = 20;
  m.to = 40;
  m.tokens = toks(40, 1);
  m.keys.resize(2);
  m.blocks.resize(2);  // blocks 1 and 2 cover [16, 48)
  m.checkpoints = {{20, 100}, {40, 100}};
  ASSERT_TRUE(checkManifest(m).ok()) << checkManifest(m).error();
  auto bad = [&](auto&& edit) {
    SnapshotManifest b = m;
    edit(b);
    return checkManifest(b).code();
  };
  EXPECT_EQ(bad([](auto& b) { b.id = 0; }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad([](auto& b) { b.blockTokens = 0; }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad([](auto& b) { b.from = 41; }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad([](auto& b) { b.tokens.pop_back(); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad([](auto& b) { b.keys.resize(3); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad([](auto& b) { b.blocks.resize(3); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad([](auto& b) { b.window = 4, b.chunk = 4; }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad([](auto& b) { b.checkpoints[0].position = 19; }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad([](auto& b) { b.checkpoints[1].position = 20; }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad([](auto& b) { b.checkpoints[1].bytes = 0; }), ErrorCode::kInvalidArgument);
  // An empty snapshot: no blocks, no checkpoints, any tokens up to its end.
  SnapshotManifest e = m;
  e.from = e.to = 40;
  e.blocks.clear();
  e.checkpoints.clear();
  EXPECT_TRUE(checkManifest(e).ok());
  e.blocks.resize(1);
  EXPECT_EQ(checkManifest(e).code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
