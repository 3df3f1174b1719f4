// Shared-memory segments: the memory of one host-pool extent, as the daemon and its clients map it.
//
// Two kinds behind one mapping path (a descriptor mapped MAP_SHARED, read-write):
// - a POSIX shared-memory object (Boost.Interprocess shared_memory_object) on 4 KiB pages, named
//   "<prefix><index>" under /dev/shm: clients open it by name; the creator removes the name when
//   the segment is destroyed, and a crashed daemon's names are removed by the next one
//   (removeStaleSegments);
// - an anonymous memory file on 2 MiB hugetlb pages (memfd_create(MFD_HUGETLB)): it has no name,
//   so clients are handed its descriptor over the daemon's socket (transport/pool_fds.h); it
//   vanishes with the last process that holds it, a crashed daemon's too.
// The daemon's segments are allocated and pre-faulted when created, so that no write into the pool
// pays a page fault there, and a shortage of memory or huge pages is an error at start instead of
// a SIGBUS later. A segment is a resource type: one owner, not copyable, one cleanup.
#pragma once

#include <kj/io.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kvtier/error.h"

namespace kvtier {

enum class PageKind : uint8_t {
  k4K,      // ordinary pages (shared memory, no transparent huge pages)
  kHuge2M,  // 2 MiB hugetlb pages
};

// "4k", "hugetlb-2M": how the ready line, stats and metrics name the kinds.
const char* pageKindName(PageKind kind);

class ShmSegment {
 public:
  // Creates a named POSIX shared-memory segment of `bytes` bytes with permissions `mode`, maps it,
  // allocates its pages and faults them in. Fails (UNAVAILABLE) if the name exists or the system
  // refuses (e.g. /dev/shm is too small: ENOSPC).
  static Result<std::unique_ptr<ShmSegment>> create(const std::string& name, uint64_t bytes,
                                                    unsigned mode = 0600);
  // Creates an anonymous segment of `bytes` (a multiple of 2 MiB) on 2 MiB hugetlb pages, maps it,
  // allocates every page and faults them in. `label` only names it in /proc/<pid>/fd
  // ("/memfd:<label>"). Sealed against resizing: a client that holds the descriptor cannot shrink
  // it under the daemon. Fails (UNAVAILABLE) when the kernel has too few free huge pages or no
  // hugetlb support; nothing is left behind.
  static Result<std::unique_ptr<ShmSegment>> createHuge(const std::string& label, uint64_t bytes);
  // Maps an existing named segment read-write. Fails (UNAVAILABLE) if it does not exist, cannot be
  // opened, or is smaller than `minBytes`.
  static Result<std::unique_ptr<ShmSegment>> open(const std::string& name, uint64_t minBytes);
  // Maps `bytes` of a segment's descriptor that its creator handed over (createHuge's fd(), sent
  // by transport/pool_fds.h) and closes the descriptor. Fails (UNAVAILABLE) if the file is smaller
  // than `bytes` or `bytes` is not a multiple of its page size.
  static Result<std::unique_ptr<ShmSegment>> adopt(kj::AutoCloseFd fd, uint64_t bytes);

  // Unmaps; the creator of a named segment also removes the name (mapped clients keep their
  // mapping until they unmap).
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Faults in every page of this process's mapping for writing (MADV_POPULATE_WRITE; before Linux
  // 5.14 one write per page), so that later writes here take no fault. The creators call it; a
  // client maps only page tables (the pages exist), worth it for huge pages: one entry per 2 MiB.
  Status populate();

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The name clients open (named segments) or the label (anonymous ones).
  const std::string& name() const { return name_; }
  bool anonymous() const { return anonymous_; }
  PageKind pages() const { return pages_; }
  // The descriptor to hand to clients: an anonymous segment's, in the process that created it;
  // -1 otherwise. Owned by the segment.
  int fd() const { return fd_.get(); }

 private:
  ShmSegment(std::string name, bool anonymous, bool owner)
      : name_(std::move(name)), anonymous_(anonymous), owner_(owner) {}
  // Maps `bytes` of `fd` into this segment (its page size from fstat). The one mapping path.
  Status map(int fd, uint64_t bytes);

  std::string name_;
  bool anonymous_;
  bool owner_;
  PageKind pages_ = PageKind::k4K;
  uint64_t pageBytes_ = 4096;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  kj::AutoCloseFd fd_;  // anonymous segments in their creator only
};

// Removes every segment whose name starts with `prefix` (left by a daemon that crashed). Returns
// how many were removed. The caller must hold the daemon's instance lock, so none is in use.
size_t removeStaleSegments(std::string_view prefix);

}  // namespace kvtier
