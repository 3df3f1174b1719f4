#include "kernels/block_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace kvtier::kernels {
namespace {

// Runs of at least this many bytes are copied with non-temporal (streaming) stores: the
// destination of a block copy is not read back soon by the copying core (another process, a DMA
// to the GPU), and skipping the read-for-ownership of every destination line roughly doubles the
// bandwidth of a single core over memcpy (docs/performance.md).
constexpr size_t kStreamingThreshold = 4096;

// Hot path: no allocation, no syscall.
void copyRun(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__x86_64__)
  if (n >= kStreamingThreshold) {
    // Align the destination to 16 bytes, stream the middle, copy the tail.
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
    std::memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    std::memcpy(dst + i, src + i, n - i);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

// Orders the streaming stores before whatever publishes the bytes (a commit, a return).
void fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace

void packSlots(const BlockGeometry& g, const uint8_t* block, uint32_t firstSlot, uint32_t slots,
               uint8_t* packed, uint64_t packedTokens, uint64_t packedFirst) {
  const uint64_t run = uint64_t{slots} * g.tokenBytes;
  for (uint64_t lkv = 0; lkv < 2ull * g.numLayers; ++lkv) {
    copyRun(packed + (lkv * packedTokens + packedFirst) * g.tokenBytes,
            block + (lkv * g.blockTokens + firstSlot) * g.tokenBytes, run);
  }
  fence();
}

void unpackSlots(const BlockGeometry& g, uint8_t* block, uint32_t firstSlot, uint32_t slots,
                 const uint8_t* packed, uint64_t packedTokens, uint64_t packedFirst) {
  const uint64_t run = uint64_t{slots} * g.tokenBytes;
  for (uint64_t lkv = 0; lkv < 2ull * g.numLayers; ++lkv) {
    copyRun(block + (lkv * g.blockTokens + firstSlot) * g.tokenBytes,
            packed + (lkv * packedTokens + packedFirst) * g.tokenBytes, run);
  }
  fence();
}

}  // namespace kvtier::kernels
