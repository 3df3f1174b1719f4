#include "store/prefix_index.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <vector>

namespace kvtier {
namespace {

Key128 keyOf(uint64_t n) {
  Key128 k;
  for (int i = 0; i < 8; ++i) k.bytes[i] = static_cast<uint8_t>(n >> (8 * i));
  k.bytes[15] = 0x5a;
  return k;
}

// A pool of `n` 64-byte blocks, all carved, whose metadata the index reads.
struct Fixture {
  explicit Fixture(size_t n) : pool({{0, n * 64}}) {
    const uint32_t cls = pool.sizeClass(64);
    for (size_t i = 0; i < n; ++i) blocks.push_back(pool.allocate(cls));
  }
  // Gives block b the content (space, key), as sealing does.
  void seal(BlockId b, uint32_t space, const Key128& key) {
    pool[b].space = space;
    pool[b].key = key;
  }
  BlockPool pool;
  std::vector<BlockId> blocks;
};

TEST(PrefixIndexTest, FindsWhatWasInsertedAndNothingElse) {
  Fixture f(3000);
  PrefixIndex index(f.pool, 42);
  EXPECT_EQ(index.find(0, keyOf(1)), kNoBlock) << "empty index";
  for (size_t i = 0; i < 3000; ++i) {
    f.seal(f.blocks[i], i % 2, keyOf(i));
    ASSERT_EQ(index.insert(i % 2, keyOf(i), f.blocks[i]), kNoBlock);
  }
  EXPECT_EQ(index.size(), 3000u);
  for (size_t i = 0; i < 3000; ++i) {
    EXPECT_EQ(index.find(i % 2, keyOf(i)), f.blocks[i]);
    // The same key in the other namespace is other content.
    EXPECT_EQ(index.find(1 - i % 2, keyOf(i)), kNoBlock);
  }
  EXPECT_EQ(index.find(0, keyOf(5000)), kNoBlock);
  // A second insert of present content returns the block that holds it and changes nothing.
  EXPECT_EQ(index.insert(0, keyOf(0), f.blocks[7]), f.blocks[0]);
  EXPECT_EQ(index.find(0, keyOf(0)), f.blocks[0]);
  EXPECT_EQ(index.size(), 3000u);
  // About 8 to 16 bytes an entry (at most 3/4 full, growing by doubling).
  EXPECT_LE(index.memoryBytes(), 3000u * 16 * 4 / 3 + 8192);
}

TEST(PrefixIndexTest, ChurnAgainstAReferenceMap) {
  // Random inserts, erases and replaces, checked after each step against std::unordered_map:
  // backward-shift deletion must never lose an entry behind the hole it fills.
  Fixture f(4096);
  PrefixIndex index(f.pool, 7);
  std::unordered_map<uint64_t, BlockId> ref;  // key number -> block
  std::vector<BlockId> freeBlocks(f.blocks.rbegin(), f.blocks.rend());
  std::mt19937_64 rng(1);
  for (int step = 0; step < 60000; ++step) {
    const uint64_t k = rng() % 6000;  // a small key space: collisions in the table are common
    auto it = ref.find(k);
    const int op = static_cast<int>(rng() % 3);
    if (it == ref.end()) {
      if (freeBlocks.empty()) continue;
      const BlockId b = freeBlocks.back();
      freeBlocks.pop_back();
      f.seal(b, 3, keyOf(k));
      ASSERT_EQ(index.insert(3, keyOf(k), b), kNoBlock);
      ref[k] = b;
    } else if (op == 0 && !freeBlocks.empty()) {
      // Content moves to another block (a move between tiers).
      const BlockId b = freeBlocks.back();
      freeBlocks.pop_back();
      f.seal(b, 3, keyOf(k));
      ASSERT_TRUE(index.replace(3, keyOf(k), b));
      f.seal(it->second, 0, Key128{});
      freeBlocks.push_back(it->second);
      it->second = b;
    } else {
      ASSERT_TRUE(index.erase(3, keyOf(k)));
      EXPECT_FALSE(index.erase(3, keyOf(k))) << "erased twice";
      f.seal(it->second, 0, Key128{});  // released: its key cleared
      freeBlocks.push_back(it->second);
      ref.erase(it);
    }
    if (step % 997 == 0 || step > 59000) {
      ASSERT_EQ(index.size(), ref.size());
      for (const auto& [key, block] : ref) ASSERT_EQ(index.find(3, keyOf(key)), block);
      size_t seen = 0;
      index.forEach([&](BlockId) { ++seen; });
      ASSERT_EQ(seen, ref.size());
    }
  }
}

TEST(PrefixIndexTest, FindRunStopsAtTheFirstMissing) {
  Fixture f(1000);
  PrefixIndex index(f.pool, 9);
  std::vector<Key128> chain;
  for (size_t i = 0; i < 600; ++i) {
    chain.push_back(keyOf(100000 + i));
    if (i == 500) continue;  // block 500 of the chain is not indexed
    f.seal(f.blocks[i], 1, chain.back());
    index.insert(1, chain.back(), f.blocks[i]);
  }
  std::vector<BlockId> out;
  EXPECT_EQ(index.findRun(1, chain, out), 500u);
  ASSERT_EQ(out.size(), 500u);
  for (size_t i = 0; i < 500; ++i) EXPECT_EQ(out[i], f.blocks[i]);
  out.clear();
  EXPECT_EQ(index.findRun(1, std::span(chain).first(37), out), 37u) << "shorter than the lead";
  out.clear();
  EXPECT_EQ(index.findRun(2, chain, out), 0u) << "another namespace";
  EXPECT_TRUE(out.empty());
  PrefixIndex empty(f.pool, 9);
  EXPECT_EQ(empty.findRun(1, chain, out), 0u);
}

TEST(PrefixIndexTest, SeedsSpreadTheSameKeysDifferently) {
  // Keys a client chose to collide under one process's hash do not collide under another's.
  Fixture f(1);
  PrefixIndex a(f.pool, 1), b(f.pool, 2);
  int same = 0;
  for (uint64_t i = 0; i < 1000; ++i) same += a.hash(0, keyOf(i)) == b.hash(0, keyOf(i));
  EXPECT_LT(same, 5);
}

}  // namespace
}  // namespace kvtier
