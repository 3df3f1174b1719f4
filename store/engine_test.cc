#include "store/engine.h"
#include "store/engine_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace kvtier {

// Readable failure messages for block references (error codes: engine_test_util.h).
inline void PrintTo(const BlockLocation& l, std::ostream* os) {
  *os << "{extent " << l.extent << ", offset " << l.offset << ", bytes " << l.bytes << ", gen "
      << l.generation << "}";
}

namespace {

using namespace test_util;  // smallLayout, Tags, tagsOf, toks, kOwner, EngineHarness

// A small layout, so that pools of a few blocks reach FULL and eviction quickly: 2 layers, 1 KV
// head, head dim 4, fp16 -> 8 bytes per token per layer for K (and V), 512 bytes per block.
constexpr uint32_t kBt = 16;
constexpr uint32_t kBlockBytes = 512;

std::vector<BlockLocation> firstBlocks(const std::vector<BlockLocation>& v, size_t n) {
  return {v.begin(), v.begin() + n};
}

class EngineTest : public ::testing::Test, protected EngineHarness {
 protected:
  void SetUp() override { makeEngine(16); }

  std::optional<uint32_t> tagAt(const BlockLocation& loc, uint32_t slot) {
    return readTag(layout_, at(loc), slot);
  }

  Result<PutGrant> put(std::string_view seq, uint64_t begin, const std::vector<uint32_t>& tokens,
                       const std::vector<Key128>& keys = {}) {
    return engine_->put(kOwner, space_, seq, begin, tokens, keys, SeqOptions{});
  }

  // put + write the tokens as tags + commit everything.
  ::testing::AssertionResult writeIn(SpaceId sp, std::string_view seq, uint64_t begin,
                                     const std::vector<uint32_t>& tokens, OwnerId owner = kOwner,
                                     bool detached = false, const std::vector<Key128>& keys = {}) {
    return putAndCommit(sp, seq, begin, tokens, SeqOptions{.detached = detached}, owner, keys);
  }
  ::testing::AssertionResult write(std::string_view seq, uint64_t begin,
                                   const std::vector<uint32_t>& tokens, OwnerId owner = kOwner,
                                   bool detached = false) {
    return writeIn(space_, seq, begin, tokens, owner, detached);
  }

  // The tags of every position of seq, read through a get's block references.
  Tags readIn(SpaceId sp, std::string_view seq) { return readRangeIn(sp, seq, 0, kEnd); }
  Tags read(std::string_view seq) { return readIn(space_, seq); }

  std::vector<BlockLocation> blocksOf(std::string_view seq) {
    auto g = engine_->get(space_, seq, 0, kEnd);
    if (!g.ok()) {
      ADD_FAILURE() << "get '" << seq << "': " << g.error();
      return {};
    }
    if (g->lease != 0) {
      EXPECT_TRUE(engine_->releaseRead(g->lease).ok());
    }
    return g->blocks;
  }

  uint64_t matchedKeys(const std::vector<Key128>& keys) {
    auto r = engine_->lookup(kOwner, space_, {}, keys, "", SeqOptions{});
    if (!r.ok()) {
      ADD_FAILURE() << "lookup: " << r.error();
      return 0;
    }
    if (r->lease != 0) {
      EXPECT_TRUE(engine_->releaseRead(r->lease).ok());
    }
    return r->matchedTokens;
  }
};

// ---------------------------------------------------------------------------------------------
// Namespaces

TEST_F(EngineTest, OpenSpaceIsPerSaltAndLayout) {
  auto again = engine_->openSpace(layout_, saltFor("tenant-a"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, space_);
  auto otherTenant = engine_->openSpace(layout_, saltFor("tenant-b"));
  auto otherModel = engine_->openSpace(smallLayout("other-model"), saltFor("tenant-a"));
  ASSERT_TRUE(otherTenant.ok());
  ASSERT_TRUE(otherModel.ok());
  EXPECT_NE(*otherTenant, space_);
  EXPECT_NE(*otherModel, space_);
  EXPECT_NE(*otherModel, *otherTenant);
  EXPECT_EQ(engine_->space(*otherModel).fingerprint, smallLayout("other-model").fingerprint());
  // Both block sizes are the same: one size class.
  EXPECT_EQ(engine_->space(*otherModel).sizeClass, engine_->space(space_).sizeClass);

  Layout bad = layout_;
  bad.numLayers = 0;
  EXPECT_EQ(engine_->openSpace(bad, saltFor("tenant-a")).code(), ErrorCode::kInvalidArgument);
  Layout huge = layout_;
  huge.numLayers = 64;  // 16 KiB blocks do not fit in the 8 KiB extent
  EXPECT_EQ(engine_->openSpace(huge, saltFor("tenant-a")).code(), ErrorCode::kInvalidArgument);
}

// A namespace whose writers cannot map the pool (they move bytes inline and read whole blocks) gets
// its blocks cleared before they are granted: what a block held for another tenant never comes
// back through a block they wrote in part, or not at all. Others get blocks as they are.
TEST_F(EngineTest, BlocksOfInlineWritersAreClearedBeforeTheyAreGranted) {
  // Tenant a's prompts fill the whole pool with tags; removed, they stay cached (evictable).
  for (uint32_t i = 0; i < 4; ++i) {
    const std::string name = "a" + std::to_string(i);
    ASSERT_TRUE(write(name, 0, toks(64, 1000 * (i + 1))));
    ASSERT_TRUE(engine_->remove(space_, name, 0, kEnd).ok());
  }
  const auto nonZero = [&](const BlockLocation& loc) {
    const uint8_t* b = at(loc);
    return std::count_if(b, b + kBlockBytes, [](uint8_t x) { return x != 0; });
  };
  // Control: a trusted namespace's fresh block is one of a's, as it was.
  auto trusted = engine_->openSpace(layout_, saltFor("tenant-c")).value();
  auto g = engine_->put(kOwner, trusted, "t", 0, toks(1, 7), {}, SeqOptions{});
  ASSERT_TRUE(g.ok()) << g.error();
  EXPECT_GT(nonZero(g->blocks[0]), 0) << "the pool was not full of a's blocks";
  ASSERT_TRUE(engine_->abortWrite(g->lease).ok());

  auto inlineSpace = engine_->openSpace(layout_, saltFor("tenant-b"), /*inlineWriters=*/true);
  ASSERT_TRUE(inlineSpace.ok());
  EXPECT_TRUE(engine_->space(*inlineSpace).clearsFreshBlocks);
  auto partial = engine_->put(kOwner, *inlineSpace, "b", 0, toks(20, 9), {}, SeqOptions{});
  ASSERT_TRUE(partial.ok()) << partial.error();
  ASSERT_EQ(partial->blocks.size(), 2u);
  for (const auto& loc : partial->blocks) EXPECT_EQ(nonZero(loc), 0) << "a's bytes in b's block";
  ASSERT_TRUE(engine_->commit(partial->lease, kEnd, {}).ok());
  // A block the engine fills in part itself: the copy-on-write copy of b's partial block.
  ASSERT_TRUE(engine_->copyPrefix(kOwner, *inlineSpace, "b", "d", 20, SeqOptions{}).ok());
  auto d = engine_->get(*inlineSpace, "d", 0, kEnd);
  ASSERT_TRUE(d.ok()) << d.error();
  ASSERT_EQ(d->blocks.size(), 2u);
  EXPECT_NE(d->blocks[1], partial->blocks[1]) << "the partial block was copied";
  EXPECT_EQ(nonZero(d->blocks[1]), 0) << "a's bytes in the copy of b's partial block";
  ASSERT_TRUE(engine_->releaseRead(d->lease).ok());
  // Opening the namespace again (another session of b) keeps it so.
  EXPECT_TRUE(
      engine_->space(engine_->openSpace(layout_, saltFor("tenant-b")).value()).clearsFreshBlocks);
}

TEST_F(EngineTest, UnknownSpaceIsInvalidEverywhere) {
  ASSERT_TRUE(write("s", 0, toks(20, 1000)));
  const SpaceId bad = space_ + 100;
  const auto t = toks(16, 1000);
  EXPECT_EQ(engine_->put(kOwner, bad, "s", 0, t, {}, SeqOptions{}).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->get(bad, "s", 0, kEnd).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->lookup(kOwner, bad, t, {}, "", SeqOptions{}).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->copyPrefix(kOwner, bad, "s", "d", 16, SeqOptions{}).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->remove(bad, "s", 0, kEnd).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->truncate(bad, "s", 0).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->canResume(bad, "s", 0).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->length(bad, "s").code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->resolveSealed(bad, blocksOf("s")[0]).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("s"), 20u);
  EXPECT_EQ(read("s"), tagsOf(toks(20, 1000)));
  EXPECT_EQ(engine_->stats().writeLeases, 0u);
}

// ---------------------------------------------------------------------------------------------
// Put, commit, abort

TEST_F(EngineTest, PutCommitGetRoundTrip) {
  const auto t = toks(40, 1000);
  auto g = put("s", 0, t);
  ASSERT_TRUE(g.ok()) << g.error();
  EXPECT_NE(g->lease, 0u);
  EXPECT_EQ(g->firstPosition, 0u);
  ASSERT_EQ(g->blocks.size(), 3u);
  fill(*g, 0, t);
  auto c = engine_->commit(g->lease, kEnd);
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c->length, 40u);
  EXPECT_EQ(c->sealedBlocks, 2u) << "the partial third block is not sealed";
  EXPECT_EQ(len("s"), 40u);
  EXPECT_EQ(read("s"), tagsOf(t));

  // A range in the middle: blocks from the one holding `begin`.
  auto r = engine_->get(space_, "s", 20, 30);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->firstPosition, 16u);
  EXPECT_EQ(r->end, 30u);
  ASSERT_EQ(r->blocks.size(), 1u);
  EXPECT_EQ(tagAt(r->blocks[0], 4), 1020u);
  EXPECT_EQ(tagAt(r->blocks[0], 13), 1029u);
  EXPECT_TRUE(engine_->releaseRead(r->lease).ok());

  // An empty range covers no block and needs no lease.
  auto e = engine_->get(space_, "s", 40, 40);
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->blocks.empty());
  EXPECT_EQ(e->lease, 0u);
  EXPECT_EQ(engine_->get(space_, "s", 10, 5).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->get(space_, "s", 0, 41).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->get(space_, "nosuch", 0, kEnd).code(), ErrorCode::kNotFound);
  EXPECT_EQ(engine_->stats().readLeases, 0u);
}

TEST_F(EngineTest, NothingIsVisibleBeforeCommit) {
  const auto t = toks(40, 1000);
  auto g = put("s", 0, t);
  ASSERT_TRUE(g.ok());
  fill(*g, 0, t);
  EXPECT_EQ(len("s"), std::nullopt);
  EXPECT_EQ(engine_->get(space_, "s", 0, kEnd).code(), ErrorCode::kNotFound);
  EXPECT_EQ(matched(t), 0u);
  EXPECT_FALSE(resumable("s", 1));
  EXPECT_EQ(engine_->stats().sequences, 0u);
  ASSERT_TRUE(engine_->commit(g->lease, kEnd).ok());
  EXPECT_EQ(len("s"), 40u);
  EXPECT_EQ(matched(t), 32u);

  // An append is invisible until its commit too, even where it fills the partial block in place.
  const auto more = toks(24, 3000);
  auto a = put("s", 40, more);
  ASSERT_TRUE(a.ok());
  fill(*a, 40, more);
  EXPECT_EQ(len("s"), 40u);
  EXPECT_EQ(read("s"), tagsOf(t));
  EXPECT_EQ(matched(cat(t, more)), 32u);
  EXPECT_FALSE(resumable("s", 41));
  ASSERT_TRUE(engine_->commit(a->lease, kEnd).ok());
  EXPECT_EQ(len("s"), 64u);
  EXPECT_EQ(read("s"), tagsOf(cat(t, more)));
  EXPECT_EQ(matched(cat(t, more)), 64u);
}

TEST_F(EngineTest, PutPastTheEndIsInvalidAndChangesNothing) {
  const auto t = toks(20, 1000);
  ASSERT_TRUE(write("s", 0, t));
  const uint64_t before = used();
  EXPECT_EQ(put("s", 21, toks(4, 2000)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(put("s", 1000, toks(4, 2000)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(put("new", 1, toks(4, 2000)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("s"), 20u);
  EXPECT_EQ(len("new"), std::nullopt);
  EXPECT_EQ(read("s"), tagsOf(t));
  EXPECT_EQ(used(), before);
  EXPECT_EQ(engine_->stats().writeLeases, 0u);
  // No lease was left behind: writing at the end works.
  ASSERT_TRUE(write("s", 20, toks(4, 2000)));
  EXPECT_EQ(len("s"), 24u);
}

TEST_F(EngineTest, PutBeforeTheEndReplacesFromBegin) {
  const auto t = toks(40, 1000);
  ASSERT_TRUE(write("s", 0, t));
  // Mid-block, shorter than what it replaces: the sequence ends at begin + n.
  const auto b = toks(4, 5000);
  ASSERT_TRUE(write("s", 20, b));
  EXPECT_EQ(len("s"), 24u);
  EXPECT_EQ(read("s"), tagsOf(cat(head(t, 20), b)));
  // At a block boundary.
  const auto c = toks(3, 6000);
  ASSERT_TRUE(write("s", 16, c));
  EXPECT_EQ(len("s"), 19u);
  EXPECT_EQ(read("s"), tagsOf(cat(head(t, 16), c)));
  // From 0: a whole new sequence, longer than before.
  const auto d = toks(50, 7000);
  ASSERT_TRUE(write("s", 0, d));
  EXPECT_EQ(len("s"), 50u);
  EXPECT_EQ(read("s"), tagsOf(d));
  // Sealed blocks outlive the sequence that made them: the old prefix is still in the index.
  EXPECT_EQ(matched(t), 32u);
  EXPECT_EQ(matched(d), 48u);
}

TEST_F(EngineTest, OneWriteLeasePerSequence) {
  auto g1 = put("s", 0, toks(20, 1000));
  ASSERT_TRUE(g1.ok());
  const uint64_t before = used();
  EXPECT_EQ(put("s", 0, toks(20, 2000)).code(), ErrorCode::kConflict);
  EXPECT_EQ(used(), before) << "a refused put holds no block";
  // Other sequences are independent.
  auto g2 = put("t", 0, toks(4, 3000));
  ASSERT_TRUE(g2.ok());
  EXPECT_EQ(engine_->stats().writeLeases, 2u);
  EXPECT_TRUE(engine_->abortWrite(g2->lease).ok());
  fill(*g1, 0, toks(20, 1000));
  ASSERT_TRUE(engine_->commit(g1->lease, kEnd).ok());
  // The lease ended with the commit: the next writer gets in, and after an abort the next one.
  auto g3 = put("s", 20, toks(4, 4000));
  ASSERT_TRUE(g3.ok());
  EXPECT_EQ(put("s", 20, toks(4, 4000)).code(), ErrorCode::kConflict);
  EXPECT_TRUE(engine_->abortWrite(g3->lease).ok());
  ASSERT_TRUE(write("s", 20, toks(4, 4000)));
  EXPECT_EQ(len("s"), 24u);
}

TEST_F(EngineTest, AbortFreesBlocksAndLeavesTheSequence) {
  ASSERT_EQ(used(), 0u);
  auto g = put("s", 0, toks(40, 1000));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(used(), 3u);
  fill(*g, 0, toks(40, 1000));
  EXPECT_TRUE(engine_->abortWrite(g->lease).ok());
  EXPECT_EQ(used(), 0u);
  EXPECT_EQ(len("s"), std::nullopt);
  EXPECT_EQ(matched(toks(40, 1000)), 0u) << "an aborted write seals nothing";
  EXPECT_EQ(engine_->abortWrite(g->lease).code(), ErrorCode::kReleased);
  EXPECT_EQ(engine_->commit(g->lease, kEnd).code(), ErrorCode::kReleased);

  // Aborting an append (in place into the partial block, plus fresh blocks).
  const auto t = toks(20, 1000);
  ASSERT_TRUE(write("t", 0, t));
  const uint64_t before = used();
  auto a = put("t", 20, toks(30, 2000));
  ASSERT_TRUE(a.ok());
  EXPECT_GT(used(), before);
  fill(*a, 20, toks(30, 2000));
  EXPECT_TRUE(engine_->abortWrite(a->lease).ok());
  EXPECT_EQ(used(), before);
  EXPECT_EQ(len("t"), 20u);
  EXPECT_EQ(read("t"), tagsOf(t));
  // Aborting a replacement from the middle of a block (a private copy).
  auto b = put("t", 8, toks(4, 3000));
  ASSERT_TRUE(b.ok());
  fill(*b, 8, toks(4, 3000));
  EXPECT_TRUE(engine_->abortWrite(b->lease).ok());
  EXPECT_EQ(used(), before);
  EXPECT_EQ(read("t"), tagsOf(t));
  EXPECT_EQ(engine_->stats().writeLeases, 0u);
  EXPECT_EQ(engine_->stats().blocksPinned, 0u);
}

TEST_F(EngineTest, CommitUpToCommitsAPrefixAndFreesTheRest) {
  const auto t = toks(40, 1000);
  auto g = put("s", 0, t);
  ASSERT_TRUE(g.ok());
  fill(*g, 0, t);
  auto c = engine_->commit(g->lease, 20);
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c->length, 20u);
  EXPECT_EQ(c->sealedBlocks, 1u);
  EXPECT_EQ(len("s"), 20u);
  EXPECT_EQ(read("s"), tagsOf(head(t, 20)));
  EXPECT_EQ(used(), 2u) << "the third granted block was not committed";
  EXPECT_EQ(matched(t), 16u);
  EXPECT_EQ(engine_->commit(g->lease, kEnd).code(), ErrorCode::kReleased);

  // Committing up to `begin` keeps nothing of the grant.
  auto a = put("s", 20, toks(30, 2000));
  ASSERT_TRUE(a.ok());
  fill(*a, 20, toks(30, 2000));
  auto c2 = engine_->commit(a->lease, 20);
  ASSERT_TRUE(c2.ok()) << c2.error();
  EXPECT_EQ(c2->length, 20u);
  EXPECT_EQ(len("s"), 20u);
  EXPECT_EQ(read("s"), tagsOf(head(t, 20)));
  EXPECT_EQ(used(), 2u);
}

TEST_F(EngineTest, CommitOutsideTheGrantIsInvalidAndTheLeaseStaysOpen) {
  const auto t = toks(20, 1000);
  ASSERT_TRUE(write("s", 0, t));
  const auto more = toks(10, 2000);
  auto g = put("s", 20, more);
  ASSERT_TRUE(g.ok());
  fill(*g, 20, more);
  EXPECT_EQ(engine_->commit(g->lease, 19).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->commit(g->lease, 31).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->commit(g->lease, 0).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("s"), 20u);
  EXPECT_EQ(read("s"), tagsOf(t));
  EXPECT_EQ(engine_->stats().writeLeases, 1u);
  EXPECT_EQ(put("s", 20, more).code(), ErrorCode::kConflict)
      << "the lease still holds the sequence";
  auto c = engine_->commit(g->lease, kEnd);
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c->length, 30u);
  EXPECT_EQ(read("s"), tagsOf(cat(t, more)));
}

TEST_F(EngineTest, CommitAfterTruncateConflictsAndKeepsTheSequence) {
  const auto t = toks(40, 1000);
  ASSERT_TRUE(write("s", 0, t));
  auto g = put("s", 40, toks(10, 2000));
  ASSERT_TRUE(g.ok());
  fill(*g, 40, toks(10, 2000));
  ASSERT_TRUE(engine_->truncate(space_, "s", 20).ok());
  EXPECT_EQ(engine_->commit(g->lease, kEnd).code(), ErrorCode::kConflict);
  EXPECT_EQ(len("s"), 20u);
  EXPECT_EQ(read("s"), tagsOf(head(t, 20)));
  // The lease ended and its blocks are gone: s holds its two blocks, nothing else exists.
  EXPECT_EQ(engine_->commit(g->lease, kEnd).code(), ErrorCode::kReleased);
  EXPECT_EQ(engine_->stats().writeLeases, 0u);
  EXPECT_EQ(used(), 2u);
  EXPECT_EQ(engine_->stats().blocksPinned, 0u);
  ASSERT_TRUE(write("s", 20, toks(4, 3000)));
  EXPECT_EQ(read("s"), tagsOf(cat(head(t, 20), toks(4, 3000))));
}

TEST_F(EngineTest, CommitAfterCopyPrefixOrBindConflicts) {
  const auto src = toks(32, 5000);
  ASSERT_TRUE(write("src", 0, src));
  ASSERT_TRUE(write("d", 0, toks(20, 1000)));

  // Onto an existing sequence.
  auto g = put("d", 20, toks(4, 2000));
  ASSERT_TRUE(g.ok());
  fill(*g, 20, toks(4, 2000));
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "src", "d", 24, SeqOptions{}).ok());
  EXPECT_EQ(engine_->commit(g->lease, kEnd).code(), ErrorCode::kConflict);
  EXPECT_EQ(len("d"), 24u);
  EXPECT_EQ(read("d"), tagsOf(head(src, 24)));

  // A put that would create the sequence, overtaken by a copyPrefix that created it.
  auto n = put("n", 0, toks(8, 7000));
  ASSERT_TRUE(n.ok());
  fill(*n, 0, toks(8, 7000));
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "src", "n", 16, SeqOptions{}).ok());
  EXPECT_EQ(engine_->commit(n->lease, kEnd).code(), ErrorCode::kConflict);
  EXPECT_EQ(len("n"), 16u);
  EXPECT_EQ(read("n"), tagsOf(head(src, 16)));

  // ... and by a lookup that bound it.
  auto m = put("m", 0, toks(8, 7000));
  ASSERT_TRUE(m.ok());
  fill(*m, 0, toks(8, 7000));
  auto l = engine_->lookup(kOwner, space_, src, {}, "m", SeqOptions{});
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(engine_->releaseRead(l->lease).ok());
  EXPECT_EQ(engine_->commit(m->lease, kEnd).code(), ErrorCode::kConflict);
  EXPECT_EQ(len("m"), 32u);
  EXPECT_EQ(read("m"), tagsOf(src));
  EXPECT_EQ(engine_->stats().writeLeases, 0u);
}

TEST_F(EngineTest, UnknownOrFinishedLeasesAreReleased) {
  EXPECT_EQ(engine_->commit(12345, kEnd).code(), ErrorCode::kReleased);
  EXPECT_EQ(engine_->abortWrite(12345).code(), ErrorCode::kReleased);
  EXPECT_EQ(engine_->releaseRead(12345).code(), ErrorCode::kReleased);
  EXPECT_EQ(engine_->leaseBlockData(12345, 0).code(), ErrorCode::kReleased);

  auto g = put("s", 0, toks(20, 1000));
  ASSERT_TRUE(g.ok());
  auto data = engine_->leaseBlockData(g->lease, 1);
  ASSERT_TRUE(data.ok());
  EXPECT_EQ(*data, at(g->blocks[1]));
  EXPECT_EQ(engine_->leaseBlockData(g->lease, 2).code(), ErrorCode::kInvalidArgument);
  fill(*g, 0, toks(20, 1000));
  ASSERT_TRUE(engine_->commit(g->lease, kEnd).ok());
  EXPECT_EQ(engine_->commit(g->lease, kEnd).code(), ErrorCode::kReleased);
  EXPECT_EQ(engine_->abortWrite(g->lease).code(), ErrorCode::kReleased);
  EXPECT_EQ(engine_->leaseBlockData(g->lease, 0).code(), ErrorCode::kReleased);
  // A write lease id is not a read lease.
  EXPECT_EQ(engine_->releaseRead(g->lease).code(), ErrorCode::kReleased);

  auto r = engine_->get(space_, "s", 0, kEnd);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(engine_->commit(r->lease, kEnd).code(), ErrorCode::kReleased)
      << "a read lease is not a write lease";
  EXPECT_TRUE(engine_->releaseRead(r->lease).ok());
  EXPECT_EQ(engine_->releaseRead(r->lease).code(), ErrorCode::kReleased);
  EXPECT_EQ(len("s"), 20u);
}

TEST_F(EngineTest, PutArgumentsAreCheckedAndChangeNothing) {
  const auto t = toks(20, 1000);
  ASSERT_TRUE(write("s", 0, t));
  const uint64_t before = used();
  const std::vector<uint32_t> none;
  const std::vector<uint32_t> tooMany(kMaxTokensPerCall + 1, 7);
  const std::string longName(kMaxSeqNameBytes + 1, 'n');

  EXPECT_EQ(put("s", 20, none).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(put("s", 20, tooMany).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(put("", 0, toks(4, 1)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(put(longName, 0, toks(4, 1)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->put(kOwner, space_ + 1, "t", 0, toks(4, 1), {}, SeqOptions{}).code(),
            ErrorCode::kInvalidArgument);
  // Keys, when given, are one per block the put completes.
  EXPECT_EQ(put("t", 0, toks(20, 1), {keyOf(1), keyOf(2)}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(put("t", 0, toks(8, 1), {keyOf(1)}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(put("t", 0, toks(32, 1), {keyOf(1)}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(put("s", 20, toks(12, 1), {keyOf(1), keyOf(2)}).code(), ErrorCode::kInvalidArgument);

  EXPECT_EQ(used(), before);
  EXPECT_EQ(engine_->stats().writeLeases, 0u);
  EXPECT_EQ(engine_->stats().sequences, 1u);
  EXPECT_EQ(len("s"), 20u);
  EXPECT_EQ(len("t"), std::nullopt);
  EXPECT_EQ(read("s"), tagsOf(t));

  // The bounds themselves are allowed.
  const std::string maxName(kMaxSeqNameBytes, 'n');
  ASSERT_TRUE(write(maxName, 0, toks(4, 1)));
  EXPECT_EQ(len(maxName), 4u);
  EXPECT_EQ(engine_->length(space_, longName).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->length(space_, "").code(), ErrorCode::kInvalidArgument);
}

TEST_F(EngineTest, LookupArgumentsAreChecked) {
  const std::vector<uint32_t> tooMany(kMaxTokensPerCall + 1, 7);
  EXPECT_EQ(engine_->lookup(kOwner, space_, tooMany, {}, "", SeqOptions{}).code(),
            ErrorCode::kInvalidArgument);
  const std::vector<Key128> tooManyKeys(kMaxBlocksPerLease + 1);
  EXPECT_EQ(engine_->lookup(kOwner, space_, {}, tooManyKeys, "", SeqOptions{}).code(),
            ErrorCode::kInvalidArgument);
  const auto t = toks(16, 1);
  const std::vector<Key128> keys = {keyOf(1)};
  EXPECT_EQ(engine_->lookup(kOwner, space_, t, keys, "", SeqOptions{}).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(
      engine_->lookup(kOwner, space_, t, {}, std::string(kMaxSeqNameBytes + 1, 'x'), SeqOptions{})
          .code(),
      ErrorCode::kInvalidArgument);
  // Nothing at all to look up matches nothing.
  auto r = engine_->lookup(kOwner, space_, {}, {}, "", SeqOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->matchedTokens, 0u);
  EXPECT_EQ(r->lease, 0u);
}

// ---------------------------------------------------------------------------------------------
// Appends in place and copy-on-write

TEST_F(EngineTest, AppendWritesInPlaceIntoTheOwnPartialBlock) {
  const auto t = toks(20, 1000);
  ASSERT_TRUE(write("s", 0, t));
  const auto locs = blocksOf("s");
  ASSERT_EQ(locs.size(), 2u);
  ASSERT_EQ(used(), 2u);

  const auto more = toks(8, 2000);
  auto g = put("s", 20, more);
  ASSERT_TRUE(g.ok()) << g.error();
  EXPECT_EQ(g->firstPosition, 16u);
  ASSERT_EQ(g->blocks.size(), 1u);
  EXPECT_EQ(g->blocks[0], locs[1]) << "an append to an unshared partial block needs no copy";
  EXPECT_EQ(used(), 2u);
  // The slots before `begin` already hold the sequence's bytes.
  for (uint32_t slot = 0; slot < 4; ++slot) EXPECT_EQ(tagAt(g->blocks[0], slot), 1016u + slot);
  fill(*g, 20, more);
  auto c = engine_->commit(g->lease, kEnd);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->sealedBlocks, 0u);
  EXPECT_EQ(read("s"), tagsOf(cat(t, more)));
  EXPECT_EQ(used(), 2u);

  // Filling the block seals it.
  const auto last = toks(4, 3000);
  auto g2 = put("s", 28, last);
  ASSERT_TRUE(g2.ok());
  fill(*g2, 28, last);
  auto c2 = engine_->commit(g2->lease, kEnd);
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(c2->sealedBlocks, 1u);
  EXPECT_EQ(c2->length, 32u);
  const auto all = cat(cat(t, more), last);
  EXPECT_EQ(read("s"), tagsOf(all));
  EXPECT_EQ(matched(all), 32u);
  EXPECT_EQ(used(), 2u);
}

TEST_F(EngineTest, ReplacingInsideTheOwnPartialBlockIsInvisibleUntilCommit) {
  const auto t = toks(40, 1000);
  ASSERT_TRUE(write("s", 0, t));
  const auto locs = blocksOf("s");
  const auto repl = toks(4, 2000);
  auto g = put("s", 36, repl);  // positions 36..39 are committed and visible
  ASSERT_TRUE(g.ok()) << g.error();
  EXPECT_EQ(g->firstPosition, 32u);
  ASSERT_EQ(g->blocks.size(), 1u);
  for (uint32_t slot = 0; slot < 4; ++slot) EXPECT_EQ(tagAt(g->blocks[0], slot), 1032u + slot);
  fill(*g, 36, repl);
  EXPECT_EQ(read("s"), tagsOf(t));
  EXPECT_TRUE(engine_->abortWrite(g->lease).ok());
  EXPECT_EQ(read("s"), tagsOf(t));
  EXPECT_EQ(blocksOf("s"), locs);
  ASSERT_TRUE(write("s", 36, repl));
  EXPECT_EQ(read("s"), tagsOf(cat(head(t, 36), repl)));
}

TEST_F(EngineTest, AppendThatCompletesAnIndexedBlockSharesIt) {
  const auto t = toks(32, 1000);
  ASSERT_TRUE(write("full", 0, t));
  ASSERT_EQ(used(), 2u);
  ASSERT_TRUE(write("s", 0, head(t, 20)));
  EXPECT_EQ(used(), 3u) << "block 0 is shared, block 1 is s's own partial block";
  ASSERT_TRUE(write("s", 20, std::vector<uint32_t>(t.begin() + 20, t.end())));
  EXPECT_EQ(used(), 2u) << "the completed block is the indexed one; s's copy is freed";
  EXPECT_EQ(blocksOf("s"), blocksOf("full"));
  EXPECT_EQ(read("s"), tagsOf(t));
  EXPECT_EQ(engine_->stats().blocksPinned, 0u);
}

TEST_F(EngineTest, CopyOnWriteNeverChangesASharedBlock) {
  const auto a = toks(32, 1000);
  ASSERT_TRUE(write("a", 0, a));
  const auto aLocs = blocksOf("a");
  ASSERT_EQ(aLocs.size(), 2u);

  // b shares a's sealed blocks, then ends in the middle of the second one.
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "a", "b", 32, SeqOptions{}).ok());
  EXPECT_EQ(blocksOf("b"), aLocs);
  ASSERT_TRUE(engine_->truncate(space_, "b", 24).ok());
  const auto bNew = toks(8, 2000);
  auto g = put("b", 24, bNew);
  ASSERT_TRUE(g.ok()) << g.error();
  EXPECT_EQ(g->firstPosition, 16u);
  ASSERT_EQ(g->blocks.size(), 1u);
  EXPECT_NE(g->blocks[0], aLocs[1]) << "a shared block is never written";
  for (uint32_t slot = 0; slot < 8; ++slot) EXPECT_EQ(tagAt(g->blocks[0], slot), 1016u + slot);
  fill(*g, 24, bNew);
  EXPECT_EQ(read("a"), tagsOf(a));
  ASSERT_TRUE(engine_->commit(g->lease, kEnd).ok());
  EXPECT_EQ(read("a"), tagsOf(a));
  EXPECT_EQ(read("b"), tagsOf(cat(head(a, 24), bNew)));
  for (uint32_t slot = 0; slot < kBt; ++slot) EXPECT_EQ(tagAt(aLocs[1], slot), 1016u + slot);

  // Replacing below the length, in the middle of a shared block.
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "a", "c", 32, SeqOptions{}).ok());
  const auto cNew = toks(4, 3000);
  ASSERT_TRUE(write("c", 20, cNew));
  EXPECT_EQ(read("c"), tagsOf(cat(head(a, 20), cNew)));
  EXPECT_EQ(read("a"), tagsOf(a));
  EXPECT_EQ(matched(a), 32u);
}

// ---------------------------------------------------------------------------------------------
// Sealing, dedup and lookup

TEST_F(EngineTest, FullBlocksAreSealedAndDeduplicated) {
  const auto t = toks(40, 1000);
  ASSERT_TRUE(write("x", 0, t));
  EXPECT_EQ(used(), 3u);
  const auto xLocs = blocksOf("x");

  auto g = put("y", 0, t);
  ASSERT_TRUE(g.ok());
  // x's full blocks are reused (pinned by the lease): a fresh block for the partial one, and a
  // scratch block that takes the client's bytes for the reused ones.
  EXPECT_EQ(used(), 5u) << "fresh blocks only for what the cache lacks";
  fill(*g, 0, t);
  auto c = engine_->commit(g->lease, kEnd);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->sealedBlocks, 2u);
  EXPECT_EQ(used(), 4u) << "the full blocks are x's; only y's partial block is new";
  const auto yLocs = blocksOf("y");
  ASSERT_EQ(yLocs.size(), 3u);
  EXPECT_EQ(firstBlocks(yLocs, 2), firstBlocks(xLocs, 2));
  EXPECT_NE(yLocs[2], xLocs[2]) << "partial blocks are never shared";
  EXPECT_EQ(read("y"), tagsOf(t));

  // A third sequence of exactly the full blocks adds nothing.
  ASSERT_TRUE(write("z", 0, head(t, 32)));
  EXPECT_EQ(used(), 4u);
  EXPECT_EQ(engine_->stats().blocksUsed, 4u);
  // Removing x keeps the shared blocks for y and z.
  ASSERT_TRUE(engine_->remove(space_, "x", 0, kEnd).ok());
  EXPECT_EQ(used(), 3u);
  EXPECT_EQ(read("y"), tagsOf(t));
}

TEST_F(EngineTest, LookupMatchesTheLongestSealedPrefix) {
  const auto t = toks(40, 1000);
  ASSERT_TRUE(write("s", 0, t));
  const auto locs = blocksOf("s");

  auto r = engine_->lookup(kOwner, space_, t, {}, "", SeqOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->matchedTokens, 32u);
  EXPECT_NE(r->lease, 0u);
  EXPECT_EQ(r->blocks, firstBlocks(locs, 2));
  EXPECT_EQ(tagAt(r->blocks[1], 3), 1019u);
  EXPECT_EQ(engine_->stats().blocksPinned, 2u);
  EXPECT_TRUE(engine_->releaseRead(r->lease).ok());
  EXPECT_EQ(engine_->stats().blocksPinned, 0u);

  EXPECT_EQ(matched(head(t, 32)), 32u);
  EXPECT_EQ(matched(head(t, 31)), 16u);
  EXPECT_EQ(matched(head(t, 16)), 16u);
  EXPECT_EQ(matched(head(t, 15)), 0u);
  EXPECT_EQ(matched(cat(t, toks(8, 9000))), 32u);

  // A prompt that diverges inside block k matches exactly k blocks.
  for (size_t pos = 0; pos < t.size(); ++pos) {
    auto p = t;
    p[pos] = 77;
    EXPECT_EQ(matched(p), std::min<uint64_t>(pos / kBt * kBt, 32)) << "diverging at " << pos;
  }

  // A partial last block never matches.
  const auto q = toks(10, 7000);
  ASSERT_TRUE(write("q", 0, q));
  EXPECT_EQ(matched(q), 0u);
  EXPECT_EQ(matched(cat(q, toks(6, 1))), 0u);
  const auto p = toks(20, 5000);
  ASSERT_TRUE(write("p", 0, p));
  EXPECT_EQ(matched(p), 16u);
  EXPECT_EQ(matched(cat(p, toks(12, 1))), 16u);
}

TEST_F(EngineTest, HitsAndMissesCountClientLookupsOnlyNotPeerPins) {
  const auto t = toks(40, 1000);  // two whole blocks and a partial one
  ASSERT_TRUE(write("s", 0, t));
  const auto before = engine_->stats();
  // A client's lookup of 3 candidate blocks matching 2: 2 hits and a miss.
  auto client = engine_->lookup(kOwner, space_, cat(t, toks(8, 9000)), {}, "", SeqOptions{});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(engine_->releaseRead(client->lease).ok());
  EXPECT_EQ(engine_->stats().hits, before.hits + 2);
  EXPECT_EQ(engine_->stats().misses, before.misses + 1);
  // A peer pinning the same blocks (and asking for one more) is neither.
  auto peer = engine_->lookup(kOwner, space_, cat(t, toks(8, 9000)), {}, "", SeqOptions{}, {}, 0,
                              LookupFor::kPeer);
  ASSERT_TRUE(peer.ok());
  EXPECT_EQ(peer->matchedTokens, 32u);
  ASSERT_TRUE(engine_->releaseRead(peer->lease).ok());
  EXPECT_EQ(engine_->stats().hits, before.hits + 2);
  EXPECT_EQ(engine_->stats().misses, before.misses + 1);
}

TEST_F(EngineTest, LookupNeverMatchesAnotherTenantOrLayout) {
  const auto t = toks(32, 1000);
  ASSERT_TRUE(write("s", 0, t));
  auto tenantB = engine_->openSpace(layout_, saltFor("tenant-b"));
  auto otherModel = engine_->openSpace(smallLayout("other-model"), saltFor("tenant-a"));
  ASSERT_TRUE(tenantB.ok());
  ASSERT_TRUE(otherModel.ok());
  EXPECT_EQ(matched(t), 32u);
  EXPECT_EQ(matchedIn(*tenantB, t), 0u);
  EXPECT_EQ(matchedIn(*otherModel, t), 0u);
  // Names are per namespace too.
  EXPECT_EQ(lenIn(*tenantB, "s"), std::nullopt);

  // The same tokens committed by another tenant are stored again, not shared.
  const uint64_t before = used();
  ASSERT_TRUE(writeIn(*tenantB, "s", 0, t));
  EXPECT_EQ(used(), before + 2);
  EXPECT_EQ(matchedIn(*tenantB, t), 32u);
  EXPECT_EQ(lenIn(*tenantB, "s"), 32u);
  EXPECT_EQ(len("s"), 32u);
  auto a = engine_->get(space_, "s", 0, kEnd);
  auto b = engine_->get(*tenantB, "s", 0, kEnd);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  for (size_t i = 0; i < 2; ++i) EXPECT_NE(a->blocks[i], b->blocks[i]);
  EXPECT_TRUE(engine_->releaseRead(a->lease).ok());
  EXPECT_TRUE(engine_->releaseRead(b->lease).ok());
  EXPECT_EQ(matchedIn(*otherModel, t), 0u);
}

TEST_F(EngineTest, LookupWithClientKeys) {
  const auto t = toks(40, 1000);
  const std::vector<Key128> keys = {keyOf(1), keyOf(2)};
  auto g = put("s", 0, t, keys);
  ASSERT_TRUE(g.ok()) << g.error();
  fill(*g, 0, t);
  auto c = engine_->commit(g->lease, kEnd);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->sealedBlocks, 2u);
  const auto locs = blocksOf("s");

  auto r = engine_->lookup(kOwner, space_, {}, keys, "", SeqOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->matchedTokens, 32u);
  EXPECT_EQ(r->blocks, firstBlocks(locs, 2));
  EXPECT_TRUE(engine_->releaseRead(r->lease).ok());
  EXPECT_EQ(matchedKeys({keyOf(1), keyOf(9)}), 16u);
  EXPECT_EQ(matchedKeys({keyOf(9)}), 0u);
  EXPECT_EQ(matchedKeys({keyOf(1), keyOf(2), keyOf(3)}), 32u);
  EXPECT_EQ(matchedKeys({keyOf(1), keyOf(9), keyOf(2)}), 16u) << "a prefix stops at the first miss";
  EXPECT_EQ(matched(t), 0u) << "the blocks are indexed under the client's keys, not token hashes";
  EXPECT_EQ(engine_->lookup(kOwner, space_, t, keys, "", SeqOptions{}).code(),
            ErrorCode::kInvalidArgument);

  // A client-keyed sequence needs keys for every block a later put completes.
  EXPECT_EQ(put("s", 40, toks(8, 2000)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("s"), 40u);
  ASSERT_TRUE(writeIn(space_, "s", 40, toks(8, 2000), kOwner, false, {keyOf(3)}));
  EXPECT_EQ(matchedKeys({keyOf(1), keyOf(2), keyOf(3)}), 48u);
  // ... and none for a put that completes no block.
  ASSERT_TRUE(write("s", 48, toks(4, 3000)));
  EXPECT_EQ(len("s"), 52u);

  // Lookup by keys can bind a sequence as well.
  auto b = engine_->lookup(kOwner, space_, {}, keys, "bound", SeqOptions{});
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(engine_->releaseRead(b->lease).ok());
  EXPECT_EQ(len("bound"), 32u);
  EXPECT_EQ(read("bound"), tagsOf(head(t, 32)));
}

TEST_F(EngineTest, LookupBindsTheMatchedPrefixAsASequence) {
  const auto t = toks(40, 1000);
  ASSERT_TRUE(write("s", 0, t));
  const auto locs = blocksOf("s");
  const uint64_t before = used();

  auto r = engine_->lookup(kOwner, space_, t, {}, "b", SeqOptions{});
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->matchedTokens, 32u);
  EXPECT_TRUE(engine_->releaseRead(r->lease).ok());
  EXPECT_EQ(len("b"), 32u);
  EXPECT_EQ(blocksOf("b"), firstBlocks(locs, 2));
  EXPECT_EQ(read("b"), tagsOf(head(t, 32)));
  EXPECT_EQ(used(), before) << "binding shares blocks";
  // The engine continues from it.
  ASSERT_TRUE(write("b", 32, toks(4, 2000)));
  EXPECT_EQ(read("b"), tagsOf(cat(head(t, 32), toks(4, 2000))));
  EXPECT_EQ(read("s"), tagsOf(t));

  // It replaces an existing sequence.
  ASSERT_TRUE(write("c", 0, toks(20, 3000)));
  auto r2 = engine_->lookup(kOwner, space_, head(t, 20), {}, "c", SeqOptions{});
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->matchedTokens, 16u);
  EXPECT_TRUE(engine_->releaseRead(r2->lease).ok());
  EXPECT_EQ(len("c"), 16u);
  EXPECT_EQ(read("c"), tagsOf(head(t, 16)));

  // No match: the bound sequence is empty.
  auto r3 = engine_->lookup(kOwner, space_, toks(16, 9000), {}, "c", SeqOptions{});
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(r3->matchedTokens, 0u);
  EXPECT_EQ(r3->lease, 0u);
  EXPECT_EQ(len("c").value_or(0), 0u);
  EXPECT_FALSE(resumable("c", 1));

  // A bad name binds nothing.
  EXPECT_EQ(
      engine_->lookup(kOwner, space_, t, {}, std::string(kMaxSeqNameBytes + 1, 'x'), SeqOptions{})
          .code(),
      ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->stats().readLeases, 0u);
}

// A match longer than the answer may carry (an inline lookup's bound) fails before the lookup
// binds anything: the sequence it names keeps what it held.
TEST_F(EngineTest, ALookupOverItsBlockBoundFailsAndBindsNothing) {
  const auto t = toks(48, 1000);
  ASSERT_TRUE(write("s", 0, t));
  ASSERT_TRUE(write("c", 0, toks(20, 3000)));
  const auto stats = engine_->stats();
  auto over = engine_->lookup(kOwner, space_, t, {}, "c", SeqOptions{}, {}, -1, LookupFor::kClient,
                              /*maxBlocks=*/2);
  EXPECT_EQ(over.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("c"), 20u);
  EXPECT_EQ(read("c"), tagsOf(toks(20, 3000)));
  EXPECT_EQ(engine_->stats().readLeases, stats.readLeases);
  EXPECT_EQ(engine_->stats().hits, stats.hits);
  // At the bound it binds.
  auto at = engine_->lookup(kOwner, space_, t, {}, "c", SeqOptions{}, {}, -1, LookupFor::kClient,
                            /*maxBlocks=*/3);
  ASSERT_TRUE(at.ok()) << at.error();
  EXPECT_TRUE(engine_->releaseRead(at->lease).ok());
  EXPECT_EQ(read("c"), tagsOf(t));
}

// ---------------------------------------------------------------------------------------------
// copyPrefix

TEST_F(EngineTest, CopyPrefixReplacesTheDestinationWithMinLen) {
  const auto src = toks(40, 1000);
  ASSERT_TRUE(write("src", 0, src));
  ASSERT_TRUE(write("dst", 0, toks(40, 5000)));
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "src", "dst", 20, SeqOptions{}).ok());
  EXPECT_EQ(len("dst"), 20u);
  EXPECT_EQ(read("dst"), tagsOf(head(src, 20)));
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "src", "dst", 1000, SeqOptions{}).ok());
  EXPECT_EQ(len("dst"), 40u);
  EXPECT_EQ(read("dst"), tagsOf(src));
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "src", "fresh", kEnd, SeqOptions{}).ok());
  EXPECT_EQ(read("fresh"), tagsOf(src));
  EXPECT_EQ(read("src"), tagsOf(src));
}

TEST_F(EngineTest, CopyPrefixSharesFullBlocksAndCopiesThePartialOne) {
  const auto src = toks(40, 1000);
  ASSERT_TRUE(write("src", 0, src));
  const auto srcLocs = blocksOf("src");
  ASSERT_EQ(srcLocs.size(), 3u);
  ASSERT_EQ(used(), 3u);

  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "src", "whole", 32, SeqOptions{}).ok());
  EXPECT_EQ(used(), 3u) << "full blocks are shared by reference";
  EXPECT_EQ(blocksOf("whole"), firstBlocks(srcLocs, 2));

  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "src", "e", 20, SeqOptions{}).ok());
  EXPECT_EQ(used(), 4u) << "the partially covered block is copied";
  const auto eLocs = blocksOf("e");
  ASSERT_EQ(eLocs.size(), 2u);
  EXPECT_EQ(eLocs[0], srcLocs[0]);
  EXPECT_NE(eLocs[1], srcLocs[1]);
  // Writes to the copy never reach src.
  ASSERT_TRUE(write("e", 20, toks(12, 2000)));
  EXPECT_EQ(read("e"), tagsOf(cat(head(src, 20), toks(12, 2000))));
  EXPECT_EQ(read("src"), tagsOf(src));

  // src's own partial block: copied too, and neither side's appends reach the other.
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "src", "f", 40, SeqOptions{}).ok());
  const auto fLocs = blocksOf("f");
  ASSERT_EQ(fLocs.size(), 3u);
  EXPECT_NE(fLocs[2], srcLocs[2]);
  ASSERT_TRUE(write("src", 40, toks(8, 3000)));
  EXPECT_EQ(read("f"), tagsOf(src));
  ASSERT_TRUE(write("f", 40, toks(8, 4000)));
  EXPECT_EQ(read("src"), tagsOf(cat(src, toks(8, 3000))));
  EXPECT_EQ(read("f"), tagsOf(cat(src, toks(8, 4000))));
}

TEST_F(EngineTest, CopyPrefixOfNothingEmptiesTheDestination) {
  const auto src = toks(20, 1000);
  ASSERT_TRUE(write("src", 0, src));
  ASSERT_TRUE(write("dst", 0, toks(20, 5000)));
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "src", "dst", 0, SeqOptions{}).ok());
  EXPECT_EQ(len("dst").value_or(0), 0u);
  EXPECT_FALSE(resumable("dst", 1));
  EXPECT_EQ(read("src"), tagsOf(src));

  ASSERT_TRUE(write("dst", 0, toks(20, 5000)));
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "nosuch", "dst", 16, SeqOptions{}).ok());
  EXPECT_EQ(len("dst").value_or(0), 0u);
  EXPECT_EQ(len("nosuch"), std::nullopt) << "the unknown source is not created";
  EXPECT_EQ(used(), 3u) << "src's two blocks and dst's former sealed block (cached)";
  EXPECT_EQ(engine_->stats().blocksCached, 1u);
}

TEST_F(EngineTest, CopyPrefixOntoItselfIsTruncate) {
  const auto t = toks(40, 1000);
  ASSERT_TRUE(write("s", 0, t));
  const auto locs = blocksOf("s");
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "s", "s", 100, SeqOptions{}).ok());
  EXPECT_EQ(len("s"), 40u);
  EXPECT_EQ(blocksOf("s"), locs);
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "s", "s", 20, SeqOptions{}).ok());
  EXPECT_EQ(len("s"), 20u);
  EXPECT_EQ(read("s"), tagsOf(head(t, 20)));
  EXPECT_EQ(blocksOf("s"), firstBlocks(locs, 2)) << "like truncate, no copy";
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "s", "s", 0, SeqOptions{}).ok());
  EXPECT_EQ(len("s").value_or(0), 0u);
}

TEST_F(EngineTest, CopyPrefixChecksNamesAndChangesNothing) {
  ASSERT_TRUE(write("src", 0, toks(20, 1000)));
  ASSERT_TRUE(write("dst", 0, toks(20, 5000)));
  const uint64_t before = used();
  EXPECT_EQ(engine_->copyPrefix(kOwner, space_, "src", "", 16, SeqOptions{}).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->copyPrefix(kOwner, space_, "", "dst", 16, SeqOptions{}).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_
                ->copyPrefix(kOwner, space_, "src", std::string(kMaxSeqNameBytes + 1, 'd'), 16,
                             SeqOptions{})
                .code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(read("dst"), tagsOf(toks(20, 5000)));
  EXPECT_EQ(used(), before);
}

TEST_F(EngineTest, CopyPrefixWithAFullPoolAnswersFullAndChangesNothing) {
  makeEngine(2);
  ASSERT_TRUE(write("src", 0, toks(20, 1000)));  // both blocks held
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "src", "dst", 16, SeqOptions{}).ok())
      << "no copy needed";
  EXPECT_EQ(engine_->copyPrefix(kOwner, space_, "src", "dst", 20, SeqOptions{}).code(),
            ErrorCode::kFull);
  EXPECT_EQ(len("dst"), 16u);
  EXPECT_EQ(read("dst"), tagsOf(toks(16, 1000)));
}

// ---------------------------------------------------------------------------------------------
// remove, truncate, canResume

TEST_F(EngineTest, RemoveRules) {
  const auto t = toks(40, 1000);
  ASSERT_TRUE(write("s", 0, t));
  const uint64_t before = used();

  // A middle range would shift later positions: not supported without a rotary scheme.
  EXPECT_EQ(engine_->remove(space_, "s", 5, 10).code(), ErrorCode::kNotSupported);
  EXPECT_EQ(engine_->remove(space_, "s", 0, 39).code(), ErrorCode::kNotSupported);
  EXPECT_EQ(engine_->remove(space_, "s", 10, 5).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("s"), 40u);
  EXPECT_EQ(read("s"), tagsOf(t));
  EXPECT_EQ(used(), before);

  // Empty ranges and ranges past the end: success, no change.
  EXPECT_TRUE(engine_->remove(space_, "s", 3, 3).ok());
  EXPECT_TRUE(engine_->remove(space_, "s", 40, 50).ok());
  EXPECT_TRUE(engine_->remove(space_, "s", 45, 60).ok());
  EXPECT_TRUE(engine_->remove(space_, "s", 45, kEnd).ok());
  EXPECT_EQ(len("s"), 40u);
  EXPECT_EQ(read("s"), tagsOf(t));
  // Unknown sequences: success, nothing created.
  EXPECT_TRUE(engine_->remove(space_, "nosuch", 0, kEnd).ok());
  EXPECT_TRUE(engine_->remove(space_, "nosuch", 5, 10).ok());
  EXPECT_EQ(len("nosuch"), std::nullopt);

  // A range that reaches the end cuts the tail.
  EXPECT_TRUE(engine_->remove(space_, "s", 30, 40).ok());
  EXPECT_EQ(len("s"), 30u);
  EXPECT_TRUE(engine_->remove(space_, "s", 20, kEnd).ok());
  EXPECT_EQ(len("s"), 20u);
  EXPECT_EQ(read("s"), tagsOf(head(t, 20)));
  EXPECT_TRUE(engine_->remove(space_, "s", 0, kEnd).ok());
  EXPECT_EQ(len("s").value_or(0), 0u);
  EXPECT_TRUE(engine_->remove(space_, "s", 0, kEnd).ok()) << "END never fails";
  EXPECT_EQ(engine_->remove(space_, "", 0, kEnd).code(), ErrorCode::kInvalidArgument);
}

TEST_F(EngineTest, TruncateFreesBlocksPastTheEnd) {
  const auto t = toks(20, 1000);
  ASSERT_TRUE(write("s", 0, t));
  ASSERT_EQ(used(), 2u);
  EXPECT_TRUE(engine_->truncate(space_, "s", 20).ok());
  EXPECT_TRUE(engine_->truncate(space_, "s", 1000).ok());
  EXPECT_EQ(len("s"), 20u);
  EXPECT_EQ(used(), 2u);
  EXPECT_TRUE(engine_->truncate(space_, "s", 10).ok());
  EXPECT_EQ(len("s"), 10u);
  EXPECT_EQ(used(), 1u) << "the partial block past the end is freed";
  EXPECT_EQ(read("s"), tagsOf(head(t, 10)));
  EXPECT_TRUE(engine_->truncate(space_, "nosuch", 5).ok());
  EXPECT_EQ(len("nosuch"), std::nullopt);

  // Sealed blocks past the end leave the sequence and stay cached in the index.
  const auto u = toks(48, 2000);
  ASSERT_TRUE(write("u", 0, u));
  const uint64_t before = used();
  EXPECT_TRUE(engine_->truncate(space_, "u", 16).ok());
  EXPECT_EQ(used(), before) << "sealed blocks stay until evicted";
  EXPECT_EQ(engine_->stats().blocksCached, 2u);
  EXPECT_EQ(read("u"), tagsOf(head(u, 16)));
  EXPECT_EQ(matched(u), 48u);
  EXPECT_TRUE(engine_->truncate(space_, "u", 0).ok());
  EXPECT_EQ(len("u").value_or(0), 0u);
  EXPECT_EQ(engine_->stats().blocksCached, 3u);
}

TEST_F(EngineTest, TruncateIntoASealedBlockKeepsThePrefix) {
  const auto t = toks(32, 1000);
  ASSERT_TRUE(write("s", 0, t));
  const auto locs = blocksOf("s");
  EXPECT_TRUE(engine_->truncate(space_, "s", 20).ok());
  EXPECT_EQ(len("s"), 20u);
  EXPECT_EQ(read("s"), tagsOf(head(t, 20)));
  EXPECT_EQ(blocksOf("s"), locs);
  EXPECT_EQ(matched(t), 32u) << "the sealed block itself is unchanged";
  // Continuing writes a copy, with a different token 20.
  const auto more = toks(12, 5000);
  ASSERT_TRUE(write("s", 20, more));
  EXPECT_EQ(read("s"), tagsOf(cat(head(t, 20), more)));
  EXPECT_EQ(matched(cat(head(t, 20), more)), 32u);
  EXPECT_EQ(matched(t), 32u);
  for (uint32_t slot = 0; slot < kBt; ++slot) EXPECT_EQ(tagAt(locs[1], slot), 1016u + slot);
}

TEST_F(EngineTest, CanResume) {
  ASSERT_TRUE(write("s", 0, toks(20, 1000)));
  EXPECT_TRUE(resumable("s", 0));
  EXPECT_TRUE(resumable("s", 16));
  EXPECT_TRUE(resumable("s", 20));
  EXPECT_FALSE(resumable("s", 21));
  EXPECT_FALSE(resumable("s", kEnd));
  EXPECT_TRUE(resumable("nosuch", 0));
  EXPECT_FALSE(resumable("nosuch", 1));
  EXPECT_EQ(engine_->canResume(space_, "", 0).code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(engine_->truncate(space_, "s", 5).ok());
  EXPECT_TRUE(resumable("s", 5));
  EXPECT_FALSE(resumable("s", 6));
}

// ---------------------------------------------------------------------------------------------
// Leases, FULL and eviction

TEST_F(EngineTest, ReadLeasePinsBlocksAndAFullPoolAnswersFull) {
  makeEngine(2);
  const auto t = toks(32, 1000);
  ASSERT_TRUE(write("s", 0, t));
  auto g = engine_->get(space_, "s", 0, kEnd);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(engine_->remove(space_, "s", 0, kEnd).ok());
  EXPECT_EQ(engine_->stats().blocksPinned, 2u);
  EXPECT_EQ(engine_->stats().blocksCached, 0u) << "pinned blocks are not evictable";

  EXPECT_EQ(put("t", 0, toks(16, 2000)).code(), ErrorCode::kFull);
  EXPECT_EQ(len("t"), std::nullopt);
  EXPECT_EQ(engine_->stats().writeLeases, 0u);
  EXPECT_EQ(engine_->stats().evictions, 0u);
  EXPECT_EQ(used(), 2u);
  for (uint32_t slot = 0; slot < kBt; ++slot) {
    EXPECT_EQ(tagAt(g->blocks[0], slot), 1000u + slot);
    EXPECT_EQ(tagAt(g->blocks[1], slot), 1016u + slot);
  }
  EXPECT_EQ(matched(t), 32u) << "still indexed";

  // Released, they are evictable again.
  EXPECT_TRUE(engine_->releaseRead(g->lease).ok());
  EXPECT_EQ(engine_->stats().blocksCached, 2u);
  ASSERT_TRUE(write("t", 0, toks(16, 2000)));
  EXPECT_EQ(engine_->stats().evictions, 1u);
  EXPECT_EQ(read("t"), tagsOf(toks(16, 2000)));
}

TEST_F(EngineTest, LookupLeasePinsBlocks) {
  makeEngine(1);
  const auto t = toks(16, 1000);
  ASSERT_TRUE(write("s", 0, t));
  auto l = engine_->lookup(kOwner, space_, t, {}, "", SeqOptions{});
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->matchedTokens, 16u);
  ASSERT_TRUE(engine_->remove(space_, "s", 0, kEnd).ok());
  EXPECT_EQ(put("t", 0, toks(16, 2000)).code(), ErrorCode::kFull);
  EXPECT_EQ(tagAt(l->blocks[0], 7), 1007u);
  EXPECT_TRUE(engine_->releaseRead(l->lease).ok());
  ASSERT_TRUE(write("t", 0, toks(16, 2000)));
  EXPECT_EQ(matched(t), 0u) << "the evicted block left the index";
}

TEST_F(EngineTest, PinningACachedBlockProtectsItFromEviction) {
  makeEngine(1);
  const auto t = toks(16, 1000);
  ASSERT_TRUE(write("s", 0, t));
  ASSERT_TRUE(engine_->remove(space_, "s", 0, kEnd).ok());
  ASSERT_EQ(engine_->stats().blocksCached, 1u);
  // No sequence holds the block when the lookup pins it.
  auto l = engine_->lookup(kOwner, space_, t, {}, "", SeqOptions{});
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->matchedTokens, 16u);
  EXPECT_EQ(engine_->stats().blocksCached, 0u);
  EXPECT_EQ(put("t", 0, toks(16, 2000)).code(), ErrorCode::kFull);
  EXPECT_EQ(engine_->stats().evictions, 0u);
  for (uint32_t slot = 0; slot < kBt; ++slot) EXPECT_EQ(tagAt(l->blocks[0], slot), 1000u + slot);
  EXPECT_TRUE(engine_->resolveSealed(space_, l->blocks[0]).ok());
  EXPECT_TRUE(engine_->releaseRead(l->lease).ok());
  EXPECT_EQ(engine_->stats().blocksCached, 1u);
  ASSERT_TRUE(write("t", 0, toks(16, 2000)));
  EXPECT_EQ(engine_->stats().evictions, 1u);
}

TEST_F(EngineTest, LookupStopsAtTheFirstEvictedBlock) {
  makeEngine(4);
  const auto t = toks(48, 1000);
  ASSERT_TRUE(write("s", 0, t));
  // A snapshot of [32, 48) keeps block 2 (a released prefix is evicted tail first: only
  // something that holds a later block apart from its parents leaves it behind).
  ASSERT_TRUE(engine_->snapshot(space_, "s", 32).ok());
  ASSERT_TRUE(engine_->remove(space_, "s", 0, kEnd).ok());
  ASSERT_EQ(engine_->stats().blocksCached, 2u);
  // Touch block 0 so that block 1 is the least recently used, then evict exactly that one: y
  // takes the one free block and block 1.
  ASSERT_EQ(matched(head(t, 16)), 16u);
  ASSERT_TRUE(write("y", 0, toks(20, 5000)));
  ASSERT_EQ(engine_->stats().evictions, 1u);
  EXPECT_EQ(matched(t), 16u) << "blocks 0 and 2 are cached, but the prefix ends at block 1";

  // Recomputing block 1 (into the block y's partial block leaves free) makes the whole prefix
  // available again: block 2's key follows from block 1's.
  ASSERT_TRUE(engine_->truncate(space_, "y", 16).ok());
  auto bound = engine_->lookup(kOwner, space_, t, {}, "s", SeqOptions{});
  ASSERT_TRUE(bound.ok());
  EXPECT_TRUE(engine_->releaseRead(bound->lease).ok());
  ASSERT_EQ(len("s"), 16u);
  ASSERT_TRUE(write("s", 16, std::vector<uint32_t>(t.begin() + 16, t.begin() + 32)));
  EXPECT_EQ(engine_->stats().evictions, 1u);
  EXPECT_EQ(matched(t), 48u);
}

TEST_F(EngineTest, AWriteLeaseKeepsItsBlocksWhenTheSequenceGoes) {
  makeEngine(2);
  ASSERT_TRUE(write("s", 0, toks(20, 1000)));
  auto g = put("s", 20, toks(4, 2000));  // into s's own partial block
  ASSERT_TRUE(g.ok());
  ASSERT_EQ(g->blocks.size(), 1u);
  ASSERT_TRUE(engine_->remove(space_, "s", 0, kEnd).ok());
  // s's sealed block is evictable, the block under the write lease is not.
  auto t = put("t", 0, toks(16, 3000));
  ASSERT_TRUE(t.ok()) << t.error();
  EXPECT_NE(t->blocks[0], g->blocks[0]);
  EXPECT_EQ(put("u", 0, toks(16, 4000)).code(), ErrorCode::kFull);
  fill(*g, 20, toks(4, 2000));
  EXPECT_EQ(engine_->commit(g->lease, kEnd).code(), ErrorCode::kConflict);
  EXPECT_EQ(len("s"), std::nullopt);
  EXPECT_TRUE(engine_->abortWrite(t->lease).ok());
  EXPECT_EQ(used(), 0u);
}

TEST_F(EngineTest, BlocksHeldBySequencesAreNeverEvicted) {
  makeEngine(2);
  const auto t = toks(20, 1000);
  ASSERT_TRUE(write("s", 0, t));
  EXPECT_EQ(put("t", 0, toks(16, 2000)).code(), ErrorCode::kFull);
  EXPECT_EQ(engine_->stats().evictions, 0u);
  EXPECT_EQ(read("s"), tagsOf(t));
  EXPECT_EQ(matched(t), 16u);
  // A put needing more blocks than can be found takes none.
  ASSERT_TRUE(engine_->truncate(space_, "s", 16).ok());
  EXPECT_EQ(used(), 1u);
  EXPECT_EQ(put("t", 0, toks(20, 2000)).code(), ErrorCode::kFull);
  EXPECT_EQ(used(), 1u);
  EXPECT_EQ(engine_->stats().writeLeases, 0u);
  EXPECT_EQ(read("s"), tagsOf(head(t, 16)));
}

TEST_F(EngineTest, EvictionTakesTheLeastRecentlyUsedUnpinnedUnheldBlock) {
  makeEngine(4);
  const auto a = toks(16, 1000), b = toks(16, 2000), c = toks(16, 3000), d = toks(16, 4000);
  ASSERT_TRUE(write("a", 0, a));
  ASSERT_TRUE(write("b", 0, b));
  ASSERT_TRUE(write("c", 0, c));  // stays held by c
  ASSERT_TRUE(write("d", 0, d));
  auto pinD = engine_->lookup(kOwner, space_, d, {}, "", SeqOptions{});
  ASSERT_TRUE(pinD.ok());
  ASSERT_EQ(pinD->matchedTokens, 16u);
  ASSERT_TRUE(engine_->remove(space_, "d", 0, kEnd).ok());  // d's block: pinned only
  ASSERT_TRUE(engine_->remove(space_, "a", 0, kEnd).ok());  // cached first
  ASSERT_TRUE(engine_->remove(space_, "b", 0, kEnd).ok());  // cached second
  EXPECT_EQ(used(), 4u);
  EXPECT_EQ(engine_->stats().blocksCached, 2u);

  // A lookup hit makes a's block the most recently used: b's is now the oldest.
  EXPECT_EQ(matched(a), 16u);
  auto e = put("e", 0, toks(16, 5000));
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_EQ(engine_->stats().evictions, 1u);
  EXPECT_EQ(matched(b), 0u) << "the evicted block left the index";
  EXPECT_EQ(matched(a), 16u);

  auto f = put("f", 0, toks(16, 6000));
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ(engine_->stats().evictions, 2u);
  EXPECT_EQ(matched(a), 0u);

  // Left: c's held block, d's pinned block, two blocks under write leases.
  EXPECT_EQ(put("g", 0, toks(16, 7000)).code(), ErrorCode::kFull);
  EXPECT_EQ(engine_->stats().evictions, 2u);
  EXPECT_EQ(read("c"), tagsOf(c));
  EXPECT_EQ(matched(c), 16u);
  for (uint32_t slot = 0; slot < kBt; ++slot) EXPECT_EQ(tagAt(pinD->blocks[0], slot), 4000u + slot);
  EXPECT_EQ(matched(d), 16u);

  fill(*e, 0, toks(16, 5000));
  ASSERT_TRUE(engine_->commit(e->lease, kEnd).ok());
  EXPECT_TRUE(engine_->abortWrite(f->lease).ok());
  EXPECT_TRUE(engine_->releaseRead(pinD->lease).ok());
  EXPECT_EQ(read("e"), tagsOf(toks(16, 5000)));
  EXPECT_EQ(engine_->stats().evictions, 2u);
}

TEST_F(EngineTest, ReadLeaseBytesDoNotChangeUnderAnAppendAfterTruncate) {
  // A reader granted [0, 20) reads positions 16..19 from the partial block. The sequence is then
  // cut to 18 and appended to: the append must not write into the block the reader still pins
  // (that would change bytes under a read lease, and show uncommitted bytes to the reader).
  const auto t = toks(20, 1000);
  ASSERT_TRUE(write("s", 0, t));
  auto r = engine_->get(space_, "s", 0, kEnd);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->end, 20u);
  ASSERT_EQ(r->blocks.size(), 2u);
  ASSERT_TRUE(engine_->truncate(space_, "s", 18).ok());

  const auto more = toks(2, 2000);
  auto g = put("s", 18, more);
  ASSERT_TRUE(g.ok()) << g.error();
  fill(*g, 18, more);
  EXPECT_EQ(tagAt(r->blocks[1], 2), 1018u) << "uncommitted bytes are visible through a read lease";
  EXPECT_EQ(tagAt(r->blocks[1], 3), 1019u);
  ASSERT_TRUE(engine_->commit(g->lease, kEnd).ok());
  EXPECT_EQ(tagAt(r->blocks[1], 2), 1018u) << "bytes changed under a read lease";
  EXPECT_EQ(tagAt(r->blocks[1], 3), 1019u);
  EXPECT_EQ(read("s"), tagsOf(cat(head(t, 18), more)));
  EXPECT_TRUE(engine_->releaseRead(r->lease).ok());
  EXPECT_EQ(read("s"), tagsOf(cat(head(t, 18), more)));
}

TEST_F(EngineTest, ReadLeaseKeepsAPartialBlockOfARemovedSequence) {
  const auto t = toks(20, 1000);
  ASSERT_TRUE(write("s", 0, t));
  auto r = engine_->get(space_, "s", 0, kEnd);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(engine_->remove(space_, "s", 0, kEnd).ok());
  EXPECT_EQ(used(), 2u) << "the pinned partial block is not freed";
  ASSERT_TRUE(write("s", 0, toks(20, 5000)));
  for (const auto& loc : blocksOf("s")) EXPECT_NE(loc, r->blocks[1]);
  for (uint32_t slot = 0; slot < 4; ++slot) EXPECT_EQ(tagAt(r->blocks[1], slot), 1016u + slot);
  EXPECT_TRUE(engine_->releaseRead(r->lease).ok());
  EXPECT_EQ(used(), 3u) << "released: s's two blocks and the old sealed block (cached)";
}

// ---------------------------------------------------------------------------------------------
// resolveSealed

TEST_F(EngineTest, ResolveSealedDetectsReuse) {
  makeEngine(1);
  ASSERT_TRUE(write("a", 0, toks(16, 1000)));
  const BlockLocation refA = blocksOf("a")[0];
  auto r = engine_->resolveSealed(space_, refA);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(*r, at(refA));
  EXPECT_EQ(readTag(layout_, *r, 3), 1003u);
  // Cached (no sequence holds it) is still sealed and resolvable.
  ASSERT_TRUE(engine_->remove(space_, "a", 0, kEnd).ok());
  EXPECT_TRUE(engine_->resolveSealed(space_, refA).ok());

  // Evicted and reused for another block: the old reference is stale.
  ASSERT_TRUE(write("b", 0, toks(16, 2000)));
  const BlockLocation refB = blocksOf("b")[0];
  ASSERT_EQ(refB.extent, refA.extent);
  ASSERT_EQ(refB.offset, refA.offset);
  EXPECT_NE(refB.generation, refA.generation);
  EXPECT_EQ(engine_->resolveSealed(space_, refA).code(), ErrorCode::kStaleReference);
  auto rb = engine_->resolveSealed(space_, refB);
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(readTag(layout_, *rb, 3), 2003u);

  // Garbage references name no block.
  auto bad = refB;
  bad.offset = 7;
  EXPECT_EQ(engine_->resolveSealed(space_, bad).code(), ErrorCode::kInvalidArgument);
  bad = refB;
  bad.offset = 100 * kBlockBytes;
  EXPECT_EQ(engine_->resolveSealed(space_, bad).code(), ErrorCode::kInvalidArgument);
  bad = refB;
  bad.extent = 9;
  EXPECT_EQ(engine_->resolveSealed(space_, bad).code(), ErrorCode::kInvalidArgument);
  bad = refB;
  bad.bytes = kBlockBytes / 2;
  EXPECT_EQ(engine_->resolveSealed(space_, bad).code(), ErrorCode::kInvalidArgument);
  // Another tenant's space does not resolve it.
  auto tenantB = engine_->openSpace(layout_, saltFor("tenant-b"));
  ASSERT_TRUE(tenantB.ok());
  EXPECT_FALSE(engine_->resolveSealed(*tenantB, refB).ok());
}

TEST_F(EngineTest, ResolveSealedRejectsExtentIdsThatAliasAnotherBlock) {
  // Extent ids are 16 bits inside the pool: extent 65536 is no extent, even though its low bits
  // are those of extent 0.
  ASSERT_TRUE(write("a", 0, toks(16, 1000)));
  const BlockLocation ref = blocksOf("a")[0];
  ASSERT_TRUE(engine_->resolveSealed(space_, ref).ok());
  auto bad = ref;
  bad.extent = ref.extent + (1u << 16);
  EXPECT_EQ(engine_->resolveSealed(space_, bad).code(), ErrorCode::kInvalidArgument);
}

TEST_F(EngineTest, ResolveSealedRefusesAPartialBlock) {
  ASSERT_TRUE(write("p", 0, toks(20, 1000)));
  const auto locs = blocksOf("p");
  ASSERT_EQ(locs.size(), 2u);
  EXPECT_TRUE(engine_->resolveSealed(space_, locs[0]).ok());
  EXPECT_EQ(engine_->resolveSealed(space_, locs[1]).code(), ErrorCode::kStaleReference);
}

// ---------------------------------------------------------------------------------------------
// Owners and stats

TEST_F(EngineTest, EndOwnerRemovesOnlyItsNonDetachedSequences) {
  const auto t = toks(20, 1000);
  ASSERT_TRUE(write("s1", 0, t, /*owner=*/1, /*detached=*/false));
  ASSERT_TRUE(write("s2", 0, t, /*owner=*/1, /*detached=*/true));
  ASSERT_TRUE(write("s3", 0, t, /*owner=*/2, /*detached=*/false));
  ASSERT_TRUE(engine_->copyPrefix(1, space_, "s3", "c1", 20, SeqOptions{}).ok());
  ASSERT_TRUE(engine_->copyPrefix(1, space_, "s3", "c2", 20, SeqOptions{.detached = true}).ok());
  auto l1 = engine_->lookup(1, space_, t, {}, "l1", SeqOptions{});
  auto l2 = engine_->lookup(1, space_, t, {}, "l2", SeqOptions{.detached = true});
  ASSERT_TRUE(l1.ok());
  ASSERT_TRUE(l2.ok());
  EXPECT_TRUE(engine_->releaseRead(l1->lease).ok());
  EXPECT_TRUE(engine_->releaseRead(l2->lease).ok());
  EXPECT_EQ(engine_->stats().sequences, 7u);

  engine_->endOwner(1);
  EXPECT_EQ(len("s1"), std::nullopt);
  EXPECT_EQ(len("c1"), std::nullopt);
  EXPECT_EQ(len("l1"), std::nullopt);
  EXPECT_EQ(len("s2"), 20u);
  EXPECT_EQ(len("c2"), 20u);
  EXPECT_EQ(len("l2"), 16u);
  EXPECT_EQ(len("s3"), 20u);
  EXPECT_EQ(read("s2"), tagsOf(t));
  EXPECT_EQ(engine_->stats().sequences, 4u);
  EXPECT_EQ(matched(t), 16u) << "sealed blocks outlive sequences";

  engine_->endOwner(99);
  EXPECT_EQ(engine_->stats().sequences, 4u);
  engine_->endOwner(2);
  EXPECT_EQ(len("s3"), std::nullopt);
  EXPECT_EQ(len("s2"), 20u);
  EXPECT_EQ(engine_->stats().sequences, 3u);
}

TEST_F(EngineTest, StatsCountBlocksLeasesAndSequences) {
  makeEngine(8);
  auto s = engine_->stats();
  EXPECT_EQ(s.blocksTotal, 8u);
  EXPECT_EQ(s.bytesTotal, 8u * kBlockBytes);
  EXPECT_EQ(s.blocksUsed, 0u);
  ASSERT_EQ(s.spaces.size(), 1u);
  EXPECT_EQ(s.spaces[0].blockBytes, kBlockBytes);
  EXPECT_EQ(s.spaces[0].fingerprint, layout_.fingerprint());
  EXPECT_EQ(s.spaces[0].blocksTotal, 8u);

  ASSERT_TRUE(write("s", 0, toks(40, 1000)));
  s = engine_->stats();
  EXPECT_EQ(s.blocksUsed, 3u);
  EXPECT_EQ(s.bytesUsed, 3u * kBlockBytes);
  EXPECT_EQ(s.sequences, 1u);
  EXPECT_EQ(s.spaces[0].sequences, 1u);
  EXPECT_EQ(s.spaces[0].blocksUsed, 3u);
  EXPECT_EQ(s.bytesPut, 40u * layout_.tokenKvBytes());

  auto g = engine_->get(space_, "s", 0, kEnd);
  ASSERT_TRUE(g.ok());
  auto w = put("t", 0, toks(4, 1));
  ASSERT_TRUE(w.ok());
  s = engine_->stats();
  EXPECT_EQ(s.readLeases, 1u);
  EXPECT_EQ(s.writeLeases, 1u);
  EXPECT_EQ(s.blocksPinned, 4u) << "the read lease's three blocks and the write lease's one";
  EXPECT_EQ(s.bytesGot, 40u * layout_.tokenKvBytes());
  EXPECT_TRUE(engine_->releaseRead(g->lease).ok());
  EXPECT_TRUE(engine_->abortWrite(w->lease).ok());

  ASSERT_TRUE(engine_->remove(space_, "s", 0, kEnd).ok());
  s = engine_->stats();
  EXPECT_EQ(s.readLeases, 0u);
  EXPECT_EQ(s.writeLeases, 0u);
  EXPECT_EQ(s.blocksPinned, 0u);
  EXPECT_EQ(s.sequences, 0u);
  EXPECT_EQ(s.blocksUsed, 2u) << "sealed blocks stay, cached";
  EXPECT_EQ(s.blocksCached, 2u);
  EXPECT_EQ(s.evictions, 0u);
}

}  // namespace
}  // namespace kvtier
