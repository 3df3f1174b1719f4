// Engine unit tests: read and write leases, a full pool and eviction, resolveSealed, a
// session's end and the stats (the fixture: engine_test_fixture.h).

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
