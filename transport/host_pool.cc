#include "transport/host_pool.h"

#include <unistd.h>

#include <algorithm>

namespace kvtier {

template <typename Make>
Status HostPool::addExtents(HostPool& pool, const HostPoolOptions& options, uint64_t pageBytes,
                            Make&& make) {
  const uint64_t extentBytes = options.extentBytes / pageBytes * pageBytes;
  for (uint64_t left = options.bytes / pageBytes * pageBytes, i = 0; left > 0; ++i) {
    const uint64_t size = std::min(left, extentBytes);
    auto seg = make(options.prefix + std::to_string(i), size);
    if (!seg) return seg.error();
    pool.segments_.push_back(std::move(seg).value());
    left -= size;
  }
  return {};
}

Result<std::unique_ptr<HostPool>> HostPool::create(const HostPoolOptions& options) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (options.bytes < page)
    return makeError(ErrorCode::kInvalidArgument, "host pool of ", options.bytes,
                     " bytes is below one page");
  if (options.extentBytes < page)
    return makeError(ErrorCode::kInvalidArgument, "extent size below one page");
  auto pool = std::unique_ptr<HostPool>(new HostPool());
  if (options.hugePages == HugePages::kOff) {
    pool->pagesReason_ = "huge pages off";
  } else {
    pool->pagesReason_ = hugePageShortfall(options.bytes, options.extentBytes,
                                           readHugePageCounts(options.hugePageCountsDir));
    if (pool->pagesReason_.empty()) {
      // The counts say yes; the allocation decides (another process may take them meanwhile).
      auto made = addExtents(*pool, options, kHugePageBytes, ShmSegment::createHuge);
      if (made) {
        pool->pages_ = PageKind::kHuge2M;
        return pool;
      }
      pool->segments_.clear();
      pool->pagesReason_ = made.error().message();
    }
    if (options.hugePages == HugePages::kOn) {
      return makeError(ErrorCode::kUnavailable,
                       "no pool on 2 MiB huge pages: ", pool->pagesReason_);
    }
  }
  const uint64_t want = options.bytes / page * page;
  const MemoryRoom room = memoryRoom(options.memory);
  if (room.bytes != UINT64_MAX &&
      (room.bytes < kPoolHeadroomBytes || want > room.bytes - kPoolHeadroomBytes)) {
    return makeError(ErrorCode::kUnavailable, "a host pool of ", formatBytes(want),
                     " does not fit the memory this process can have (", room.detail, "; ",
                     formatBytes(kPoolHeadroomBytes),
                     " kept beside the pool): ask for a smaller pool");
  }
  auto made = addExtents(*pool, options, page, [&](const std::string& name, uint64_t bytes) {
    return ShmSegment::create(name, bytes, options.mode);
  });
  if (!made) return made.error();
  return pool;
}

Result<std::unique_ptr<HostPool>> HostPool::create(const std::string& prefix, uint64_t bytes,
                                                   uint64_t extentBytes, unsigned mode) {
  return create(HostPoolOptions{.prefix = prefix,
                                .bytes = bytes,
                                .extentBytes = extentBytes,
                                .hugePages = HugePages::kOff,
                                .mode = mode});
}

std::vector<BlockPool::Extent> HostPool::extents() const {
  std::vector<BlockPool::Extent> out;
  for (uint32_t i = 0; i < segments_.size(); ++i) out.push_back({i, segments_[i]->size()});
  return out;
}

uint64_t HostPool::bytes() const {
  uint64_t total = 0;
  for (const auto& s : segments_) total += s->size();
  return total;
}

}  // namespace kvtier
