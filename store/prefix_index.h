// PrefixIndex: the engine's map from (namespace, key) to the sealed block holding that content.
//
// Ten million indexed blocks must cost little memory and no more per lookup than ten thousand
// (issue 18). A node-based hash map (std::unordered_map) costs ~70 bytes an entry and two
// dependent cache misses a probe (bucket, node). This table stores no key at all: a sealed
// block's namespace and key are in its BlockMeta already, which a lookup reads anyway. A slot is
// 8 bytes: the block id and 32 bits of the key's hash, which are also where the slot's home is
// (hash & mask), so growing never reads a block's metadata and a probe reads a block's metadata
// only when 32 bits of hash match (a false match is 1 in 2^(32 - log2 capacity) per slot
// passed). Open addressing with linear probing, at most 3/4 full (8 to 16 bytes a block),
// deletion by backward shift (no tombstones: probe lengths never degrade with churn).
//
// The hash mixes the key with the namespace and a seed chosen at random per process: keys are
// chosen by clients (an SDK may send its own), and a client that could aim keys at one run of
// slots would slow every other client's lookups.
//
// Not thread-safe: owned by the engine (the daemon's event loop).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/block_key.h"
#include "store/block_pool.h"
#include "store/huge_pages.h"

namespace kvtier {

class PrefixIndex {
 public:
  // `pool` holds the metadata (space, key) of the blocks indexed; it must outlive the index.
  explicit PrefixIndex(const BlockPool& pool, uint64_t seed = 0);

  // The hash of (space, key), for find/prefetch: compute once, use for both.
  uint32_t hash(uint32_t space, const Key128& key) const;
  // Brings the slot a probe of `h` starts at into the cache (a batch of lookups issues these
  // ahead of the probes, so that their cache misses overlap).
  void prefetch(uint32_t h) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[h & mask_]);
  }

  // The block indexed under (space, key), or kNoBlock.
  BlockId find(uint32_t space, const Key128& key) const {
    return find(space, key, hash(space, key));
  }
  BlockId find(uint32_t space, const Key128& key, uint32_t h) const;
  // The blocks of keys[0], keys[1], ... up to the first key not indexed, appended to `out`;
  // returns how many. Probes run a few keys behind prefetches of the slots and of the blocks'
  // metadata, so that a long prefix's cache misses overlap rather than add up.
  size_t findRun(uint32_t space, std::span<const Key128> keys, std::vector<BlockId>& out) const;
  // Indexes `block` under (space, key) unless a block is indexed there already: returns that
  // block (and changes nothing), or kNoBlock when `block` was added. `block`'s metadata need not
  // hold the key yet, but must before the next call that probes for it.
  BlockId insert(uint32_t space, const Key128& key, BlockId block);
  // Removes the entry for (space, key); false when there is none.
  bool erase(uint32_t space, const Key128& key);
  // Points the entry for (space, key) at `block` (a move between tiers); false when there is none.
  // `block`'s metadata must hold the same space and key.
  bool replace(uint32_t space, const Key128& key, BlockId block);

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Bytes of the table (for stats and tests).
  size_t memoryBytes() const { return slots_.capacity() * sizeof(Slot); }
  // Calls f(block) for every indexed block (in no particular order).
  template <typename F>
  void forEach(F&& f) const {
    for (const Slot& s : slots_) {
      if (s.block != kNoBlock) f(s.block);
    }
  }

 private:
  struct Slot {
    uint32_t hash = 0;
    BlockId block = kNoBlock;  // kNoBlock: empty
  };
  // The slot holding (space, key), or slots_.size().
  size_t slotOf(uint32_t space, const Key128& key, uint32_t h) const;
  bool matches(const Slot& s, uint32_t space, const Key128& key, uint32_t h) const;
  void grow();

  const BlockPool& pool_;
  uint64_t seed_;
  mutable std::vector<uint32_t> hashScratch_;  // findRun's
  std::vector<Slot, HugePageAllocator<Slot>> slots_;                    // a power of two in size, or empty
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace kvtier
