#include "daemon/cluster/directory.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace kvtier {

std::vector<Key128> anchorsFiledUnder(std::span<const Key128> chain) {
  if (chain.empty()) return {};
  const size_t d = chain.size() - 1;
  if (d % kSegmentBlocks != 0) return {chain[d - d % kSegmentBlocks]};
  std::vector<Key128> out;
  out.reserve(d / kSegmentBlocks + 1);
  for (size_t a = 0; a <= d; a += kSegmentBlocks) out.push_back(chain[a]);
  return out;
}

uint64_t anchorHash(uint64_t fingerprint, const Salt& salt, const Key128& under) {
  uint8_t buf[8 + 16 + 16];
  std::memcpy(buf, &fingerprint, 8);
  std::memcpy(buf + 8, salt.data(), 16);
  std::memcpy(buf + 24, under.bytes.data(), 16);
  return XXH3_64bits(buf, sizeof buf);
}

uint64_t rendezvousScore(std::string_view node, const DirKey& key) {
  uint8_t buf[8 + 16 + 16];
  std::memcpy(buf, &key.fingerprint, 8);
  std::memcpy(buf + 8, key.salt.data(), 16);
  std::memcpy(buf + 24, key.key.bytes.data(), 16);
  const uint64_t seed = XXH3_64bits(node.data(), node.size());
  return XXH3_64bits_withSeed(buf, sizeof buf, seed);
}

const std::string& homeOf(const DirKey& key, const std::vector<std::string>& members) {
  const std::string* best = &members.front();
  uint64_t bestScore = rendezvousScore(*best, key);
  for (size_t i = 1; i < members.size(); ++i) {
    const uint64_t s = rendezvousScore(members[i], key);
    if (s > bestScore || (s == bestScore && members[i] < *best)) {
      best = &members[i];
      bestScore = s;
    }
  }
  return *best;
}

std::vector<std::string> homesOf(const DirEntry& e, const HashRing& ring, size_t replicas) {
  std::vector<std::string> out;
  if (ring.empty()) return out;
  const uint64_t h = anchorHash(e.key.fingerprint, e.key.salt, e.under);
  if (replicas <= 1) return {ring.home(h)};
  for (size_t m : ring.homes(h, replicas)) out.push_back(ring.members()[m]);
  return out;
}

namespace {
bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}
}  // namespace

// --- HomeDirectory

void HomeDirectory::add(const std::string& node, const DirEntry& entry) {
  ++version_;
  Holders& h = entries_[entry];
  h.own = h.own || entry.own;
  auto& holders = h.nodes;
  if (std::find(holders.begin(), holders.end(), node) != holders.end()) return;
  if (holders.size() >= kMaxHoldersPerKey) holders.erase(holders.begin());  // keep the newest
  holders.push_back(node);
}

void HomeDirectory::withdraw(const std::string& node, const DirEntry& entry) {
  ++version_;
  auto it = entries_.find(entry);
  if (it == entries_.end()) return;
  auto& holders = it->second.nodes;
  holders.erase(std::remove(holders.begin(), holders.end(), node), holders.end());
  if (holders.empty()) entries_.erase(it);
}

size_t HomeDirectory::forgetNode(const std::string& node) {
  ++version_;
  size_t changed = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto& holders = it->second.nodes;
    const size_t before = holders.size();
    holders.erase(std::remove(holders.begin(), holders.end(), node), holders.end());
    changed += before != holders.size();
    if (holders.empty()) {
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  return changed;
}

size_t HomeDirectory::dropNotHome(const std::string& self, const HashRing& ring, size_t replicas) {
  if (ring.empty()) return 0;
  ++version_;
  size_t dropped = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (!contains(homesOf(it->first, ring, replicas), self)) {
      it = entries_.erase(it);
      ++dropped;
    } else {
      ++it;
    }
  }
  return dropped;
}

const std::vector<std::string>& HomeDirectory::holders(const DirEntry& entry) const {
  static const std::vector<std::string> kNone;
  auto it = entries_.find(entry);
  return it == entries_.end() ? kNone : it->second.nodes;
}

size_t HomeDirectory::keysAsFirstHome(const std::string& self, const HashRing& ring) const {
  if (ring.empty()) return 0;
  size_t n = 0;
  for (const auto& [e, h] : entries_) n += h.own && homeOf(e, ring) == self;
  return n;
}

// --- HeldKeys

namespace {
// The entry filing `key` under `u`, one of the key's anchors `under` (in chain order): the last is
// its own segment's.
DirEntry entryUnder(const DirKey& key, const std::vector<Key128>& under, const Key128& u) {
  return DirEntry{key, u, u == under.back()};
}
}  // namespace

void HeldKeys::queue(const std::string& home, const DirEntry& entry, bool add) {
  auto [it, inserted] = queues_[home].insert_or_assign(entry, add);
  (void)it;
  pending_ += inserted;
}

void HeldKeys::queueAll(const DirEntry& entry, bool add, const HashRing& ring) {
  for (const std::string& home : homesOf(entry, ring, replicas_)) queue(home, entry, add);
}

bool HeldKeys::filed(const DirEntry& e) const {
  auto it = held_.find(e.key);
  return it != held_.end() &&
         std::find(it->second.begin(), it->second.end(), e.under) != it->second.end();
}

bool HeldKeys::hold(const DirKey& key, std::vector<Key128> under, const HashRing& ring) {
  if (under.empty()) under = {key.key};
  auto [it, inserted] = held_.try_emplace(key);
  if (!inserted) {
    // Only a key whose place was unknown moves: a known place never changes (a key names its
    // whole prefix, so its chain positions are fixed).
    const bool unknown = it->second.size() == 1 && it->second[0] == key.key;
    if (!unknown || under == it->second) return false;
    for (const Key128& u : it->second) {
      if (std::find(under.begin(), under.end(), u) == under.end()) {
        queueAll(entryUnder(key, it->second, u), false, ring);
      }
    }
  }
  it->second = std::move(under);
  for (const Key128& u : it->second) queueAll(entryUnder(key, it->second, u), true, ring);
  return inserted;
}

bool HeldKeys::drop(const DirKey& key, const HashRing& ring) {
  auto it = held_.find(key);
  if (it == held_.end()) return false;
  const std::vector<Key128> under = std::move(it->second);
  held_.erase(it);
  for (const Key128& u : under) queueAll(entryUnder(key, under, u), false, ring);
  return true;
}

size_t HeldKeys::rehome(const HashRing& before, const HashRing& after) {
  if (after.empty()) return 0;
  size_t moved = 0;
  for (const auto& [key, under] : held_) {
    for (const Key128& u : under) {
      const DirEntry e = entryUnder(key, under, u);
      const auto was = homesOf(e, before, replicas_);
      for (const std::string& to : homesOf(e, after, replicas_)) {
        if (contains(was, to)) continue;
        queue(to, e, true);
        ++moved;
      }
    }
  }
  return moved;
}

size_t HeldKeys::resendTo(const std::string& home, const HashRing& ring) {
  if (ring.empty()) return 0;
  size_t sent = 0;
  for (const auto& [key, under] : held_) {
    for (const Key128& u : under) {
      const DirEntry e = entryUnder(key, under, u);
      if (!contains(homesOf(e, ring, replicas_), home)) continue;
      queue(home, e, true);
      ++sent;
    }
  }
  return sent;
}

HeldKeys::Batch HeldKeys::take(const std::string& home, size_t max) {
  Batch out;
  auto it = queues_.find(home);
  if (it == queues_.end()) return out;
  auto& q = it->second;
  for (auto k = q.begin(); k != q.end() && out.size() < max;) {
    (k->second ? out.add : out.withdraw).push_back(k->first);
    k = q.erase(k);
    --pending_;
  }
  if (q.empty()) queues_.erase(it);
  return out;
}

std::vector<std::string> HeldKeys::pendingHomes() const {
  std::vector<std::string> out;
  for (const auto& [home, q] : queues_) {
    if (!q.empty()) out.push_back(home);
  }
  return out;
}

size_t HeldKeys::pendingFor(const std::string& home) const {
  auto it = queues_.find(home);
  return it == queues_.end() ? 0 : it->second.size();
}

void HeldKeys::requeue(const std::string& home, const Batch& batch) {
  auto& q = queues_[home];
  for (const auto& e : batch.add) {
    if (filed(e)) pending_ += q.emplace(e, true).second;
  }
  for (const auto& e : batch.withdraw) {
    if (!filed(e)) pending_ += q.emplace(e, false).second;
  }
  if (q.empty()) queues_.erase(home);
}

void HeldKeys::dropQueue(const std::string& home) {
  auto it = queues_.find(home);
  if (it == queues_.end()) return;
  pending_ -= it->second.size();
  queues_.erase(it);
}

}  // namespace kvtier
