// TwoQEvictionPolicy (store/eviction.h) on its own: probation before protected, what protects
// content (reuse in memory, a continuation of a reused prefix, the eviction history), dead ends,
// replicas, moves, the history's reach and size, and a model check of victim() and oldest().
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "store/eviction.h"
#include "store/eviction_model_test_util.h"

namespace kvtier {
namespace {

uint64_t tagOf(uint64_t content) { return 1000 + content; }

// A prefix's blocks released together, last block first (as the engine releases them).
void release(EvictionPolicy& p, const std::vector<BlockId>& blocks, uint32_t cls = 0) {
  for (size_t i = blocks.size(); i-- > 0;) p.insert(blocks[i], cls, false, tagOf(blocks[i]));
}

// A prefix used again: held (erase) and released again.
void reuse(EvictionPolicy& p, const std::vector<BlockId>& blocks) {
  for (BlockId b : blocks) p.erase(b);
  release(p, blocks);
}

// Evicts `n` blocks of class 0 as allocation does; returns them in order.
std::vector<BlockId> evict(EvictionPolicy& p, size_t n, uint64_t tagBase = 0) {
  std::vector<BlockId> out;
  for (size_t i = 0; i < n; ++i) {
    const BlockId v = p.victim(0);
    if (v == kNoBlock) break;
    out.push_back(v);
    p.evicted(v, tagBase ? tagBase + v : tagOf(v));
  }
  return out;
}

TEST(TwoQEvictionTest, NewContentGoesBeforeReusedContentTailFirst) {
  TwoQEvictionPolicy q;
  release(q, {1, 2, 3});  // a prefix, used once
  release(q, {4, 5});     // another, used twice
  reuse(q, {4, 5});
  release(q, {6, 7});  // new, after the reuse
  EXPECT_EQ(q.probationBlocks(0), 5u);
  EXPECT_EQ(q.protectedBlocks(0), 2u);
  std::vector<BlockId> order;
  q.oldest(0, 10, order);
  EXPECT_EQ(order, (std::vector<BlockId>{3, 2, 1, 7, 6, 5, 4}));
  EXPECT_EQ(evict(q, 7), order) << "oldest() lists what the evictions take";
}

TEST(TwoQEvictionTest, AScanNeverDisplacesAReusedPrompt) {
  TwoQEvictionPolicy q;
  const std::vector<BlockId> prompt{1, 2, 3, 4};
  release(q, prompt);
  reuse(q, prompt);
  // 1,000 one-time blocks through a cache of 64 blocks. (A few percent of them pass the
  // history's Bloom filters as evicted lately and are protected: in a cache of 8 they would
  // outnumber the prompt's room and push it out of the protected list's LRU end.)
  for (BlockId b = 100; b < 1100; ++b) {
    q.insert(b, 0, false, tagOf(b));
    if (q.size() > 64) {
      const BlockId v = q.victim(0);
      ASSERT_GE(v, 100u) << "the scan evicted the prompt's block " << v;
      q.evicted(v, tagOf(v));
    }
  }
  // The prompt, and the one-time blocks the filters took for evicted content (a few percent).
  EXPECT_GE(q.protectedBlocks(0), prompt.size());
  EXPECT_LE(q.protectedBlocks(0), prompt.size() + 1000 * 5 / 100);
}

TEST(TwoQEvictionTest, ContentEvictedLatelyComesBackProtected) {
  TwoQEvictionPolicy q;
  release(q, {1, 2, 3, 4});
  EXPECT_EQ(evict(q, 2), (std::vector<BlockId>{4, 3}));
  // The same content in other blocks (tags 1004 and 1003), and content never seen.
  q.insert(10, 0, false, tagOf(4));
  q.insert(11, 0, false, tagOf(3));
  q.insert(12, 0, false, 99999);
  EXPECT_EQ(q.protectedBlocks(0), 2u);
  EXPECT_EQ(q.victim(0), 2u) << "new content goes first";
  // Untagged content is never recognised.
  q.insert(13, 0, false, 0);
  EXPECT_EQ(q.protectedBlocks(0), 2u);
}

TEST(TwoQEvictionTest, TheHistoryReachesSeveralTimesTheCapacityAndStaysBounded) {
  TwoQEvictionPolicy q;
  constexpr BlockId kCapacity = 50;
  std::vector<BlockId> all;
  for (BlockId b = 0; b < kCapacity; ++b) all.push_back(b);
  release(q, all);
  ASSERT_EQ(q.capacity(0), kCapacity);
  // 20,000 contents pass through: evict one, bring in the next in its block.
  std::vector<uint64_t> content(kCapacity);
  for (BlockId b = 0; b < kCapacity; ++b) content[b] = tagOf(b);
  uint64_t nextContent = 1'000'000;
  std::vector<uint64_t> evictedTags;
  for (int i = 0; i < 20000; ++i) {
    const BlockId v = q.victim(0);
    ASSERT_NE(v, kNoBlock);
    q.evicted(v, content[v]);
    evictedTags.push_back(content[v]);
    content[v] = ++nextContent;
    q.insert(v, 0, false, content[v]);
  }
  EXPECT_EQ(q.capacity(0), kCapacity);
  // The last kHistorySpan * c evictions are all remembered (a Bloom filter has no false
  // negatives); those of long ago only as false positives, a few percent.
  const size_t span = TwoQEvictionPolicy::kHistorySpan * kCapacity;
  TwoQEvictionPolicy probe = q;
  auto recognised = [&probe](uint64_t tag) {
    const uint64_t before = probe.protectedBlocks(0);
    probe.insert(kCapacity + 1, 0, false, tag);
    const bool yes = probe.protectedBlocks(0) > before;
    probe.evicted(kCapacity + 1, 0);  // untagged: not added to the history
    return yes;
  };
  size_t recent = 0, old = 0;
  for (size_t i = evictedTags.size() - span; i < evictedTags.size(); ++i) {
    recent += recognised(evictedTags[i]);
  }
  for (size_t i = 0; i < 2000; ++i) old += recognised(evictedTags[i]);
  EXPECT_EQ(recent, span);
  EXPECT_LT(old, 2000u * 5 / 100) << "forgotten content still recognised";
  // Two generations of kHistorySpan * c entries, 10 bits each, rounded up to 64-bit words.
  EXPECT_LE(q.historyBytes(), 2 * (span * EvictionHistory::kBitsPerEntry / 8 + 8));
}

TEST(TwoQEvictionTest, TheEndOfACommitGoesFirstUnlessExtended) {
  TwoQEvictionPolicy q;
  // A prompt of 3 blocks: its last block is a dead end.
  q.sealed(std::vector<BlockId>{1, 2, 3}, kNoBlock, 0);
  release(q, {1, 2, 3});
  // A prompt put in two commits: the first commit's end is extended by the second (its own,
  // still held block): only the second commit's end is one.
  q.sealed(std::vector<BlockId>{10, 11}, kNoBlock, 0);
  q.sealed(std::vector<BlockId>{12, 13}, 11, 2);
  release(q, {10, 11, 12, 13});
  std::vector<BlockId> order;
  q.oldest(0, 10, order);
  EXPECT_EQ(order, (std::vector<BlockId>{3, 13, 2, 1, 12, 11, 10}));
  // A dead end used again is protected like any reused block.
  reuse(q, {1, 2, 3});
  EXPECT_EQ(q.protectedBlocks(0), 3u);
  EXPECT_EQ(q.victim(0), 13u);
}

TEST(TwoQEvictionTest, ANextTurnOfAReusedPrefixIsProtectedALongDocumentIsNot) {
  TwoQEvictionPolicy q;
  const std::vector<BlockId> prefix{1, 2, 3, 4};
  release(q, prefix);
  for (BlockId b : prefix) q.erase(b);         // the next request holds the prefix
  q.sealed(std::vector<BlockId>{5, 6}, 4, 4);  // 2 new blocks after 4 reused
  release(q, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(q.protectedBlocks(0), 6u);
  EXPECT_EQ(q.probationBlocks(0), 0u);
  // 20 new blocks after the same 4: a document after a shared prompt, on probation.
  for (BlockId b : prefix) q.erase(b);
  std::vector<BlockId> doc;
  for (BlockId b = 20; b < 40; ++b) doc.push_back(b);
  q.sealed(doc, 4, 4);
  std::vector<BlockId> all = prefix;
  all.insert(all.end(), doc.begin(), doc.end());
  release(q, all);
  EXPECT_EQ(q.probationBlocks(0), doc.size());
  EXPECT_EQ(q.victim(0), 39u) << "the document's end goes first";
}

TEST(TwoQEvictionTest, ReplicasGoFirstAndAreProtectedWhenReadAgain) {
  TwoQEvictionPolicy q;
  release(q, {1, 2});
  q.insert(7, 0, /*first=*/true, tagOf(7));
  q.insert(8, 0, /*first=*/true, tagOf(8));
  EXPECT_EQ(q.victim(0), 8u) << "the last replica in goes first";
  reuse(q, {7});
  EXPECT_EQ(q.protectedBlocks(0), 1u);
  // A replica's eviction is not this node's history.
  EXPECT_EQ(evict(q, 1), std::vector<BlockId>{8});
  q.insert(9, 0, false, tagOf(8));
  EXPECT_EQ(q.protectedBlocks(0), 1u);
}

TEST(TwoQEvictionTest, AMovedBlockKeepsItsList) {
  TwoQEvictionPolicy q;
  release(q, {1, 2});
  reuse(q, {1});
  q.erase(1);
  q.moved(1, 5);
  q.insert(5, 1, false, tagOf(1));  // another class: another tier
  EXPECT_EQ(q.protectedBlocks(1), 1u);
  EXPECT_EQ(q.protectedBlocks(0), 0u);
  EXPECT_EQ(q.capacity(1), 1u);
  // The old block is another block now.
  q.insert(1, 0, false, 4242);
  EXPECT_EQ(q.probationBlocks(0), 2u);
}

// A model check: under random inserts (some sealed first), holds, evictions and moves, victim()
// is always a block in the order (never a held one), and oldest() lists exactly what successive
// evictions take, also with blocks about to be pinned skipped.
TEST(TwoQEvictionTest, VictimsAreAlwaysEvictableAndOldestMatchesEvictions) {
  test::runCopyableModel<TwoQEvictionPolicy>({.seed = 777});
}

// The same across three size classes (tiers), content moving between them: a victim is always of
// the class asked for, and each class's oldest() is that class's evictions.
TEST(TwoQEvictionTest, EveryClassEvictsOnlyItsOwnBlocks) {
  test::runCopyableModel<TwoQEvictionPolicy>({.seed = 778, .checkSize = true, .classes = 3});
}

TEST(TwoQEvictionTest, ParsesAndNamesItsKind) {
  auto k = parseEvictionKind("2q");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, EvictionKind::kTwoQ);
  EXPECT_STREQ(evictionName(EvictionKind::kTwoQ), "2q");
  EXPECT_FALSE(parseEvictionKind("2Q").ok());
  EXPECT_NE(dynamic_cast<TwoQEvictionPolicy*>(makeEvictionPolicy(EvictionKind::kTwoQ).get()),
            nullptr);
}

}  // namespace
}  // namespace kvtier
