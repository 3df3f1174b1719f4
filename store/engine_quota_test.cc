// Tenant quotas (docs/security.md): a tenant (one salt) whose allocation would take it beyond its
// quota evicts only its own cached blocks, and gets FULL, with nothing changed, when it has too
// few; within its quota it evicts any cached block as without a quota; what it is charged goes
// back to 0 once its blocks are gone.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "store/engine.h"
#include "store/engine_test_util.h"

namespace kvtier {
namespace {

using namespace test_util;

constexpr uint32_t kBt = kTestBlockTokens;

std::vector<uint32_t> request(size_t n, uint32_t first) { return toks(n * kBt, first); }

class EngineQuota : protected EngineHarness, public ::testing::Test {
 protected:
  // An engine of `blocks` blocks, tenant A (space_) and tenant B (spaceB_), each tenant allowed
  // `quotaBlocks` blocks.
  void make(uint64_t blocks, uint64_t quotaBlocks, uint64_t blobBytes = 0) {
    makeEngine(blocks, blobBytes);
    auto b = engine_->openSpace(layout_, saltB_);
    ASSERT_TRUE(b.ok()) << b.error();
    spaceB_ = *b;
    ASSERT_NE(engine_->space(space_).tenant, engine_->space(spaceB_).tenant);
    engine_->setTenantQuota(quotaBlocks * layout_.blockBytes());
  }
  void cacheIn(SpaceId sp, const std::string& seq, const std::vector<uint32_t>& tokens) {
    cacheTagged(*engine_, *mem_, sp, seq, tokens, 0);
  }
  // Blocks charged to a tenant.
  uint64_t blocksOf(const Salt& salt) const {
    return engine_->tenantBytesUsed(salt) / layout_.blockBytes();
  }

  const Salt saltA_ = saltFor("tenant-a");  // EngineHarness's space_
  const Salt saltB_ = saltFor("tenant-b");
  SpaceId spaceB_ = 0;
};

TEST_F(EngineQuota, OverQuotaPutEvictsOwnBlocksOnly) {
  make(8, 4);
  const auto a = request(3, 1000);
  cacheIn(space_, "a", a);
  cacheIn(spaceB_, "b", request(4, 2000));  // B at its quota; one block of the pool free
  ASSERT_EQ(blocksOf(saltB_), 4u);
  // B floods: every put takes B beyond its quota, so it replaces its own cached blocks, never A's
  // (older in the eviction order, hence first to go without a quota), nor the free block.
  for (uint32_t i = 0; i < 10; ++i) {
    cacheIn(spaceB_, "flood" + std::to_string(i), request(1 + i % 3, 3000 + 100 * i));
    EXPECT_EQ(matched(a), a.size()) << "B's put " << i << " evicted A's blocks";
    EXPECT_LE(blocksOf(saltB_), 4u) << "B went beyond its quota at put " << i;
    EXPECT_EQ(used(), 7u) << "B took the free block beyond its quota at put " << i;
  }
  EXPECT_EQ(blocksOf(saltA_), 3u);
  EXPECT_GT(engine_->stats().evictions, 0u);
}

TEST_F(EngineQuota, AtQuotaWithoutOwnCachedBlocksIsFullAndChangesNothing) {
  make(8, 4);
  const auto a = request(3, 1000);
  cacheIn(space_, "a", a);
  const auto held = request(4, 2000);
  ASSERT_TRUE(putAndCommit(spaceB_, "held", 0, held, {}, kOwner));  // held, not cached
  const EngineStats before = engine_->stats();

  auto g = engine_->put(kOwner, spaceB_, "more", 0, request(1, 5000), {}, {});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.code(), ErrorCode::kFull);
  EXPECT_NE(g.error().message().find("quota"), std::string::npos) << g.error();

  const EngineStats after = engine_->stats();
  EXPECT_EQ(after.blocksUsed, before.blocksUsed);
  EXPECT_EQ(after.evictions, before.evictions);
  EXPECT_EQ(after.writeLeases, before.writeLeases);
  EXPECT_EQ(matched(a), a.size());
  EXPECT_EQ(lenIn(spaceB_, "held"), held.size());
  EXPECT_EQ(lenIn(spaceB_, "more"), std::nullopt);
  EXPECT_EQ(blocksOf(saltB_), 4u);
  EXPECT_EQ(readRangeIn(spaceB_, "held", 0, kEnd), tagsOf(held));
  // Blobs are charged alike: a checkpoint would take B beyond its quota too.
  auto c = engine_->putCheckpoint(spaceB_, "held", held.size(), 64);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.code(), ErrorCode::kFull);
  EXPECT_EQ(engine_->stats().blocksUsed, before.blocksUsed);
}

TEST_F(EngineQuota, UnderQuotaEvictsOthersBlocksAsBefore) {
  make(8, 6);
  const auto a = request(6, 1000);
  cacheIn(space_, "a", a);  // A at its quota, the pool 2 blocks short of full
  // B is far within its quota: its put evicts whatever the eviction order gives (A's, the only
  // cached blocks), as without a quota: A's prefix loses its tail.
  cacheIn(spaceB_, "b", request(4, 2000));
  EXPECT_EQ(engine_->stats().evictions, 2u);
  EXPECT_EQ(matched(a), 4u * kBt);
  EXPECT_EQ(blocksOf(saltA_), 4u);
  EXPECT_EQ(blocksOf(saltB_), 4u);
}

TEST_F(EngineQuota, CrossingTheQuotaEvictsOwnBlocksForThePartBeyondIt) {
  make(8, 5);
  const auto a = request(4, 1000);
  cacheIn(space_, "a", a);
  cacheIn(spaceB_, "b", request(4, 2000));  // the pool is full; B one block within its quota
  // Two blocks for B: one within its quota (any cached block: the order's first is A's), one
  // beyond it (B's own).
  cacheIn(spaceB_, "c", request(2, 3000));
  EXPECT_EQ(engine_->stats().evictions, 2u);
  EXPECT_EQ(blocksOf(saltB_), 5u);
  EXPECT_EQ(blocksOf(saltA_), 3u);
  EXPECT_EQ(matched(a), 3u * kBt);
}

TEST_F(EngineQuota, AccountingReturnsToZeroWhenEverythingIsFreed) {
  make(16, 16, /*blobBytes=*/8192);
  const uint64_t bb = layout_.blockBytes();
  // A sequence of two full blocks and a partial one, a checkpoint, a snapshot, a read lease and an
  // aborted write: all charged while they hold blocks.
  const auto tokens = toks(2 * kBt + 5, 1);
  ASSERT_TRUE(putAndCommit(space_, "s", 0, tokens, {}, kOwner));
  EXPECT_EQ(engine_->tenantBytesUsed(saltA_), 3 * bb);
  EXPECT_EQ(engine_->tenantBytesUsed(saltB_), 0u);
  auto cp = engine_->putCheckpoint(space_, "s", tokens.size(), 100);
  ASSERT_TRUE(cp.ok()) << cp.error();
  ASSERT_TRUE(engine_->commit(cp->lease, kEnd).ok());
  EXPECT_GT(engine_->tenantBytesUsed(saltA_), 3 * bb);
  auto snap = engine_->snapshot(space_, "s", 0);
  ASSERT_TRUE(snap.ok()) << snap.error();
  auto read = engine_->get(space_, "s", 0, kEnd);
  ASSERT_TRUE(read.ok()) << read.error();
  const uint64_t beforeWrite = engine_->tenantBytesUsed(saltA_);
  auto w = engine_->put(kOwner, space_, "w", 0, request(2, 500), {}, {});
  ASSERT_TRUE(w.ok()) << w.error();
  EXPECT_EQ(engine_->tenantBytesUsed(saltA_), beforeWrite + 2 * bb);
  ASSERT_TRUE(engine_->abortWrite(w->lease).ok());
  ASSERT_TRUE(engine_->releaseRead(read->lease).ok());

  auto keys = engine_->sequenceKeys(space_, "s", 0, kEnd, false);
  ASSERT_TRUE(keys.ok()) << keys.error();
  ASSERT_EQ(keys->size(), 2u);
  ASSERT_TRUE(engine_->dropSnapshot(space_, snap->id).ok());
  ASSERT_TRUE(engine_->truncate(space_, "s", 0).ok());
  // What is left is cached (the sealed blocks): charged until it leaves memory.
  const EngineStats cached = engine_->stats();
  ASSERT_EQ(cached.tenants.size(), 2u);
  EXPECT_EQ(cached.tenants[0].salt, saltA_);
  EXPECT_EQ(cached.tenants[0].bytesUsed, 2 * bb);
  EXPECT_EQ(cached.tenants[0].blocksCached, 2u);
  EXPECT_EQ(cached.tenantQuotaBytes, 16 * bb);
  EXPECT_EQ(engine_->dropCached(space_, *keys), 2u);
  EXPECT_EQ(engine_->tenantBytesUsed(saltA_), 0u);
  EXPECT_EQ(engine_->stats().tenants[0].blocksCached, 0u);
  EXPECT_EQ(engine_->stats().tenants[0].bytesUsed, 0u);
  EXPECT_EQ(engine_->stats().tenants[1].bytesUsed, 0u);
}

}  // namespace
}  // namespace kvtier
