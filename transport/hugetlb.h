// 2 MiB huge pages (hugetlb) for the host pool: what the kernel has free, and whether a pool fits.
//
// The kernel keeps a pool of huge pages apart from ordinary memory (vm.nr_hugepages; none by
// default): a hugetlb mapping takes its pages from there or not at all. kvtierd asks how many are
// free before it tries (docs/performance.md, "The pool's memory"). Pure functions over plain
// values and two small sysfs reads; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "kvtier/error.h"
#include "store/huge_pages.h"  // kHugePageBytes

namespace kvtier {

// Where the kernel counts its 2 MiB pages.
inline constexpr const char* kHugePages2MDir = "/sys/kernel/mm/hugepages/hugepages-2048kB";

struct HugePageCounts {
  uint64_t total = 0;     // nr_hugepages: the kernel's pool of 2 MiB pages
  uint64_t free = 0;      // free_hugepages: not faulted in by anyone
  uint64_t reserved = 0;  // resv_hugepages: free, but promised to mappings made already
  // Pages a new mapping can still have.
  uint64_t available() const { return free > reserved ? free - reserved : 0; }
};

// The counts under `dir` (kHugePages2MDir, or a copy of it in a test). UNAVAILABLE when they
// cannot be read: a kernel without hugetlb, or without 2 MiB pages.
Result<HugePageCounts> readHugePageCounts(const std::string& dir = kHugePages2MDir);

// Why a pool of `poolBytes` in extents of `extentBytes` cannot go on 2 MiB pages when the kernel
// has `counts` (an error: it could not say); empty when it can, as far as the counts tell — the
// allocation itself has the last word. The pool takes poolBytes rounded down to 2 MiB.
std::string hugePageShortfall(uint64_t poolBytes, uint64_t extentBytes,
                              const Result<HugePageCounts>& counts);

}  // namespace kvtier
