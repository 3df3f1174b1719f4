// ARC and the other policies through the engine (docs/cache-policy.md, §5 and §9): prefix
// reuse protects a prefix from one-time content, a conversation's newest turn stays with the
// prefix it extends, a prefix leaves tail first, and nothing held or pinned is ever evicted.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "store/engine.h"
#include "store/engine_test_util.h"

namespace kvtier {
namespace {

using namespace test_util;

constexpr uint32_t kBt = kTestBlockTokens;

// The blocks of a request of `n` blocks starting with token `first`.
std::vector<uint32_t> request(size_t n, uint32_t first) { return toks(n * kBt, first); }
std::vector<uint32_t> operator+(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class EngineArc : protected EngineHarness, public ::testing::TestWithParam<EvictionKind> {
 protected:
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
  // A burst of `n` one-time requests of `blocks` blocks each (a batch job: a scan).
  void scan(size_t n, size_t blocks, uint32_t first) {
    for (size_t i = 0; i < n; ++i) serve(request(blocks, first + static_cast<uint32_t>(i * 1000)));
  }
};

// A shared system prompt reused by a few sessions outlives a scan larger than the pool with ARC;
// LRU lets the scan flush it.
TEST_P(EngineArc, AScanDoesNotFlushAReusedPrompt) {
  makeEngine(16, 0, GetParam());
  const auto prompt = request(4, 100);
  for (uint32_t s = 0; s < 3; ++s) serve(prompt + request(2, 1000 + 100 * s));
  scan(10, 4, 100000);  // 40 blocks, each used once
  if (GetParam() == EvictionKind::kArc) {
    EXPECT_EQ(matched(prompt), prompt.size()) << "the scan flushed the reused prompt";
    EXPECT_GT(engine_->stats().evictions, 0u);
  } else {
    EXPECT_EQ(matched(prompt), 0u) << "LRU keeps the most recent: the scan";
  }
}

// A conversation's second turn: its new blocks continue the turn it reused, so they stay with
// it — a scan afterwards takes neither the head nor the newest turn that the next turn needs.
TEST_P(EngineArc, AConversationsNewestTurnStaysWithItsPrefix) {
  makeEngine(16, 0, GetParam());
  const auto turn1 = request(4, 100);
  const auto turn2 = turn1 + request(2, 500);
  serve(turn1);
  serve(turn2);
  scan(6, 4, 100000);
  if (GetParam() == EvictionKind::kArc) {
    EXPECT_EQ(matched(turn2), turn2.size()) << "the turn's tail left before the scan did";
  } else {
    EXPECT_EQ(matched(turn2), 0u);
  }
}

// A long document after a reused prompt is new content: on probation, it goes before the
// prompt, from its own tail.
TEST_P(EngineArc, ADocumentAfterASharedPromptGoesBeforeThePrompt) {
  makeEngine(16, 0, GetParam());
  const auto prompt = request(2, 100);
  serve(prompt + request(1, 200));
  serve(prompt + request(1, 300));  // the prompt is reused
  const auto doc = prompt + request(10, 10000);
  serve(doc);                       // 10 new blocks after 2 reused: new content
  serve(request(6, 50000));         // one-time content needs 4 blocks back
  if (GetParam() == EvictionKind::kArc) {
    // The second session kept its turn; the document lost its tail (and the first session,
    // used once, its block).
    EXPECT_EQ(matched(prompt + request(1, 300)), 3u * kBt);
    EXPECT_EQ(matched(doc), 9u * kBt);
  } else {
    // LRU takes the oldest: the first two sessions' blocks, then the document's tail.
    EXPECT_EQ(matched(prompt + request(1, 300)), 2u * kBt);
    EXPECT_EQ(matched(doc), 10u * kBt);
  }
}

// What every policy keeps, whichever it is (the suite runs each of them).
class EngineAnyPolicy : public EngineArc {};

// Reused prefixes leave from their tails too: with nothing used only once left, the oldest
// reused prefix loses its last blocks, never its head.
TEST_P(EngineAnyPolicy, AReusedPrefixIsEvictedTailFirst) {
  makeEngine(8, 0, GetParam());
  const auto a = request(4, 1000), b = request(4, 2000);
  serve(a);
  serve(a);
  serve(b);
  serve(b);
  serve(request(2, 3000));  // two blocks must go
  EXPECT_EQ(matched(b), b.size());
  EXPECT_EQ(matched(a), 2u * kBt) << "A's head went before its tail";
}

// Blocks a sequence holds or a lease pins are never evicted, whatever the policy prefers: with
// all but two blocks held, a scan cycles through those two.
TEST_P(EngineAnyPolicy, HeldAndPinnedBlocksAreNeverEvicted) {
  makeEngine(8, 0, GetParam());
  const auto kept = request(3, 100), pinned = request(3, 200);
  ASSERT_TRUE(putAndCommit(space_, "kept", 0, kept, {}, kOwner));
  serve(pinned);
  serve(pinned);
  auto lease = engine_->lookup(kOwner, space_, pinned, {}, "", {});
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->matchedTokens, pinned.size());
  scan(20, 2, 100000);
  EXPECT_EQ(engine_->stats().evictions, 19u * 2);
  EXPECT_EQ(readRange("kept", 0, kept.size()), tagsOf(kept));
  ASSERT_TRUE(engine_->releaseRead(lease->lease).ok());
  EXPECT_EQ(matched(pinned), pinned.size());
  EXPECT_EQ(matched(kept), kept.size());
}

INSTANTIATE_TEST_SUITE_P(Policies, EngineArc,
                         ::testing::Values(EvictionKind::kArc, EvictionKind::kLru),
                         [](const auto& info) { return std::string(evictionName(info.param)); });
INSTANTIATE_TEST_SUITE_P(Policies, EngineAnyPolicy,
                         ::testing::Values(EvictionKind::kArc, EvictionKind::kLru,
                                           EvictionKind::kTwoQ, EvictionKind::kS3Fifo,
                                           EvictionKind::kSieve, EvictionKind::kAdaptive),
                         [](const auto& info) {
                           std::string name = evictionName(info.param);
                           return name == "2q" ? std::string("twoq") : name;
                         });

}  // namespace
}  // namespace kvtier
