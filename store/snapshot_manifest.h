// SnapshotManifest: what the cold tier keeps of a snapshot so that it survives a daemon restart.
//
// A manifest names its snapshot by (layout fingerprint, tenant salt, snapshot id), never by the
// process's namespace number, and lists everything a restore needs: the range, the origin's
// tokens and keys, the options and flags, and for each block where its bytes are — a sealed
// block's content key (its bytes are the cold tier's ordinary record of that key), or a record
// of the snapshot's own (a partial or unindexed block, a recurrent state checkpoint), named by
// (snapshot id, slot). The on-disk encoding is daemon/snapshot_codec.h; this is the plain C++
// form the engine builds and rebuilds snapshots from.
#pragma once

#include <cstdint>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/error.h"

namespace kvtier {

struct ManifestBlock {
  enum class Kind : uint8_t {
    kReleased,  // a window released it: no bytes
    kSealed,    // sealed and content-keyed: the cold tier's block record of `key`
    kOwn,       // a record of the snapshot's own, slot = the block's index
  };
  Kind kind = Kind::kReleased;
  Key128 key = {};  // kSealed only
  bool operator==(const ManifestBlock&) const = default;
};

struct ManifestCheckpoint {
  uint64_t position = 0;
  uint32_t bytes = 0;  // the blob's own size; a record of the snapshot's own, checkpointSlot(i)
  bool operator==(const ManifestCheckpoint&) const = default;
};

struct SnapshotManifest {
  uint64_t id = 0;
  uint64_t fingerprint = 0;
  Salt salt = {};
  uint32_t blockTokens = 0;  // of the layout: a manifest never meets another layout's space
  uint32_t blockBytes = 0;
  uint64_t from = 0, to = 0;
  std::vector<uint32_t> tokens = {};  // [0, to) of the sequence it came from
  std::vector<Key128> keys = {};      // of the full blocks [0, to / blockTokens), maybe fewer
  // The options of the sequence it came from (a restore into a new sequence takes them).
  bool detached = false;
  uint64_t window = 0, chunk = 0;
  bool clientKeyed = false, unindexed = false;
  std::vector<ManifestBlock> blocks = {};  // cover [from / B * B, to); empty when from == to
  std::vector<ManifestCheckpoint> checkpoints = {};  // by position, in [from, to]
  bool operator==(const SnapshotManifest&) const = default;
};

// A snapshot's own records are numbered: block i is slot i, checkpoint j is checkpointSlot(j).
inline constexpr uint32_t kCheckpointSlotBit = 0x80000000u;
inline uint32_t checkpointSlot(size_t j) { return kCheckpointSlotBit | static_cast<uint32_t>(j); }

// Checks what the engine relies on to rebuild a snapshot from `m` (the manifest comes from disk:
// it is input, not an invariant). INVALID_ARGUMENT names the first inconsistency.
Status checkManifest(const SnapshotManifest& m);

}  // namespace kvtier
