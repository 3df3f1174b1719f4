// Engine unit tests of the cache shapes: snapshots (restore, rewind, merge, split) and
// sliding-window and chunked sequences (checkpoints and entries: engine_blobs_test.cc; middle
// removal: engine_removal_test.cc). Real BlockPool + HeapBlockMemory + Engine, in-process.
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
// Snapshots

TEST_F(ShapesTest, SnapshotSharesBlocksAndSurvivesWritesTruncationAndRemoval) {
  const auto t = toks(40, 1000);
  ASSERT_TRUE(write("s", 0, t));
  const uint64_t before = used();
  const auto whole = snap("s", 0);
  EXPECT_EQ(whole.from, 0u);
  EXPECT_EQ(whole.to, 40u);
  EXPECT_FALSE(whole.hasCheckpoints);
  const auto tail = snap("s", 20);
  EXPECT_EQ(tail.from, 20u);
  EXPECT_EQ(tail.to, 40u);
  EXPECT_NE(whole.id, tail.id);
  EXPECT_EQ(used(), before) << "snapshots share blocks: no copy";
  EXPECT_EQ(engine_->stats().snapshots, 2u);
  auto info = engine_->snapshotInfo(space_, tail.id);
  ASSERT_TRUE(info.ok()) << info.error();
  EXPECT_EQ(info->from, 20u);
  EXPECT_EQ(info->to, 40u);

  // Later writes: a cut into the partial last block (which both snapshots share) and an append at
  // the new end, which must not write into it; a replacement from inside the sealed first block;
  // then the sequence's removal.
  ASSERT_TRUE(engine_->truncate(space_, "s", 34).ok());
  ASSERT_TRUE(write("s", 34, toks(10, 7000)));
  ASSERT_TRUE(write("s", 5, toks(3, 8000)));
  ASSERT_TRUE(engine_->remove(space_, "s", 0, kEnd).ok());
  EXPECT_EQ(len("s"), std::nullopt);

  ASSERT_TRUE(restore("r", whole.id, 40).ok());
  EXPECT_EQ(len("r"), 40u);
  EXPECT_EQ(read("r"), tagsOf(t));
  ASSERT_TRUE(write("r2", 0, head(t, 20)));
  ASSERT_TRUE(restore("r2", tail.id, 40).ok());
  EXPECT_EQ(read("r2"), tagsOf(t));
  // The snapshot itself did not change: a second restore gives the same bytes.
  ASSERT_TRUE(restore("r3", whole.id, 40).ok());
  EXPECT_EQ(read("r3"), tagsOf(t));
}

// A snapshot taken while a put appends in place to the sequence's partial last block: the block
// goes on changing under the open put, so the snapshot holds a copy of its slots — bytes that
// stay as they were (the cold tier checksums and copies them at different moments).
TEST_F(ShapesTest, ASnapshotTakenDuringAnInPlaceAppendHoldsItsOwnCopyOfTheLastBlock) {
  const auto t = toks(20, 1000);
  ASSERT_TRUE(write("s", 0, t));
  const auto appended = toks(8, 2000);
  auto g = engine_->put(kOwner, space_, "s", 20, appended, {}, SeqOptions{});
  ASSERT_TRUE(g.ok()) << g.error();
  const BlockLocation last = g->blocks[0];  // the sequence's own partial block, in place
  const auto s = snap("s", 0);
  auto pinned = engine_->pinSnapshot(space_, s.id);
  ASSERT_TRUE(pinned.ok()) << pinned.error();
  ASSERT_EQ(pinned->parts.size(), 2u);
  EXPECT_NE(pinned->parts[1].location, last) << "the snapshot shares a block still being written";
  const std::vector<uint8_t> before(at(pinned->parts[1].location),
                                    at(pinned->parts[1].location) + layout_.blockBytes());
  fill(*g, 20, appended);
  ASSERT_TRUE(engine_->commit(g->lease, kEnd).ok());
  EXPECT_EQ(std::vector<uint8_t>(at(pinned->parts[1].location),
                                 at(pinned->parts[1].location) + layout_.blockBytes()),
            before);
  ASSERT_TRUE(engine_->releaseRead(pinned->lease).ok());
  ASSERT_TRUE(restore("r", s.id, 20).ok());
  EXPECT_EQ(read("r"), tagsOf(t));
  EXPECT_EQ(read("s"), tagsOf(cat(t, appended)));
}

TEST_F(ShapesTest, SnapshotSurvivesTheEndOfItsSession) {
  const auto t = toks(30, 1000);
  ASSERT_TRUE(write("s", 0, t, SeqOptions{}, /*owner=*/7));
  const auto sn = snap("s", 0);
  engine_->endOwner(7);
  EXPECT_EQ(len("s"), std::nullopt);
  ASSERT_TRUE(restore("r", sn.id, 30).ok());
  EXPECT_EQ(read("r"), tagsOf(t));
}

TEST_F(ShapesTest, SnapshotFromAtOrPastTheEndIsEmpty) {
  const auto t = toks(20, 1000);
  ASSERT_TRUE(write("s", 0, t));
  const uint64_t before = used();
  for (uint64_t from : {20u, 25u, 1000u}) {
    const auto e = snap("s", from);
    EXPECT_EQ(e.from, from);
    EXPECT_EQ(e.to, from) << "empty: [from, from)";
    EXPECT_FALSE(e.hasCheckpoints);
  }
  EXPECT_EQ(used(), before);
  EXPECT_EQ(engine_->snapshot(space_, "nosuch", 0).code(), ErrorCode::kNotFound);

  // An empty snapshot past the end needs a prefix the sequence lacks; a target other than `from`
  // is outside it.
  const auto e25 = snap("s", 25);
  EXPECT_EQ(restore("s", e25.id, 25).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(restore("nosuch", e25.id, 25).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("nosuch"), std::nullopt);
  const auto e20 = snap("s", 20);
  EXPECT_EQ(restore("s", e20.id, 21).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(restore("s", e20.id, 19).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("s"), 20u);
  EXPECT_EQ(read("s"), tagsOf(t));
  EXPECT_EQ(used(), before);
}

TEST_F(ShapesTest, RestoringAnEmptySnapshotKeepsThePrefix) {
  // A sequence longer than the empty snapshot's `from`, with the same first 20 tokens.
  const auto t = toks(30, 1000);
  ASSERT_TRUE(write("s", 0, head(t, 20)));
  ASSERT_TRUE(write("l", 0, t));
  const auto e = snap("s", 20);
  ASSERT_EQ(e.from, 20u);
  ASSERT_EQ(e.to, 20u);
  // Run first in a child process: a crash there is a failure here, not the end of the suite.
  EXPECT_EXIT(
      {
        const bool ok = restore("l", e.id, 20).ok() && restore("s", e.id, 20).ok();
        std::_Exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "")
      << "restore of an empty snapshot onto a sequence holding its prefix";
  if (HasFailure()) return;
  ASSERT_TRUE(restore("l", e.id, 20).ok());
  EXPECT_EQ(len("l"), 20u);
  EXPECT_EQ(read("l"), tagsOf(head(t, 20)));
  ASSERT_TRUE(restore("s", e.id, 20).ok());
  EXPECT_EQ(read("s"), tagsOf(head(t, 20)));
}

TEST_F(ShapesTest, SplittingOrMergingEmptySnapshots) {
  const auto t = toks(20, 1000);
  ASSERT_TRUE(write("s", 0, t));
  const auto e = snap("s", 20);  // [20, 20)
  const auto whole = snap("s", 0);
  // Run first in a child process: a crash there is a failure here, not the end of the suite.
  EXPECT_EXIT(
      {
        auto r = engine_->splitSnapshot(space_, e.id, 20);
        std::_Exit(r.ok() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "")
      << "split of an empty snapshot";
  if (HasFailure()) return;
  auto [l, r] = split(e, 20);
  EXPECT_EQ(l.from, 20u);
  EXPECT_EQ(l.to, 20u);
  EXPECT_EQ(r.from, 20u);
  EXPECT_EQ(r.to, 20u);
  // An empty snapshot merged on either side of a non-empty one changes nothing.
  const auto m = merge(whole, e);
  EXPECT_EQ(m.from, 0u);
  EXPECT_EQ(m.to, 20u);
  ASSERT_TRUE(restore("r", m.id, 20).ok());
  EXPECT_EQ(read("r"), tagsOf(t));
}

TEST_F(ShapesTest, RestoreOutsideTheSnapshotOrWithoutThePrefixIsInvalidAndChangesNothing) {
  const auto t = toks(40, 1000);
  ASSERT_TRUE(write("s", 0, t));
  ASSERT_TRUE(write("short", 0, head(t, 10)));
  const auto sn = snap("s", 16);
  const uint64_t before = used();

  EXPECT_EQ(restore("s", sn.id, 41).code(), ErrorCode::kInvalidArgument) << "past `to`";
  EXPECT_EQ(restore("s", sn.id, kEnd).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(restore("s", sn.id, 15).code(), ErrorCode::kInvalidArgument) << "before `from`";
  EXPECT_EQ(restore("s", sn.id, 0).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(restore("short", sn.id, 30).code(), ErrorCode::kInvalidArgument)
      << "short lacks [0, 16)";
  EXPECT_EQ(restore("nosuch", sn.id, 30).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(restore("", sn.id, 30).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("nosuch"), std::nullopt);
  EXPECT_EQ(read("s"), tagsOf(t));
  EXPECT_EQ(read("short"), tagsOf(head(t, 10)));
  EXPECT_EQ(used(), before);

  // Both ends are valid targets.
  ASSERT_TRUE(write("p", 0, head(t, 16)));
  ASSERT_TRUE(restore("p", sn.id, 16).ok());
  EXPECT_EQ(read("p"), tagsOf(head(t, 16)));
  ASSERT_TRUE(restore("p", sn.id, 40).ok());
  EXPECT_EQ(read("p"), tagsOf(t));
}

TEST_F(ShapesTest, RestoreOntoAnotherSequenceWithTheSamePrefix) {
  const auto a = toks(20, 1000), b = toks(20, 2000), c = toks(12, 3000);
  const auto ab = cat(a, b);
  ASSERT_TRUE(write("s", 0, ab));
  const auto mid = snap("s", 20);      // starts inside block 1
  const auto aligned = snap("s", 16);  // starts at block 1

  ASSERT_TRUE(write("o", 0, cat(a, c)));
  ASSERT_TRUE(restore("o", mid.id, 40).ok());
  EXPECT_EQ(len("o"), 40u);
  EXPECT_EQ(read("o"), tagsOf(ab));

  ASSERT_TRUE(write("o2", 0, cat(a, c)));
  ASSERT_TRUE(restore("o2", mid.id, 30).ok());
  EXPECT_EQ(read("o2"), tagsOf(head(ab, 30)));

  ASSERT_TRUE(write("o3", 0, cat(a, c)));
  ASSERT_TRUE(restore("o3", mid.id, 20).ok());
  EXPECT_EQ(read("o3"), tagsOf(a));

  ASSERT_TRUE(write("o4", 0, cat(head(a, 16), toks(5, 4000))));
  ASSERT_TRUE(restore("o4", aligned.id, 40).ok());
  EXPECT_EQ(read("o4"), tagsOf(ab));

  // A fresh sequence takes a snapshot that starts at 0.
  const auto whole = snap("s", 0);
  ASSERT_TRUE(restore("fresh", whole.id, 33).ok());
  EXPECT_EQ(read("fresh"), tagsOf(head(ab, 33)));

  // Writing to the restored sequences changes neither the source nor the snapshot.
  ASSERT_TRUE(write("o", 25, toks(10, 5000)));
  ASSERT_TRUE(write("o2", 30, toks(10, 5000)));
  ASSERT_TRUE(write("fresh", 33, toks(2, 6000)));
  EXPECT_EQ(read("s"), tagsOf(ab));
  ASSERT_TRUE(write("again", 0, a));
  ASSERT_TRUE(restore("again", mid.id, 40).ok());
  EXPECT_EQ(read("again"), tagsOf(ab));
}

TEST_F(ShapesTest, RestoreOntoADifferentPrefixIsNeverIndexedPastIt) {
  // The snapshot's KV was computed after `a`; restored after `d` it is not what a prefill of
  // d + b gives, so the block mixing them (and everything after) must not be found by a lookup.
  const auto a = toks(20, 1000), b = toks(20, 2000), d = toks(20, 4000);
  ASSERT_TRUE(write("s", 0, cat(a, b)));
  const auto sn = snap("s", 20);
  ASSERT_TRUE(write("d", 0, d));
  ASSERT_TRUE(restore("d", sn.id, 40).ok());
  EXPECT_EQ(read("d"), tagsOf(cat(d, b)));
  EXPECT_EQ(matched(cat(d, b)), 16u);
  const auto more = toks(30, 6000);
  ASSERT_TRUE(write("d", 40, more));
  EXPECT_EQ(matched(cat(cat(d, b), more)), 16u);
  EXPECT_EQ(matched(cat(a, b)), 32u) << "the source's own blocks stay indexed";

  // The same first block but different tokens after it (16..19, in the block holding `from`):
  // still not the prefix the snapshot continues. Blocks completed later must not be indexed under
  // the source's key chain either: a lookup of a + b + more must not find d2's KV of `more`.
  const auto d2 = cat(head(a, 16), toks(4, 4500));
  ASSERT_TRUE(write("d2", 0, d2));
  ASSERT_TRUE(restore("d2", sn.id, 40).ok());
  EXPECT_EQ(read("d2"), tagsOf(cat(d2, b)));
  ASSERT_TRUE(write("d2", 40, more));
  EXPECT_EQ(matched(cat(cat(d2, b), more)), 16u);
  EXPECT_EQ(matched(cat(cat(a, b), more)), 32u);
}

TEST_F(ShapesTest, RewindWithoutASnapshot) {
  const auto t = toks(40, 1000);
  ASSERT_TRUE(write("s", 0, t));
  ASSERT_TRUE(restore("s", std::nullopt, 40).ok());
  EXPECT_EQ(len("s"), 40u);
  EXPECT_EQ(restore("s", std::nullopt, 41).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("s"), 40u);
  ASSERT_TRUE(restore("s", std::nullopt, 25).ok());
  EXPECT_EQ(len("s"), 25u);
  EXPECT_EQ(read("s"), tagsOf(head(t, 25)));
  EXPECT_TRUE(resumable("s", 25));
  EXPECT_FALSE(resumable("s", 26));
  EXPECT_TRUE(restore("nosuch", std::nullopt, 0).ok());
  EXPECT_EQ(restore("nosuch", std::nullopt, 1).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("nosuch"), std::nullopt);
  ASSERT_TRUE(restore("s", std::nullopt, 0).ok());
  EXPECT_EQ(len("s").value_or(0), 0u);
}

TEST_F(ShapesTest, MergeOfAdjacentSnapshotsRestoresTheOriginalBytes) {
  const auto t = toks(50, 1000);
  ASSERT_TRUE(write("s", 0, head(t, 20)));
  const auto a = snap("s", 0);  // [0, 20): ends inside block 1
  ASSERT_TRUE(write("s", 20, slice(t, 20, 45)));
  const auto b = snap("s", 20);  // [20, 45)
  ASSERT_TRUE(write("s", 45, slice(t, 45, 50)));
  const auto c = snap("s", 45);  // [45, 50)

  const auto ab = merge(a, b);
  EXPECT_EQ(ab.from, 0u);
  EXPECT_EQ(ab.to, 45u);
  const auto abc = merge(ab, c);
  EXPECT_EQ(abc.from, 0u);
  EXPECT_EQ(abc.to, 50u);
  const auto bc = merge(b, c);
  EXPECT_EQ(bc.from, 20u);
  EXPECT_EQ(bc.to, 50u);

  // Not adjacent: a.to != b.from.
  const uint64_t count = engine_->stats().snapshots;
  EXPECT_EQ(engine_->mergeSnapshots(space_, b.id, a.id).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->mergeSnapshots(space_, a.id, c.id).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->mergeSnapshots(space_, a.id, a.id).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->mergeSnapshots(space_, c.id, ab.id).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->stats().snapshots, count);

  // The merged snapshots outlive their parts and the sequence.
  ASSERT_TRUE(engine_->truncate(space_, "s", 0).ok());
  for (const auto& x : {a, b, c}) ASSERT_TRUE(engine_->dropSnapshot(space_, x.id).ok());
  ASSERT_TRUE(restore("r", abc.id, 50).ok());
  EXPECT_EQ(read("r"), tagsOf(t));
  ASSERT_TRUE(restore("r2", ab.id, 45).ok());
  EXPECT_EQ(read("r2"), tagsOf(head(t, 45)));
  ASSERT_TRUE(restore("r3", ab.id, 33).ok());
  EXPECT_EQ(read("r3"), tagsOf(head(t, 33)));
  ASSERT_TRUE(write("r4", 0, head(t, 20)));
  ASSERT_TRUE(restore("r4", bc.id, 50).ok());
  EXPECT_EQ(read("r4"), tagsOf(t));
}

TEST_F(ShapesTest, MergeAtABlockBoundaryAndWithEmptySnapshots) {
  const auto t = toks(50, 1000);
  ASSERT_TRUE(write("s", 0, head(t, 32)));
  const auto a = snap("s", 0);       // [0, 32)
  const auto empty = snap("s", 32);  // [32, 32)
  ASSERT_TRUE(write("s", 32, slice(t, 32, 50)));
  const auto b = snap("s", 32);  // [32, 50)
  const auto ab = merge(a, b);
  EXPECT_EQ(ab.from, 0u);
  EXPECT_EQ(ab.to, 50u);
  ASSERT_TRUE(restore("r", ab.id, 50).ok());
  EXPECT_EQ(read("r"), tagsOf(t));

  const auto ae = merge(a, empty);
  EXPECT_EQ(ae.from, 0u);
  EXPECT_EQ(ae.to, 32u);
  const auto eb = merge(empty, b);
  EXPECT_EQ(eb.from, 32u);
  EXPECT_EQ(eb.to, 50u);
  ASSERT_TRUE(restore("r2", ae.id, 32).ok());
  EXPECT_EQ(read("r2"), tagsOf(head(t, 32)));
  ASSERT_TRUE(restore("r2", eb.id, 50).ok());
  EXPECT_EQ(read("r2"), tagsOf(t));
}

TEST_F(ShapesTest, SplitAtEitherEndOrOutsideGivesOneEmptyHalf) {
  const auto t = toks(40, 1000);
  ASSERT_TRUE(write("s", 0, t));
  const auto whole = snap("s", 0);  // [0, 40)
  const auto part = snap("s", 10);  // [10, 40)

  auto [l, r] = split(whole, 20);
  EXPECT_EQ(l.from, 0u);
  EXPECT_EQ(l.to, 20u);
  EXPECT_EQ(r.from, 20u);
  EXPECT_EQ(r.to, 40u);
  ASSERT_TRUE(restore("p", l.id, 20).ok());
  EXPECT_EQ(read("p"), tagsOf(head(t, 20)));
  EXPECT_EQ(restore("p", l.id, 21).code(), ErrorCode::kInvalidArgument) << "past the left half";
  ASSERT_TRUE(restore("p", r.id, 40).ok());
  EXPECT_EQ(read("p"), tagsOf(t));

  struct Case {
    const SnapshotInfo& s;
    uint64_t at, lFrom, lTo, rFrom, rTo;
  };
  for (const Case& c : {Case{whole, 0, 0, 0, 0, 40}, Case{whole, 40, 0, 40, 40, 40},
                        Case{whole, 1000, 0, 40, 40, 40}, Case{part, 10, 10, 10, 10, 40},
                        Case{part, 5, 10, 10, 10, 40}, Case{part, 40, 10, 40, 40, 40}}) {
    SCOPED_TRACE(::testing::Message() << "[" << c.s.from << ", " << c.s.to << ") at " << c.at);
    auto [x, y] = split(c.s, c.at);
    EXPECT_EQ(x.from, c.lFrom);
    EXPECT_EQ(x.to, c.lTo);
    EXPECT_EQ(y.from, c.rFrom);
    EXPECT_EQ(y.to, c.rTo);
    // The non-empty half still restores the original bytes.
    const SnapshotInfo& full = x.from == x.to ? y : x;
    if (full.from > 0) {
      ASSERT_TRUE(write("q", 0, head(t, full.from)));
    }
    ASSERT_TRUE(restore("q", full.id, full.to).ok());
    EXPECT_EQ(read("q"), tagsOf(head(t, full.to)));
    ASSERT_TRUE(engine_->truncate(space_, "q", 0).ok());
  }

  // Split inside a block, then merge the halves back: the original bytes.
  auto [left, right] = split(part, 25);
  const auto back = merge(left, right);
  EXPECT_EQ(back.from, 10u);
  EXPECT_EQ(back.to, 40u);
  ASSERT_TRUE(engine_->truncate(space_, "s", 0).ok());
  ASSERT_TRUE(write("m", 0, head(t, 10)));
  ASSERT_TRUE(restore("m", back.id, 40).ok());
  EXPECT_EQ(read("m"), tagsOf(t));
}

TEST_F(ShapesTest, UnknownOrForeignSnapshotIdsAreNotFound) {
  const auto t = toks(20, 1000);
  ASSERT_TRUE(write("s", 0, t));
  const auto mine = snap("s", 0);
  auto other = engine_->openSpace(layout_, saltFor("tenant-b"));
  ASSERT_TRUE(other.ok());
  ASSERT_NE(*other, space_);
  auto g = engine_->put(kOwner, *other, "s", 0, t, {}, SeqOptions{});
  ASSERT_TRUE(g.ok()) << g.error();
  fill(*g, 0, t);
  ASSERT_TRUE(engine_->commit(g->lease, kEnd).ok());
  auto foreign = engine_->snapshot(*other, "s", 0);
  ASSERT_TRUE(foreign.ok()) << foreign.error();

  for (SnapshotId id : {SnapshotId{987654}, foreign->id}) {
    SCOPED_TRACE(::testing::Message() << "snapshot " << id);
    EXPECT_EQ(engine_->snapshotInfo(space_, id).code(), ErrorCode::kNotFound);
    EXPECT_EQ(restore("s", id, 0).code(), ErrorCode::kNotFound);
    EXPECT_EQ(restore("s", id, 20).code(), ErrorCode::kNotFound);
    EXPECT_EQ(engine_->mergeSnapshots(space_, mine.id, id).code(), ErrorCode::kNotFound);
    EXPECT_EQ(engine_->mergeSnapshots(space_, id, mine.id).code(), ErrorCode::kNotFound);
    EXPECT_EQ(engine_->splitSnapshot(space_, id, 5).code(), ErrorCode::kNotFound);
    EXPECT_EQ(engine_->dropSnapshot(space_, id).code(), ErrorCode::kNotFound);
  }
  EXPECT_EQ(engine_->snapshotInfo(*other, mine.id).code(), ErrorCode::kNotFound);
  EXPECT_EQ(engine_->dropSnapshot(*other, mine.id).code(), ErrorCode::kNotFound);
  // Both still work in their own spaces.
  EXPECT_TRUE(engine_->snapshotInfo(*other, foreign->id).ok());
  EXPECT_TRUE(engine_->snapshotInfo(space_, mine.id).ok());
  EXPECT_EQ(read("s"), tagsOf(t));
}

TEST_F(ShapesTest, DropSnapshotReleasesItsBlocks) {
  makeEngine(4);
  const auto t = toks(60, 1000);  // 3 sealed blocks and a partial one: the whole pool
  ASSERT_TRUE(write("s", 0, t));
  const auto sn = snap("s", 0);
  ASSERT_TRUE(engine_->remove(space_, "s", 0, kEnd).ok());
  EXPECT_EQ(len("s"), std::nullopt);
  EXPECT_EQ(used(), 4u);
  EXPECT_EQ(held(), 4u) << "the snapshot holds every block; none is evictable";
  EXPECT_EQ(engine_->put(kOwner, space_, "t", 0, toks(16, 5000), {}, SeqOptions{}).code(),
            ErrorCode::kFull);

  ASSERT_TRUE(engine_->dropSnapshot(space_, sn.id).ok());
  EXPECT_EQ(engine_->dropSnapshot(space_, sn.id).code(), ErrorCode::kNotFound);
  EXPECT_EQ(engine_->stats().snapshots, 0u);
  EXPECT_EQ(held(), 0u);
  EXPECT_EQ(used(), 3u) << "the partial block is freed, sealed ones stay cached in the index";
  EXPECT_EQ(matched(t), 48u);
  ASSERT_TRUE(write("t", 0, toks(64, 5000))) << "the whole pool is usable again";
  EXPECT_EQ(read("t"), tagsOf(toks(64, 5000)));
}

// =============================================================================================
// Sliding windows and chunks

TEST_F(ShapesTest, WindowKeepsTheLastWTokensAndReleasesBlocksWhollyBeforeIt) {
  const SeqOptions w{.window = 20};
  const auto t = toks(48, 1000);
  ASSERT_TRUE(write("s", 0, head(t, 16), w));
  EXPECT_EQ(held(), 1u);
  EXPECT_TRUE(resumable("s", 0));
  EXPECT_TRUE(resumable("s", 16));
  ASSERT_TRUE(write("s", 16, slice(t, 16, 32), w));
  // Window [12, 32): no block lies wholly before it.
  EXPECT_EQ(held(), 2u);
  EXPECT_TRUE(resumable("s", 32));
  EXPECT_FALSE(resumable("s", 31)) << "max(0, 31 - 20) = 11 < 12";
  EXPECT_FALSE(resumable("s", 0));
  EXPECT_EQ(readRange("s", 12, 32), tagsOf(slice(t, 12, 32)));
  EXPECT_EQ(getCode("s", 11, 32), ErrorCode::kInvalidArgument);

  ASSERT_TRUE(write("s", 32, slice(t, 32, 48), w));
  // Window [28, 48): block 0 is released (cached in the index), block 1 is still needed.
  EXPECT_EQ(len("s"), 48u);
  EXPECT_EQ(held(), 2u);
  EXPECT_EQ(engine_->stats().blocksCached, 1u);
  EXPECT_EQ(readRange("s", 28, 48), tagsOf(slice(t, 28, 48)));
  EXPECT_EQ(getCode("s", 27, 48), ErrorCode::kInvalidArgument);
  EXPECT_EQ(getCode("s", 16, 20), ErrorCode::kInvalidArgument);
  EXPECT_EQ(getCode("s", 0, kEnd), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(resumable("s", 48));
  EXPECT_FALSE(resumable("s", 47));
  EXPECT_FALSE(resumable("s", 49));
  EXPECT_EQ(engine_->snapshot(space_, "s", 27).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(snap("s", 28).to, 48u);
  // A write that would need released positions is refused.
  EXPECT_EQ(engine_->put(kOwner, space_, "s", 40, toks(2, 9000), {}, w).code(),
            ErrorCode::kInvalidArgument);
}

TEST_F(ShapesTest, WindowedSequenceStreamsThroughAPoolSmallerThanIt) {
  makeEngine(3);
  const SeqOptions w{.window = 20};
  const auto t = toks(200, 1000);
  for (size_t begin = 0; begin < t.size(); begin += 8) {
    ASSERT_TRUE(write("s", begin, slice(t, begin, begin + 8), w)) << "at " << begin;
    EXPECT_LE(held(), 2u) << "at " << begin;
  }
  EXPECT_EQ(len("s"), 200u);
  EXPECT_EQ(readRange("s", 180, 200), tagsOf(slice(t, 180, 200)));
  EXPECT_GT(engine_->stats().evictions, 0u);
}

TEST_F(ShapesTest, WindowOfOne) {
  makeEngine(2);
  const SeqOptions w{.window = 1};
  for (uint32_t i = 0; i < 40; ++i) {
    SCOPED_TRACE(::testing::Message() << "length " << i + 1);
    ASSERT_TRUE(write("s", i, {5000 + i}, w));
    EXPECT_EQ(len("s"), i + 1);
    EXPECT_EQ(readRange("s", i, i + 1), Tags{5000 + i});
    EXPECT_TRUE(resumable("s", i + 1));
    if (i >= 1) {
      EXPECT_FALSE(resumable("s", i));
      EXPECT_EQ(getCode("s", i - 1, i + 1), ErrorCode::kInvalidArgument);
    }
    EXPECT_LE(held(), 2u);
  }
  EXPECT_EQ(held(), 1u) << "at 40 only block 2 is needed";
}

TEST_F(ShapesTest, ABatchLargerThanTheWindow) {
  const SeqOptions w{.window = 8};
  const auto t = toks(40, 1000);
  ASSERT_TRUE(write("s", 0, t, w));
  EXPECT_EQ(len("s"), 40u);
  EXPECT_EQ(held(), 1u) << "window [32, 40): blocks 0 and 1 are released at commit";
  EXPECT_EQ(readRange("s", 32, 40), tagsOf(slice(t, 32, 40)));
  EXPECT_EQ(getCode("s", 31, 40), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(resumable("s", 40));
  EXPECT_FALSE(resumable("s", 39));

  const auto more = toks(50, 2000);
  ASSERT_TRUE(write("s", 40, more, w));
  EXPECT_EQ(len("s"), 90u);
  EXPECT_EQ(held(), 1u) << "window [82, 90) lies in block 5";
  EXPECT_EQ(readRange("s", 82, 90), tagsOf(slice(more, 42, 50)));
  EXPECT_EQ(getCode("s", 81, 90), ErrorCode::kInvalidArgument);
}

TEST_F(ShapesTest, WindowAndChunkAreExclusive) {
  EXPECT_EQ(engine_->put(kOwner, space_, "s", 0, toks(4, 1), {}, {.window = 8, .chunk = 8}).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("s"), std::nullopt);
}

TEST_F(ShapesTest, ChunkBoundaries) {
  const SeqOptions c{.chunk = 24};  // chunks [0, 24), [24, 48), ...; blocks of 16
  const auto t = toks(23, 1000), u = toks(25, 2000);
  ASSERT_TRUE(write("s", 0, t, c));
  EXPECT_EQ(held(), 2u);
  EXPECT_TRUE(resumable("s", 0));
  EXPECT_TRUE(resumable("s", 23));
  EXPECT_EQ(readRange("s", 0, 23), tagsOf(t));

  // Position 24 starts a new chunk: block 0 ([0, 16)) is wholly before it.
  ASSERT_TRUE(write("s", 23, {3000}, c));
  EXPECT_EQ(held(), 1u);
  EXPECT_TRUE(resumable("s", 24));
  EXPECT_FALSE(resumable("s", 23));
  EXPECT_FALSE(resumable("s", 0));
  EXPECT_EQ(getCode("s", 24, 24), ErrorCode::kOk);
  EXPECT_EQ(getCode("s", 23, 24), ErrorCode::kInvalidArgument);
  EXPECT_EQ(getCode("s", 16, 24), ErrorCode::kInvalidArgument);

  ASSERT_TRUE(write("s", 24, slice(u, 0, 23), c));  // length 47: still chunk [24, 48)
  EXPECT_EQ(held(), 2u);
  EXPECT_TRUE(resumable("s", 24));
  EXPECT_TRUE(resumable("s", 30));
  EXPECT_TRUE(resumable("s", 47));
  EXPECT_FALSE(resumable("s", 23));
  EXPECT_EQ(readRange("s", 24, 47), tagsOf(slice(u, 0, 23)));
  // Rewinds inside the current chunk work, before it they fail and change nothing.
  ASSERT_TRUE(restore("s", std::nullopt, 30).ok());
  EXPECT_EQ(len("s"), 30u);
  EXPECT_EQ(readRange("s", 24, 30), tagsOf(slice(u, 0, 6)));
  EXPECT_EQ(restore("s", std::nullopt, 23).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("s"), 30u);

  // Length 48 starts chunk [48, 72): every block so far is wholly before it.
  ASSERT_TRUE(write("s", 30, toks(18, 4000), c));
  EXPECT_EQ(len("s"), 48u);
  EXPECT_EQ(held(), 0u);
  EXPECT_TRUE(resumable("s", 48));
  EXPECT_FALSE(resumable("s", 47));
  EXPECT_EQ(getCode("s", 47, 48), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(write("s", 48, {5000}, c));
  EXPECT_EQ(held(), 1u);
  EXPECT_EQ(readRange("s", 48, 49), Tags{5000});
}

TEST_F(ShapesTest, RestoringAWindowedSequenceWhoseWindowIsGoneFails) {
  const SeqOptions w{.window = 16};
  const auto t = toks(40, 1000);
  // While the whole window is there, rewinds and restores work.
  ASSERT_TRUE(write("k", 0, head(t, 12), w));
  ASSERT_TRUE(restore("k", std::nullopt, 6).ok());
  EXPECT_EQ(readRange("k", 0, 6), tagsOf(head(t, 6)));
  ASSERT_TRUE(write("k", 6, slice(t, 6, 12), w));
  const auto early = snap("k", 4);
  ASSERT_TRUE(write("k", 12, slice(t, 12, 14), w));
  ASSERT_TRUE(restore("k", early.id, 12).ok());
  EXPECT_EQ(len("k"), 12u);
  EXPECT_EQ(readRange("k", 0, 12), tagsOf(head(t, 12)));

  // Past the window, positions before 40 - 16 = 24 are gone.
  ASSERT_TRUE(write("k", 12, slice(t, 12, 40), w));
  EXPECT_EQ(restore("k", early.id, 12).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(restore("k", std::nullopt, 30).code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(resumable("k", 12));
  EXPECT_FALSE(resumable("k", 30));
  EXPECT_EQ(len("k"), 40u);
  EXPECT_EQ(readRange("k", 24, 40), tagsOf(slice(t, 24, 40)));
}

}  // namespace
}  // namespace kvtier
