// An eviction policy that follows whichever of the others would hit most on the workload it sees.
//
// No single policy wins everywhere (docs/cache-policy.md §9: on one workload SIEVE hits 11 pp
// more than ARC at a small cache, on another LRU 10 pp more than 2Q at a large one), and an
// operator cannot know in advance which workload they have. So the engine's blocks are ordered
// by one expert at a time — LRU, ARC, 2Q, S3-FIFO or SIEVE, the leader — while miniature copies
// of all five (shadow caches) replay a sample of the same accesses and count their hits:
//
// - Sampling (SHARDS, Waldspurger et al., FAST'15): a block's content is in the sample when a
//   hash of its tag falls under the rate R (1/8 to 1/64, so that a shadow holds at least
//   Options::shadowBlocks); a shadow holds R times the class's capacity. Each insert of a sampled
//   tag is an access of every shadow: a hit when the shadow still holds it, else the shadow evicts
//   by its policy and takes it. A shadow's hits estimate its policy's on the whole cache.
// - Hints: a block sealed as the continuation of a prefix the request reused from memory
//   (sealed(), ARC's and 2Q's rule) is sealed so in the shadows too, after the block the shadow
//   took last, and the end of a commit that continues nothing as a dead end (2Q's rule): without
//   them the shadows of ARC and 2Q hit far more than the engine's ARC and 2Q on some workloads
//   (docs/cache-policy.md §9).
// - Evidence: the shadows see the same accesses, so what tells two apart is the accesses one hit
//   and the other missed. For each pair, those are counted (and the hits, for stats), decayed by
//   half every Options::halfLife shadow capacities of accesses, so that the leader follows a
//   workload that changes.
// - Switching: 2Q leads at first (the best fixed policy on the most workloads measured). A shadow
//   becomes the leader when, against the leader's shadow, it won more of those accesses than it
//   lost by Options::switchZ standard deviations (McNemar's test: (won - lost) / sqrt(won +
//   lost)), after at least a shadow capacity of accesses since the last switch. With up to
//   Options::rebuildBlocks blocks in memory, the new leader is built from them at once: the
//   evictable ones inserted in the old order (first to go first), the held ones after them, held
//   again. Their histories (uses, ghosts) start afresh; the set of blocks does not change. With
//   more, the switch costs O(1): the old leader becomes a donor, its blocks wait in its order and
//   go first, and each one used again joins the new leader's order (which starts empty).
//
// The engine sees one policy: the leader orders the blocks used since the last switch, the
// donors (rarely any) those not used since; the shadows only see tags. Cost: the leader's, plus
// 5 shadow accesses per sampled insert (an insert in R), plus a rebuild (O(blocks in memory, at
// most rebuildBlocks)) per switch.
//
// Not thread-safe (the engine's owner calls it), as every policy.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "store/eviction.h"

namespace kvtier {

class AdaptiveEvictionPolicy final : public EvictionPolicy {
 public:
  struct Options {
    // The fewest blocks a shadow holds: the rate is lowered from 1/2^minRateShift toward
    // 1/2^maxRateShift while a shadow keeps at least this many.
    uint64_t shadowBlocks = 256;
    uint32_t minRateShift = 3;  // 1/8: the shadows cost a fraction of an insert
    uint32_t maxRateShift = 6;  // 1/64
    // The counts halve every `halfLife` shadow capacities of sampled accesses.
    double halfLife = 32;
    // A shadow leads when it beats the leader's by this many standard deviations (see above), and
    // at least a shadow capacity of sampled accesses came since the last switch.
    double switchZ = 3;
    // A switch with at most this many blocks in memory orders them all for the new leader at
    // once (a few milliseconds); with more, the new leader starts empty and the old order drains
    // into it as its blocks are used, evicted first (no pause of the engine's loop).
    uint64_t rebuildBlocks = 65536;
  };
  AdaptiveEvictionPolicy() : AdaptiveEvictionPolicy(Options{}) {}
  explicit AdaptiveEvictionPolicy(Options options);

  void insert(BlockId id, uint32_t sizeClass, bool first = false, uint64_t tag = 0) override;
  void erase(BlockId id) override;
  void evicted(BlockId id, uint64_t tag) override;
  void moved(BlockId from, BlockId to) override;
  void sealed(std::span<const BlockId> fresh, BlockId parent, uint64_t position) override;
  BlockId victim(uint32_t sizeClass) const override;
  void oldest(uint32_t sizeClass, size_t max, std::vector<BlockId>& out,
              std::span<const BlockId> skip = {}) const override;
  size_t size() const override;
  void prefetch(BlockId id) const override {
    if (id < blocks_.size()) __builtin_prefetch(&blocks_[id], 1);
    leader_->prefetch(id);
  }

  // The experts, in the order the shadows keep them.
  static constexpr std::array<EvictionKind, 5> kExperts = {
      EvictionKind::kLru, EvictionKind::kArc, EvictionKind::kTwoQ, EvictionKind::kS3Fifo,
      EvictionKind::kSieve};
  EvictionKind kind() const override { return EvictionKind::kAdaptive; }
  // The expert that orders the blocks now (the leader), and how many times it changed.
  EvictionKind following() const override { return leaderKind_; }
  uint64_t switches() const override { return switches_; }
  // For tests and stats: the shadows' decayed hits (kExperts' order) summed over the classes.
  std::array<double, kExperts.size()> scores() const;

 private:
  // What sealed() said of a block before its first insert.
  enum class Hint : uint8_t { kNone, kContinues, kDeadEnd };
  // A cache of tags of a fixed capacity ordered by one expert policy (shadow block ids).
  class Shadow {
   public:
    explicit Shadow(EvictionKind kind) : policy_(makeEvictionPolicy(kind)) {}
    // An access of `tag`: true when the shadow held it.
    bool access(uint64_t tag, uint64_t capacity, Hint hint);

   private:
    std::unique_ptr<EvictionPolicy> policy_;
    std::unordered_map<uint64_t, BlockId> ids_;  // tag -> shadow block
    std::vector<uint64_t> tags_;                 // shadow block -> tag
    std::vector<BlockId> free_;
    BlockId last_ = kNoBlock;  // the block inserted last (a parent for the hints)
  };
  struct Class {
    uint64_t resident = 0;   // blocks of the class in memory (known: evictable or held)
    uint64_t capacity = 0;   // the most resident at once
    uint32_t rateShift = 0;  // 0: no shadows yet (until the class is full: its first eviction)
    uint64_t shadowCapacity = 0;
    double decay = 1;  // the counts' factor per sampled access (setShadowCapacity)
    std::vector<Shadow> shadows;
    std::array<double, kExperts.size()> score{};
    // wins[i][j]: sampled accesses shadow i hit and shadow j missed, decayed alike.
    std::array<std::array<double, kExperts.size()>, kExperts.size()> wins{};
  };
  struct Block {
    uint64_t tag = 0;
    uint32_t sizeClass = 0;
    bool known : 1 = false;
    bool held : 1 = false;
    bool replica : 1 = false;
    bool continues : 1 = false;  // sealed(): continues a reused prefix, until its first insert
    bool deadEnd : 1 = false;    // sealed(): ends its commit, until its first insert
    uint16_t epoch = 0;          // the order it is in: the leader's (epoch_) or a donor's
  };
  // A policy that led before, whose blocks not used since the switch still wait in its order.
  struct Donor {
    uint16_t epoch;
    std::unique_ptr<EvictionPolicy> policy;
  };

  // A block in no order: the leader's epoch, so that its first insert asks no donor.
  Block unplaced() const {
    Block b;
    b.epoch = epoch_;
    return b;
  }
  Class& cls(uint32_t c);
  Block& block(BlockId id);
  void startShadows(Class& k);
  void setShadowCapacity(Class& k, uint64_t blocks) const;
  void sample(Class& k, uint64_t tag, Hint hint);
  void maybeSwitch();
  void rebuild(EvictionKind kind);
  // The policy whose order holds `id` (null: a donor that drained).
  EvictionPolicy* orderOf(BlockId id) const;
  EvictionPolicy* donor(uint16_t epoch) const;
  void dropDrained();

  Options options_;
  std::unique_ptr<EvictionPolicy> leader_;
  EvictionKind leaderKind_ = EvictionKind::kTwoQ;
  std::vector<Block, HugePageAllocator<Block>> blocks_;  // by block id
  std::vector<Class> classes_;
  uint64_t switches_ = 0;
  uint16_t epoch_ = 0;         // the leader's
  std::vector<Donor> donors_;  // oldest first
  uint64_t sinceSwitch_ = 0;  // sampled accesses since the last switch (or the start)
  uint64_t switchAfter_ = 0;  // ... needed before the next one
};

}  // namespace kvtier
