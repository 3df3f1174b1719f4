// Engine unit tests: namespaces, puts and commits, appends in place and copy-on-write (the
// fixture: engine_test_fixture.h; lookups: engine_lookup_test.cc; leases and eviction:
// engine_lease_test.cc).

#include "store/engine.h"
#include "store/engine_test_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace kvtier {
namespace {

using namespace test_util;  // EngineTest, smallLayout, Tags, tagsOf, toks, kOwner

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

}  // namespace
}  // namespace kvtier
