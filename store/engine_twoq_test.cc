// The 2Q policy (`--eviction 2q`, store/eviction.h) through the engine: a prefix always leaves
// from its tail, held, pinned and leased blocks are never chosen, a FULL put evicts nothing, a
// scan does not flush reused content, and content evicted lately comes back protected.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "store/engine.h"
#include "store/engine_test_util.h"

namespace kvtier {
namespace {

using namespace test_util;

constexpr uint32_t kBt = kTestBlockTokens;

// The tokens of `n` blocks starting with token `first`.
std::vector<uint32_t> request(size_t n, uint32_t first) { return toks(n * kBt, first); }
std::vector<uint32_t> operator+(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class EngineTwoQ : protected EngineHarness, public ::testing::Test {
 protected:
  void make(uint64_t blocks) { makeEngine(blocks, 0, EvictionKind::kTwoQ); }

  // A request as an engine serves one: the cached prefix bound to a sequence by a lookup, the
  // rest put after it, then the sequence removed (`kvtier replay`'s method).
  void serve(const std::vector<uint32_t>& tokens) {
    auto r = engine_->lookup(kOwner, space_, tokens, {}, "req", {});
    ASSERT_TRUE(r.ok()) << r.error();
    if (r->lease) {
      ASSERT_TRUE(engine_->releaseRead(r->lease).ok());
    }
    const uint64_t hit = r->matchedTokens;
    if (hit < tokens.size()) {
      const std::vector<uint32_t> rest(tokens.begin() + static_cast<std::ptrdiff_t>(hit),
                                       tokens.end());
      ASSERT_TRUE(putAndCommit(space_, "req", hit, rest, {}, kOwner));
    }
    ASSERT_TRUE(engine_->remove(space_, "req", 0, kEnd).ok());
  }
  void scan(size_t n, size_t blocks, uint32_t first) {
    for (size_t i = 0; i < n; ++i) serve(request(blocks, first + static_cast<uint32_t>(i * 1000)));
  }

  // Which blocks of `tokens`' chain the prefix index holds, looked at without touching them (a
  // lookup would count as a use).
  std::vector<bool> cached(const std::vector<uint32_t>& tokens) {
    auto keys = engine_->chainKeys(space_, tokens, {});
    EXPECT_TRUE(keys.ok());
    std::vector<bool> out;
    if (!keys.ok()) return out;
    for (const Key128& k : *keys) out.push_back(engine_->indexed(space_, k));
    return out;
  }
  // Blocks of the chain the index holds, checking they are its first ones: no block is kept
  // behind one that is gone (a prefix leaves from its tail).
  ::testing::AssertionResult cachedPrefix(const std::vector<uint32_t>& tokens, size_t& blocks) {
    const std::vector<bool> c = cached(tokens);
    blocks = 0;
    while (blocks < c.size() && c[blocks]) ++blocks;
    for (size_t i = blocks; i < c.size(); ++i) {
      if (c[i]) {
        return ::testing::AssertionFailure()
               << "block " << i << " is cached behind block " << blocks << ", which is gone";
      }
    }
    return ::testing::AssertionSuccess();
  }
};

// Requests sharing prompts and documents, with tails of their own, through a pool far smaller
// than they are: after every request, every chain served so far is cached as a prefix of itself.
TEST_F(EngineTwoQ, APrefixAlwaysLeavesFromItsTail) {
  make(24);
  uint64_t rng = 2026;
  auto next = [&rng](uint64_t n) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (rng >> 33) % n;
  };
  std::vector<std::vector<uint32_t>> served;
  size_t partial = 0;
  for (int i = 0; i < 400; ++i) {
    // One of 3 prompts (2 blocks), one of 8 documents (2-6 blocks), a tail of 0-3 new blocks or
    // one of 4 earlier tails; now and then a one-time scan of 5 blocks.
    std::vector<uint32_t> tokens;
    if (next(8) == 0) {
      tokens = request(5, 1'000'000 + static_cast<uint32_t>(i) * 100);
    } else {
      const uint32_t prompt = static_cast<uint32_t>(next(3));
      const uint32_t doc = static_cast<uint32_t>(next(8));
      tokens = request(2, 10'000 * (prompt + 1)) + request(2 + doc % 5, 100'000 + 1000 * doc);
      const uint32_t tail = static_cast<uint32_t>(next(8));
      tokens = tokens + request(tail % 4, tail < 4 ? 500'000 + 100 * tail
                                                   : 600'000 + static_cast<uint32_t>(i) * 10);
    }
    serve(tokens);
    served.push_back(tokens);
    for (const auto& s : served) {
      size_t blocks = 0;
      ASSERT_TRUE(cachedPrefix(s, blocks)) << "after request " << i;
      partial += blocks > 0 && blocks * kBt < s.size();
    }
  }
  EXPECT_GT(engine_->stats().evictions, 1000u);
  EXPECT_GT(partial, 0u) << "no chain was ever cut: the test saw no tail leave";
}

TEST_F(EngineTwoQ, AReleasedPrefixGoesTailFirstWithinEachList) {
  make(10);
  const auto a = request(4, 100), b = request(4, 200);
  serve(a);  // new: a dead end (block 3) and probation
  serve(b);
  serve(request(3, 300));  // 3 blocks, 2 free: one eviction, a's end
  size_t blocks = 0;
  ASSERT_TRUE(cachedPrefix(a, blocks));
  EXPECT_EQ(blocks, 3u);
  ASSERT_TRUE(cachedPrefix(b, blocks));
  EXPECT_EQ(blocks, 4u);
  serve(request(2, 400));  // 2 more: the ends of b and of the 3-block request, dead ends first
  ASSERT_TRUE(cachedPrefix(a, blocks));
  EXPECT_EQ(blocks, 3u);
  ASSERT_TRUE(cachedPrefix(b, blocks));
  EXPECT_EQ(blocks, 3u);
  // Reused, a is protected (its missing end continues it): new content goes before it, b from
  // its tail.
  serve(a);
  serve(request(4, 500));
  ASSERT_TRUE(cachedPrefix(a, blocks));
  EXPECT_EQ(blocks, 4u);
  ASSERT_TRUE(cachedPrefix(b, blocks));
  EXPECT_EQ(blocks, 0u);
}

TEST_F(EngineTwoQ, HeldPinnedAndLeasedBlocksAreNeverEvicted) {
  make(8);
  const auto kept = request(3, 100), pinned = request(2, 200);
  ASSERT_TRUE(putAndCommit(space_, "kept", 0, kept, {}, kOwner));  // held by its sequence
  serve(pinned);
  auto lease = engine_->lookup(kOwner, space_, pinned, {}, "", {});  // pinned by a read lease
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->matchedTokens, pinned.size());
  const auto written = request(1, 300);
  auto w = engine_->put(kOwner, space_, "writing", 0, written, {}, {});  // a write lease
  ASSERT_TRUE(w.ok()) << w.error();
  fill(*w, 0, written);
  scan(20, 2, 100000);  // 2 blocks free: each scan request evicts the one before
  EXPECT_EQ(engine_->stats().evictions, 19u * 2);
  auto full = engine_->put(kOwner, space_, "more", 0, request(3, 400), {}, {});
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.code(), ErrorCode::kFull);
  ASSERT_TRUE(engine_->commit(w->lease, kEnd).ok());
  EXPECT_EQ(readRange("writing", 0, written.size()), tagsOf(written));
  EXPECT_EQ(readRange("kept", 0, kept.size()), tagsOf(kept));
  ASSERT_TRUE(engine_->releaseRead(lease->lease).ok());
  EXPECT_EQ(matched(pinned), pinned.size());
}

TEST_F(EngineTwoQ, AFullPutEvictsNothing) {
  make(8);
  const auto x = request(4, 1000), y = request(3, 2000);
  serve(x);
  serve(x);  // protected
  serve(y);  // probation
  auto g = engine_->put(kOwner, space_, "big", 0, request(9, 5000), {}, {});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.code(), ErrorCode::kFull);
  EXPECT_EQ(engine_->stats().evictions, 0u);
  EXPECT_EQ(used(), 7u);
  EXPECT_EQ(cached(x), std::vector<bool>(4, true));
  EXPECT_EQ(cached(y), std::vector<bool>(3, true));
}

TEST_F(EngineTwoQ, AScanDoesNotFlushAReusedPrompt) {
  make(16);
  const auto prompt = request(4, 100);
  for (uint32_t s = 0; s < 3; ++s) serve(prompt + request(2, 1000 + 100 * s));
  scan(10, 4, 100000);  // 40 blocks, each used once
  EXPECT_EQ(matched(prompt), prompt.size()) << "the scan flushed the reused prompt";
  EXPECT_GT(engine_->stats().evictions, 0u);
}

// A document read once and evicted by other new content is recognised when it comes back (its
// blocks' content is in the eviction history) and then outlives new content.
TEST_F(EngineTwoQ, ContentEvictedLatelyComesBackProtected) {
  make(12);
  const auto doc = request(6, 100);
  serve(doc);
  scan(4, 4, 100000);  // 16 new blocks: the document, older, goes first
  EXPECT_EQ(cached(doc), std::vector<bool>(6, false));
  serve(doc);  // a miss, put again: evicted lately, so protected
  scan(3, 4, 200000);
  EXPECT_EQ(cached(doc), std::vector<bool>(6, true)) << "new content displaced the document";
}

}  // namespace
}  // namespace kvtier
