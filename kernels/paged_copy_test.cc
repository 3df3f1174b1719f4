#include "kernels/paged_copy.h"

#include <gtest/gtest.h>

#include <cstring>

#include "kernels/paged_copy_test_util.h"

namespace kvtier::kernels {
namespace {

using testing::PagedBuffers;
using testing::pagedCases;

// Every element of [begin, end) lands where the element-wise formula says; every other byte of
// the pool is untouched.
TEST(PagedCopyCpu, ScatterPutsEveryElementWhereTheLayoutsSay) {
  for (const auto& pc : pagedCases()) {
    SCOPED_TRACE(pc.name);
    PagedBuffers b(pc);
    const auto before = b.pool;
    auto t = testing::hostTables(b);
    ASSERT_EQ(checkPagedCopy(b.kv(), t.copy(b)), "");
    scatterCpu(b.kv(), t.copy(b));
    std::vector<std::vector<bool>> written(b.poolBlocks, std::vector<bool>(b.poolBlockBytes));
    for (uint32_t layer = 0; layer < pc.layers; ++layer) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        const auto& tensor = b.tensors[layer * 2 + kv];
        for (uint64_t pos = pc.begin; pos < pc.end; ++pos) {
          for (uint32_t h = 0; h < pc.heads; ++h) {
            for (uint32_t d = 0; d < pc.headDim; ++d) {
              const uint64_t po = b.poolOffset(layer, kv, pos, h, d);
              const uint64_t eo = b.engineOffset(pos, h, d);
              auto& block = b.pool[pos / pc.poolTokens];
              ASSERT_EQ(std::memcmp(&block[po], &tensor[eo], pc.elemBytes), 0)
                  << "layer " << layer << " kv " << kv << " pos " << pos;
              for (uint32_t e = 0; e < pc.elemBytes; ++e) {
                written[pos / pc.poolTokens][po + e] = true;
              }
            }
          }
        }
      }
    }
    for (uint64_t j = 0; j < b.poolBlocks; ++j) {
      for (uint64_t i = 0; i < b.poolBlockBytes; ++i) {
        if (!written[j][i]) {
          ASSERT_EQ(b.pool[j][i], before[j][i]) << "block " << j << " byte " << i;
        }
      }
    }
  }
}

// gather(scatter(x)) == x on [begin, end), and gather writes nothing else of the engine's cache.
TEST(PagedCopyCpu, GatherReturnsWhatScatterStoredAndNothingElse) {
  for (const auto& pc : pagedCases()) {
    SCOPED_TRACE(pc.name);
    PagedBuffers b(pc);
    auto t = testing::hostTables(b);
    scatterCpu(b.kv(), t.copy(b));
    const auto original = b.tensors;
    for (auto& x : b.tensors) std::fill(x.begin(), x.end(), 0xA5);
    gatherCpu(b.kv(), t.copy(b));
    for (uint32_t plane = 0; plane < 2 * pc.layers; ++plane) {
      std::vector<bool> inRange(b.tensorBytes);
      for (uint64_t pos = pc.begin; pos < pc.end; ++pos) {
        const uint64_t row = b.engineOffset(pos, 0, 0);
        for (uint64_t i = 0; i < b.tokenBytes; ++i) inRange[row + i] = true;
      }
      for (uint64_t i = 0; i < b.tensorBytes; ++i) {
        ASSERT_EQ(b.tensors[plane][i], inRange[i] ? original[plane][i] : 0xA5)
            << "plane " << plane << " byte " << i;
      }
    }
  }
}

// A copy may start at a later pool block: the table then names pool blocks from poolFirst on.
TEST(PagedCopyCpu, PoolTableMayStartAtALaterBlock) {
  PagedBuffers b({"later", 2, 16, 16, 2, 8, 2, 40, 70, true});
  auto t = testing::hostTables(b);
  for (auto& x : b.pool) std::fill(x.begin(), x.end(), 0);
  auto full = t.copy(b);
  scatterCpu(b.kv(), full);
  const auto expected = b.pool;
  for (auto& x : b.pool) std::fill(x.begin(), x.end(), 0);
  auto later = t.copy(b);
  later.poolFirst = 2;
  later.poolBlocks = t.pool.data() + 2;
  scatterCpu(b.kv(), later);
  EXPECT_EQ(b.pool[2], expected[2]);
  EXPECT_EQ(b.pool[3], expected[3]);
  EXPECT_EQ(b.pool[4], expected[4]);
  EXPECT_NE(b.pool[4], std::vector<uint8_t>(b.poolBlockBytes, 0));
  EXPECT_EQ(b.pool[0], std::vector<uint8_t>(b.poolBlockBytes, 0)) << "before poolFirst: untouched";
}

TEST(PagedCopyCpu, CheckRefusesUnusableShapes) {
  PagedBuffers b(pagedCases()[0]);
  auto t = testing::hostTables(b);
  auto c = t.copy(b);
  EXPECT_EQ(checkPagedCopy(b.kv(), c), "");
  auto bad = c;
  bad.begin = 20;
  bad.end = 10;
  EXPECT_NE(checkPagedCopy(b.kv(), bad), "");
  bad = c;
  bad.poolTokens = 0;
  EXPECT_NE(checkPagedCopy(b.kv(), bad), "");
  bad = c;
  bad.poolFirst = 1;  // begin 0 lies before pool block 1
  EXPECT_NE(checkPagedCopy(b.kv(), bad), "");
  bad = c;
  bad.tensors = nullptr;
  EXPECT_NE(checkPagedCopy(b.kv(), bad), "");
  PagedKv kv = b.kv();
  kv.blockTokens = 0;
  EXPECT_NE(checkPagedCopy(kv, c), "");
}

TEST(PagedCopyCpu, AlignmentIsTheWidestAccessEveryRowAllows) {
  PagedBuffers b(pagedCases()[0]);  // 2 KiB rows
  auto t = testing::hostTables(b);
  std::vector<std::vector<uint8_t>> aligned(b.tensors.size(),
                                            std::vector<uint8_t>(b.tensorBytes + 64));
  for (size_t i = 0; i < aligned.size(); ++i) {
    auto base = reinterpret_cast<uintptr_t>(aligned[i].data());
    t.tensors[i] = aligned[i].data() + ((16 - base % 16) % 16);
  }
  std::vector<uint8_t> poolStore(b.poolBlockBytes + 64);
  const auto pbase = reinterpret_cast<uintptr_t>(poolStore.data());
  t.pool[0] = poolStore.data() + ((16 - pbase % 16) % 16);
  EXPECT_EQ(pagedCopyAlignment(b.kv(), t.copy(b)), 16u);
  t.pool[0] += 8;
  EXPECT_EQ(pagedCopyAlignment(b.kv(), t.copy(b)), 8u);
  t.tensors[1] += 2;
  EXPECT_EQ(pagedCopyAlignment(b.kv(), t.copy(b)), 2u);
  PagedKv odd = b.kv();
  odd.tokenBytes = 15;
  EXPECT_EQ(pagedCopyAlignment(odd, t.copy(b)), 1u);
}

}  // namespace
}  // namespace kvtier::kernels
