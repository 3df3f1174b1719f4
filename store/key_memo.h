// KeyMemo: the block keys the engine has hashed, remembered with what they were hashed from, so
// that a lookup of a prefix it has seen (put by any client, looked up before) takes each key from
// memory instead of hashing it again.
//
// A key is SHA-256 of the previous key (the namespace's fingerprint and salt for block 0) and the
// block's tokens (kvtier/block_key.h): two SHA-256 compressions in a chain, ~130 ns a block on the
// development VM, where each waits for the last, so that a 64-block lookup spent more time hashing
// than everything else it does. A remembered key is a fact about SHA-256, not about the pool: it
// never goes stale, whatever is evicted, and it is found only by an exact match of everything it
// was hashed from (namespace, previous key or root, every token), never by a hash of them, so a
// key taken from here is the key SHA-256 gives. The slot a key lives in is chosen by a seeded
// xxh3 of the block's tokens and position (computable for every block of a prompt at once, so
// that the slots of a long prefix are fetched ahead, their cache misses overlapping); a key that
// lands in an occupied slot replaces what was there (direct-mapped: bounded memory, no probe
// chains a client could lengthen). A miss costs the hash it would have cost anyway.
//
// Blocks of more than kMaxTokens tokens are not remembered. Not thread-safe: the engine's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "kvtier/block_key.h"

namespace kvtier {

class KeyMemo {
 public:
  static constexpr size_t kDefaultSlots = 16384;  // ~4.8 MB once used (296 bytes a slot)
  static constexpr uint32_t kMaxTokens = 64;

  // `slots` is rounded up to a power of two; the table is allocated at the first remember().
  explicit KeyMemo(size_t slots = kDefaultSlots, uint64_t seed = 0);

  // The slot of block `index` of a chain in namespace `space` holding `tokens`.
  uint64_t slotOf(uint32_t space, size_t index, std::span<const uint32_t> tokens) const;
  void prefetch(uint64_t slot) const {
    if (slots_) __builtin_prefetch(&slots_[slot]);
  }
  // The key hashed from (`previous`, or the root when null; `tokens`) in `space`, when `slot`
  // holds it; else null.
  const Key128* find(uint64_t slot, uint32_t space, const Key128* previous,
                     std::span<const uint32_t> tokens) const;
  void remember(uint64_t slot, uint32_t space, const Key128* previous,
                std::span<const uint32_t> tokens, const Key128& key);

  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

 private:
  struct Slot {
    Key128 previous;  // zero for block 0 (root)
    Key128 key;
    uint32_t space = 0;
    uint16_t tokenCount = 0;  // 0: empty
    bool root = false;
    uint32_t tokens[kMaxTokens];
  };
  size_t mask_;
  uint64_t seed_;
  std::unique_ptr<Slot[]> slots_;
  mutable uint64_t hits_ = 0, misses_ = 0;
};

// The keys of a namespace's chain, from the memo where it has them, else hashed (and
// remembered). Cheap to create; not thread-safe.
class MemoHasher {
 public:
  // `memo` may be null: every key is hashed.
  MemoHasher(uint64_t fingerprint, const Salt& salt, uint32_t space, KeyMemo* memo)
      : hasher_(fingerprint, salt), space_(space), memo_(memo) {}

  static constexpr uint64_t kNoSlot = UINT64_MAX;
  // The key of block `index` holding `tokens`, chained after `previous` (null for block 0).
  // `slot`: what prefetch() returned for the block, so that it is not computed again.
  Key128 next(size_t index, const Key128* previous, std::span<const uint32_t> tokens,
              uint64_t slot = kNoSlot);
  // Fetches the memo's slot for block `index` ahead of next() and returns it (kNoSlot without a
  // memo or for blocks too long to remember).
  uint64_t prefetch(size_t index, std::span<const uint32_t> tokens) const;

 private:
  BlockKeyHasher hasher_;
  uint32_t space_;
  KeyMemo* memo_;
};

}  // namespace kvtier
