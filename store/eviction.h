// Eviction policy: which evictable block goes first when a size class runs out.
//
// A block is evictable when it is sealed and in the prefix index, no sequence holds it and no
// lease pins it. The engine tells the policy when a block becomes evictable (insert), when it
// stops being so (erase), and when it leaves memory (evicted, moved); the policy only orders them.
// Pluggable: `kvtierd --eviction adaptive|lru|arc|2q|s3fifo|sieve`; the adaptive policy, which
// follows whichever of the others would hit most on the workload it sees, is the default
// (docs/cache-policy.md). SIEVE and S3-FIFO: store/eviction_fifo.h; the adaptive policy:
// store/eviction_adaptive.h.
//
// Not thread-safe: the engine's owner (the daemon's event loop) calls it. Every call is O(1)
// (oldest: O(max)); nothing allocates per call once the block ids have been seen.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "kvtier/error.h"
#include "store/block_pool.h"
#include "store/huge_pages.h"

namespace kvtier {

// The policies `kvtierd --eviction` offers.
enum class EvictionKind : uint8_t {
  kLru,       // least recently used first
  kArc,       // adaptive replacement (recency and frequency)
  kTwoQ,      // new content on probation, first to go; content seen reused protected (2Q)
  kS3Fifo,    // a small FIFO for new content, a main one for content used again, ghosts (S3-FIFO)
  kSieve,     // one FIFO, a hand that spares blocks used since it last passed (SIEVE)
  kAdaptive,  // follows whichever of the five would hit most, measured as it runs: the default
};
inline constexpr EvictionKind kDefaultEviction = EvictionKind::kAdaptive;
const char* evictionName(EvictionKind kind);
// "lru", "arc", "2q", "s3fifo", "sieve" or "adaptive"; INVALID_ARGUMENT otherwise.
Result<EvictionKind> parseEvictionKind(std::string_view name);

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // `id` became evictable now: the most recently used, or with `first`, the first to go (a
  // replica fetched from another node, which holds the block too). Inserting a block that is in
  // already moves it there (a use that did not pin it, e.g. a lookup's plan).
  // A prefix's blocks released together are inserted last block first (Engine), so that an
  // order that keeps insertion order evicts a prefix from its tail.
  // `tag` names the block's content (its namespace and key, hashed; 0: unknown): the same for the
  // same content whichever block holds it, so that a policy may recognise content it evicted.
  virtual void insert(BlockId id, uint32_t sizeClass, bool first = false, uint64_t tag = 0) = 0;
  // `id` is no longer evictable (held or pinned): it leaves the order, the policy may keep its
  // history for when it comes back. No-op if not inserted.
  virtual void erase(BlockId id) = 0;
  // `id` (its content: `tag`) left memory: erased, and inserted again it is another block. Every
  // block the policy was told of leaves through evicted() or moved() before its id is reused.
  virtual void evicted(BlockId id, uint64_t tag) = 0;
  // The content of `from` now lives in block `to` (a move between tiers): `to` takes `from`'s
  // history, `from` is another block when inserted again. Neither is in the order (both pinned).
  virtual void moved(BlockId from, BlockId to) = 0;
  // A hint about a prefix's shape, before the blocks' first insert: one commit sealed `fresh`
  // (new content, in chain order) in a chain whose blocks before the first of them number
  // `position`, `parent` being the last of those (kNoBlock when position is 0). A policy that
  // does not use it ignores it.
  virtual void sealed(std::span<const BlockId> /*fresh*/, BlockId /*parent*/,
                      uint64_t /*position*/) {}
  // The block of `sizeClass` to evict first, or kNoBlock. Does not erase it. Never a block that
  // was erased (held or pinned) and not inserted again.
  virtual BlockId victim(uint32_t sizeClass) const = 0;
  // Up to `max` blocks of `sizeClass` in eviction order (first to go first), appended to `out`:
  // the blocks that successive victim() and evicted() calls would give, the blocks of `skip`
  // (sorted; about to be pinned) left out as if they had been erased first.
  virtual void oldest(uint32_t sizeClass, size_t max, std::vector<BlockId>& out,
                      std::span<const BlockId> skip = {}) const = 0;
  // Blocks in the order (evictable now).
  virtual size_t size() const = 0;
  // Brings what insert/erase of `id` read into the cache: a caller about to hold or release a run
  // of blocks issues these a few blocks ahead, so that the misses of a large index overlap.
  virtual void prefetch(BlockId /*id*/) const {}
  // For stats: the policy (`kvtierd --eviction`); the one that orders the blocks now (the
  // adaptive policy's current expert; the policy itself otherwise); how many times that changed.
  virtual EvictionKind kind() const = 0;
  virtual EvictionKind following() const { return kind(); }
  virtual uint64_t switches() const { return 0; }
};

std::unique_ptr<EvictionPolicy> makeEvictionPolicy(EvictionKind kind);

// Intrusive doubly linked lists over block ids, one node per id (8 bytes), O(1) link and unlink
// at either end or in the middle. The caller knows which list a block is linked in, if any.
class BlockLists {
 public:
  struct List {
    BlockId head = kNoBlock;  // first to go
    BlockId tail = kNoBlock;  // last to go
    uint64_t size = 0;
  };
  void reserve(BlockId id) {
    if (id >= nodes_.size()) nodes_.resize(size_t{id} + 1);
  }
  BlockId next(BlockId id) const { return nodes_[id].next; }
  BlockId prev(BlockId id) const { return nodes_[id].prev; }
  void prefetch(BlockId id) const {
    if (id < nodes_.size()) __builtin_prefetch(&nodes_[id], 1);
  }
  // `id` (reserved, not linked) goes to the tail of `l` (or its head, with `atHead`).
  void link(List& l, BlockId id, bool atHead = false);
  void unlink(List& l, BlockId id);

 private:
  struct Node {
    BlockId prev = kNoBlock;
    BlockId next = kNoBlock;
  };
  std::vector<Node, HugePageAllocator<Node>> nodes_;
};

// Least recently used first.
class LruEvictionPolicy final : public EvictionPolicy {
 public:
  EvictionKind kind() const override { return EvictionKind::kLru; }
  void insert(BlockId id, uint32_t sizeClass, bool first = false, uint64_t tag = 0) override;
  void erase(BlockId id) override;
  void evicted(BlockId id, uint64_t /*tag*/) override { erase(id); }
  void moved(BlockId /*from*/, BlockId /*to*/) override {}
  BlockId victim(uint32_t sizeClass) const override;
  void oldest(uint32_t sizeClass, size_t max, std::vector<BlockId>& out,
              std::span<const BlockId> skip = {}) const override;
  size_t size() const override { return size_; }
  void prefetch(BlockId id) const override {
    links_.prefetch(id);
    if (id < state_.size()) __builtin_prefetch(&state_[id], 1);
  }

 private:
  struct State {
    uint32_t sizeClass = 0;
    bool linked = false;
  };
  BlockLists links_;
  std::vector<State, HugePageAllocator<State>> state_;  // by block id
  std::vector<BlockLists::List> lists_;
  size_t size_ = 0;
};

// Tags of blocks evicted lately, in two FIFO lists (ARC's ghosts B1 and B2), bounded by the
// caller. Compact: a 32-bit fingerprint of each tag in an open-addressing table (8 bytes a slot,
// at most 3/4 full) and in a queue (8 bytes an entry; entries dropped by a hit wait there until
// they reach the front or the queue is compacted): about 30 bytes per ghost (28 measured on the
// shared trace at 20,000 blocks). Two tags with one fingerprint are one ghost: a hit on the wrong
// one only takes a block for a reused one.
class GhostLists {
 public:
  // Adds `tag` to the back of list `list` (0 or 1); a ghost of the same fingerprint leaves the
  // list it was in.
  void add(uint64_t tag, int list);
  // The list holding `tag` (0 or 1), which it leaves; -1 when neither does.
  int take(uint64_t tag);
  // Drops the oldest ghost of `list`; false when it is empty.
  bool dropOldest(int list);
  uint64_t size(int list) const { return count_[list]; }
  uint64_t size() const { return count_[0] + count_[1]; }
  // Bytes held (table and queues), for tests and stats.
  size_t memoryBytes() const;

 private:
  struct Slot {
    uint32_t fp = 0;   // 0: empty
    uint32_t seq = 0;  // the entry's number; low bit: its list
  };
  struct Queued {
    uint32_t fp;
    uint32_t seq;
  };
  static uint32_t fingerprint(uint64_t tag);
  size_t find(uint32_t fp) const;  // its slot, or the table's size
  void erase(size_t slot);
  void grow();
  void compact(int list);

  std::vector<Slot> table_;  // a power of two in size (or empty)
  std::vector<Queued> queue_[2];
  size_t front_[2] = {0, 0};  // the queues' first live-or-stale entry
  uint64_t count_[2] = {0, 0};
  uint32_t nextSeq_ = 2;
};

// Adaptive Replacement Cache (Megiddo and Modha, FAST'03) over the engine's evictable blocks,
// per size class, made aware of prefixes. Blocks used once since they entered memory are in the
// recency list (T1), blocks used again in the frequency list (T2); each list is kept in the
// order blocks became evictable, so a prefix released tail first goes tail first within its
// list. The target size of T1 adapts: an insert of content recently evicted from T1 (a ghost in
// B1) says T1 was too small, one evicted from T2 (B2) that T2 was. A one-time scan (new content,
// used once) thus only cycles through T1 and never flushes the prefixes reused across requests
// in T2. Replicas (insert with `first`) go before both lists.
// Prefixes: a block is only worth its chain. New blocks that a request appends to a prefix it
// reused from memory, at most kContinuationRatio of them per reused block, are a conversation's
// or an agent's next turn — the part the next turn needs most — and start in T2 with the prefix
// they extend, instead of on probation in T1, where plain ARC would evict the tails of the
// conversations it keeps the heads of (sealed()). New content that reuses little or nothing (a
// document, a scan, even after a shared system prompt) starts in T1.
// Per block: 16 bytes (links and state), as LRU; ghosts: at most one per block of the class seen
// (about 24 bytes each, GhostLists).
class ArcEvictionPolicy final : public EvictionPolicy {
 public:
  EvictionKind kind() const override { return EvictionKind::kArc; }
  void insert(BlockId id, uint32_t sizeClass, bool first = false, uint64_t tag = 0) override;
  void erase(BlockId id) override;
  void evicted(BlockId id, uint64_t tag) override;
  void moved(BlockId from, BlockId to) override;
  void sealed(std::span<const BlockId> fresh, BlockId parent, uint64_t position) override;
  BlockId victim(uint32_t sizeClass) const override;
  void oldest(uint32_t sizeClass, size_t max, std::vector<BlockId>& out,
              std::span<const BlockId> skip = {}) const override;
  size_t size() const override { return size_; }
  void prefetch(BlockId id) const override {
    links_.prefetch(id);
    if (id < state_.size()) __builtin_prefetch(&state_[id], 1);
  }

  // New blocks per reused one up to which a request's new blocks continue what it reused.
  static constexpr uint64_t kContinuationRatio = 4;

  // For tests and stats: ghosts of `sizeClass` (B1 + B2), the bytes they take, the target size of
  // T1, and the blocks of each list in memory (held or not): T1 (with replicas) and T2.
  uint64_t ghostCount(uint32_t sizeClass) const;
  size_t ghostBytes() const;
  double recencyTarget(uint32_t sizeClass) const;
  uint64_t recentBlocks(uint32_t sizeClass) const;
  uint64_t frequentBlocks(uint32_t sizeClass) const;
  // The largest number of blocks of the class in memory at once so far: ARC's capacity c.
  uint64_t capacity(uint32_t sizeClass) const;

 private:
  enum : uint8_t { kUnknown = 0, kRecent = 1, kFrequent = 2, kReplica = 3 };
  struct State {
    uint8_t list = kUnknown;  // what the block's history is, in the order or held
    bool linked = false;
    bool continues = false;  // sealed() said so: T2 at its first insert
    uint32_t sizeClass = 0;
  };
  struct Class {
    BlockLists::List recent, frequent, replicas;  // T1, T2, replicas (ahead of both)
    uint64_t resident[3] = {0, 0, 0};  // blocks in memory with T1 / T2 history, replicas
    uint64_t capacity = 0;                        // the most resident blocks seen at once
    double target = 0;                            // p: T1's target size
    GhostLists ghosts;                            // B1 (list 0) and B2 (list 1)
  };
  Class& cls(uint32_t c);
  const Class* findClass(uint32_t c) const { return c < classes_.size() ? &classes_[c] : nullptr; }
  BlockLists::List& listOf(Class& c, uint8_t list);
  // Whether the next victim comes from T1, given T1's and T2's resident blocks.
  static bool fromRecent(const Class& c, uint64_t recent, bool recentEmpty, bool frequentEmpty);
  void forget(BlockId id);  // unlinked and unknown; resident counts updated
  void trimGhosts(Class& c);

  BlockLists links_;
  std::vector<State, HugePageAllocator<State>> state_;
  std::vector<Class> classes_;
  size_t size_ = 0;
};

// The tags of the blocks evicted lately, as a set: whether a tag was among roughly the last
// `span` to 2 * `span` added. Two Bloom filter generations of `span` entries each (10 bits an
// entry, 3 probes: about 1.7 % false positives a generation); when the newer one is full, the
// older one is dropped and a new one takes the next entries. Nothing is removed: a tag added once
// stays until its generation goes. 2.5 bytes per entry of `span` (20 bits for two generations).
// O(1).
class EvictionHistory {
 public:
  // Adds `tag`; a generation that starts now is sized for `span` entries (at least 64).
  void add(uint64_t tag, uint64_t span);
  bool contains(uint64_t tag) const;
  // Bytes held, for tests and stats.
  size_t memoryBytes() const;

  static constexpr uint64_t kBitsPerEntry = 10;
  static constexpr int kProbes = 3;

 private:
  // Words left uninitialized by resize(): a generation of 2 MiB or more is mapped on its own
  // (HugePageAllocator), zero already, and its pages are faulted in as probes touch them, so that
  // a rotation costs no pass over the new generation (5 bytes per block of c: 50 MB at 10 M
  // blocks, on the event loop). Smaller ones are cleared (memset).
  template <typename T>
  struct UninitAllocator : HugePageAllocator<T> {
    template <typename U>
    struct rebind {
      using other = UninitAllocator<U>;
    };
    UninitAllocator() = default;
    template <typename U>
    UninitAllocator(const UninitAllocator<U>&) noexcept {}
    template <typename U>
    void construct(U* p) noexcept {
      ::new (static_cast<void*>(p)) U;  // default-initialized: untouched
    }
    template <typename U, typename... Args>
    void construct(U* p, Args&&... args) {
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
  };
  struct Generation {
    std::vector<uint64_t, UninitAllocator<uint64_t>> bits;
    uint64_t bitCount = 0;  // bits.size() * 64; 0: never filled
    uint64_t count = 0, span = 0;
    uint64_t bit(uint64_t h, int probe) const;  // the bit of probe `probe` for hash `h`
    bool has(uint64_t h) const;
  };
  static uint64_t mix(uint64_t tag);
  Generation gens_[2];
  int newer_ = 0;
};

// 2Q (Johnson and Shasha, VLDB'94) over the engine's evictable blocks, per size class, made aware
// of prefixes: content is admitted for good only once it has been seen reused.
// - Probation (2Q's A1in): new content, in the order it became evictable (a prefix released tail
//   first goes tail first). It always goes before protected content: a burst of one-time content
//   never displaces what requests reuse, however long it is.
// - Protected (Am): content used again while in memory, new blocks that continue a prefix the
//   request reused (as ARC: at most kContinuationRatio new blocks per reused one: a
//   conversation's next turn), and new content whose tag is in the eviction history (A1out):
//   evicted lately, it is wanted again. Least recently used first. A prefix's new blocks are
//   protected through the history only together with the block before them: the blocks of a
//   commit released tail first wait, protected provisionally, for their parent's insert, and go
//   to probation with it if it does (a false positive of the history, or a prefix that lost its
//   head, must not keep a tail behind a head that goes first).
// - The eviction history remembers the tags of the last kHistorySpan..2 * kHistorySpan times c
//   evicted blocks (c: the most blocks of the class in memory at once), in Bloom filters: content
//   reused at a distance several times the cache's size is recognised on its second use, where
//   ARC's ghosts (at most c) have forgotten it.
// - Dead ends: the last block of a commit that continues nothing the request reused (the end of a
//   prompt; a later commit that extends it while the sequence holds it takes the mark back) goes
//   first among probation: the end of a request is seldom the start of another.
// - Replicas (insert with `first`) go before everything, as with LRU and ARC.
// Per block: 16 bytes (links and state), as LRU; the history: 2 * kHistorySpan *
// EvictionHistory::kBitsPerEntry bits per block of c (10 bytes).
class TwoQEvictionPolicy final : public EvictionPolicy {
 public:
  EvictionKind kind() const override { return EvictionKind::kTwoQ; }
  void insert(BlockId id, uint32_t sizeClass, bool first = false, uint64_t tag = 0) override;
  void erase(BlockId id) override;
  void evicted(BlockId id, uint64_t tag) override;
  void moved(BlockId from, BlockId to) override;
  void sealed(std::span<const BlockId> fresh, BlockId parent, uint64_t position) override;
  BlockId victim(uint32_t sizeClass) const override;
  void oldest(uint32_t sizeClass, size_t max, std::vector<BlockId>& out,
              std::span<const BlockId> skip = {}) const override;
  size_t size() const override { return size_; }
  void prefetch(BlockId id) const override {
    links_.prefetch(id);
    if (id < state_.size()) __builtin_prefetch(&state_[id], 1);
  }

  // New blocks per reused one up to which a request's new blocks continue what it reused.
  static constexpr uint64_t kContinuationRatio = 4;
  // A history generation covers this many times c evictions (measured: docs/cache-policy.md).
  static constexpr uint64_t kHistorySpan = 4;

  // For tests and stats: evictable blocks of `sizeClass` on probation (dead ends included) and
  // protected; the history's bytes; the most blocks of the class in memory at once (c).
  uint64_t probationBlocks(uint32_t sizeClass) const;
  uint64_t protectedBlocks(uint32_t sizeClass) const;
  size_t historyBytes() const;
  uint64_t capacity(uint32_t sizeClass) const;

 private:
  // Lists in eviction order: replicas, dead ends, probation, protected.
  enum : uint8_t { kReplica = 0, kDeadEnd = 1, kProbation = 2, kProtected = 3, kLists = 4 };
  static constexpr uint8_t kUnknown = 0xff;  // not in memory as far as the policy knows
  struct State {
    uint8_t list = kUnknown;  // the list of the block's content, in the order or held
    bool linked : 1 = false;
    bool continues : 1 = false;    // sealed(): protected at its first insert
    bool deadEnd : 1 = false;      // sealed(): the end of its commit, at its first insert
    bool freshParent : 1 = false;  // sealed(): its parent is released right after it
    bool provisional : 1 = false;  // protected by the history until its parent's insert
    uint32_t sizeClass = 0;
  };
  static_assert(sizeof(State) == 8);
  struct Class {
    BlockLists::List lists[kLists];
    uint64_t resident = 0;  // blocks of the class in memory with a known list (held or not)
    uint64_t capacity = 0;  // the most resident blocks seen at once
    EvictionHistory history;
  };
  Class& cls(uint32_t c);
  const Class* findClass(uint32_t c) const { return c < classes_.size() ? &classes_[c] : nullptr; }
  State& stateOf(BlockId id);  // grown to hold `id`
  // The provisionally protected blocks at the tail of `k`'s protected list (the last ones
  // inserted: a parent's descendants) stay protected (`keep`) or go to probation's tail.
  void settleProvisional(Class& k, bool keep);

  BlockLists links_;
  std::vector<State, HugePageAllocator<State>> state_;
  std::vector<Class> classes_;
  std::vector<BlockId> runScratch_;
  size_t size_ = 0;
};

}  // namespace kvtier
