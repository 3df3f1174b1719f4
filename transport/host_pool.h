// HostPool: the daemon's host-memory pool, a set of shared-memory extents that clients map.
//
// Extents are at most `extentBytes` each, one segment each (transport/shm_segment.h): named POSIX
// shared memory "<prefix><index>" on 4 KiB pages, or anonymous hugetlb memory on 2 MiB pages
// (labelled the same), as HugePages and the kernel's free huge pages decide. Either way every page
// is allocated and faulted in when the pool is made. The pool owns the segments: destroying it
// unmaps them and removes the names.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "store/block_pool.h"
#include "transport/hugetlb.h"
#include "transport/memory_room.h"
#include "transport/shm_segment.h"

namespace kvtier {

// Which pages the pool asks for (kvtierd --huge-pages).
enum class HugePages : uint8_t {
  kAuto,  // 2 MiB hugetlb pages when enough are free, else 4 KiB pages, saying why
  kOn,    // 2 MiB hugetlb pages or no pool
  kOff,   // 4 KiB pages (named POSIX shared memory)
};

struct HostPoolOptions {
  std::string prefix;  // segment names (and hugetlb labels) are prefix + extent index
  uint64_t bytes = 0;  // rounded down to a page: 4 KiB, or 2 MiB on huge pages
  uint64_t extentBytes = uint64_t{1} << 30;  // likewise
  HugePages hugePages = HugePages::kOff;
  unsigned mode = 0600;  // of named segments
  // Where the kernel counts its 2 MiB pages (a test points this elsewhere).
  std::string hugePageCountsDir = kHugePages2MDir;
  // Where the memory a pool on 4 KiB pages must fit is read (transport/memory_room.h).
  MemorySources memory = {};
};

class HostPool final : public BlockMemory {
 public:
  // Default extent size: large enough for any block, small enough that a pool is several extents
  // (each can be mapped, and later registered with UCX, on its own).
  static constexpr uint64_t kDefaultExtentBytes = uint64_t{1} << 30;

  // Makes the pool. UNAVAILABLE when the memory cannot be had: for kOn, also when the huge pages
  // cannot (the message says why); kAuto then falls back to 4 KiB pages (pagesReason() says why).
  // A pool on 4 KiB pages must fit the memory the process can have with kPoolHeadroomBytes to
  // spare (memoryRoom): else UNAVAILABLE with the figures, before any memory is taken.
  // INVALID_ARGUMENT for a pool or extent below one page.
  static Result<std::unique_ptr<HostPool>> create(const HostPoolOptions& options);
  // A pool on 4 KiB pages.
  static Result<std::unique_ptr<HostPool>> create(const std::string& prefix, uint64_t bytes,
                                                  uint64_t extentBytes = kDefaultExtentBytes,
                                                  unsigned mode = 0600);

  uint8_t* extentBase(uint32_t extent) override { return segments_.at(extent)->data(); }
  // (id, bytes) of every extent, for BlockPool.
  std::vector<BlockPool::Extent> extents() const;
  const ShmSegment& segment(uint32_t extent) const { return *segments_.at(extent); }
  size_t extentCount() const { return segments_.size(); }
  // The pool's bytes: the sum of its extents.
  uint64_t bytes() const;
  // The pages the pool got, and why 4 KiB ones when huge pages were asked for (kAuto: "only 12
  // huge pages free, 512 needed", ...) or not ("huge pages off"); empty on huge pages.
  PageKind pages() const { return pages_; }
  const std::string& pagesReason() const { return pagesReason_; }

 private:
  // Extents of `pageBytes`-rounded sizes, each made by `make(name, bytes)`.
  template <typename Make>
  static Status addExtents(HostPool& pool, const HostPoolOptions& options, uint64_t pageBytes,
                           Make&& make);

  std::vector<std::unique_ptr<ShmSegment>> segments_;
  PageKind pages_ = PageKind::k4K;
  std::string pagesReason_;
};

}  // namespace kvtier
