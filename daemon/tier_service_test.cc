// TierService with the engine's GPU-tier rules, in process: a host extent and a second extent
// standing in for a GPU pool (heap memory; the daemon's copier is cudaMemcpyAsync, here memcpy).
#include "daemon/tier_service.h"

#include <gtest/gtest.h>
#include <kj/async.h>
#include <kj/debug.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "store/engine_test_util.h"

namespace kvtier {
namespace {

using namespace test_util;

constexpr uint32_t kBt = kTestBlockTokens;
constexpr uint8_t kGpu = 1;

// smallLayout() (blocks of 512 bytes), or the same with blocks of 1 MiB.
Layout layoutOf(bool largeBlocks) {
  Layout l = smallLayout();
  if (largeBlocks) {
    l.numKvHeads = 8;
    l.headDim = 1024;
  }
  return l;
}

struct Rig {
  // A host pool of 16 blocks and a GPU pool of `gpuBlocks`.
  explicit Rig(bool largeBlocks = false, uint64_t gpuBlocks = 4)
      : layout(layoutOf(largeBlocks)),
        pool{{{0, 16 * layout.blockBytes(), 0}, {1, gpuBlocks * layout.blockBytes(), kGpu}}} {}

  Layout layout;
  BlockPool pool;
  HeapBlockMemory mem{pool.extents()};
  Engine engine{pool, mem};
  SpaceId space = engine.openSpace(layout, saltFor("t")).value();
  std::atomic<bool> copierWorks{true};
  std::atomic<int> copies{0};

  BlockCopier copier() {
    return [this](std::span<const BlockCopy> cs) {
      for (const auto& c : cs) std::memcpy(c.dst, c.src, c.bytes);
      copies += static_cast<int>(cs.size());
      return copierWorks.load();
    };
  }
  void cache(const std::vector<uint32_t>& tokens, uint8_t tier) {
    cacheTagged(engine, mem, space, "s", tokens, tier);
  }
  // The extent of each block a lookup finds (every tag checked).
  std::vector<uint32_t> where(const std::vector<uint32_t>& tokens) {
    return lookupExtents(engine, mem, space, tokens);
  }
  std::vector<Key128> keysOf(const std::vector<uint32_t>& tokens) {
    std::vector<Key128> keys;
    auto plan = engine.lookupPlan(space, tokens, {});
    EXPECT_TRUE(plan.ok());
    if (!plan.ok()) return keys;
    for (const auto& step : *plan) keys.push_back(step.key);
    return keys;
  }
};

TEST(TierService, DemotesWhenTheGpuPoolRunsLowAndKeepsTheBytes) {
  kj::EventLoop loop;
  kj::WaitScope ws(loop);
  Rig rig;
  TierService tiers(rig.engine, rig.copier(), {kGpu}, 0.5);
  const auto tokens = toks(4 * kBt, 10);
  rig.cache(tokens, kGpu);  // the GPU pool is full
  tiers.kick();
  EXPECT_TRUE(tiers.canMakeRoom());
  tiers.whenSettles().wait(ws);
  // Demoted down to the mark: at least half of the GPU pool free, oldest blocks first.
  const EngineStats s = rig.engine.stats();
  EXPECT_GE(s.gpuDemoted, 2u);
  EXPECT_LE(s.gpuBlocksUsed, 2u);
  EXPECT_EQ(s.blocksPinned, 0u);
  EXPECT_EQ(s.evictions, 0u);
  const auto extents = rig.where(tokens);
  ASSERT_EQ(extents.size(), 4u) << "every block still hits, with its bytes";
  EXPECT_EQ(extents[0], 0u) << "the oldest block went to the host pool";
}

TEST(TierService, APutShortOfGpuBlocksSucceedsOnceDemotionMadeRoom) {
  kj::EventLoop loop;
  kj::WaitScope ws(loop);
  Rig rig;
  TierService tiers(rig.engine, rig.copier(), {kGpu}, 0.25);
  rig.cache(toks(4 * kBt, 10), kGpu);
  auto full = rig.engine.put(1, rig.space, "x", 0, toks(kBt, 99), {}, {}, kGpu);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().code(), ErrorCode::kFull);
  tiers.kick();
  tiers.whenSettles().wait(ws);
  auto g = rig.engine.put(1, rig.space, "x", 0, toks(kBt, 99), {}, {}, kGpu);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(rig.engine.abortWrite(g->lease).ok());
}

// A put that needs more GPU blocks than are free, while the pool is above its low-water mark:
// makeRoom demotes anyway, and the put then fits.
TEST(TierService, MakeRoomDemotesWhateverTheMark) {
  kj::EventLoop loop;
  kj::WaitScope ws(loop);
  Rig rig;
  TierService tiers(rig.engine, rig.copier(), {kGpu}, 0.25);
  rig.cache(toks(2 * kBt, 10), kGpu);  // 2 of 4 GPU blocks free: above the mark
  tiers.kick();
  EXPECT_FALSE(tiers.canMakeRoom()) << "nothing to do at the mark";
  auto big = rig.engine.put(1, rig.space, "x", 0, toks(3 * kBt, 99), {}, {}, kGpu);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code(), ErrorCode::kFull);
  tiers.makeRoom(kGpu);
  EXPECT_TRUE(tiers.canMakeRoom());
  tiers.whenSettles().wait(ws);
  auto g = rig.engine.put(1, rig.space, "x", 0, toks(3 * kBt, 99), {}, {}, kGpu);
  ASSERT_TRUE(g.ok()) << g.error();
  EXPECT_TRUE(rig.engine.abortWrite(g->lease).ok());
  EXPECT_EQ(rig.where(toks(2 * kBt, 10)).size(), 2u) << "the demoted blocks still hit";
}

// What a server call short of GPU blocks waits for: a demotion batch, and only for FULL in a GPU
// tier that has something to demote.
TEST(TierService, OnlyAFullGpuTierWithBlocksToDemoteIsWorthWaitingFor) {
  kj::EventLoop loop;
  kj::WaitScope ws(loop);
  Rig rig;
  TierService tiers(rig.engine, rig.copier(), {kGpu}, 0.25);
  EXPECT_TRUE(tiers.whenRetryable(ErrorCode::kFull, kGpu) == nullptr) << "nothing to demote";
  rig.cache(toks(2 * kBt, 10), kGpu);
  EXPECT_TRUE(tiers.whenRetryable(ErrorCode::kFull, 0) == nullptr) << "the host tier";
  EXPECT_TRUE(tiers.whenRetryable(ErrorCode::kNotFound, kGpu) == nullptr);
  KJ_IF_MAYBE (wait, tiers.whenRetryable(ErrorCode::kFull, kGpu)) {
    wait->wait(ws);
  } else {
    FAIL() << "a demotion batch should have started";
  }
  EXPECT_EQ(rig.engine.stats().gpuDemoted, 2u);
}

TEST(TierService, PromoteBringsHostBlocksToTheGpu) {
  kj::EventLoop loop;
  kj::WaitScope ws(loop);
  Rig rig;
  TierService tiers(rig.engine, rig.copier(), {kGpu}, 0.0);
  const auto tokens = toks(2 * kBt, 500);
  rig.cache(tokens, 0);
  KJ_ASSERT_NONNULL(tiers.bringTo(rig.space, rig.keysOf(tokens), kGpu)).wait(ws);
  EXPECT_EQ(rig.where(tokens), (std::vector<uint32_t>{1, 1}));
  EXPECT_EQ(rig.engine.stats().gpuPromoted, 2u);
  // Already there: nothing to wait for, the lookup answers at once.
  EXPECT_TRUE(tiers.bringTo(rig.space, rig.keysOf(tokens), kGpu) == nullptr);
}

TEST(TierService, BytesChangedInTheHostPoolNeverReachTheGpu) {
  kj::EventLoop loop;
  kj::WaitScope ws(loop);
  Rig rig;
  TierService tiers(rig.engine, rig.copier(), {kGpu}, 0.0);
  const auto tokens = toks(2 * kBt, 800);
  rig.cache(tokens, 0);  // sealed with checksums the engine took from the bytes
  {
    // A stray write changes a byte of the second block after its seal.
    auto r = rig.engine.lookup(kOwner, rig.space, tokens, {}, "", SeqOptions{});
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->blocks.size(), 2u);
    rig.mem.extentBase(r->blocks[1].extent)[r->blocks[1].offset + 300] ^= 1;
    ASSERT_TRUE(rig.engine.releaseRead(r->lease).ok());
  }
  const uint64_t used = rig.engine.stats().blocksUsed;
  KJ_ASSERT_NONNULL(tiers.bringTo(rig.space, rig.keysOf(tokens), kGpu)).wait(ws);
  // The first block moved; the damaged one moved nowhere and left the index and the pool.
  EXPECT_EQ(rig.where(tokens), (std::vector<uint32_t>{1}));
  const EngineStats s = rig.engine.stats();
  EXPECT_EQ(s.gpuPromoted, 1u);
  EXPECT_EQ(s.corruptBlocks, 1u);
  EXPECT_EQ(s.gpuBlocksUsed, 1u);
  EXPECT_EQ(s.blocksUsed, used - 2);  // the promoted block's host copy and the damaged one
  EXPECT_EQ(s.blocksPinned, 0u);
}

// A batch of several MiB is checked on threads of its own, a promotion's while it is copied: a
// damaged block anywhere in it is found, the others move.
TEST(TierService, ALargeBatchIsCheckedWholeWhileItMoves) {
  kj::EventLoop loop;
  kj::WaitScope ws(loop);
  Rig rig(true, 16);  // blocks of 1 MiB
  ASSERT_EQ(rig.layout.blockBytes(), 1u << 20);
  TierService tiers(rig.engine, rig.copier(), {kGpu}, 0.0);
  const auto tokens = toks(12 * kBt, 1000);
  rig.cache(tokens, 0);
  const size_t bad[] = {0, 5, 11};
  {
    auto r = rig.engine.lookup(kOwner, rig.space, tokens, {}, "", SeqOptions{});
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->blocks.size(), 12u);
    for (size_t b : bad) rig.mem.extentBase(r->blocks[b].extent)[r->blocks[b].offset + 4099] ^= 4;
    ASSERT_TRUE(rig.engine.releaseRead(r->lease).ok());
  }
  KJ_ASSERT_NONNULL(tiers.bringTo(rig.space, rig.keysOf(tokens), kGpu)).wait(ws);
  // Block 0 is damaged: the prefix ends before it, and the 9 good blocks were promoted.
  EXPECT_TRUE(rig.where(tokens).empty());
  const EngineStats s = rig.engine.stats();
  EXPECT_EQ(s.gpuPromoted, 9u);
  EXPECT_EQ(s.corruptBlocks, 3u);
  EXPECT_EQ(s.gpuBlocksUsed, 9u);
  EXPECT_EQ(s.blocksPinned, 0u);
}

// The same for a large demotion: the copies that are not the writer's bytes are dropped.
TEST(TierService, ALargeDemotionDropsOnlyTheDamagedCopies) {
  kj::EventLoop loop;
  kj::WaitScope ws(loop);
  Rig rig(true, 16);
  std::atomic<bool> damage{false};
  auto copier = [&](std::span<const BlockCopy> cs) {
    for (size_t i = 0; i < cs.size(); ++i) {
      std::memcpy(cs[i].dst, cs[i].src, cs[i].bytes);
      if (damage && i % 4 == 1) cs[i].dst[i * 1000] ^= 1;
    }
    return true;
  };
  TierService tiers(rig.engine, copier, {kGpu}, 0.0);
  const auto tokens = toks(12 * kBt, 1100);
  rig.cache(tokens, 0);
  KJ_ASSERT_NONNULL(tiers.bringTo(rig.space, rig.keysOf(tokens), kGpu)).wait(ws);
  ASSERT_EQ(rig.engine.stats().gpuBlocksUsed, 12u);
  damage = true;
  tiers.makeRoom(kGpu);
  tiers.whenSettles().wait(ws);
  const EngineStats s = rig.engine.stats();
  EXPECT_EQ(s.gpuDemoted + s.corruptBlocks, 12u);
  EXPECT_EQ(s.corruptBlocks, 3u);
  EXPECT_EQ(s.blocksUsed, 9u);  // the good copies, in the host pool
  EXPECT_EQ(s.gpuBlocksUsed, 0u);
  EXPECT_EQ(s.blocksPinned, 0u);
}

TEST(TierService, ADemotionWhoseCopyIsNotTheWritersDropsTheBlock) {
  kj::EventLoop loop;
  kj::WaitScope ws(loop);
  Rig rig;
  // A copier that damages what it writes once told to (a fault on the way, or in GPU memory).
  std::atomic<bool> damage{false};
  auto copier = [&](std::span<const BlockCopy> cs) {
    for (const auto& c : cs) {
      std::memcpy(c.dst, c.src, c.bytes);
      if (damage) c.dst[c.bytes - 1] ^= 1;
    }
    return true;
  };
  TierService tiers(rig.engine, copier, {kGpu}, 0.0);
  // Blocks written to the host pool carry their writer's checksum to the GPU and back; a GPU
  // block without one (written there) gets it from its bytes as it reaches host memory.
  const auto tokens = toks(2 * kBt, 900);
  rig.cache(tokens, 0);
  KJ_ASSERT_NONNULL(tiers.bringTo(rig.space, rig.keysOf(tokens), kGpu)).wait(ws);
  ASSERT_EQ(rig.where(tokens), (std::vector<uint32_t>{1, 1}));
  damage = true;
  tiers.makeRoom(kGpu);
  tiers.whenSettles().wait(ws);
  const EngineStats s = rig.engine.stats();
  EXPECT_EQ(s.gpuDemoted, 0u);
  EXPECT_EQ(s.corruptBlocks, 2u);
  EXPECT_EQ(s.blocksPinned, 0u);
  EXPECT_EQ(s.blocksUsed, 0u);  // neither the host copies nor the GPU blocks were kept
  EXPECT_EQ(s.gpuBlocksUsed, 0u);
  EXPECT_TRUE(rig.where(tokens).empty());
}

TEST(TierService, AFailedCopyMovesNothingAndLeaksNothing) {
  kj::EventLoop loop;
  kj::WaitScope ws(loop);
  Rig rig;
  rig.copierWorks = false;
  TierService tiers(rig.engine, rig.copier(), {kGpu}, 0.0);
  const auto tokens = toks(2 * kBt, 500);
  rig.cache(tokens, 0);
  KJ_ASSERT_NONNULL(tiers.bringTo(rig.space, rig.keysOf(tokens), kGpu)).wait(ws);
  EXPECT_EQ(rig.where(tokens), (std::vector<uint32_t>{0, 0}));
  const EngineStats s = rig.engine.stats();
  EXPECT_EQ(s.gpuPromoted, 0u);
  EXPECT_EQ(s.gpuBlocksUsed, 0u);
  EXPECT_EQ(s.blocksPinned, 0u);
}

TEST(TierService, ACancelledPromoteStillFinishesAndUnpins) {
  kj::EventLoop loop;
  kj::WaitScope ws(loop);
  Rig rig;
  TierService tiers(rig.engine, rig.copier(), {kGpu}, 0.0);
  const auto tokens = toks(2 * kBt, 500);
  rig.cache(tokens, 0);
  {
    auto dropped = tiers.bringTo(rig.space, rig.keysOf(tokens), kGpu);
    EXPECT_GT(rig.engine.stats().blocksPinned, 0u);
  }  // the lookup that waited went away
  for (int i = 0; i < 1000 && rig.engine.stats().blocksPinned > 0; ++i) {
    ws.poll();  // runs what the worker's finished copy queued back to this loop
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(rig.engine.stats().blocksPinned, 0u);
  EXPECT_EQ(rig.where(tokens), (std::vector<uint32_t>{1, 1}));
}

}  // namespace
}  // namespace kvtier
