// A model check every eviction policy's tests run: random inserts (some after a commit's hint),
// holds, evictions and moves of 48 blocks against a model of which are evictable. A victim is
// always an evictable block of the class asked for, never a held one, and there is one whenever a
// block of that class is evictable; every `oldestEvery` steps oldest(), with random blocks to
// skip, is checked against what the policy would evict. With several size classes (the engine's
// tiers: a block id belongs to one pool, so to one class), a move may take content to another
// class, as a demotion does.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "store/eviction.h"

namespace kvtier::test {

struct EvictionModel {
  uint64_t seed = 1;
  int steps = 20000;
  uint64_t reuseOneIn = 4;  // an insert of absent content takes old content once in this many
  bool hints = true;        // some new blocks are sealed() first, after a random parent
  bool checkSize = false;   // size() is the evictable count after every step
  int oldestEvery = 97;
  uint32_t classes = 1;  // block b is of class b % classes
  // Set: oldest() is checked against successive victim()/evicted() of a copy made by it (the
  // skipped blocks erased first). Unset: oldest() lists the evictable blocks not skipped, in some
  // order, victim() first when nothing is skipped.
  std::function<std::unique_ptr<EvictionPolicy>(const EvictionPolicy&)> copy{};
  // Called after every step (e.g. to note which policy leads).
  std::function<void()> afterStep{};
};

// The tag of a content: block ids are where content lives now.
inline uint64_t modelTag(uint64_t content) { return 1000 + content; }

// Runs `m` on `p`; failures are gtest failures (a fatal one ends the run).
inline void runEvictionModel(EvictionPolicy& p, const EvictionModel& m) {
  uint64_t rng = m.seed;
  auto next = [&rng](uint64_t n) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (rng >> 33) % n;
  };
  constexpr BlockId kIds = 48;
  enum { kAbsent, kIn, kHeld };
  const auto classOf = [&m](BlockId b) { return static_cast<uint32_t>(b % m.classes); };
  // A class at random (none drawn with one class, so that single-class runs keep their sequence).
  const auto anyClass = [&] { return m.classes > 1 ? static_cast<uint32_t>(next(m.classes)) : 0u; };
  std::vector<int> where(kIds, kAbsent);
  std::vector<uint64_t> content(kIds, 0);
  const auto evictable = [&](uint32_t c) {
    int n = 0;
    for (BlockId b = 0; b < kIds; ++b) n += where[b] == kIn && classOf(b) == c;
    return n;
  };
  uint64_t nextContent = 1;
  for (int step = 0; step < m.steps; ++step) {
    SCOPED_TRACE(testing::Message() << "seed " << m.seed << ", step " << step);
    const BlockId id = static_cast<BlockId>(next(kIds));
    const uint64_t op = next(10);
    if (op < 4) {  // a block becomes evictable: new content, or a release after a hold
      if (where[id] == kAbsent) {
        content[id] = next(m.reuseOneIn) == 0 ? next(nextContent) : nextContent++;
      }
      if (m.hints && op == 0 && where[id] == kAbsent) {
        p.sealed(std::vector<BlockId>{id}, static_cast<BlockId>(next(kIds)), next(3));
      }
      p.insert(id, classOf(id), next(20) == 0, modelTag(content[id]));
      where[id] = kIn;
    } else if (op < 6) {  // held or pinned
      p.erase(id);
      if (where[id] == kIn) where[id] = kHeld;
    } else if (op < 9) {  // evicted, as allocation does
      const uint32_t c = anyClass();
      const BlockId v = p.victim(c);
      ASSERT_EQ(v != kNoBlock, evictable(c) > 0) << "class " << c;
      if (v == kNoBlock) continue;
      ASSERT_LT(v, kIds);
      ASSERT_EQ(where[v], kIn) << "victim " << v << " is not evictable";
      ASSERT_EQ(classOf(v), c) << "victim " << v << " is not of class " << c;
      p.evicted(v, modelTag(content[v]));
      where[v] = kAbsent;
    } else if (where[id] == kHeld) {  // a held block moves to a fresh one
      BlockId to = kNoBlock;
      for (BlockId b = 0; b < kIds; ++b) {
        if (where[b] == kAbsent) to = b;
      }
      if (to == kNoBlock) continue;
      p.moved(id, to);
      content[to] = content[id];
      where[id] = kAbsent;
      p.insert(to, classOf(to), false, modelTag(content[to]));
      where[to] = kIn;
    }
    if (m.afterStep) m.afterStep();
    if (m.checkSize) {
      ASSERT_EQ(p.size(), static_cast<size_t>(std::count(where.begin(), where.end(), kIn)));
    }
    if (step % m.oldestEvery != 0) continue;
    const uint32_t c = anyClass();
    std::vector<BlockId> skip;
    for (BlockId b = 0; b < kIds; ++b) {
      if (where[b] == kIn && classOf(b) == c && next(4) == 0) skip.push_back(b);
    }
    std::vector<BlockId> listed;
    p.oldest(c, kIds, listed, skip);
    if (m.copy) {
      std::unique_ptr<EvictionPolicy> copy = m.copy(p);
      for (BlockId b : skip) copy->erase(b);
      std::vector<BlockId> taken;
      for (BlockId v = copy->victim(c); v != kNoBlock && taken.size() <= kIds;
           v = copy->victim(c)) {
        taken.push_back(v);
        copy->evicted(v, modelTag(content[v]));
      }
      ASSERT_EQ(listed, taken) << "class " << c;
      EXPECT_EQ(copy->size(),
                static_cast<size_t>(std::count(where.begin(), where.end(), kIn) - evictable(c)));
    } else {
      std::vector<BlockId> expected;
      for (BlockId b = 0; b < kIds; ++b) {
        if (where[b] == kIn && classOf(b) == c &&
            !std::binary_search(skip.begin(), skip.end(), b)) {
          expected.push_back(b);
        }
      }
      std::vector<BlockId> sorted = listed;
      std::sort(sorted.begin(), sorted.end());
      ASSERT_EQ(sorted, expected) << "class " << c;
      if (skip.empty() && !listed.empty()) {
        EXPECT_EQ(p.victim(c), listed.front());
      }
    }
  }
}

// EvictionModel::copy for a copyable policy type.
template <typename Policy>
std::unique_ptr<EvictionPolicy> copyOf(const EvictionPolicy& p) {
  return std::make_unique<Policy>(dynamic_cast<const Policy&>(p));
}

// `m` on a fresh `Policy`, oldest() checked against the evictions of a copy (copyOf).
template <typename Policy>
void runCopyableModel(EvictionModel m) {
  Policy p;
  m.copy = copyOf<Policy>;
  runEvictionModel(p, m);
}

}  // namespace kvtier::test
