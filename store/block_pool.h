// BlockPool: fixed-size blocks carved from a pool's extents, with O(1) allocate and release.
//
// The pool knows extents only as (id, bytes): where their memory lives is transport/'s business
// (see BlockMemory). Blocks of one size form a size class with its own free list; memory is carved
// from the extents lazily, the first time a class needs more blocks, and a carved block keeps its
// class for the daemon's life (one model per daemon is the common case; docs/architecture.md).
//
// Every block has a generation that changes each time it is released, so a reference handed to a
// client ({extent, offset, bytes, generation}) is detected as stale once the block is reused.
//
// Not thread-safe: owned by the daemon's event loop.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "kvtier/block_key.h"
#include "store/huge_pages.h"

namespace kvtier {

using BlockId = uint32_t;
inline constexpr BlockId kNoBlock = std::numeric_limits<BlockId>::max();
// A tenant (one salt: docs/security.md) that host-pool blocks are charged to; kNoTenant: none.
using TenantId = uint32_t;
inline constexpr TenantId kNoTenant = std::numeric_limits<TenantId>::max();

enum class BlockState : uint8_t {
  kFree,     // on a free list
  kWriting,  // granted to a write lease, not yet committed: invisible
  kPartial,  // committed, not full: owned by exactly the sequences that hold it
  kSealed,   // full, keyed, immutable, in the prefix index
};

struct BlockLocation {
  uint32_t extent = 0;
  uint64_t offset = 0;
  uint32_t bytes = 0;
  uint64_t generation = 0;
  bool operator==(const BlockLocation&) const = default;
};

// One per block of the pool, 64 bytes (a cache line's worth: with 10 M blocks this array is most
// of the daemon's memory, issue 18): the fields are ordered and the flags packed to that end.
struct BlockMeta {
  Key128 key;  // key of a sealed block
  uint64_t generation = 1;
  uint64_t offset : 48 = 0;  // in its extent (extents are smaller than 2^48 bytes)
  uint64_t extent : 16 = 0;  // extent ids are below 2^16 (BlockPool's constructor checks)
  uint32_t refs = 0;         // sequences holding the block
  uint32_t pins = 0;         // leases pinning the block: never evicted or reused while > 0
  uint32_t space = 0;        // namespace of a sealed block
  // The tenant a host-pool block is charged to (BlockPool::tenantBytes), kNoTenant for none (GPU
  // blocks, scratch blocks).
  TenantId tenant = kNoTenant;
  uint32_t blobBytes = 0;  // a checkpoint's or entry's own size (its block may be larger)
  BlockId nextFree = kNoBlock;
  uint32_t sizeClass = 0;
  BlockState state = BlockState::kFree;
  // A replica fetched from another node: the next this many times it becomes evictable it goes
  // to the front of the eviction order (once after its fetch, once after the lookup that asked
  // for it), so a cluster keeps one copy of a block rather than one per node that read it.
  uint8_t replicaSettles = 0;
  bool entry : 1 = false;     // a sealed position-independent entry (indexed apart from blocks)
  bool onDisk : 1 = false;    // a sealed block whose record the cold tier holds: free to drop
  bool spilling : 1 = false;  // being written to the cold tier (pinned meanwhile)
  // The block is in its tenant's eviction order (Engine).
  bool tenantLinked : 1 = false;
  // The block's checksum (BlockPool::checksum) is set: taken from its writer when it was sealed,
  // or carried with its bytes from the disk or another node. Cleared when the block is released.
  bool summed : 1 = false;
  // Its bytes were found to differ from its checksum: out of the index, freed (never cached
  // again) once nothing holds it (Engine::dropCorrupt).
  bool corrupt : 1 = false;
};
static_assert(sizeof(BlockMeta) == 64);

class BlockPool {
 public:
  struct Extent {
    uint32_t id;
    uint64_t bytes;
    // Which memory the extent is: 0 the host pool, gpuTier(i) the pool of GPU pool i. Blocks of
    // one size in different tiers are different size classes: allocation names the tier it wants.
    uint8_t tier = 0;
  };
  // The tier of the daemon's GPU pool `index` (0, 1, ... in the order the pools were made).
  static constexpr uint8_t gpuTier(size_t index) { return static_cast<uint8_t>(1 + index); }

  explicit BlockPool(std::vector<Extent> extents);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // The size class of blocks of `blockBytes` bytes in `tier`, created on first use.
  uint32_t sizeClass(uint32_t blockBytes, uint8_t tier = 0);
  uint32_t classBytes(uint32_t cls) const { return classes_[cls].blockBytes; }
  uint8_t classTier(uint32_t cls) const { return classes_[cls].tier; }
  // The tier of a block (of its extent).
  uint8_t tierOf(BlockId id) const { return classes_[blocks_[id].sizeClass].tier; }
  // True when some extent belongs to `tier`.
  bool hasTier(uint8_t tier) const { return tier < cursors_.size() && cursors_[tier].present; }

  // A free block of class `cls` (state kWriting, refs 0, pins 0), or kNoBlock when the class has
  // no free block and the extents have no room to carve one. A host-pool block is charged to
  // `tenant` until released (GPU blocks never are). Hot path: O(1), amortised no allocation.
  BlockId allocate(uint32_t cls, TenantId tenant = kNoTenant);
  // Returns a block to its free list, uncharges its tenant and bumps its generation. O(1).
  void release(BlockId id);
  // Moves the charge of allocated block `id` to `tenant` (kNoTenant: nobody). O(1).
  void setTenant(BlockId id, TenantId tenant);
  // Host-pool bytes of the blocks charged to `tenant`. O(1).
  uint64_t tenantBytes(TenantId tenant) const {
    return tenant < tenantBytes_.size() ? tenantBytes_[tenant] : 0;
  }

  BlockMeta& operator[](BlockId id) { return blocks_[id]; }
  const BlockMeta& operator[](BlockId id) const { return blocks_[id]; }
  bool valid(BlockId id) const { return id < blocks_.size(); }
  BlockLocation location(BlockId id) const;
  // The xxh3-64 of a sealed block's bytes, as its writer took it (kept apart from BlockMeta, which
  // is one cache line). Only meaningful while BlockMeta::summed; release() clears it.
  void setChecksum(BlockId id, uint64_t sum) {
    sums_[id] = sum;
    blocks_[id].summed = true;
  }
  void clearChecksum(BlockId id) { blocks_[id].summed = false; }
  std::optional<uint64_t> checksum(BlockId id) const {
    return blocks_[id].summed ? std::optional<uint64_t>(sums_[id]) : std::nullopt;
  }
  // The block at (extent, offset), or kNoBlock. O(1).
  BlockId find(uint32_t extent, uint64_t offset) const;

  // Blocks of class `cls` that exist or could still be carved.
  uint64_t blocksTotal(uint32_t cls) const;
  uint64_t blocksUsed(uint32_t cls) const { return classes_[cls].used; }
  uint64_t blocksUsed() const { return used_; }
  uint64_t bytesUsed() const { return bytesUsed_; }
  uint64_t bytesTotal() const { return bytesTotal_; }
  uint64_t largestExtentBytes() const { return largestExtent_; }  // of the host tier
  size_t classCount() const { return classes_.size(); }
  const std::vector<Extent>& extents() const { return extents_; }

 private:
  struct SizeClass {
    uint32_t blockBytes;
    uint8_t tier = 0;
    BlockId freeHead = kNoBlock;
    uint64_t carved = 0;
    uint64_t used = 0;
  };

  // Where the next block of a tier is carved: extents of other tiers are skipped.
  struct Cursor {
    bool present = false;
    size_t extent = 0;
    uint64_t offset = 0;
  };

  BlockId carve(uint32_t cls);
  uint64_t carvableBlocks(uint32_t blockBytes, uint8_t tier) const;

  std::vector<Extent> extents_;
  std::vector<SizeClass> classes_;
  std::vector<BlockMeta, HugePageAllocator<BlockMeta>> blocks_;
  std::vector<uint64_t, HugePageAllocator<uint64_t>> sums_;  // by block: see checksum()
  // Where blocks were carved, for find(): by extent id, runs of blocks of one size carved one
  // after another (consecutive ids at a fixed stride), in offset order. One model per daemon makes
  // one run per extent; this replaced a hash map of every block's location (40 bytes a block).
  struct Run {
    uint64_t offset;  // of its first block
    uint64_t stride;  // bytes from one block to the next
    BlockId first;    // id of its first block
    uint32_t count;
  };
  std::vector<std::vector<Run>> runs_;
  std::vector<Cursor> cursors_;        // by tier
  std::vector<uint64_t> tenantBytes_;  // by tenant: host-pool bytes charged
  uint64_t used_ = 0;
  uint64_t bytesUsed_ = 0;
  uint64_t bytesTotal_ = 0;
  uint64_t largestExtent_ = 0;
};

// Where a block's bytes are: implemented over shared memory by transport/ and over the heap for
// in-process use and tests. Pointers stay valid for the pool's life.
//
// An extent may live in GPU memory (a tiered pool): its base is then a device address, which the
// CPU must not dereference. The engine asks hostAddressable before touching bytes itself, and
// moves bytes between blocks only through copy().
class BlockMemory {
 public:
  virtual ~BlockMemory() = default;
  virtual uint8_t* extentBase(uint32_t extent) = 0;
  uint8_t* blockData(const BlockMeta& meta) { return extentBase(meta.extent) + meta.offset; }
  virtual bool hostAddressable(uint32_t /*extent*/) const { return true; }
  // Copies `bytes` between addresses inside extents (host or device, either way). Blocking.
  virtual void copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
    std::memcpy(dst, src, bytes);
  }
};

// One copy of bytes between two extents' memory (a move between tiers).
struct BlockCopy {
  uint8_t* dst = nullptr;
  const uint8_t* src = nullptr;
  uint64_t bytes = 0;
};

// A range of addresses: one extent's memory (a separate allocation or registration).
struct MemoryRange {
  const uint8_t* base = nullptr;
  uint64_t bytes = 0;
};

// The same bytes moved by fewer copies: `copies` (disjoint, so their order does not matter) sorted
// by source, and every copy that continues the previous one on both sides merged into it, as long
// as each side stays inside one of `ranges` (a copy must not cross from one allocation into
// another even where their addresses happen to meet; a copy outside every range is left alone).
// Blocks of a prefix often sit side by side in both pools: one DMA per run instead of one per
// block keeps the copy engine streaming instead of waiting for the next call.
std::vector<BlockCopy> coalesceCopies(std::vector<BlockCopy> copies,
                                      std::span<const MemoryRange> ranges);

// Heap-backed extents: for in-process engines and unit tests.
class HeapBlockMemory final : public BlockMemory {
 public:
  explicit HeapBlockMemory(const std::vector<BlockPool::Extent>& extents);
  uint8_t* extentBase(uint32_t extent) override { return extents_.at(extent).data(); }

 private:
  std::vector<std::vector<uint8_t>> extents_;
};

}  // namespace kvtier
