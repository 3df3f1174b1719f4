# kvtier client <-> daemon protocol (Unix socket, Cap'n Proto RPC).
#
# The KV bytes do not travel in these messages on the default path: the daemon answers with block
# references into pool extents that the client has mapped, and the client reads and writes them in
# place. The `inline` variants carry the bytes in the messages for clients that cannot map the pool.
#
# Every count and size below is bounded by the daemon (see daemon/limits.h); a call that exceeds a
# bound fails with invalidArgument and changes nothing.

@0xa3069de4643f569f;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("kvtier::rpc");

const protocolVersion :UInt32 = 1;
# Sent in Daemon.hello. A daemon refuses a client whose major protocol differs (protocolMismatch).

enum ErrorCode {
  # Stable, numbered error codes. The same numbers are kvtier::ErrorCode in C++ (store/include/kvtier/error.h).
  # They travel in the description of a kj::Exception as "kvtier error <n> (<NAME>): <message>".
  ok @0;
  invalidArgument @1;   # a bad position, size, name, layout or key; never retry unchanged
  notFound @2;          # unknown sequence
  full @3;              # the pool is full and nothing is evictable; retry later (OVERLOADED)
  notSupported @4;      # the call is valid but not offered for this namespace (UNIMPLEMENTED)
  staleReference @5;    # a block reference whose generation no longer matches: the block was reused
  checksumMismatch @6;  # stored bytes failed their checksum; treated as a miss
  permissionDenied @7;  # the peer is not allowed to use this daemon
  unavailable @8;       # a tier or peer is not reachable; retry (DISCONNECTED)
  conflict @9;          # another write lease holds the sequence, or it changed under this lease
  protocolMismatch @10; # client and daemon speak different protocol versions
  internal @11;         # a bug in kvtier
  released @12;         # the lease was already committed, aborted or released
}

enum DType {
  float16 @0;
  bfloat16 @1;
  float32 @2;
  float8E4M3 @3;
  float8E5M2 @4;
  int8 @5;
}

enum RopeStyle {
  none @0;
  neox @1;   # pairs (d, d + rotaryDims/2)
  gptj @2;   # pairs (2d, 2d + 1)
}

struct RopeScheme {
  # Declaring the rotary scheme enables middle removal (later tokens' K is re-rotated).
  style @0 :RopeStyle;
  rotaryDims @1 :UInt32;
  base @2 :Float64 = 10000;
}

struct SeqOptions {
  # How a sequence is kept; applies when the call creates it.
  detached @0 :Bool;     # outlives the session (prefill -> decode hand-off)
  window @1 :UInt64;     # sliding window: keep the most recent `window` tokens (0: none)
  chunk @2 :UInt64;      # chunked attention: keep the current chunk (0: none)
}

enum RemoteMode {
  # What a lookup does about blocks past its local prefix when the daemon is in a cluster.
  fetch @0;      # ask the cluster, fetch the longest continuation, then answer
  localOnly @1;  # this node only
  prefetch @2;   # answer with the local hit now, fetch the rest in the background
}

struct ClusterMember {
  nodeId @0 :Text;
  address @1 :Text;      # HOST:PORT of its peer listener
  up @2 :Bool;           # connected and answering (always true for self)
  self @3 :Bool;
}

struct DrainProgress {
  snapshotsMoved @0 :UInt64;   # by this step
  blocksCopied @1 :UInt64;     # by this step
  snapshotsLeft @2 :UInt64;    # after this step
  blocksLeft @3 :UInt64;       # in memory and not yet copied to another node
  failures @4 :UInt64;         # items this step could not hand over (retried by the next)
}

struct SnapshotInfo {
  id @0 :UInt64;         # pass it to another process: it names the snapshot within the namespace
  from @1 :UInt64;
  to @2 :UInt64;
  checkpoints @3 :List(UInt64);  # recurrent state positions inside [from, to]
  node @4 :Text;         # the cluster node that holds it (empty outside a cluster): restore
                         # it on another node with restore(..., node)
}

struct Layout {
  # What a block holds. Bytes inside a block are layer-major:
  # [layer][K|V][token][kvHead][headDim], so one layer's K and V for the block are contiguous.
  modelId @0 :Text;
  numLayers @1 :UInt32;
  numKvHeads @2 :UInt32;
  headDim @3 :UInt32;
  dtype @4 :DType;
  blockTokens @5 :UInt32;   # 16..512
  rope @6 :RopeScheme;
  stateBytes @7 :UInt64;    # a recurrent state captured at a prefix's end (0: none); with
                            # numLayers, numKvHeads and headDim 0 the layout has no KV at all
}

struct Extent {
  # One exportable allocation of the pool. Host extents are POSIX shared-memory segments (4 KiB
  # pages) or anonymous hugetlb memory (2 MiB pages); GPU extents are whole cudaMalloc allocations
  # exported with CUDA IPC.
  id @0 :UInt32;
  shmName @1 :Text;         # host extents; empty: not offered to this client (another user's
                            # process, docs/security.md): it moves bytes inline
  bytes @2 :UInt64;
  device @3 :Int32 = -1;    # the CUDA device of a GPU extent; -1 for host extents
  ipcHandle @4 :Data;       # a GPU extent's cudaIpcMemHandle_t (64 bytes)
  byDescriptor @5 :Bool;    # a host extent offered without a name (anonymous hugetlb memory): its
                            # file descriptor comes over the daemon's socket (transport/pool_fds.h)
}

struct BlockRef {
  extent @0 :UInt32;
  offset @1 :UInt64;
  bytes @2 :UInt32;
  generation @3 :UInt64;    # changes every time the block is reused; a stale reference is refused
}

struct SpaceStats {
  fingerprint @0 :UInt64;
  blockBytes @1 :UInt32;
  blocksTotal @2 :UInt64;
  blocksUsed @3 :UInt64;
  sequences @4 :UInt64;
}

struct Stats {
  blocksTotal @0 :UInt64;     # blocks the pool holds now plus those its uncarved bytes can still make
  blocksUsed @1 :UInt64;      # held by a sequence, a lease or the prefix index
  blocksPinned @2 :UInt64;    # pinned by a read or write lease: never evicted
  blocksCached @3 :UInt64;    # sealed, indexed, held by nothing: evictable
  bytesTotal @4 :UInt64;
  bytesUsed @5 :UInt64;
  hits @6 :UInt64;            # blocks found by lookup
  misses @7 :UInt64;          # lookups that stopped short (one per lookup that did not match every block)
  evictions @8 :UInt64;
  clients @9 :UInt64;         # connected sessions
  sequences @10 :UInt64;
  readLeases @11 :UInt64;
  writeLeases @12 :UInt64;
  bytesPut @13 :UInt64;       # committed block bytes
  bytesGot @14 :UInt64;       # bytes handed out under read leases
  spaces @15 :List(SpaceStats);
  snapshots @16 :UInt64;
  entries @17 :UInt64;        # position-independent entries cached
  checkpoints @18 :UInt64;    # recurrent state checkpoints held by sequences
  # Cold tier (RocksDB).
  spilled @19 :UInt64;          # blocks written to disk
  promoted @20 :UInt64;         # blocks read back into the pool (cold hits)
  coldRecords @21 :UInt64;      # blocks held on disk
  coldBytes @22 :UInt64;
  corruptDropped @23 :UInt64;   # records that failed their checksum or header check: missed, deleted
  spillErrors @24 :UInt64;      # spill batches that failed (full or failing disk)
  evictedUnspilled @25 :UInt64; # blocks dropped while spilling was paused
  coldEvicted @26 :UInt64;      # records dropped for the cold tier's capacity bound
  coldSnapshots @27 :UInt64;    # snapshot manifests held on disk (snapshots that survive a restart)
  coldSnapshotsDropped @28 :UInt64;  # snapshots dropped from disk: their manifest or a record they need failed its checks or was gone
  # GPU pools (blocksTotal and blocksUsed above count the host pool).
  gpuBlocksTotal @29 :UInt64;
  gpuBlocksUsed @30 :UInt64;
  gpuDemoted @31 :UInt64;       # blocks moved from a GPU pool to the host pool
  gpuPromoted @32 :UInt64;      # blocks moved from the host pool to a GPU pool
  coldDiskBytes @33 :UInt64;    # the cold tier's table and blob files: coldBytes, what compaction has not yet reclaimed, snapshots' own records
  # Cluster (zero when the daemon is not in one).
  clusterMembers @34 :UInt64;       # members known, self included
  clusterMembersUp @35 :UInt64;     # live members (the rendezvous set), self included
  directoryEntries @36 :UInt64;     # keys this node is home for
  publishBacklog @37 :UInt64;       # directory messages not yet sent to their homes
  remoteLookups @38 :UInt64;        # lookups that asked the cluster
  remoteHitBlocks @39 :UInt64;      # blocks fetched from other nodes
  remoteHitBytes @40 :UInt64;
  servedBlocks @41 :UInt64;         # blocks pinned for other nodes' fetches
  fetchTimeouts @42 :UInt64;        # fetch errors by kind: a peer past its deadline,
  fetchUnavailable @43 :UInt64;     #   a peer unreachable or gone,
  fetchTransfer @44 :UInt64;        #   a UCX transfer that failed,
  fetchChecksum @45 :UInt64;        #   a block that failed its checksum or key check,
  fetchFull @46 :UInt64;            #   no room locally
  peerAuthFailures @47 :UInt64;     # peers refused for a wrong token
  heldKeys @48 :UInt64;             # keys this node holds, as published
  directoryRehomed @49 :UInt64;     # keys re-sent to a new home after membership changes
  peerRttMicros @50 :UInt64;        # median round trip of the last heartbeats to live peers
  tenantBytesUsed @51 :UInt64;      # host-pool bytes of the asking tenant's blocks
  tenantQuotaBytes @52 :UInt64;     # the most one tenant may take (kvtierd --tenant-quota); 0: none
  laneLookups @53 :UInt64;          # lookups served over sessions' fast lanes
  lanesAttached @54 :UInt64;        # sessions whose fast lane is attached now
  lanesRefused @55 :UInt64;         # lane attaches refused (bad token, another process, twice)
  lanePuts @56 :UInt64;             # write leases granted over sessions' fast lanes
  remoteLookupsCut @57 :UInt64;     # lookups answered at their deadline while their fetch went on
  poolPages @58 :Text;              # the host pool's pages: "hugetlb-2M" or "4k" (kvtierd --huge-pages)
  poolPagesReason @59 :Text;        # why 4 KiB pages ("only 12 huge pages free, 512 needed", "huge
                                    # pages off"); empty on huge pages
  lookupPeerMessages @60 :UInt64;   # peer messages remote lookups sent: directory queries and pins
  lookupPeerMessagesMax @61 :UInt64;  # the most one remote lookup sent
  directoryQueries @62 :UInt64;     # who-holds queries this node answered as a directory home
  directoryKeys @63 :UInt64;        # distinct keys this node is the first directory home of
  blocksCorrupt @64 :UInt64;        # blocks in memory a reader found differing from their writer's
                                    # checksum (checked again here): out of the index, freed
  coldQuarantined @65 :UInt64;      # damaged cold tiers moved aside (kvtierd went on with an empty one)
  evictionPolicy @66 :Text;         # kvtierd --eviction: "adaptive" (the default), "lru", "arc", "2q", "s3fifo" or "sieve"
  evictionFollowing @67 :Text;      # the policy that orders the blocks now: the adaptive policy's
                                    # current expert ("2q" until it has measured), else the policy itself
  evictionSwitches @68 :UInt64;     # times the adaptive policy changed the expert it follows
}

interface Daemon {
  hello @0 (protocolVersion :UInt32, clientName :Text) -> (session :Session, protocolVersion :UInt32, daemonVersion :Text, devices :List(Int32), devicePciBusIds :List(Text), laneToken :Data);
  # `devices`: the CUDA devices (the daemon's ordinals) that have a GPU pool, empty without one;
  # `devicePciBusIds`: their PCI bus ids, so that a client that sees the devices under other
  # ordinals (CUDA_VISIBLE_DEVICES) opens the right one.
  # The daemon checks the peer's Unix credentials (SO_PEERCRED) and assigns its tenant.
  # `laneToken`: attaches the session's fast lane, a second connection from the same process for
  # the hottest calls (transport/lane_codec.h).
}

interface Session {
  # Dropping the session (or the connection) removes every sequence it opened that is not detached.
  open @0 (layout :Layout, device :Int32 = -1) -> (space :Space, extents :List(Extent), fingerprint :UInt64, blockBytes :UInt32, lane :UInt32);
  # `lane`: the number the session's fast lane knows the space by.
  # With a device (a CUDA ordinal with a GPU pool), the space's puts allocate in that GPU's pool
  # and its lookups bring host-pool blocks of the prefix there first; the extents then include
  # that GPU's (and only that GPU's) with their IPC handles. -1: the host pool only.
  stats @1 () -> (stats :Stats);
  cluster @2 () -> (nodeId :Text, members :List(ClusterMember));
  # The cluster as this daemon sees it (empty when it is not in one).
  drain @3 (maxSnapshots :UInt32, maxBlocks :UInt32) -> (progress :DrainProgress);
  # One step of draining this node before maintenance: moves up to maxSnapshots of its snapshots
  # to the other live members (each dropped here only once another node holds it) and copies up
  # to maxBlocks of the blocks it holds in memory to them. Call again until nothing is left; safe
  # to stop at any point and start again.
}

interface Space {
  # One namespace: (tenant salt, layout). Positions are token indices; END (2^64-1) means "the end".

  put @0 (seq :Text, begin :UInt64, tokens :List(UInt32), keys :List(Data), options :SeqOptions)
      -> (lease :WriteLease, blocks :List(BlockRef), firstPosition :UInt64);
  # Grants blocks for positions [begin, begin + len(tokens)); blocks[0] starts at firstPosition
  # (begin rounded down to a block). Positions of blocks[0] before begin already hold the sequence's
  # bytes. Nothing is visible until commit. `keys`, when given, are the client's own 16-byte keys,
  # one for each block this put completes, in order.

  get @1 (seq :Text, begin :UInt64, end :UInt64 = 0xffffffffffffffff, inline :Bool)
      -> (lease :ReadLease, blocks :List(BlockRef), firstPosition :UInt64, end :UInt64, data :List(Data),
          sums :List(UInt64));
  # `sums`: each block's checksum from its writer (xxh3-64 of the block), for the reader to check
  # its copy against; 0 where there is none (a partial block's, a GPU block's).

  lookup @2 (tokens :List(UInt32), keys :List(Data), bindSeq :Text, options :SeqOptions, inline :Bool,
             remote :RemoteMode)
      -> (matchedTokens :UInt64, lease :ReadLease, blocks :List(BlockRef), data :List(Data),
          stateBlocks :UInt32, sums :List(UInt64));
  # Longest prefix made of sealed full blocks. With bindSeq, that prefix also becomes the sequence.
  # `sums`: each block's checksum from its writer, as get's.
  # In a namespace whose layout has a state (and without bindSeq): the deepest prefix whose state
  # is cached too; the last `stateBlocks` of `blocks` are that state's chunks
  # (docs/cache-shapes.md), the blocks before them cover the whole blocks of [0, matchedTokens).

  copyPrefix @3 (src :Text, dst :Text, len :UInt64, options :SeqOptions) -> ();
  remove @4 (seq :Text, begin :UInt64, end :UInt64 = 0xffffffffffffffff) -> ();
  truncate @5 (seq :Text, len :UInt64) -> ();
  canResume @6 (seq :Text, pos :UInt64) -> (ok :Bool);
  length @7 (seq :Text) -> (length :UInt64, exists :Bool);
  read @8 (refs :List(BlockRef)) -> (data :List(Data));
  # Inline read of sealed blocks by reference; a reference whose generation is stale is refused.

  # Snapshots: immutable, block-sharing copies of [from, length) that outlive their sequence.
  snapshot @9 (seq :Text, from :UInt64) -> (snapshot :SnapshotInfo);
  restore @10 (seq :Text, snapshot :UInt64, target :UInt64, options :SeqOptions, node :Text) -> ();
  # snapshot = 0: rewind seq to target without a snapshot. `node`, when not empty and not this
  # daemon's node id, names the cluster node that holds the snapshot: its manifest and blocks are
  # brought here (UCX, checked like every remote block) before the restore.
  mergeSnapshots @11 (a :UInt64, b :UInt64) -> (snapshot :SnapshotInfo);
  splitSnapshot @12 (snapshot :UInt64, at :UInt64) -> (left :SnapshotInfo, right :SnapshotInfo);
  snapshotInfo @13 (snapshot :UInt64) -> (snapshot :SnapshotInfo);
  dropSnapshot @14 (snapshot :UInt64) -> ();
  copySnapshot @20 (node :Text, snapshot :UInt64, move :Bool) -> (snapshot :SnapshotInfo);
  # Copies snapshot `snapshot` of cluster node `node` to this daemon, as a new snapshot of its
  # own (the answer). With move, the source drops its copy once this daemon holds the new one.
  pushBlocks @21 (node :Text, seq :Text, begin :UInt64, end :UInt64, tokens :List(UInt32),
                  keys :List(Data), move :Bool) -> (blocks :UInt32, held :UInt32, dropped :UInt32);
  # Copies blocks of this daemon to cluster node `node`, which fetches them over UCX, checks
  # them and keeps them as cached blocks of its own (a lookup there hits them). Which blocks:
  # the sealed blocks of sequence `seq` over [begin, end) when `seq` is set, else the blocks
  # `keys`, else the full blocks of the prompt `tokens`. `blocks`: how many were asked for;
  # `held`: how many `node` now holds. With move, and only once `node` holds them all, this
  # daemon removes [begin, end) from `seq` (a range move) and drops its cached copies, in memory
  # and on disk (`dropped`: those freed from memory; a block another sequence still holds stays).

  # Recurrent state checkpoints: a blob at a position of a sequence.
  putCheckpoint @15 (seq :Text, pos :UInt64, bytes :UInt64) -> (lease :WriteLease, block :BlockRef);
  getCheckpoint @16 (seq :Text, pos :UInt64, inline :Bool)
      -> (lease :ReadLease, block :BlockRef, bytes :UInt64, data :Data);
  checkpoints @17 (seq :Text) -> (positions :List(UInt64));

  # Prefix states (layouts with stateBytes): the chunks of the state after tokens[0, n) (or after
  # the client-keyed blocks `keys`), to fill with the KV of the n % blockTokens tokens past the
  # last block boundary (a block, when not 0) and then the state, and commit (WriteLease.commit,
  # one checksum per chunk). Found by content: any lookup of a prompt beginning with those tokens.
  putState @22 (tokens :List(UInt32), keys :List(Data))
      -> (lease :WriteLease, blocks :List(BlockRef), position :UInt64);

  reportCorrupt @23 (refs :List(BlockRef)) -> (dropped :UInt32);
  # Blocks whose bytes a reader found differing from their checksum (get's or lookup's sums). The
  # daemon checks each itself; those that differ leave the index and are freed once nothing holds
  # them (counted: Stats.blocksCorrupt). At most 4096 references.

  # Position-independent entries (encoder outputs, image embeddings): content-keyed blobs.
  putEntry @18 (key :Data, bytes :UInt64) -> (lease :WriteLease, block :BlockRef);
  getEntry @19 (key :Data, inline :Bool)
      -> (lease :ReadLease, block :BlockRef, bytes :UInt64, data :Data);
}

interface WriteLease {
  write @0 (block :UInt32, firstSlot :UInt32, slots :UInt32, data :Data) -> ();
  # Inline write of token slots [firstSlot, firstSlot + slots) of granted block `block`; `data` is
  # laid out [layer][K|V][slot][kvHead][headDim] over those slots.
  commit @1 (upTo :UInt64 = 0xffffffffffffffff, sums :List(UInt64))
      -> (length :UInt64, sealedBlocks :UInt32);
  # Makes positions [begin, upTo) visible (upTo = END: all granted). Full blocks are sealed and keyed.
  # `sums`: the writer's xxh3-64 of each block the put fills to its end, in order (taken as it
  # copied them in), kept as the checksum every move verifies the block against; empty: the daemon
  # takes them from the bytes at commit. Any other count is INVALID_ARGUMENT (the lease stays open).
  abort @2 () -> ();
  writeBlob @3 (offset :UInt64, data :Data) -> ();
  # Inline write into a checkpoint or entry lease's blob.
}

interface ReadLease {
  release @0 () -> ();
}
