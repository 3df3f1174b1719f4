#include "kernels/block_sum.h"

#include <gtest/gtest.h>

// The reference: xxHash's own XXH3_64bits (header-only, the same code as libxxhash).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/block_copy.h"

namespace kvtier::kernels {
namespace {

bool cpuHasAvx2() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

// One way to run a checksummed copy: a copy method on one of the two paths.
struct Config {
  CopyMethod method;
  FusedPath path;
  std::string name() const {
    static const char* const kPaths[] = {"fallback", "avx2", "avx512"};
    return std::string(copyMethodName(method)) + " " + kPaths[static_cast<int>(path)];
  }
};

// Every configuration this machine can run (each vector path only where the CPU has it).
std::vector<Config> configs() {
  std::vector<Config> all;
  for (CopyMethod m : {CopyMethod::kStreaming, CopyMethod::kCached}) {
    for (FusedPath p : {FusedPath::kAvx512, FusedPath::kAvx2, FusedPath::kFallback}) {
      if (p <= widestFusedPath()) all.push_back({m, p});
    }
  }
  return all;
}

// Applies a configuration for the scope of a test, then restores the copy methods and the widest
// path.
class ScopedConfig {
 public:
  explicit ScopedConfig(const Config& c)
      : into_(copyMethod(CopyDirection::kIntoPool)), outOf_(copyMethod(CopyDirection::kOutOfPool)) {
    setCopyMethod(CopyDirection::kIntoPool, c.method);
    setCopyMethod(CopyDirection::kOutOfPool, c.method);
    setFusedXxh3MaxPath(c.path);
  }
  ~ScopedConfig() {
    setCopyMethod(CopyDirection::kIntoPool, into_);
    setCopyMethod(CopyDirection::kOutOfPool, outOf_);
    setFusedXxh3MaxPath(FusedPath::kAvx512);
  }

 private:
  CopyMethod into_, outOf_;
};

// A buffer whose usable part starts 64-byte aligned, so that offsets from it give known
// alignments (aligned ones take the streaming-store branch, odd ones the plain one).
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes) : raw_(bytes + 64 + 64) {}
  uint8_t* at(size_t offset) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(raw_.data());
    return reinterpret_cast<uint8_t*>((p + 63) / 64 * 64) + offset;
  }

 private:
  std::vector<uint8_t> raw_;
};

void fillRandom(uint8_t* p, size_t n, std::mt19937_64& rng) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(rng());
}

// How an input is split into runs.
enum class Split { kWhole, kSingleBytes, kMixed, kNearStripes };

// Run lengths summing to `total`. kMixed mixes 1-3 byte runs, runs around a stripe, short ones and
// long ones (>= 4096, so streamed): stripes straddle run boundaries at every offset.
std::vector<size_t> splitRuns(size_t total, Split split, std::mt19937_64& rng) {
  std::vector<size_t> runs;
  for (size_t left = total; left > 0;) {
    size_t n = left;
    switch (split) {
      case Split::kWhole:
        break;
      case Split::kSingleBytes:
        n = 1;
        break;
      case Split::kMixed:
        switch (rng() % 4) {
          case 0:
            n = 1 + rng() % 3;
            break;
          case 1:
            n = 60 + rng() % 9;
            break;
          case 2:
            n = 1 + rng() % 300;
            break;
          default:
            n = 4096 + rng() % 20000;
            break;
        }
        break;
      case Split::kNearStripes:
        n = 64 * (1 + rng() % 40) + rng() % 3 - 1;  // a whole number of stripes, or one byte off
        break;
    }
    n = std::min(n, left);
    runs.push_back(n);
    left -= n;
  }
  return runs;
}

// Copies `total` random bytes through FusedXxh3 in `runs`, from src + srcOffset to dst +
// dstOffset, and checks the copy (and that no byte around it was written) and the digest against
// XXH3_64bits.
void expectFusedExact(const Config& c, size_t total, const std::vector<size_t>& runs,
                      size_t srcOffset, size_t dstOffset, std::mt19937_64& rng) {
  AlignedBuffer srcBuf(total + srcOffset), dstBuf(total + dstOffset + 1);
  uint8_t* src = srcBuf.at(srcOffset);
  uint8_t* dst = dstBuf.at(dstOffset);
  fillRandom(src, total, rng);
  std::memset(dstBuf.at(0), 0xCD, total + dstOffset + 1);
  const uint64_t expected = XXH3_64bits(src, total);

  FusedXxh3 sum(total, c.method);
  EXPECT_EQ(sum.path(), total > 240 ? c.path : FusedPath::kFallback);
  size_t at = 0;
  for (size_t n : runs) {
    sum.feed(dst + at, src + at, n);
    at += n;
  }
  copyFence();
  ASSERT_EQ(at, total);
  EXPECT_EQ(sum.digest(), expected) << c.name() << " total " << total << " runs " << runs.size()
                                    << " src+" << srcOffset << " dst+" << dstOffset;
  EXPECT_EQ(sum.digest(), expected) << "a second digest() differs";
  EXPECT_EQ(0, std::memcmp(dst, src, total)) << c.name() << " total " << total;
  for (size_t i = 0; i < dstOffset; ++i) EXPECT_EQ(dstBuf.at(0)[i], 0xCD);
  EXPECT_EQ(dst[total], 0xCD);
}

// Known answers of XXH3-64 itself, so that the reference above is not only compared with itself.
TEST(BlockSum, ChecksumIsXxh3WithDefaultSecretAndSeedZero) {
  EXPECT_EQ(blockChecksum(nullptr, 0), 0x2D06800538D394C2ull);
  std::vector<uint8_t> bytes(100000);
  std::mt19937_64 rng(7);
  fillRandom(bytes.data(), bytes.size(), rng);
  for (size_t n : {1u, 16u, 17u, 128u, 129u, 240u, 241u, 1024u, 1025u, 100000u}) {
    EXPECT_EQ(blockChecksum(bytes.data(), n), XXH3_64bits(bytes.data(), n)) << n;
  }
}

// Every total length up to 2200 bytes (XXH3's short forms, the first scrambles at 1025 and 2049,
// multiples of 64 where the last stripe is the last regular one's neighbour), split at random, at
// misaligned source and destination offsets, on every path and copy method.
TEST(BlockSum, FusedEqualsXxh3ForEveryLengthUpTo2200) {
  std::mt19937_64 rng(1);
  for (const Config& c : configs()) {
    ScopedConfig scoped(c);
    for (size_t total = 0; total <= 2200; ++total) {
      const Split split = static_cast<Split>(total % 4);
      expectFusedExact(c, total, splitRuns(total, split, rng), total % 7, (total * 5) % 64, rng);
    }
  }
}

// Long inputs: streamed runs, the lengths where XXH3's block and stripe counts turn over
// (multiples of 64 and of 1024, one past them), split every way.
TEST(BlockSum, FusedEqualsXxh3ForLongInputsSplitEveryWay) {
  std::vector<size_t> totals = {4096, 4097, 4095, (64 << 10) + 7, 1 << 20, (1 << 20) + 1};
  for (size_t k : {1u, 2u, 3u, 16u, 17u, 100u}) {
    totals.push_back(1024 * k);
    totals.push_back(1024 * k + 1);
    totals.push_back(1024 * k - 1);
    totals.push_back(64 * (k + 4));
    totals.push_back(64 * (k + 4) + 1);
  }
  std::mt19937_64 rng(2);
  for (const Config& c : configs()) {
    ScopedConfig scoped(c);
    for (size_t total : totals) {
      for (Split split : {Split::kWhole, Split::kMixed, Split::kNearStripes}) {
        const auto runs = splitRuns(total, split, rng);
        expectFusedExact(c, total, runs, 0, 0, rng);  // aligned: streaming stores where chosen
        expectFusedExact(c, total, runs, 3, 17, rng);
        expectFusedExact(c, total, runs, 32, 32, rng);
      }
      if (total <= (64 << 10) + 7) {
        expectFusedExact(c, total, splitRuns(total, Split::kSingleBytes, rng), 1, 2, rng);
      }
    }
  }
}

// Without the hook the widest path the CPU has runs; the hook narrows it.
TEST(BlockSum, TheWidestPathRunsWhereTheCpuHasIt) {
  const FusedPath expected = __builtin_cpu_supports("avx512f") && cpuHasAvx2() ? FusedPath::kAvx512
                             : cpuHasAvx2()                                    ? FusedPath::kAvx2
                                            : FusedPath::kFallback;
  EXPECT_EQ(widestFusedPath(), expected);
  EXPECT_EQ(FusedXxh3(241, CopyMethod::kStreaming).path(), expected);
  EXPECT_EQ(FusedXxh3(240, CopyMethod::kStreaming).path(), FusedPath::kFallback);
  setFusedXxh3MaxPath(FusedPath::kAvx2);
  EXPECT_EQ(FusedXxh3(1 << 20, CopyMethod::kStreaming).path(),
            std::min(expected, FusedPath::kAvx2));
  setFusedXxh3MaxPath(FusedPath::kFallback);
  EXPECT_EQ(FusedXxh3(1 << 20, CopyMethod::kStreaming).path(), FusedPath::kFallback);
  setFusedXxh3MaxPath(FusedPath::kAvx512);
}

// unpackBlockSummed writes what unpackSlots writes for the whole block and returns the block's
// XXH3_64bits, for token sizes below and above a stripe, blocks from 2 bytes to 1 MiB, aligned
// and not.
TEST(BlockSum, UnpackBlockSummedEqualsUnpackSlotsThenXxh3) {
  std::mt19937_64 rng(3);
  for (const Config& c : configs()) {
    ScopedConfig scoped(c);
    for (uint64_t tokenBytes : {2ull, 24ull, 256ull, 2048ull}) {
      for (uint32_t blockTokens : {1u, 16u, 64u}) {
        for (uint32_t numLayers = 1; numLayers <= 4; ++numLayers) {
          const BlockGeometry g{numLayers, blockTokens, tokenBytes};
          const size_t blockBytes = 2ull * numLayers * blockTokens * tokenBytes;
          // The packed buffer holds the block's tokens among others, at an odd address.
          const uint64_t packedTokens = blockTokens + 3, packedFirst = 2;
          std::vector<uint8_t> packed(2ull * numLayers * packedTokens * tokenBytes + 3);
          fillRandom(packed.data(), packed.size(), rng);
          const uint8_t* p = packed.data() + 3;
          std::vector<uint8_t> expected(blockBytes);
          unpackSlots(g, expected.data(), 0, blockTokens, p, packedTokens, packedFirst);
          const uint64_t expectedSum = XXH3_64bits(expected.data(), blockBytes);
          for (size_t offset : {0u, 5u}) {
            AlignedBuffer out(blockBytes + offset + 1);
            std::memset(out.at(0), 0xCD, blockBytes + offset + 1);
            uint8_t* block = out.at(offset);
            EXPECT_EQ(unpackBlockSummed(g, block, p, packedTokens, packedFirst), expectedSum)
                << c.name() << " layers " << numLayers << " tokens " << blockTokens
                << " tokenBytes " << tokenBytes << " offset " << offset;
            EXPECT_EQ(0, std::memcmp(block, expected.data(), blockBytes));
            EXPECT_EQ(block[blockBytes], 0xCD);
            if (offset > 0) {
              EXPECT_EQ(block[-1], 0xCD);
            }
          }
        }
      }
    }
  }
}

// copyBytesSummed copies like copyBytes and returns the source's XXH3_64bits, either direction.
TEST(BlockSum, CopyBytesSummedEqualsCopyThenXxh3) {
  std::mt19937_64 rng(4);
  for (const Config& c : configs()) {
    ScopedConfig scoped(c);
    for (CopyDirection d : {CopyDirection::kIntoPool, CopyDirection::kOutOfPool}) {
      for (size_t n : {0u, 1u, 240u, 241u, 4095u, 4096u, 65536u, 100003u}) {
        AlignedBuffer srcBuf(n + 1), dstBuf(n + 1);
        uint8_t* src = srcBuf.at(1);
        uint8_t* dst = dstBuf.at(0);
        fillRandom(src, n, rng);
        dst[n] = 0xCD;
        const uint64_t sum = copyBytesSummed(dst, src, n, d);
        copyFence();
        EXPECT_EQ(sum, XXH3_64bits(src, n)) << c.name() << " n " << n;
        EXPECT_EQ(0, std::memcmp(dst, src, n));
        EXPECT_EQ(dst[n], 0xCD);
      }
    }
  }
}

TEST(BlockSum, CopyRunsSummedCopiesTheRunsAndSumsTheWholeBlock) {
  // A reader's verified copy: some runs of a block out, every byte of it into the checksum.
  std::mt19937_64 rng(5);
  for (const Config& c : configs()) {
    ScopedConfig scoped(c);
    for (size_t n : {100u, 241u, 4096u, 65536u, 262144u}) {
      AlignedBuffer block(n);
      fillRandom(block.at(0), n, rng);
      // Runs of every shape: none, the whole block, and odd pieces with gaps between them.
      std::vector<std::vector<std::pair<uint64_t, uint64_t>>> shapes = {
          {}, {{0, n}}, {{1, n / 3}, {n / 2, n / 5 + 1}, {n - 7, 7}}, {{0, 64}, {64, n - 64}}};
      for (const auto& shape : shapes) {
        std::vector<uint8_t> out(n + 1, 0xCD);
        std::vector<CopyRun> runs;
        for (const auto& [offset, bytes] : shape)
          runs.push_back({offset, bytes, out.data() + offset});
        const uint64_t sum = copyRunsSummed(block.at(0), n, runs, CopyDirection::kOutOfPool);
        copyFence();
        EXPECT_EQ(sum, XXH3_64bits(block.at(0), n)) << c.name() << " n " << n;
        std::vector<uint8_t> want(n + 1, 0xCD);
        for (const auto& [offset, bytes] : shape) {
          std::memcpy(want.data() + offset, block.at(offset), bytes);
        }
        EXPECT_EQ(out, want) << c.name() << " n " << n << ": only the runs are copied";
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::kernels
