// Engine unit tests of blobs: recurrent-state checkpoints and position-independent entries
// (engine_shapes_test_fixture.h). Real BlockPool + HeapBlockMemory + Engine, in-process.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "store/engine.h"
#include "store/engine_shapes_test_fixture.h"

namespace kvtier {

namespace {

using namespace shapes_test;  // ShapesTest, Harness, slice, blob and test_util

// =============================================================================================
// Recurrent state checkpoints

class CheckpointTest : public ShapesTest {
 protected:
  void SetUp() override { makeEngine(16, 16 * kBlobBlock); }
};

TEST_F(CheckpointTest, PutGetAndPositions) {
  ASSERT_TRUE(write("s", 0, toks(20, 1000)));
  ASSERT_TRUE(putCheckpoint("s", 20, 1));
  ASSERT_TRUE(putCheckpoint("s", 8, 2, 5000));  // a larger blob class
  EXPECT_EQ(checkpoints("s"), (std::vector<uint64_t>{8, 20}));
  EXPECT_EQ(engine_->stats().checkpoints, 2u);
  EXPECT_EQ(checkpointBytes("s", 20), blob(1, 100));
  EXPECT_EQ(checkpointBytes("s", 8, 5000), blob(2, 5000));

  EXPECT_EQ(engine_->getCheckpoint(space_, "s", 10).code(), ErrorCode::kNotFound);
  EXPECT_EQ(engine_->getCheckpoint(space_, "nosuch", 0).code(), ErrorCode::kNotFound);
  EXPECT_EQ(engine_->checkpointPositions(space_, "nosuch").code(), ErrorCode::kNotFound);
  EXPECT_EQ(engine_->putCheckpoint(space_, "nosuch", 0, 100).code(), ErrorCode::kNotFound);
  EXPECT_EQ(engine_->putCheckpoint(space_, "s", 21, 100).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->putCheckpoint(space_, "s", 5, 0).code(), ErrorCode::kInvalidArgument);

  // Nothing is visible before the commit; the lease holds the sequence's writer slot.
  const uint64_t blobs = blobsUsed();
  auto g = engine_->putCheckpoint(space_, "s", 12, 100);
  ASSERT_TRUE(g.ok()) << g.error();
  EXPECT_EQ(engine_->getCheckpoint(space_, "s", 12).code(), ErrorCode::kNotFound);
  EXPECT_EQ(engine_->put(kOwner, space_, "s", 20, toks(1, 1), {}, SeqOptions{}).code(),
            ErrorCode::kConflict);
  ASSERT_TRUE(engine_->abortWrite(g->lease).ok());
  EXPECT_EQ(checkpoints("s"), (std::vector<uint64_t>{8, 20}));
  EXPECT_EQ(blobsUsed(), blobs);

  // A second checkpoint at a position replaces the first, whose block is freed.
  ASSERT_TRUE(putCheckpoint("s", 20, 3));
  EXPECT_EQ(checkpointBytes("s", 20), blob(3, 100));
  EXPECT_EQ(blobsUsed(), blobs);

  // The sequence changes while a checkpoint lease is open: the commit conflicts.
  auto h = engine_->putCheckpoint(space_, "s", 16, 100);
  ASSERT_TRUE(h.ok()) << h.error();
  ASSERT_TRUE(engine_->truncate(space_, "s", 18).ok());
  EXPECT_EQ(engine_->commit(h->lease, kEnd).code(), ErrorCode::kConflict);
  EXPECT_EQ(checkpoints("s"), (std::vector<uint64_t>{8}));
  EXPECT_EQ(blobsUsed(), blobs - 1);
}

TEST_F(CheckpointTest, GetCheckpointReportsTheBlobsOwnSize) {
  // BlobGrant::bytes is "the blob's own size (the block may be larger)" (engine.h).
  ASSERT_TRUE(write("s", 0, toks(20, 1000)));
  ASSERT_TRUE(putCheckpoint("s", 20, 1, 100));
  auto g = engine_->getCheckpoint(space_, "s", 20);
  ASSERT_TRUE(g.ok()) << g.error();
  EXPECT_EQ(g->bytes, 100u);
  EXPECT_GE(g->block.bytes, 100u);
  EXPECT_TRUE(engine_->releaseRead(g->lease).ok());
}

TEST_F(CheckpointTest, RestoreOnlyAtACheckpoint) {
  const auto t = toks(40, 1000);
  ASSERT_TRUE(write("s", 0, t));
  ASSERT_TRUE(putCheckpoint("s", 16, 1));
  ASSERT_TRUE(putCheckpoint("s", 30, 2));
  ASSERT_TRUE(putCheckpoint("s", 40, 3));
  EXPECT_TRUE(resumable("s", 0));
  EXPECT_TRUE(resumable("s", 16));
  EXPECT_FALSE(resumable("s", 20));
  EXPECT_TRUE(resumable("s", 30));
  EXPECT_TRUE(resumable("s", 40));

  // Rewinds: off a checkpoint fails and changes nothing; on one works.
  EXPECT_EQ(restore("s", std::nullopt, 20).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("s"), 40u);
  EXPECT_EQ(checkpoints("s"), (std::vector<uint64_t>{16, 30, 40}));
  ASSERT_TRUE(restore("s", std::nullopt, 30).ok());
  EXPECT_EQ(len("s"), 30u);
  EXPECT_EQ(checkpoints("s"), (std::vector<uint64_t>{16, 30}));
  EXPECT_EQ(checkpointBytes("s", 30), blob(2, 100));
  EXPECT_EQ(read("s"), tagsOf(head(t, 30)));

  // Snapshots carry the checkpoints in [from, to] and outlive the sequence's.
  const auto sn = snap("s", 10);
  EXPECT_TRUE(sn.hasCheckpoints);
  EXPECT_EQ(sn.checkpoints, (std::vector<uint64_t>{16, 30}));
  ASSERT_TRUE(engine_->truncate(space_, "s", 10).ok());
  EXPECT_EQ(checkpoints("s"), std::vector<uint64_t>{});
  EXPECT_EQ(restore("s", sn.id, 20).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(restore("s", sn.id, 25).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("s"), 10u);
  ASSERT_TRUE(restore("s", sn.id, 16).ok());
  EXPECT_EQ(len("s"), 16u);
  EXPECT_EQ(checkpoints("s"), (std::vector<uint64_t>{16}));
  EXPECT_EQ(checkpointBytes("s", 16), blob(1, 100));
  ASSERT_TRUE(restore("s", sn.id, 30).ok());
  EXPECT_EQ(read("s"), tagsOf(head(t, 30)));
  EXPECT_EQ(checkpoints("s"), (std::vector<uint64_t>{16, 30}));
  EXPECT_EQ(checkpointBytes("s", 30), blob(2, 100));

  // Onto another sequence with the same prefix: identical checkpoint bytes.
  ASSERT_TRUE(write("o", 0, head(t, 10)));
  ASSERT_TRUE(restore("o", sn.id, 30).ok());
  EXPECT_EQ(read("o"), tagsOf(head(t, 30)));
  EXPECT_EQ(checkpointBytes("o", 16), blob(1, 100));
  EXPECT_EQ(checkpointBytes("o", 30), blob(2, 100));
}

TEST_F(CheckpointTest, MergeKeepsCheckpointsAndSplitIsNotSupported) {
  const auto t = toks(40, 1000);
  ASSERT_TRUE(write("s", 0, head(t, 20)));
  ASSERT_TRUE(putCheckpoint("s", 20, 1));
  const auto a = snap("s", 0);
  ASSERT_TRUE(write("s", 20, slice(t, 20, 40)));
  ASSERT_TRUE(putCheckpoint("s", 40, 2));
  const auto b = snap("s", 20);
  EXPECT_EQ(a.checkpoints, (std::vector<uint64_t>{20}));
  EXPECT_EQ(b.checkpoints, (std::vector<uint64_t>{20, 40}));

  const uint64_t count = engine_->stats().snapshots;
  for (uint64_t at : {0u, 10u, 20u, 40u, 100u}) {
    EXPECT_EQ(engine_->splitSnapshot(space_, a.id, at).code(), ErrorCode::kNotSupported) << at;
  }
  EXPECT_EQ(engine_->stats().snapshots, count);

  const auto m = merge(a, b);
  EXPECT_EQ(m.from, 0u);
  EXPECT_EQ(m.to, 40u);
  EXPECT_EQ(m.checkpoints, (std::vector<uint64_t>{20, 40}));
  EXPECT_EQ(engine_->splitSnapshot(space_, m.id, 20).code(), ErrorCode::kNotSupported);
  ASSERT_TRUE(engine_->truncate(space_, "s", 0).ok());
  ASSERT_TRUE(restore("r", m.id, 40).ok());
  EXPECT_EQ(read("r"), tagsOf(t));
  EXPECT_EQ(checkpointBytes("r", 20), blob(1, 100));
  EXPECT_EQ(checkpointBytes("r", 40), blob(2, 100));
  EXPECT_EQ(restore("r", m.id, 30).code(), ErrorCode::kInvalidArgument);

  // A snapshot past the last checkpoint holds none and splits.
  ASSERT_TRUE(write("s2", 0, t));
  ASSERT_TRUE(putCheckpoint("s2", 10, 3));
  const auto late = snap("s2", 11);
  EXPECT_FALSE(late.hasCheckpoints);
  EXPECT_TRUE(engine_->splitSnapshot(space_, late.id, 20).ok());
}

TEST_F(CheckpointTest, CopyPrefixSharesTheCheckpointsUpToTheCopyPoint) {
  ASSERT_TRUE(write("s", 0, toks(40, 1000)));
  ASSERT_TRUE(putCheckpoint("s", 10, 1));
  ASSERT_TRUE(putCheckpoint("s", 20, 2));
  ASSERT_TRUE(putCheckpoint("s", 30, 3));
  const uint64_t blobs = blobsUsed();
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "s", "d", 20, SeqOptions{}).ok());
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "s", "e", 25, SeqOptions{}).ok());
  EXPECT_EQ(checkpoints("d"), (std::vector<uint64_t>{10, 20}));
  EXPECT_EQ(checkpoints("e"), (std::vector<uint64_t>{10, 20}));
  EXPECT_EQ(blobsUsed(), blobs) << "shared, not copied";
  ASSERT_TRUE(engine_->remove(space_, "s", 0, kEnd).ok());
  EXPECT_EQ(checkpointBytes("d", 10), blob(1, 100));
  EXPECT_EQ(checkpointBytes("d", 20), blob(2, 100));
  EXPECT_EQ(checkpointBytes("e", 20), blob(2, 100));
  EXPECT_EQ(blobsUsed(), 2u) << "the checkpoint at 30 went with s";
}

TEST_F(CheckpointTest, CopyPrefixReplacesTheDestinationsCheckpoints) {
  // dst's previous contents are discarded, its checkpoint at 0 too; and no block may leak.
  ASSERT_TRUE(write("s", 0, toks(20, 1000)));
  ASSERT_TRUE(putCheckpoint("s", 0, 1));
  ASSERT_TRUE(write("d", 0, toks(20, 2000)));
  ASSERT_TRUE(putCheckpoint("d", 0, 2));
  ASSERT_TRUE(write("plain", 0, toks(20, 3000)));
  ASSERT_TRUE(write("d2", 0, toks(20, 4000)));
  ASSERT_TRUE(putCheckpoint("d2", 0, 3));

  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "s", "d", 20, SeqOptions{}).ok());
  EXPECT_EQ(checkpoints("d"), (std::vector<uint64_t>{0}));
  EXPECT_EQ(checkpointBytes("d", 0), blob(1, 100));
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "plain", "d2", 20, SeqOptions{}).ok());
  EXPECT_EQ(checkpoints("d2"), std::vector<uint64_t>{}) << "plain has no checkpoint";

  for (const char* name : {"s", "d", "plain", "d2"}) {
    ASSERT_TRUE(engine_->remove(space_, name, 0, kEnd).ok());
  }
  EXPECT_EQ(engine_->stats().sequences, 0u);
  EXPECT_EQ(blobsUsed(), 0u) << "every checkpoint block is freed with its last holder";
}

TEST_F(CheckpointTest, TruncateAndPutDropLaterCheckpoints) {
  ASSERT_TRUE(write("s", 0, toks(40, 1000)));
  for (uint64_t pos : {10u, 20u, 30u, 40u}) {
    ASSERT_TRUE(putCheckpoint("s", pos, static_cast<uint8_t>(pos)));
  }
  EXPECT_EQ(blobsUsed(), 4u);
  ASSERT_TRUE(engine_->truncate(space_, "s", 30).ok());
  EXPECT_EQ(checkpoints("s"), (std::vector<uint64_t>{10, 20, 30})) << "30 is the new end";
  EXPECT_EQ(blobsUsed(), 3u);
  ASSERT_TRUE(engine_->truncate(space_, "s", 25).ok());
  EXPECT_EQ(checkpoints("s"), (std::vector<uint64_t>{10, 20}));
  EXPECT_EQ(blobsUsed(), 2u);
  // A put replaces positions from `begin` on: a state after them (20) is stale, the state at
  // `begin` is not.
  ASSERT_TRUE(write("s", 15, toks(10, 5000)));
  EXPECT_EQ(len("s"), 25u);
  EXPECT_EQ(checkpoints("s"), (std::vector<uint64_t>{10}));
  EXPECT_EQ(blobsUsed(), 1u);
  ASSERT_TRUE(putCheckpoint("s", 25, 7));
  ASSERT_TRUE(write("s", 25, toks(5, 6000)));
  EXPECT_EQ(checkpoints("s"), (std::vector<uint64_t>{10, 25}));
  EXPECT_EQ(checkpointBytes("s", 25), blob(7, 100));
}

// =============================================================================================
// Position-independent entries

TEST_F(CheckpointTest, EntriesPutGetAndDeduplicate) {
  const Key128 k = keyOf(1);
  EXPECT_EQ(engine_->getEntry(space_, k).code(), ErrorCode::kNotFound);
  auto g = engine_->putEntry(space_, k, 300);
  ASSERT_TRUE(g.ok()) << g.error();
  EXPECT_EQ(g->bytes, 300u);
  const auto first = blob(1, 300);
  std::memcpy(at(g->block), first.data(), first.size());
  EXPECT_EQ(engine_->getEntry(space_, k).code(), ErrorCode::kNotFound) << "not before commit";
  EXPECT_EQ(engine_->stats().entries, 0u);
  ASSERT_TRUE(engine_->commit(g->lease, kEnd).ok());
  EXPECT_EQ(engine_->stats().entries, 1u);
  EXPECT_EQ(entryBytes(space_, k), first);
  EXPECT_EQ(blobsUsed(), 1u);

  // A second put of the same key is deduplicated: one entry, the first bytes, one block.
  ASSERT_TRUE(putEntry(space_, k, 2, 300));
  EXPECT_EQ(engine_->stats().entries, 1u);
  EXPECT_EQ(entryBytes(space_, k), first);
  EXPECT_EQ(blobsUsed(), 1u);

  ASSERT_TRUE(putEntry(space_, keyOf(2), 2, 9000));
  EXPECT_EQ(engine_->stats().entries, 2u);
  EXPECT_EQ(entryBytes(space_, keyOf(2)), blob(2, 9000));

  auto aborted = engine_->putEntry(space_, keyOf(3), 100);
  ASSERT_TRUE(aborted.ok());
  ASSERT_TRUE(engine_->abortWrite(aborted->lease).ok());
  EXPECT_EQ(engine_->getEntry(space_, keyOf(3)).code(), ErrorCode::kNotFound);
  EXPECT_EQ(engine_->putEntry(space_, keyOf(4), 0).code(), ErrorCode::kInvalidArgument);

  // Entries are per namespace.
  auto other = engine_->openSpace(layout_, saltFor("tenant-b"));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(engine_->getEntry(*other, k).code(), ErrorCode::kNotFound);
}

TEST_F(ShapesTest, EntriesAreEvictedLeastRecentlyUsedFirstButNeverWhilePinned) {
  // Room for three entries, nothing else; the order asserted is LRU's (--eviction lru).
  makeEngine(0, 3 * kBlobBlock, EvictionKind::kLru);
  for (uint8_t i = 1; i <= 3; ++i) ASSERT_TRUE(putEntry(space_, keyOf(i), i, 1000));
  EXPECT_EQ(engine_->stats().entries, 3u);
  EXPECT_EQ(entryBytes(space_, keyOf(1)), blob(1, 1000));  // 1 is now the most recently used

  ASSERT_TRUE(putEntry(space_, keyOf(4), 4, 1000));
  EXPECT_EQ(engine_->stats().evictions, 1u);
  EXPECT_EQ(engine_->stats().entries, 3u);
  EXPECT_EQ(engine_->getEntry(space_, keyOf(2)).code(), ErrorCode::kNotFound)
      << "2 was the least recently used";

  // LRU order now 3, 1, 4. Pin 3: the next put evicts 1 instead.
  auto pin3 = engine_->getEntry(space_, keyOf(3));
  ASSERT_TRUE(pin3.ok());
  ASSERT_TRUE(putEntry(space_, keyOf(5), 5, 1000));
  EXPECT_EQ(engine_->getEntry(space_, keyOf(1)).code(), ErrorCode::kNotFound);
  const auto pinned = blob(3, 1000);
  EXPECT_EQ(std::memcmp(at(pin3->block), pinned.data(), pinned.size()), 0);

  // Everything pinned: FULL, nothing evicted.
  auto pin4 = engine_->getEntry(space_, keyOf(4));
  auto pin5 = engine_->getEntry(space_, keyOf(5));
  ASSERT_TRUE(pin4.ok());
  ASSERT_TRUE(pin5.ok());
  const uint64_t evictions = engine_->stats().evictions;
  EXPECT_EQ(engine_->putEntry(space_, keyOf(6), 1000).code(), ErrorCode::kFull);
  EXPECT_EQ(engine_->stats().evictions, evictions);
  for (auto* l : {&pin3, &pin4, &pin5}) EXPECT_TRUE(engine_->releaseRead((*l)->lease).ok());
  ASSERT_TRUE(putEntry(space_, keyOf(6), 6, 1000));
  EXPECT_EQ(engine_->stats().entries, 3u);
  EXPECT_EQ(entryBytes(space_, keyOf(6)), blob(6, 1000));
}

}  // namespace
}  // namespace kvtier
