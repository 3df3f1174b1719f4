#include "transport/hugetlb.h"

#include <fstream>

namespace kvtier {

namespace {

Result<uint64_t> readCount(const std::string& path) {
  std::ifstream in(path);
  uint64_t value = 0;
  if (!(in >> value)) return makeError(ErrorCode::kUnavailable, "cannot read ", path);
  return value;
}

}  // namespace

Result<HugePageCounts> readHugePageCounts(const std::string& dir) {
  auto total = readCount(dir + "/nr_hugepages");
  if (!total) return total.error();
  auto free = readCount(dir + "/free_hugepages");
  if (!free) return free.error();
  auto reserved = readCount(dir + "/resv_hugepages");
  if (!reserved) return reserved.error();
  return HugePageCounts{*total, *free, *reserved};
}

std::string hugePageShortfall(uint64_t poolBytes, uint64_t extentBytes,
                              const Result<HugePageCounts>& counts) {
  if (poolBytes < kHugePageBytes) return "the pool is smaller than one huge page (2 MiB)";
  if (extentBytes < kHugePageBytes) return "extents are smaller than one huge page (2 MiB)";
  if (!counts) return "the kernel offers no 2 MiB huge pages (" + counts.error().message() + ")";
  const uint64_t needed = poolBytes / kHugePageBytes;
  if (counts->available() < needed) {
    return "only " + std::to_string(counts->available()) + " huge pages free, " +
           std::to_string(needed) + " needed";
  }
  return "";
}

}  // namespace kvtier
