// The kvtier client SDK (blocking C++ API).
//
//   auto client = kvtier::Client::connect({.socketPath = "kvtier-data/kvtierd.sock"}).value();
//   auto space = client->open(layout).value();
//   space->put("req-1", 0, tokens, kv.data(), kv.size()).value();      // bytes go into shared
//   memory auto hit = space->lookup(prompt).value();                           // longest cached
//   prefix hit.copyTo(0, hit.matchedTokens(), out.data(), out.size()).value(); // or read
//   hit.block(i) in place
//
// Threading: by default a Client runs its own event-loop thread; every method may be called from
// any thread and blocks the caller until the daemon answers. ClientThreading::kCallerThread runs
// it on the connecting thread instead (no thread hop per call; that thread only). Spaces, handles
// and views borrow the Client and must not outlive it.
//
// Bytes: a block holds [layer][K|V][slot][kvHead][headDim] (see kvtier/layout.h). The `kv`
// buffers of put() and copyTo() are "packed": [layer][K|V][token][kvHead][headDim] over the tokens
// of the call, so each call moves 2 * numLayers contiguous runs per block.
//
// GPU: a Client built with CUDA may open a space on a device (OpenOptions::device). Its puts then
// land in that GPU's pool and its lookups bring the prefix there; putPaged and gatherTo move the
// bytes between the engine's own paged KV cache (vLLM's layout) and the pool with kernels on the
// engine's stream, through CUDA IPC mappings the client opens once per extent and closes with
// the client. Block views (ReadHandle::block, WriteHandle::block) are empty for GPU blocks.
//
// Errors: every call returns a Result whose error code is one of kvtier::ErrorCode (stable); the
// daemon's typed errors arrive unchanged, a lost connection is UNAVAILABLE.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/error.h"
#include "kvtier/layout.h"

namespace kvtier {

inline constexpr uint64_t kEndPosition = UINT64_MAX;

enum class ClientThreading {
  // The client runs its own event-loop thread; any thread may call it (each call hops to the loop
  // thread and back).
  kOwnThread,
  // The client runs on the thread that calls connect(), with no hop: lowest latency, for engines
  // whose scheduler thread does all cache calls. Calls from another thread fail (INVALID_ARGUMENT);
  // a handle dropped on another thread is released with the client's next call on its own.
  kCallerThread,
};

struct ClientOptions {
  std::string socketPath = "kvtier-data/kvtierd.sock";
  std::string clientName = "kvtier-client";
  // Map the daemon's pool and move bytes in place (the default). When false, or when the pool
  // cannot be mapped, bytes travel inline in the RPC messages.
  bool mapPool = true;
  ClientThreading threading = ClientThreading::kOwnThread;
  // Caller-thread mode: while calls follow each other within this window, the calling thread
  // polls for the daemon's answer for up to this long before it sleeps, so the answer need not
  // wake it (on a small VM a wake-up costs more than the call); the first call after a pause does
  // not poll (see transport/busy_poll.h). Zero: never polls. CPU spent: at most this per call.
  // Clamped to [0, 10 ms]. (Own-thread mode never polls: its loop thread would hold the core the
  // caller it wakes is placed on.)
  std::chrono::microseconds busyPoll{50};
  // Lookups (and their releases) over the session's fast lane: a second connection with
  // hand-framed messages, one each way per lookup, from the calling thread in either threading
  // mode (transport/lane_codec.h). Off: every call goes over Cap'n Proto. Calls the lane cannot
  // take (binding a sequence, inline bytes, another thread's lookup under way) always do.
  bool lane = true;
  // When the daemon went away (calls fail UNAVAILABLE), the client connects again by itself once
  // it is back: a call made when an attempt is due tries first (at most one attempt per
  // `reconnectInterval`, however often calls come: a client calling without pause is connected
  // again within that interval of the daemon's return). The new daemon is a new session: spaces
  // opened before are opened again on it at their next call, sequences the old session owned are
  // gone with it, and handles from before fail (UNAVAILABLE; their views stay readable until
  // released). Off: every call after the loss fails UNAVAILABLE; connect a new Client.
  bool reconnect = true;
  std::chrono::milliseconds reconnectInterval{250};
};

struct BlockRef {
  uint32_t extent = 0;
  uint64_t offset = 0;
  uint32_t bytes = 0;
  uint64_t generation = 0;
};

struct SpaceStats {
  uint64_t fingerprint = 0;
  uint32_t blockBytes = 0;
  uint64_t blocksTotal = 0, blocksUsed = 0, sequences = 0;
};

struct Stats {
  uint64_t blocksTotal = 0, blocksUsed = 0, blocksPinned = 0, blocksCached = 0;
  uint64_t bytesTotal = 0, bytesUsed = 0;
  uint64_t hits = 0, misses = 0, evictions = 0;
  // The eviction policy (kvtierd --eviction: "adaptive" by default), the one that orders the
  // blocks now (the adaptive policy's current expert: "lru", "arc", "2q", "s3fifo" or "sieve";
  // the policy itself otherwise), and how many times the adaptive policy changed expert.
  std::string evictionPolicy, evictionFollowing;
  uint64_t evictionSwitches = 0;
  // Blocks a reader found differing from their writer's checksum (checked again by the daemon):
  // out of the index, freed.
  uint64_t blocksCorrupt = 0;
  uint64_t clients = 0, sequences = 0, readLeases = 0, writeLeases = 0;
  uint64_t bytesPut = 0, bytesGot = 0;
  uint64_t snapshots = 0, entries = 0, checkpoints = 0;
  // Cold tier (RocksDB).
  uint64_t spilled = 0, promoted = 0, coldRecords = 0, coldBytes = 0, corruptDropped = 0;
  uint64_t coldQuarantined = 0;  // damaged cold tiers moved aside, replaced by an empty one
  uint64_t spillErrors = 0, evictedUnspilled = 0, coldEvicted = 0;
  // The cold tier's table and blob files on disk: coldBytes (what --disk-bytes bounds) plus
  // records dropped but not yet compacted away, obsolete files not yet deleted, and snapshots'
  // own records and manifests.
  uint64_t coldDiskBytes = 0;
  // Snapshots on disk (they survive a restart), and those dropped because their manifest or a
  // record they need failed its checks or was gone.
  uint64_t coldSnapshots = 0, coldSnapshotsDropped = 0;
  // GPU pools (blocksTotal and blocksUsed above count the host pool).
  uint64_t gpuBlocksTotal = 0, gpuBlocksUsed = 0, gpuDemoted = 0, gpuPromoted = 0;
  // Cluster (zero outside one): members known and live (self included), keys this node is home
  // for, held and not yet published; lookups that asked the cluster, blocks and bytes fetched
  // from other nodes, blocks served to them; fetch errors by kind; peers refused.
  uint64_t clusterMembers = 0, clusterMembersUp = 0, directoryEntries = 0, heldKeys = 0,
           publishBacklog = 0, directoryRehomed = 0;
  uint64_t remoteLookups = 0, remoteLookupsCut = 0, remoteHitBlocks = 0, remoteHitBytes = 0,
           servedBlocks = 0;
  // Peer messages remote lookups sent (directory queries and pins), the most for one lookup, and
  // the directory queries this node answered as a home.
  uint64_t lookupPeerMessages = 0, lookupPeerMessagesMax = 0, directoryQueries = 0;
  // Distinct keys this node is the first directory home of: summed over the members, the keys
  // the cluster holds (each counted once, however many copies).
  uint64_t directoryKeys = 0;
  uint64_t fetchTimeouts = 0, fetchUnavailable = 0, fetchTransfer = 0, fetchChecksum = 0,
           fetchFull = 0, peerAuthFailures = 0;
  uint64_t peerRttMicros = 0;  // median heartbeat round trip to the live peers
  // This client's tenant (its Unix user): host-pool bytes its blocks take, and the most they may
  // (kvtierd --tenant-quota; 0: no quota).
  uint64_t tenantBytesUsed = 0, tenantQuotaBytes = 0;
  // Fast lanes (ClientOptions::lane): lookups served over them, lanes attached now, attaches
  // refused.
  uint64_t laneLookups = 0, lanesAttached = 0, lanesRefused = 0, lanePuts = 0;
  // The host pool's pages: "hugetlb-2M" or "4k" (kvtierd --huge-pages), and why 4 KiB pages
  // ("only 12 huge pages free, 512 needed", "huge pages off"; empty on huge pages).
  std::string poolPages, poolPagesReason;
  std::vector<SpaceStats> spaces;
  std::string toJson() const;
};

struct CommitInfo {
  uint64_t length = 0;
  uint32_t sealedBlocks = 0;
};

class Client;
class Space;
struct Connection;  // the SDK's own (client/client_internal.h)
struct LeaseState;

// Blocks held under a read lease (get or lookup). The views stay valid, and the blocks pinned,
// until release() or destruction. Movable, not copyable.
class ReadHandle {
 public:
  ReadHandle(ReadHandle&&) noexcept;
  ReadHandle& operator=(ReadHandle&&) noexcept;
  ~ReadHandle();

  // lookup: tokens matched. get: end - begin of the request.
  uint64_t matchedTokens() const { return end_ - begin_; }
  uint64_t begin() const { return begin_; }
  uint64_t end() const { return end_; }
  // Position of block(0)'s first slot.
  uint64_t firstPosition() const { return firstPosition_; }
  // The blocks covering [firstPosition(), end()). In a lookup's answer with a state whose
  // position is inside a block, the last of them is the state's first chunk, which holds the KV
  // of the positions past the last whole block in its first slots.
  size_t blockCount() const {
    return views_.empty() ? 0 : views_.size() - stateBlocks_ + (partialTokens() > 0 ? 1 : 0);
  }
  // The bytes of block i, in place in the shared pool (or in a private copy for inline clients).
  std::span<const uint8_t> block(size_t i) const { return views_[i]; }
  const std::vector<BlockRef>& refs() const { return refs_; }
  bool inlineData() const { return !inline_.empty(); }

  // --- A lookup in a namespace whose layout has a state (Layout::stateBytes;
  // docs/cache-shapes.md): matchedTokens() is the deepest position whose state is cached with the
  // blocks before it, all of it held by this handle's lease (a miss: 0 tokens, no state).
  bool hasState() const { return stateBlocks_ > 0; }
  // Positions past the last whole block (matchedTokens() % blockTokens): their KV is in the first
  // slots of block(blockCount() - 1), the state's first chunk (copyTo reads them as any others).
  uint32_t partialTokens() const;
  // Copies the state (layout().stateBytes bytes) into `out`, checking every chunk of it against
  // the checksum its writer took, in the same pass: CHECKSUM_MISMATCH if one differs (a fault
  // changed the bytes in the pool; nothing of it may reach an engine), NOT_FOUND without a state,
  // INVALID_ARGUMENT for another size.
  Status copyState(void* out, size_t bytes) const;
  // The state's chunks: the answer's last stateBlockCount() blocks, after blockCount() -
  // (partialTokens() > 0) whole blocks. For engines that read them in place (copyState checks).
  size_t stateBlockCount() const { return stateBlocks_; }
  std::span<const uint8_t> stateBlock(size_t j) const {
    return views_[views_.size() - stateBlocks_ + j];
  }

  // Copies positions [from, to) into `out`, packed. INVALID_ARGUMENT if the range is outside
  // [begin(), end()) or `bytes` is not (to - from) * layout.tokenKvBytes(). Each block it reads
  // from is checked against the checksum its writer took, in the same pass as the copy (a block
  // the writer did not seal, a partial last block, has none): CHECKSUM_MISMATCH when one differs
  // — a fault changed the bytes in the pool; use nothing of `out` — and the daemon is told
  // (it checks the block itself, drops it from its index and counts it: Stats::blocksCorrupt),
  // so that the next lookup misses from that block on. The message names the first bad position.
  Status copyTo(uint64_t from, uint64_t to, void* out, size_t bytes) const;
  // For engines that read block(i) in place: checks its bytes against its writer's checksum (a
  // read of the block), as copyTo does and with the same outcome on a mismatch. OK for a block
  // without one.
  Status verify(size_t i) const;
  // Block i's checksum from its writer, 0 when it has none.
  uint64_t sum(size_t i) const { return i < sums_.size() ? sums_[i] : 0; }
  // The daemon is told block i's bytes differed from its checksum (copyTo and verify do it).
  void reportCorrupt(size_t i) const;
  // Unpins the blocks; the views become invalid. Idempotent. Does not wait for the daemon: the
  // release reaches it before any later call of this client (in the default own-thread mode the
  // client's loop thread sends it right after, so other processes see the pins go shortly after).
  void release();

 private:
  friend class Space;
  ReadHandle(Space* space, std::unique_ptr<LeaseState> lease) noexcept;
  Space* space_ = nullptr;
  std::unique_ptr<LeaseState> lease_;
  uint64_t begin_ = 0, end_ = 0, firstPosition_ = 0;
  std::vector<BlockRef> refs_;
  std::vector<std::span<const uint8_t>> views_;
  std::vector<std::vector<uint8_t>> inline_;
  uint32_t stateBlocks_ = 0;    // the last refs_ and views_ are a state's chunks
  std::vector<uint64_t> sums_;  // each block's writer's checksum (0: none)
};

// Blocks held under a write lease (put). Nothing is visible to anyone until commit(); dropping
// the handle without commit aborts. Movable, not copyable.
class WriteHandle {
 public:
  WriteHandle(WriteHandle&&) noexcept;
  WriteHandle& operator=(WriteHandle&&) noexcept;
  ~WriteHandle();

  uint64_t begin() const { return begin_; }
  uint64_t end() const { return end_; }
  uint64_t firstPosition() const { return firstPosition_; }
  size_t blockCount() const { return refs_.size(); }
  // Writable bytes of granted block i, in the shared pool; empty for inline clients. Slots of
  // block(0) before begin() hold the sequence's existing bytes: do not write them. The commit
  // takes the checksum of a block handed out here from its bytes as they are then, writes
  // through the view after a write() included (write() fuses the checksum of blocks never handed
  // out into its copy).
  std::span<uint8_t> block(size_t i) const;
  // Block i was written whole through block(i), and `checksum` is kernels::blockChecksum of the
  // bytes it now holds, taken in the copy that wrote them (kernels::FusedXxh3): the commit carries
  // it instead of reading the block back. Write the block no more before the commit; a checksum
  // that is not the bytes' gets the block dropped as damaged where it is next checked, never
  // served. INVALID_ARGUMENT past the grant.
  Status blockWritten(size_t i, uint64_t checksum);

  // Writes positions [from, to) ⊆ [begin(), end()) from a packed buffer (into the mapped blocks,
  // or inline). INVALID_ARGUMENT on a bad range or size.
  Status write(uint64_t from, uint64_t to, const void* kv, size_t bytes);
  // Makes [begin(), upTo) visible; kEndPosition: all granted positions.
  Result<CommitInfo> commit(uint64_t upTo = kEndPosition);
  Status abort();

  // --- A state's lease (Space::beginPutState): blockCount() chunks of the namespace's block size.
  // Writes `size` bytes at `offset` of the chunks, which hold the state's payload (Layout::
  // statePayloadBytes: [a block holding the KV of the positions past the last whole block, when
  // there are any][the state]) and then zeros to the end of the last chunk. INVALID_ARGUMENT
  // past the chunks or for a lease of positions. The commit takes each chunk's checksum from its
  // bytes.
  Status writeState(uint64_t offset, const void* data, size_t size);
  bool stateLease() const { return stateBytes_ > 0; }

 private:
  friend class Space;
  WriteHandle(Space* space, std::unique_ptr<LeaseState> lease) noexcept;
  Space* space_ = nullptr;
  std::unique_ptr<LeaseState> lease_;
  uint64_t begin_ = 0, end_ = 0, firstPosition_ = 0;
  std::vector<BlockRef> refs_;
  std::vector<std::span<uint8_t>> views_;
  uint64_t stateBytes_ = 0;  // a state's lease: bytes of its chunks
};

struct PutOptions {
  // Detached sequences outlive the session that wrote them (prefill -> decode hand-off).
  bool detached = false;
  // Sliding-window attention: keep the most recent `window` tokens (0: all). Applies when the
  // call creates the sequence.
  uint64_t window = 0;
  // Chunked attention: keep the current chunk of `chunk` tokens (0: all).
  uint64_t chunk = 0;
  // The client's own 16-byte keys for the blocks this put completes (engines that already hash
  // blocks, trace replay). Empty: the daemon derives chained SHA-256 keys from the tokens.
  std::vector<Key128> keys = {};
};

// What a lookup does about blocks past the local prefix when the daemon is in a cluster.
enum class RemoteMode : uint8_t {
  kFetch,     // ask the cluster and fetch the longest continuation before answering (default)
  kLocal,     // this node only
  kPrefetch,  // answer with the local hit now; the rest is fetched in the background
};

struct LookupOptions {
  // Also make the matched prefix the whole of this sequence, in the same round trip. (In a
  // namespace with states, such a lookup matches the cached blocks alone, without a state.)
  std::string bindSeq = {};
  bool detached = false;
  uint64_t window = 0, chunk = 0;  // as PutOptions, for a bound sequence it creates
  RemoteMode remote = RemoteMode::kFetch;
};

// One step of `Client::drain`.
struct DrainStep {
  uint64_t snapshotsMoved = 0, blocksCopied = 0;  // by this step
  uint64_t snapshotsLeft = 0, blocksLeft = 0;     // after it
  uint64_t failures = 0;                          // not handed over this time (retried next)
};

// What `Space::copyRange`, `copyKeys` and `copyPrompt` did.
struct BlockTransfer {
  uint64_t blocks = 0;   // blocks asked for
  uint64_t held = 0;     // of them, how many the destination node now holds
  uint64_t dropped = 0;  // with move: freed from this node's memory (a block another sequence
                         // still holds stays; its disk records are deleted all the same)
};

struct ClusterMember {
  std::string nodeId, address;  // address: HOST:PORT of its peer listener
  bool up = false, self = false;
};

struct SnapshotInfo {
  uint64_t id = 0;  // names the snapshot within its namespace; another process may use it
  uint64_t from = 0, to = 0;
  std::vector<uint64_t> checkpoints;  // recurrent state positions: restore only there
  // The cluster node that holds it (empty outside a cluster): another node's process restores
  // it with restore(seq, id, target, options, node) — "node:id" names it cluster-wide.
  std::string node;
};

// A blob (recurrent state checkpoint, position-independent entry) under a read lease.
class BlobHandle {
 public:
  BlobHandle(BlobHandle&&) noexcept;
  BlobHandle& operator=(BlobHandle&&) noexcept;
  ~BlobHandle();
  // The blob's bytes, in place in the shared pool (or a private copy for inline clients); valid
  // until release() or destruction.
  std::span<const uint8_t> data() const { return data_; }
  void release();

 private:
  friend class Space;
  BlobHandle() = default;
  std::unique_ptr<LeaseState> lease_;
  std::span<const uint8_t> data_;
  std::vector<uint8_t> inline_;
};

struct OpenOptions {
  // A CUDA device with a GPU pool on the daemon (Client::devices()), or -1 for the host pool.
  int device = -1;
};

// An engine's paged KV cache, in vLLM's layout: for each layer a K and a V tensor of shape
// [numBlocks, blockTokens, kvHeads, headDim] with the space's dtype, contiguous — in the device
// memory of the space's GPU, or in host memory for a space on the host pool.
struct PagedKvCache {
  std::vector<void*> keys, values;  // one per layer
  uint32_t blockTokens = 16;        // the engine's block size (need not be the layout's)
};

// SHA-256 of `bytes` truncated to 16 bytes: a content key for position-independent entries.
Key128 contentKey(const void* bytes, size_t size);

// One put of a batch (Space::putMany): what put() takes.
struct PutItem {
  std::string_view seq;
  uint64_t begin = 0;
  std::span<const uint32_t> tokens;
  const void* kv = nullptr;  // packed, tokens.size() * layout().tokenKvBytes() bytes
  size_t bytes = 0;
  PutOptions options = {};
};

// One namespace (tenant, layout) on the daemon. Borrowed from its Client.
class Space {
 public:
  ~Space();
  Space(const Space&) = delete;
  Space& operator=(const Space&) = delete;

  const Layout& layout() const { return layout_; }
  uint64_t fingerprint() const { return fingerprint_; }

  // Stores the KV of `tokens` at positions [begin, begin + n) of seq in one round trip for the
  // lease and one for the commit; `kv` is packed, n * layout().tokenKvBytes() bytes.
  Result<CommitInfo> put(std::string_view seq, uint64_t begin, std::span<const uint32_t> tokens,
                         const void* kv, size_t bytes, const PutOptions& options = {});
  // Several puts in one call, for a writer that hands over KV continuously (a prefill batch, an
  // engine offloading finished requests): each item is stored as put() would, in order, but the
  // daemon grants the next item's blocks while this item's bytes are copied, so the control calls
  // hide behind the copies (over the fast lane; an item naming the same sequence as the one before
  // waits for its commit). One result per item; an item's failure does not stop the others. An
  // UNAVAILABLE result may or may not have been stored (the connection ended under it).
  std::vector<Result<CommitInfo>> putMany(std::span<const PutItem> items);
  // The two steps of put, for engines that write the blocks themselves (e.g. with kernels/).
  Result<WriteHandle> beginPut(std::string_view seq, uint64_t begin,
                               std::span<const uint32_t> tokens, const PutOptions& options = {});

  // Read lease on positions [begin, end) of seq (end = kEndPosition: its length).
  Result<ReadHandle> get(std::string_view seq, uint64_t begin = 0, uint64_t end = kEndPosition);
  // Longest cached prefix of `tokens` (whole blocks only).
  Result<ReadHandle> lookup(std::span<const uint32_t> tokens, const LookupOptions& options = {});
  // Longest cached prefix of a chain of client keys, one per block.
  Result<ReadHandle> lookupKeys(std::span<const Key128> keys, const LookupOptions& options = {});

  Status copyPrefix(std::string_view src, std::string_view dst, uint64_t len,
                    bool detached = false);
  Status remove(std::string_view seq, uint64_t begin, uint64_t end = kEndPosition);
  Status truncate(std::string_view seq, uint64_t len);
  Result<bool> canResume(std::string_view seq, uint64_t pos);
  // Length of seq; nullopt if it does not exist.
  Result<std::optional<uint64_t>> length(std::string_view seq);
  // --- Paged copies. On a space opened on a device (a Client built with CUDA), by kernels on the
  // engine's `stream` (a cudaStream_t; nullptr: the default stream), returning once they finished
  // on it; on a host space, by the CPU on the calling thread (`stream` unused; NOT_SUPPORTED for a
  // client that does not map the pool). `blockTable[i]` names the engine block holding positions
  // [i * cache.blockTokens, ...).
  // Stores positions [begin, begin + n) of seq from the engine's paged cache: a write lease, one
  // scatter kernel into the granted pool blocks, then the commit.
  Result<CommitInfo> putPaged(std::string_view seq, uint64_t begin,
                              std::span<const uint32_t> tokens, const PagedKvCache& cache,
                              std::span<const int32_t> blockTable, void* stream = nullptr,
                              const PutOptions& options = {});
  // The steps of putPaged, for engines that batch: scatters positions [from, to) of a write
  // handle's grant from the engine's paged cache (commit the handle afterwards).
  Status scatterTo(const WriteHandle& handle, uint64_t from, uint64_t to, const PagedKvCache& cache,
                   std::span<const int32_t> blockTable, void* stream = nullptr);
  // Gathers positions [from, to) of a read handle (get or lookup) into the engine's paged cache.
  Status gatherTo(const ReadHandle& handle, uint64_t from, uint64_t to, const PagedKvCache& cache,
                  std::span<const int32_t> blockTable, void* stream = nullptr);
  int device() const { return device_; }

  // Inline copies of sealed blocks named by references (STALE_REFERENCE once a block is reused).
  Result<std::vector<std::vector<uint8_t>>> readRefs(std::span<const BlockRef> refs);
  // Tells the daemon these sealed blocks' bytes differ from their writer's checksums; it checks
  // each itself and drops those that do from its index (ReadHandle::copyTo and verify call it).
  // Returns how many it dropped (0 also when the daemon could not be told).
  size_t reportCorrupt(std::span<const BlockRef> refs);

  // --- Snapshots (docs/cache-shapes.md). Immutable, share blocks, outlive their sequence.
  // Empty when from >= length.
  Result<SnapshotInfo> snapshot(std::string_view seq, uint64_t from = 0);
  // seq becomes its own [0, snap.from) plus the snapshot's [from, target). `node`, when not
  // empty and not this daemon's, is the cluster node holding the snapshot (SnapshotInfo::node):
  // its manifest and blocks are pulled here first (each block checked), and nothing changes if
  // that fails (UNAVAILABLE: the node is gone or did not answer in time; NOT_FOUND: it has no
  // such snapshot).
  Status restore(std::string_view seq, uint64_t snapshotId, uint64_t target,
                 const PutOptions& options = {}, std::string_view node = {});
  // Copies snapshot `snapshotId` of cluster node `node` to this daemon as a snapshot of its own
  // (a new id, this node's). With `move`, the source drops its copy once this daemon holds it.
  Result<SnapshotInfo> copySnapshot(std::string_view node, uint64_t snapshotId, bool move = false);

  // --- Blocks to another cluster node (Mooncake's copy and move). Node `node` fetches the
  // blocks from this daemon (UCX, each checked), keeps them as cached blocks of its own — a
  // lookup there hits them — and publishes them. With `move`, once `node` holds them all, and
  // only then, this daemon lets go of its copies (memory and disk); if it holds fewer, the call
  // fails with UNAVAILABLE and nothing here changed.
  //
  // The sealed blocks of `seq` over [begin, end). A move also removes [begin, end) from `seq`
  // (as remove() does), and refuses (INVALID_ARGUMENT, nothing changed) a range reaching into
  // the sequence's unfilled last block, which cannot leave this node; a copy skips that block.
  Result<BlockTransfer> copyRange(std::string_view node, std::string_view seq, uint64_t begin = 0,
                                  uint64_t end = kEndPosition, bool move = false);
  // The blocks `keys` (client-supplied keys, as lookupKeys takes), from memory or disk.
  Result<BlockTransfer> copyKeys(std::string_view node, std::span<const Key128> keys,
                                 bool move = false);
  // The full blocks of the prompt `tokens` (the chain a lookup of it walks).
  Result<BlockTransfer> copyPrompt(std::string_view node, std::span<const uint32_t> tokens,
                                   bool move = false);
  // Back to `target` <= length without a snapshot (window and checkpoint rules apply).
  Status rewind(std::string_view seq, uint64_t target);
  Result<SnapshotInfo> mergeSnapshots(uint64_t a, uint64_t b);
  Result<std::pair<SnapshotInfo, SnapshotInfo>> splitSnapshot(uint64_t id, uint64_t at);
  Result<SnapshotInfo> snapshotInfo(uint64_t id);
  Status dropSnapshot(uint64_t id);

  // --- Recurrent state checkpoints: a fixed-size blob at position `pos` (<= length) of seq.
  Status putCheckpoint(std::string_view seq, uint64_t pos, const void* state, size_t bytes);
  Result<BlobHandle> getCheckpoint(std::string_view seq, uint64_t pos);
  Result<std::vector<uint64_t>> checkpoints(std::string_view seq);

  // --- Prefix states (a layout with stateBytes; docs/cache-shapes.md). The state an engine's
  // model had after tokens[0, n) — at any n: a block boundary while it evaluates a prompt, or the
  // end of a turn — so that a lookup of any prompt beginning with those tokens, by any process,
  // can restore there (with the blocks of [0, n / blockTokens * blockTokens), which must be put
  // under the same tokens). `state`: layout().stateBytes bytes. When n is not a multiple of
  // blockTokens, `partialKv` holds the KV of the n % blockTokens positions past the last whole
  // block, packed as put() takes it (n % blockTokens * layout().tokenKvBytes() bytes). A state
  // cached already is kept. INVALID_ARGUMENT for a layout without a state, wrong sizes, no or too
  // many tokens; FULL when the pool has no room.
  Status putState(std::span<const uint32_t> tokens, const void* state, size_t bytes,
                  const void* partialKv = nullptr, size_t partialBytes = 0);
  // The same, for blocks keyed by the client (lookupKeys): the state after the blocks `keys`.
  Status putStateKeys(std::span<const Key128> keys, const void* state, size_t bytes);
  // The steps of putState, for engines that write the chunks themselves: a lease on the state's
  // chunks (WriteHandle::writeState, block(i)), then commit().
  Result<WriteHandle> beginPutState(std::span<const uint32_t> tokens);
  Result<WriteHandle> beginPutStateKeys(std::span<const Key128> keys);

  // --- Position-independent entries (encoder outputs, image embeddings), keyed by content.
  Status putEntry(const Key128& key, const void* bytes, size_t size);
  Result<BlobHandle> getEntry(const Key128& key);

 private:
  friend class Client;
  friend class ReadHandle;
  friend class WriteHandle;
  struct Impl;
  template <typename MakeRequest>
  Result<BlobHandle> readBlob(MakeRequest&& makeRequest);
  template <typename MakeRequest>
  Status putBlob(MakeRequest&& makeRequest, const void* bytes, size_t size);
  Status writeBlob(const void* bytes, size_t size, std::unique_ptr<LeaseState> lease,
                   const BlockRef& block);
  Space(Client& client, std::unique_ptr<Impl> impl, Layout layout, uint64_t fingerprint,
        int device);
  Status pagedCopy(Connection& on, bool scatter, const std::vector<BlockRef>& refs,
                   uint64_t firstPosition, uint64_t from, uint64_t to, const PagedKvCache& cache,
                   std::span<const int32_t> blockTable, void* stream);
  Result<ReadHandle> lookupImpl(std::span<const uint32_t> tokens, std::span<const Key128> keys,
                                const LookupOptions& options);
  Result<WriteHandle> beginPutStateImpl(std::span<const uint32_t> tokens,
                                        std::span<const Key128> keys);
  // Before each call: when the client connected again since the space was opened (its daemon
  // went away and came back), opens it again on the new connection.
  Status refresh();
  Client& client_;
  std::unique_ptr<Impl> impl_;
  Layout layout_;
  uint64_t fingerprint_;
  int device_ = -1;
};

class Client {
 public:
  // Connects, says hello (protocol version, peer credentials checked by the daemon) and starts the
  // client's event-loop thread. UNAVAILABLE if no daemon answers on the socket.
  static Result<std::unique_ptr<Client>> connect(const ClientOptions& options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Opens (or joins) the namespace for `layout`; maps the pool on first use (and, on a device,
  // that GPU's pool through CUDA IPC: UNAVAILABLE if it cannot be mapped).
  Result<std::unique_ptr<Space>> open(const Layout& layout, const OpenOptions& options = {});
  // CUDA devices with a GPU pool on the daemon (empty without).
  const std::vector<int>& devices() const;
  Result<Stats> stats();
  // The cluster as the daemon sees it: its node id and the members (empty outside a cluster).
  Result<std::pair<std::string, std::vector<ClusterMember>>> cluster();
  // One step of draining the daemon's node before maintenance: moves up to `maxSnapshots` of its
  // snapshots to the other live members (each dropped here only once another node
  // holds it) and copies up to `maxBlocks` of its blocks in memory to them. Call until both
  // lefts are 0; safe to stop at any point and call again. UNAVAILABLE with no other member.
  Result<DrainStep> drain(uint32_t maxSnapshots, uint32_t maxBlocks);
  const std::string& daemonVersion() const;
  // True when bytes move through the mapped pool, false when they travel inline.
  bool mapped() const;
  // Times this client connected again after its daemon went away (ClientOptions::reconnect).
  uint64_t reconnects() const;

  struct Impl;  // opaque: the event-loop thread and the daemon connection

 private:
  friend class Space;
  friend class ReadHandle;
  friend class WriteHandle;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier
