// CPU block copies between kvtier's layer-major blocks and a packed token buffer.
//
// A block holds [layer][K|V][slot][kvHead][headDim] for `blockTokens` slots. A packed buffer holds
// the same for a run of `packedTokens` consecutive positions: [layer][K|V][token][kvHead][headDim].
// These copy `slots` token slots starting at block slot `firstSlot` to or from packed token index
// `packedFirst`: 2 * numLayers memcpy calls of slots * tokenBytes bytes each.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvtier::kernels {

struct BlockGeometry {
  uint32_t numLayers;
  uint32_t blockTokens;
  uint64_t tokenBytes;  // one token's K (or V) for one layer
};

// How runs of at least kStreamingThreshold bytes are copied. Streaming (non-temporal) stores skip
// the read-for-ownership of each destination line and win on CPUs where that read is dear (2x on
// the development VM); on others glibc's memcpy is faster (issue 18: a 2-core machine whose memcpy
// ran at twice the development VM's, where the streaming write into the pool was slower than
// memcpy of the same bytes). It can differ by direction on one machine (the 2026-11-27 VM: into
// the shared pool memcpy wrote 16 MiB in 1.5 ms against 2.1 ms streaming, out of it streaming was
// faster), so each direction's method is measured, not assumed: see calibrateCopyMethod.
enum class CopyMethod : uint8_t { kStreaming, kCached };
// Into the pool: a put's write (unpackSlots). Out of the pool: a get's copy (packSlots).
enum class CopyDirection : uint8_t { kIntoPool, kOutOfPool };
inline constexpr size_t kStreamingThreshold = 4096;
// Streaming copies (and the checksummed copies of block_sum.h) prefetch their source this far
// ahead: one 4 KiB page. A CPU's hardware prefetchers stop at the end of a page, so without it
// each page of a run starts with misses the copy waits for; with it a 16 KiB-run copy into the
// pool ran 5-15 % faster on the development VM (docs/performance.md).
inline constexpr size_t kSourcePrefetchAhead = 4096;

// For tests: false makes streaming copies take the 16-byte path of CPUs without AVX2; true goes
// back to AVX2 where the CPU has it. Returns whether AVX2 is in use now.
bool setStreamingAvx2(bool enabled);

// The method in use for a direction (kStreaming until set).
CopyMethod copyMethod(CopyDirection direction);
void setCopyMethod(CopyDirection direction, CopyMethod method);
const char* copyMethodName(CopyMethod method);

struct CopyCalibration {
  CopyMethod chosen = CopyMethod::kStreaming;
  double streamingBytesPerSecond = 0, cachedBytesPerSecond = 0;
};
// Times both methods for `direction` on this machine — 16 KiB runs (a block's run for a common
// layout) between a private 4 MiB buffer and a 16 MiB shared mapping (memfd, MAP_SHARED: the pool
// is one), each pass on a part of the mapping the last one did not touch, both sides flushed out
// of the caches first (as a put's source and the pool's blocks come from memory), best of 3 each,
// alternating — and chooses memcpy only where it beats streaming by at least 10% (noise must not
// flip a machine to the slower method). No effect on copyMethod() (setCopyMethod does).
CopyCalibration calibrateCopyMethod(CopyDirection direction);
// Once per process (later calls return at once): KVTIER_COPY_METHOD=streaming or cached sets both
// directions; unset (or auto) measures each with calibrateCopyMethod (~15 ms for both on a 2-core
// VM). The SDK calls it when it first maps a pool (kvtierd's own copies — inline writes of clients
// that do not map the pool — stream).
void chooseCopyMethodsOnce();

// Copies one run of `n` bytes out of or into the pool with that direction's method; streaming
// stores are ordered by copyFence(), which the caller issues before it publishes the bytes. For
// copies whose other side is not a packed buffer (the llama.cpp integration's state rows). Hot
// path: no allocation, no syscall.
void copyBytes(uint8_t* dst, const uint8_t* src, size_t n, CopyDirection direction);
void copyFence();
// Copies `n` bytes (any number) with `method` itself, kStreamingThreshold not applied: for a caller
// that chose the method for a whole run and copies it in pieces (block_sum.cc's checksummed
// copies). Streaming stores are ordered by copyFence(). Hot path: no allocation, no syscall.
void copyWithMethod(uint8_t* dst, const uint8_t* src, size_t n, CopyMethod method);

// Hot path: no allocation, no syscall.
void packSlots(const BlockGeometry& g, const uint8_t* block, uint32_t firstSlot, uint32_t slots,
               uint8_t* packed, uint64_t packedTokens, uint64_t packedFirst);
void unpackSlots(const BlockGeometry& g, uint8_t* block, uint32_t firstSlot, uint32_t slots,
                 const uint8_t* packed, uint64_t packedTokens, uint64_t packedFirst);

}  // namespace kvtier::kernels
