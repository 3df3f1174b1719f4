// ColdDirectory: which sealed blocks the cold tier holds, as the engine asks it.
//
// Implemented by the daemon over its RocksDB cold tier; records are named by (layout fingerprint,
// tenant salt, block key) so they outlive the process's namespace numbering.
#pragma once

#include <cstdint>

#include "kvtier/block_key.h"

namespace kvtier {

class ColdDirectory {
 public:
  virtual ~ColdDirectory() = default;
  // Thread-safe; cheap (an in-memory set).
  virtual bool contains(uint64_t fingerprint, const Salt& salt, const Key128& key) const = 0;
};

}  // namespace kvtier
