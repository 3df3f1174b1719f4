// Blocks fetched from another node (replicas): indexed like promoted blocks, counted apart, and
// first to go when room is needed — so that a cluster keeps one copy of a block rather than one
// per node that read it — until this node uses them again.
#include <gtest/gtest.h>

#include "store/engine.h"
#include "store/engine_test_util.h"

namespace kvtier {
namespace {

using namespace test_util;

Key128 key(uint8_t n) {
  Key128 k;
  k.bytes[0] = n;
  k.bytes[15] = 0x5a;
  return k;
}

class EngineReplicas : protected EngineHarness, public ::testing::Test {
 protected:
  void SetUp() override { makeEngine(4); }
  // A sealed block of this node's: a put of one block under client key `k`, then the sequence
  // removed (the block stays cached, evictable).
  void local(uint8_t k) {
    const std::string seq = "s" + std::to_string(k);
    ASSERT_TRUE(
        putAndCommit(space_, seq, 0, toks(layout_.blockTokens, 100u * k), {}, kOwner, {key(k)}));
    ASSERT_TRUE(engine_->remove(space_, seq, 0, kEnd).ok());
  }
  // A block fetched from another node under key `k`.
  void fetched(uint8_t k) {
    auto t = engine_->beginPromote(space_, key(k));
    ASSERT_TRUE(t.ok());
    engine_->finishPromote(*t, /*ok=*/true, /*remote=*/true);
  }
  // A lookup of key `k` that reads it and lets it go.
  void use(uint8_t k) {
    const std::vector<Key128> keys{key(k)};
    auto r = engine_->lookup(kOwner, space_, {}, keys, "", {});
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->blocks.size(), 1u);
    ASSERT_TRUE(engine_->releaseRead(r->lease).ok());
  }
  bool held(uint8_t k) { return engine_->indexed(space_, key(k)); }
};

TEST_F(EngineReplicas, AReplicaIsEvictedBeforeOlderBlocksOfThisNode) {
  local(1);
  local(2);
  fetched(3);
  use(3);  // the lookup that asked for it
  EXPECT_EQ(engine_->stats().remoteFetched, 1u);
  EXPECT_EQ(engine_->stats().promoted, 0u) << "a replica is not a cold-tier promote";
  local(4);  // the pool's last free block
  local(5);  // needs room: the replica goes, not block 1 (the least recently used of ours)
  EXPECT_FALSE(held(3));
  EXPECT_TRUE(held(1));
  EXPECT_TRUE(held(2));
}

// A fetch holds what it brought while its lookup's other pins run (LookupFor::kHold): the hold is
// no use of the block, which stays first to go once its lookup has read it.
TEST_F(EngineReplicas, AFetchsHoldLeavesAReplicaFirstToGo) {
  local(1);
  local(2);
  fetched(3);
  const std::vector<Key128> keys{key(3)};
  auto hold = engine_->lookup(kOwner, space_, {}, keys, "", {}, {}, -1, LookupFor::kHold);
  ASSERT_TRUE(hold.ok());
  ASSERT_EQ(hold->blocks.size(), 1u);
  const EngineStats before = engine_->stats();
  ASSERT_TRUE(engine_->releaseRead(hold->lease).ok());
  EXPECT_EQ(engine_->stats().hits, before.hits) << "a hold is no hit";
  use(3);    // the lookup that asked for it
  local(4);  // the pool's last free block
  local(5);  // needs room: the replica goes, not block 1 (the least recently used of ours)
  EXPECT_FALSE(held(3));
  EXPECT_TRUE(held(1));
  EXPECT_TRUE(held(2));
}

TEST_F(EngineReplicas, AReplicaUsedAgainCountsAsThisNodesOwn) {
  makeEngine(4, 0, EvictionKind::kLru);  // the order asserted is LRU's
  fetched(1);
  use(1);
  use(1);  // a later request reads it too: now it is ours, most recently used
  local(2);
  local(3);
  local(4);
  local(5);  // the least recently used goes: block 1 was used before 2, 3 and 4 were made
  EXPECT_FALSE(held(1));
  EXPECT_TRUE(held(2));
  local(6);
  EXPECT_FALSE(held(2));
}

// With ARC (the default), a replica this node read again is one of its reused blocks: it outlives
// the blocks used once since.
TEST_F(EngineReplicas, AReplicaUsedAgainIsKeptAsAReusedBlockUnderArc) {
  fetched(1);
  use(1);
  use(1);  // a later request reads it too
  local(2);
  local(3);
  local(4);
  local(5);  // needs room: the oldest block used once goes, not the replica read again
  EXPECT_TRUE(held(1));
  EXPECT_FALSE(held(2));
  EXPECT_TRUE(held(3));
  EXPECT_TRUE(held(4));
}

}  // namespace
}  // namespace kvtier
