// Engine unit tests for the cache shapes of issue 3: snapshots (restore, rewind, merge, split),
// sliding-window and chunked sequences, recurrent state checkpoints, position-independent entries
// and middle removal with K re-rotation. Real BlockPool + HeapBlockMemory + Engine, in-process.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/rope.h"
#include "kernels/rope_test_util.h"
#include "store/engine.h"
#include "store/engine_test_util.h"

namespace kvtier {

namespace {

using namespace test_util;  // smallLayout, Tags, tags, toks, kOwner, EngineHarness
using kernels::testing::decode;
using kernels::testing::elemBytes;
using kernels::testing::encode;
using kernels::testing::partner;
using kernels::testing::referenceRope;
using kernels::testing::tolerance;

constexpr uint32_t kBt = 16;
// Checkpoints and entries live in blob blocks of 4 KiB and more (engine_shapes.cc); pools that hold
// blobs get room for some.
constexpr uint64_t kBlobBlock = 4096;

std::vector<uint32_t> slice(const std::vector<uint32_t>& v, size_t begin, size_t end) {
  return {v.begin() + begin, v.begin() + end};
}

// Blob contents (checkpoints, entries): a pattern that differs per seed.
std::vector<uint8_t> blob(uint8_t seed, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 37 + i * 13 + (i >> 8));
  return v;
}

// The engine harness plus the helpers of the cache shapes, shared by the fixtures below.
class Harness : protected EngineHarness {
 protected:
  // put + write the tokens as tags + commit everything.
  ::testing::AssertionResult write(std::string_view seq, uint64_t begin,
                                   const std::vector<uint32_t>& tokens,
                                   const SeqOptions& options = {}, OwnerId owner = kOwner) {
    return putAndCommit(space_, seq, begin, tokens, options, owner);
  }
  Tags read(std::string_view seq) { return readRange(seq, 0, kEnd); }

  ErrorCode getCode(std::string_view seq, uint64_t begin, uint64_t end) {
    auto g = engine_->get(space_, seq, begin, end);
    if (g.ok() && g->lease != 0) {
      EXPECT_TRUE(engine_->releaseRead(g->lease).ok());
    }
    return g.code();
  }

  SnapshotInfo snap(std::string_view seq, uint64_t from) {
    auto r = engine_->snapshot(space_, seq, from);
    if (!r.ok()) {
      ADD_FAILURE() << "snapshot '" << seq << "' from " << from << ": " << r.error();
      return {};
    }
    return *r;
  }
  Status restore(std::string_view seq, std::optional<SnapshotId> id, uint64_t target,
                 const SeqOptions& options = {}) {
    return engine_->restore(kOwner, space_, seq, id, target, options);
  }
  SnapshotInfo merge(const SnapshotInfo& a, const SnapshotInfo& b) {
    auto r = engine_->mergeSnapshots(space_, a.id, b.id);
    if (!r.ok()) {
      ADD_FAILURE() << "merge of [" << a.from << ", " << a.to << ") and [" << b.from << ", " << b.to
                    << "): " << r.error();
      return {};
    }
    return *r;
  }
  std::pair<SnapshotInfo, SnapshotInfo> split(const SnapshotInfo& s, uint64_t at) {
    auto r = engine_->splitSnapshot(space_, s.id, at);
    if (!r.ok()) {
      ADD_FAILURE() << "split of [" << s.from << ", " << s.to << ") at " << at << ": " << r.error();
      return {};
    }
    return *r;
  }

  // A checkpoint of blob(seed, n) at pos of seq, written and committed.
  ::testing::AssertionResult putCheckpoint(std::string_view seq, uint64_t pos, uint8_t seed,
                                           size_t n = 100) {
    auto g = engine_->putCheckpoint(space_, seq, pos, n);
    if (!g.ok()) return ::testing::AssertionFailure() << "putCheckpoint: " << g.error();
    if (g->bytes != n || g->block.bytes < n) {
      return ::testing::AssertionFailure()
             << "grant of " << g->bytes << " bytes in a block of " << g->block.bytes;
    }
    const auto bytes = blob(seed, n);
    std::memcpy(at(g->block), bytes.data(), n);
    auto c = engine_->commit(g->lease, kEnd);
    if (!c.ok()) return ::testing::AssertionFailure() << "commit: " << c.error();
    return ::testing::AssertionSuccess();
  }
  // The first n bytes of the checkpoint at pos (its read lease released), or nullopt.
  std::optional<std::vector<uint8_t>> checkpointBytes(std::string_view seq, uint64_t pos,
                                                      size_t n = 100) {
    auto g = engine_->getCheckpoint(space_, seq, pos);
    if (!g.ok()) return std::nullopt;
    const uint8_t* p = at(g->block);
    std::vector<uint8_t> out(p, p + n);
    EXPECT_TRUE(engine_->releaseRead(g->lease).ok());
    return out;
  }
  std::vector<uint64_t> checkpoints(std::string_view seq) {
    auto r = engine_->checkpointPositions(space_, seq);
    if (!r.ok()) {
      ADD_FAILURE() << "checkpointPositions '" << seq << "': " << r.error();
      return {};
    }
    return *r;
  }

  ::testing::AssertionResult putEntry(SpaceId sp, const Key128& key, uint8_t seed, size_t n) {
    auto g = engine_->putEntry(sp, key, n);
    if (!g.ok()) return ::testing::AssertionFailure() << "putEntry: " << g.error();
    if (g->bytes != n) return ::testing::AssertionFailure() << "grant of " << g->bytes << " bytes";
    const auto bytes = blob(seed, n);
    std::memcpy(at(g->block), bytes.data(), n);
    auto c = engine_->commit(g->lease, kEnd);
    if (!c.ok()) return ::testing::AssertionFailure() << "commit: " << c.error();
    return ::testing::AssertionSuccess();
  }
  // The entry's bytes (its read lease released), or nullopt when getEntry fails.
  std::optional<std::vector<uint8_t>> entryBytes(SpaceId sp, const Key128& key) {
    auto g = engine_->getEntry(sp, key);
    if (!g.ok()) return std::nullopt;
    const uint8_t* p = at(g->block);
    std::vector<uint8_t> out(p, p + g->bytes);
    EXPECT_TRUE(engine_->releaseRead(g->lease).ok());
    return out;
  }

  // Blocks held by sequences, snapshots and leases: in use and not merely cached in the index.
  uint64_t held() const {
    const EngineStats s = engine_->stats();
    return s.blocksUsed - s.blocksCached;
  }
  // Blocks in use that are not KV blocks of space_ (checkpoints and entries).
  uint64_t blobsUsed() const {
    return pool_->blocksUsed() - pool_->blocksUsed(engine_->space(space_).sizeClass);
  }
};

class ShapesTest : public ::testing::Test, protected Harness {
 protected:
  void SetUp() override { makeEngine(16); }
};

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

// =============================================================================================
// Middle removal with K re-rotation

// The layouts of the removal tests: 2 layers, 2 KV heads, head dim 8, RoPE.
struct RopeCase {
  DType dtype;
  RopeStyle style;
  uint32_t rotaryDims;
};

std::string caseName(const ::testing::TestParamInfo<RopeCase>& info) {
  const RopeCase& c = info.param;
  const char* dt = c.dtype == DType::kFloat16    ? "F16"
                   : c.dtype == DType::kBFloat16 ? "BF16"
                                                 : "F32";
  return std::string(dt) + (c.style == RopeStyle::kNeox ? "Neox" : "Gptj") + "Rot" +
         std::to_string(c.rotaryDims);
}

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A token's unrotated K element: uniform in [-m, m], m in 1..4 by token.
double unrotatedK(uint32_t token, uint32_t layer, uint32_t head, uint32_t dim) {
  const uint64_t h = mix(uint64_t{token} << 32 | layer << 16 | head << 8 | dim);
  const double u = static_cast<double>(h >> 11) / static_cast<double>(1ull << 53);
  return (2 * u - 1) * (1 + token % 4);
}

// A token's V byte: any bits, moved unchanged.
uint8_t vByte(uint32_t token, uint32_t layer, uint64_t index) {
  return static_cast<uint8_t>(mix(uint64_t{token} << 24 | layer << 20 | index) >> 17);
}

// Whether dim `dim` takes part in the rotation.
bool rotates(const RopeScheme& r, uint32_t dim) { return dim < r.rotaryDims; }

class RemovalTest : public ::testing::TestWithParam<RopeCase>, protected Harness {
 protected:
  void SetUp() override {
    layout_ = ropeLayout(GetParam());
    rotator_ = &cpuRotator_;
    makeEngine(16);
  }

  static Layout ropeLayout(const RopeCase& c) {
    Layout l;
    l.modelId = "rope-model";
    l.numLayers = 2;
    l.numKvHeads = 2;
    l.headDim = 8;
    l.dtype = c.dtype;
    l.blockTokens = kBt;
    l.rope = RopeScheme{c.style, c.rotaryDims, 10000.0};
    return l;
  }

  // K of `token` as stored at position pos: the reference rotation, in the layout's dtype.
  std::vector<uint8_t> kAt(uint32_t token, uint32_t layer, uint64_t pos) const {
    const uint32_t eb = elemBytes(layout_.dtype);
    std::vector<uint8_t> out(layout_.tokenBytes());
    for (uint32_t h = 0; h < layout_.numKvHeads; ++h) {
      std::vector<double> x(layout_.headDim);
      for (uint32_t d = 0; d < layout_.headDim; ++d) x[d] = unrotatedK(token, layer, h, d);
      const auto y = referenceRope(layout_.rope, x, static_cast<double>(pos));
      for (uint32_t d = 0; d < layout_.headDim; ++d) {
        encode(layout_.dtype, y[d], out.data() + (h * layout_.headDim + d) * eb);
      }
    }
    return out;
  }
  std::vector<uint8_t> vOf(uint32_t token, uint32_t layer) const {
    std::vector<uint8_t> out(layout_.tokenBytes());
    for (uint64_t i = 0; i < out.size(); ++i) out[i] = vByte(token, layer, i);
    return out;
  }

  // put + K rotated at each position and V of each token + commit.
  ::testing::AssertionResult writeKv(std::string_view seq, uint64_t begin,
                                     const std::vector<uint32_t>& tokens,
                                     const SeqOptions& options = {}) {
    auto g = engine_->put(kOwner, space_, seq, begin, tokens, {}, options);
    if (!g.ok()) return ::testing::AssertionFailure() << "put: " << g.error();
    for (size_t i = 0; i < tokens.size(); ++i) {
      const uint64_t pos = begin + i;
      uint8_t* block = at(g->blocks[(pos - g->firstPosition) / kBt]);
      for (uint32_t layer = 0; layer < layout_.numLayers; ++layer) {
        const auto k = kAt(tokens[i], layer, pos);
        const auto v = vOf(tokens[i], layer);
        std::memcpy(block + layout_.slotOffset(layer, 0, pos % kBt), k.data(), k.size());
        std::memcpy(block + layout_.slotOffset(layer, 1, pos % kBt), v.data(), v.size());
      }
    }
    auto c = engine_->commit(g->lease, kEnd);
    if (!c.ok()) return ::testing::AssertionFailure() << "commit: " << c.error();
    return ::testing::AssertionSuccess();
  }

  // Checks every position q of seq against `tokens`: V exactly the token's; K exactly as written
  // at q for q < exactBelow, and for q >= exactBelow within tolerance of the reference rotation of
  // the token's K to q (each rotated pair's error scaled by its norm; dims past rotaryDims exact).
  void checkKv(std::string_view seq, const std::vector<uint32_t>& tokens, uint64_t exactBelow) {
    SCOPED_TRACE(::testing::Message() << "sequence '" << seq << "'");
    ASSERT_EQ(len(seq), tokens.size());
    auto g = engine_->get(space_, seq, 0, kEnd);
    ASSERT_TRUE(g.ok()) << g.error();
    const uint32_t eb = elemBytes(layout_.dtype);
    const double tol = tolerance(layout_.dtype);
    int failures = 0;
    for (uint64_t q = 0; q < tokens.size() && failures < 10; ++q) {
      const uint8_t* block = at(g->blocks[q / kBt]);
      for (uint32_t layer = 0; layer < layout_.numLayers; ++layer) {
        const uint8_t* k = block + layout_.slotOffset(layer, 0, q % kBt);
        const uint8_t* v = block + layout_.slotOffset(layer, 1, q % kBt);
        const auto wantV = vOf(tokens[q], layer);
        if (std::memcmp(v, wantV.data(), wantV.size()) != 0) {
          ADD_FAILURE() << "V of position " << q << " (token " << tokens[q] << "), layer " << layer
                        << " differs";
          ++failures;
        }
        const auto written = kAt(tokens[q], layer, q);
        if (q < exactBelow) {
          if (std::memcmp(k, written.data(), written.size()) != 0) {
            ADD_FAILURE() << "K of untouched position " << q << ", layer " << layer << " changed";
            ++failures;
          }
          continue;
        }
        for (uint32_t h = 0; h < layout_.numKvHeads; ++h) {
          std::vector<double> x(layout_.headDim);
          for (uint32_t d = 0; d < layout_.headDim; ++d) x[d] = unrotatedK(tokens[q], layer, h, d);
          const auto want = referenceRope(layout_.rope, x, static_cast<double>(q));
          for (uint32_t d = 0; d < layout_.headDim; ++d) {
            const uint64_t off = (h * layout_.headDim + d) * eb;
            if (!rotates(layout_.rope, d)) {
              if (std::memcmp(k + off, written.data() + off, eb) != 0) {
                ADD_FAILURE() << "K dim " << d << " (not rotary) of position " << q << " changed";
                ++failures;
              }
              continue;
            }
            const double got = decode(layout_.dtype, k + off);
            const double norm = std::hypot(want[d], want[partner(layout_.rope, d)]);
            if (!(std::fabs(got - want[d]) <= tol * norm + 1e-30)) {
              ADD_FAILURE() << "K of position " << q << " (token " << tokens[q] << "), layer "
                            << layer << ", head " << h << ", dim " << d << ": " << got
                            << ", reference " << want[d] << " (pair norm " << norm << ")";
              ++failures;
            }
          }
        }
      }
    }
    EXPECT_TRUE(engine_->releaseRead(g->lease).ok());
  }

  kernels::CpuKeyRotator cpuRotator_;
};

TEST_P(RemovalTest, MiddleRemovalMovesVAndReRotatesKToTheNewPositions) {
  const auto t = toks(70, 1000);
  ASSERT_TRUE(writeKv("s", 0, t));
  checkKv("s", t, 70);
  // Others share s's blocks: a copy of the whole, a snapshot of the whole and one of the range.
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "s", "c", 70, SeqOptions{}).ok());
  const auto whole = snap("s", 0);
  const auto inside = snap("s", 24);

  ASSERT_TRUE(engine_->remove(space_, "s", 20, 37).ok());
  const auto shortened = cat(head(t, 20), slice(t, 37, 70));
  checkKv("s", shortened, 20);

  // The sharers are untouched, byte for byte.
  checkKv("c", t, 70);
  ASSERT_TRUE(restore("r", whole.id, 70).ok());
  checkKv("r", t, 70);
  ASSERT_TRUE(writeKv("r2", 0, head(t, 24)));
  ASSERT_TRUE(restore("r2", inside.id, 70).ok());
  checkKv("r2", t, 70);

  // The moved KV is not a prefill of the shortened tokens: a lookup stops before begin's block,
  // now and after more tokens are appended.
  EXPECT_EQ(matched(shortened), 16u);
  EXPECT_EQ(matched(t), 64u) << "the original blocks are still indexed";
  const auto more = toks(30, 5000);
  ASSERT_TRUE(writeKv("s", 53, more));
  EXPECT_EQ(matched(cat(shortened, more)), 16u);
  checkKv("s", cat(shortened, more), 20);

  // A second removal re-rotates tokens that moved before.
  ASSERT_TRUE(engine_->remove(space_, "s", 40, 45).ok());
  const auto twice = cat(head(cat(shortened, more), 40), slice(cat(shortened, more), 45, 83));
  checkKv("s", twice, 20);
  EXPECT_EQ(matched(twice), 16u);
}

TEST_P(RemovalTest, RemovalFromTheStartAndOfWholeBlocks) {
  const auto t = toks(50, 2000);
  ASSERT_TRUE(writeKv("a", 0, t));
  ASSERT_TRUE(engine_->remove(space_, "a", 0, 5).ok());
  checkKv("a", slice(t, 5, 50), 0);
  EXPECT_EQ(held(), 3u) << "a holds its three new blocks; the old ones are cached or freed";
  EXPECT_EQ(used(), 6u) << "a's three old sealed blocks stay cached, its old partial one is freed";
  EXPECT_EQ(matched(slice(t, 5, 50)), 0u);

  ASSERT_TRUE(writeKv("b", 0, t));
  ASSERT_TRUE(engine_->remove(space_, "b", 16, 32).ok());
  const auto shortened = cat(head(t, 16), slice(t, 32, 50));
  checkKv("b", shortened, 16);
  EXPECT_EQ(matched(shortened), 16u);

  // One token removed just before the end; and a range whose end is the end is a plain cut.
  ASSERT_TRUE(writeKv("c", 0, t));
  ASSERT_TRUE(engine_->remove(space_, "c", 48, 49).ok());
  checkKv("c", cat(head(t, 48), slice(t, 49, 50)), 48);
  ASSERT_TRUE(engine_->remove(space_, "c", 30, 49).ok());
  checkKv("c", head(t, 30), 30);
}

TEST_P(RemovalTest, LaterWritesToTheSequenceAndItsCopiesAreNeverIndexed) {
  const auto t = toks(64, 3000);
  ASSERT_TRUE(writeKv("s", 0, t));
  ASSERT_TRUE(engine_->remove(space_, "s", 20, 26).ok());
  const auto shortened = cat(head(t, 20), slice(t, 26, 64));
  // A replacement from inside begin's block, whose slots 20..24 hold moved tokens: the blocks it
  // completes hold moved KV, so they must not be indexed either.
  const auto fresh = toks(40, 7000);
  ASSERT_TRUE(writeKv("s", 25, fresh));
  const auto now = cat(head(shortened, 25), fresh);
  checkKv("s", now, 20);
  EXPECT_EQ(matched(now), 16u);

  // Nor are copies, snapshots or restores of it, however they continue.
  const auto more = toks(20, 8000);
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "s", "c", 65, SeqOptions{}).ok());
  ASSERT_TRUE(writeKv("c", 65, more));
  EXPECT_EQ(matched(cat(now, more)), 16u);
  const auto sn = snap("s", 0);
  ASSERT_TRUE(restore("r", sn.id, 65).ok());
  ASSERT_TRUE(writeKv("r", 65, more));
  EXPECT_EQ(matched(cat(now, more)), 16u);
  checkKv("r", cat(now, more), 20);
}

TEST_P(RemovalTest, FullPoolAnswersFullAndChangesNothing) {
  makeEngine(5);
  const auto t = toks(70, 1000);  // five blocks: the whole pool
  ASSERT_TRUE(writeKv("s", 0, t));
  EXPECT_EQ(engine_->remove(space_, "s", 20, 37).code(), ErrorCode::kFull);
  checkKv("s", t, 70);
  EXPECT_EQ(used(), 5u);
  EXPECT_EQ(matched(t), 64u);
}

TEST_P(RemovalTest, WithoutARotatorItIsNotSupportedAndChangesNothing) {
  rotator_ = nullptr;
  makeEngine(16);
  const auto t = toks(40, 1000);
  ASSERT_TRUE(writeKv("s", 0, t));
  const uint64_t before = used();
  EXPECT_EQ(engine_->remove(space_, "s", 10, 20).code(), ErrorCode::kNotSupported);
  checkKv("s", t, 40);
  EXPECT_EQ(used(), before);
  EXPECT_EQ(matched(t), 32u);
}

TEST_P(RemovalTest, BeforeTheWindowIsInvalid) {
  const auto t = toks(40, 1000);
  ASSERT_TRUE(writeKv("w", 0, t, SeqOptions{.window = 16}));
  EXPECT_EQ(engine_->remove(space_, "w", 10, 30).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("w"), 40u);
}

INSTANTIATE_TEST_SUITE_P(Rope, RemovalTest,
                         ::testing::Values(RopeCase{DType::kFloat16, RopeStyle::kNeox, 8},
                                           RopeCase{DType::kFloat16, RopeStyle::kGptj, 8},
                                           RopeCase{DType::kBFloat16, RopeStyle::kNeox, 8},
                                           RopeCase{DType::kBFloat16, RopeStyle::kGptj, 8},
                                           RopeCase{DType::kFloat32, RopeStyle::kNeox, 8},
                                           RopeCase{DType::kFloat32, RopeStyle::kGptj, 8},
                                           RopeCase{DType::kFloat16, RopeStyle::kNeox, 4},
                                           RopeCase{DType::kFloat32, RopeStyle::kGptj, 6}),
                         caseName);

// A rotator but no declared scheme: a middle removal is NOT_SUPPORTED and changes nothing.
TEST(RemovalWithoutSchemeTest, IsNotSupportedAndChangesNothing) {
  struct Fixture : Harness {
    void run() {
      rotator_ = &rotator;
      makeEngine(16);
      const auto t = toks(40, 1000);
      ASSERT_TRUE(write("s", 0, t));
      const uint64_t before = used();
      EXPECT_EQ(engine_->remove(space_, "s", 10, 20).code(), ErrorCode::kNotSupported);
      EXPECT_EQ(engine_->remove(space_, "s", 0, 39).code(), ErrorCode::kNotSupported);
      EXPECT_EQ(read("s"), tagsOf(t));
      EXPECT_EQ(used(), before);
      EXPECT_EQ(matched(t), 32u);
    }
    kernels::CpuKeyRotator rotator;
  } f;
  f.run();
}

}  // namespace
}  // namespace kvtier
