#include "kernels/block_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace kvtier::kernels {
namespace {

// Packs every slot range of a block and unpacks it into another, at odd offsets and sizes that
// take both the plain and the streaming copy paths, and checks every byte.
// With either copy method (streaming stores or memcpy for long runs), and streaming stores of 32
// bytes (where the CPU has AVX2) and of 16.
TEST(BlockCopy, PackUnpackRoundTripsAtAnyOffsetAndRunSize) {
  const CopyMethod into = copyMethod(CopyDirection::kIntoPool);
  const CopyMethod outOf = copyMethod(CopyDirection::kOutOfPool);
  for (int variant = 0; variant < 3; ++variant) {
    const CopyMethod method = variant == 2 ? CopyMethod::kCached : CopyMethod::kStreaming;
    setCopyMethod(CopyDirection::kIntoPool, method);
    setCopyMethod(CopyDirection::kOutOfPool, method);
    const bool avx2 = setStreamingAvx2(variant == 0);
    SCOPED_TRACE(std::string(copyMethodName(method)) + (avx2 ? ", AVX2" : ""));
    for (uint64_t tokenBytes : {8ull, 100ull, 1024ull, 5000ull}) {
      const BlockGeometry g{3, 16, tokenBytes};
      const size_t blockBytes = 2 * g.numLayers * g.blockTokens * tokenBytes;
      std::vector<uint8_t> block(blockBytes + 7), copy(blockBytes + 7, 0);
      std::iota(block.begin(), block.end(), 1);
      for (uint32_t first : {0u, 1u, 7u}) {
        for (uint32_t slots : {1u, 5u, 16u - first}) {
          // A packed buffer at an odd address, holding the run among other tokens.
          const uint64_t packedTokens = slots + 3, packedFirst = 2;
          std::vector<uint8_t> packed(2 * g.numLayers * packedTokens * tokenBytes + 3, 0xEE);
          uint8_t* p = packed.data() + 3;
          packSlots(g, block.data() + 1, first, slots, p, packedTokens, packedFirst);
          for (uint64_t lkv = 0; lkv < 2ull * g.numLayers; ++lkv) {
            for (uint64_t t = 0; t < slots; ++t) {
              for (uint64_t b = 0; b < tokenBytes; ++b) {
                ASSERT_EQ(p[(lkv * packedTokens + packedFirst + t) * tokenBytes + b],
                          block[1 + (lkv * g.blockTokens + first + t) * tokenBytes + b]);
              }
            }
          }
          unpackSlots(g, copy.data() + 5, first, slots, p, packedTokens, packedFirst);
          for (uint64_t lkv = 0; lkv < 2ull * g.numLayers; ++lkv) {
            const uint64_t off = (lkv * g.blockTokens + first) * tokenBytes;
            ASSERT_EQ(
                0, std::memcmp(copy.data() + 5 + off, block.data() + 1 + off, slots * tokenBytes))
                << "tokenBytes " << tokenBytes << " first " << first << " slots " << slots;
          }
        }
      }
    }
  }
  setStreamingAvx2(true);
  setCopyMethod(CopyDirection::kIntoPool, into);
  setCopyMethod(CopyDirection::kOutOfPool, outOf);
}

// The calibration measures both methods and keeps streaming unless memcpy is clearly faster; it
// does not change the method in use by itself.
TEST(BlockCopy, CalibrationMeasuresBothMethodsAndPrefersStreamingWithinNoise) {
  for (CopyDirection d : {CopyDirection::kIntoPool, CopyDirection::kOutOfPool}) {
    const CopyMethod before = copyMethod(d);
    const CopyCalibration c = calibrateCopyMethod(d);
    EXPECT_GT(c.streamingBytesPerSecond, 0);
    EXPECT_GT(c.cachedBytesPerSecond, 0);
    EXPECT_EQ(c.chosen, c.cachedBytesPerSecond >= 1.1 * c.streamingBytesPerSecond
                            ? CopyMethod::kCached
                            : CopyMethod::kStreaming);
    EXPECT_EQ(copyMethod(d), before);
  }
}

}  // namespace
}  // namespace kvtier::kernels
