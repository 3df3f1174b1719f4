#include "daemon/cluster/directory.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace kvtier {

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

// --- HomeDirectory

void HomeDirectory::add(const std::string& node, const DirKey& key) {
  auto& holders = entries_[key];
  if (std::find(holders.begin(), holders.end(), node) != holders.end()) return;
  if (holders.size() >= kMaxHoldersPerKey) holders.erase(holders.begin());  // keep the newest
  holders.push_back(node);
}

void HomeDirectory::withdraw(const std::string& node, const DirKey& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  auto& holders = it->second;
  holders.erase(std::remove(holders.begin(), holders.end(), node), holders.end());
  if (holders.empty()) entries_.erase(it);
}

size_t HomeDirectory::forgetNode(const std::string& node) {
  size_t changed = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto& holders = it->second;
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

size_t HomeDirectory::dropNotHome(const std::string& self,
                                  const std::vector<std::string>& members) {
  if (members.empty()) return 0;
  size_t dropped = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (homeOf(it->first, members) != self) {
      it = entries_.erase(it);
      ++dropped;
    } else {
      ++it;
    }
  }
  return dropped;
}

const std::vector<std::string>& HomeDirectory::holders(const DirKey& key) const {
  static const std::vector<std::string> kNone;
  auto it = entries_.find(key);
  return it == entries_.end() ? kNone : it->second;
}

// --- HeldKeys

void HeldKeys::queue(const std::string& home, const DirKey& key, bool add) {
  auto [it, inserted] = queues_[home].insert_or_assign(key, add);
  (void)it;
  pending_ += inserted;
}

bool HeldKeys::hold(const DirKey& key, const std::vector<std::string>& members) {
  if (!held_.insert(key).second) return false;
  if (!members.empty()) queue(homeOf(key, members), key, true);
  return true;
}

bool HeldKeys::drop(const DirKey& key, const std::vector<std::string>& members) {
  if (held_.erase(key) == 0) return false;
  if (!members.empty()) queue(homeOf(key, members), key, false);
  return true;
}

size_t HeldKeys::rehome(const std::vector<std::string>& before,
                        const std::vector<std::string>& after) {
  if (after.empty()) return 0;
  size_t moved = 0;
  for (const DirKey& key : held_) {
    const std::string& to = homeOf(key, after);
    if (!before.empty() && homeOf(key, before) == to) continue;
    queue(to, key, true);
    ++moved;
  }
  return moved;
}

size_t HeldKeys::resendTo(const std::string& home, const std::vector<std::string>& members) {
  if (members.empty()) return 0;
  size_t sent = 0;
  for (const DirKey& key : held_) {
    if (homeOf(key, members) != home) continue;
    queue(home, key, true);
    ++sent;
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
  for (const auto& k : batch.add) {
    if (held_.count(k)) pending_ += q.emplace(k, true).second;
  }
  for (const auto& k : batch.withdraw) {
    if (!held_.count(k)) pending_ += q.emplace(k, false).second;
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
