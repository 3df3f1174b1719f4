#include "store/eviction_adaptive.h"
#include "store/eviction_model_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
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
// switches: a victim is always
// evictable, never held; oldest() lists every evictable block not skipped, victim() first; the
// size is the evictable count throughout.
TEST(AdaptiveEvictionTest, EveryLeaderAndEveryRebuildKeepsTheEvictableSet) {
  AdaptiveEvictionPolicy q(eager());
  std::set<EvictionKind> leaders;
  test::EvictionModel m;
  m.seed = 31337;
  m.steps = 40000;
  m.reuseOneIn = 3;
  m.checkSize = true;
  m.oldestEvery = 89;
  m.afterStep = [&] { leaders.insert(q.leader()); };
  test::runEvictionModel(q, m);
  EXPECT_GT(q.switches(), 10u);
  EXPECT_GE(leaders.size(), 3u) << "the run should have crossed several experts";
}

// Until a class is full (its first eviction) there is nothing to measure: 2Q leads, no shadow.
TEST(AdaptiveEvictionTest, TwoQLeadsUntilTheCacheIsFull) {
  AdaptiveEvictionPolicy q(eager());
  for (BlockId b = 0; b < 100; ++b) q.insert(b, 0, false, tagOf(b));
  for (BlockId b = 0; b < 100; ++b) q.insert(b, 0, false, tagOf(b));
  EXPECT_EQ(q.leader(), EvictionKind::kTwoQ);
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
