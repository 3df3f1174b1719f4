// Eviction policy: which evictable block goes first when a size class runs out.
//
// A block is evictable when it is sealed and in the prefix index, no sequence holds it and no
// lease pins it. The engine tells the policy when a block becomes evictable (insert) and when it
// stops being so (erase); the policy only orders them. Pluggable: LRU is the default.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "store/block_pool.h"

namespace kvtier {

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // `id` became evictable now: the most recently used, or with `first`, the first to go (a
  // replica fetched from another node, which holds the block too). Inserting a block that is in
  // already moves it there (a use that did not pin it, e.g. a lookup's plan).
  // A prefix's blocks released together are inserted last block first (Engine), so that an
  // order that keeps insertion order evicts a prefix from its tail.
  virtual void insert(BlockId id, uint32_t sizeClass, bool first = false) = 0;
  // `id` is no longer evictable (held, pinned or evicted). No-op if not inserted.
  virtual void erase(BlockId id) = 0;
  // The block of `sizeClass` to evict first, or kNoBlock. Does not erase it.
  virtual BlockId victim(uint32_t sizeClass) const = 0;
  // Up to `max` blocks of `sizeClass` in eviction order (first to go first), appended to `out`.
  virtual void oldest(uint32_t sizeClass, size_t max, std::vector<BlockId>& out) const = 0;
  virtual size_t size() const = 0;
};

// Least recently used first. O(1) per operation: intrusive lists over block ids.
class LruEvictionPolicy final : public EvictionPolicy {
 public:
  void insert(BlockId id, uint32_t sizeClass, bool first = false) override;
  void erase(BlockId id) override;
  BlockId victim(uint32_t sizeClass) const override;
  void oldest(uint32_t sizeClass, size_t max, std::vector<BlockId>& out) const override;
  size_t size() const override { return size_; }

 private:
  struct Node {
    BlockId prev = kNoBlock;
    BlockId next = kNoBlock;
    uint32_t sizeClass = 0;
    bool linked = false;
  };
  struct List {
    BlockId head = kNoBlock;  // least recently used
    BlockId tail = kNoBlock;  // most recently used
  };
  std::vector<Node> nodes_;
  std::vector<List> lists_;
  size_t size_ = 0;
};

}  // namespace kvtier
