// The cluster's key directory: which nodes hold which sealed blocks.
//
// A prompt's chain of block keys is cut into segments of kSegmentBlocks keys; the key opening a
// segment (chain positions 0, 64, 128, ...) is its *anchor*. A holder files each block it holds
// under the anchor of the block's segment, and each anchor it holds also under every earlier
// anchor of its chain. The entries filed under an anchor live at the anchor's home on a
// consistent-hash ring of the live members (hash_ring.h), so one home knows who holds every key
// of a segment and how far each holder reaches down the chain past it. A lookup that misses
// locally asks one home — that of the anchor of its first missing block — about the rest of its
// segment and its later anchors, then pins the longest reach on up to two holders: a round trip
// or two and at most three messages, whatever the number of members, and a prompt nobody holds
// costs one message. A membership change moves only the anchors whose ring arc changed hands.
//
// Rendezvous hashing (homeOf) is kept for choosing where a drained block goes.
//
// Pure bookkeeping, no I/O: daemon/cluster/cluster.h moves the messages.
// Thread-safety: none; the daemon's event loop owns it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "daemon/cluster/hash_ring.h"
#include "kvtier/block_key.h"

namespace kvtier {

// A block as the cluster names it: its namespace (layout fingerprint, tenant salt) and its key.
struct DirKey {
  uint64_t fingerprint = 0;
  Salt salt{};
  Key128 key;
  bool operator==(const DirKey&) const = default;
};

struct DirKeyHash {
  size_t operator()(const DirKey& k) const noexcept {
    return std::hash<Key128>()(k.key) ^ (k.fingerprint * 0x9e3779b97f4a7c15ull);
  }
};

// Keys a segment has: 64 blocks of 16 tokens are 1,024 tokens (measured with the scale harness,
// docs/cluster.md "Scale": a lookup then asks one home whatever the prompt's length).
constexpr size_t kSegmentBlocks = 64;

// The anchors a block is filed under, given its chain: the keys from the chain's first block to
// the block itself (chain.back()). A block is filed under its segment's anchor; an anchor (whose
// segment's anchor is itself) also under every earlier anchor. An empty chain (the block's place
// is unknown) files `key` under itself.
std::vector<Key128> anchorsFiledUnder(std::span<const Key128> chain);

// A directory entry: the block `key` (of key's namespace) filed under the anchor `under`.
struct DirEntry {
  DirKey key;
  Key128 under;
  // Filed under the key's own segment's anchor: each key has exactly one such entry (which
  // counts the cluster's distinct keys). Not part of the entry's identity.
  bool own = false;
  bool operator==(const DirEntry& o) const { return key == o.key && under == o.under; }
};

struct DirEntryHash {
  size_t operator()(const DirEntry& e) const noexcept {
    return DirKeyHash()(e.key) ^ (std::hash<Key128>()(e.under) * 0x9e3779b97f4a7c15ull);
  }
};

// Where on the ring the entries filed under `under` (of namespace fingerprint/salt) live.
uint64_t anchorHash(uint64_t fingerprint, const Salt& salt, const Key128& under);
inline const std::string& homeOf(const DirEntry& e, const HashRing& ring) {
  return ring.home(anchorHash(e.key.fingerprint, e.key.salt, e.under));
}
// An entry's homes: `replicas` distinct members in ring order from its anchor's point (fewer
// when the ring has fewer members); the first is homeOf(e, ring).
std::vector<std::string> homesOf(const DirEntry& e, const HashRing& ring, size_t replicas);

// Rendezvous score of `node` for `key` (xxh3 over both: placement, not identity).
uint64_t rendezvousScore(std::string_view node, const DirKey& key);
// The member with the highest score; `members` must not be empty. Ties (never in practice) go to
// the smaller id, so every node computes the same home.
const std::string& homeOf(const DirKey& key, const std::vector<std::string>& members);

// The entries this node is home for: entry -> the nodes that hold it.
class HomeDirectory {
 public:
  // A home keeps at most this many holders per entry: a fetch needs one, and a few spare ones
  // cover a holder that has just evicted the block.
  static constexpr size_t kMaxHoldersPerKey = 8;

  void add(const std::string& node, const DirEntry& entry);
  void withdraw(const std::string& node, const DirEntry& entry);
  // Forgets everything of a member that left. Returns how many entries changed.
  size_t forgetNode(const std::string& node);
  // Drops the entries `self` is not one of the `replicas` homes of on `ring` (after a
  // membership change).
  size_t dropNotHome(const std::string& self, const HashRing& ring, size_t replicas = 1);
  // The nodes holding `entry` (empty: nobody this home knows of).
  const std::vector<std::string>& holders(const DirEntry& entry) const;
  size_t size() const { return entries_.size(); }
  // Changes on every add, withdraw or drop (a caller caches what it computes over the entries).
  uint64_t version() const { return version_; }
  // Distinct keys this node is the first home of (their own entries): summed over the members,
  // the cluster's distinct keys.
  size_t keysAsFirstHome(const std::string& self, const HashRing& ring) const;

 private:
  struct Holders {
    std::vector<std::string> nodes;
    bool own = false;
  };
  std::unordered_map<DirEntry, Holders, DirEntryHash> entries_;
  uint64_t version_ = 0;
};

// The keys this node holds, where each is filed, and the publish messages owed to their homes.
class HeldKeys {
 public:
  struct Batch {
    std::vector<DirEntry> add, withdraw;
    bool empty() const { return add.empty() && withdraw.empty(); }
    size_t size() const { return add.size() + withdraw.size(); }
  };

  // Each entry goes to `replicas` homes (homesOf).
  explicit HeldKeys(size_t replicas = 1) : replicas_(replicas) {}

  // A key this node now holds, filed under `under` (anchorsFiledUnder). Queues an add for each
  // entry's home. Returns true if the key was new. A key held already whose place was unknown
  // (filed under itself) and is now given moves to its anchors (withdrawn from the old entry).
  bool hold(const DirKey& key, std::vector<Key128> under, const HashRing& ring);
  // A key this node no longer holds (true if it was held). Queues a withdraw of each entry.
  bool drop(const DirKey& key, const HashRing& ring);
  bool holds(const DirKey& key) const { return held_.count(key) != 0; }
  // Calls f(key, anchors) for every held key.
  template <typename F>
  void forEach(F&& f) const {
    for (const auto& [key, under] : held_) f(key, under);
  }
  // The anchors a held key is filed under (nullptr: not held).
  const std::vector<Key128>* placeOf(const DirKey& key) const {
    auto it = held_.find(key);
    return it == held_.end() ? nullptr : &it->second;
  }
  size_t size() const { return held_.size(); }

  // After a membership change from `before` to `after`: queues an add of every entry to each of
  // its homes that is new. Returns how many adds (the messages the change costs).
  size_t rehome(const HashRing& before, const HashRing& after);

  // Queues an add to `home` of every entry `home` is a home of on `ring` (a home that
  // (re)connected may have forgotten them). Returns how many.
  size_t resendTo(const std::string& home, const HashRing& ring);

  // Takes up to `max` queued messages for `home` (all homes: see pendingHomes).
  Batch take(const std::string& home, size_t max);
  std::vector<std::string> pendingHomes() const;
  size_t pending() const { return pending_; }
  size_t pendingFor(const std::string& home) const;
  // Puts back a batch that could not be sent, unless a newer message for an entry was queued
  // meanwhile; only what still holds is sent again (an add for an entry still filed, a withdraw
  // for one not).
  void requeue(const std::string& home, const Batch& batch);
  // Forgets what is queued for a home that left (its entries were re-homed by rehome()).
  void dropQueue(const std::string& home);

 private:
  void queue(const std::string& home, const DirEntry& entry, bool add);
  // Queues `entry` for each of its homes.
  void queueAll(const DirEntry& entry, bool add, const HashRing& ring);

  size_t replicas_;
  bool filed(const DirEntry& e) const;

  // Each held key and the anchors it is filed under.
  std::unordered_map<DirKey, std::vector<Key128>, DirKeyHash> held_;
  // Per home, the latest message owed for each entry (true: add, false: withdraw): an entry
  // added and withdrawn before the batch leaves costs one message, and the last one wins.
  std::unordered_map<std::string, std::unordered_map<DirEntry, bool, DirEntryHash>> queues_;
  size_t pending_ = 0;
};

}  // namespace kvtier
