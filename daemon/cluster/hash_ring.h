// HashRing: consistent hashing with virtual nodes, for placing directory entries among many
// members at a cost per lookup that does not grow with the member count.
//
// Rendezvous hashing (directory.h: homeOf) scores every member for every key: exact and simple,
// but O(members) per key — at 1,024 members a lookup of a 1,000-block prompt scores a million
// pairs. A ring gives each member `vnodes` points (xxh3 of its id and the point's index) on a
// 64-bit circle; a hash's home is the member owning the first point at or after it (binary
// search: O(log(members x vnodes))). A member joining takes the arcs in front of its own points:
// about 1/(N+1) of the hashes, spread over every other member; one leaving hands its arcs to
// their successors. With 256 points a member, a member's share is within about ±20 % of 1/N
// (four standard deviations).
//
// homes(h, r) gives r distinct members in ring order from h: the first is home(h), the others
// are where replicas of a hot entry go.
//
// Immutable once built; rebuilt when membership changes. Thread-safety: const methods only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier {

class HashRing {
 public:
  static constexpr size_t kDefaultVnodes = 256;

  HashRing() = default;
  // `members` may be in any order (every node builds the same ring from the same set); duplicates
  // count once.
  explicit HashRing(const std::vector<std::string>& members, size_t vnodes = kDefaultVnodes);

  bool empty() const { return points_.empty(); }
  size_t size() const { return members_.size(); }
  const std::vector<std::string>& members() const { return members_; }

  // The index (into members()) of the home of `hash`; the ring must not be empty.
  size_t homeIndex(uint64_t hash) const;
  const std::string& home(uint64_t hash) const { return members_[homeIndex(hash)]; }
  // Up to `r` distinct member indices in ring order from `hash` (fewer when the ring has fewer
  // members); the first is homeIndex(hash).
  std::vector<size_t> homes(uint64_t hash, size_t r) const;

 private:
  struct Point {
    uint64_t at;
    uint32_t member;
    bool operator<(const Point& o) const { return at < o.at || (at == o.at && member < o.member); }
  };
  size_t firstPoint(uint64_t hash) const;

  std::vector<std::string> members_;  // sorted
  std::vector<Point> points_;         // sorted by position
};

}  // namespace kvtier
