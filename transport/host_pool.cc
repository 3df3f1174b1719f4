#include "transport/host_pool.h"

#include <unistd.h>

#include <algorithm>

namespace kvtier {

Result<std::unique_ptr<HostPool>> HostPool::create(const std::string& prefix, uint64_t bytes,
                                                   uint64_t extentBytes, unsigned mode) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (bytes < page)
    return makeError(ErrorCode::kInvalidArgument, "host pool of ", bytes,
                     " bytes is below one page");
  if (extentBytes < page)
    return makeError(ErrorCode::kInvalidArgument, "extent size below one page");
  extentBytes = extentBytes / page * page;
  auto pool = std::unique_ptr<HostPool>(new HostPool());
  for (uint64_t left = bytes / page * page, i = 0; left > 0; ++i) {
    const uint64_t size = std::min(left, extentBytes);
    auto seg = ShmSegment::create(prefix + std::to_string(i), size, mode);
    if (!seg) return seg.error();
    pool->segments_.push_back(std::move(seg).value());
    left -= size;
  }
  return pool;
}

std::vector<BlockPool::Extent> HostPool::extents() const {
  std::vector<BlockPool::Extent> out;
  for (uint32_t i = 0; i < segments_.size(); ++i) out.push_back({i, segments_[i]->size()});
  return out;
}

}  // namespace kvtier
