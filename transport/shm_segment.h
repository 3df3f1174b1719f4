// POSIX shared-memory segments (Boost.Interprocess shared_memory_object + mapped_region).
//
// The daemon creates one segment per host-pool extent and removes it when the segment object is
// destroyed; clients open the same names and map them once per connection. A segment is a
// resource type: one owner, not copyable, one cleanup.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include "kvtier/error.h"

namespace kvtier {

class ShmSegment {
 public:
  // Creates a new segment of `bytes` bytes with permissions `mode` and maps it read-write.
  // Fails (UNAVAILABLE) if the name exists or the system refuses.
  static Result<std::unique_ptr<ShmSegment>> create(const std::string& name, uint64_t bytes,
                                                    unsigned mode = 0600);
  // Maps an existing segment read-write. Fails (UNAVAILABLE) if it does not exist, cannot be
  // opened, or is smaller than `minBytes`.
  static Result<std::unique_ptr<ShmSegment>> open(const std::string& name, uint64_t minBytes);

  // Unmaps; the creator also removes the name (mapped clients keep their mapping until they unmap).
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  uint8_t* data() const { return static_cast<uint8_t*>(region_.get_address()); }
  uint64_t size() const { return region_.get_size(); }
  const std::string& name() const { return name_; }

 private:
  ShmSegment(std::string name, boost::interprocess::mapped_region region, bool owner)
      : name_(std::move(name)), region_(std::move(region)), owner_(owner) {}

  std::string name_;
  boost::interprocess::mapped_region region_;
  bool owner_;
};

// Removes every segment whose name starts with `prefix` (left by a daemon that crashed). Returns
// how many were removed. The caller must hold the daemon's instance lock, so none is in use.
size_t removeStaleSegments(std::string_view prefix);

}  // namespace kvtier
