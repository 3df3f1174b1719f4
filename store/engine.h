// Engine: the node's KV-cache state machine — namespaces, sequences, the prefix index, leases and
// eviction over one BlockPool. No I/O of its own: memory comes through BlockMemory. Its value
// types (ids, grants, tickets, results, statistics) are in store/engine_types.h.
//
// Semantics are those of docs/semantics.md (DESIGN.md "Semantics"). Every mutation is atomic: a
// call that returns an error changed nothing.
//
// Thread-safety: none. The daemon's event loop owns the engine; other threads hand it work.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/error.h"
#include "kvtier/layout.h"
#include "store/block_pool.h"
#include "store/cold_directory.h"
#include "store/engine_types.h"
#include "store/eviction.h"
#include "store/key_memo.h"
#include "store/key_rotator.h"
#include "store/limits.h"
#include "store/prefix_index.h"
#include "store/snapshot_manifest.h"

namespace kvtier {

class Engine {
 public:
  // `pool` and `memory` are borrowed and must outlive the engine.
  // `rotator`, if any, is borrowed too; without one, middle removals are NOT_SUPPORTED.
  Engine(BlockPool& pool, BlockMemory& memory, std::unique_ptr<EvictionPolicy> policy = nullptr,
         const KeyRotator* rotator = nullptr);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The namespace for (salt, layout): the same id for the same pair. INVALID_ARGUMENT for a bad
  // layout or one whose blocks are larger than an extent. `inlineWriters`: its clients cannot map
  // the pool (SpaceInfo::clearsFreshBlocks).
  Result<SpaceId> openSpace(const Layout& layout, const Salt& salt, bool inlineWriters = false);
  const SpaceInfo& space(SpaceId id) const { return spaces_[id].info; }

  // Tenant quota (docs/security.md): the most host-pool bytes the blocks of one tenant (one salt:
  // every namespace of it; held, pinned and cached blocks alike) may take; 0: none. An allocation
  // for a tenant that would take it beyond its quota evicts that tenant's own cached blocks, one
  // for each block it takes beyond the quota (the oldest its own order holds, within
  // kMaxEvictionSkip blocks that may not go yet), and never another tenant's for those; when it
  // has too few, FULL and nothing changed. Within its quota a tenant's allocations evict any
  // cached block, in the eviction policy's order, as without a quota. Blocks of GPU pools are
  // not charged. Lowering the quota evicts nothing: a tenant above it only replaces its own
  // blocks until it is back within.
  void setTenantQuota(uint64_t bytes) { tenantQuota_ = bytes; }
  uint64_t tenantQuota() const { return tenantQuota_; }
  // Host-pool bytes charged to the tenant of `salt` (0 for a salt that opened no namespace).
  uint64_t tenantBytesUsed(const Salt& salt) const;

  // Write lease for positions [begin, begin + tokens.size()) of `seq` (created at commit if absent;
  // owned by `owner` unless `detached`). `keys`, if not empty, are the client's own keys for the
  // blocks this put completes, in order. Errors: INVALID_ARGUMENT (begin > length, sizes, names,
  // key count), CONFLICT (another write lease holds seq), FULL (nothing was evicted: a put that
  // cannot have all its blocks takes none).
  // A block the put completes whose key the prefix index holds is not allocated: the lease pins
  // the cached block and the commit shares it (as the dedup at seal would). Its grant names a
  // scratch block instead, which nobody reads: the client writes it as any other.
  // `tier` is where the new blocks go: 0 the host pool, 1 + d GPU d's pool (a copy-on-write of a
  // partial block lands there too; an in-place append stays where the block is).
  Result<PutGrant> put(OwnerId owner, SpaceId space, std::string_view seq, uint64_t begin,
                       std::span<const uint32_t> tokens, std::span<const Key128> keys,
                       const SeqOptions& options, uint8_t tier = 0);
  // Makes positions [begin, upTo) visible (kEnd: all granted) and ends the lease. Errors: RELEASED
  // (unknown lease), INVALID_ARGUMENT (upTo outside the grant; the lease stays open), CONFLICT (the
  // sequence changed since the put: the lease ends, the sequence is untouched).
  // `sums`: the writer's xxh3-64 (blockChecksum) of each block the grant fills to its end, in
  // order (blocks of a commit that ends early take the first ones), kept as the checksum the
  // block is verified against on every move; empty: the engine takes them itself from the bytes
  // in host memory (a GPU block gets one when it first reaches host memory). Any other count is
  // INVALID_ARGUMENT and leaves the lease open, as a bad upTo does.
  Result<CommitResult> commit(LeaseId lease, uint64_t upTo, std::span<const uint64_t> sums = {});
  // Ends a write lease without a trace. RELEASED if unknown.
  Status abortWrite(LeaseId lease);
  // Writable bytes of granted block `index` of a write lease (for inline writes).
  Result<uint8_t*> leaseBlockData(LeaseId lease, uint32_t index);

  // Read lease on the blocks covering [begin, end) of seq (end = kEnd: the length).
  // Errors: NOT_FOUND (unknown seq), INVALID_ARGUMENT (begin > end or end > length),
  // NOT_SUPPORTED (with `servedTier` >= 0, as for lookup: a block the session cannot reach).
  Result<ReadGrant> get(SpaceId space, std::string_view seq, uint64_t begin, uint64_t end,
                        int servedTier = -1);
  // Longest prefix of `tokens` (or of the client `keys`, one per block) made of sealed blocks,
  // under a read lease. With `bindSeq`, that prefix also becomes the whole of sequence bindSeq.
  // `knownKeys`, if given, are the first keys of the tokens' chain as lookupPlan computed them for
  // the same tokens: they are not hashed again.
  // `servedTier` (>= 0) is the tier the asking session reads besides the host pool (0: none):
  // the match ends at a block in any other tier.
  // `who`: a client's lookups are this node's hits and misses; a peer's pin of the blocks it
  // fetches is not (the cluster counts those as served blocks).
  // `maxBlocks`: a longer match is INVALID_ARGUMENT, and nothing changed (the bound of an answer
  // that carries the bytes inline).
  Result<LookupResult> lookup(OwnerId owner, SpaceId space, std::span<const uint32_t> tokens,
                              std::span<const Key128> keys, std::string_view bindSeq,
                              const SeqOptions& options, std::span<const Key128> knownKeys = {},
                              int servedTier = -1, LookupFor who = LookupFor::kClient,
                              size_t maxBlocks = SIZE_MAX);
  // Unpins the blocks of a read lease. RELEASED if unknown.
  Status releaseRead(LeaseId lease);

  Status copyPrefix(OwnerId owner, SpaceId space, std::string_view src, std::string_view dst,
                    uint64_t len, const SeqOptions& options);
  // Middle ranges (end < length) need the layout's RoPE scheme and a KeyRotator: later tokens move
  // down and their K is re-rotated; the moved KV is no longer what a prefill of the shortened
  // tokens would give, so from `begin` on the sequence's blocks never enter the prefix index.
  // The re-rotated blocks are host blocks (GPU blocks are read through a host copy).
  Status remove(SpaceId space, std::string_view seq, uint64_t begin, uint64_t end);
  Status truncate(SpaceId space, std::string_view seq, uint64_t len);
  Result<bool> canResume(SpaceId space, std::string_view seq, uint64_t pos);
  // Length of seq, or nullopt when it does not exist.
  Result<std::optional<uint64_t>> length(SpaceId space, std::string_view seq);

  // --- Snapshots: immutable, block-sharing copies of [from, length) of a sequence.
  // NOT_FOUND for an unknown sequence; INVALID_ARGUMENT if `from` lies before a window's start.
  // Empty (from = to) when from >= length.
  Result<SnapshotInfo> snapshot(SpaceId space, std::string_view seq, uint64_t from);
  // seq becomes its own [0, snap.from) plus the snapshot's [from, target). INVALID_ARGUMENT when
  // target is outside [from, to], seq is shorter than from, the snapshot holds recurrent state but
  // none at target, or a window would need released positions. Without a snapshot, rewinds seq
  // to target (<= length) under the same window and checkpoint rules.
  Status restore(OwnerId owner, SpaceId space, std::string_view seq, std::optional<SnapshotId> snap,
                 uint64_t target, const SeqOptions& options);
  // A new snapshot [a.from, b.to); requires a.to == b.from.
  Result<SnapshotInfo> mergeSnapshots(SpaceId space, SnapshotId a, SnapshotId b);
  // Two new snapshots [from, at) and [at, to); at or outside the ends gives one empty half.
  // NOT_SUPPORTED for snapshots holding recurrent state.
  Result<std::pair<SnapshotInfo, SnapshotInfo>> splitSnapshot(SpaceId space, SnapshotId id,
                                                              uint64_t at);
  Result<SnapshotInfo> snapshotInfo(SpaceId space, SnapshotId id);
  Status dropSnapshot(SpaceId space, SnapshotId id);

  // --- Recurrent state checkpoints: a blob of `bytes` at position `pos` (<= length) of seq.
  Result<BlobGrant> putCheckpoint(SpaceId space, std::string_view seq, uint64_t pos,
                                  uint64_t bytes);
  Result<BlobGrant> getCheckpoint(SpaceId space, std::string_view seq, uint64_t pos);
  Result<std::vector<uint64_t>> checkpointPositions(SpaceId space, std::string_view seq);

  // --- Position-independent entries (encoder outputs, image embeddings): content-keyed blobs,
  // evicted and counted like blocks. A put of a key that exists is deduplicated at commit.
  Result<BlobGrant> putEntry(SpaceId space, const Key128& key, uint64_t bytes);
  Result<BlobGrant> getEntry(SpaceId space, const Key128& key);

  // Commits a checkpoint or entry lease (commit() works for every kind of write lease).

  // --- Prefix states (Layout::stateBytes; store/engine_states.cc, docs/cache-shapes.md). A state
  // is what a restore at a position needs besides the KV blocks before it: the model's recurrent
  // state there and, at a position inside a block, the KV of the tokens past the last block
  // boundary. It is kept as chunks of the namespace's block size, sealed in the prefix index
  // under keys derived from the prefix's content, so any process finds another's, and they are
  // evicted, spilled and promoted as blocks are.
  // A write lease on the chunks of the state after tokens[0, n) (or, client-keyed, after the
  // blocks `keys`, at their end), to be filled with Layout::statePayloadBytes(n % blockTokens)
  // bytes: a block whose first n % blockTokens slots hold those tokens' KV (when not 0), then the
  // state. commit() seals them; a chunk cached already is not replaced. INVALID_ARGUMENT for a
  // layout without a state, no tokens or too many; FULL when the pool has no room.
  Result<PutGrant> putState(SpaceId space, std::span<const uint32_t> tokens,
                            std::span<const Key128> keys);
  // For the cluster (engine_states.cc): the states a lookup of `tokens` (or the client's `keys`)
  // could restore deeper than what this node holds in memory or on disk — every block boundary
  // up to the deepest block of `chain` (the prompt's block keys, chainKeys) held here (at most
  // 64 of them) and the positions inside the block after it — deepest first, each named by its
  // first chunk's key. A state's chunks are filed in the directory as if they followed the
  // blocks before its position in the chain.
  struct StateCandidate {
    uint64_t position = 0;
    Key128 firstChunk;
  };
  std::vector<StateCandidate> stateCandidates(SpaceId space, std::span<const uint32_t> tokens,
                                              std::span<const Key128> keys,
                                              std::span<const Key128> chain) const;
  // The keys of the chunks of the state at `position` of `tokens` (or after the client's `keys`).
  std::vector<Key128> stateChunkKeys(SpaceId space, std::span<const uint32_t> tokens,
                                     std::span<const Key128> keys, uint64_t position) const;

  // --- Cold tier (the daemon moves the bytes; the engine keeps the rules).
  // With a directory set, eviction drops only blocks already on disk, and lookups see cold blocks.
  // `directory` is borrowed and must outlive the engine.
  void setColdDirectory(const ColdDirectory* directory) { cold_ = directory; }
  // While paused (a failing disk), eviction may drop blocks not yet written (counted).
  void setSpillPaused(bool paused) { spillPaused_ = paused; }
  // Up to `max` sealed blocks that nothing holds and that are not on disk, and no more than
  // `maxBytes` once it holds `min`: first those eviction will reach soonest (the head of each
  // host class's eviction order, at most as many blocks of it walked as wait to be spilled),
  // then the others in the order they became evictable.
  std::vector<SpillItem> takeSpillBatch(size_t max, uint64_t maxBytes = kEnd, size_t min = 1);
  // Every sealed block not yet on disk, held or not (a graceful shutdown's flush).
  std::vector<SpillItem> takeAllUnspilled();
  // The same blocks, most useful first, for a flush that may not write them all (a bounded
  // shutdown): blocks something holds or pins (sequences, leases) first, then cached blocks in
  // the reverse of the eviction policy's order (the last it would evict first).
  std::vector<SpillItem> takeAllUnspilledByValue();
  // Written blocks are marked on disk: eviction may drop them at no cost.
  void finishSpill(std::span<const SpillItem> items, bool written);
  // Blocks waiting to be spilled (a hint: may count some that no longer need it).
  size_t spillBacklog() const { return dirty_.size(); }
  // The blocks with a disk record that eviction dropped from the host pool since the last call,
  // in eviction order: their records are now the only copies, and the cold tier's bound drops
  // such records in the order their blocks left memory (ColdTier::leftMemory).
  std::vector<LeftMemory> takeLeftMemory() { return std::exchange(leftMemory_, {}); }
  // The longest prefix of `tokens` (or `keys`) whose blocks are in memory or on disk; for each
  // block, its key and whether it is in memory. The blocks in memory count as used now (the most
  // recent in the eviction order), so the promotes of the cold ones evict older blocks first.
  // `withState`, in a namespace with prefix states: the plan of a client's lookup that answers a
  // state (not a binding one, not a peer's pin): the blocks before the deepest position whose
  // state is in memory or on disk, then that state's chunks (PlanStep::state).
  struct PlanStep {
    Key128 key;
    bool hot;
    bool state = false;  // a chunk of the prefix state the lookup will answer (after the blocks)
  };
  Result<std::vector<PlanStep>> lookupPlan(SpaceId space, std::span<const uint32_t> tokens,
                                           std::span<const Key128> keys, bool withState = false);
  // A fresh pinned block to read cold `key` into; FULL if none can be had.
  Result<PromoteTicket> beginPromote(SpaceId space, const Key128& key);
  // beginPromote for each of `keys` at once: the blocks are allocated together (one choice of
  // victims for all), so that a lookup's promotes cost one walk of the eviction order. A key
  // back in memory meanwhile gets a ticket with no block. FULL when the pool has no room for all
  // of them: nothing changed (the caller may promote fewer).
  Result<std::vector<PromoteTicket>> beginPromotes(SpaceId space, std::span<const Key128> keys);
  // Seals and indexes the promoted block (ok) or frees it (the record was missing or corrupt).
  // `remote`: the bytes came from another node (counted apart; not on this node's disk). A
  // remote block is a `replica` (the other node keeps its copy: this one goes first when room is
  // needed, until used again) unless it was handed over for good (a drain).
  void finishPromote(const PromoteTicket& ticket, bool ok, bool remote = false,
                     bool replica = true);
  // Every candidate key of a lookup's tokens (or its client keys), whether held or not: the
  // chain a remote lookup asks the cluster about. The first `known.size()` keys are taken from
  // `known` (computed before for the same tokens).
  Result<std::vector<Key128>> chainKeys(SpaceId space, std::span<const uint32_t> tokens,
                                        std::span<const Key128> keys,
                                        std::span<const Key128> known = {}) const;
  // Whether the prefix index holds `key` in `space` (in memory).
  bool indexed(SpaceId space, const Key128& key) const {
    return index_.find(space, key) != kNoBlock;
  }
  // Every snapshot in memory, by namespace (a drain moves them to other nodes).
  std::vector<std::pair<SpaceId, SnapshotId>> snapshotList() const;
  // Every sealed block of the prefix index in memory, by namespace (a drain copies them).
  std::vector<std::pair<SpaceId, Key128>> indexedBlocks() const;
  // The keys of the sealed blocks of `seq` that cover [begin, end) (end clamped to its length)
  // and are held in memory, for a copy to another node. NOT_FOUND without the sequence;
  // INVALID_ARGUMENT when its KV is not indexed, or, with `whole`, when part of the range lies
  // in its unfilled last block (which only this node can hold: a move would lose it).
  Result<std::vector<Key128>> sequenceKeys(SpaceId space, std::string_view seq, uint64_t begin,
                                           uint64_t end, bool whole);
  // Frees the cached blocks `keys` that nothing holds or pins (the last step of a move); blocks
  // a sequence, a snapshot or a lease still holds stay. Returns how many were freed.
  size_t dropCached(SpaceId space, std::span<const Key128> keys);
  // The observer told of index changes (borrowed; nullptr: none).
  void setIndexObserver(IndexObserver* observer) { observer_ = observer; }

  // --- GPU tiers (the daemon moves the bytes; the engine keeps the rules). Tier 0 is the host
  // pool, 1 + d the pool of GPU d. Blocks move only while nothing but the prefix index holds them.
  // With demotion on, a full GPU class never drops a block: it answers FULL until the daemon has
  // demoted some to the host pool.
  void setGpuDemotion(bool on) { demoteGpuBlocks_ = on; }
  // When fewer than `lowWater` (a fraction) of a GPU class's blocks in `tier` are free: up to
  // `max` of its least recently used evictable blocks, each with a fresh host block to move into.
  std::vector<MoveTicket> takeDemoteBatch(uint8_t tier, size_t max, double lowWater);
  // For each of `keys` whose block of `space` is in another tier, held only by the index: a fresh
  // block in `tier` to move it into (stops at the first that has no room). A GPU session's lookup
  // brings its prefix to its GPU; a host session's brings GPU blocks to the host pool.
  std::vector<MoveTicket> beginMovesTo(SpaceId space, std::span<const Key128> keys, uint8_t tier);
  // After the copies: a moved block's index entry names its new block and the old block is freed.
  // A block that someone took meanwhile (a sequence, a lease) stays where it was; the copy is
  // freed.
  // `damaged[i]`: ticket i's bytes in host memory did not match its checksum after the copy: the
  // move does not take and the source block is dropped as corrupt (as dropCorrupt does).
  void finishMoves(std::span<const MoveTicket> tickets, bool copied,
                   std::span<const uint8_t> damaged = {});
  // --- Snapshot persistence (docs/cache-shapes.md). With a cold directory set, every new snapshot
  // waits to be written (write-behind); a snapshot rebuilt from disk is written already.
  // Snapshots waiting, oldest first, until they cover `maxBlocks` blocks (at least one snapshot
  // when any waits). Their blocks stay pinned until finishSnapshotWrites.
  std::vector<SnapshotWrite> takeSnapshotWrites(size_t maxBlocks);
  // written: the snapshots, and the sealed blocks they name, are on disk. Otherwise they wait for
  // the next try. Snapshots dropped meanwhile are skipped (their deletion is queued after).
  void finishSnapshotWrites(std::span<const SnapshotWrite> writes, bool written);
  size_t snapshotWriteBacklog() const { return unwrittenSnapshots_.size(); }  // a hint
  // Written snapshots holding a sealed block whose record `held(space, key)` says is gone (the
  // cold tier's capacity bound took it since) wait to be written again, record included. Returns
  // how many. For a graceful shutdown: what memory still holds is kept.
  size_t rewriteSnapshotsMissing(const std::function<bool(SpaceId, const Key128&)>& held);
  bool hasSnapshot(SpaceId space, SnapshotId id) const;
  // True when the snapshot's manifest is on disk or being written: dropping it must delete it.
  bool snapshotOnDisk(SpaceId space, SnapshotId id) const;
  // Snapshot ids: the next one is at least `next`; ids at or past `limit` are not handed out
  // (UNAVAILABLE) until a higher limit is set. The daemon sets only limits it has persisted, so
  // that no id is handed out twice across restarts. Without a limit set: unbounded.
  void setSnapshotIds(SnapshotId next, SnapshotId limit);
  SnapshotId nextSnapshotId() const { return nextSnapshot_; }
  SnapshotId snapshotIdLimit() const { return snapshotIdLimit_; }
  // Rebuilds a snapshot from its manifest in two steps around the reads. begin checks the
  // manifest against the namespace (INVALID_ARGUMENT: it is not usable here), pins the sealed
  // blocks still in memory and fresh blocks for the others (FULL when there is no room; nothing
  // changed); NOT_SUPPORTED when a checkpoint is larger than this pool's extents; CONFLICT if
  // the snapshot is in memory. The caller then reads every SnapshotRead.
  Result<SnapshotLoad> beginSnapshotLoad(SpaceId space, SnapshotManifest manifest);
  // readOk[i]: whether reads[i] was read. When all were, the snapshot exists again under its id;
  // otherwise NOT_FOUND, and nothing changed but the sealed blocks that were read, which join
  // the prefix index as promoted blocks. Releases every pin of the load.
  // `remote`: the bytes came from another node (counted apart); the snapshot is then not on this
  // node's disk, and stays in memory only unless queueSnapshotWrite is called for it.
  Result<SnapshotInfo> finishSnapshotLoad(SnapshotLoad& load, std::span<const uint8_t> readOk,
                                          bool remote = false);
  // For another node: snapshot `id`'s manifest and its blocks, pinned under a read lease
  // (releaseRead). NOT_FOUND if memory does not hold it.
  Result<SnapshotPin> pinSnapshot(SpaceId space, SnapshotId id);
  // A fresh snapshot id (for a snapshot pulled from another node). UNAVAILABLE as for snapshot().
  Result<SnapshotId> reserveSnapshotId();
  // With a cold directory set, a snapshot that is not on disk waits to be written (write-behind).
  void queueSnapshotWrite(SpaceId space, SnapshotId id);

  // Bytes of a sealed block of `space` named by a client reference. STALE_REFERENCE when the
  // generation no longer matches (the block was reused) or the block is no longer sealed;
  // INVALID_ARGUMENT for a reference that names no block.
  Result<const uint8_t*> resolveSealed(SpaceId space, const BlockLocation& ref);

  // Removes the sequences `owner` created that are not detached (its session ended).
  void endOwner(OwnerId owner);

  // A reader found the bytes of these sealed blocks of `space` differ from their writer's
  // checksum (a memory fault, a stray write). Each one whose bytes really differ now — the engine
  // sums them itself; a reference that is stale, unsealed, in GPU memory or whose bytes check out
  // is passed over — leaves the prefix index at once (no lookup finds it again; a copy on disk
  // serves the next one) and is freed when nothing holds it. Returns how many it dropped.
  size_t dropCorrupt(SpaceId space, std::span<const BlockLocation> refs);
  uint64_t corruptBlocks() const { return corruptBlocks_; }

  EngineStats stats() const;
  BlockPool& pool() { return pool_; }
  BlockMemory& memory() { return memory_; }

 private:
  struct Sequence {
    std::vector<BlockId> blocks;   // kNoBlock where a window released the block
    std::vector<Key128> keys;      // keys of its full blocks (index = block), for the chain
    std::vector<uint32_t> tokens;  // one per position; its size is the length
    std::map<uint64_t, BlockId> checkpoints;  // recurrent state blobs by position
    OwnerId owner = 0;
    SeqOptions options;
    uint64_t firstRetained = 0;  // positions below were released by the window or chunk
    bool clientKeyed = false;    // keys came from the client: tokens cannot rebuild them
    bool unindexed = false;      // its KV is not a prefill of its tokens: never sealed or indexed
    uint64_t version = 0;        // engine-wide unique, changes on every mutation
  };
  struct Snapshot {
    SpaceId space = 0;
    uint64_t from = 0, to = 0;
    std::vector<BlockId> blocks;              // cover [from / B * B, to)
    std::vector<uint32_t> tokens;             // [0, to) of the sequence it came from
    std::vector<Key128> keys;                 // of the full blocks [0, to / B)
    std::map<uint64_t, BlockId> checkpoints;  // in [from, to]
    SeqOptions options;
    bool clientKeyed = false, unindexed = false;
    // Its manifest on disk (snapshot persistence): kNone without a cold tier.
    enum class Disk : uint8_t { kNone, kWaiting, kWriting, kWritten };
    Disk disk = Disk::kNone;
  };
  enum class LeaseKind : uint8_t { kSequence, kCheckpoint, kEntry, kState };
  struct Space {
    SpaceInfo info;
    std::unordered_map<std::string, Sequence> seqs;
    std::unordered_map<std::string, LeaseId> writers;  // seq name -> open write lease
  };
  struct WriteLease {
    LeaseKind kind = LeaseKind::kSequence;
    uint64_t blobBytes = 0;  // checkpoint and entry leases
    Key128 entryKey;         // entry leases
    SeqOptions options;
    SpaceId space = 0;
    std::string seq;
    OwnerId owner = 0;
    uint64_t begin = 0;
    uint64_t firstPosition = 0;
    std::vector<uint32_t> tokens;
    std::vector<Key128> keys;
    std::vector<BlockId> blocks;
    bool firstInPlace = false;  // blocks[0] is the sequence's own partial block, appended in place
    uint64_t seqVersion = 0;    // 0: the sequence did not exist
    // Keys the commit seals the completed blocks with, computed by the put (empty: none).
    std::vector<Key128> chain;
    // reused[i]: blocks[i] is a cached block of the prefix index the commit shares (pinned, never
    // written); the client writes that block's bytes into `sink` instead. Empty: none reused.
    std::vector<uint8_t> reused;
    BlockId sink = kNoBlock;
  };
  struct ReadLease {
    std::vector<BlockId> blocks;
  };
  struct IndexKey {
    SpaceId space;
    Key128 key;
    bool operator==(const IndexKey&) const = default;
  };
  struct IndexKeyHash {
    size_t operator()(const IndexKey& k) const noexcept {
      return std::hash<Key128>()(k.key) ^ (size_t{k.space} * 0x9e3779b97f4a7c15ull);
    }
  };

  Status checkSpace(SpaceId space) const;
  // The bounds on a lookup's tokens or keys (lookup and lookupPlan).
  Status checkLookupInput(SpaceId space, std::span<const uint32_t> tokens,
                          std::span<const Key128> keys) const;
  // Walks the key chain of a lookup's candidate blocks — the client's keys, or the chain hashed
  // from the tokens (the first `known.size()` keys taken from `known`) — calling visit(i, key)
  // until it returns false. Returns how many blocks were candidates.
  size_t walkKeys(SpaceId space, std::span<const uint32_t> tokens, std::span<const Key128> keys,
                  std::span<const Key128> known,
                  const std::function<bool(size_t, const Key128&)>& visit) const;
  Sequence* findSeq(SpaceId space, std::string_view name);
  // Whether a session that reads the host pool and tier `servedTier` (< 0: every tier) can read
  // block `id`.
  bool reachable(BlockId id, int servedTier) const;
  // A move of `from`'s bytes into the fresh block `to`, both pinned until finishMoves.
  MoveTicket beginMove(BlockId from, BlockId to);
  // Sealed block `id` of `space` holds bytes other than its writer's: out of the index now,
  // freed once nothing holds it (never cached again), counted.
  void markCorrupt(BlockId id, SpaceId space);
  uint32_t blockTokens(SpaceId space) const { return spaces_[space].info.layout.blockTokens; }

  // Allocation with eviction: a fresh block of the space's class (or of `cls`), or kNoBlock when
  // the class is full and nothing is evictable.
  BlockId allocate(SpaceId space, uint8_t tier = 0);
  BlockId allocateClass(uint32_t cls, TenantId tenant);
  // The size class of the space's blocks in `tier` (which must exist).
  uint32_t classOf(SpaceId space, uint8_t tier);
  // Whether allocation may drop `victim`, a block of class `cls` in the eviction order.
  bool mayEvict(BlockId victim, uint32_t cls) const;
  // The `n` blocks allocation evicts for class `cls`, into `out`: first `own` of `tenant`'s own
  // order, then the first of the eviction order, each one that may be dropped, the blocks of
  // `keep` (sorted; about to be pinned) left out. False when there are fewer within
  // kMaxEvictionSkip blocks that may not be dropped (in each walk). Walks O(n + skipped).
  bool victimsFor(uint32_t cls, size_t n, std::span<const BlockId> keep, std::vector<BlockId>& out,
                  TenantId tenant = kNoTenant, size_t own = 0) const;
  // How many of the victims of an allocation of `n` blocks of `cls` for `tenant` must be the
  // tenant's own, so that it stays within its quota (or, above it, does not grow): 0 without a
  // quota or within it.
  size_t ownVictimsNeeded(uint32_t cls, size_t n, TenantId tenant) const;
  // The victims (victimsFor's) an allocation of `n` blocks of `cls` for `tenant` evicts first:
  // none while the class has free blocks and the tenant stays within its quota.
  bool planVictims(uint32_t cls, size_t n, TenantId tenant, std::span<const BlockId> keep,
                   std::vector<BlockId>& out) const;
  // Evicts `victims` of class `cls` (victimsFor's), counting those the cold tier lacks.
  void evictFor(uint32_t cls, std::span<const BlockId> victims);
  // Whether `n` blocks of class `cls` can be had for `tenant` — free, or by evicting — leaving the
  // blocks of `keep` (about to be pinned) in place. Walks at most the blocks it would evict and
  // skip.
  bool canAllocate(uint32_t cls, size_t n, TenantId tenant,
                   std::span<const BlockId> keep = {}) const;
  // The eviction order's bookkeeping, the policy's and the tenants' together: `id` became
  // evictable (or was used while it is: it moves to the end), is no longer, or left memory.
  void cacheInsert(BlockId id, bool first = false);
  void cacheErase(BlockId id);
  // The tenant's evictable blocks of class `cls`, in the order they became evictable.
  BlockLists::List& tenantOrder(TenantId tenant, uint32_t cls);
  // The keys the commit of a put of `tokens` at `begin` will seal the blocks it completes with
  // (as sealFrom gives them), in order; empty when it will seal none.
  std::vector<Key128> putChain(SpaceId space, const Sequence* seq, uint64_t begin,
                               std::span<const uint32_t> tokens,
                               std::span<const Key128> keys) const;
  Result<BlobGrant> grantBlob(LeaseKind kind, SpaceId space, std::string seq, uint64_t pos,
                              uint64_t bytes, const Key128& key);
  Result<CommitResult> commitBlob(LeaseId id, WriteLease& lease);
  Result<CommitResult> commitState(LeaseId id, WriteLease& lease, std::span<const uint64_t> sums);
  // The state a lookup of `tokens` (or the client's `keys`) can restore: the deepest position
  // whose state chunks `has` holds, among the block boundaries up to `blocks` (the leading blocks
  // of the chain available: `chain` holds their keys) and positions inside the block after one
  // (docs/cache-shapes.md). Without KV in the layout, every block boundary of the tokens counts
  // and `chain` may be empty (the keys are hashed here).
  struct StateFind {
    uint64_t position = 0;  // 0: none
    std::vector<Key128> chunks;
  };
  StateFind findState(SpaceId space, std::span<const uint32_t> tokens, std::span<const Key128> keys,
                      std::span<const Key128> chain, size_t blocks,
                      const std::function<bool(const Key128&)>& has) const;
  // The state part of a client's lookup in a namespace with states: `blocks` (the chain's leading
  // blocks in memory, keys in `chain`) are cut to those before the restorable position, and the
  // state's chunks appended.
  void answerWithState(SpaceId space, std::span<const uint32_t> tokens,
                       std::span<const Key128> keys, std::span<const Key128> chain, int servedTier,
                       std::vector<BlockId>& blocks, LookupResult& result);
  // Creates seq with `options` if absent.
  Sequence& createSeq(SpaceId space, std::string_view name, OwnerId owner,
                      const SeqOptions& options);
  // First position a sequence needs to continue at `pos` (window or chunk; 0 otherwise).
  static uint64_t neededFrom(const SeqOptions& options, uint64_t pos);
  // Releases blocks wholly before what the window or chunk still needs at the end.
  void applyRetention(Sequence& seq, uint32_t blockTokens);
  // Seals the full blocks [from, length / B) of seq with keys from its tokens (or `given`).
  uint32_t sealFrom(SpaceId space, Sequence& seq, size_t from, std::span<const Key128> given);
  // Copies token slots [begin, end) of every layer's K and V from `from` to `to`.
  void copySlotRange(SpaceId space, BlockId from, BlockId to, uint32_t begin, uint32_t end);
  void dropCheckpointsAfter(Sequence& seq, uint64_t pos);
  void dropAllCheckpoints(Sequence& seq);
  Result<SnapshotInfo> addSnapshot(Snapshot snap);
  // UNAVAILABLE unless `n` more snapshot ids may be handed out.
  Status checkSnapshotIds(uint64_t n) const;
  const Snapshot* findSnapshot(SpaceId space, SnapshotId id) const;
  // Indexes a block read back from the cold tier as the sealed block `key` of `space`; false
  // when a twin is indexed already (the caller's block is then freed when unpinned).
  bool indexPromoted(SpaceId space, const Key128& key, BlockId block,
                     std::optional<uint64_t> checksum, bool remote = false, bool replica = true);
  SnapshotInfo infoOf(SnapshotId id, const Snapshot& snap) const;
  Status middleRemove(SpaceId space, Sequence& seq, uint64_t begin, uint64_t end);
  // The manifest of a snapshot and the bytes it names, its blocks pinned (w.pinned).
  SnapshotWrite describeSnapshot(SnapshotId id, const Snapshot& snap);
  void evict(BlockId victim);
  // Marks a sealed block as being written to the cold tier and describes it for the writer.
  SpillItem markSpilling(BlockId b);
  // Allocates n blocks or none; evicts nothing unless all n can be had.
  bool allocateMany(SpaceId space, size_t n, std::vector<BlockId>& out, uint8_t tier = 0);
  void ref(BlockId id);
  void unref(BlockId id);
  void pin(BlockId id);
  void unpin(BlockId id);
  // Drop the holds on a run of a prefix's blocks last-block-first, so that the blocks that become
  // evictable enter the eviction order tail first: a block is never kept behind its parent.
  void unrefTailFirst(std::span<const BlockId> blocks);
  // Brings the metadata that holding or releasing `id` touches (its BlockMeta, the policy's and
  // the tenant order's nodes) into the cache. Loops over runs of blocks call it kPrefetchAhead
  // blocks ahead: with 10 M blocks indexed each of those is a cache miss, and overlapped they
  // cost about one (issue 18: lookup latency flat from 10 k to 10 M blocks).
  void prefetchHold(BlockId id) const;
  static constexpr size_t kPrefetchAhead = 8;
  // op(id) for each block of `blocks`, first to last (or last to first with `tailFirst`),
  // prefetching the block kPrefetchAhead further on (prefetchHold).
  template <typename Op>
  void forEachPrefetched(std::span<const BlockId> blocks, bool tailFirst, Op op);
  void unpinTailFirst(std::span<const BlockId> blocks);
  // Frees a block that nothing holds any more, or hands a sealed one to the eviction policy.
  void settle(BlockId id);
  // Copies token slots [0, slots) of every layer's K and V from `from` to `to`.
  // Zeroes a block taken for a namespace whose writers cannot map the pool
  // (SpaceInfo::clearsFreshBlocks); nothing for others. allocate() and allocateMany() do it for
  // every block they take: a put's grant, and the blocks the engine fills in part itself (a
  // copy-on-write copy, a restore's or a merge's joined block, a middle removal's).
  void clearForInlineWriters(SpaceId space, BlockId id);
  void copySlots(SpaceId space, BlockId from, BlockId to, uint32_t slots);
  // Seals block `index` of seq (full), keys it after block index-1, and dedups against the index.
  // Returns the block the sequence holds afterwards (the indexed twin if one existed).
  BlockId seal(SpaceId space, Sequence& seq, size_t index, const Key128& key);
  // Gives a block without a checksum one from its first `bytes` bytes, where the engine can read
  // them (host memory): the fallback for bytes no writer summed (inline writes, a GPU block on
  // its way to the host pool, a block whose writer sent none).
  void ensureChecksum(BlockId id, uint64_t bytes);
  void replaceBlocks(Sequence& seq, std::vector<BlockId> blocks);
  void eraseSeq(SpaceId space, std::string_view name);
  LeaseId newReadLease(std::vector<BlockId> blocks);
  void finishWrite(LeaseId id, WriteLease& lease);

  BlockPool& pool_;
  BlockMemory& memory_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::vector<Space> spaces_;
  // Tenants, by TenantId: their salt, and by size class the order their evictable host blocks
  // became evictable in (least recently first), linked through tenantLinks_.
  struct Tenant {
    Salt salt{};
    std::vector<BlockLists::List> cached;
  };
  std::vector<Tenant> tenants_;
  BlockLists tenantLinks_;
  uint64_t tenantQuota_ = 0;
  PrefixIndex index_;
  // Keys hashed before, for the chains of later lookups and puts (mutable: the const calls that
  // hash a chain remember what they hashed).
  mutable KeyMemo keyMemo_;
  struct Entry {
    BlockId block;
    uint64_t bytes;
  };
  std::unordered_map<IndexKey, Entry, IndexKeyHash> entries_;
  std::unordered_map<SnapshotId, Snapshot> snapshots_;
  SnapshotId nextSnapshot_ = 1;
  SnapshotId snapshotIdLimit_ = std::numeric_limits<SnapshotId>::max();
  std::deque<SnapshotId> unwrittenSnapshots_;  // waiting for takeSnapshotWrites (hints)
  const KeyRotator* rotator_ = nullptr;
  const ColdDirectory* cold_ = nullptr;
  IndexObserver* observer_ = nullptr;
  uint64_t remoteFetched_ = 0;
  bool spillPaused_ = false;
  bool demoteGpuBlocks_ = false;
  uint64_t gpuDemoted_ = 0, gpuPromoted_ = 0;
  std::deque<BlockId> dirty_;  // sealed blocks that became evictable before reaching the disk
  std::vector<LeftMemory> leftMemory_;  // takeLeftMemory
  // By size class: the scratch block that open write leases write the bytes of reused blocks into
  // (nobody reads it); kNoBlock when no lease needs one. Freed with its last lease.
  std::vector<BlockId> sinks_;
  // Blocks of the eviction order that allocation passes over because they are not on disk yet
  // (the cold tier on) or being spilled, before it answers FULL: about a spill batch of small
  // blocks, the run the spiller may be writing at the head of the order.
  static constexpr size_t kMaxEvictionSkip = 4096;
  mutable std::vector<BlockId> orderScratch_;  // victimsFor's walk (no allocation per call)
  mutable std::vector<BlockId> skipScratch_;   // victimsFor's: `keep` and the tenant's victims
  std::vector<BlockId> victimScratch_;         // allocateClass's victim
  uint64_t spilled_ = 0, promoted_ = 0, coldHits_ = 0, evictedUnspilled_ = 0;
  std::unordered_map<LeaseId, WriteLease> writeLeases_;
  std::unordered_map<LeaseId, ReadLease> readLeases_;
  LeaseId nextLease_ = 1;
  uint64_t nextVersion_ = 1;
  uint64_t pinnedBlocks_ = 0;
  uint64_t hits_ = 0, misses_ = 0, evictions_ = 0, bytesPut_ = 0, bytesGot_ = 0;
  uint64_t corruptBlocks_ = 0;
};

}  // namespace kvtier
