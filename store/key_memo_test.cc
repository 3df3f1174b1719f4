#include "store/key_memo.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace kvtier {
namespace {

constexpr uint64_t kFp = 0x1234;
constexpr Salt kSalts[2] = {{7, 7, 7}, {8, 8, 8}};  // namespaces 0 and 1
constexpr uint32_t kBt = 16;

std::vector<uint32_t> randomTokens(std::mt19937& random, size_t n) {
  std::vector<uint32_t> t(n);
  for (auto& x : t) x = random() % 1000;  // a small vocabulary: blocks often share tokens
  return t;
}

// The chain as SHA-256 gives it, nothing remembered.
std::vector<Key128> hashedChain(std::span<const uint32_t> tokens, uint32_t space = 0) {
  BlockKeyHasher hasher(kFp, kSalts[space]);
  std::vector<Key128> keys;
  for (size_t i = 0; i < tokens.size() / kBt; ++i) {
    keys.push_back(hasher.next(i == 0 ? nullptr : &keys.back(), tokens.subspan(i * kBt, kBt)));
  }
  return keys;
}

std::vector<Key128> memoChain(KeyMemo& memo, uint32_t space, std::span<const uint32_t> tokens) {
  MemoHasher hasher(kFp, kSalts[space], space, &memo);
  std::vector<Key128> keys;
  for (size_t i = 0; i < tokens.size() / kBt; ++i) {
    keys.push_back(hasher.next(i, i == 0 ? nullptr : &keys.back(), tokens.subspan(i * kBt, kBt)));
  }
  return keys;
}

TEST(KeyMemo, ARememberedKeyIsFoundOnlyByEverythingItWasHashedFrom) {
  KeyMemo memo(64, 99);
  std::mt19937 random(1);
  const auto tokens = randomTokens(random, kBt);
  const Key128 previous = hashedChain(randomTokens(random, kBt))[0];
  const Key128 key = hashedChain(tokens)[0];  // (any key: the memo stores what it is told)
  const uint64_t slot = memo.slotOf(3, 5, tokens);
  EXPECT_EQ(memo.find(slot, 3, &previous, tokens), nullptr);  // nothing remembered yet
  memo.remember(slot, 3, &previous, tokens, key);
  const Key128* found = memo.find(slot, 3, &previous, tokens);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(*found, key);

  EXPECT_EQ(memo.find(slot, 4, &previous, tokens), nullptr) << "another namespace";
  EXPECT_EQ(memo.find(slot, 3, nullptr, tokens), nullptr) << "block 0 instead";
  Key128 other = previous;
  other.bytes[15] ^= 1;
  EXPECT_EQ(memo.find(slot, 3, &other, tokens), nullptr) << "another previous key";
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto changed = tokens;
    changed[i] ^= 1u << (i % 32);
    EXPECT_EQ(memo.find(slot, 3, &previous, changed), nullptr) << "token " << i << " changed";
  }
  EXPECT_EQ(memo.find(slot, 3, &previous, std::span(tokens).first(kBt - 1)), nullptr)
      << "fewer tokens";

  // Block 0 is remembered apart from a block after a zero key.
  const Key128 zero{};
  memo.remember(slot, 3, nullptr, tokens, key);
  EXPECT_EQ(memo.find(slot, 3, &zero, tokens), nullptr);
  EXPECT_NE(memo.find(slot, 3, nullptr, tokens), nullptr);
}

TEST(KeyMemo, BlocksLongerThanItsLimitAreNeverRemembered) {
  KeyMemo memo(64, 99);
  const std::vector<uint32_t> tokens(KeyMemo::kMaxTokens + 1, 5);
  const uint64_t slot = memo.slotOf(0, 0, tokens);
  memo.remember(slot, 0, nullptr, tokens, Key128{});
  EXPECT_EQ(memo.find(slot, 0, nullptr, tokens), nullptr);
}

// Whatever the memo holds, evicts or shares between namespaces, a chain's keys are SHA-256's:
// prompts that share prefixes and blocks, in two namespaces, through memos of 1 to 4096 slots
// (1 slot: every key replaces the last).
TEST(KeyMemo, ChainsThroughTheMemoAreTheHashedChainsWhateverItHolds) {
  std::mt19937 random(20261129);
  std::vector<std::vector<uint32_t>> prompts;
  for (int p = 0; p < 24; ++p) {
    auto t = randomTokens(random, kBt * (1 + random() % 40));
    if (p > 0 && p % 3 == 0) {  // a prompt that extends an earlier one
      const auto& base = prompts[random() % prompts.size()];
      t.insert(t.begin(), base.begin(), base.end());
    }
    prompts.push_back(std::move(t));
  }
  for (size_t slots : {1, 7, 64, 4096}) {
    KeyMemo memo(slots, 1 + slots);
    for (int round = 0; round < 3; ++round) {
      for (const auto& t : prompts) {
        // The namespaces' chains differ from their roots on; the memo must not mix them.
        for (uint32_t space : {0u, 1u}) {
          ASSERT_EQ(memoChain(memo, space, t), hashedChain(t, space))
              << slots << " slots, namespace " << space;
        }
      }
    }
    if (slots == 4096) {
      EXPECT_GT(memo.hits(), memo.misses()) << "a large memo serves the repeated prompts";
    }
  }
}

}  // namespace
}  // namespace kvtier
