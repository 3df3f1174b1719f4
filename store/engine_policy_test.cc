// What the cache keeps (docs/cache-policy.md): a cold-tier promote never evicts the prefix it
// promotes for, a put reuses the cached blocks of the keys it completes instead of allocating
// (and evicting) for them, a FULL put evicts nothing, and a released prefix is evicted from its
// tail, so what stays is always a prefix a lookup can reach.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "store/engine.h"
#include "store/engine_test_util.h"

namespace kvtier {
namespace {

using namespace test_util;

constexpr uint32_t kBt = kTestBlockTokens;

// The cold tier as the engine sees it: the records written by spills, by key.
class FakeColdTier final : public ColdDirectory {
 public:
  bool contains(uint64_t, const Salt&, const Key128& key) const override {
    return records.count(key) != 0;
  }
  std::unordered_map<Key128, std::vector<uint8_t>> records;
};

class EnginePolicy : protected EngineHarness, public ::testing::Test {
 protected:
  // Puts `tokens` (tag = token) as a sequence and removes it: only the cache holds its blocks.
  void cache(const std::string& seq, const std::vector<uint32_t>& tokens) {
    cacheTagged(*engine_, *mem_, space_, seq, tokens, 0);
  }
  void cacheKeyed(const std::string& seq, const std::vector<uint32_t>& tokens,
                  const std::vector<Key128>& keys) {
    ASSERT_TRUE(putAndCommit(space_, seq, 0, tokens, {}, kOwner, keys));
    ASSERT_TRUE(engine_->remove(space_, seq, 0, kEnd).ok());
  }
  // Blocks of a lookup of client keys (its read lease released again).
  size_t matchedKeys(const std::vector<Key128>& keys) {
    auto r = engine_->lookup(kOwner, space_, {}, keys, "", {});
    EXPECT_TRUE(r.ok()) << r.error();
    if (!r.ok()) return 0;
    if (r->lease != 0) {
      EXPECT_TRUE(engine_->releaseRead(r->lease).ok());
    }
    return r->blocks.size();
  }

  void useColdTier() { engine_->setColdDirectory(&cold_); }
  // Writes every block waiting for the cold tier, as the daemon's spiller does.
  void spillAll() {
    auto items = engine_->takeSpillBatch(1000);
    for (const SpillItem& item : items) {
      const uint8_t* bytes = at(item.location);
      cold_.records[item.key].assign(bytes, bytes + item.location.bytes);
    }
    engine_->finishSpill(items, /*written=*/true);
  }
  // A lookup as the daemon answers one with the cold tier on (server.cc, ColdService::promote):
  // plan, start a promote of every cold block of the plan, read the records, finish them, then
  // answer. Returns the blocks the answer matched, every tag checked; `cold`: how many of the
  // planned blocks were on disk only.
  size_t lookupThroughColdTier(const std::vector<uint32_t>& tokens, size_t* cold = nullptr) {
    auto plan = engine_->lookupPlan(space_, tokens, {});
    EXPECT_TRUE(plan.ok()) << plan.error();
    if (!plan.ok()) return 0;
    if (cold) *cold = 0;
    std::vector<PromoteTicket> tickets;
    for (const auto& step : *plan) {
      if (step.hot) continue;
      if (cold) ++*cold;
      auto t = engine_->beginPromote(space_, step.key);
      EXPECT_TRUE(t.ok()) << t.error();
      if (t.ok()) tickets.push_back(*t);
    }
    for (const PromoteTicket& t : tickets) {
      if (t.block == kNoBlock) continue;
      const auto& record = cold_.records.at(t.key);
      std::memcpy(at(t.location), record.data(), record.size());
      engine_->finishPromote(t, /*ok=*/true);
    }
    return lookupExtents(*engine_, *mem_, space_, tokens).size();
  }

  FakeColdTier cold_;
};

// The blocks of a request of `n` blocks starting with token `first`.
std::vector<uint32_t> request(size_t n, uint32_t first) { return toks(n * kBt, first); }

// ---------------------------------------------------------------------------------------------
// Defect 1: a lookup that promotes from the cold tier must not evict the in-memory part of the
// prefix it is promoting for.

TEST_F(EnginePolicy, ColdPromoteKeepsThePlannedPrefixInMemory) {
  makeEngine(8);
  useColdTier();
  const auto a = request(4, 1000), b = request(4, 2000), c = request(1, 3000);
  cache("a", a);
  cache("b", b);
  spillAll();
  cache("c", c);  // the pool is full: one block of A goes (it is on disk)
  // One block of A is cold, three are in memory; B's blocks are older than those three once the
  // lookup is under way, so the promote's allocation must take one of B's, never A's.
  size_t cold = 0;
  EXPECT_EQ(lookupThroughColdTier(a, &cold), 4u)
      << "the promote evicted part of the prefix it served";
  EXPECT_EQ(cold, 1u);
  EXPECT_EQ(engine_->stats().promoted, 1u);
  EXPECT_EQ(matched(c), c.size()) << "the newest block is not the one to go";
}

// The cold tier keeps what memory dropped last: every block evicted with a disk record is
// reported, in eviction order, once; one evicted before it reached the disk (the spill lagging,
// the disk failing) has no record to report.
TEST_F(EnginePolicy, EvictedBlocksWithADiskRecordAreReportedToTheColdTier) {
  makeEngine(8, 0, EvictionKind::kArc);  // ARC's order: A's blocks are the oldest used
  useColdTier();
  const auto a = request(4, 1000), b = request(4, 2000);
  cache("a", a);
  cache("b", b);
  spillAll();
  EXPECT_TRUE(engine_->takeLeftMemory().empty()) << "nothing left memory yet";
  cache("c", request(2, 3000));  // the pool is full: A's two oldest-used blocks go
  const auto aKeys = engine_->chainKeys(space_, a, {}).value();
  auto left = engine_->takeLeftMemory();
  ASSERT_EQ(left.size(), 2u);
  for (const LeftMemory& item : left) {
    EXPECT_NE(std::find(aKeys.begin(), aKeys.end(), item.key), aKeys.end());
    EXPECT_EQ(item.fingerprint, engine_->space(space_).fingerprint);
  }
  EXPECT_TRUE(engine_->takeLeftMemory().empty()) << "reported once";
  // Blocks of C are not on disk yet: with the spill paused, their eviction reports nothing.
  engine_->setSpillPaused(true);
  cache("d", request(8, 4000));
  for (const LeftMemory& item : engine_->takeLeftMemory()) {
    const auto cKeys = engine_->chainKeys(space_, request(2, 3000), {}).value();
    EXPECT_EQ(std::find(cKeys.begin(), cKeys.end(), item.key), cKeys.end());
  }
}

// ---------------------------------------------------------------------------------------------
// Defect 2: a put from position 0 of a whole request reuses the cached blocks of the keys the
// cache holds; it allocates (and evicts) only for the blocks it lacks.

// The put needs a fresh block for what the cache lacks, and while its lease is open one scratch
// block per size class takes what the client writes for the reused blocks.
TEST_F(EnginePolicy, WholePutReusesCachedBlocksInsteadOfEvicting) {
  makeEngine(9);
  const auto x = request(4, 1000), y = request(3, 2000);
  cache("x", x);
  cache("y", y);                            // 7 of 9 blocks used
  const auto r = cat(y, request(1, 3000));  // y's three blocks and one new block
  ASSERT_TRUE(putAndCommit(space_, "r", 0, r, {}, kOwner));
  EXPECT_EQ(engine_->stats().evictions, 0u) << "one block was missing and two were free";
  EXPECT_EQ(matched(x), x.size()) << "the put evicted a prefix it did not need to";
  EXPECT_EQ(readRange("r", 0, r.size()), tagsOf(r));
  EXPECT_EQ(matched(r), r.size());
  EXPECT_EQ(used(), 8u) << "r shares y's blocks; the scratch block is free again";
}

TEST_F(EnginePolicy, WholePutWithClientKeysReusesCachedBlocks) {
  makeEngine(9);
  std::vector<Key128> xk, rk;
  for (uint8_t i = 0; i < 4; ++i) xk.push_back(keyOf(10 + i));
  for (uint8_t i = 0; i < 4; ++i) rk.push_back(keyOf(20 + i));
  const auto x = request(4, 1000), r = request(4, 2000);
  cacheKeyed("x", x, xk);
  cacheKeyed("y", head(r, 3 * kBt), {rk.begin(), rk.begin() + 3});
  ASSERT_TRUE(putAndCommit(space_, "r", 0, r, {}, kOwner, rk));
  EXPECT_EQ(engine_->stats().evictions, 0u);
  EXPECT_EQ(matchedKeys(xk), 4u) << "the put evicted a prefix it did not need to";
  EXPECT_EQ(matchedKeys(rk), 4u);
  EXPECT_EQ(readRange("r", 0, r.size()), tagsOf(r));
}

// What the client writes for a block the cache already holds never reaches the cached block: a
// reader of it sees the same bytes before, during and after the put.
TEST_F(EnginePolicy, AReusedBlockNeverChangesUnderAReader) {
  makeEngine(8);
  const auto y = request(3, 2000);
  cache("y", y);
  auto held = engine_->lookup(kOwner, space_, y, {}, "", {});
  ASSERT_TRUE(held.ok());
  ASSERT_EQ(held->blocks.size(), 3u);
  const auto r = cat(y, request(1, 3000));
  auto g = engine_->put(kOwner, space_, "r", 0, r, {}, {});
  ASSERT_TRUE(g.ok()) << g.error();
  std::vector<uint32_t> other(r.size());
  for (size_t i = 0; i < r.size(); ++i) other[i] = r[i] + 500000;  // recomputed, not identical
  fill(*g, 0, other);
  // Inline writes (the daemon's write call) land where the grant says, not in the cached block.
  for (uint32_t b = 0; b < held->blocks.size(); ++b) {
    auto inlineDest = engine_->leaseBlockData(g->lease, b);
    ASSERT_TRUE(inlineDest.ok());
    EXPECT_EQ(*inlineDest, at(g->blocks[b]));
    EXPECT_NE(*inlineDest, at(held->blocks[b]));
  }
  for (size_t b = 0; b < held->blocks.size(); ++b) {
    for (uint32_t s = 0; s < kBt; ++s) {
      ASSERT_EQ(readTag(layout_, at(held->blocks[b]), s), y[b * kBt + s]) << "block " << b;
    }
  }
  ASSERT_TRUE(engine_->commit(g->lease, kEnd).ok());
  ASSERT_TRUE(engine_->releaseRead(held->lease).ok());
  // The sequence holds the cache's blocks for what the cache had, its own bytes for the rest.
  EXPECT_EQ(readRange("r", 0, y.size()), tagsOf(y));
  EXPECT_EQ(readRange("r", y.size(), r.size()), tagsOf({other.begin() + y.size(), other.end()}));
}

// An append whose first block is the sequence's partial one reuses the cached blocks after it.
TEST_F(EnginePolicy, AnAppendReusesTheCachedBlocksItCompletes) {
  makeEngine(8);
  const auto y = request(3, 2000);
  cache("y", y);
  ASSERT_TRUE(putAndCommit(space_, "r", 0, head(y, 8), {}, kOwner));
  const uint64_t before = used();  // y's three blocks and r's partial one
  const auto rest = std::vector<uint32_t>(y.begin() + 8, y.end());
  auto g = engine_->put(kOwner, space_, "r", 8, rest, {}, {});
  ASSERT_TRUE(g.ok()) << g.error();
  EXPECT_EQ(used(), before + 1) << "only the scratch block: r's block 0 is appended in place";
  fill(*g, 8, rest);
  auto c = engine_->commit(g->lease, kEnd);
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c->sealedBlocks, 3u);
  EXPECT_EQ(used(), 3u) << "r's block 0 is y's again (seal), blocks 1 and 2 were reused";
  EXPECT_EQ(readRange("r", 0, y.size()), tagsOf(y));
  EXPECT_EQ(matched(y), y.size());
}

TEST_F(EnginePolicy, AnAbortedPutThatReusedBlocksLeavesTheCacheAsItWas) {
  makeEngine(8);
  const auto y = request(3, 2000);
  cache("y", y);
  const uint64_t before = used();
  auto g = engine_->put(kOwner, space_, "r", 0, cat(y, request(1, 3000)), {}, {});
  ASSERT_TRUE(g.ok()) << g.error();
  ASSERT_TRUE(engine_->abortWrite(g->lease).ok());
  EXPECT_EQ(used(), before);
  EXPECT_EQ(engine_->stats().blocksPinned, 0u);
  EXPECT_EQ(engine_->stats().blocksCached, 3u);
  EXPECT_EQ(matched(y), y.size());
  EXPECT_EQ(len("r"), std::nullopt);
}

TEST_F(EnginePolicy, ACommitEndingInsideAReusedBlockKeepsTheCachedBytes) {
  makeEngine(8);
  const auto y = request(3, 2000);
  cache("y", y);
  const auto r = cat(y, request(1, 3000));
  auto g = engine_->put(kOwner, space_, "r", 0, r, {}, {});
  ASSERT_TRUE(g.ok()) << g.error();
  fill(*g, 0, r);
  const uint64_t upTo = 2 * kBt + 5;  // inside y's third block
  auto c = engine_->commit(g->lease, upTo);
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c->length, upTo);
  EXPECT_EQ(readRange("r", 0, upTo), tagsOf(head(r, upTo)));
  // Appending continues the sequence without touching the cached block.
  ASSERT_TRUE(putAndCommit(space_, "r", upTo, toks(4, 9000), {}, kOwner));
  EXPECT_EQ(readRange("r", upTo, upTo + 4), tagsOf(toks(4, 9000)));
  EXPECT_EQ(matched(y), y.size());
  EXPECT_EQ(lookupExtents(*engine_, *mem_, space_, y).size(), 3u);
}

// ---------------------------------------------------------------------------------------------
// Defect 3: a put that fails with FULL changed nothing: it evicted nothing on the way.

TEST_F(EnginePolicy, AFullPutEvictsNothing) {
  makeEngine(8);
  const auto x = request(4, 1000), y = request(3, 2000);
  cache("x", x);
  cache("y", y);
  auto g = engine_->put(kOwner, space_, "big", 0, request(9, 5000), {}, {});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.code(), ErrorCode::kFull);
  EXPECT_EQ(engine_->stats().evictions, 0u);
  EXPECT_EQ(used(), 7u);
  EXPECT_EQ(matched(x), x.size());
  EXPECT_EQ(matched(y), y.size());
}

TEST_F(EnginePolicy, AFullPutEvictsNothingWhenHeldBlocksLeaveTooLittle) {
  makeEngine(8);
  const auto x = request(4, 1000), y = request(4, 2000);
  cache("x", x);
  ASSERT_TRUE(putAndCommit(space_, "y", 0, y, {}, kOwner));  // held by its sequence
  auto g = engine_->put(kOwner, space_, "big", 0, request(5, 5000), {}, {});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.code(), ErrorCode::kFull);
  EXPECT_EQ(engine_->stats().evictions, 0u);
  EXPECT_EQ(matched(x), x.size());
  // What can be had is still granted.
  EXPECT_TRUE(putAndCommit(space_, "small", 0, request(4, 6000), {}, kOwner));
}

TEST_F(EnginePolicy, AFullPutEvictsNothingWhenTheColdTierLagsBehind) {
  makeEngine(8);
  useColdTier();
  const auto x = request(4, 1000), y = request(4, 2000);
  cache("x", x);
  spillAll();
  cache("y", y);  // not written yet: it cannot be dropped
  auto g = engine_->put(kOwner, space_, "big", 0, request(5, 5000), {}, {});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.code(), ErrorCode::kFull);
  EXPECT_EQ(engine_->stats().evictions, 0u);
  EXPECT_EQ(matched(x), x.size()) << "x left memory for a put that failed";
  spillAll();
  EXPECT_TRUE(putAndCommit(space_, "big", 0, request(5, 5000), {}, kOwner));
}

// ---------------------------------------------------------------------------------------------
// Defect 4: a released prefix is evicted from its tail: its head, which every longer prefix
// needs, goes last, and no block stays in memory behind an evicted parent.

TEST_F(EnginePolicy, ARemovedSequenceIsEvictedTailFirst) {
  // ARC's order: A is the older prefix (2Q, which the adaptive policy starts with, takes each
  // prefix's dead end first; every policy's tail-first order: EngineAnyPolicy).
  makeEngine(8, 0, EvictionKind::kArc);
  const auto a = request(4, 1000), b = request(4, 2000);
  cache("a", a);
  cache("b", b);
  cache("c", request(2, 3000));  // two blocks of A go
  EXPECT_EQ(matched(a), 2u * kBt) << "A's head went before its tail";
  EXPECT_EQ(matched(b), b.size());
  EXPECT_EQ(engine_->stats().blocksCached, 8u);
}

TEST_F(EnginePolicy, ATruncatedSequenceReleasesTailFirst) {
  makeEngine(4);
  const auto a = request(4, 1000);
  ASSERT_TRUE(putAndCommit(space_, "a", 0, a, {}, kOwner));
  ASSERT_TRUE(engine_->truncate(space_, "a", kBt).ok());  // blocks 1..3 released
  ASSERT_TRUE(engine_->remove(space_, "a", 0, kEnd).ok());
  cache("c", request(1, 3000));  // one block of A goes
  EXPECT_EQ(matched(a), 3u * kBt);
}

TEST_F(EnginePolicy, AReadLeaseReleasesTailFirst) {
  makeEngine(4);
  const auto a = request(4, 1000);
  cache("a", a);
  ASSERT_EQ(matched(a), a.size());  // a lookup pins A and lets it go
  cache("c", request(1, 3000));     // one block of A goes
  EXPECT_EQ(matched(a), 3u * kBt);
}

TEST_F(EnginePolicy, ALookupBoundSequenceReleasesTailFirst) {
  makeEngine(4);
  const auto a = request(4, 1000);
  cache("a", a);
  auto r = engine_->lookup(kOwner, space_, a, {}, "bound", {});
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(engine_->releaseRead(r->lease).ok());
  ASSERT_TRUE(engine_->remove(space_, "bound", 0, kEnd).ok());
  cache("c", request(1, 3000));
  EXPECT_EQ(matched(a), 3u * kBt);
}

}  // namespace
}  // namespace kvtier
