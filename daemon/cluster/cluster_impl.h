// ClusterService's implementation, shared by the files that implement it, one concern each:
//   cluster.cc         start and leave, stats, the public ClusterService
//   peer_service.cc    the Peer service other daemons call (pin, who-holds, publish, snapshots,
//                      take), its gate and the accept loop
//   links.cc           links to the other members: connections, heartbeats, membership, UCX
//                      endpoints
//   publish.cc         telling homes which keys this node holds
//   fetch.cc           remote hits: asking homes, pinning, UCX gets, checking checksums
//   snapshot_moves.cc  snapshots pulled from and dropped on other nodes
//   drain.cc           copies and moves of blocks to other nodes, and draining this one
// Private to daemon/cluster/: the constants and helpers below are in an unnamed namespace, each
// file its own copy.
#pragma once

#include "daemon/cluster/cluster.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <xxhash.h>

#include <capnp/rpc-twoparty.h>
#include <kj/debug.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <random>
#include <unordered_set>

#include "daemon/cluster/directory.h"
#include "daemon/cluster/etcd_membership.h"
#include "daemon/log.h"
#include "daemon/snapshot_codec.h"
#include "daemon/worker_thread.h"
#include "schemas/peer.capnp.h"
#include "transport/buffered_stream.h"
#include "transport/cross_thread.h"
#include "transport/rpc_codec.h"
#include "transport/socket_stream.h"
#include "transport/ucx.h"

namespace kvtier {
namespace {

namespace peer = rpc::peer;
using cluster::EtcdMembership;
using cluster::EtcdMembershipOptions;
using cluster::MemberRecord;

// Bounds on what a peer may send (schemas/peer.capnp).
// Keys in one who-holds or pin call: a 64k-token prompt in 16-token blocks.
constexpr size_t kMaxChainKeys = 4096;
// Fetches running at once. A lookup answers after one peer deadline while its fetch goes on, so
// a client looping lookups against a silent peer could otherwise start fetches faster than they
// end, each holding fresh blocks; past the bound a lookup asks nobody (fetch_errors kind "full").
constexpr size_t kMaxFetchesInFlight = 64;
// Anchors one block is filed under (a block at chain position d: d / 64 + 1 for an anchor): a
// 4-million-token prompt's deepest anchor.
constexpr size_t kMaxAnchorsPerBlock = 4096;
// An anchor whose home answered this many who-holds queries under it is hot (a popular prefix's:
// measured with the scale harness, docs/cluster.md "Scale"); a home announces its newest hot
// anchors, at most kMaxHotAnchors, and counts queries for at most kMaxCountedAnchors anchors.
constexpr uint32_t kHotQueries = 4;
// Homes of each entry (the ring's next members from its anchor's point): an asker picks the least
// loaded it knows of, so no home answers far more than its share (the scale harness: busiest/mean
// 3.6 with any replica at 1,024 members, 1.55 with the least loaded of three).
constexpr size_t kAnchorReplicas = 3;
constexpr size_t kMaxHotAnchors = 256;
constexpr size_t kMaxCountedAnchors = 65536;
// Pins one remote lookup sends at most: with its directory query, four messages. A chain is
// rarely spread over more holders (a fetched or drained block keeps its chain; a node's fetched
// replicas go first when it needs room, so its own later blocks can outlive their head).
constexpr size_t kMaxLookupPins = 3;
// Peer messages one remote lookup sends at most: directory queries and pins together (a second
// query, about a later segment, leaves room for two pins).
constexpr uint32_t kMaxLookupMessages = 4;
// Anchors a holder may name for a block it serves without the fetcher knowing the chain (a
// drain): a 16k-block chain's deepest anchor. More (or repeated ones): filed under the key itself.
constexpr size_t kMaxHolderAnchors = 256;
// Blocks pinned by one call: 1024 blocks of 2 MiB are 2 GiB, more than one fetch needs at once.
constexpr size_t kMaxPinBlocks = 1024;
// A run of blocks on one holder is pinned and read in pieces of this many blocks (16 MiB of
// 2 MiB blocks), so that hashing on both sides overlaps the transfer: measured on 64 blocks of
// 2 MiB over tcp, 0.83 GB/s in one piece.
constexpr size_t kPinPieceBlocks = 8;
// Keys in one publish call (both lists): batches are cut at kPublishBatch.
constexpr size_t kMaxPublishKeys = 65536;
constexpr size_t kPublishBatch = 4096;
// Extents a peer may describe in transportInfo.
constexpr size_t kMaxRemoteExtents = 4096;
// Open peer connections served at once; more are closed at accept.
constexpr size_t kMaxPeerConnections = 256;
// Nodes named in one who-holds answer (a bit mask per key).
constexpr size_t kMaxAnswerNodes = 64;
// Messages on the peer port: the largest is a publish of kMaxPublishKeys (~1.3 MiB); allow 16 MiB.
constexpr uint64_t kPeerTraversalWords = (uint64_t{16} << 20) / sizeof(capnp::word);
// Blocks whose checksum mismatch was logged (each is logged once; forgotten whole when full).
constexpr size_t kMaxLoggedCorrupt = 4096;
// A batch of gets gets kTransferBase plus its bytes at this floor (50 MB/s) to complete.
constexpr kj::Duration kTransferBase = 1000 * kj::MILLISECONDS;
constexpr uint64_t kTransferFloorBytesPerMs = 50'000;
// Heartbeat round trips remembered per link, for the peer RTT in stats.
constexpr size_t kRttSamples = 16;
// Reconnect backoff of a link.
constexpr kj::Duration kMinBackoff = 100 * kj::MILLISECONDS;
constexpr kj::Duration kMaxBackoff = 5 * kj::SECONDS;

inline capnp::ReaderOptions peerReaderOptions() {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = kPeerTraversalWords;
  o.nestingLimit = 16;
  return o;
}

Error invalid(std::string what) { return makeError(ErrorCode::kInvalidArgument, what); }

// The host of HOST:PORT, without the brackets of an IPv6 address ("[::1]:7" -> "::1").
inline std::string hostOf(const std::string& hostPort) {
  std::string host = hostPort.substr(0, hostPort.rfind(':'));
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  return host;
}

// A holder's UCX grant as it came in a pin answer (any other size: none, which it refuses).
inline UcxGrant grantFrom(capnp::Data::Reader in) {
  UcxGrant grant{};
  if (in.size() == sizeof grant) std::memcpy(grant.data(), in.begin(), sizeof grant);
  return grant;
}

inline Salt saltFrom(capnp::Data::Reader in) {
  Salt s{};
  if (in.size() != s.size()) throwRpcError(invalid("a salt has 16 bytes"));
  std::memcpy(s.data(), in.begin(), s.size());
  return s;
}

inline std::vector<Key128> unpackKeys(capnp::Data::Reader in, size_t max) {
  if (in.size() % 16 != 0) throwRpcError(invalid("packed keys are 16 bytes each"));
  const size_t n = in.size() / 16;
  if (n > max) {
    throwRpcError(makeError(ErrorCode::kInvalidArgument, n, " keys exceed ", max));
  }
  std::vector<Key128> out(n);
  for (size_t i = 0; i < n; ++i) std::memcpy(out[i].bytes.data(), in.begin() + 16 * i, 16);
  return out;
}

inline bool validNodeId(std::string_view id) {
  return !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '-' || c == '_' || c == '.';
  });
}

inline std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

// Packs keys into a Data field, 16 bytes each.
inline capnp::Data::Builder packKeys(capnp::Data::Builder out, const std::vector<Key128>& keys) {
  for (size_t i = 0; i < keys.size(); ++i)
    std::memcpy(out.begin() + 16 * i, keys[i].bytes.data(), 16);
  return out;
}

// Names a namespace on a request by its layout and tenant salt (pin, pinSnapshot, take, ...).
template <typename Request>
void setNamespace(Request& req, const SpaceInfo& info) {
  layoutToRpc(info.layout, req.initLayout());
  req.setSalt(capnp::Data::Reader(info.salt.data(), 16));
}

// A promise that fails with UNAVAILABLE ("peer timeout") unless `p` settles by `timeout`.
template <typename T>
kj::Promise<T> withDeadline(kj::Timer& timer, kj::Duration timeout, kj::Promise<T> p) {
  return timer.timeoutAfter(timeout, kj::mv(p));
}

}  // namespace

// The implementation.

class ClusterService::Impl final : public IndexObserver, private kj::TaskSet::ErrorHandler {
 public:
  struct Link {
    std::string address;
    std::string nodeId;  // learned at authenticate (or known from etcd)
    bool up = false;
    bool removed = false;
    // The client side of a peer connection, with the peer port's bounds.
    struct Rpc {
      explicit Rpc(kj::AsyncIoStream& stream)
          : network(stream, capnp::rpc::twoparty::Side::CLIENT, peerReaderOptions()),
            system(capnp::makeRpcClient(network)) {}
      capnp::Capability::Client bootstrap() {
        capnp::word scratch[4];
        memset(&scratch, 0, sizeof(scratch));
        capnp::MallocMessageBuilder message(scratch);
        auto vat = message.getRoot<capnp::rpc::twoparty::VatId>();
        vat.setSide(capnp::rpc::twoparty::Side::SERVER);
        return system.bootstrap(vat);
      }
      capnp::TwoPartyVatNetwork network;
      capnp::RpcSystem<capnp::rpc::twoparty::VatId> system;
    };
    kj::Own<kj::AsyncIoStream> stream;
    kj::Own<Rpc> rpc;
    kj::Maybe<peer::Peer::Client> peer;
    std::shared_ptr<UcxEndpoint> ucx;  // shared with a connection being set up
    struct Region {
      uint32_t index;
      uint64_t address, bytes;
    };
    std::unordered_map<uint32_t, Region> regions;  // the holder's extent id -> its region
    kj::Maybe<kj::ForkedPromise<void>> ucxSetup;
    // Changes with every setup and every linkDown: a setup that ends after a newer one began (or
    // after the link went down) leaves the link's endpoint and regions alone.
    uint64_t transportEpoch = 0;
    kj::Promise<void> task = nullptr;
    kj::Duration backoff = kMinBackoff;
    bool publishing = false;
    // Who-holds queries the peer has answered as a directory home (its last heartbeat answer),
    // plus those this node sent it since: the load an asker compares among an anchor's homes.
    uint64_t load = 0;
    uint64_t queriesSeen = 0;  // its total in the last heartbeat answer
    // Round trips of the last heartbeats (microseconds), oldest overwritten first.
    std::array<double, kRttSamples> rtts{};
    size_t rttCount = 0;
  };

  Impl(Engine& engine, HostPool& pool, ColdService* cold, TierService* tiers,
       kj::AsyncIoContext& io, ClusterOptions options)
      : engine_(engine),
        pool_(pool),
        cold_(cold),
        tiers_(tiers),
        io_(io),
        timer_(io.provider->getTimer()),
        options_(std::move(options)),
        hasher_("kvtier:xxh3"),
        tasks_(*this) {
    members_ = {options_.nodeId};
    ring_ = HashRing(members_);
    engine_.setIndexObserver(this);
  }

  ~Impl() noexcept override {
    engine_.setIndexObserver(nullptr);
    for (auto& [address, link] : links_) link->task = nullptr;
  }

  Status start();
  kj::Promise<void> leave();
  // The places of held blocks across a graceful restart (ClusterOptions::placesFile).
  void savePlaces() const;
  std::unordered_map<DirKey, std::vector<Key128>, DirKeyHash> loadPlaces() const;
  kj::Promise<void> fetch(SpaceId space, std::vector<Key128> chain, size_t from);
  kj::Promise<void> fetchState(SpaceId space, std::vector<uint32_t> tokens,
                               std::vector<Key128> keys, std::vector<Key128> chain);
  RemoteStats stats() const;
  std::vector<RemoteMember> memberList() const;
  bool active() const { return members_.size() > 1; }

  void blockIndexed(SpaceId space, const Key128& key, std::span<const Key128> chain) override {
    std::vector<Key128> under = anchorsFiledUnder(chain);
    if (under.empty() && placeHint_)
      under = *placeHint_;  // a fetched block: as its holder files it
    held_.hold(dirKey(space, key), std::move(under), ring_);
    schedulePublish();
  }
  void blockUnindexed(SpaceId space, const Key128& key) override {
    const DirKey k = dirKey(space, key);
    if (cold_ && cold_->directory().contains(k.fingerprint, k.salt, k.key)) return;  // on disk
    held_.drop(k, ring_);
    schedulePublish();
  }

  // Served to peers (the RPC objects below).
  class PeerImpl;
  class PeerGateImpl;
  class PinLeaseImpl;
  struct Connection;

  Engine& engine_;
  HostPool& pool_;
  ColdService* cold_;
  TierService* tiers_;
  kj::AsyncIoContext& io_;
  kj::Timer& timer_;
  ClusterOptions options_;
  std::string advertise_;
  OwnerId owner_ = ~OwnerId{0} - 1;  // the engine owner of peers' pins (they bind no sequence)

  std::unique_ptr<UcxWorker> ucx_;
  uint16_t ucxPort_ = 0;                             // UCX's listener
  std::vector<std::unique_ptr<UcxRegion>> regions_;  // the host pool's extents, by extent id
  kj::Own<kj::ConnectionReceiver> listener_;
  size_t connections_ = 0;

  std::vector<std::string> members_;                    // live node ids, self included, sorted
  HashRing ring_;                                       // of members_: the directory's homes
  std::map<std::string, std::shared_ptr<Link>> links_;  // by address
  kj::Own<EtcdMembership> etcd_;
  std::vector<MemberRecord> etcdMembers_;

  HomeDirectory home_;
  // stats(): the directory's distinct keys, as of a directory version and membership.
  mutable size_t keysCounted_ = 0;
  mutable std::pair<uint64_t, std::vector<std::string>> keysCountedAt_{~uint64_t{0}, {}};
  HeldKeys held_{kAnchorReplicas};
  // Who-holds queries answered per anchor, until it is hot; the hot anchors this node is home for
  // (oldest first); those other homes announced in their heartbeat answers, by home.
  std::unordered_map<DirKey, uint32_t, DirKeyHash> anchorQueries_;
  std::vector<DirKey> hotAnchors_;
  std::map<std::string, std::unordered_map<DirKey, std::vector<std::string>, DirKeyHash>> hotKnown_;
  // While a fetched block is sealed: the anchors it is filed under.
  const std::vector<Key128>* placeHint_ = nullptr;
  // Sets placeHint_ for one sealing, whatever happens.
  struct PlaceHint {
    PlaceHint(const std::vector<Key128>*& slot, const std::vector<Key128>* place) : slot(slot) {
      slot = place;
    }
    ~PlaceHint() { slot = nullptr; }
    const std::vector<Key128>*& slot;
  };
  bool publishScheduled_ = false;
  size_t publishInFlight_ = 0;  // keys sent to homes and not yet acknowledged

  std::unordered_set<uint64_t> loggedCorrupt_;  // blocks (a part of their key) logged corrupt
  WorkerThread hasher_;

  RemoteStats stats_;
  kj::TaskSet tasks_;

  DirKey dirKey(SpaceId space, const Key128& key) const {
    const SpaceInfo& info = engine_.space(space);
    return DirKey{info.fingerprint, info.salt, key};
  }
  // The error a call naming a node that is not a live member gets.
  static Error notLive(const std::string& node) {
    return makeError(ErrorCode::kUnavailable, "node ", node,
                     " is not a live member of the cluster");
  }
  std::shared_ptr<Link> linkTo(const std::string& node) const {
    for (const auto& [address, link] : links_) {
      if (link->up && link->nodeId == node) return link;
    }
    return nullptr;
  }

  // Membership.
  void addLink(const std::string& address, const std::string& nodeId);
  kj::Promise<void> runLink(Link& link);
  kj::Promise<void> connectLink(Link& link);
  kj::Promise<void> heartbeat(Link& link);
  void linkDown(Link& link, const kj::Exception& why);
  void updateMembers();
  void setEtcdMembers(const std::vector<MemberRecord>& records);

  // Directory.
  void schedulePublish();
  void flushPublish();

  // Fetch.
  // Asks the directory about `chain` from position `from` on and fetches what other nodes hold.
  // The blocks of a fetch's chain this node holds (its local prefix, any held past the first
  // missing block, and those each pin brings), pinned until the fetch ends: the blocks a fetch
  // allocates must not evict the very blocks the lookup's answer joins them to.
  struct LocalHold {
    Engine& engine;
    OwnerId owner;
    std::vector<LeaseId> leases;
    LocalHold(Engine& e, OwnerId o) : engine(e), owner(o) {}
    LocalHold(const LocalHold&) = delete;
    LocalHold& operator=(const LocalHold&) = delete;
    ~LocalHold() { release(); }
    void add(SpaceId space, std::span<const Key128> chain);
    void release();
  };
  kj::Promise<void> fetchChain(SpaceId space, std::vector<Key128> chain, size_t from,
                               std::shared_ptr<LocalHold> held);
  // A pin a lookup sends: chain positions [begin, end) on `link`'s node.
  struct PinPlan {
    std::shared_ptr<Link> link;
    size_t begin, end;
  };
  // A hot segment skipped by a lookup: chain positions [begin, end) and its anchor's holders.
  struct HotSegment {
    size_t begin, end;
    std::vector<std::string> holders;
  };
  // What a lookup knows when it plans its pins: holders[j] hold chain position asked[j] (the
  // keys of [keyedFrom, keyedEnd), one segment's, then each later anchor), the hot segments it
  // skipped, and local[i]: this node holds position i already.
  struct PinInputs {
    size_t from = 0, keyedFrom = 0, keyedEnd = 0;
    std::vector<size_t> asked;
    std::vector<std::vector<std::string>> holders;
    std::vector<HotSegment> hot;
    std::vector<bool> local;
    std::vector<std::string> tried;  // holders whose pin came back short: not asked again
    bool requeried = false;          // a second home was asked, about a later segment
    std::shared_ptr<LocalHold> held;
  };
  // Asks the home of the segment holding plan->keyedFrom who holds the rest of that segment, key
  // by key, and each later anchor of `chain` (this node's own directory when it is that home):
  // fills plan->asked, keyedEnd and holders; the promise gives the messages sent (0 or 1).
  // nullptr: the home is not reachable.
  // Asks the home of `anchor` (this node's own directory when it is that home) who holds each
  // of `keys` filed under it: holders[j] for keys[j] (the answer's hot flag handled as askHome
  // does). Nothing when the home is not reachable.
  struct HomeAnswer {
    std::vector<std::vector<std::string>> holders;
    uint32_t messages = 0;
  };
  kj::Maybe<kj::Promise<HomeAnswer>> queryHome(const DirKey& anchor,
                                               const std::vector<Key128>& keys);
  kj::Maybe<kj::Promise<uint32_t>> askHome(SpaceId space, const std::vector<Key128>& chain,
                                           std::shared_ptr<PinInputs> plan);
  // At most maxPins pins: the holder reaching furthest from `at`, then the one reaching furthest
  // from where that one stops, and so on.
  std::vector<PinPlan> planPins(size_t chainSize, const PinInputs& in, size_t at,
                                size_t maxPins) const;
  // Sends the pins planned from chain position `at` (at most pinsLeft), fetches what they pinned,
  // and, where a holder came back short, plans again from the gap with the pins left. `messages`:
  // the lookup's peer messages so far, counted when it ends.
  kj::Promise<void> pinAndFetch(SpaceId space, std::shared_ptr<std::vector<Key128>> chain,
                                std::shared_ptr<PinInputs> plan, size_t at, size_t pinsLeft,
                                uint32_t messages);
  // A remote lookup's peer messages (who-holds queries and pins), for stats.
  void countLookupMessages(uint32_t messages);
  // Directory load. A who-holds query under `anchor` (this node is its home): true if the anchor
  // is hot (this query made it so, or it was).
  bool noteQuery(const DirKey& anchor);
  // The holders of a hot anchor its home announced (nullptr: not hot as far as this node knows).
  const std::vector<std::string>* hotHolders(const DirKey& anchor) const;
  // Which of an anchor's homes a lookup asks: this node if it is one, else the least loaded.
  std::string directoryHomeFor(const DirKey& anchor);
  // `replica`: the holder keeps its copy (a remote hit); false when the blocks are handed over
  // for good (a drain, a move). With `awaitRelease`, resolves only once the holder has released
  // its pin (a move then frees the holder's blocks at once).
  // `places`: where each key is filed (a lookup knows its chain); empty: as the holder files it
  // (a drain's or a move's blocks), checked. `hold`: each block is added to it as it is sealed
  // (before the run's other pieces or the lookup's other pins allocate theirs).
  kj::Promise<void> fetchRun(SpaceId space, std::shared_ptr<Link> link, std::vector<Key128> keys,
                             bool replica = true, bool awaitRelease = false,
                             std::vector<std::vector<Key128>> places = {},
                             std::shared_ptr<LocalHold> hold = nullptr);
  kj::Promise<void> ensureTransport(std::shared_ptr<Link> link);
  void countFailure(const kj::Exception& e);
  // How long a batch of gets may take: a base plus its bytes at a floor bandwidth, at most the
  // peer timeout. A stuck transfer (seen under paced traffic over tcp, docs/cluster.md "Not
  // yet") then costs a small batch 1 s, not the whole timeout. (A 200 ms base cut off transfers
  // on endpoints still being wired up.)
  kj::Duration transferDeadline(const std::vector<UcxGet>& gets) const {
    uint64_t bytes = 0;
    for (const auto& g : gets) bytes += g.bytes;
    const kj::Duration d = kTransferBase + bytes / kTransferFloorBytesPerMs * kj::MILLISECONDS;
    return std::min(d, options_.peerTimeout);
  }
  // Releases a holder's pin, in the background (it runs out by itself anyway). The promise
  // resolves once the holder has answered (or did not in time); it need not be kept.
  kj::Promise<void> releasePin(kj::Maybe<peer::PinLease::Client>& lease) {
    KJ_IF_MAYBE (l, lease) {
      auto released =
          withDeadline(timer_, options_.peerTimeout, l->releaseRequest().send().ignoreResult())
              .catch_([](kj::Exception&&) {})
              .fork();
      tasks_.add(released.addBranch());
      lease = nullptr;
      return released.addBranch();
    }
    return kj::READY_NOW;
  }

  // Serving.
  kj::Promise<void> acceptLoop();
  void servePeer(kj::Own<kj::AsyncIoStream> stream);
  // A peer connection as the daemon reads it: watched for reading only (transport/socket_stream.h:
  // neither end is woken each time the other reads), buffered, Nagle off.
  kj::Own<kj::AsyncIoStream> peerStream(kj::Own<kj::AsyncIoStream> stream) {
    const int one = 1;
    KJ_IF_MAYBE (e, kj::runCatchingExceptions(
                        [&] { stream->setsockopt(IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); })) {
      (void)e;  // not TCP (a test's socket pair): nothing to turn off
    }
    return kj::heap<BufferedIoStream>(readWatchedSocket(io_.unixEventPort, kj::mv(stream)));
  }
  // xxh3 of each block's first `bytes` bytes, on the hasher thread (a fetcher's verification).
  kj::Promise<std::vector<uint64_t>> checksumsOf(std::vector<BlockLocation> blocks);
  // The checksums served with `blocks`: each block's own, taken by its writer (`stored`); only a
  // block that has none (a partial block of a snapshot) gets one taken from its bytes now.
  kj::Promise<std::vector<uint64_t>> servedChecksums(std::vector<BlockLocation> blocks,
                                                     std::vector<std::optional<uint64_t>> stored);
  // A block that failed its checksum is a miss, counted by the caller; it is logged once.
  void logCorrupt(const char* event, const Key128& key, const std::string& node);
  // Snapshots across nodes.
  kj::Promise<SnapshotId> pullSnapshot(SpaceId space, std::string node, SnapshotId id);
  kj::Promise<void> dropRemoteSnapshot(SpaceId space, std::string node, SnapshotId id);
  kj::Promise<size_t> pushBlocks(SpaceId space, std::string node, std::vector<Key128> keys);
  // Drains.
  // The first key of the chain a held block belongs to, as far as the directory's places tell
  // (the block's own key when its place is unknown).
  Key128 chainRoot(const DirKey& dk) const {
    const std::vector<Key128>* place = held_.placeOf(dk);
    if (!place || place->empty()) return dk.key;
    if (place->size() > 1 || place->front() == dk.key) return place->front();
    const std::vector<Key128>* anchor =
        held_.placeOf(DirKey{dk.fingerprint, dk.salt, place->front()});
    return anchor && !anchor->empty() ? anchor->front() : place->front();
  }
  kj::Promise<DrainProgress> drainStep(uint32_t maxSnapshots, uint32_t maxBlocks);
  // Fetches `keys` of `space` from `link`'s node straight (no directory): resolves with how many
  // of them this node holds afterwards.
  kj::Promise<size_t> fetchFrom(SpaceId space, std::shared_ptr<Link> link,
                                std::vector<Key128> keys);
  // Asks `target` to take snapshot `snapshot` (0: none) and blocks `keys` of `space` from us.
  kj::Promise<capnp::Response<peer::Peer::TakeResults>> askToTake(std::shared_ptr<Link> target,
                                                                  SpaceId space,
                                                                  SnapshotId snapshot,
                                                                  std::vector<Key128> keys);
  kj::Promise<void> dropLocalSnapshot(SpaceId space, SnapshotId id) {
    if (cold_) return cold_->dropSnapshot(space, id);
    if (auto s = engine_.dropSnapshot(space, id); !s) return toKjException(s.error());
    return kj::READY_NOW;
  }
  // Blocks this node handed to others in a drain (a drain run again skips them).
  std::unordered_set<DirKey, DirKeyHash> drained_;
  // Blocks being fetched, and the fetch that brings them: a lookup that needs one of them waits
  // for that fetch rather than reading the same bytes again.
  std::unordered_map<DirKey, std::shared_ptr<kj::ForkedPromise<void>>, DirKeyHash> fetching_;
  size_t fetchesInFlight_ = 0;  // fetch(): at most kMaxFetchesInFlight

  void taskFailed(kj::Exception&& e) override {
    logWarn("cluster_task_failed", e.getDescription().cStr());
  }
};

}  // namespace kvtier
