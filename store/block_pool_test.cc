#include "store/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>
#include <vector>

namespace kvtier {
namespace {

// Allocates blocks of `cls` until the pool says no; returns them in order.
std::vector<BlockId> allocateAll(BlockPool& pool, uint32_t cls) {
  std::vector<BlockId> ids;
  for (BlockId id = pool.allocate(cls); id != kNoBlock; id = pool.allocate(cls)) {
    ids.push_back(id);
    if (ids.size() > 100000) break;  // a broken pool must not hang the test
  }
  return ids;
}

// Every block lies inside its extent and no two blocks overlap.
void expectDisjointInsideExtents(const BlockPool& pool, const std::vector<BlockId>& ids) {
  std::map<uint32_t, uint64_t> extentBytes;
  for (const auto& e : pool.extents()) extentBytes[e.id] = e.bytes;
  std::map<uint32_t, std::vector<std::pair<uint64_t, uint64_t>>> ranges;
  for (BlockId id : ids) {
    const BlockLocation loc = pool.location(id);
    ASSERT_TRUE(extentBytes.count(loc.extent)) << "block " << id;
    EXPECT_LE(loc.offset + loc.bytes, extentBytes[loc.extent])
        << "block " << id << " straddles the end of extent " << loc.extent;
    ranges[loc.extent].emplace_back(loc.offset, loc.offset + loc.bytes);
  }
  for (auto& [extent, r] : ranges) {
    std::sort(r.begin(), r.end());
    for (size_t i = 1; i < r.size(); ++i) {
      EXPECT_LE(r[i - 1].second, r[i].first) << "blocks overlap in extent " << extent;
    }
  }
}

TEST(BlockPoolTest, EmptyPool) {
  BlockPool pool({{0, 4096}});
  EXPECT_EQ(pool.bytesTotal(), 4096u);
  EXPECT_EQ(pool.bytesUsed(), 0u);
  EXPECT_EQ(pool.blocksUsed(), 0u);
  EXPECT_EQ(pool.classCount(), 0u);
  EXPECT_EQ(pool.find(0, 0), kNoBlock) << "nothing carved yet";
}

TEST(BlockPoolTest, RejectsOversizedExtents) {
  EXPECT_THROW(BlockPool({{0, uint64_t{1} << 48}}), std::invalid_argument);
  EXPECT_THROW(BlockPool({{1u << 16, 4096}}), std::invalid_argument);
}

TEST(BlockPoolTest, SizeClassesAreCreatedOncePerSize) {
  BlockPool pool({{0, 1 << 20}});
  const uint32_t a = pool.sizeClass(512);
  const uint32_t b = pool.sizeClass(4096);
  EXPECT_NE(a, b);
  EXPECT_EQ(pool.sizeClass(512), a);
  EXPECT_EQ(pool.sizeClass(4096), b);
  EXPECT_EQ(pool.classCount(), 2u);
  EXPECT_EQ(pool.classBytes(a), 512u);
  EXPECT_EQ(pool.classBytes(b), 4096u);
}

TEST(BlockPoolTest, AllocateUntilExhaustedThenNoBlock) {
  BlockPool pool({{0, 4 * 512}});
  const uint32_t cls = pool.sizeClass(512);
  EXPECT_EQ(pool.blocksTotal(cls), 4u);
  const auto ids = allocateAll(pool, cls);
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(std::set<BlockId>(ids.begin(), ids.end()).size(), 4u);
  for (BlockId id : ids) {
    EXPECT_TRUE(pool.valid(id));
    EXPECT_EQ(pool[id].state, BlockState::kWriting);
    EXPECT_EQ(pool[id].refs, 0u);
    EXPECT_EQ(pool[id].pins, 0u);
    EXPECT_EQ(pool[id].sizeClass, cls);
  }
  EXPECT_EQ(pool.blocksUsed(), 4u);
  EXPECT_EQ(pool.blocksUsed(cls), 4u);
  EXPECT_EQ(pool.bytesUsed(), 4u * 512);
  EXPECT_EQ(pool.allocate(cls), kNoBlock);
  EXPECT_EQ(pool.blocksUsed(), 4u) << "a failed allocate changes nothing";
  EXPECT_FALSE(pool.valid(kNoBlock));
  expectDisjointInsideExtents(pool, ids);
}

TEST(BlockPoolTest, ReleaseReusesFromFreeListAndBumpsGeneration) {
  BlockPool pool({{0, 4 * 512}});
  const uint32_t cls = pool.sizeClass(512);
  const auto ids = allocateAll(pool, cls);
  ASSERT_EQ(ids.size(), 4u);
  const BlockLocation before = pool.location(ids[1]);

  pool.release(ids[1]);
  EXPECT_EQ(pool[ids[1]].state, BlockState::kFree);
  EXPECT_EQ(pool.blocksUsed(), 3u);
  EXPECT_EQ(pool.bytesUsed(), 3u * 512);
  const BlockLocation after = pool.location(ids[1]);
  EXPECT_EQ(after.generation, before.generation + 1);
  EXPECT_EQ(after.extent, before.extent);
  EXPECT_EQ(after.offset, before.offset);
  EXPECT_FALSE(after == before) << "a reference from before the release is distinguishable";

  // The freed block is handed out again (the extent has no room left to carve).
  EXPECT_EQ(pool.allocate(cls), ids[1]);
  EXPECT_EQ(pool.location(ids[1]).generation, before.generation + 1) << "allocate keeps it";
  EXPECT_EQ(pool[ids[1]].state, BlockState::kWriting);

  // Every release bumps it again.
  pool.release(ids[1]);
  EXPECT_EQ(pool.allocate(cls), ids[1]);
  EXPECT_EQ(pool.location(ids[1]).generation, before.generation + 2);
}

TEST(BlockPoolTest, FreeListIsLastInFirstOutAndPreferredOverCarving) {
  BlockPool pool({{0, 8 * 512}});
  const uint32_t cls = pool.sizeClass(512);
  std::vector<BlockId> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(pool.allocate(cls));
  pool.release(ids[0]);
  pool.release(ids[2]);
  pool.release(ids[3]);
  // Freed blocks come back before any new one is carved, most recently freed first.
  EXPECT_EQ(pool.allocate(cls), ids[3]);
  EXPECT_EQ(pool.allocate(cls), ids[2]);
  EXPECT_EQ(pool.allocate(cls), ids[0]);
  EXPECT_EQ(pool.find(0, 4 * 512), kNoBlock) << "nothing new carved while the free list had blocks";
  const BlockId fresh = pool.allocate(cls);
  EXPECT_EQ(pool.location(fresh).offset, 4u * 512);
  EXPECT_EQ(pool.blocksTotal(cls), 8u);
}

TEST(BlockPoolTest, ManyAllocateReleaseCyclesKeepCounts) {
  BlockPool pool({{0, 16 * 512}});
  const uint32_t cls = pool.sizeClass(512);
  for (int round = 0; round < 100; ++round) {
    auto ids = allocateAll(pool, cls);
    ASSERT_EQ(ids.size(), 16u) << "round " << round;
    for (BlockId id : ids) pool.release(id);
    ASSERT_EQ(pool.blocksUsed(), 0u);
  }
  const auto ids = allocateAll(pool, cls);
  for (BlockId id : ids) EXPECT_EQ(pool.location(id).generation, 1u + 100u);
}

TEST(BlockPoolTest, CarvingNeverStraddlesExtents) {
  // 512-byte blocks: extent 0 holds one (1000 bytes), extent 1 four, extent 2 none (100 bytes).
  BlockPool pool({{0, 1000}, {1, 2048}, {2, 100}});
  const uint32_t cls = pool.sizeClass(512);
  EXPECT_EQ(pool.blocksTotal(cls), 5u);
  const auto ids = allocateAll(pool, cls);
  ASSERT_EQ(ids.size(), 5u);
  expectDisjointInsideExtents(pool, ids);
  EXPECT_EQ(pool.location(ids[0]).extent, 0u);
  EXPECT_EQ(pool.location(ids[0]).offset, 0u);
  for (size_t i = 1; i < 5; ++i) {
    EXPECT_EQ(pool.location(ids[i]).extent, 1u);
    EXPECT_EQ(pool.location(ids[i]).offset, (i - 1) * 512);
  }
}

TEST(BlockPoolTest, SmallBlocksAreCacheLineAlignedAndCountedExactly) {
  // 300-byte blocks on a 64-byte stride of 320: 3 fit in 1000 bytes, 6 in 2048, none in 100.
  BlockPool pool({{0, 1000}, {1, 2048}, {2, 100}});
  const uint32_t cls = pool.sizeClass(300);
  EXPECT_EQ(pool.blocksTotal(cls), 9u);
  const auto ids = allocateAll(pool, cls);
  ASSERT_EQ(ids.size(), 9u);
  expectDisjointInsideExtents(pool, ids);
  for (BlockId id : ids) EXPECT_EQ(pool.location(id).offset % 64, 0u);
  EXPECT_EQ(pool.blocksTotal(cls), 9u) << "carved blocks still count";
}

TEST(BlockPoolTest, PageSizedBlocksArePageAligned) {
  BlockPool pool({{0, 5 * 4096}});
  const uint32_t small = pool.sizeClass(512);
  const uint32_t page = pool.sizeClass(4096);
  const BlockId s = pool.allocate(small);
  const BlockId p = pool.allocate(page);
  ASSERT_NE(s, kNoBlock);
  ASSERT_NE(p, kNoBlock);
  EXPECT_EQ(pool.location(s).offset, 0u);
  EXPECT_EQ(pool.location(p).offset, 4096u) << "skips to the next page";
  EXPECT_EQ(pool.location(p).bytes, 4096u);
  EXPECT_EQ(pool.location(s).bytes, 512u);
}

TEST(BlockPoolTest, SizeClassesShareExtentsWithoutOverlap) {
  BlockPool pool({{0, 6 * 4096}, {1, 3 * 4096}});
  const uint32_t small = pool.sizeClass(512);
  const uint32_t page = pool.sizeClass(4096);
  EXPECT_EQ(pool.blocksTotal(page), 9u);
  EXPECT_EQ(pool.blocksTotal(small), 9u * 8);

  std::vector<BlockId> all;
  // Interleave the classes; each keeps its own free list.
  for (int i = 0; i < 3; ++i) {
    all.push_back(pool.allocate(small));
    all.push_back(pool.allocate(page));
  }
  for (BlockId id : all) ASSERT_NE(id, kNoBlock);
  EXPECT_EQ(pool.blocksUsed(small), 3u);
  EXPECT_EQ(pool.blocksUsed(page), 3u);
  EXPECT_EQ(pool.blocksUsed(), 6u);
  EXPECT_EQ(pool.bytesUsed(), 3u * 512 + 3u * 4096);

  // What remains carvable for one class shrinks as the other carves.
  const uint64_t pageTotal = pool.blocksTotal(page);
  EXPECT_LT(pageTotal, 9u);
  // blocksTotal is exact: that many allocations succeed.
  auto more = allocateAll(pool, page);
  EXPECT_EQ(3u + more.size(), pageTotal);
  all.insert(all.end(), more.begin(), more.end());
  expectDisjointInsideExtents(pool, all);

  // A released block stays in its class: the other class cannot take it.
  pool.release(all[1]);  // a page block
  EXPECT_EQ(pool.allocate(small), kNoBlock) << "no room left to carve a small block";
  EXPECT_EQ(pool.allocate(page), all[1]);
  EXPECT_EQ(pool[all[1]].sizeClass, page);
}

TEST(BlockPoolTest, FindByExtentAndOffset) {
  BlockPool pool({{3, 2 * 512}, {7, 2 * 512}});
  const uint32_t cls = pool.sizeClass(512);
  const auto ids = allocateAll(pool, cls);
  ASSERT_EQ(ids.size(), 4u);
  for (BlockId id : ids) {
    const BlockLocation loc = pool.location(id);
    EXPECT_EQ(pool.find(loc.extent, loc.offset), id);
  }
  EXPECT_EQ(pool.location(ids[0]).extent, 3u);
  EXPECT_EQ(pool.location(ids[2]).extent, 7u);
  EXPECT_EQ(pool.find(3, 1), kNoBlock) << "not the start of a block";
  EXPECT_EQ(pool.find(3, 256), kNoBlock);
  EXPECT_EQ(pool.find(3, 1024), kNoBlock) << "past the extent";
  EXPECT_EQ(pool.find(0, 0), kNoBlock) << "no such extent";
  EXPECT_EQ(pool.find(5, 512), kNoBlock);
  // A freed block is still found at its place (its generation tells references apart).
  pool.release(ids[3]);
  EXPECT_EQ(pool.find(7, 512), ids[3]);
}

TEST(BlockPoolTest, FindsBlocksOfClassesCarvedInTurns) {
  // Two sizes carved alternately from one extent: every block is its own run of locations (the
  // strides differ), and each is found at its place, the alignment gaps between them are not.
  BlockPool pool({{2, 64 * 4096}});
  const uint32_t small = pool.sizeClass(100);  // 64-byte alignment: stride 128
  const uint32_t page = pool.sizeClass(4096);
  std::vector<BlockId> ids;
  for (int i = 0; i < 20; ++i) {
    ids.push_back(pool.allocate(i % 3 == 0 ? page : small));
    ASSERT_NE(ids.back(), kNoBlock);
  }
  for (BlockId id : ids) {
    const BlockLocation loc = pool.location(id);
    EXPECT_EQ(pool.find(loc.extent, loc.offset), id) << "block " << id;
    EXPECT_EQ(pool.find(loc.extent, loc.offset + 64), kNoBlock) << "inside block " << id;
  }
  expectDisjointInsideExtents(pool, ids);
  // A long run of one size after them: every block of it found, one past its end not.
  std::vector<BlockId> run = allocateAll(pool, small);
  ASSERT_GT(run.size(), 100u);
  for (BlockId id : run) {
    const BlockLocation loc = pool.location(id);
    ASSERT_EQ(pool.find(loc.extent, loc.offset), id);
  }
  const BlockLocation last = pool.location(run.back());
  EXPECT_EQ(pool.find(2, last.offset + 128), kNoBlock);
}

TEST(BlockPoolTest, FindRejectsExtentAndOffsetOutsideTheirBits) {
  // Locations are looked up by (extent << 48 | offset): an extent id of 2^16 or more, or an
  // offset of 2^48 or more, must not alias another block's location.
  BlockPool pool({{0, 2 * 512}, {1, 2 * 512}});
  const uint32_t cls = pool.sizeClass(512);
  const auto ids = allocateAll(pool, cls);
  ASSERT_EQ(ids.size(), 4u);
  ASSERT_EQ(pool.find(0, 0), ids[0]);
  ASSERT_EQ(pool.find(1, 0), ids[2]);
  EXPECT_EQ(pool.find(1u << 16, 0), kNoBlock) << "extent 65536 does not exist";
  EXPECT_EQ(pool.find((1u << 16) + 1, 512), kNoBlock) << "extent 65537 does not exist";
  EXPECT_EQ(pool.find(0, uint64_t{1} << 48), kNoBlock) << "offset 2^48 is outside extent 0";
}

TEST(BlockPoolTest, BlocksTotalCountsWhatCouldStillBeCarved) {
  BlockPool pool({{0, 10 * 512}});
  const uint32_t cls = pool.sizeClass(512);
  EXPECT_EQ(pool.blocksTotal(cls), 10u);
  for (int i = 0; i < 3; ++i) ASSERT_NE(pool.allocate(cls), kNoBlock);
  EXPECT_EQ(pool.blocksTotal(cls), 10u);
  EXPECT_EQ(pool.blocksUsed(cls), 3u);
}

TEST(HeapBlockMemoryTest, ExtentsAreSizedAndDistinct) {
  const std::vector<BlockPool::Extent> extents = {{2, 4096}, {5, 1024}};
  BlockPool pool(extents);
  HeapBlockMemory mem(pool.extents());
  uint8_t* a = mem.extentBase(2);
  uint8_t* b = mem.extentBase(5);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  a[4095] = 0xaa;
  b[1023] = 0xbb;
  EXPECT_EQ(a[4095], 0xaa);
  EXPECT_EQ(b[1023], 0xbb);
  EXPECT_EQ(a[0], 0) << "zero-initialised";

  const uint32_t cls = pool.sizeClass(1024);
  const BlockId id = pool.allocate(cls);
  ASSERT_NE(id, kNoBlock);
  EXPECT_EQ(mem.blockData(pool[id]), mem.extentBase(pool[id].extent) + pool[id].offset);
}

// Tier moves: runs contiguous on both sides become one copy, in any input order; a run broken on
// either side, or crossing from one range (allocation) into the next, stays two copies; every byte
// is moved exactly once.
TEST(BlockPoolTest, CoalescedCopiesMoveTheSameBytesInFewerRuns) {
  std::vector<uint8_t> src(64 * 10), dst(64 * 10);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  // Source blocks 0-7 are one allocation, 8-9 another that happens to follow it; dst is one.
  const std::vector<MemoryRange> ranges = {
      {src.data(), 8 * 64}, {src.data() + 8 * 64, 2 * 64}, {dst.data(), dst.size()}};
  auto copy = [&](size_t from, size_t to) { return BlockCopy{&dst[to * 64], &src[from * 64], 64}; };
  // 0-2 -> 5-7 (a run, given out of order); 3 -> 9 (breaks the run on the destination); 4 -> 0
  // (the source continues, the destination does not); 6-7 -> 1-2 (a run); 8 -> 3 (contiguous
  // with 7 -> 2 on both sides, but in the source's second allocation).
  const std::vector<BlockCopy> copies = {copy(2, 7), copy(0, 5), copy(4, 0), copy(1, 6),
                                         copy(3, 9), copy(6, 1), copy(8, 3), copy(7, 2)};
  const auto merged = coalesceCopies(copies, ranges);
  ASSERT_EQ(merged.size(), 5u);
  EXPECT_EQ(merged[0].src, &src[0]);
  EXPECT_EQ(merged[0].dst, &dst[5 * 64]);
  const std::vector<uint64_t> runs = {3 * 64, 64, 64, 2 * 64, 64};
  uint64_t total = 0;
  for (size_t i = 0; i < merged.size(); ++i) {
    EXPECT_EQ(merged[i].bytes, runs[i]) << "run " << i;
    std::memcpy(merged[i].dst, merged[i].src, merged[i].bytes);
    total += merged[i].bytes;
  }
  EXPECT_EQ(total, copies.size() * 64);
  for (const auto& c : copies) EXPECT_EQ(std::memcmp(c.dst, c.src, c.bytes), 0);
  // Outside every range nothing is merged.
  EXPECT_EQ(coalesceCopies({copy(0, 0), copy(1, 1)}, {}).size(), 2u);
  EXPECT_TRUE(coalesceCopies({}, ranges).empty());
}

}  // namespace
}  // namespace kvtier
