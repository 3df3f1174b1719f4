#include "store/eviction.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kvtier
