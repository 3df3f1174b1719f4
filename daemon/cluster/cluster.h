// ClusterService: this daemon as a member of a cluster (docs/cluster.md).
//
// - Peer control plane: Cap'n Proto RPC over TCP (schemas/peer.capnp). The listener serves a
//   PeerGate whose only call is authenticate(cluster token); every other daemon is reached
//   through a Link that connects, authenticates, pings on a heartbeat and reconnects with
//   backoff. Every call to a peer has a deadline (--peer-timeout-ms).
// - Membership: static peers (a member is up while its link is), or etcd v3 (the members
//   registered under /kvtier/<cluster>/nodes/ with a lease; daemon/cluster/etcd_membership.h).
// - Directory: rendezvous hashing gives every key a home among the live members
//   (daemon/cluster/directory.h); the keys this node indexes are published to their homes in
//   batches and withdrawn when evicted (unless the cold tier still holds them).
// - Remote hit: a lookup's chain past the local prefix is asked of the keys' homes (one round
//   trip per home), pinned on the holders under a short lease, read with UCX straight into fresh
//   local blocks, checked (xxh3 and key) and only then sealed into the local index.
//
// Thread-safety: none; everything runs on the daemon's event loop, but for the checksums, which
// run on a worker thread over pinned blocks.
#pragma once

#include <kj/async-io.h>
#include <kj/async-unix.h>

#include <memory>
#include <string>
#include <vector>

#include "daemon/cold_service.h"
#include "daemon/remote_tier.h"
#include "daemon/tier_service.h"
#include "store/engine.h"
#include "transport/host_pool.h"

namespace kvtier {

struct ClusterOptions {
  std::string nodeId;
  std::string listen;     // HOST:PORT of the peer listener (port 0: any)
  std::string advertise;  // HOST:PORT peers dial; empty: the listener's host and bound port
  std::string token;      // the cluster token every peer presents
  std::vector<std::string> peers;  // static membership
  std::string etcd;                // http://HOST:PORT: etcd membership instead
  std::string clusterName = "kvtier";
  uint32_t etcdLeaseTtlSeconds = 5;
  kj::Duration peerTimeout = 2 * kj::SECONDS;
  kj::Duration pinLease = 5 * kj::SECONDS;
  kj::Duration heartbeat = 500 * kj::MILLISECONDS;
  // How long a publish batch waits for more keys after its first; 0: it leaves on the next turn of
  // the event loop, with every key sealed in this one (a commit's blocks go together). Measured on
  // a trace replay with requests dealt round-robin over 3 nodes of 2000 blocks: 10 ms left blocks
  // unfindable long enough for the next turn of a conversation to recompute them (-1.34 pp of hit
  // rate against one LRU of 3C), 1 ms -1.02 pp, 0 -0.88 pp; puts on a member unchanged (0.99).
  kj::Duration publishDelay = 0 * kj::MILLISECONDS;
  // Test hook (KVTIER_TEST_CORRUPT_SERVED=1): this node describes every block it serves with a
  // checksum that does not match its bytes, as a block corrupted in flight would arrive.
  bool corruptServedForTest = false;
  // Where the directory's places of held blocks (the anchors each is filed under) are kept across
  // a graceful restart (written at leave, read and removed at start): blocks on disk after a
  // restart are filed where peers look for them. Empty: not kept.
  std::string placesFile;
};

// A daemon that listens off loopback needs a token of at least this many bytes.
inline constexpr size_t kMinClusterTokenBytes = 32;
// INVALID_ARGUMENT unless `token` is long enough for a listener on `listen`'s host.
Status checkClusterToken(const std::string& listen, const std::string& token);
bool isLoopbackHost(const std::string& hostPort);

class ClusterService final : public RemoteTier {
 public:
  // `engine`, `pool`, `cold` (optional), `tiers` (optional) and `io` are borrowed and must
  // outlive the service. Registers itself as the engine's index observer.
  ClusterService(Engine& engine, HostPool& pool, ColdService* cold, TierService* tiers,
                 kj::AsyncIoContext& io, ClusterOptions options);
  ~ClusterService();
  ClusterService(const ClusterService&) = delete;
  ClusterService& operator=(const ClusterService&) = delete;

  // Listens, registers the host pool with UCX, and starts membership (links or etcd). Errors:
  // INVALID_ARGUMENT (a bad address or token), UNAVAILABLE (cannot listen, UCX unusable).
  Status start();
  // Serves one peer connection (behind the gate, as the listener serves each it accepts): a
  // socket connected some other way, e.g. one end of a socket pair (the in-process fuzz harness).
  void servePeer(kj::Own<kj::AsyncIoStream> stream);
  // The address peers dial (the advertised host with the bound port); after start().
  const std::string& address() const;
  const std::string& nodeId() const override;
  // Leaves the cluster: revokes the etcd lease (bounded by the peer timeout).
  kj::Promise<void> leave();

  // RemoteTier
  bool active() const override;
  kj::Promise<void> fetch(SpaceId space, std::vector<Key128> chain, size_t from) override;
  kj::Promise<void> fetchState(SpaceId space, std::vector<uint32_t> tokens,
                               std::vector<Key128> keys, std::vector<Key128> chain) override;
  RemoteStats stats() const override;
  std::vector<RemoteMember> members() const override;
  kj::Promise<SnapshotId> pullSnapshot(SpaceId space, std::string node, SnapshotId id) override;
  kj::Promise<void> dropRemoteSnapshot(SpaceId space, std::string node, SnapshotId id) override;
  kj::Promise<size_t> pushBlocks(SpaceId space, std::string node,
                                 std::vector<Key128> keys) override;
  kj::Promise<DrainProgress> drainStep(uint32_t maxSnapshots, uint32_t maxBlocks) override;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier
