// HostPool: the daemon's host-memory pool, a set of shared-memory extents that clients map.
//
// Extents are at most `extentBytes` each (one segment each, named "<prefix><index>"). The pool
// owns the segments: destroying it unmaps and removes them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "store/block_pool.h"
#include "transport/shm_segment.h"

namespace kvtier {

class HostPool final : public BlockMemory {
 public:
  // Default extent size: large enough for any block, small enough that a pool is several extents
  // (each can be mapped, and later registered with UCX, on its own).
  static constexpr uint64_t kDefaultExtentBytes = uint64_t{1} << 30;

  static Result<std::unique_ptr<HostPool>> create(const std::string& prefix, uint64_t bytes,
                                                  uint64_t extentBytes = kDefaultExtentBytes,
                                                  unsigned mode = 0600);

  uint8_t* extentBase(uint32_t extent) override { return segments_.at(extent)->data(); }
  // (id, bytes) of every extent, for BlockPool.
  std::vector<BlockPool::Extent> extents() const;
  const ShmSegment& segment(uint32_t extent) const { return *segments_.at(extent); }
  size_t extentCount() const { return segments_.size(); }

 private:
  std::vector<std::unique_ptr<ShmSegment>> segments_;
};

}  // namespace kvtier
