// The FIFO family: SIEVE and S3-FIFO over the engine's evictable blocks, per size class.
//
// Both keep blocks in the order they first became evictable and never move a block on a hit:
// a use only marks it (lazy promotion). So a block a lookup holds stays where it is in the queue
// while held (erase() marks it held, the queues skip it) instead of leaving and coming back
// newest, as with LRU: that is what makes them FIFOs. A prefix's blocks released together are
// inserted last block first (Engine), so a prefix leaves tail first.
//
// - SIEVE (Zhang et al., NSDI'24): one queue and a hand that walks from the oldest block toward
//   the newest, wrapping: a block used since the hand last passed it is spared (its mark
//   cleared), the first unmarked one goes.
// - S3-FIFO (Yang et al., SOSP'23): a small queue (S, a tenth of the blocks in memory) that new
//   content enters, a main queue (M) and ghosts (G: tags of blocks S evicted, as many as M holds).
//   S's oldest block goes to M if it was used since it came in, else it is evicted (its tag to G);
//   content found in G comes back straight into M; M's oldest block is spared with one use less
//   (0..3 counted), evicted at 0. A burst of one-time content only passes through S.
// Replicas (insert with `first`) go before both, as with the other policies; read again they join
// the main queue.
//
// victim() and oldest() perform the steps the next eviction would perform up to its victim
// (SIEVE's hand clearing marks, S3-FIFO's moves from S to M and M's second chances): they change
// the order, never the set of evictable blocks, so they stay const to the engine; oldest()
// simulates the evictions after that one.
// Per block: 16 bytes (links and state), as LRU; S3-FIFO's ghosts: at most one per block of M
// (about 30 bytes each, GhostLists). Cost: O(1) per call, amortized, plus a step for each held
// block the hand or a queue's walk passes (none when nothing is evictable: a class keeps count).
//
// Not thread-safe (the engine's owner calls it), as every policy.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "store/eviction.h"

namespace kvtier {

// What SIEVE and S3-FIFO share: the state of a block, its class's queues, held blocks kept in
// place, a block's history carried by moved().
class FifoFamilyPolicy : public EvictionPolicy {
 public:
  void erase(BlockId id) override;
  void moved(BlockId from, BlockId to) override;
  size_t size() const override { return size_; }
  void prefetch(BlockId id) const override {
    links_.prefetch(id);
    if (id < state_.size()) __builtin_prefetch(&state_[id], 1);
  }

  // For tests and stats: blocks of `sizeClass` in its main queue, in its small one (S3-FIFO),
  // held ones included.
  uint64_t mainBlocks(uint32_t sizeClass) const;
  uint64_t smallBlocks(uint32_t sizeClass) const;

 protected:
  enum : uint8_t { kUnknown = 0, kSmall = 1, kMain = 2, kReplica = 3 };
  struct State {
    uint8_t queue = kUnknown;  // the queue of the block's content (in it, or carried by moved())
    bool linked : 1 = false;   // in its queue
    bool held : 1 = false;     // in its queue but not evictable (erased)
    uint8_t uses = 0;          // SIEVE: used since the hand passed (0/1); S3-FIFO: 0..3
    uint32_t sizeClass = 0;
  };
  static_assert(sizeof(State) == 8);
  struct Class {
    BlockLists::List small, main, replicas;  // head: oldest (the order's first), tail: newest
    BlockId hand = kNoBlock;  // SIEVE: the next block it looks at (none: main's head)
    GhostLists ghosts;        // S3-FIFO: G (list 0)
    uint64_t evictable = 0;   // blocks linked and not held
  };

  // Marks a block that is in its queue already as used again (insert of a linked block, held or
  // not): it becomes evictable where it stands. Returns false when `id` is not linked.
  bool reinsert(BlockId id, bool first, uint8_t maxUses);
  // Links `id` at the newest end of `queue` (the oldest end for replicas: the last one in goes
  // first, as LRU's `first` gives), evictable, with `uses`.
  void link(BlockId id, uint32_t sizeClass, uint8_t queue, uint8_t uses);
  // Takes `id` out of its queue and forgets it (evicted); its state before.
  State unlinkAndForget(BlockId id);
  BlockLists::List& queueOf(Class& k, uint8_t queue);
  Class& cls(uint32_t c);
  Class* findClass(uint32_t c) const {
    return c < classes_.size() ? const_cast<Class*>(&classes_[c]) : nullptr;
  }
  State& stateOf(BlockId id);  // grown to hold `id`
  bool evictable(BlockId id, std::span<const BlockId> skip) const;
  // Replicas in order, up to `max` (appended to `out`); returns how many.
  size_t oldestReplicas(const Class& k, size_t max, std::vector<BlockId>& out,
                        std::span<const BlockId> skip) const;
  // The block after `id` in `l`, wrapping to its head.
  BlockId nextWrapping(const BlockLists::List& l, BlockId id) const;

  // Mutable: victim() and oldest() rotate (see above).
  mutable BlockLists links_;
  mutable std::vector<State, HugePageAllocator<State>> state_;
  mutable std::vector<Class> classes_;
  size_t size_ = 0;
};

class SieveEvictionPolicy final : public FifoFamilyPolicy {
 public:
  EvictionKind kind() const override { return EvictionKind::kSieve; }
  void insert(BlockId id, uint32_t sizeClass, bool first = false, uint64_t tag = 0) override;
  void evicted(BlockId id, uint64_t tag) override;
  BlockId victim(uint32_t sizeClass) const override;
  void oldest(uint32_t sizeClass, size_t max, std::vector<BlockId>& out,
              std::span<const BlockId> skip = {}) const override;

 private:
  // Moves the hand to the first evictable block not used since it last passed (clearing the
  // marks it passes), as an eviction would; kNoBlock when every block is held.
  BlockId settle(Class& k) const;
};

class S3FifoEvictionPolicy final : public FifoFamilyPolicy {
 public:
  EvictionKind kind() const override { return EvictionKind::kS3Fifo; }
  void insert(BlockId id, uint32_t sizeClass, bool first = false, uint64_t tag = 0) override;
  void evicted(BlockId id, uint64_t tag) override;
  BlockId victim(uint32_t sizeClass) const override;
  void oldest(uint32_t sizeClass, size_t max, std::vector<BlockId>& out,
              std::span<const BlockId> skip = {}) const override;

  // S's share of the blocks in memory (the paper's 10 %), and the most uses counted.
  static constexpr uint64_t kSmallShareDivisor = 10;
  static constexpr uint8_t kMaxUses = 3;

  // For tests: the ghosts of `sizeClass`.
  uint64_t ghostCount(uint32_t sizeClass) const;

 private:
  // Whether the next eviction takes S's oldest block, given S's and M's sizes and whether either
  // has a block left to look at.
  static bool fromSmall(uint64_t small, uint64_t main, bool smallLeft, bool mainLeft);
  // Performs the moves the next eviction would perform (S to M, M's second chances) until the
  // oldest block of S or M is the victim: that block, or kNoBlock when every block is held.
  BlockId settle(Class& k) const;

  struct Moved {
    BlockId id;
    uint8_t uses;
  };
  mutable std::vector<Moved> moved_;  // oldest()'s scratch
};

}  // namespace kvtier
