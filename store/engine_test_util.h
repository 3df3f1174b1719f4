// Helpers shared by the engine's unit tests: a small layout and per-position tags written into
// every layer's K and V slot, so that a test can tell exactly which position's bytes it reads.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/layout.h"
#include "store/block_pool.h"
#include "store/engine.h"

namespace kvtier::test_util {

inline constexpr uint32_t kTestBlockTokens = 16;

// 2 layers, 1 KV head, head dim 4, fp16: 8 bytes per token per layer for K (and V), 512-byte
// blocks. No RoPE scheme.
inline Layout smallLayout(std::string modelId = "test-model") {
  Layout l;
  l.modelId = std::move(modelId);
  l.numLayers = 2;
  l.numKvHeads = 1;
  l.headDim = 4;
  l.dtype = DType::kFloat16;
  l.blockTokens = kTestBlockTokens;
  return l;
}

// What a test writes into a position: for every layer, K and V, the token slot holds the tag (4
// bytes, little-endian), the layer, K or V, and the tag's complement; zeroed or foreign bytes read
// back as nullopt.
using Tags = std::vector<std::optional<uint32_t>>;

inline void slotBytes(uint32_t tag, uint32_t layer, uint32_t kv, uint8_t out[8]) {
  out[0] = static_cast<uint8_t>(tag);
  out[1] = static_cast<uint8_t>(tag >> 8);
  out[2] = static_cast<uint8_t>(tag >> 16);
  out[3] = static_cast<uint8_t>(tag >> 24);
  out[4] = static_cast<uint8_t>(layer);
  out[5] = static_cast<uint8_t>(kv);
  out[6] = static_cast<uint8_t>(~tag);
  out[7] = static_cast<uint8_t>(~tag >> 8);
}

inline void writeTag(const Layout& l, uint8_t* block, uint32_t slot, uint32_t tag) {
  for (uint32_t layer = 0; layer < l.numLayers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      uint8_t bytes[8];
      slotBytes(tag, layer, kv, bytes);
      std::memcpy(block + l.slotOffset(layer, kv, slot), bytes, sizeof bytes);
    }
  }
}

inline std::optional<uint32_t> readTag(const Layout& l, const uint8_t* block, uint32_t slot) {
  const uint8_t* p = block + l.slotOffset(0, 0, slot);
  const uint32_t tag =
      uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
  for (uint32_t layer = 0; layer < l.numLayers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      uint8_t bytes[8];
      slotBytes(tag, layer, kv, bytes);
      if (std::memcmp(block + l.slotOffset(layer, kv, slot), bytes, sizeof bytes) != 0)
        return std::nullopt;
    }
  }
  return tag;
}

inline std::vector<uint32_t> toks(size_t n, uint32_t first) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = first + static_cast<uint32_t>(i);
  return v;
}

inline constexpr OwnerId kOwner = 1;

inline std::vector<uint32_t> head(const std::vector<uint32_t>& v, size_t n) {
  return {v.begin(), v.begin() + n};
}
inline std::vector<uint32_t> cat(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
inline Tags tagsOf(const std::vector<uint32_t>& tokens) {
  return Tags(tokens.begin(), tokens.end());
}
inline Key128 keyOf(uint8_t seed) {
  Key128 k;
  for (size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<uint8_t>(seed * 31 + i);
  return k;
}

// Puts `tokens` as `seq` of `space` in `tier` with tag = token, commits, and removes the sequence,
// so that only the prefix index holds its full blocks.
inline void cacheTagged(Engine& engine, BlockMemory& memory, SpaceId space, std::string_view seq,
                        const std::vector<uint32_t>& tokens, uint8_t tier) {
  const Layout& layout = engine.space(space).layout;
  auto g = engine.put(kOwner, space, seq, 0, tokens, {}, {}, tier);
  ASSERT_TRUE(g.ok()) << g.error();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const BlockLocation& b = g->blocks[i / layout.blockTokens];
    writeTag(layout, memory.extentBase(b.extent) + b.offset, i % layout.blockTokens, tokens[i]);
  }
  ASSERT_TRUE(engine.commit(g->lease, kEnd).ok());
  ASSERT_TRUE(engine.remove(space, seq, 0, kEnd).ok());
}

// The extent of each block a lookup of `tokens` finds, after checking every tag of the blocks the
// CPU can read (its read lease released again).
inline std::vector<uint32_t> lookupExtents(Engine& engine, BlockMemory& memory, SpaceId space,
                                           const std::vector<uint32_t>& tokens) {
  const Layout& layout = engine.space(space).layout;
  auto r = engine.lookup(kOwner, space, tokens, {}, "", {});
  EXPECT_TRUE(r.ok());
  if (!r.ok()) return {};
  std::vector<uint32_t> extents;
  for (size_t b = 0; b < r->blocks.size(); ++b) {
    const BlockLocation& l = r->blocks[b];
    extents.push_back(l.extent);
    if (!memory.hostAddressable(l.extent)) continue;
    for (uint32_t s = 0; s < layout.blockTokens; ++s) {
      EXPECT_EQ(readTag(layout, memory.extentBase(l.extent) + l.offset, s),
                tokens[b * layout.blockTokens + s])
          << "block " << b;
    }
  }
  if (r->lease) {
    EXPECT_TRUE(engine.releaseRead(r->lease).ok());
  }
  return extents;
}

// A real engine over a BlockPool and heap memory, and the helpers the engine's fixtures share:
// writing tags through a put, reading them back through a get, lengths, lookups, canResume.
class EngineHarness {
 protected:
  // A fresh engine over one extent of `blocks` blocks of layout_ plus `blobBytes` more bytes,
  // with the daemon's default eviction policy unless told otherwise.
  void makeEngine(uint64_t blocks, uint64_t blobBytes = 0,
                  EvictionKind eviction = kDefaultEviction) {
    engine_.reset();
    mem_.reset();
    pool_ = std::make_unique<BlockPool>(
        std::vector<BlockPool::Extent>{{0, blocks * layout_.chunkBytes() + blobBytes}});
    mem_ = std::make_unique<HeapBlockMemory>(pool_->extents());
    engine_ = std::make_unique<Engine>(*pool_, *mem_, makeEvictionPolicy(eviction), rotator_);
    auto s = engine_->openSpace(layout_, saltFor("tenant-a"));
    ASSERT_TRUE(s.ok()) << s.error();
    space_ = *s;
    ASSERT_EQ(engine_->space(space_).blockBytes, layout_.chunkBytes());
  }

  uint8_t* at(const BlockLocation& loc) { return mem_->extentBase(loc.extent) + loc.offset; }

  // Writes tag = token into positions [begin, begin + tags.size()) of a grant.
  void fill(const PutGrant& g, uint64_t begin, const std::vector<uint32_t>& tags) {
    const uint32_t bt = layout_.blockTokens;
    for (size_t i = 0; i < tags.size(); ++i) {
      const uint64_t pos = begin + i;
      const size_t index = (pos - g.firstPosition) / bt;
      ASSERT_LT(index, g.blocks.size()) << "position " << pos << " is outside the grant";
      ASSERT_EQ(g.blocks[index].bytes, layout_.blockBytes());
      writeTag(layout_, at(g.blocks[index]), pos % bt, tags[i]);
    }
  }

  // put + write the tokens as tags + commit everything.
  ::testing::AssertionResult putAndCommit(SpaceId sp, std::string_view seq, uint64_t begin,
                                          const std::vector<uint32_t>& tokens,
                                          const SeqOptions& options, OwnerId owner,
                                          const std::vector<Key128>& keys = {}) {
    auto g = engine_->put(owner, sp, seq, begin, tokens, keys, options);
    if (!g.ok()) return ::testing::AssertionFailure() << "put: " << g.error();
    fill(*g, begin, tokens);
    auto c = engine_->commit(g->lease, kEnd);
    if (!c.ok()) return ::testing::AssertionFailure() << "commit: " << c.error();
    if (c->length != begin + tokens.size()) {
      return ::testing::AssertionFailure() << "committed length " << c->length;
    }
    return ::testing::AssertionSuccess();
  }

  // The tags of positions [begin, end) of seq, read through a get's block references.
  Tags readRangeIn(SpaceId sp, std::string_view seq, uint64_t begin, uint64_t end) {
    auto g = engine_->get(sp, seq, begin, end);
    if (!g.ok()) {
      ADD_FAILURE() << "get '" << seq << "' [" << begin << ", " << end << "): " << g.error();
      return {};
    }
    const uint32_t bt = layout_.blockTokens;
    Tags out;
    for (uint64_t pos = begin; pos < g->end; ++pos) {
      const size_t index = (pos - g->firstPosition) / bt;
      if (index >= g->blocks.size()) {
        ADD_FAILURE() << "get '" << seq << "' has no block for position " << pos;
        break;
      }
      out.push_back(readTag(layout_, at(g->blocks[index]), pos % bt));
    }
    if (g->lease != 0) {
      EXPECT_TRUE(engine_->releaseRead(g->lease).ok());
    }
    return out;
  }
  Tags readRange(std::string_view seq, uint64_t begin, uint64_t end) {
    return readRangeIn(space_, seq, begin, end);
  }

  std::optional<uint64_t> lenIn(SpaceId sp, std::string_view seq) {
    auto r = engine_->length(sp, seq);
    if (!r.ok()) {
      ADD_FAILURE() << "length '" << seq << "': " << r.error();
      return std::nullopt;
    }
    return *r;
  }
  std::optional<uint64_t> len(std::string_view seq) { return lenIn(space_, seq); }

  // Tokens a lookup matches (whole blocks; its read lease released again).
  uint64_t matchedIn(SpaceId sp, const std::vector<uint32_t>& tokens) {
    auto r = engine_->lookup(kOwner, sp, tokens, {}, "", SeqOptions{});
    if (!r.ok()) {
      ADD_FAILURE() << "lookup: " << r.error();
      return 0;
    }
    EXPECT_EQ(r->blocks.size() * layout_.blockTokens, r->matchedTokens);
    EXPECT_EQ(r->lease == 0, r->matchedTokens == 0);
    if (r->lease != 0) {
      EXPECT_TRUE(engine_->releaseRead(r->lease).ok());
    }
    return r->matchedTokens;
  }
  uint64_t matched(const std::vector<uint32_t>& tokens) { return matchedIn(space_, tokens); }

  bool resumable(std::string_view seq, uint64_t pos) {
    auto r = engine_->canResume(space_, seq, pos);
    EXPECT_TRUE(r.ok()) << r.error();
    return r.ok() && *r;
  }

  uint64_t used() const { return pool_->blocksUsed(); }

  Layout layout_ = smallLayout();
  const KeyRotator* rotator_ = nullptr;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<HeapBlockMemory> mem_;
  std::unique_ptr<Engine> engine_;
  SpaceId space_ = 0;
};

}  // namespace kvtier::test_util

namespace kvtier {
// Readable failure messages for error codes.
inline void PrintTo(ErrorCode code, std::ostream* os) { *os << errorName(code); }
}  // namespace kvtier
