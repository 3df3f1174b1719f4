#include "store/eviction_adaptive.h"
#include "store/eviction_model_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

namespace kvtier {
namespace {

uint64_t tagOf(uint64_t content) { return 1000 + content; }

// Shadows of every block and a leader that changes at the least lead: switches come often, so
// that a random run crosses many rebuilds.
AdaptiveEvictionPolicy::Options eager() {
  AdaptiveEvictionPolicy::Options o;
  o.shadowBlocks = 1;
  o.minRateShift = 0;
  o.maxRateShift = 0;
  o.halfLife = 0.5;
  o.switchZ = 0;
  return o;
}

// Random inserts (some after a commit's hint), uses, holds, evictions and moves across leader
// switches: a victim is always evictable, never held; oldest() lists every evictable block not
// skipped, victim() first; the size is the evictable count throughout.
void runAcrossSwitches(const AdaptiveEvictionPolicy::Options& options, uint64_t seed,
                       uint32_t classes = 1) {
  AdaptiveEvictionPolicy q(options);
  std::set<EvictionKind> leaders;
  test::EvictionModel m;
  m.seed = seed;
  m.classes = classes;
  m.steps = 40000;
  m.reuseOneIn = 3;
  m.checkSize = true;
  m.oldestEvery = 89;
  m.afterStep = [&] { leaders.insert(q.following()); };
  test::runEvictionModel(q, m);
  EXPECT_GT(q.switches(), 10u);
  EXPECT_GE(leaders.size(), 3u) << "the run should have crossed several experts";
}

TEST(AdaptiveEvictionTest, EveryLeaderAndEveryRebuildKeepsTheEvictableSet) {
  runAcrossSwitches(eager(), 31337);
}

// The same with every switch draining (no rebuild): the blocks of the orders that led before go
// first, and each joins the new leader's order when used again.
TEST(AdaptiveEvictionTest, EverySwitchThatDrainsKeepsTheEvictableSet) {
  AdaptiveEvictionPolicy::Options o = eager();
  o.rebuildBlocks = 0;
  runAcrossSwitches(o, 4242);
}

// Both across three size classes (tiers), content moving between them, each class with its own
// shadows: a victim is always of the class asked for, rebuilding or draining.
TEST(AdaptiveEvictionTest, EveryClassEvictsOnlyItsOwnBlocksAcrossSwitches) {
  runAcrossSwitches(eager(), 8086, 3);
  if (HasFatalFailure()) return;
  AdaptiveEvictionPolicy::Options o = eager();
  o.rebuildBlocks = 0;
  runAcrossSwitches(o, 6502, 3);
}

// After a switch that drains, the blocks not used since go before any block the new leader
// orders, in the old leader's order; a block used again leaves the old order for the new one.
TEST(AdaptiveEvictionTest, ASwitchThatDrainsEvictsWhatWasNotUsedSinceFirst) {
  AdaptiveEvictionPolicy::Options o = eager();
  o.rebuildBlocks = 0;
  AdaptiveEvictionPolicy q(o);
  // Working sets of 40 contents that change every 200 uses, in a cache of 48 blocks, used as the
  // engine does (a hit is a hold and a release; a miss evicts the victim for it): recency wins
  // what 2Q's probation loses, and the leader changes.
  constexpr BlockId kBlocks = 48;
  std::vector<uint64_t> held(kBlocks, 0);  // block -> content (0: free)
  std::map<uint64_t, BlockId> where;       // content -> block
  BlockId fresh = 0;
  for (uint64_t n = 0; q.switches() == 0; ++n) {
    ASSERT_LT(n, 100000u) << "no switch";
    const uint64_t c = 1 + n / 200 * 40 + n % 40;
    if (auto it = where.find(c); it != where.end()) {
      q.erase(it->second);
      q.insert(it->second, 0, false, tagOf(c));
      continue;
    }
    BlockId b = fresh;
    if (fresh < kBlocks) {
      ++fresh;
    } else {
      b = q.victim(0);
      ASSERT_NE(b, kNoBlock);
      q.evicted(b, tagOf(held[b]));
      where.erase(held[b]);
    }
    held[b] = c;
    where[c] = b;
    q.insert(b, 0, false, tagOf(c));
  }
  std::vector<BlockId> before;
  q.oldest(0, kBlocks, before);
  ASSERT_EQ(before.size(), kBlocks);
  // Use the first half again: they leave the old order; the rest go first, in that order.
  for (size_t i = 0; i < kBlocks / 2; ++i) {
    q.erase(before[i]);
    q.insert(before[i], 0, false, tagOf(held[before[i]]));
  }
  std::vector<BlockId> after;
  q.oldest(0, kBlocks, after);
  ASSERT_EQ(after.size(), kBlocks);
  EXPECT_TRUE(std::equal(before.begin() + kBlocks / 2, before.end(), after.begin()))
      << "the blocks not used since the switch go first, in the old order";
  EXPECT_EQ(q.victim(0), before[kBlocks / 2]);
  EXPECT_EQ(q.size(), kBlocks);
}

// Until a class is full (its first eviction) there is nothing to measure: 2Q leads, no shadow.
TEST(AdaptiveEvictionTest, TwoQLeadsUntilTheCacheIsFull) {
  AdaptiveEvictionPolicy q(eager());
  for (BlockId b = 0; b < 100; ++b) q.insert(b, 0, false, tagOf(b));
  for (BlockId b = 0; b < 100; ++b) q.insert(b, 0, false, tagOf(b));
  EXPECT_EQ(q.following(), EvictionKind::kTwoQ);
  EXPECT_EQ(q.switches(), 0u);
  for (double s : q.scores()) EXPECT_EQ(s, 0);
}

TEST(AdaptiveEvictionTest, ParsesAndNamesItsKind) {
  auto k = parseEvictionKind("adaptive");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, EvictionKind::kAdaptive);
  EXPECT_STREQ(evictionName(EvictionKind::kAdaptive), "adaptive");
  EXPECT_NE(
      dynamic_cast<AdaptiveEvictionPolicy*>(makeEvictionPolicy(EvictionKind::kAdaptive).get()),
      nullptr);
}

}  // namespace
}  // namespace kvtier
