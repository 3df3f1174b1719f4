// The engine's value types: ids, what its calls take and return (grants, leases, tickets for the
// tier and cold-tier moves, snapshots, lookups), its statistics, and the observer of its index.
// store/engine.h declares the Engine that speaks them.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/layout.h"
#include "store/block_pool.h"
#include "store/snapshot_manifest.h"

namespace kvtier {

using SpaceId = uint32_t;
using OwnerId = uint64_t;  // a client session
using LeaseId = uint64_t;
using SnapshotId = uint64_t;

inline constexpr uint64_t kEnd = std::numeric_limits<uint64_t>::max();

// How a sequence is kept; applies when a call creates the sequence.
struct SeqOptions {
  // Detached sequences outlive the session that created them (prefill -> decode hand-off).
  bool detached = false;
  // Sliding-window attention: keep the most recent `window` tokens; blocks wholly before the
  // window are released. 0: no window.
  uint64_t window = 0;
  // Chunked attention: keep the current chunk of `chunk` tokens. 0: no chunking. At most one of
  // window and chunk.
  uint64_t chunk = 0;
};

struct SnapshotInfo {
  SnapshotId id = 0;
  uint64_t from = 0;
  uint64_t to = 0;
  bool hasCheckpoints = false;  // recurrent state inside: restorable only at those positions
  std::vector<uint64_t> checkpoints;
};

struct PutGrant {
  LeaseId lease = 0;
  // blocks[0] starts at firstPosition = begin rounded down to a block. Slots of blocks[0] before
  // `begin` already hold the sequence's bytes; the client writes positions [begin, begin + n).
  uint64_t firstPosition = 0;
  std::vector<BlockLocation> blocks;
};

struct CommitResult {
  uint64_t length = 0;        // the sequence's length after the commit
  uint32_t sealedBlocks = 0;  // blocks this commit sealed and keyed
};

struct ReadGrant {
  LeaseId lease = 0;  // 0 when no block is covered
  uint64_t firstPosition = 0;
  uint64_t end = 0;
  std::vector<BlockLocation> blocks;
  // Each block's checksum from its writer, for the reader to verify its copy against (0: none,
  // e.g. a partial block, which is not sealed; a GPU block's).
  std::vector<uint64_t> sums;
};

struct BlobGrant {  // a checkpoint or an entry: one blob
  LeaseId lease = 0;
  BlockLocation block;
  uint64_t bytes = 0;  // the blob's own size (the block may be larger)
};

// A sealed block to write to the cold tier. Until finishSpill it is marked spilling: never
// evicted or reused, so its bytes can be read in place.
struct SpillItem {
  BlockId block = kNoBlock;
  BlockLocation location;
  uint64_t fingerprint = 0;
  Salt salt{};
  Key128 key;
  // The block's checksum as its writer took it (written into the record, not computed again).
  std::optional<uint64_t> checksum = {};
};

// A block with a disk record that eviction dropped from the host pool: its namespace and key.
struct LeftMemory {
  uint64_t fingerprint = 0;
  Salt salt{};
  Key128 key;
};

// A block moving between tiers: `from` is copied into the fresh block `to` (both pinned until
// finishMoves).
struct MoveTicket {
  BlockId from = kNoBlock, to = kNoBlock;
  BlockLocation src, dst;
  // The block's checksum, which the copy's end in host memory must match once copied (the
  // source of a promotion, the copy of a demotion); 0: nothing to check (a GPU block without
  // one).
  uint64_t sum = 0;
  bool sumOfSource = false;
};

// A cold block being read back into a fresh pool block (pinned until finishPromote).
struct PromoteTicket {
  BlockId block = kNoBlock;  // kNoBlock: nothing to do (already in memory)
  BlockLocation location;
  SpaceId space = 0;
  Key128 key;
  // Set by the reader before finishPromote: the checksum the bytes were verified against (the
  // record's, or the one the holder served), kept as the block's own. Unset: computed there.
  std::optional<uint64_t> checksum = {};
};

// Bytes a snapshot write reads in place: the first `bytes` of a block pinned until
// finishSnapshotWrites.
struct SnapshotBytes {
  BlockLocation location;
  uint32_t bytes = 0;
  Key128 key = {};    // a sealed block: its content key
  uint32_t slot = 0;  // a record of the snapshot's own: its slot (store/snapshot_manifest.h)
  // The block's (or checkpoint's) checksum from its writer, when it has one (a sealed block, a
  // checkpoint); unset for a partial block's bytes, whose checksum the move takes itself.
  std::optional<uint64_t> checksum = {};
};

// A snapshot to write to the cold tier: its manifest, the sealed blocks it names (written unless
// the cold tier holds them) and its own records (partial or unindexed blocks, checkpoints).
struct SnapshotWrite {
  SnapshotManifest manifest;
  std::vector<SnapshotBytes> sealed = {};
  std::vector<SnapshotBytes> own = {};
  std::vector<BlockId> pinned = {};  // the engine's bookkeeping
};

// One block of a snapshot being rebuilt from its manifest: `bytes` bytes to read into `dest`,
// from the cold tier's record of `key` (sealed) or from the snapshot's own record `slot`.
struct SnapshotRead {
  BlockLocation dest;
  uint32_t bytes = 0;
  bool sealed = false;
  Key128 key = {};
  uint32_t slot = 0;
  BlockId block = kNoBlock;  // the engine's: the fresh block read into (pinned meanwhile)
  size_t index = 0;          // the engine's: the manifest block (or checkpoint) it fills
  bool checkpoint = false;   // the engine's
  // Set by the reader of a sealed block: the checksum its bytes were verified against.
  std::optional<uint64_t> checksum = {};
};

// A snapshot held for another node that pulls it: its manifest, and where the bytes of each
// manifest block (a released one: bytes 0) and then of each checkpoint lie, pinned under `lease`.
struct SnapshotPin {
  LeaseId lease = 0;
  SnapshotManifest manifest;
  std::vector<SnapshotBytes> parts;
};

struct SnapshotLoad {
  SpaceId space = 0;
  SnapshotManifest manifest;
  std::vector<SnapshotRead> reads = {};
  // The engine's bookkeeping: the block of each manifest block and checkpoint, and every pin.
  std::vector<BlockId> blocks = {}, checkpoints = {}, pinned = {};
};

// Who a lookup is for: a client (this node's hits and misses), a peer's pin of blocks it fetches
// (counted as served by the cluster), or this node's own fetch holding the blocks a lookup will
// join its fetched blocks to (kHold: no hit or miss, and a replica stays one: the settle the
// hold's release brings is not one of its own, see BlockMeta::replicaSettles).
enum class LookupFor : uint8_t { kClient, kPeer, kHold };

struct LookupResult {
  uint64_t matchedTokens = 0;
  LeaseId lease = 0;  // 0 when nothing matched
  std::vector<BlockLocation> blocks;
  // For a peer's lookup (LookupFor::kPeer): each block's checksum from its writer, served with
  // it for the fetcher to verify (unset where the block has none: a GPU block's).
  std::vector<std::optional<uint64_t>> checksums = {};
  // A client's lookup: each block's checksum from its writer, for the reader to verify its copy
  // against (0: none, a GPU block's).
  std::vector<uint64_t> sums = {};
  // A client's lookup in a namespace with prefix states (Layout::stateBytes): the last
  // `stateBlocks` of `blocks` are the chunks of the state captured at matchedTokens; the blocks
  // before them cover [0, matchedTokens / B * B).
  uint32_t stateBlocks = 0;
};

struct SpaceInfo {
  Layout layout;
  uint64_t fingerprint = 0;
  Salt salt{};
  uint32_t sizeClass = 0;
  uint32_t blockBytes = 0;
  TenantId tenant = 0;  // the namespace's tenant: one per salt
  // Its writers cannot map the pool (they move bytes inline): a block is cleared before it is
  // granted to them, so no byte a block held for its previous owner can come back through a read
  // of a block they wrote only in part (docs/security.md).
  bool clearsFreshBlocks = false;
};

struct EngineStats {
  uint64_t blocksTotal = 0, blocksUsed = 0, blocksPinned = 0, blocksCached = 0;
  uint64_t bytesTotal = 0, bytesUsed = 0;
  uint64_t hits = 0, misses = 0, evictions = 0;
  // The eviction policy, the one that orders the blocks now (the adaptive policy's current
  // expert; the policy itself otherwise) and how many times that changed: evictionName()s.
  const char* eviction = "";
  const char* evictionFollowing = "";
  uint64_t evictionSwitches = 0;
  uint64_t corruptBlocks = 0;  // Engine::dropCorrupt
  uint64_t sequences = 0, readLeases = 0, writeLeases = 0;
  uint64_t snapshots = 0, entries = 0, checkpoints = 0;
  uint64_t spilled = 0, promoted = 0, coldHits = 0, evictedUnspilled = 0;
  uint64_t remoteFetched = 0;  // blocks fetched from other nodes and indexed
  uint64_t bytesPut = 0, bytesGot = 0;
  // GPU pools (blocksTotal/Used above count the host pool).
  uint64_t gpuBlocksTotal = 0, gpuBlocksUsed = 0, gpuDemoted = 0, gpuPromoted = 0;
  struct Space {
    uint64_t fingerprint = 0;
    uint32_t blockBytes = 0;
    uint64_t blocksTotal = 0, blocksUsed = 0, sequences = 0;
  };
  std::vector<Space> spaces;
  // Tenants (one per salt), in the order they opened their first namespace.
  uint64_t tenantQuotaBytes = 0;  // 0: no quota
  struct Tenant {
    Salt salt{};
    uint64_t bytesUsed = 0;     // host-pool bytes of its blocks: held, pinned and cached
    uint64_t blocksCached = 0;  // of those, evictable ones
  };
  std::vector<Tenant> tenants;
};

// Told when a sealed block enters or leaves the prefix index (the cluster's directory publishes
// what the node holds). Called on the engine's thread, inside the engine's calls: it must not
// call back into the engine.
class IndexObserver {
 public:
  virtual ~IndexObserver() = default;
  // `chain`: the keys of the block's prefix, from the chain's first block to this one (its last
  // key is `key`), where the engine knows them (a sequence sealing its blocks); empty otherwise
  // (a block read back from disk or fetched from another node). Valid during the call only.
  virtual void blockIndexed(SpaceId space, const Key128& key, std::span<const Key128> chain) = 0;
  virtual void blockUnindexed(SpaceId space, const Key128& key) = 0;
};

}  // namespace kvtier
