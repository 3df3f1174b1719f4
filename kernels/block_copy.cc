#include "kernels/block_copy.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvtier::kernels {
namespace {

std::atomic<CopyMethod> gMethods[2] = {CopyMethod::kStreaming, CopyMethod::kStreaming};

#if defined(__x86_64__)
// Streams the 32-byte-aligned middle of a run with AVX2 (on the development VM 12 % faster than
// 16-byte stores), prefetching the source a page ahead.
__attribute__((target("avx2"))) void streamAvx2(uint8_t* dst, const uint8_t* src, size_t n) {
  for (size_t i = 0; i + 128 <= n; i += 128) {
    _mm_prefetch(reinterpret_cast<const char*>(src + i + kSourcePrefetchAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(src + i + 64 + kSourcePrefetchAhead), _MM_HINT_T0);
    const auto* s = reinterpret_cast<const __m256i*>(src + i);
    auto* d = reinterpret_cast<__m256i*>(dst + i);
    const __m256i a = _mm256_loadu_si256(s), b = _mm256_loadu_si256(s + 1);
    const __m256i c = _mm256_loadu_si256(s + 2), e = _mm256_loadu_si256(s + 3);
    _mm256_stream_si256(d, a);
    _mm256_stream_si256(d + 1, b);
    _mm256_stream_si256(d + 2, c);
    _mm256_stream_si256(d + 3, e);
  }
}

// The same with 16-byte stores, for CPUs without AVX2.
void streamSse2(uint8_t* dst, const uint8_t* src, size_t n) {
  for (size_t i = 0; i + 64 <= n; i += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(src + i + kSourcePrefetchAhead), _MM_HINT_T0);
    const auto* s = reinterpret_cast<const __m128i*>(src + i);
    auto* d = reinterpret_cast<__m128i*>(dst + i);
    const __m128i a = _mm_loadu_si128(s), b = _mm_loadu_si128(s + 1);
    const __m128i c = _mm_loadu_si128(s + 2), e = _mm_loadu_si128(s + 3);
    _mm_stream_si128(d, a);
    _mm_stream_si128(d + 1, b);
    _mm_stream_si128(d + 2, c);
    _mm_stream_si128(d + 3, e);
  }
}

bool cpuHasAvx2() {
  __builtin_cpu_init();  // this runs as a static initializer: the CPU may not be detected yet
  return __builtin_cpu_supports("avx2");
}
const bool gCpuHasAvx2 = cpuHasAvx2();
std::atomic<bool> gStreamAvx2{gCpuHasAvx2};  // setStreamingAvx2
#endif

// Runs of at least kStreamingThreshold bytes are copied with non-temporal (streaming) stores
// unless the machine measured memcpy faster: the destination of a block copy is not read back
// soon by the copying core (another process, a DMA to the GPU), and where skipping the
// read-for-ownership of every destination line pays, it roughly doubles a single core's bandwidth
// over memcpy (docs/performance.md).
void streamRun(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__x86_64__)
  // Align the destination to 32 bytes, stream the middle, copy the tail.
  const size_t head = std::min(n, (32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31);
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  const bool avx2 = gStreamAvx2.load(std::memory_order_relaxed);
  const size_t middle = n & ~size_t(avx2 ? 127 : 63);
  if (avx2) {
    streamAvx2(dst, src, middle);
  } else {
    streamSse2(dst, src, middle);
  }
  std::memcpy(dst + middle, src + middle, n - middle);
#else
  std::memcpy(dst, src, n);
#endif
}

// Hot path: no allocation, no syscall.
void copyRun(uint8_t* dst, const uint8_t* src, size_t n, CopyMethod method) {
  copyWithMethod(dst, src, n, n >= kStreamingThreshold ? method : CopyMethod::kCached);
}

// Orders the streaming stores before whatever publishes the bytes (a commit, a return).
void fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace

void copyWithMethod(uint8_t* dst, const uint8_t* src, size_t n, CopyMethod method) {
  if (method == CopyMethod::kStreaming) return streamRun(dst, src, n);
  std::memcpy(dst, src, n);
}

bool setStreamingAvx2(bool enabled) {
#if defined(__x86_64__)
  gStreamAvx2.store(enabled && gCpuHasAvx2, std::memory_order_relaxed);
  return enabled && gCpuHasAvx2;
#else
  (void)enabled;
  return false;
#endif
}

CopyMethod copyMethod(CopyDirection direction) {
  return gMethods[static_cast<int>(direction)].load(std::memory_order_relaxed);
}
void setCopyMethod(CopyDirection direction, CopyMethod method) {
  gMethods[static_cast<int>(direction)].store(method, std::memory_order_relaxed);
}
const char* copyMethodName(CopyMethod method) {
  return method == CopyMethod::kStreaming ? "streaming" : "cached";
}

namespace {

constexpr size_t kCalibrationRun = 16 << 10, kCalibrationPrivate = 4 << 20,
                 kCalibrationShared = 16 << 20;

// The buffers a calibration copies between: a private one, and a shared mapping of its own as the
// pool's side (memfd, MAP_SHARED: no name, nothing to remove after). Faulted in up front: a first
// touch costs what the kernel makes it, not what the copy does.
struct CalibrationBuffers {
  CalibrationBuffers() {
    const int fd = static_cast<int>(::syscall(SYS_memfd_create, "kvtier-copy-calibration", 0));
    if (fd < 0) return;
    void* map = ::ftruncate(fd, kCalibrationShared) == 0
                    ? ::mmap(nullptr, kCalibrationShared, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                    : MAP_FAILED;
    ::close(fd);
    if (map == MAP_FAILED) return;
    shared = static_cast<uint8_t*>(map);
    own = std::make_unique<uint8_t[]>(kCalibrationPrivate);
    std::memset(own.get(), 0x5a, kCalibrationPrivate);
    std::memset(shared, 0xa5, kCalibrationShared);
  }
  ~CalibrationBuffers() {
    if (shared) ::munmap(shared, kCalibrationShared);
  }
  std::unique_ptr<uint8_t[]> own;
  uint8_t* shared = nullptr;
  size_t at = 0;  // where in the shared mapping the next pass goes: on from the last one
};

// Writes `n` bytes at `p` back out of the caches. A real copy's source and destination come from
// memory — a model's KV of many MiB, pool blocks last touched long ago — not from what the last
// pass left in cache: with both cached, memcpy looked 10 % faster than streaming into the pool on
// a machine whose puts streamed 25 % faster.
void evict(const uint8_t* p, size_t n) {
#if defined(__x86_64__)
  for (size_t off = 0; off < n; off += 64) _mm_clflush(p + off);
  _mm_mfence();
#else
  (void)p;
  (void)n;
#endif
}

CopyCalibration calibrate(CopyDirection direction, CalibrationBuffers& b) {
  CopyCalibration c;
  if (!b.shared) return c;  // no memory for it: keep streaming
  const bool into = direction == CopyDirection::kIntoPool;
  const auto pass = [&](CopyMethod method) {
    evict(b.own.get(), kCalibrationPrivate);
    evict(b.shared + b.at, kCalibrationPrivate);
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t off = 0; off < kCalibrationPrivate; off += kCalibrationRun) {
      if (into) {
        copyRun(b.shared + b.at + off, b.own.get() + off, kCalibrationRun, method);
      } else {
        copyRun(b.own.get() + off, b.shared + b.at + off, kCalibrationRun, method);
      }
    }
    fence();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    b.at = (b.at + kCalibrationPrivate) % kCalibrationShared;
    return double(kCalibrationPrivate) / std::max(seconds, 1e-9);
  };
  for (int round = 0; round < 3; ++round) {
    const bool streamingFirst = round % 2 == 0;
    const double first = pass(streamingFirst ? CopyMethod::kStreaming : CopyMethod::kCached);
    const double second = pass(streamingFirst ? CopyMethod::kCached : CopyMethod::kStreaming);
    c.streamingBytesPerSecond =
        std::max(c.streamingBytesPerSecond, streamingFirst ? first : second);
    c.cachedBytesPerSecond = std::max(c.cachedBytesPerSecond, streamingFirst ? second : first);
  }
  c.chosen = c.cachedBytesPerSecond >= 1.1 * c.streamingBytesPerSecond ? CopyMethod::kCached
                                                                       : CopyMethod::kStreaming;
  return c;
}

}  // namespace

CopyCalibration calibrateCopyMethod(CopyDirection direction) {
  CalibrationBuffers buffers;
  return calibrate(direction, buffers);
}

void chooseCopyMethodsOnce() {
  static const bool chosen = [] {
    const char* env = std::getenv("KVTIER_COPY_METHOD");
    const std::string asked = env ? env : "auto";
    std::optional<CalibrationBuffers> buffers;
    for (CopyDirection d : {CopyDirection::kIntoPool, CopyDirection::kOutOfPool}) {
      if (asked == "streaming") {
        setCopyMethod(d, CopyMethod::kStreaming);
      } else if (asked == "cached") {
        setCopyMethod(d, CopyMethod::kCached);
      } else {
        if (!buffers) buffers.emplace();
        setCopyMethod(d, calibrate(d, *buffers).chosen);
      }
    }
    return true;
  }();
  (void)chosen;
}

void copyBytes(uint8_t* dst, const uint8_t* src, size_t n, CopyDirection direction) {
  copyRun(dst, src, n, copyMethod(direction));
}

void copyFence() { fence(); }

void packSlots(const BlockGeometry& g, const uint8_t* block, uint32_t firstSlot, uint32_t slots,
               uint8_t* packed, uint64_t packedTokens, uint64_t packedFirst) {
  const uint64_t run = uint64_t{slots} * g.tokenBytes;
  const CopyMethod method = copyMethod(CopyDirection::kOutOfPool);
  for (uint64_t lkv = 0; lkv < 2ull * g.numLayers; ++lkv) {
    copyRun(packed + (lkv * packedTokens + packedFirst) * g.tokenBytes,
            block + (lkv * g.blockTokens + firstSlot) * g.tokenBytes, run, method);
  }
  fence();
}

void unpackSlots(const BlockGeometry& g, uint8_t* block, uint32_t firstSlot, uint32_t slots,
                 const uint8_t* packed, uint64_t packedTokens, uint64_t packedFirst) {
  const uint64_t run = uint64_t{slots} * g.tokenBytes;
  const CopyMethod method = copyMethod(CopyDirection::kIntoPool);
  for (uint64_t lkv = 0; lkv < 2ull * g.numLayers; ++lkv) {
    copyRun(block + (lkv * g.blockTokens + firstSlot) * g.tokenBytes,
            packed + (lkv * packedTokens + packedFirst) * g.tokenBytes, run, method);
  }
  fence();
}

}  // namespace kvtier::kernels
