// The engine's GPU-tier rules, in process: a pool with a host extent (tier 0) and a second extent
// standing in for GPU 0's pool (tier 1). The daemon moves bytes with CUDA; here a test BlockMemory
// copies them and can declare the GPU extent unaddressable by the CPU, as real device memory is.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "store/engine.h"
#include "store/engine_test_util.h"

namespace kvtier {
namespace {

using namespace test_util;

constexpr uint32_t kBt = kTestBlockTokens;
constexpr uint32_t kBlockBytes = 512;
constexpr uint8_t kGpu = 1;  // tier of GPU 0
constexpr uint32_t kHostExtent = 0, kGpuExtent = 1;

// Heap extents; the GPU one may be declared unaddressable. Counts copies between blocks.
class TieredTestMemory final : public BlockMemory {
 public:
  explicit TieredTestMemory(const std::vector<BlockPool::Extent>& extents) : heap_(extents) {}
  uint8_t* extentBase(uint32_t extent) override { return heap_.extentBase(extent); }
  bool hostAddressable(uint32_t extent) const override {
    return extent != kGpuExtent || gpuAddressable;
  }
  void copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) override {
    ++copies;
    std::memcpy(dst, src, bytes);
  }
  bool gpuAddressable = true;
  int copies = 0;

 private:
  HeapBlockMemory heap_;
};

struct Harness {
  Layout layout = smallLayout();
  std::unique_ptr<BlockPool> pool;
  std::unique_ptr<TieredTestMemory> mem;
  std::unique_ptr<Engine> engine;
  SpaceId space = 0;

  Harness(uint64_t hostBlocks, uint64_t gpuBlocks,
          std::unique_ptr<EvictionPolicy> policy = nullptr) {
    pool = std::make_unique<BlockPool>(std::vector<BlockPool::Extent>{
        {kHostExtent, hostBlocks * kBlockBytes, 0}, {kGpuExtent, gpuBlocks * kBlockBytes, kGpu}});
    mem = std::make_unique<TieredTestMemory>(pool->extents());
    engine = std::make_unique<Engine>(*pool, *mem, std::move(policy));
    space = engine->openSpace(layout, saltFor("t")).value();
  }
  uint8_t* at(const BlockLocation& l) { return mem->extentBase(l.extent) + l.offset; }

  void cache(const std::string& seq, const std::vector<uint32_t>& tokens, uint8_t tier) {
    cacheTagged(*engine, *mem, space, seq, tokens, tier);
  }
  // Looks tokens up; returns the blocks' extents (every tag checked).
  std::vector<uint32_t> lookupExtents(const std::vector<uint32_t>& tokens, size_t expectBlocks) {
    std::vector<uint32_t> extents = test_util::lookupExtents(*engine, *mem, space, tokens);
    EXPECT_EQ(extents.size(), expectBlocks);
    return extents;
  }
  void runMoves(const std::vector<MoveTicket>& moves, bool copied = true) {
    for (const auto& m : moves) {
      if (copied) mem->copy(at(m.dst), at(m.src), m.src.bytes);
    }
    engine->finishMoves(moves, copied);
  }
};

TEST(EngineTiers, PutInAGpuTierAllocatesThere) {
  Harness h(8, 4);
  h.cache("a", toks(2 * kBt, 100), kGpu);
  EXPECT_EQ(h.lookupExtents(toks(2 * kBt, 100), 2),
            (std::vector<uint32_t>{kGpuExtent, kGpuExtent}));
  const EngineStats s = h.engine->stats();
  EXPECT_EQ(s.gpuBlocksUsed, 2u);
  EXPECT_EQ(s.gpuBlocksTotal, 4u);
  EXPECT_EQ(s.blocksUsed, 0u) << "host pool untouched";
}

TEST(EngineTiers, PutToATierTheDaemonDoesNotHaveIsInvalid) {
  Harness h(8, 4);
  auto g = h.engine->put(kOwner, h.space, "a", 0, toks(kBt, 1), {}, {}, 3);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(h.engine->stats().writeLeases, 0u);
}

TEST(EngineTiers, DemotionMovesTheOldestGpuBlocksToHostWithTheSameBytes) {
  Harness h(8, 4);
  h.cache("old", toks(kBt, 1000), kGpu);
  h.cache("mid", toks(kBt, 2000), kGpu);
  h.cache("new", toks(kBt, 3000), kGpu);
  // 1 of 4 GPU blocks free: below a 50 % low-water mark.
  auto moves = h.engine->takeDemoteBatch(kGpu, 2, 0.5);
  ASSERT_EQ(moves.size(), 2u);
  EXPECT_EQ(moves[0].src.extent, kGpuExtent);
  EXPECT_EQ(moves[0].dst.extent, kHostExtent);
  h.runMoves(moves);
  EXPECT_EQ(h.lookupExtents(toks(kBt, 1000), 1), std::vector<uint32_t>{kHostExtent}) << "oldest";
  EXPECT_EQ(h.lookupExtents(toks(kBt, 2000), 1), std::vector<uint32_t>{kHostExtent});
  EXPECT_EQ(h.lookupExtents(toks(kBt, 3000), 1), std::vector<uint32_t>{kGpuExtent})
      << "newest stays";
  const EngineStats s = h.engine->stats();
  EXPECT_EQ(s.gpuDemoted, 2u);
  EXPECT_EQ(s.gpuBlocksUsed, 1u);
  EXPECT_EQ(s.blocksUsed, 2u);
  EXPECT_EQ(s.evictions, 0u) << "a demotion is not an eviction: nothing was lost";
  EXPECT_EQ(s.blocksPinned, 0u);
}

// A GPU pool demotes in the order the eviction policy would evict: what the host pool would drop
// first leaves the GPU first. A 2-block document read again, then two one-time prompts: LRU
// demotes the document first (least recently used), tail before head; ARC and 2Q demote the
// one-time prompts first and keep the reused document longest, still tail before head.
TEST(EngineTiers, DemotionFollowsTheEvictionPolicysOrder) {
  struct Case {
    EvictionKind kind;
    const char* order;
  };
  for (const Case& c :
       {Case{EvictionKind::kLru, "doc1 doc0 x y"}, Case{EvictionKind::kArc, "x y doc1 doc0"},
        Case{EvictionKind::kTwoQ, "x y doc1 doc0"}}) {
    SCOPED_TRACE(evictionName(c.kind));
    Harness h(8, 4, makeEvictionPolicy(c.kind));
    const auto doc = toks(2 * kBt, 100), x = toks(kBt, 300), y = toks(kBt, 400);
    h.cache("doc", doc, kGpu);
    EXPECT_EQ(h.lookupExtents(doc, 2), (std::vector<uint32_t>{kGpuExtent, kGpuExtent}));
    h.cache("x", x, kGpu);
    h.cache("y", y, kGpu);
    auto moves = h.engine->takeDemoteBatch(kGpu, 4, 1.0);
    ASSERT_EQ(moves.size(), 4u);
    h.runMoves(moves);
    // Which content each move carried: its destination is where a lookup now finds it.
    std::vector<std::string> names(moves.size());
    const auto name = [&](const std::vector<uint32_t>& tokens, const std::string& base) {
      auto r = h.engine->lookup(kOwner, h.space, tokens, {}, "", {});
      ASSERT_TRUE(r.ok());
      for (size_t b = 0; b < r->blocks.size(); ++b) {
        for (size_t m = 0; m < moves.size(); ++m) {
          if (moves[m].dst == r->blocks[b]) {
            names[m] = r->blocks.size() > 1 ? base + std::to_string(b) : base;
          }
        }
      }
      EXPECT_TRUE(h.engine->releaseRead(r->lease).ok());
    };
    name(doc, "doc");
    name(x, "x");
    name(y, "y");
    std::string order;
    for (const std::string& n : names) order += (order.empty() ? "" : " ") + n;
    EXPECT_EQ(order, c.order);
    EXPECT_EQ(h.engine->stats().gpuBlocksUsed, 0u);
  }
}

TEST(EngineTiers, NoDemotionAboveTheLowWaterMark) {
  Harness h(8, 4);
  h.cache("a", toks(kBt, 1), kGpu);
  EXPECT_TRUE(h.engine->takeDemoteBatch(kGpu, 4, 0.5).empty()) << "3 of 4 free";
  EXPECT_TRUE(h.engine->takeDemoteBatch(0, 4, 1.0).empty()) << "the host tier is not demoted";
}

TEST(EngineTiers, HeldOrPinnedGpuBlocksAreNeverDemoted) {
  Harness h(8, 2);
  // One block held by a live sequence, one pinned by a read lease: nothing may move.
  auto g = h.engine->put(kOwner, h.space, "live", 0, toks(kBt, 1), {}, {}, kGpu);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(h.engine->commit(g->lease, kEnd).ok());
  auto g2 = h.engine->put(kOwner, h.space, "gone", 0, toks(kBt, 500), {}, {}, kGpu);
  ASSERT_TRUE(g2.ok());
  ASSERT_TRUE(h.engine->commit(g2->lease, kEnd).ok());
  ASSERT_TRUE(h.engine->remove(h.space, "gone", 0, kEnd).ok());
  auto read = h.engine->lookup(kOwner, h.space, toks(kBt, 500), {}, "", {});
  ASSERT_TRUE(read.ok());
  ASSERT_EQ(read->blocks.size(), 1u);
  EXPECT_TRUE(h.engine->takeDemoteBatch(kGpu, 4, 1.0).empty());
  EXPECT_TRUE(h.engine->releaseRead(read->lease).ok());
  auto moves = h.engine->takeDemoteBatch(kGpu, 4, 1.0);
  ASSERT_EQ(moves.size(), 1u) << "released: now it may move; the live sequence's block may not";
  EXPECT_EQ(moves[0].src, read->blocks[0]);
  h.runMoves(moves);
}

TEST(EngineTiers, ABlockTakenDuringItsMoveStaysWhereItWas) {
  Harness h(8, 2);
  h.cache("a", toks(kBt, 7), kGpu);
  auto moves = h.engine->takeDemoteBatch(kGpu, 1, 1.0);
  ASSERT_EQ(moves.size(), 1u);
  // A reader pins the block while its bytes travel: the move must not free it under the reader.
  auto read = h.engine->lookup(kOwner, h.space, toks(kBt, 7), {}, "", {});
  ASSERT_TRUE(read.ok());
  ASSERT_EQ(read->blocks.size(), 1u);
  EXPECT_EQ(read->blocks[0], moves[0].src);
  h.runMoves(moves);
  EXPECT_EQ(readTag(h.layout, h.at(read->blocks[0]), 3), 7u + 3);
  EXPECT_TRUE(h.engine->releaseRead(read->lease).ok());
  EXPECT_EQ(h.lookupExtents(toks(kBt, 7), 1), std::vector<uint32_t>{kGpuExtent});
  const EngineStats s = h.engine->stats();
  EXPECT_EQ(s.gpuDemoted, 0u);
  EXPECT_EQ(s.blocksUsed, 0u) << "the copy was freed";
  EXPECT_EQ(s.blocksPinned, 0u);
}

TEST(EngineTiers, AFailedCopyChangesNothing) {
  Harness h(8, 2);
  h.cache("a", toks(kBt, 7), kGpu);
  auto moves = h.engine->takeDemoteBatch(kGpu, 1, 1.0);
  ASSERT_EQ(moves.size(), 1u);
  h.runMoves(moves, /*copied=*/false);
  EXPECT_EQ(h.lookupExtents(toks(kBt, 7), 1), std::vector<uint32_t>{kGpuExtent});
  EXPECT_EQ(h.engine->stats().blocksUsed, 0u);
  EXPECT_EQ(h.engine->stats().gpuBlocksUsed, 1u);
}

TEST(EngineTiers, PromotionBringsHostBlocksToTheGpuWithTheSameBytes) {
  Harness h(8, 4);
  const auto tokens = toks(3 * kBt, 40);
  h.cache("a", tokens, 0);
  auto plan = h.engine->lookupPlan(h.space, tokens, {});
  ASSERT_TRUE(plan.ok());
  std::vector<Key128> keys;
  for (const auto& step : *plan) keys.push_back(step.key);
  ASSERT_EQ(keys.size(), 3u);
  auto moves = h.engine->beginMovesTo(h.space, keys, kGpu);
  ASSERT_EQ(moves.size(), 3u);
  h.runMoves(moves);
  EXPECT_EQ(h.lookupExtents(tokens, 3),
            (std::vector<uint32_t>{kGpuExtent, kGpuExtent, kGpuExtent}));
  const EngineStats s = h.engine->stats();
  EXPECT_EQ(s.gpuPromoted, 3u);
  EXPECT_EQ(s.blocksUsed, 0u);
  EXPECT_EQ(s.gpuBlocksUsed, 3u);
  // Already on the GPU: nothing more to move.
  EXPECT_TRUE(h.engine->beginMovesTo(h.space, keys, kGpu).empty());
}

// A host session's lookup brings GPU blocks to the host pool, which it can read.
TEST(EngineTiers, MovesToTheHostPoolForAHostSession) {
  Harness h(8, 4);
  const auto tokens = toks(2 * kBt, 70);
  h.cache("a", tokens, kGpu);
  auto plan = h.engine->lookupPlan(h.space, tokens, {});
  ASSERT_TRUE(plan.ok());
  std::vector<Key128> keys;
  for (const auto& step : *plan) keys.push_back(step.key);
  auto moves = h.engine->beginMovesTo(h.space, keys, 0);
  ASSERT_EQ(moves.size(), 2u);
  h.runMoves(moves);
  EXPECT_EQ(h.lookupExtents(tokens, 2), (std::vector<uint32_t>{kHostExtent, kHostExtent}));
  EXPECT_EQ(h.engine->stats().gpuDemoted, 2u);
  EXPECT_EQ(h.engine->stats().gpuBlocksUsed, 0u);
}

// A session never gets a reference it cannot read: a host session's match ends at a GPU block,
// a GPU session's at another GPU's block.
TEST(EngineTiers, LookupsAndGetsNeverHandOutBlocksTheSessionCannotReach) {
  Harness h(8, 4);
  const auto tokens = toks(2 * kBt, 300);
  auto g = h.engine->put(kOwner, h.space, "a", 0, toks(kBt, 300), {}, {}, 0);
  ASSERT_TRUE(g.ok());
  for (uint32_t s = 0; s < kBt; ++s) writeTag(h.layout, h.at(g->blocks[0]), s, 300 + s);
  ASSERT_TRUE(h.engine->commit(g->lease, kEnd).ok());
  auto g2 = h.engine->put(kOwner, h.space, "a", kBt, toks(kBt, 300 + kBt), {}, {}, kGpu);
  ASSERT_TRUE(g2.ok());
  ASSERT_TRUE(h.engine->commit(g2->lease, kEnd).ok());
  ASSERT_EQ(g2->blocks[0].extent, kGpuExtent);
  for (int served : {-1, 0, 1, 2}) {
    auto r = h.engine->lookup(kOwner, h.space, tokens, {}, "", {}, {}, served);
    ASSERT_TRUE(r.ok());
    const size_t expect = served == 0 || served == 2 ? 1 : 2;
    EXPECT_EQ(r->blocks.size(), expect) << "served tier " << served;
    if (r->lease) {
      EXPECT_TRUE(h.engine->releaseRead(r->lease).ok());
    }
  }
  // A get cannot end early: a range holding an unreachable block is NOT_SUPPORTED, nothing pinned.
  for (int served : {-1, 0, 1, 2}) {
    auto g = h.engine->get(h.space, "a", 0, kEnd, served);
    const bool reachable = served == -1 || served == 1;
    ASSERT_EQ(g.ok(), reachable) << "served tier " << served;
    if (!g.ok()) {
      EXPECT_EQ(g.error().code(), ErrorCode::kNotSupported);
      EXPECT_EQ(h.engine->stats().readLeases, 0u);
      continue;
    }
    EXPECT_TRUE(h.engine->releaseRead(g->lease).ok());
  }
  auto host = h.engine->get(h.space, "a", 0, kBt, 0);
  ASSERT_TRUE(host.ok()) << "the host block alone is reachable";
  EXPECT_TRUE(h.engine->releaseRead(host->lease).ok());
}

TEST(EngineTiers, PromotionStopsWhenTheGpuIsFullAndNeverDropsGpuBlocksWithDemotionOn) {
  Harness h(8, 2);
  h.engine->setGpuDemotion(true);
  h.cache("gpu", toks(2 * kBt, 900), kGpu);  // the GPU pool is full of cached blocks
  h.cache("host", toks(kBt, 40), 0);
  auto plan = h.engine->lookupPlan(h.space, toks(kBt, 40), {});
  ASSERT_TRUE(plan.ok());
  std::vector<Key128> keys{(*plan)[0].key};
  EXPECT_TRUE(h.engine->beginMovesTo(h.space, keys, kGpu).empty());
  auto g = h.engine->put(kOwner, h.space, "x", 0, toks(kBt, 5), {}, {}, kGpu);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().code(), ErrorCode::kFull) << "the daemon demotes, then the put retries";
  EXPECT_EQ(h.engine->stats().evictions, 0u);
  EXPECT_EQ(h.lookupExtents(toks(2 * kBt, 900), 2).size(), 2u) << "nothing was dropped";
  // Without demotion (no tier service), a full GPU pool evicts like any pool.
  h.engine->setGpuDemotion(false);
  auto g2 = h.engine->put(kOwner, h.space, "x", 0, toks(kBt, 5), {}, {}, kGpu);
  ASSERT_TRUE(g2.ok());
  EXPECT_EQ(h.engine->stats().evictions, 1u);
  EXPECT_TRUE(h.engine->abortWrite(g2->lease).ok());
}

TEST(EngineTiers, BytesTheCpuCannotAddressAreNeverTouchedByTheEngine) {
  Harness h(8, 4);
  h.mem->gpuAddressable = false;
  Layout roped = smallLayout("roped");
  roped.rope = RopeScheme{RopeStyle::kNeox, 4, 10000.0};
  auto g = h.engine->put(kOwner, h.space, "a", 0, toks(kBt + 3, 1), {}, {}, kGpu);
  ASSERT_TRUE(g.ok());
  auto data = h.engine->leaseBlockData(g->lease, 0);
  ASSERT_FALSE(data.ok()) << "inline writes cannot reach GPU memory";
  EXPECT_EQ(data.error().code(), ErrorCode::kNotSupported);
  ASSERT_TRUE(h.engine->commit(g->lease, kEnd).ok());
  // Copy-on-write of a GPU block goes through BlockMemory::copy (a device copy in the daemon).
  const int before = h.mem->copies;
  ASSERT_TRUE(h.engine->copyPrefix(kOwner, h.space, "a", "b", kBt + 2, {}).ok());
  EXPECT_EQ(h.mem->copies - before, 2 * 2) << "one run per layer, K and V";
  // Inline reads of sealed GPU blocks are refused, not served from a device address.
  auto r = h.engine->get(h.space, "a", 0, kBt);
  ASSERT_TRUE(r.ok());
  auto bytes = h.engine->resolveSealed(h.space, r->blocks[0]);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.error().code(), ErrorCode::kNotSupported);
  EXPECT_TRUE(h.engine->releaseRead(r->lease).ok());
}

// Middle removal of a sequence in GPU memory: the blocks the tokens move out of are read
// through host copies (BlockMemory::copy), never touched in place, and the result is right.
TEST(EngineTiers, MiddleRemovalReadsGpuBlocksThroughHostCopies) {
  Layout roped = smallLayout("roped");
  roped.rope = RopeScheme{RopeStyle::kNeox, 4, 10000.0};
  auto pool = std::make_unique<BlockPool>(std::vector<BlockPool::Extent>{
      {kHostExtent, 8 * kBlockBytes, 0}, {kGpuExtent, 8 * kBlockBytes, kGpu}});
  TieredTestMemory mem(pool->extents());
  struct NoopRotator final : KeyRotator {  // rotation itself is tested in kernels/
    bool supports(const Layout&) const override { return true; }
    void rotate(const Layout&, uint8_t*, uint64_t, int64_t) const override {}
  } rotator;
  Engine engine(*pool, mem, nullptr, &rotator);
  const SpaceId space = engine.openSpace(roped, saltFor("t")).value();
  const auto tokens = toks(3 * kBt, 1);
  auto g = engine.put(kOwner, space, "a", 0, tokens, {}, {}, kGpu);
  ASSERT_TRUE(g.ok());
  for (size_t i = 0; i < tokens.size(); ++i) {
    writeTag(roped, mem.extentBase(g->blocks[i / kBt].extent) + g->blocks[i / kBt].offset, i % kBt,
             tokens[i]);
  }
  ASSERT_TRUE(engine.commit(g->lease, kEnd).ok());
  mem.gpuAddressable = false;  // from here the engine may reach GPU bytes only by copies
  const int copiesBefore = mem.copies;
  ASSERT_TRUE(engine.remove(space, "a", 4, 8).ok());
  EXPECT_GT(mem.copies, copiesBefore);
  EXPECT_EQ(engine.length(space, "a").value(), std::optional<uint64_t>(3 * kBt - 4));
  mem.gpuAddressable = true;  // the test reads every block back
  auto r = engine.get(space, "a", 0, kEnd);
  ASSERT_TRUE(r.ok());
  for (uint64_t pos = 0; pos < 3 * kBt - 4; ++pos) {
    const auto& loc = r->blocks[pos / kBt];
    const uint32_t expected = tokens[pos < 4 ? pos : pos + 4];
    EXPECT_EQ(readTag(roped, mem.extentBase(loc.extent) + loc.offset, pos % kBt), expected)
        << "position " << pos;
  }
  EXPECT_EQ(r->blocks[0].extent, kHostExtent) << "re-rotated blocks are host blocks";
  EXPECT_TRUE(engine.releaseRead(r->lease).ok());
}

}  // namespace
}  // namespace kvtier
