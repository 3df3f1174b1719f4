// Engine unit tests: sealing, deduplication and lookup, copyPrefix, remove, truncate and
// canResume (the fixture: engine_test_fixture.h).

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

}  // namespace
}  // namespace kvtier
