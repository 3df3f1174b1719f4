#include "store/checksum.h"

// Inlined: the store's objects also go into the SDK, which then needs no libxxhash of its own.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvtier {

uint64_t blockChecksum(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

}  // namespace kvtier
