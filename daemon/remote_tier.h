// RemoteTier: other nodes, as the client server sees them (daemon/cluster/ implements it).
//
// Thread-safety: none; the daemon's event loop owns it.
#pragma once

#include <kj/async.h>

#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "store/engine.h"

namespace kvtier {

// What a lookup does about blocks past its local prefix (the client's choice, LookupOptions).
enum class RemoteMode : uint8_t {
  kFetch,     // ask the cluster and fetch the longest continuation before answering
  kLocal,     // this node only
  kPrefetch,  // answer with the local hit now; fetch the rest in the background
};

struct RemoteMember {
  std::string nodeId, address;
  bool up = false, self = false;
};

struct RemoteStats {
  std::string nodeId;
  uint64_t members = 0, membersUp = 0;    // self included
  uint64_t directoryEntries = 0;          // entries this node is a home of
  uint64_t directoryKeys = 0;             // distinct keys it is the first home of
  uint64_t heldKeys = 0;                  // keys this node holds and has published
  uint64_t publishBacklog = 0;            // publish messages not yet sent
  uint64_t published = 0, withdrawn = 0;  // keys sent to homes
  uint64_t rehomed = 0;                   // keys re-sent because their home changed
  uint64_t remoteLookups = 0;             // lookups that asked the cluster
  uint64_t remoteLookupsCut = 0;          // of them, answered at their deadline, fetch unfinished
  // Peer messages those lookups sent (directory queries and pins), in all and at most for one.
  uint64_t lookupPeerMessages = 0, lookupPeerMessagesMax = 0;
  uint64_t directoryQueries = 0;  // who-holds queries this node answered as a home
  uint64_t remoteHitBlocks = 0, remoteHitBytes = 0;
  uint64_t servedBlocks = 0, servedBytes = 0;  // blocks this node pinned for other nodes
  uint64_t pinsExpired = 0;                    // pins whose lease ran out before release
  uint64_t authFailures = 0;
  uint64_t peerRttMicros = 0;  // median heartbeat round trip to live peers
  // Fetch errors by kind: a peer that did not answer in time, a peer unreachable or gone, a
  // transfer that failed, a block that failed its checksum or key check, no room locally.
  uint64_t fetchTimeouts = 0, fetchUnavailable = 0, fetchTransfer = 0, fetchChecksum = 0,
           fetchFull = 0;
};

struct DrainProgress {
  uint64_t snapshotsMoved = 0, blocksCopied = 0;  // by this step
  uint64_t snapshotsLeft = 0, blocksLeft = 0;     // after it
  uint64_t failures = 0;                          // items not handed over (the next step retries)
};

class RemoteTier {
 public:
  virtual ~RemoteTier() = default;
  // Whether any other node could hold blocks (a cluster with live members).
  virtual bool active() const = 0;
  // Fetches the longest run of `chain` (a prompt's block keys from its first block on) from
  // position `from` (the first block past the local prefix of `space`) that other nodes hold,
  // sealing each block into the local index once verified. Resolves when done or after one peer
  // deadline, whichever is first; never rejects (what could not be fetched is simply not there).
  // The fetch goes on if the returned promise is dropped or resolved early.
  virtual kj::Promise<void> fetch(SpaceId space, std::vector<Key128> chain, size_t from) = 0;
  // In a namespace with prefix states: fetches the deepest state other nodes hold for a lookup of
  // `tokens` (or the client's `keys`; `chain`: their block keys) deeper than this node can
  // restore, with the blocks this node holds before it (Engine::stateCandidates): one directory
  // query, then a fetch of its chunks as of a chain. Resolves as fetch() does; never rejects.
  virtual kj::Promise<void> fetchState(SpaceId space, std::vector<uint32_t> tokens,
                                       std::vector<Key128> keys, std::vector<Key128> chain) = 0;
  virtual RemoteStats stats() const = 0;
  // This node's id in the cluster.
  virtual const std::string& nodeId() const = 0;
  // Brings snapshot `id` held by cluster node `node` here: its manifest and blocks are pulled
  // (each block checked by xxh3) into a new snapshot of `space` with a fresh local id, kept in
  // memory only (queueSnapshotWrite persists it). Resolves to the local id; rejects, with
  // nothing changed, with UNAVAILABLE (the node is not a live member, or did not answer in
  // time), NOT_FOUND (it has no such snapshot), FULL, or CHECKSUM_MISMATCH.
  virtual kj::Promise<SnapshotId> pullSnapshot(SpaceId space, std::string node, SnapshotId id) = 0;
  // One bounded step of draining this node: up to `maxSnapshots` snapshots moved to the other
  // live members and up to `maxBlocks` blocks in memory copied to them. UNAVAILABLE when no
  // other member is live.
  virtual kj::Promise<DrainProgress> drainStep(uint32_t maxSnapshots, uint32_t maxBlocks) = 0;
  // Asks `node` to drop its snapshot `id` of `space` (a move's last step).
  virtual kj::Promise<void> dropRemoteSnapshot(SpaceId space, std::string node, SnapshotId id) = 0;
  // Has `node` fetch blocks `keys` of `space` from this node (UCX, checked like every remote
  // block) and keep them as cached blocks of its own. Resolves to how many of them `node` holds
  // afterwards; rejects with UNAVAILABLE when it is not a live member or does not answer in time.
  virtual kj::Promise<size_t> pushBlocks(SpaceId space, std::string node,
                                         std::vector<Key128> keys) = 0;
  virtual std::vector<RemoteMember> members() const = 0;
};

}  // namespace kvtier
