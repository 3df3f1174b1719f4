// The engine's unit-test fixture, shared by engine_test.cc (namespaces, puts and commits, appends),
// engine_lookup_test.cc (sealing, lookup, copyPrefix, remove and truncate) and engine_lease_test.cc
// (leases, eviction, resolveSealed, owners and stats): a real engine over a pool of 16 small
// blocks, with tags written per position (engine_test_util.h).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "store/engine.h"
#include "store/engine_test_util.h"

namespace kvtier {

// Readable failure messages for block references (error codes: engine_test_util.h).
inline void PrintTo(const BlockLocation& l, std::ostream* os) {
  *os << "{extent " << l.extent << ", offset " << l.offset << ", bytes " << l.bytes << ", gen "
      << l.generation << "}";
}

namespace test_util {

// A small layout, so that pools of a few blocks reach FULL and eviction quickly: 2 layers, 1 KV
// head, head dim 4, fp16 -> 8 bytes per token per layer for K (and V), 512 bytes per block.
inline constexpr uint32_t kBt = kTestBlockTokens;
inline constexpr uint32_t kBlockBytes = 512;

inline std::vector<BlockLocation> firstBlocks(const std::vector<BlockLocation>& v, size_t n) {
  return {v.begin(), v.begin() + n};
}

class EngineTest : public ::testing::Test, protected EngineHarness {
 protected:
  void SetUp() override { makeEngine(16); }

  std::optional<uint32_t> tagAt(const BlockLocation& loc, uint32_t slot) {
    return readTag(layout_, at(loc), slot);
  }

  Result<PutGrant> put(std::string_view seq, uint64_t begin, const std::vector<uint32_t>& tokens,
                       const std::vector<Key128>& keys = {}) {
    return engine_->put(kOwner, space_, seq, begin, tokens, keys, SeqOptions{});
  }

  // put + write the tokens as tags + commit everything.
  ::testing::AssertionResult writeIn(SpaceId sp, std::string_view seq, uint64_t begin,
                                     const std::vector<uint32_t>& tokens, OwnerId owner = kOwner,
                                     bool detached = false, const std::vector<Key128>& keys = {}) {
    return putAndCommit(sp, seq, begin, tokens, SeqOptions{.detached = detached}, owner, keys);
  }
  ::testing::AssertionResult write(std::string_view seq, uint64_t begin,
                                   const std::vector<uint32_t>& tokens, OwnerId owner = kOwner,
                                   bool detached = false) {
    return writeIn(space_, seq, begin, tokens, owner, detached);
  }

  // The tags of every position of seq, read through a get's block references.
  Tags readIn(SpaceId sp, std::string_view seq) { return readRangeIn(sp, seq, 0, kEnd); }
  Tags read(std::string_view seq) { return readIn(space_, seq); }

  std::vector<BlockLocation> blocksOf(std::string_view seq) {
    auto g = engine_->get(space_, seq, 0, kEnd);
    if (!g.ok()) {
      ADD_FAILURE() << "get '" << seq << "': " << g.error();
      return {};
    }
    if (g->lease != 0) {
      EXPECT_TRUE(engine_->releaseRead(g->lease).ok());
    }
    return g->blocks;
  }

  uint64_t matchedKeys(const std::vector<Key128>& keys) {
    auto r = engine_->lookup(kOwner, space_, {}, keys, "", SeqOptions{});
    if (!r.ok()) {
      ADD_FAILURE() << "lookup: " << r.error();
      return 0;
    }
    if (r->lease != 0) {
      EXPECT_TRUE(engine_->releaseRead(r->lease).ok());
    }
    return r->matchedTokens;
  }
};

}  // namespace test_util
}  // namespace kvtier
