#include "transport/shm_segment.h"

#include <dirent.h>

#include <boost/interprocess/exceptions.hpp>
#include <vector>

namespace kvtier {

namespace bip = boost::interprocess;

Result<std::unique_ptr<ShmSegment>> ShmSegment::create(const std::string& name, uint64_t bytes,
                                                       unsigned mode) {
  try {
    bip::permissions perms(mode);
    bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write, perms);
    try {
      shm.truncate(static_cast<bip::offset_t>(bytes));
      bip::mapped_region region(shm, bip::read_write, 0, bytes);
      return std::unique_ptr<ShmSegment>(new ShmSegment(name, std::move(region), true));
    } catch (...) {
      bip::shared_memory_object::remove(name.c_str());
      throw;
    }
  } catch (const bip::interprocess_exception& e) {
    return makeError(ErrorCode::kUnavailable, "cannot create shared memory '", name, "' of ", bytes,
                     " bytes: ", e.what());
  }
}

Result<std::unique_ptr<ShmSegment>> ShmSegment::open(const std::string& name, uint64_t minBytes) {
  try {
    bip::shared_memory_object shm(bip::open_only, name.c_str(), bip::read_write);
    bip::offset_t size = 0;
    if (!shm.get_size(size) || static_cast<uint64_t>(size) < minBytes) {
      return makeError(ErrorCode::kUnavailable, "shared memory '", name, "' has ",
                       static_cast<uint64_t>(size), " bytes, expected ", minBytes);
    }
    bip::mapped_region region(shm, bip::read_write, 0, minBytes);
    return std::unique_ptr<ShmSegment>(new ShmSegment(name, std::move(region), false));
  } catch (const bip::interprocess_exception& e) {
    return makeError(ErrorCode::kUnavailable, "cannot map shared memory '", name, "': ", e.what());
  }
}

ShmSegment::~ShmSegment() {
  if (owner_) bip::shared_memory_object::remove(name_.c_str());
}

size_t removeStaleSegments(std::string_view prefix) {
  // POSIX shared memory objects appear under /dev/shm on Linux.
  std::vector<std::string> names;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir)) {
      std::string_view n(entry->d_name);
      if (n.substr(0, prefix.size()) == prefix) names.emplace_back(n);
    }
    closedir(dir);
  }
  size_t removed = 0;
  for (const auto& n : names) removed += bip::shared_memory_object::remove(n.c_str()) ? 1 : 0;
  return removed;
}

}  // namespace kvtier
