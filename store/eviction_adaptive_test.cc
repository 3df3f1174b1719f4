#include "store/eviction_adaptive.h"

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
  uint64_t rng = 31337;
  auto next = [&rng](uint64_t n) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (rng >> 33) % n;
  };
  constexpr BlockId kIds = 48;
  AdaptiveEvictionPolicy q(eager());
  enum { kAbsent, kIn, kHeld };
  std::vector<int> where(kIds, kAbsent);
  std::vector<uint64_t> content(kIds, 0);
  uint64_t nextContent = 1;
  std::set<EvictionKind> leaders;
  for (int step = 0; step < 40000; ++step) {
    const BlockId id = static_cast<BlockId>(next(kIds));
    const uint64_t op = next(10);
    if (op < 4) {
      if (where[id] == kAbsent) content[id] = next(3) == 0 ? next(nextContent) : nextContent++;
      if (op == 0 && where[id] == kAbsent) {
        q.sealed(std::vector<BlockId>{id}, static_cast<BlockId>(next(kIds)), next(3));
      }
      q.insert(id, 0, next(20) == 0, tagOf(content[id]));
      where[id] = kIn;
    } else if (op < 6) {
      q.erase(id);
      if (where[id] == kIn) where[id] = kHeld;
    } else if (op < 9) {
      const BlockId v = q.victim(0);
      const bool any = std::count(where.begin(), where.end(), kIn) > 0;
      ASSERT_EQ(v != kNoBlock, any) << "step " << step;
      if (v == kNoBlock) continue;
      ASSERT_EQ(where[v], kIn) << "victim " << v << " is not evictable, step " << step
                               << ", leader " << evictionName(q.leader());
      q.evicted(v, tagOf(content[v]));
      where[v] = kAbsent;
    } else if (where[id] == kHeld) {
      BlockId to = kNoBlock;
      for (BlockId b = 0; b < kIds; ++b) {
        if (where[b] == kAbsent) to = b;
      }
      if (to == kNoBlock) continue;
      q.moved(id, to);
      content[to] = content[id];
      where[id] = kAbsent;
      q.insert(to, 0, false, tagOf(content[to]));
      where[to] = kIn;
    }
    leaders.insert(q.leader());
    ASSERT_EQ(q.size(), static_cast<size_t>(std::count(where.begin(), where.end(), kIn)))
        << "step " << step << ", leader " << evictionName(q.leader());
    if (step % 89 == 0) {
      std::vector<BlockId> skip;
      for (BlockId b = 0; b < kIds; ++b) {
        if (where[b] == kIn && next(4) == 0) skip.push_back(b);
      }
      std::vector<BlockId> listed;
      q.oldest(0, kIds, listed, skip);
      std::vector<BlockId> expected;
      for (BlockId b = 0; b < kIds; ++b) {
        if (where[b] == kIn && !std::binary_search(skip.begin(), skip.end(), b)) {
          expected.push_back(b);
        }
      }
      std::vector<BlockId> sorted = listed;
      std::sort(sorted.begin(), sorted.end());
      ASSERT_EQ(sorted, expected) << "step " << step << ", leader " << evictionName(q.leader());
      if (skip.empty() && !listed.empty()) {
        EXPECT_EQ(q.victim(0), listed.front());
      }
    }
  }
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
