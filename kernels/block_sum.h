// Checksummed copies into the pool: the writer computes a block's checksum in the same pass as the
// copy that writes the block, from the registers that copy loaded, so the source is read once and
// a put costs what a plain copy does. The destination is never read back (it is another process's
// memory soon, and reading it would cost a second pass over the pool).
//
// The checksum is XXH3-64 (default secret, seed 0): blockChecksum below, which a reader verifies
// with; the fused computation gives the same 64 bits for every length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/block_copy.h"

namespace kvtier::kernels {

// A block's (or blob's) checksum: XXH3_64bits(data, n). The one definition: every writer and
// verifier of a checksum goes through this or through the fused copies below, which equal it.
uint64_t blockChecksum(const void* data, size_t n);

// Copies runs dst <- src and folds them, in order, into XXH3_64bits of their concatenation, whose
// total length is given up front (XXH3's last stripe and final mix depend on it). Runs may have any
// length and alignment; a stripe that straddles two runs is carried between them. Runs of at least
// kStreamingThreshold bytes are stored with `method`, as copyBytes would (on the AVX2 path,
// streaming stores need the destination 32-byte aligned at stripe boundaries, as it is in pool
// blocks; elsewhere they are plain stores); the caller issues copyFence() after the last run before
// it publishes the bytes.
//
// With AVX-512 or AVX2 (checked at run time) and more than 240 bytes, each 64-byte stripe is
// loaded once, stored, and accumulated from the same registers (AVX-512: one register a stripe,
// half the instructions of AVX2's two, which leaves the out-of-order window room to keep more of
// the source's cache misses in flight). Otherwise (240 bytes or fewer, where XXH3 has
// no stripes; no AVX2; not x86-64) each run is copied in pieces of up to 16 KiB and each piece,
// still in cache, is hashed with XXH3's streaming state: the same result, slower.
//
// Hot path: no allocation, no syscall. The object is 640 bytes, 64-byte aligned: keep it on the
// stack of the copy.
// How a FusedXxh3 computes: the widest of these the CPU has (FusedPath::kFallback off x86-64).
enum class FusedPath : uint8_t { kFallback, kAvx2, kAvx512 };

class FusedXxh3 {
 public:
  FusedXxh3(uint64_t totalBytes, CopyMethod method);
  FusedXxh3(const FusedXxh3&) = delete;
  FusedXxh3& operator=(const FusedXxh3&) = delete;

  // The next `n` bytes: copied from src to dst and folded in. At most totalBytes in all. A null
  // dst folds them in without copying them anywhere (bytes checked but not wanted).
  void feed(uint8_t* dst, const uint8_t* src, size_t n);
  // XXH3_64bits of the totalBytes fed (all of them must have been).
  uint64_t digest() const;
  // The path this object takes (240 bytes or fewer: always the fallback).
  FusedPath path() const { return path_; }

  // XXH3's state is kept as bytes here so that this header does not pull in xxhash.h.
  static constexpr size_t kXxh3StateBytes = 576;

 private:
  // The fused path's state: XXH3's accumulators and what a run boundary leaves over.
  struct Stripes {
    alignas(64) uint64_t acc[8];
    uint64_t regular;   // stripes accumulated in order: (total - 1) / 64 (the last is apart)
    uint64_t done;      // of those, accumulated so far
    uint8_t carry[64];  // the start of stripe `done`, when a run ended inside it
    size_t carried;
    uint8_t last[64];  // bytes [total - 64, total): XXH3's last stripe, as they come
  };

  void feedStripes(uint8_t* dst, const uint8_t* src, size_t n, CopyMethod method);
  void keepLastStripe(const uint8_t* src, size_t n);
  void feedState(uint8_t* dst, const uint8_t* src, size_t n, CopyMethod method);

  uint64_t total_;
  uint64_t fed_ = 0;
  CopyMethod method_;
  FusedPath path_;
  union {
    Stripes stripes_;
    alignas(64) unsigned char state_[kXxh3StateBytes];  // XXH3_state_t, fallback path
  };
};

// A run of a block's bytes a verified read copies out: bytes [offset, offset + bytes) to dst.
struct CopyRun {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint8_t* dst = nullptr;
};
// Copies the runs (ascending, not overlapping, within the block) out of a block of `blockBytes`
// and returns XXH3_64bits of the whole block, every byte read once: the runs' as they are copied,
// the others as they are folded in. What a reader verifies a block with (the writer's checksum is
// of the whole block) without reading it twice, and without a window between the check and the
// copy. The caller issues copyFence() as with copyBytes.
uint64_t copyRunsSummed(const uint8_t* block, size_t blockBytes, std::span<const CopyRun> runs,
                        CopyDirection direction);
// The same with a copy method of the caller's choosing (kCached for a destination read again at
// once).
uint64_t copyRunsSummed(const uint8_t* block, size_t blockBytes, std::span<const CopyRun> runs,
                        CopyMethod method);

// copyBytes(dst, src, n, direction) that also returns XXH3_64bits(src, n), in one pass (for
// blobs). The caller issues copyFence() as with copyBytes.
uint64_t copyBytesSummed(uint8_t* dst, const uint8_t* src, size_t n, CopyDirection direction);

// Writes a whole block exactly as unpackSlots(g, block, 0, g.blockTokens, packed, packedTokens,
// packedFirst) does (kIntoPool's method, fenced at the end) and returns its checksum,
// XXH3_64bits(block, 2 * numLayers * blockTokens * tokenBytes), computed from the source as it is
// copied: the block is not read back.
uint64_t unpackBlockSummed(const BlockGeometry& g, uint8_t* block, const uint8_t* packed,
                           uint64_t packedTokens, uint64_t packedFirst);

// The widest path the CPU offers (what FusedXxh3 takes by default).
FusedPath widestFusedPath();
// Test hook: FusedXxh3 objects constructed after it take at most `path` (kAvx512: no limit). Not
// for production use.
void setFusedXxh3MaxPath(FusedPath path);

}  // namespace kvtier::kernels
