#include "store/eviction_fifo.h"
#include "store/eviction_model_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

namespace kvtier {
namespace {

// A tag per content; block ids are where content lives now.
uint64_t tagOf(uint64_t content) { return 1000 + content; }

// A request's blocks released as the engine releases them: last block first.
void release(EvictionPolicy& p, const std::vector<BlockId>& blocks) {
  for (size_t i = blocks.size(); i-- > 0;) p.insert(blocks[i], 0, false, tagOf(blocks[i]));
}
// A request that reuses `blocks`: held (erased) while it runs, released tail first.
void reuse(EvictionPolicy& p, const std::vector<BlockId>& blocks) {
  for (BlockId b : blocks) p.erase(b);
  release(p, blocks);
}
// Evicts `n` victims of class 0 as the engine does; returns them.
std::vector<BlockId> evict(EvictionPolicy& p, size_t n) {
  std::vector<BlockId> out;
  for (size_t i = 0; i < n; ++i) {
    const BlockId v = p.victim(0);
    if (v == kNoBlock) break;
    p.evicted(v, tagOf(v));
    out.push_back(v);
  }
  return out;
}
std::vector<BlockId> range(BlockId from, BlockId to) {
  std::vector<BlockId> out;
  for (BlockId b = from; b < to; ++b) out.push_back(b);
  return out;
}

TEST(SieveEvictionTest, AUseMarksABlockWhereItStandsAndTheHandSparesItOnce) {
  SieveEvictionPolicy p;
  release(p, {0});
  release(p, {1});
  release(p, {2});
  reuse(p, {0});  // held and released: marked, not moved
  // The hand starts at the oldest block: 0 is spared (its mark cleared), 1 goes, then 2, then 0.
  EXPECT_EQ(evict(p, 3), (std::vector<BlockId>{1, 2, 0}));
}

TEST(SieveEvictionTest, TheHandGoesOnFromWhereItStoppedAndWraps) {
  SieveEvictionPolicy p;
  for (BlockId b = 0; b < 4; ++b) release(p, {b});
  reuse(p, {0});
  reuse(p, {2});
  EXPECT_EQ(evict(p, 1), (std::vector<BlockId>{1}));  // 0 spared, the hand stops after 1
  release(p, {4});                                    // newest
  reuse(p, {0});                                      // marked again behind the hand
  // The hand: 2 (spared), 3, 4, then round to 0 (marked again: spared), 2 (cleared before).
  EXPECT_EQ(evict(p, 3), (std::vector<BlockId>{3, 4, 2}));
  EXPECT_EQ(evict(p, 1), (std::vector<BlockId>{0}));
}

TEST(S3FifoEvictionTest, AOneTimeScanOnlyPassesThroughTheSmallQueue) {
  S3FifoEvictionPolicy p;
  // A system prompt of 20 blocks, reused twice: its blocks move to M when S gives them up.
  const std::vector<BlockId> prompt = range(0, 20);
  release(p, prompt);
  reuse(p, prompt);
  reuse(p, prompt);
  // A scan of 1,000 one-time blocks through a cache of 100: each evicted as soon as the next
  // arrives (the prompt's blocks were moved to M on the way).
  BlockId next = 20;
  for (int i = 0; i < 1000; ++i) {
    release(p, {next++});
    if (p.size() > 100) {
      const std::vector<BlockId> gone = evict(p, 1);
      ASSERT_EQ(gone.size(), 1u);
      ASSERT_GE(gone[0], 20u) << "the reused prompt lost block " << gone[0];
    }
  }
  EXPECT_EQ(p.mainBlocks(0), prompt.size());
  EXPECT_GT(p.ghostCount(0), 0u);
  EXPECT_LE(p.ghostCount(0), p.mainBlocks(0)) << "ghosts: at most what M holds";
}

TEST(S3FifoEvictionTest, ContentTheSmallQueueEvictedComesBackIntoTheMainQueue) {
  S3FifoEvictionPolicy p;
  for (BlockId b = 0; b < 20; ++b) release(p, {b});
  reuse(p, range(0, 10));  // used: to M when S lets them go
  // Evictions: S is over its tenth, so 0..9 go to M on the way and 10.. are evicted to G.
  EXPECT_EQ(evict(p, 3), (std::vector<BlockId>{10, 11, 12}));
  EXPECT_EQ(p.mainBlocks(0), 10u);
  // Content 10 comes back in another block: found in G, it enters M.
  p.insert(50, 0, false, tagOf(10));
  EXPECT_EQ(p.mainBlocks(0), 11u);
  EXPECT_EQ(p.ghostCount(0), 2u);
}

// The two policies, beside each other.
class FifoFamilyTest : public ::testing::TestWithParam<EvictionKind> {
 protected:
  std::unique_ptr<EvictionPolicy> make() const { return makeEvictionPolicy(GetParam()); }
};

TEST_P(FifoFamilyTest, APrefixReleasedTogetherGoesTailFirst) {
  auto p = make();
  release(*p, {0, 1, 2, 3});
  EXPECT_EQ(evict(*p, 4), (std::vector<BlockId>{3, 2, 1, 0}));
}

TEST_P(FifoFamilyTest, AHeldBlockIsNeverAVictimAndKeepsItsPlace) {
  auto p = make();
  release(*p, {0});
  release(*p, {1});
  p->erase(0);
  EXPECT_EQ(p->size(), 1u);
  EXPECT_EQ(p->victim(0), 1u);
  p->erase(1);
  EXPECT_EQ(p->victim(0), kNoBlock) << "everything is held";
  std::vector<BlockId> none;
  p->oldest(0, 10, none);
  EXPECT_TRUE(none.empty());
  p->insert(1, 0, false, tagOf(1));
  EXPECT_EQ(evict(*p, 2), (std::vector<BlockId>{1}));
}

TEST_P(FifoFamilyTest, ReplicasGoFirstAndJoinTheMainQueueWhenReadAgain) {
  auto p = make();
  release(*p, {0, 1});
  p->insert(5, 0, /*first=*/true, tagOf(5));
  p->insert(6, 0, /*first=*/true, tagOf(6));
  EXPECT_EQ(p->victim(0), 6u) << "the last replica in goes first";
  p->erase(6);
  p->insert(6, 0, false, tagOf(6));  // read again here
  EXPECT_EQ(evict(*p, 1), (std::vector<BlockId>{5}));
  EXPECT_NE(p->victim(0), 6u);
}

TEST_P(FifoFamilyTest, AMovedBlockKeepsItsHistory) {
  auto p = make();
  release(*p, {0});
  release(*p, {1});
  reuse(*p, {0});
  p->erase(0);
  p->moved(0, 7);  // its content now in block 7 (another tier)
  p->insert(7, 0, false, tagOf(0));
  EXPECT_EQ(p->size(), 2u);
  // Used before the move: 1 goes first.
  EXPECT_EQ(evict(*p, 1), (std::vector<BlockId>{1}));
}

// Random inserts, uses, holds, evictions and moves against a model of what is evictable: a
// victim is always evictable, never held; oldest() (with blocks to skip) lists exactly what
// successive evictions take.
TEST_P(FifoFamilyTest, VictimsAreAlwaysEvictableAndOldestMatchesEvictions) {
  // The last run across three size classes (tiers), content moving between them: a victim is
  // always of the class asked for, and each class's oldest() is that class's evictions.
  for (uint64_t seed : {777u, 4242u, 99u}) {
    auto q = make();
    test::EvictionModel m;
    m.seed = seed;
    m.classes = seed == 99u ? 3 : 1;
    m.hints = false;
    m.checkSize = true;
    m.copy = GetParam() == EvictionKind::kSieve ? test::copyOf<SieveEvictionPolicy>
                                                : test::copyOf<S3FifoEvictionPolicy>;
    test::runEvictionModel(*q, m);
    if (HasFatalFailure()) return;
  }
}

TEST_P(FifoFamilyTest, ParsesAndNamesItsKind) {
  const char* name = evictionName(GetParam());
  auto k = parseEvictionKind(name);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, GetParam());
  EXPECT_FALSE(parseEvictionKind("S3FIFO").ok());
  auto bad = parseEvictionKind("fifo");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("sieve or adaptive"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Policies, FifoFamilyTest,
                         ::testing::Values(EvictionKind::kSieve, EvictionKind::kS3Fifo),
                         [](const auto& info) {
                           return std::string(info.param == EvictionKind::kSieve ? "Sieve"
                                                                                 : "S3Fifo");
                         });

}  // namespace
}  // namespace kvtier
