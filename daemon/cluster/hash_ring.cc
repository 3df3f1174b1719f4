#include "daemon/cluster/hash_ring.h"

#include <xxhash.h>

#include <algorithm>

namespace kvtier {

HashRing::HashRing(const std::vector<std::string>& members, size_t vnodes) : members_(members) {
  std::sort(members_.begin(), members_.end());
  members_.erase(std::unique(members_.begin(), members_.end()), members_.end());
  points_.reserve(members_.size() * vnodes);
  for (size_t m = 0; m < members_.size(); ++m) {
    const uint64_t seed = XXH3_64bits(members_[m].data(), members_[m].size());
    for (uint64_t v = 0; v < vnodes; ++v) {
      points_.push_back(Point{XXH3_64bits_withSeed(&v, sizeof v, seed), uint32_t(m)});
    }
  }
  std::sort(points_.begin(), points_.end());
}

size_t HashRing::firstPoint(uint64_t hash) const {
  auto it = std::lower_bound(points_.begin(), points_.end(), hash,
                             [](const Point& p, uint64_t h) { return p.at < h; });
  return it == points_.end() ? 0 : size_t(it - points_.begin());
}

size_t HashRing::homeIndex(uint64_t hash) const { return points_[firstPoint(hash)].member; }

std::vector<size_t> HashRing::homes(uint64_t hash, size_t r) const {
  std::vector<size_t> out;
  r = std::min(r, members_.size());
  if (r == 0) return out;
  for (size_t i = firstPoint(hash), seen = 0; out.size() < r && seen < points_.size();
       ++seen, i = (i + 1) % points_.size()) {
    const size_t m = points_[i].member;
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  }
  return out;
}

}  // namespace kvtier
