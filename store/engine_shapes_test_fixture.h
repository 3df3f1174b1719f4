// The fixtures of the engine's cache-shape tests (engine_shapes_test.cc: snapshots, windows and
// chunks; engine_blobs_test.cc: checkpoints and entries; engine_removal_test.cc: middle removal):
// a real engine over a BlockPool and heap memory, with the helpers of snapshots and blobs.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "store/engine.h"
#include "store/engine_test_util.h"

namespace kvtier::shapes_test {

using namespace test_util;  // smallLayout, Tags, tags, toks, kOwner, EngineHarness

inline constexpr uint32_t kBt = kTestBlockTokens;
// Checkpoints and entries live in blob blocks of 4 KiB and more (engine_shapes.cc); pools that hold
// blobs get room for some.
inline constexpr uint64_t kBlobBlock = 4096;

inline std::vector<uint32_t> slice(const std::vector<uint32_t>& v, size_t begin, size_t end) {
  return {v.begin() + begin, v.begin() + end};
}

// Blob contents (checkpoints, entries): a pattern that differs per seed.
inline std::vector<uint8_t> blob(uint8_t seed, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 37 + i * 13 + (i >> 8));
  return v;
}

// The engine harness plus the helpers of the cache shapes, shared by the fixtures below.
class Harness : protected EngineHarness {
 protected:
  // put + write the tokens as tags + commit everything.
  ::testing::AssertionResult write(std::string_view seq, uint64_t begin,
                                   const std::vector<uint32_t>& tokens,
                                   const SeqOptions& options = {}, OwnerId owner = kOwner) {
    return putAndCommit(space_, seq, begin, tokens, options, owner);
  }
  Tags read(std::string_view seq) { return readRange(seq, 0, kEnd); }

  ErrorCode getCode(std::string_view seq, uint64_t begin, uint64_t end) {
    auto g = engine_->get(space_, seq, begin, end);
    if (g.ok() && g->lease != 0) {
      EXPECT_TRUE(engine_->releaseRead(g->lease).ok());
    }
    return g.code();
  }

  SnapshotInfo snap(std::string_view seq, uint64_t from) {
    auto r = engine_->snapshot(space_, seq, from);
    if (!r.ok()) {
      ADD_FAILURE() << "snapshot '" << seq << "' from " << from << ": " << r.error();
      return {};
    }
    return *r;
  }
  Status restore(std::string_view seq, std::optional<SnapshotId> id, uint64_t target,
                 const SeqOptions& options = {}) {
    return engine_->restore(kOwner, space_, seq, id, target, options);
  }
  SnapshotInfo merge(const SnapshotInfo& a, const SnapshotInfo& b) {
    auto r = engine_->mergeSnapshots(space_, a.id, b.id);
    if (!r.ok()) {
      ADD_FAILURE() << "merge of [" << a.from << ", " << a.to << ") and [" << b.from << ", " << b.to
                    << "): " << r.error();
      return {};
    }
    return *r;
  }
  std::pair<SnapshotInfo, SnapshotInfo> split(const SnapshotInfo& s, uint64_t at) {
    auto r = engine_->splitSnapshot(space_, s.id, at);
    if (!r.ok()) {
      ADD_FAILURE() << "split of [" << s.from << ", " << s.to << ") at " << at << ": " << r.error();
      return {};
    }
    return *r;
  }

  // A checkpoint of blob(seed, n) at pos of seq, written and committed.
  ::testing::AssertionResult putCheckpoint(std::string_view seq, uint64_t pos, uint8_t seed,
                                           size_t n = 100) {
    auto g = engine_->putCheckpoint(space_, seq, pos, n);
    if (!g.ok()) return ::testing::AssertionFailure() << "putCheckpoint: " << g.error();
    if (g->bytes != n || g->block.bytes < n) {
      return ::testing::AssertionFailure()
             << "grant of " << g->bytes << " bytes in a block of " << g->block.bytes;
    }
    const auto bytes = blob(seed, n);
    std::memcpy(at(g->block), bytes.data(), n);
    auto c = engine_->commit(g->lease, kEnd);
    if (!c.ok()) return ::testing::AssertionFailure() << "commit: " << c.error();
    return ::testing::AssertionSuccess();
  }
  // The first n bytes of the checkpoint at pos (its read lease released), or nullopt.
  std::optional<std::vector<uint8_t>> checkpointBytes(std::string_view seq, uint64_t pos,
                                                      size_t n = 100) {
    auto g = engine_->getCheckpoint(space_, seq, pos);
    if (!g.ok()) return std::nullopt;
    const uint8_t* p = at(g->block);
    std::vector<uint8_t> out(p, p + n);
    EXPECT_TRUE(engine_->releaseRead(g->lease).ok());
    return out;
  }
  std::vector<uint64_t> checkpoints(std::string_view seq) {
    auto r = engine_->checkpointPositions(space_, seq);
    if (!r.ok()) {
      ADD_FAILURE() << "checkpointPositions '" << seq << "': " << r.error();
      return {};
    }
    return *r;
  }

  ::testing::AssertionResult putEntry(SpaceId sp, const Key128& key, uint8_t seed, size_t n) {
    auto g = engine_->putEntry(sp, key, n);
    if (!g.ok()) return ::testing::AssertionFailure() << "putEntry: " << g.error();
    if (g->bytes != n) return ::testing::AssertionFailure() << "grant of " << g->bytes << " bytes";
    const auto bytes = blob(seed, n);
    std::memcpy(at(g->block), bytes.data(), n);
    auto c = engine_->commit(g->lease, kEnd);
    if (!c.ok()) return ::testing::AssertionFailure() << "commit: " << c.error();
    return ::testing::AssertionSuccess();
  }
  // The entry's bytes (its read lease released), or nullopt when getEntry fails.
  std::optional<std::vector<uint8_t>> entryBytes(SpaceId sp, const Key128& key) {
    auto g = engine_->getEntry(sp, key);
    if (!g.ok()) return std::nullopt;
    const uint8_t* p = at(g->block);
    std::vector<uint8_t> out(p, p + g->bytes);
    EXPECT_TRUE(engine_->releaseRead(g->lease).ok());
    return out;
  }

  // Blocks held by sequences, snapshots and leases: in use and not merely cached in the index.
  uint64_t held() const {
    const EngineStats s = engine_->stats();
    return s.blocksUsed - s.blocksCached;
  }
  // Blocks in use that are not KV blocks of space_ (checkpoints and entries).
  uint64_t blobsUsed() const {
    return pool_->blocksUsed() - pool_->blocksUsed(engine_->space(space_).sizeClass);
  }
};

class ShapesTest : public ::testing::Test, protected Harness {
 protected:
  void SetUp() override { makeEngine(16); }
};

}  // namespace kvtier::shapes_test
