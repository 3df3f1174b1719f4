// ColdService in-process: a real engine and a real RocksDB cold tier on a file system that can be
// made full. A failing disk pauses spilling and counts it, memory keeps serving, and spilling
// resumes when space returns.
#include "daemon/cold_service.h"

#include <gtest/gtest.h>
#include <kj/async-io.h>

#include <filesystem>

#include "tests/full_disk_fs.h"

namespace kvtier {
namespace {

Layout tinyLayout() {
  return Layout{"test/cold", 2, 1, 4, DType::kFloat16, 16, {}};
}  // 512 B blocks

// Holds KJ objects (throwing destructors), so it is a plain object each test makes, not a fixture.
struct ColdHarness {
  ColdHarness() {
    char tmpl[] = "/tmp/kvtier-coldsvc-XXXXXX";
    dir_ = mkdtemp(tmpl);
    fs_ = std::make_shared<test::FullDiskFileSystem>(rocksdb::FileSystem::Default());
    auto tier = ColdTier::open({.path = dir_ + "/cold", .capacityBytes = 0, .fileSystem = fs_});
    cold_ = std::make_unique<ColdService>(engine_, std::move(tier).value(),
                                          io_.provider->getTimer(), 5 * kj::MILLISECONDS);
    space_ = engine_.openSpace(tinyLayout(), saltFor("t")).value();
  }
  ~ColdHarness() {
    cold_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Puts a 64-token prompt (4 blocks) and drops its sequence: 4 sealed blocks, held by nothing.
  Status putPrompt(uint32_t seed) {
    std::vector<uint32_t> tokens(64);
    for (uint32_t i = 0; i < 64; ++i) tokens[i] = seed * 1000 + i;
    auto grant = engine_.put(1, space_, "p", 0, tokens, {}, {});
    if (!grant) return grant.error();
    for (const auto& b : grant->blocks) {
      std::memset(memory_.extentBase(b.extent) + b.offset, static_cast<int>(seed), b.bytes);
    }
    if (auto c = engine_.commit(grant->lease, kEnd); !c) return c.error();
    auto removed = engine_.remove(space_, "p", 0, kEnd);
    cold_->kick();
    return removed;
  }

  void settle() { cold_->whenSpillSettles().wait(io_.waitScope); }

  // Runs the event loop until `done()` or 5 s pass (waits on the retry timer, not a fixed sleep).
  template <typename F>
  bool runUntil(F done) {
    for (int i = 0; i < 1000 && !done(); ++i) {
      io_.provider->getTimer().afterDelay(5 * kj::MILLISECONDS).wait(io_.waitScope);
      cold_->kick();
    }
    return done();
  }

  kj::AsyncIoContext io_ = kj::setupAsyncIo();
  BlockPool pool_{{{0, 8 * 512}}};  // 8 blocks
  HeapBlockMemory memory_{pool_.extents()};
  Engine engine_{pool_, memory_};
  std::string dir_;
  std::shared_ptr<test::FullDiskFileSystem> fs_;
  std::unique_ptr<ColdService> cold_;
  SpaceId space_ = 0;

  void spilledBlocksAreDroppedFirstAndComeBack();
  void fullDiskPausesSpilling();
};

void ColdHarness::spilledBlocksAreDroppedFirstAndComeBack() {
  ASSERT_TRUE(putPrompt(1).ok());
  settle();
  EXPECT_EQ(engine_.stats().spilled, 4u);
  // Three more prompts through an 8-block pool: prompt 1's blocks, on disk, make room.
  for (uint32_t seed = 2; seed <= 4; ++seed) {
    ASSERT_TRUE(putPrompt(seed).ok()) << seed;
    settle();
  }
  std::vector<uint32_t> tokens(64);
  for (uint32_t i = 0; i < 64; ++i) tokens[i] = 1000 + i;
  auto plan = engine_.lookupPlan(space_, tokens, {}).value();
  ASSERT_EQ(plan.size(), 4u);
  std::vector<Key128> coldKeys;
  for (const auto& step : plan) {
    if (!step.hot) coldKeys.push_back(step.key);
  }
  ASSERT_FALSE(coldKeys.empty());
  cold_->promote(space_, coldKeys).wait(io_.waitScope);
  auto hit = engine_.lookup(1, space_, tokens, {}, "", {}).value();
  EXPECT_EQ(hit.matchedTokens, 64u);
  for (const auto& b : hit.blocks) {
    EXPECT_EQ(memory_.extentBase(b.extent)[b.offset + b.bytes - 1], 1) << "promoted bytes differ";
  }
  EXPECT_EQ(engine_.stats().promoted, coldKeys.size());
}

void ColdHarness::fullDiskPausesSpilling() {
  fs_->full = true;
  ASSERT_TRUE(putPrompt(1).ok());
  settle();
  EXPECT_EQ(cold_->stats().spillErrors, 1u);
  EXPECT_TRUE(cold_->stats().spillPaused);
  EXPECT_EQ(engine_.stats().spilled, 0u);
  // While paused, puts still succeed: unwritten blocks may be dropped (counted).
  ASSERT_TRUE(putPrompt(2).ok());
  ASSERT_TRUE(putPrompt(3).ok());
  EXPECT_GT(engine_.stats().evictedUnspilled, 0u);
  // Space returns: after the retry delay, spilling resumes on its own.
  fs_->full = false;
  ASSERT_TRUE(runUntil([&] { return engine_.stats().spilled > 0 && !cold_->stats().spillPaused; }))
      << "spilling did not resume";
}

TEST(ColdService, SpilledBlocksAreDroppedFirstAndComeBack) {
  ColdHarness().spilledBlocksAreDroppedFirstAndComeBack();
}

TEST(ColdService, FullDiskPausesSpillingMemoryKeepsServingAndSpillingResumes) {
  ColdHarness().fullDiskPausesSpilling();
}

}  // namespace
}  // namespace kvtier
