// The cluster's key directory: which nodes hold which sealed blocks.
//
// Every block key has a home among the live members, chosen by rendezvous (highest random weight)
// hashing: the member with the highest score(member, key). A membership change moves only the
// keys whose home was the member that left, or whose home becomes the member that joined. Each
// node tells the homes, in batches, which keys it holds (in any tier), and withdraws them when it
// no longer does; a home answers who-holds queries for the keys it is home for.
//
// Pure bookkeeping, no I/O: daemon/cluster/cluster.h moves the messages.
// Thread-safety: none; the daemon's event loop owns it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

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

// Rendezvous score of `node` for `key` (xxh3 over both: placement, not identity).
uint64_t rendezvousScore(std::string_view node, const DirKey& key);
// The member with the highest score; `members` must not be empty. Ties (never in practice) go to
// the smaller id, so every node computes the same home.
const std::string& homeOf(const DirKey& key, const std::vector<std::string>& members);

// The entries this node is home for: key -> the nodes that hold it.
class HomeDirectory {
 public:
  // A home keeps at most this many holders per key: a fetch needs one, and a few spare ones
  // cover a holder that has just evicted the block.
  static constexpr size_t kMaxHoldersPerKey = 8;

  void add(const std::string& node, const DirKey& key);
  void withdraw(const std::string& node, const DirKey& key);
  // Forgets everything of a member that left. Returns how many entries changed.
  size_t forgetNode(const std::string& node);
  // Drops the entries whose home among `members` is not `self` (after a membership change).
  size_t dropNotHome(const std::string& self, const std::vector<std::string>& members);
  // The nodes holding `key` (empty: nobody this home knows of).
  const std::vector<std::string>& holders(const DirKey& key) const;
  size_t size() const { return entries_.size(); }

 private:
  std::unordered_map<DirKey, std::vector<std::string>, DirKeyHash> entries_;
};

// The keys this node holds, and the publish messages owed to their homes.
class HeldKeys {
 public:
  struct Batch {
    std::vector<DirKey> add, withdraw;
    bool empty() const { return add.empty() && withdraw.empty(); }
    size_t size() const { return add.size() + withdraw.size(); }
  };

  // A key this node now holds (true if it was new). Queues an add for its home.
  bool hold(const DirKey& key, const std::vector<std::string>& members);
  // A key this node no longer holds (true if it was held). Queues a withdraw for its home.
  bool drop(const DirKey& key, const std::vector<std::string>& members);
  bool holds(const DirKey& key) const { return held_.count(key) != 0; }
  size_t size() const { return held_.size(); }

  // After a membership change from `before` to `after`: queues an add to the new home of every
  // held key whose home changed. Returns how many keys moved (the messages the change costs).
  size_t rehome(const std::vector<std::string>& before, const std::vector<std::string>& after);

  // Queues an add to `home` of every held key whose home among `members` is `home` (a home
  // that (re)connected may have forgotten them). Returns how many.
  size_t resendTo(const std::string& home, const std::vector<std::string>& members);

  // Takes up to `max` queued messages for `home` (all homes: see pendingHomes).
  Batch take(const std::string& home, size_t max);
  std::vector<std::string> pendingHomes() const;
  size_t pending() const { return pending_; }
  size_t pendingFor(const std::string& home) const;
  // Puts back a batch that could not be sent, unless a newer message for a key was queued
  // meanwhile; only what still holds is sent again (an add for a key still held, a withdraw for
  // one not held).
  void requeue(const std::string& home, const Batch& batch);
  // Forgets what is queued for a home that left (its keys were re-homed by rehome()).
  void dropQueue(const std::string& home);

 private:
  void queue(const std::string& home, const DirKey& key, bool add);

  std::unordered_set<DirKey, DirKeyHash> held_;
  // Per home, the latest message owed for each key (true: add, false: withdraw): a key added and
  // withdrawn before the batch leaves costs one message, and the last one wins.
  std::unordered_map<std::string, std::unordered_map<DirKey, bool, DirKeyHash>> queues_;
  size_t pending_ = 0;
};

}  // namespace kvtier
