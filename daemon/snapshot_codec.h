// The on-disk form of snapshot manifests (schemas/cold_record.capnp): an 8-byte xxh3-64 of the
// message, then the SnapshotManifest struct as a flat Cap'n Proto message.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/block_key.h"
#include "kvtier/error.h"
#include "store/snapshot_manifest.h"

namespace kvtier {

// The stored value for `m`. `formatVersion` is the current one; tests write others.
std::string encodeManifest(const SnapshotManifest& m, uint32_t formatVersion);
std::string encodeManifest(const SnapshotManifest& m);

// Decodes a stored value read under the key (fingerprint, salt, id) and checks it: the checksum,
// the format version, that it names that key, and checkManifest. CHECKSUM_MISMATCH says which
// check failed; a manifest that fails one is never used.
Result<SnapshotManifest> decodeManifest(std::string_view value, uint64_t fingerprint,
                                        const Salt& salt, uint64_t id);

}  // namespace kvtier
