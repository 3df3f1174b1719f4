#include "bench/local_pool_copies.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cstring>
#include <span>
#include <vector>

#include "client/bench_hooks.h"

namespace kvtier::bench {
namespace {

#if defined(__x86_64__)
__attribute__((target("avx2"))) void streamRun(uint8_t* dst, const uint8_t* src, size_t n) {
  auto* d = reinterpret_cast<__m256i*>(dst);
  const auto* s = reinterpret_cast<const __m256i*>(src);
  size_t i = 0;
  for (; i + 4 <= n / 32; i += 4) {
    const __m256i a = _mm256_loadu_si256(s + i), b = _mm256_loadu_si256(s + i + 1);
    const __m256i c = _mm256_loadu_si256(s + i + 2), e = _mm256_loadu_si256(s + i + 3);
    _mm256_stream_si256(d + i, a);
    _mm256_stream_si256(d + i + 1, b);
    _mm256_stream_si256(d + i + 2, c);
    _mm256_stream_si256(d + i + 3, e);
  }
  std::memcpy(dst + i * 32, src + i * 32, n - i * 32);
}
bool haveStreamRun() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx"); }
#else
void streamRun(uint8_t* dst, const uint8_t* src, size_t n) { std::memcpy(dst, src, n); }
bool haveStreamRun() { return false; }
#endif

// Copies the prefix's runs between the packed buffer and the blocks: into them (`into`) or out.
// `stream`: AVX2 streaming stores, else memcpy. Returns seconds.
double rawRuns(std::span<uint8_t* const> blocks, uint8_t* packed, const Layout& layout, bool into,
               bool stream) {
  const size_t bt = layout.blockTokens, tokenBytes = layout.tokenBytes();
  const size_t run = bt * tokenBytes;
  const size_t lkvs = 2 * size_t{layout.numLayers};
  const auto t0 = Clock::now();
  for (size_t b = 0; b < blocks.size(); ++b) {
    for (size_t lkv = 0; lkv < lkvs; ++lkv) {
      uint8_t* inBlock = blocks[b] + lkv * run;
      uint8_t* inPacked = packed + (lkv * kPrefixTokens + b * bt) * tokenBytes;
      uint8_t* dst = into ? inBlock : inPacked;
      const uint8_t* src = into ? inPacked : inBlock;
      if (stream) {
        streamRun(dst, src, run);
      } else {
        std::memcpy(dst, src, run);
      }
    }
  }
#if defined(__x86_64__)
  if (stream) _mm_sfence();
#endif
  asm volatile("" : : "r"(blocks.data()) : "memory");
  return secondsSince(t0);
}

}  // namespace

Result<PoolCopySeconds> timePoolCopies(Space& space, Workload& w, int iterations) {
  PoolCopySeconds out;
  const bool stream = haveStreamRun();
  for (int i = 0; i < iterations; ++i) {
    auto lease = space.beginPut("bench-raw", 0, w.nextPutTokens());
    if (!lease) return lease.error();
    std::vector<uint8_t*> blocks;
    for (size_t b = 0; b < lease->blockCount(); ++b) blocks.push_back(lease->block(b).data());
    if (blocks.size() != kPrefixBlocks || !blocks[0]) {
      return makeError(ErrorCode::kInternal, "the put was granted ", blocks.size(),
                       " mapped blocks, expected ", kPrefixBlocks);
    }
    for (int k = 0; k < 4; ++k) {
      switch ((k + i) % 4) {
        case 0: {
          const auto t0 = Clock::now();
          auto s = lease->write(0, kPrefixTokens, w.kv.data(), w.kv.size());
          if (!s) return s.error();
          out.write += secondsSince(t0);
          break;
        }
        case 1: {
          bench_hooks::setWriterChecksums(false);
          const auto t0 = Clock::now();
          auto s = lease->write(0, kPrefixTokens, w.kv.data(), w.kv.size());
          out.writeUnsummed += secondsSince(t0);
          bench_hooks::setWriterChecksums(true);
          if (!s) return s.error();
          break;
        }
        case 2:
          out.rawInto[0] += rawRuns(blocks, w.kv.data(), w.layout, true, false);
          break;
        case 3:
          if (stream) out.rawInto[1] += rawRuns(blocks, w.kv.data(), w.layout, true, true);
          break;
      }
    }
    if (auto s = lease->abort(); !s) return s.error();

    auto hit = space.lookup(w.tokens);
    if (!hit) return hit.error();
    if (auto s = expectMatched(*hit, kPrefixTokens); !s) return s.error();
    std::vector<uint8_t*> pinned;
    for (size_t b = 0; b < hit->blockCount(); ++b)
      pinned.push_back(const_cast<uint8_t*>(hit->block(b).data()));
    for (int k = 0; k < 4; ++k) {
      switch ((k + i) % 4) {
        case 0: {
          const auto t0 = Clock::now();
          auto s = hit->copyTo(0, kPrefixTokens, w.out.data(), w.out.size());
          if (!s) return s.error();
          out.copyOut += secondsSince(t0);
          break;
        }
        case 1: {
          bench_hooks::setReaderChecks(false);
          const auto t0 = Clock::now();
          auto s = hit->copyTo(0, kPrefixTokens, w.out.data(), w.out.size());
          out.copyOutUnchecked += secondsSince(t0);
          bench_hooks::setReaderChecks(true);
          if (!s) return s.error();
          break;
        }
        case 2:
          out.rawOut[0] += rawRuns(pinned, w.out.data(), w.layout, false, false);
          break;
        case 3:
          if (stream) out.rawOut[1] += rawRuns(pinned, w.out.data(), w.layout, false, true);
          break;
      }
    }
    hit->release();
  }
  return out;
}

}  // namespace kvtier::bench
