#include "store/eviction.h"
#include "store/eviction_model_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

namespace kvtier {
namespace {

// Evicts everything of `cls` in the policy's order (victim, then erase it).
std::vector<BlockId> drain(EvictionPolicy& policy, uint32_t cls) {
  std::vector<BlockId> order;
  for (BlockId v = policy.victim(cls); v != kNoBlock; v = policy.victim(cls)) {
    order.push_back(v);
    policy.erase(v);
    if (order.size() > 1000) break;  // a broken list must not hang the test
  }
  return order;
}

TEST(LruEvictionTest, EmptyHasNoVictim) {
  LruEvictionPolicy lru;
  EXPECT_EQ(lru.size(), 0u);
  EXPECT_EQ(lru.victim(0), kNoBlock);
  EXPECT_EQ(lru.victim(7), kNoBlock);
  lru.erase(3);  // never inserted: no-op
  EXPECT_EQ(lru.size(), 0u);
}

TEST(LruEvictionTest, LeastRecentlyInsertedGoesFirst) {
  LruEvictionPolicy lru;
  for (BlockId id : {5u, 2u, 9u, 0u}) lru.insert(id, 0);
  EXPECT_EQ(lru.size(), 4u);
  EXPECT_EQ(lru.victim(0), 5u);
  EXPECT_EQ(lru.size(), 4u) << "victim() does not erase";
  EXPECT_EQ(drain(lru, 0), (std::vector<BlockId>{5, 2, 9, 0}));
  EXPECT_EQ(lru.size(), 0u);
}

TEST(LruEvictionTest, ReinsertMovesToMostRecent) {
  LruEvictionPolicy lru;
  for (BlockId id : {1u, 2u, 3u}) lru.insert(id, 0);
  lru.insert(1, 0);  // used again
  EXPECT_EQ(lru.size(), 3u) << "a block is counted once";
  EXPECT_EQ(drain(lru, 0), (std::vector<BlockId>{2, 3, 1}));
}

TEST(LruEvictionTest, InsertedFirstGoesFirst) {
  LruEvictionPolicy lru;
  for (BlockId id : {1u, 2u}) lru.insert(id, 0);
  lru.insert(3, 0, /*first=*/true);  // a replica: before the least recently used
  lru.insert(4, 0);
  EXPECT_EQ(lru.victim(0), 3u);
  lru.insert(5, 1, /*first=*/true);  // an empty list
  EXPECT_EQ(lru.victim(1), 5u);
  EXPECT_EQ(drain(lru, 0), (std::vector<BlockId>{3, 1, 2, 4}));
  EXPECT_EQ(drain(lru, 1), (std::vector<BlockId>{5}));
}

TEST(LruEvictionTest, EraseHeadMiddleAndTail) {
  LruEvictionPolicy lru;
  for (BlockId id : {10u, 11u, 12u, 13u, 14u}) lru.insert(id, 0);
  lru.erase(12);  // middle
  lru.erase(10);  // head
  lru.erase(14);  // tail
  lru.erase(14);  // twice: no-op
  lru.erase(99);  // never inserted: no-op
  EXPECT_EQ(lru.size(), 2u);
  EXPECT_EQ(lru.victim(0), 11u);
  // The list is still well linked at both ends after the erases.
  lru.insert(20, 0);
  EXPECT_EQ(drain(lru, 0), (std::vector<BlockId>{11, 13, 20}));
  // An erased block can come back, as the most recent.
  lru.insert(12, 0);
  lru.insert(10, 0);
  EXPECT_EQ(drain(lru, 0), (std::vector<BlockId>{12, 10}));
}

TEST(LruEvictionTest, EraseOnlyElementEmptiesList) {
  LruEvictionPolicy lru;
  lru.insert(4, 1);
  lru.erase(4);
  EXPECT_EQ(lru.victim(1), kNoBlock);
  EXPECT_EQ(lru.size(), 0u);
  lru.insert(6, 1);
  EXPECT_EQ(lru.victim(1), 6u);
}

TEST(LruEvictionTest, ListsArePerSizeClass) {
  LruEvictionPolicy lru;
  lru.insert(1, 0);
  lru.insert(2, 1);
  lru.insert(3, 0);
  lru.insert(4, 2);
  lru.insert(5, 1);
  EXPECT_EQ(lru.size(), 5u);
  EXPECT_EQ(lru.victim(0), 1u);
  EXPECT_EQ(lru.victim(1), 2u);
  EXPECT_EQ(lru.victim(2), 4u);
  EXPECT_EQ(lru.victim(3), kNoBlock);
  // Erasing in one class leaves the others alone.
  lru.erase(1);
  EXPECT_EQ(lru.victim(0), 3u);
  EXPECT_EQ(lru.victim(1), 2u);
  // A block that moves to another class leaves its old list.
  lru.insert(3, 1);
  EXPECT_EQ(lru.victim(0), kNoBlock);
  EXPECT_EQ(drain(lru, 1), (std::vector<BlockId>{2, 5, 3}));
  EXPECT_EQ(drain(lru, 2), (std::vector<BlockId>{4}));
  EXPECT_EQ(lru.size(), 0u);
}

TEST(LruEvictionTest, ManyBlocksKeepOrder) {
  LruEvictionPolicy lru;
  constexpr BlockId kN = 500;
  for (BlockId id = 0; id < kN; ++id) lru.insert(id, 0);
  // Touch the even ones: they move behind all odd ones, in touch order.
  for (BlockId id = 0; id < kN; id += 2) lru.insert(id, 0);
  std::vector<BlockId> expected;
  for (BlockId id = 1; id < kN; id += 2) expected.push_back(id);
  for (BlockId id = 0; id < kN; id += 2) expected.push_back(id);
  EXPECT_EQ(lru.size(), kN);
  EXPECT_EQ(drain(lru, 0), expected);
}

// ---------------------------------------------------------------------------------------------
// ARC, made aware of prefixes (the daemon's default).

TEST(EvictionKindTest, NamesParseBack) {
  for (EvictionKind k : {EvictionKind::kLru, EvictionKind::kArc}) {
    auto parsed = parseEvictionKind(evictionName(k));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, k);
  }
  EXPECT_EQ(parseEvictionKind("lfu").code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(kDefaultEviction, EvictionKind::kAdaptive);
  EXPECT_NE(dynamic_cast<ArcEvictionPolicy*>(makeEvictionPolicy(EvictionKind::kArc).get()),
            nullptr);
  EXPECT_NE(dynamic_cast<LruEvictionPolicy*>(makeEvictionPolicy(EvictionKind::kLru).get()),
            nullptr);
}

// A tag per content; block ids are where content lives now.
uint64_t tagOf(uint64_t content) { return 1000 + content; }

// A request's blocks released as the engine releases them: last block first.
void release(EvictionPolicy& p, const std::vector<BlockId>& blocks, uint32_t cls = 0) {
  for (size_t i = blocks.size(); i-- > 0;) p.insert(blocks[i], cls, false, tagOf(blocks[i]));
}
// A request that reuses `blocks`: held (erased) while it runs, released tail first.
void reuse(EvictionPolicy& p, const std::vector<BlockId>& blocks) {
  for (BlockId b : blocks) p.erase(b);
  release(p, blocks);
}
// Evicts the victim of class 0 as the engine does; returns it.
BlockId evictOne(EvictionPolicy& p) {
  const BlockId v = p.victim(0);
  if (v != kNoBlock) p.evicted(v, tagOf(v));
  return v;
}

TEST(ArcEvictionTest, AScanDoesNotFlushAFrequentlyReusedPrefix) {
  ArcEvictionPolicy arc;
  const std::vector<BlockId> prompt = {0, 1, 2, 3};
  release(arc, prompt);
  reuse(arc, prompt);  // a second request: reused
  reuse(arc, prompt);
  EXPECT_EQ(arc.frequentBlocks(0), 4u);
  // A scan: 1000 blocks used once, in a cache that holds 20 of them besides the prompt.
  std::set<BlockId> scanned;
  for (BlockId b = 100; b < 1100; ++b) {
    release(arc, {b});
    scanned.insert(b);
    if (arc.size() > 24) {
      const BlockId v = evictOne(arc);
      ASSERT_TRUE(scanned.count(v)) << "block " << v << " of the reused prompt was evicted";
      scanned.erase(v);
    }
  }
  // The same scan through LRU flushes the prompt.
  LruEvictionPolicy lru;
  release(lru, prompt);
  reuse(lru, prompt);
  reuse(lru, prompt);
  std::set<BlockId> lruEvicted;
  for (BlockId b = 100; b < 1100; ++b) {
    release(lru, {b});
    if (lru.size() > 24) lruEvicted.insert(evictOne(lru));
  }
  EXPECT_TRUE(lruEvicted.count(0));
}

TEST(ArcEvictionTest, APrefixGoesTailFirstInEitherList) {
  ArcEvictionPolicy arc;
  release(arc, {10, 11, 12});  // used once: T1
  release(arc, {20, 21, 22});
  reuse(arc, {20, 21, 22});  // reused: T2
  std::vector<BlockId> order;
  arc.oldest(0, 10, order);
  // T1 is over its target (0, nothing adapted yet): it goes first, each prefix from its tail.
  EXPECT_EQ(order, (std::vector<BlockId>{12, 11, 10, 22, 21, 20}));
  std::vector<BlockId> evicted;
  while (arc.size() > 0) evicted.push_back(evictOne(arc));
  EXPECT_EQ(evicted, order) << "oldest() is the order evictions take";
}

TEST(ArcEvictionTest, ContentEvictedLatelyComesBackAsReusedAndAdaptsTheTarget) {
  ArcEvictionPolicy arc;
  for (BlockId b = 0; b < 8; ++b) release(arc, {b});
  reuse(arc, {6, 7});  // T1: 0..5, T2: 6, 7
  EXPECT_EQ(arc.capacity(0), 8u);
  ASSERT_EQ(evictOne(arc), 0u);  // from T1: a ghost in B1
  EXPECT_EQ(arc.ghostCount(0), 1u);
  EXPECT_EQ(arc.recencyTarget(0), 0.0);
  // Block 0's content comes back into another block: T1 was too small.
  arc.insert(50, 0, false, tagOf(0));
  EXPECT_EQ(arc.ghostCount(0), 0u);
  EXPECT_GT(arc.recencyTarget(0), 0.0);
  EXPECT_EQ(arc.frequentBlocks(0), 3u) << "a ghost hit is a reuse";
  // Content evicted from T2 that comes back moves the target the other way.
  arc.erase(1);
  arc.erase(2);
  arc.erase(3);
  arc.erase(4);
  arc.erase(5);  // held: T1 has nothing to give, T2 gives its oldest
  const BlockId v = evictOne(arc);
  ASSERT_EQ(v, 7u);
  const double before = arc.recencyTarget(0);
  arc.insert(51, 0, false, tagOf(7));
  EXPECT_LT(arc.recencyTarget(0), before);
}

TEST(ArcEvictionTest, GhostsStayBoundedByTheCapacity) {
  // 200 blocks, 300,000 contents cycling through them: at most 200 ghosts, and the
  // memory they take stays flat.
  constexpr BlockId kBlocks = 200;
  ArcEvictionPolicy arc;
  uint64_t content = 0;
  std::vector<uint64_t> contentOf(kBlocks);
  for (BlockId b = 0; b < kBlocks; ++b) {
    contentOf[b] = content++;
    arc.insert(b, 0, false, tagOf(contentOf[b]));
  }
  size_t bytesAfterWarmup = 0;
  for (int i = 0; i < 300000; ++i) {
    const BlockId v = arc.victim(0);
    ASSERT_NE(v, kNoBlock);
    arc.evicted(v, tagOf(contentOf[v]));
    // Now and then an old content comes back (a ghost hit); mostly new content.
    contentOf[v] = i % 7 == 0 && content > 300 ? content - 300 : content++;
    arc.insert(v, 0, false, tagOf(contentOf[v]));
    if (i % 3 == 0) reuse(arc, {static_cast<BlockId>((i / 3) % kBlocks)});
    ASSERT_LE(arc.ghostCount(0), kBlocks);
    if (i == 50000) bytesAfterWarmup = arc.ghostBytes();
  }
  EXPECT_EQ(arc.capacity(0), kBlocks);
  EXPECT_LE(arc.ghostBytes(), bytesAfterWarmup);
  EXPECT_LE(arc.ghostBytes(), 64u * kBlocks) << "about 24 bytes a ghost, a few times that at most";
}

TEST(ArcEvictionTest, ReplicasGoFirstAndCountAsReusedWhenReadAgain) {
  ArcEvictionPolicy arc;
  release(arc, {1, 2});
  reuse(arc, {1, 2});
  arc.insert(3, 0, /*first=*/true, tagOf(3));
  arc.insert(4, 0, /*first=*/true, tagOf(4));
  EXPECT_EQ(arc.victim(0), 4u) << "the last replica in goes first, as with LRU";
  arc.erase(3);
  arc.insert(3, 0, false, tagOf(3));  // read again here
  EXPECT_EQ(arc.frequentBlocks(0), 3u);
  std::vector<BlockId> order;
  arc.oldest(0, 10, order);
  EXPECT_EQ(order, (std::vector<BlockId>{4, 2, 1, 3}));
}

TEST(ArcEvictionTest, AMovedBlockKeepsItsHistory) {
  ArcEvictionPolicy arc;
  release(arc, {1});
  reuse(arc, {1});
  release(arc, {2});
  arc.erase(1);  // pinned for the move
  arc.moved(1, 9);
  arc.insert(9, 1, false, tagOf(1));  // its new block, in another class (tier)
  EXPECT_EQ(arc.frequentBlocks(1), 1u);
  EXPECT_EQ(arc.frequentBlocks(0), 0u);
  arc.insert(1, 0, false, tagOf(77));  // block 1 holds other content now: new
  EXPECT_EQ(arc.recentBlocks(0), 2u);
}

TEST(ArcEvictionTest, NewBlocksThatContinueAReusedPrefixStartWithIt) {
  ArcEvictionPolicy arc;
  release(arc, {0, 1, 2, 3});
  reuse(arc, {0, 1, 2, 3});  // a conversation's first turn, reused by its second
  // The second turn appends 2 blocks after block 3: they continue it.
  arc.erase(0), arc.erase(1), arc.erase(2), arc.erase(3);
  const std::vector<BlockId> turn = {4, 5};
  arc.sealed(turn, /*parent=*/3, /*position=*/4);
  release(arc, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(arc.frequentBlocks(0), 6u);
  EXPECT_EQ(arc.recentBlocks(0), 0u);
  // A long document after the same prefix (more than 4 new blocks per reused one) is new
  // content: probation.
  std::vector<BlockId> doc;
  for (BlockId b = 10; b < 27; ++b) doc.push_back(b);
  arc.sealed(doc, 3, 4);
  release(arc, doc);
  EXPECT_EQ(arc.recentBlocks(0), doc.size());
  // So is a chunk whose parent this request wrote itself (never evictable yet).
  arc.sealed(std::vector<BlockId>{31}, /*parent=*/30, 1);
  release(arc, {31});
  EXPECT_EQ(arc.recentBlocks(0), doc.size() + 1);
}

// A model check: under random inserts, holds, evictions and moves, victim() is always a block
// in the order (never a held one), and oldest() lists exactly what successive evictions take,
// also with blocks about to be pinned skipped.
TEST(ArcEvictionTest, VictimsAreAlwaysEvictableAndOldestMatchesEvictions) {
  test::runCopyableModel<ArcEvictionPolicy>({.seed = 12345});
}

// The same across three size classes (tiers), content moving between them: a victim is always of
// the class asked for, and each class's oldest() is that class's evictions. LRU too.
TEST(ArcEvictionTest, EveryClassEvictsOnlyItsOwnBlocks) {
  test::runCopyableModel<ArcEvictionPolicy>({.seed = 5150, .checkSize = true, .classes = 3});
}

TEST(LruEvictionTest, EveryClassEvictsOnlyItsOwnBlocks) {
  for (uint32_t classes : {1u, 3u}) {
    test::runCopyableModel<LruEvictionPolicy>(
        {.seed = 606 + classes, .hints = false, .checkSize = true, .classes = classes});
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace kvtier
