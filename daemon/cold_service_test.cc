// ColdService in-process: a real engine and a real RocksDB cold tier on a file system that can be
// made full. A failing disk pauses spilling and counts it, memory keeps serving, and spilling
// resumes when space returns.
#include "daemon/cold_service.h"

#include <gtest/gtest.h>
#include <kj/async-io.h>

#include <atomic>
#include <cstring>
#include <filesystem>

#include "tests/full_disk_fs.h"
#include "tests/temp_dir.h"
#include "transport/rpc_codec.h"

namespace kvtier {
namespace {

Layout tinyLayout() {
  return Layout{"test/cold", 2, 1, 4, DType::kFloat16, 16, {}};
}  // 512 B blocks

// Holds KJ objects (throwing destructors), so it is a plain object each test makes, not a fixture.
struct ColdHarness {
  ColdHarness() {
    fs_ = std::make_shared<test::FullDiskFileSystem>(rocksdb::FileSystem::Default());
    auto tier = ColdTier::open({.path = dir_.file("cold"), .capacityBytes = 0, .fileSystem = fs_});
    cold_ = std::make_unique<ColdService>(engine_, std::move(tier).value(),
                                          io_.provider->getTimer(), 5 * kj::MILLISECONDS);
    space_ = engine_.openSpace(tinyLayout(), saltFor("t")).value();
  }
  ~ColdHarness() { cold_.reset(); }

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
  test::TempDir dir_;  // removed after the cold tier that lives in it, also when a test fails
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

// ---------------------------------------------------------------------------------------------
// Snapshots across restarts, in-process: each Run is one life of a daemon over the same data
// directory (a fresh pool, engine and ColdService; the namespaces opened in another order).

using TempDirectory = test::TempDir;

// Heap extents where extent 1 stands in for a GPU pool: not addressable by the CPU, reached only
// through copy(), which counts.
class GpuStandInMemory final : public BlockMemory {
 public:
  explicit GpuStandInMemory(const std::vector<BlockPool::Extent>& extents) : heap_(extents) {}
  uint8_t* extentBase(uint32_t extent) override { return heap_.extentBase(extent); }
  bool hostAddressable(uint32_t extent) const override { return extent != 1; }
  void copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) override {
    ++copies;
    std::memcpy(dst, src, bytes);
  }
  std::atomic<int> copies{0};

 private:
  HeapBlockMemory heap_;
};

struct DaemonRun {
  DaemonRun(kj::AsyncIoContext& io, const std::string& dir, bool tenantBFirst = false) : io_(io) {
    auto tier = ColdTier::open({.path = dir + "/cold", .capacityBytes = 0, .fileSystem = nullptr});
    cold_ = std::make_unique<ColdService>(engine_, std::move(tier).value(),
                                          io_.provider->getTimer(), 5 * kj::MILLISECONDS);
    if (tenantBFirst) b_ = engine_.openSpace(tinyLayout(), saltFor("b")).value();
    a_ = engine_.openSpace(tinyLayout(), saltFor("a")).value();
    if (!tenantBFirst) b_ = engine_.openSpace(tinyLayout(), saltFor("b")).value();
  }
  ~DaemonRun() { cold_.reset(); }

  // 20 tokens of `space` (a sealed block and a partial one), every byte of block i = seed + i.
  void put(SpaceId space, std::string_view seq, uint8_t seed, uint8_t tier = 0) {
    std::vector<uint32_t> tokens(20);
    for (uint32_t i = 0; i < 20; ++i) tokens[i] = seed * 1000 + i;
    auto grant = engine_.put(1, space, seq, 0, tokens, {}, SeqOptions{.detached = true}, tier);
    ASSERT_TRUE(grant.ok()) << grant.error();
    for (size_t i = 0; i < grant->blocks.size(); ++i) {
      const auto& b = grant->blocks[i];
      std::memset(memory_.extentBase(b.extent) + b.offset, seed + static_cast<int>(i), b.bytes);
    }
    ASSERT_TRUE(engine_.commit(grant->lease, kEnd).ok());
  }

  // A snapshot of a fresh sequence "s" of tenant a, put with `seed`.
  SnapshotId snapshotOfNew(uint8_t seed) {
    put(a_, "s", seed);
    return engine_.snapshot(a_, "s", 0).value().id;
  }

  // The bytes of seq's blocks, checked against put's pattern.
  bool holds(SpaceId space, std::string_view seq, uint8_t seed) {
    auto g = engine_.get(space, seq, 0, kEnd);
    if (!g || g->end != 20 || g->blocks.size() != 2) return false;
    bool same = true;
    for (size_t i = 0; i < g->blocks.size(); ++i) {
      const uint8_t* p = memory_.extentBase(g->blocks[i].extent) + g->blocks[i].offset;
      for (uint32_t j = 0; j < g->blocks[i].bytes; ++j) same = same && p[j] == seed + i;
    }
    (void)engine_.releaseRead(g->lease);
    return same;
  }

  template <typename F>
  bool runUntil(F done) {
    for (int i = 0; i < 1000 && !done(); ++i) {
      io_.provider->getTimer().afterDelay(5 * kj::MILLISECONDS).wait(io_.waitScope);
    }
    return done();
  }

  // Waits for a load; returns the error it failed with (kOk when it resolved).
  ErrorCode load(SpaceId space, SnapshotId id) {
    ErrorCode code = ErrorCode::kOk;
    cold_->loadSnapshot(space, id)
        .catch_([&](kj::Exception&& e) { code = fromKjException(e).code(); })
        .wait(io_.waitScope);
    return code;
  }

  kj::AsyncIoContext& io_;
  BlockPool pool_{{{0, 16 * 512, 0}, {1, 16 * 512, 1}}};  // host pool, and a GPU stand-in
  GpuStandInMemory memory_{pool_.extents()};
  Engine engine_{pool_, memory_};
  std::unique_ptr<ColdService> cold_;
  SpaceId a_ = 0, b_ = 0;
};

TEST(ColdService, SnapshotsComeBackAfterARestartForTheirOwnTenantOnly) {
  TempDirectory dir;
  auto io = kj::setupAsyncIo();
  SnapshotId id = 0;
  {
    DaemonRun first(io, dir.path());
    id = first.snapshotOfNew(10);
    first.cold_->kick();  // what the server does after every snapshot call
    ASSERT_TRUE(first.runUntil([&] { return first.cold_->stats().tier.snapshots == 1; }));
    EXPECT_TRUE(first.engine_.snapshotOnDisk(first.a_, id));
    // Gone without a flush, as after SIGKILL.
  }
  // The namespaces are opened in another order: renumbered.
  DaemonRun second(io, dir.path(), /*tenantBFirst=*/true);
  EXPECT_GT(second.engine_.nextSnapshotId(), id) << "ids stay unique across restarts";
  EXPECT_EQ(second.load(second.b_, id), ErrorCode::kOk) << "nothing for tenant b: not an error";
  EXPECT_FALSE(second.engine_.hasSnapshot(second.b_, id));
  EXPECT_EQ(second.engine_.snapshotInfo(second.b_, id).code(), ErrorCode::kNotFound);
  EXPECT_EQ(second.load(second.a_, id), ErrorCode::kOk);
  ASSERT_TRUE(second.engine_.hasSnapshot(second.a_, id));
  EXPECT_EQ(second.engine_.snapshotInfo(second.a_, id).value().to, 20u);
  ASSERT_TRUE(second.engine_.restore(1, second.a_, "x", id, 20, {}).ok());
  EXPECT_TRUE(second.holds(second.a_, "x", 10)) << "restored bytes differ";
  EXPECT_EQ(second.engine_.stats().blocksPinned, 0u);

  // A drop deletes it from disk as well; a drop by the other tenant finds nothing.
  ErrorCode foreign = ErrorCode::kOk;
  second.cold_->dropSnapshot(second.b_, id)
      .catch_([&](kj::Exception&& e) { foreign = fromKjException(e).code(); })
      .wait(io.waitScope);
  EXPECT_EQ(foreign, ErrorCode::kNotFound);
  second.cold_->dropSnapshot(second.a_, id).wait(io.waitScope);
  EXPECT_TRUE(second.runUntil([&] { return second.cold_->stats().tier.snapshots == 0; }));
  EXPECT_EQ(second.cold_->stats().tier.snapshotsDropped, 0u);
}

// A snapshot of blocks in GPU memory is written through host staging copies (the writer never
// reads GPU memory in place) and comes back after a restart with the same bytes.
TEST(ColdService, ASnapshotOfGpuBlocksIsStagedThroughHostMemory) {
  TempDirectory dir;
  auto io = kj::setupAsyncIo();
  SnapshotId id = 0;
  {
    DaemonRun first(io, dir.path());
    first.put(first.a_, "s", 30, /*tier=*/1);
    ASSERT_EQ(first.engine_.get(first.a_, "s", 0, kEnd).value().blocks[0].extent, 1u);
    const int before = first.memory_.copies.load();
    id = first.engine_.snapshot(first.a_, "s", 0).value().id;
    first.cold_->kick();
    ASSERT_TRUE(first.runUntil([&] { return first.cold_->stats().tier.snapshots == 1; }));
    EXPECT_GE(first.memory_.copies.load() - before, 2) << "both GPU blocks staged";
  }
  DaemonRun second(io, dir.path());
  EXPECT_EQ(second.load(second.a_, id), ErrorCode::kOk);
  ASSERT_TRUE(second.engine_.restore(1, second.a_, "x", id, 20, {}).ok());
  EXPECT_TRUE(second.holds(second.a_, "x", 30)) << "restored bytes differ";
  EXPECT_EQ(second.engine_.stats().blocksPinned, 0u);
}

TEST(ColdService, ADropOfASnapshotOnlyOnDiskDeletesIt) {
  TempDirectory dir;
  auto io = kj::setupAsyncIo();
  SnapshotId id = 0;
  {
    DaemonRun first(io, dir.path());
    id = first.snapshotOfNew(10);
    first.cold_->flushAll(io.waitScope);  // as on SIGTERM
    EXPECT_EQ(first.cold_->stats().tier.snapshots, 1u);
  }
  DaemonRun second(io, dir.path());
  EXPECT_EQ(second.engine_.nextSnapshotId(), id + 1) << "a graceful stop skips no ids";
  second.cold_->dropSnapshot(second.a_, id).wait(io.waitScope);
  EXPECT_EQ(second.cold_->stats().tier.snapshots, 0u);
  EXPECT_EQ(second.load(second.a_, id), ErrorCode::kOk);
  EXPECT_FALSE(second.engine_.hasSnapshot(second.a_, id));
}

TEST(ColdService, ASnapshotWhoseRecordIsCorruptIsDroppedAndChangesNothing) {
  TempDirectory dir;
  auto io = kj::setupAsyncIo();
  SnapshotId id = 0;
  {
    DaemonRun first(io, dir.path());
    id = first.snapshotOfNew(10);
    first.cold_->flushAll(io.waitScope);
  }
  {
    auto tier =
        ColdTier::open({.path = dir.path() + "/cold", .capacityBytes = 0, .fileSystem = nullptr})
            .value();
    const SnapshotKey key{tinyLayout().fingerprint(), saltFor("a"), id};
    std::string value;
    auto* db = tier->rawDb();
    ASSERT_TRUE(
        db->Get(rocksdb::ReadOptions(), tier->snapshotsFamily(), key.recordKey(1), &value).ok());
    value.back() ^= 0x01;  // the partial block's own record
    ASSERT_TRUE(
        db->Put(rocksdb::WriteOptions(), tier->snapshotsFamily(), key.recordKey(1), value).ok());
  }
  DaemonRun second(io, dir.path());
  const uint64_t used = second.engine_.stats().blocksUsed;
  EXPECT_EQ(second.load(second.a_, id), ErrorCode::kChecksumMismatch);
  EXPECT_FALSE(second.engine_.hasSnapshot(second.a_, id));
  EXPECT_EQ(second.engine_.stats().blocksPinned, 0u);
  EXPECT_EQ(second.engine_.stats().blocksUsed, used + 1) << "only the sealed block, cached";
  EXPECT_EQ(second.cold_->stats().tier.snapshotsDropped, 1u);
  EXPECT_EQ(second.cold_->stats().tier.corruptDropped, 1u);
  EXPECT_EQ(second.cold_->stats().tier.snapshots, 0u);
  EXPECT_EQ(second.load(second.a_, id), ErrorCode::kOk) << "gone: the engine answers NOT_FOUND";
}

TEST(ColdService, SnapshotIdsWaitForTheirReservationOnDisk) {
  TempDirectory dir;
  auto io = kj::setupAsyncIo();
  DaemonRun run(io, dir.path());
  run.put(run.a_, "s", 10);
  // Pretend almost every reserved id was used: the next call reserves more on the worker.
  const SnapshotId next = run.engine_.nextSnapshotId();
  run.engine_.setSnapshotIds(next, next + 1);
  ASSERT_TRUE(run.engine_.snapshot(run.a_, "s", 0).ok());
  EXPECT_EQ(run.engine_.snapshot(run.a_, "s", 0).code(), ErrorCode::kUnavailable);
  KJ_IF_MAYBE (wait, run.cold_->whenRetryable(ErrorCode::kUnavailable)) {
    wait->wait(io.waitScope);
  } else {
    FAIL() << "no reservation started";
  }
  EXPECT_GE(run.engine_.snapshotIdLimit(), next + ColdService::kSnapshotIdChunk);
  EXPECT_TRUE(run.engine_.snapshot(run.a_, "s", 0).ok());
  EXPECT_TRUE(run.cold_->whenRetryable(ErrorCode::kUnavailable) == nullptr)
      << "plenty of ids: waiting cannot help another UNAVAILABLE";
}

}  // namespace
}  // namespace kvtier
