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

capnp::ReaderOptions peerReaderOptions() {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = kPeerTraversalWords;
  o.nestingLimit = 16;
  return o;
}

Error invalid(std::string what) { return makeError(ErrorCode::kInvalidArgument, what); }

Salt saltFrom(capnp::Data::Reader in) {
  Salt s{};
  if (in.size() != s.size()) throwRpcError(invalid("a salt has 16 bytes"));
  std::memcpy(s.data(), in.begin(), s.size());
  return s;
}

std::vector<Key128> unpackKeys(capnp::Data::Reader in, size_t max) {
  if (in.size() % 16 != 0) throwRpcError(invalid("packed keys are 16 bytes each"));
  const size_t n = in.size() / 16;
  if (n > max) {
    throwRpcError(makeError(ErrorCode::kInvalidArgument, n, " keys exceed ", max));
  }
  std::vector<Key128> out(n);
  for (size_t i = 0; i < n; ++i) std::memcpy(out[i].bytes.data(), in.begin() + 16 * i, 16);
  return out;
}

bool validNodeId(std::string_view id) {
  return !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '-' || c == '_' || c == '.';
  });
}

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

// Packs keys into a Data field, 16 bytes each.
capnp::Data::Builder packKeys(capnp::Data::Builder out, const std::vector<Key128>& keys) {
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

bool isLoopbackHost(const std::string& hostPort) {
  std::string host = hostPort.substr(0, hostPort.rfind(':'));
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

Status checkClusterToken(const std::string& listen, const std::string& token) {
  if (!isLoopbackHost(listen) && token.size() < kMinClusterTokenBytes) {
    return makeError(ErrorCode::kInvalidArgument, "--listen ", listen,
                     " is reachable off this host: it needs --cluster-token-file with a token of "
                     "at least ",
                     kMinClusterTokenBytes, " bytes (", token.size(), " given)");
  }
  return {};
}

// --- the implementation

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
    std::unique_ptr<UcxEndpoint> ucx;
    struct Region {
      uint32_t index;
      uint64_t address, bytes;
    };
    std::unordered_map<uint32_t, Region> regions;  // the holder's extent id -> its region
    kj::Maybe<kj::ForkedPromise<void>> ucxSetup;
    kj::Promise<void> task = nullptr;
    kj::Duration backoff = kMinBackoff;
    bool publishing = false;
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
    engine_.setIndexObserver(this);
  }

  ~Impl() noexcept override {
    engine_.setIndexObserver(nullptr);
    for (auto& [address, link] : links_) link->task = nullptr;
  }

  Status start();
  kj::Promise<void> leave();
  kj::Promise<void> fetch(SpaceId space, std::vector<Key128> keys);
  RemoteStats stats() const;
  std::vector<RemoteMember> memberList() const;
  bool active() const { return members_.size() > 1; }

  void blockIndexed(SpaceId space, const Key128& key) override {
    held_.hold(dirKey(space, key), members_);
    schedulePublish();
  }
  void blockUnindexed(SpaceId space, const Key128& key) override {
    const DirKey k = dirKey(space, key);
    if (cold_ && cold_->directory().contains(k.fingerprint, k.salt, k.key)) return;  // on disk
    held_.drop(k, members_);
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
  std::vector<std::unique_ptr<UcxRegion>> regions_;  // the host pool's extents, by extent id
  kj::Own<kj::ConnectionReceiver> listener_;
  size_t connections_ = 0;

  std::vector<std::string> members_;                    // live node ids, self included, sorted
  std::map<std::string, std::shared_ptr<Link>> links_;  // by address
  kj::Own<EtcdMembership> etcd_;
  std::vector<MemberRecord> etcdMembers_;

  HomeDirectory home_;
  HeldKeys held_;
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
  kj::Promise<void> fetchChain(SpaceId space, std::vector<Key128> keys);
  // `replica`: the holder keeps its copy (a remote hit); false when the blocks are handed over
  // for good (a drain, a move). With `awaitRelease`, resolves only once the holder has released
  // its pin (a move then frees the holder's blocks at once).
  kj::Promise<void> fetchRun(SpaceId space, std::shared_ptr<Link> link, std::vector<Key128> keys,
                             bool replica = true, bool awaitRelease = false);
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

  void taskFailed(kj::Exception&& e) override {
    logWarn("cluster_task_failed", e.getDescription().cStr());
  }
};

// A pin on blocks served to a peer: released when the peer releases or drops it, when its
// connection ends, or when its lease runs out — whichever comes first.
class ClusterService::Impl::PinLeaseImpl final : public peer::PinLease::Server {
 public:
  PinLeaseImpl(Impl& impl, LeaseId id, kj::Duration lease) : impl_(impl), id_(id) {
    if (id_ != 0) impl_.ucx_->holdBegin();
    expiry_ = impl.timer_.afterDelay(lease)
                  .then([this] {
                    if (id_ != 0) ++impl_.stats_.pinsExpired;
                    releaseNow();
                  })
                  .eagerlyEvaluate(nullptr);
  }
  ~PinLeaseImpl() noexcept(false) { releaseNow(); }
  kj::Promise<void> release(ReleaseContext) override {
    releaseNow();
    return kj::READY_NOW;
  }
  void releaseNow() {
    if (id_ == 0) return;
    impl_.ucx_->holdEnd();
    (void)impl_.engine_.releaseRead(std::exchange(id_, 0));
    if (impl_.cold_) impl_.cold_->kick();
  }

 private:
  Impl& impl_;
  LeaseId id_;
  kj::Promise<void> expiry_ = nullptr;
};

class ClusterService::Impl::PeerImpl final : public peer::Peer::Server {
 public:
  PeerImpl(Impl& impl, std::string node) : impl_(impl), node_(std::move(node)) {}

  kj::Promise<void> ping(PingContext context) override {
    context.getResults().setNodeId(impl_.options_.nodeId);
    return kj::READY_NOW;
  }

  kj::Promise<void> publish(PublishContext context) override {
    auto p = context.getParams();
    size_t total = 0;
    auto apply = [&](capnp::List<peer::KeyGroup>::Reader groups, bool add) {
      for (auto g : groups) {
        const Salt salt = saltFrom(g.getSpace().getSalt());
        const auto keys = unpackKeys(g.getKeys(), kMaxPublishKeys);
        total += keys.size();
        if (total > kMaxPublishKeys) {
          throwRpcError(makeError(ErrorCode::kInvalidArgument, "a publish of more than ",
                                  kMaxPublishKeys, " keys"));
        }
        for (const Key128& k : keys) {
          const DirKey dk{g.getSpace().getFingerprint(), salt, k};
          if (add) {
            impl_.home_.add(node_, dk);
          } else {
            impl_.home_.withdraw(node_, dk);
          }
        }
      }
    };
    // Validate both lists before changing anything.
    for (auto list : {p.getAdd(), p.getWithdraw()}) {
      for (auto g : list) {
        (void)saltFrom(g.getSpace().getSalt());
        (void)unpackKeys(g.getKeys(), kMaxPublishKeys);
      }
    }
    apply(p.getWithdraw(), false);
    apply(p.getAdd(), true);
    return kj::READY_NOW;
  }

  kj::Promise<void> whoHolds(WhoHoldsContext context) override {
    auto p = context.getParams();
    const Salt salt = saltFrom(p.getSpace().getSalt());
    const auto keys = unpackKeys(p.getKeys(), kMaxChainKeys);
    std::vector<std::string> nodes;
    std::vector<uint64_t> masks;
    for (const Key128& k : keys) {
      uint64_t mask = 0;
      for (const auto& n : impl_.home_.holders(DirKey{p.getSpace().getFingerprint(), salt, k})) {
        auto it = std::find(nodes.begin(), nodes.end(), n);
        if (it == nodes.end()) {
          if (nodes.size() >= kMaxAnswerNodes) continue;
          it = nodes.insert(nodes.end(), n);
        }
        mask |= uint64_t{1} << (it - nodes.begin());
      }
      masks.push_back(mask);
    }
    while (!masks.empty() && masks.back() == 0) masks.pop_back();
    auto out = context.getResults();
    auto n = out.initNodes(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) n.set(i, nodes[i]);
    auto h = out.initHolders(masks.size());
    for (size_t i = 0; i < masks.size(); ++i) h.set(i, masks[i]);
    return kj::READY_NOW;
  }

  kj::Promise<void> pin(PinContext context) override;

  kj::Promise<void> transportInfo(TransportInfoContext context) override {
    auto out = context.getResults();
    const auto& address = impl_.ucx_->address();
    out.setWorkerAddress(capnp::Data::Reader(address.data(), address.size()));
    out.setTransports(impl_.ucx_->transports());
    auto extents = out.initExtents(impl_.regions_.size());
    for (uint32_t i = 0; i < impl_.regions_.size(); ++i) {
      const UcxRegion& r = *impl_.regions_[i];
      extents[i].setId(i);
      extents[i].setAddress(reinterpret_cast<uint64_t>(r.base()));
      extents[i].setBytes(r.bytes());
      extents[i].setRkey(capnp::Data::Reader(r.packedRkey().data(), r.packedRkey().size()));
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> snapshotManifest(SnapshotManifestContext context) override {
    auto p = context.getParams();
    const Salt salt = saltFrom(p.getSpace().getSalt());
    if (!impl_.cold_) {
      throwRpcError(makeError(ErrorCode::kNotFound, "this node keeps no snapshots on disk"));
    }
    // Snapshots are written behind the call that made them: one not yet on disk is NOT_FOUND.
    return impl_.cold_->encodedManifest(p.getSpace().getFingerprint(), salt, p.getId())
        .then([context](std::string manifest) mutable {
          context.getResults().setManifest(capnp::Data::Reader(
              reinterpret_cast<const uint8_t*>(manifest.data()), manifest.size()));
        });
  }

  kj::Promise<void> pinSnapshot(PinSnapshotContext context) override {
    auto p = context.getParams();
    const Layout layout = layoutFromRpc(p.getLayout());
    const Salt salt = saltFrom(p.getSalt());
    const SnapshotId id = p.getId();
    kj::Duration lease = impl_.options_.pinLease;
    if (p.getLeaseMs() != 0) lease = std::min(lease, p.getLeaseMs() * kj::MILLISECONDS);
    const SpaceId space = orThrow(impl_.engine_.openSpace(layout, salt));
    kj::Promise<void> ready = kj::READY_NOW;
    if (!impl_.engine_.hasSnapshot(space, id) && impl_.cold_) {
      ready = impl_.cold_->loadSnapshot(space, id);  // after a restart: from disk
    }
    return ready.then([this, context, space, id, lease]() mutable {
      SnapshotPin pin = orThrow(impl_.engine_.pinSnapshot(space, id));
      auto pinned = kj::heap<PinLeaseImpl>(impl_, pin.lease, lease);  // released if cancelled
      std::vector<BlockLocation> parts;
      std::vector<std::optional<uint64_t>> stored;
      for (const SnapshotBytes& part : pin.parts) {
        stored.push_back(part.checksum);
        if (part.bytes != 0 && !impl_.engine_.memory().hostAddressable(part.location.extent)) {
          throwRpcError(makeError(ErrorCode::kNotSupported,
                                  "snapshot blocks in GPU memory are not served across nodes"));
        }
        BlockLocation at = part.location;
        at.bytes = part.bytes;
        parts.push_back(at);
      }
      std::string manifest = encodeManifest(pin.manifest);
      return impl_.servedChecksums(parts, std::move(stored))
          .then([this, context, parts, manifest = std::move(manifest),
                 pinned = kj::mv(pinned)](std::vector<uint64_t> sums) mutable {
            auto out = context.getResults();
            out.setManifest(capnp::Data::Reader(reinterpret_cast<const uint8_t*>(manifest.data()),
                                                manifest.size()));
            auto list = out.initParts(parts.size());
            for (size_t i = 0; i < parts.size(); ++i) {
              list[i].setExtent(parts[i].extent);
              list[i].setOffset(parts[i].offset);
              list[i].setBytes(parts[i].bytes);
              list[i].setChecksum(impl_.options_.corruptServedForTest ? sums[i] ^ 1 : sums[i]);
              ++impl_.stats_.servedBlocks;
              impl_.stats_.servedBytes += parts[i].bytes;
            }
            out.setLease(kj::mv(pinned));
          });
    });
  }

  kj::Promise<void> dropSnapshot(DropSnapshotContext context) override {
    auto p = context.getParams();
    const Layout layout = layoutFromRpc(p.getLayout());
    const SpaceId space = orThrow(impl_.engine_.openSpace(layout, saltFrom(p.getSalt())));
    if (impl_.cold_) return impl_.cold_->dropSnapshot(space, p.getId());  // memory and disk
    orThrow(impl_.engine_.dropSnapshot(space, p.getId()));
    return kj::READY_NOW;
  }

  kj::Promise<void> take(TakeContext context) override {
    auto p = context.getParams();
    const Layout layout = layoutFromRpc(p.getLayout());
    const SpaceId space = orThrow(impl_.engine_.openSpace(layout, saltFrom(p.getSalt())));
    auto keys = unpackKeys(p.getKeys(), kMaxChainKeys);
    const std::string from = text(p.getFrom());
    auto link = impl_.linkTo(from);
    if (!link) {
      throwRpcError(Impl::notLive(from));
    }
    kj::Promise<SnapshotId> snap = SnapshotId{0};
    if (p.getSnapshot() != 0) {
      snap = impl_.pullSnapshot(space, from, p.getSnapshot()).then([this, space](SnapshotId local) {
        impl_.engine_.queueSnapshotWrite(space, local);  // kept: written behind
        if (impl_.cold_) impl_.cold_->kick();
        return local;
      });
    }
    return snap.then(
        [this, context, space, link, keys = std::move(keys)](SnapshotId local) mutable {
          return impl_.fetchFrom(space, link, std::move(keys))
              .then([context, local](size_t held) mutable {
                context.getResults().setSnapshot(local);
                context.getResults().setBlocks(static_cast<uint32_t>(held));
              });
        });
  }

  kj::Promise<void> members(MembersContext context) override {
    const auto list = impl_.memberList();
    auto out = context.getResults().initMembers(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      out[i].setNodeId(list[i].nodeId);
      out[i].setAddress(list[i].address);
      out[i].setUp(list[i].up);
    }
    return kj::READY_NOW;
  }

 private:
  Impl& impl_;
  std::string node_;
};

kj::Promise<void> ClusterService::Impl::PeerImpl::pin(PinContext context) {
  auto p = context.getParams();
  const Layout layout = layoutFromRpc(p.getLayout());
  const Salt salt = saltFrom(p.getSalt());
  auto keys = unpackKeys(p.getKeys(), kMaxPinBlocks);
  kj::Duration lease = impl_.options_.pinLease;
  if (p.getLeaseMs() != 0) lease = std::min(lease, p.getLeaseMs() * kj::MILLISECONDS);
  const SpaceId space = orThrow(impl_.engine_.openSpace(layout, salt));
  // Blocks held only on disk come back into memory first, and GPU blocks to the host pool
  // (UCX reads host memory only).
  kj::Promise<void> ready = kj::READY_NOW;
  {
    const auto plan = orThrow(impl_.engine_.lookupPlan(space, {}, keys));
    std::vector<Key128> cold, chain;
    for (const auto& step : plan) {
      chain.push_back(step.key);
      if (!step.hot) cold.push_back(step.key);
    }
    if (!cold.empty() && impl_.cold_) ready = impl_.cold_->promote(space, std::move(cold));
    if (impl_.tiers_) {
      ready = ready.then([this, space, chain = std::move(chain)]() -> kj::Promise<void> {
        KJ_IF_MAYBE (moving, impl_.tiers_->bringTo(space, chain, 0)) return kj::mv(*moving);
        return kj::READY_NOW;
      });
    }
  }
  return ready.then([this, context, space, keys = std::move(keys), lease]() mutable {
    LookupResult result = orThrow(
        impl_.engine_.lookup(impl_.owner_, space, {}, keys, "", {}, {}, 0, LookupFor::kPeer));
    // Owned from here: a call cancelled before it answers releases the pin.
    auto pinned = kj::heap<PinLeaseImpl>(impl_, result.lease, lease);
    if (result.blocks.size() < keys.size()) {
      // The home named us for a key we no longer hold (the cold tier dropped it): withdraw it.
      const DirKey missing = impl_.dirKey(space, keys[result.blocks.size()]);
      const bool onDisk = impl_.cold_ && impl_.cold_->directory().contains(
                                             missing.fingerprint, missing.salt, missing.key);
      if (!onDisk && impl_.held_.drop(missing, impl_.members_)) impl_.schedulePublish();
    }
    auto blocks = result.blocks;
    auto stored = result.checksums;
    return impl_.servedChecksums(std::move(blocks), std::move(stored))
        .then([this, context, result = std::move(result), keys = std::move(keys),
               pinned = kj::mv(pinned)](std::vector<uint64_t> sums) mutable {
          auto out = context.getResults();
          auto list = out.initBlocks(result.blocks.size());
          for (size_t i = 0; i < result.blocks.size(); ++i) {
            const BlockLocation& b = result.blocks[i];
            list[i].setExtent(b.extent);
            list[i].setOffset(b.offset);
            list[i].setBytes(b.bytes);
            list[i].setChecksum(impl_.options_.corruptServedForTest ? sums[i] ^ 1 : sums[i]);
            list[i].setKey(capnp::Data::Reader(keys[i].bytes.data(), 16));
            ++impl_.stats_.servedBlocks;
            impl_.stats_.servedBytes += b.bytes;
          }
          out.setLease(kj::mv(pinned));
        });
  });
}

// One accepted peer connection.
struct ClusterService::Impl::Connection {
  Connection(Impl& impl, kj::Own<kj::AsyncIoStream> s)
      : impl(impl),
        stream(kj::mv(s)),
        network(*stream, capnp::rpc::twoparty::Side::SERVER, peerReaderOptions()) {
    ++impl.connections_;
  }
  ~Connection() { --impl.connections_; }
  Impl& impl;
  kj::Own<kj::AsyncIoStream> stream;
  capnp::TwoPartyVatNetwork network;
  kj::Maybe<capnp::RpcSystem<capnp::rpc::twoparty::VatId>> rpc;
  bool authenticated = false;
  kj::Own<kj::PromiseFulfiller<void>> drop;
};

class ClusterService::Impl::PeerGateImpl final : public peer::PeerGate::Server {
 public:
  PeerGateImpl(Impl& impl, Connection& connection) : impl_(impl), connection_(connection) {}

  kj::Promise<void> authenticate(AuthenticateContext context) override {
    auto p = context.getParams();
    auto token = p.getToken();
    const std::string& mine = impl_.options_.token;
    const bool tokenOk =
        token.size() == mine.size() && CRYPTO_memcmp(token.begin(), mine.data(), mine.size()) == 0;
    if (!tokenOk) {
      ++impl_.stats_.authFailures;
      logWarn("peer_refused",
              "reason=bad_token node=\"" + text(p.getNodeId()).substr(0, 64) + "\"");
      connection_.drop->fulfill();  // the connection ends once this call returns
      throwRpcError(makeError(ErrorCode::kPermissionDenied, "wrong cluster token"));
    }
    if (p.getProtocolVersion() != peer::PEER_PROTOCOL_VERSION) {
      throwRpcError(makeError(ErrorCode::kProtocolMismatch, "peer speaks protocol ",
                              p.getProtocolVersion(), ", this daemon ",
                              peer::PEER_PROTOCOL_VERSION));
    }
    const std::string node = text(p.getNodeId());
    if (!validNodeId(node)) throwRpcError(invalid("a node id is 1 to 64 of [A-Za-z0-9._-]"));
    connection_.authenticated = true;
    // A peer that (re)connects may be a home that forgot what we hold (it restarted, or it saw
    // us leave while we still saw it): send it again what it is home for.
    const size_t resent = impl_.held_.resendTo(node, impl_.members_);
    impl_.stats_.rehomed += resent;
    impl_.schedulePublish();
    auto out = context.getResults();
    out.setNodeId(impl_.options_.nodeId);
    out.setProtocolVersion(peer::PEER_PROTOCOL_VERSION);
    out.setPeer(kj::heap<PeerImpl>(impl_, node));
    return kj::READY_NOW;
  }

 private:
  Impl& impl_;
  Connection& connection_;
};

// --- start, membership

Status ClusterService::Impl::start() {
  auto ucx = UcxWorker::create(io_.unixEventPort, timer_);
  if (!ucx) return ucx.error();
  ucx_ = std::move(ucx).value();
  for (uint32_t i = 0; i < pool_.extentCount(); ++i) {
    auto region = ucx_->map(pool_.extentBase(i), pool_.segment(i).size());
    if (!region) return region.error();
    regions_.push_back(std::move(region).value());
  }
  KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] {
                 auto address = io_.provider->getNetwork()
                                    .parseAddress(options_.listen.c_str())
                                    .wait(io_.waitScope);
                 listener_ = address->listen();
               })) {
    return makeError(ErrorCode::kUnavailable, "cannot listen on ", options_.listen, ": ",
                     e->getDescription().cStr());
  }
  const std::string base = options_.advertise.empty() ? options_.listen : options_.advertise;
  const std::string host = base.substr(0, base.rfind(':'));
  const std::string port = options_.advertise.empty() ? std::to_string(listener_->getPort())
                                                      : base.substr(base.rfind(':') + 1);
  advertise_ = host + ":" + port;
  tasks_.add(acceptLoop());
  // What the cold tier holds (after a restart: every block this node can serve) is published
  // like the blocks indexed from here on.
  if (cold_) {
    for (const ColdKey& k : cold_->blockKeys())
      held_.hold(DirKey{k.fingerprint, k.salt, k.key}, members_);
    schedulePublish();
  }
  if (!options_.etcd.empty()) {
    EtcdMembershipOptions eo;
    eo.endpoint = options_.etcd;
    eo.cluster = options_.clusterName;
    eo.self = MemberRecord{options_.nodeId, advertise_, "ucx"};
    eo.leaseTtlSeconds = options_.etcdLeaseTtlSeconds;
    eo.requestTimeout = options_.peerTimeout;
    etcd_ =
        kj::heap<EtcdMembership>(io_.provider->getNetwork(), timer_, eo,
                                 [this](const std::vector<MemberRecord>& m) { setEtcdMembers(m); });
    tasks_.add(etcd_->run());
  } else {
    for (const auto& p : options_.peers) {
      if (p != advertise_) addLink(p, "");
    }
  }
  logInfo("cluster_started", "node=" + options_.nodeId + " peer_addr=" + advertise_ +
                                 " membership=" + (options_.etcd.empty() ? "static" : "etcd") +
                                 " ucx_tls=" + ucx_->transports());
  return {};
}

kj::Promise<void> ClusterService::Impl::leave() {
  if (etcd_)
    return timer_.timeoutAfter(options_.peerTimeout, etcd_->leave()).catch_([](kj::Exception&&) {});
  return kj::READY_NOW;
}

void ClusterService::Impl::addLink(const std::string& address, const std::string& nodeId) {
  auto link = std::make_shared<Link>();
  link->address = address;
  link->nodeId = nodeId;
  Link& l = *link;
  links_[address] = link;
  l.task = runLink(l).eagerlyEvaluate(nullptr);
}

kj::Promise<void> ClusterService::Impl::runLink(Link& link) {
  return connectLink(link)
      .then([this, &link] {
        link.up = true;
        link.backoff = kMinBackoff;
        logInfo("peer_up", "node=" + link.nodeId + " addr=" + link.address);
        updateMembers();
        schedulePublish();
        return heartbeat(link).exclusiveJoin(link.rpc->network.onDisconnect().then([]() {
          kj::throwFatalException(KJ_EXCEPTION(DISCONNECTED, "peer connection closed"));
        }));
      })
      .catch_([this, &link](kj::Exception&& e) { linkDown(link, e); })
      .then([this, &link] {
        const kj::Duration wait = link.backoff;
        link.backoff = std::min(link.backoff * 2, kMaxBackoff);
        return timer_.afterDelay(wait).then([this, &link] { return runLink(link); });
      });
}

kj::Promise<void> ClusterService::Impl::connectLink(Link& link) {
  auto connecting =
      io_.provider->getNetwork()
          .parseAddress(link.address.c_str())
          .then([](kj::Own<kj::NetworkAddress> a) { return a->connect(); })
          .then([this, &link](kj::Own<kj::AsyncIoStream> stream) {
            link.stream = peerStream(kj::mv(stream));
            link.rpc = kj::heap<Link::Rpc>(*link.stream);
            auto gate = link.rpc->bootstrap().castAs<peer::PeerGate>();
            auto req = gate.authenticateRequest();
            req.setToken(capnp::Data::Reader(
                reinterpret_cast<const uint8_t*>(options_.token.data()), options_.token.size()));
            req.setProtocolVersion(peer::PEER_PROTOCOL_VERSION);
            req.setNodeId(options_.nodeId);
            req.setAddress(advertise_);
            return req.send().then([this, &link](auto response) {
              const std::string node = text(response.getNodeId());
              if (!validNodeId(node) || node == options_.nodeId ||
                  (!link.nodeId.empty() && link.nodeId != node)) {
                kj::throwFatalException(
                    KJ_EXCEPTION(FAILED, "peer answered with an unexpected node id", node));
              }
              link.nodeId = node;
              link.peer = response.getPeer();
            });
          });
  return withDeadline(timer_, options_.peerTimeout, kj::mv(connecting));
}

kj::Promise<void> ClusterService::Impl::heartbeat(Link& link) {
  return timer_.afterDelay(options_.heartbeat).then([this, &link] {
    KJ_IF_MAYBE (p, link.peer) {
      const auto sent = std::chrono::steady_clock::now();
      return withDeadline(timer_, options_.peerTimeout, p->pingRequest().send().ignoreResult())
          .then([this, &link, sent] {
            link.rtts[link.rttCount++ % kRttSamples] =
                std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - sent)
                    .count();
            return heartbeat(link);
          });
    }
    return kj::Promise<void>(KJ_EXCEPTION(DISCONNECTED, "no peer"));
  });
}

void ClusterService::Impl::linkDown(Link& link, const kj::Exception& why) {
  const bool wasUp = link.up;
  link.up = false;
  link.peer = nullptr;
  link.ucxSetup = nullptr;
  link.ucx = nullptr;  // force-closes: gets in flight fail, their blocks are freed
  link.regions.clear();
  link.rpc = nullptr;
  link.stream = nullptr;
  link.publishing = false;
  link.rttCount = 0;
  if (wasUp) {
    logWarn("peer_down", "node=" + link.nodeId + " addr=" + link.address + " reason=\"" +
                             std::string(why.getDescription().cStr()).substr(0, 200) + "\"");
    updateMembers();
  }
}

void ClusterService::Impl::updateMembers() {
  std::vector<std::string> next{options_.nodeId};
  if (etcd_) {
    for (const auto& m : etcdMembers_) {
      if (m.nodeId != options_.nodeId) next.push_back(m.nodeId);
    }
  } else {
    for (const auto& [address, link] : links_) {
      if (link->up && !link->removed) next.push_back(link->nodeId);
    }
  }
  std::sort(next.begin(), next.end());
  next.erase(std::unique(next.begin(), next.end()), next.end());
  if (next == members_) return;
  const std::vector<std::string> before = std::move(members_);
  members_ = std::move(next);
  for (const auto& n : before) {
    if (!std::binary_search(members_.begin(), members_.end(), n)) {
      home_.forgetNode(n);
      held_.dropQueue(n);
    }
  }
  const size_t moved = held_.rehome(before, members_);
  stats_.rehomed += moved;
  const size_t dropped = home_.dropNotHome(options_.nodeId, members_);
  logInfo("membership", "members=" + std::to_string(members_.size()) + " keys_rehomed=" +
                            std::to_string(moved) + " entries_dropped=" + std::to_string(dropped));
  schedulePublish();
}

void ClusterService::Impl::setEtcdMembers(const std::vector<MemberRecord>& records) {
  etcdMembers_.clear();
  std::map<std::string, std::string> want;  // address -> node
  for (const auto& r : records) {
    if (!validNodeId(r.nodeId)) continue;
    etcdMembers_.push_back(r);
    if (r.nodeId != options_.nodeId) want[r.address] = r.nodeId;
  }
  for (auto it = links_.begin(); it != links_.end();) {
    auto w = want.find(it->first);
    if (w == want.end() || w->second != it->second->nodeId) {
      it->second->removed = true;
      it->second->task = nullptr;
      linkDown(*it->second, KJ_EXCEPTION(DISCONNECTED, "left the cluster"));
      it = links_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [address, node] : want) {
    if (!links_.count(address)) addLink(address, node);
  }
  updateMembers();
}

// --- directory

void ClusterService::Impl::schedulePublish() {
  if (publishScheduled_ || held_.pending() == 0) return;
  publishScheduled_ = true;
  const kj::Duration delay =
      held_.pending() >= kPublishBatch ? 0 * kj::MILLISECONDS : options_.publishDelay;
  tasks_.add(timer_.afterDelay(delay).then([this] {
    publishScheduled_ = false;
    flushPublish();
  }));
}

void ClusterService::Impl::flushPublish() {
  for (const std::string& home : held_.pendingHomes()) {
    if (home == options_.nodeId) {
      const auto batch = held_.take(home, SIZE_MAX);
      for (const auto& k : batch.withdraw) home_.withdraw(home, k);
      for (const auto& k : batch.add) home_.add(home, k);
      stats_.published += batch.add.size();
      stats_.withdrawn += batch.withdraw.size();
      continue;
    }
    auto link = linkTo(home);
    if (!link || link->publishing) continue;  // sent once the link is up, or re-homed
    KJ_IF_MAYBE (p, link->peer) {
      auto batch = std::make_shared<HeldKeys::Batch>(held_.take(home, kPublishBatch));
      auto req = p->publishRequest();
      auto fill = [](auto groups, const std::vector<DirKey>& keys) {
        // One group per key run of the same namespace (a batch rarely spans more than a few).
        size_t i = 0, g = 0;
        while (i < keys.size()) {
          size_t j = i;
          while (j < keys.size() && keys[j].fingerprint == keys[i].fingerprint &&
                 keys[j].salt == keys[i].salt) {
            ++j;
          }
          auto group = groups[g++];
          group.getSpace().setFingerprint(keys[i].fingerprint);
          group.getSpace().setSalt(capnp::Data::Reader(keys[i].salt.data(), 16));
          auto packed = group.initKeys((j - i) * 16);
          for (size_t k = i; k < j; ++k)
            std::memcpy(packed.begin() + 16 * (k - i), keys[k].key.bytes.data(), 16);
          i = j;
        }
      };
      auto groupsOf = [](const std::vector<DirKey>& keys) {
        size_t n = 0;
        for (size_t i = 0; i < keys.size(); ++i) {
          if (i == 0 || keys[i].fingerprint != keys[i - 1].fingerprint ||
              keys[i].salt != keys[i - 1].salt) {
            ++n;
          }
        }
        return n;
      };
      std::sort(batch->add.begin(), batch->add.end(), [](const DirKey& a, const DirKey& b) {
        return std::tie(a.fingerprint, a.salt) < std::tie(b.fingerprint, b.salt);
      });
      std::sort(batch->withdraw.begin(), batch->withdraw.end(),
                [](const DirKey& a, const DirKey& b) {
                  return std::tie(a.fingerprint, a.salt) < std::tie(b.fingerprint, b.salt);
                });
      fill(req.initAdd(groupsOf(batch->add)), batch->add);
      fill(req.initWithdraw(groupsOf(batch->withdraw)), batch->withdraw);
      link->publishing = true;
      publishInFlight_ += batch->size();
      tasks_.add(withDeadline(timer_, options_.peerTimeout, req.send().ignoreResult())
                     .then(
                         [this, link, batch] {
                           link->publishing = false;
                           publishInFlight_ -= batch->size();
                           stats_.published += batch->add.size();
                           stats_.withdrawn += batch->withdraw.size();
                           schedulePublish();
                         },
                         [this, link, batch, home](kj::Exception&& e) {
                           link->publishing = false;
                           publishInFlight_ -= batch->size();
                           logWarn("publish_failed", "home=" + home +
                                                         " keys=" + std::to_string(batch->size()) +
                                                         " " + e.getDescription().cStr());
                           held_.requeue(home, *batch);
                           // Try again later (the link may come back; if not, a membership
                           // change re-homes the keys).
                           tasks_.add(timer_.afterDelay(options_.peerTimeout).then([this] {
                             schedulePublish();
                           }));
                         }));
    }
  }
}

// --- fetch

void ClusterService::Impl::countFailure(const kj::Exception& e) {
  if (e.getType() == kj::Exception::Type::OVERLOADED &&
      std::string(e.getDescription().cStr()).find("timed out") != std::string::npos) {
    ++stats_.fetchTimeouts;
  } else if (fromKjException(e).code() == ErrorCode::kFull) {
    ++stats_.fetchFull;
  } else {
    ++stats_.fetchUnavailable;
  }
  logWarn("fetch_failed", std::string(e.getDescription().cStr()).substr(0, 300));
}

kj::Promise<void> ClusterService::Impl::fetch(SpaceId space, std::vector<Key128> keys) {
  if (!active() || keys.empty()) return kj::READY_NOW;
  if (keys.size() > kMaxChainKeys) keys.resize(kMaxChainKeys);
  ++stats_.remoteLookups;
  auto job = fetchChain(space, std::move(keys))
                 .catch_([this](kj::Exception&& e) { countFailure(e); })
                 .fork();
  tasks_.add(job.addBranch());  // goes on if the lookup that asked is dropped
  return job.addBranch();
}

kj::Promise<void> ClusterService::Impl::fetchChain(SpaceId space, std::vector<Key128> keys) {
  const SpaceInfo& info = engine_.space(space);
  std::map<std::string, std::vector<size_t>> byHome;
  for (size_t i = 0; i < keys.size(); ++i) {
    byHome[homeOf(DirKey{info.fingerprint, info.salt, keys[i]}, members_)].push_back(i);
  }
  auto holders = std::make_shared<std::vector<std::vector<std::string>>>(keys.size());
  kj::Vector<kj::Promise<void>> asks;
  for (auto& [home, idx] : byHome) {
    if (home == options_.nodeId) {
      for (size_t i : idx)
        (*holders)[i] = home_.holders(DirKey{info.fingerprint, info.salt, keys[i]});
      continue;
    }
    auto link = linkTo(home);
    if (!link) continue;
    KJ_IF_MAYBE (p, link->peer) {
      auto req = p->whoHoldsRequest();
      req.getSpace().setFingerprint(info.fingerprint);
      req.getSpace().setSalt(capnp::Data::Reader(info.salt.data(), 16));
      auto packed = req.initKeys(idx.size() * 16);
      for (size_t j = 0; j < idx.size(); ++j)
        std::memcpy(packed.begin() + 16 * j, keys[idx[j]].bytes.data(), 16);
      asks.add(withDeadline(timer_, options_.peerTimeout, req.send())
                   .then([holders, idx = idx](auto response) {
                     auto nodes = response.getNodes();
                     auto masks = response.getHolders();
                     const size_t n = std::min<size_t>(masks.size(), idx.size());
                     for (size_t j = 0; j < n; ++j) {
                       for (size_t b = 0; b < nodes.size() && b < 64; ++b) {
                         if (masks[j] & (uint64_t{1} << b))
                           (*holders)[idx[j]].push_back(text(nodes[b]));
                       }
                     }
                   })
                   .catch_([this](kj::Exception&& e) { countFailure(e); }));
    }
  }
  return kj::joinPromises(asks.releaseAsArray())
      .then([this, space, keys = std::move(keys), holders]() mutable {
        // Runs: from the first key on, the holder that covers the longest stretch.
        kj::Vector<kj::Promise<void>> runs;
        size_t i = 0;
        while (i < keys.size()) {
          // A block this node holds already (the chain's holdings may interleave: a drain
          // spreads a prefix over several nodes) is no gap: the walk goes on past it.
          if (engine_.indexed(space, keys[i])) {
            ++i;
            continue;
          }
          // A block another lookup's fetch is bringing: wait for that fetch instead.
          if (auto f = fetching_.find(dirKey(space, keys[i])); f != fetching_.end()) {
            runs.add(f->second->addBranch());
            ++i;
            continue;
          }
          std::shared_ptr<Link> best;
          size_t bestEnd = i;
          for (const auto& h : (*holders)[i]) {
            if (h == options_.nodeId) continue;
            auto link = linkTo(h);
            if (!link) continue;
            size_t j = i;
            while (j < keys.size() && j - i < kMaxPinBlocks &&
                   (j == i || !fetching_.count(dirKey(space, keys[j]))) &&
                   std::find((*holders)[j].begin(), (*holders)[j].end(), h) !=
                       (*holders)[j].end()) {
              ++j;
            }
            if (j > bestEnd) {
              best = link;
              bestEnd = j;
            }
          }
          if (!best) break;
          // The run goes in pieces, all at once: while the holder hashes one piece for its pin
          // answer, the pieces before it are on the wire, and the asker checks each piece while
          // the next arrive.
          for (size_t from = i; from < bestEnd; from += kPinPieceBlocks) {
            const size_t to = std::min(bestEnd, from + kPinPieceBlocks);
            std::vector<Key128> piece(keys.begin() + from, keys.begin() + to);
            auto run =
                std::make_shared<kj::ForkedPromise<void>>(fetchRun(space, best, piece).fork());
            for (const Key128& k : piece) fetching_[dirKey(space, k)] = run;
            // Once done (it never rejects), its blocks are no longer in flight.
            runs.add(run->addBranch().then([this, space, piece = std::move(piece), run]() {
              for (const Key128& k : piece) {
                auto f = fetching_.find(dirKey(space, k));
                if (f != fetching_.end() && f->second == run) fetching_.erase(f);
              }
            }));
          }
          i = bestEnd;
        }
        return kj::joinPromises(runs.releaseAsArray());
      });
}

kj::Promise<void> ClusterService::Impl::ensureTransport(std::shared_ptr<Link> link) {
  if (link->ucx && !link->ucx->failed()) return kj::READY_NOW;
  KJ_IF_MAYBE (setup, link->ucxSetup) return setup->addBranch();
  link->ucx = nullptr;
  link->regions.clear();
  KJ_IF_MAYBE (p, link->peer) {
    auto setup =
        withDeadline(timer_, options_.peerTimeout, p->transportInfoRequest().send())
            .then([this, link](auto response) {
              auto extents = response.getExtents();
              if (extents.size() > kMaxRemoteExtents) {
                throwRpcError(invalid("a peer described too many extents"));
              }
              auto address = response.getWorkerAddress();
              auto ep = orThrow(ucx_->connect({address.begin(), address.size()}));
              for (auto x : extents) {
                auto rkey = x.getRkey();
                const uint32_t index = orThrow(
                    ep->addRemoteRegion(x.getAddress(), x.getBytes(), {rkey.begin(), rkey.size()}));
                link->regions[x.getId()] = Link::Region{index, x.getAddress(), x.getBytes()};
              }
              link->ucx = std::move(ep);
              logInfo("ucx_endpoint", "node=" + link->nodeId);
            })
            .then([link] { link->ucxSetup = nullptr; },
                  [link](kj::Exception&& e) {
                    link->ucxSetup = nullptr;
                    link->regions.clear();
                    kj::throwFatalException(kj::mv(e));
                  })
            .fork();
    auto branch = setup.addBranch();
    link->ucxSetup = kj::mv(setup);
    return branch;
  }
  return KJ_EXCEPTION(DISCONNECTED, "peer is not connected");
}

kj::Promise<void> ClusterService::Impl::fetchRun(SpaceId space, std::shared_ptr<Link> link,
                                                 std::vector<Key128> keys, bool replica,
                                                 bool awaitRelease) {
  // Fresh pinned local blocks first: the run is cut where the pool has no room.
  struct Run {
    std::vector<PromoteTicket> tickets;
    std::vector<bool> finished;
    kj::Maybe<peer::PinLease::Client> lease;
    kj::Maybe<kj::Promise<void>> released;
  };
  auto run = std::make_shared<Run>();
  for (const Key128& k : keys) {
    auto t = engine_.beginPromote(space, k);
    if (!t) {
      ++stats_.fetchFull;
      break;
    }
    run->tickets.push_back(*t);
  }
  run->finished.assign(run->tickets.size(), false);
  keys.resize(run->tickets.size());
  if (keys.empty()) return kj::READY_NOW;
  auto finishAll = [this, run, replica](const std::vector<bool>& good) {
    for (size_t i = 0; i < run->tickets.size(); ++i) {
      if (run->finished[i]) continue;
      run->finished[i] = true;
      const bool ok = i < good.size() && good[i];
      engine_.finishPromote(run->tickets[i], ok, /*remote=*/true, replica);
      if (ok && run->tickets[i].block != kNoBlock) {
        ++stats_.remoteHitBlocks;
        stats_.remoteHitBytes += run->tickets[i].location.bytes;
      }
    }
    run->released = releasePin(run->lease);
    if (cold_) cold_->kick();
  };
  const SpaceInfo info = engine_.space(space);
  return ensureTransport(link)
      .then([this, link, info, keys]() {
        KJ_IF_MAYBE (p, link->peer) {
          auto req = p->pinRequest();
          setNamespace(req, info);
          packKeys(req.initKeys(keys.size() * 16), keys);
          req.setLeaseMs(static_cast<uint32_t>(options_.pinLease / kj::MILLISECONDS));
          return withDeadline(timer_, options_.peerTimeout, req.send());
        }
        return kj::Promise<capnp::Response<peer::Peer::PinResults>>(
            KJ_EXCEPTION(DISCONNECTED, "peer is not connected"));
      })
      .then([this, link, run, keys](capnp::Response<peer::Peer::PinResults> response) {
        run->lease = response.getLease();
        auto blocks = response.getBlocks();
        std::vector<UcxGet> gets;
        std::vector<size_t> which;
        std::vector<uint64_t> expected;
        const size_t n = std::min<size_t>(blocks.size(), run->tickets.size());
        for (size_t i = 0; i < n; ++i) {
          const PromoteTicket& t = run->tickets[i];
          if (t.block == kNoBlock) continue;  // indexed meanwhile: nothing to read
          auto b = blocks[i];
          auto key = b.getKey();
          auto region = link->regions.find(b.getExtent());
          if (key.size() != 16 || std::memcmp(key.begin(), keys[i].bytes.data(), 16) != 0 ||
              b.getBytes() != t.location.bytes || region == link->regions.end() ||
              b.getOffset() > region->second.bytes) {
            ++stats_.fetchChecksum;  // an answer that does not describe the block asked for
            break;
          }
          gets.push_back(UcxGet{pool_.extentBase(t.location.extent) + t.location.offset,
                                regions_[t.location.extent].get(), region->second.index,
                                region->second.address + b.getOffset(), t.location.bytes});
          which.push_back(i);
          expected.push_back(b.getChecksum());
        }
        if (gets.empty() || !link->ucx) return kj::Promise<std::vector<bool>>(std::vector<bool>());
        const kj::TimePoint deadline = timer_.now() + transferDeadline(gets);
        const kj::TimePoint started = timer_.now();
        return link->ucx->get(gets, deadline)
            .then([this, run, gets, which, expected, link, started](std::vector<bool> ok) {
              const size_t failed = std::count(ok.begin(), ok.end(), false);
              if (failed > 0) {
                logWarn(
                    "fetch_transfer_failed",
                    "node=" + link->nodeId + " failed=" + std::to_string(failed) +
                        " of=" + std::to_string(ok.size()) +
                        " ms=" + std::to_string((timer_.now() - started) / kj::MILLISECONDS) +
                        " endpoint_failed=" + (link->ucx && link->ucx->failed() ? "yes" : "no"));
              }
              std::vector<BlockLocation> verify;
              for (size_t j = 0; j < gets.size(); ++j) {
                if (!ok[j]) continue;
                verify.push_back(run->tickets[which[j]].location);
              }
              return checksumsOf(std::move(verify))
                  .then([this, run, which, expected, ok,
                         node = link->nodeId](std::vector<uint64_t> sums) {
                    std::vector<bool> good(run->tickets.size(), false);
                    size_t s = 0;
                    for (size_t j = 0; j < which.size(); ++j) {
                      bool fine = false;
                      if (ok[j]) {
                        fine = sums[s++] == expected[j];
                        PromoteTicket& t = run->tickets[which[j]];
                        if (fine) {
                          t.checksum = expected[j];  // the writer's, verified: the block's own
                        } else {
                          ++stats_.fetchChecksum;
                          logCorrupt("fetch_checksum_mismatch", t.key, node);
                        }
                      } else {
                        ++stats_.fetchTransfer;
                      }
                      // A block after a gap is still a valid block: keep it (a later lookup
                      // may reach it once the gap is filled).
                      good[which[j]] = fine;
                    }
                    return good;
                  });
            });
      })
      .then([finishAll](std::vector<bool> good) { finishAll(good); },
            [this, finishAll](kj::Exception&& e) {
              countFailure(e);
              finishAll({});
            })
      .then([run, awaitRelease]() -> kj::Promise<void> {
        if (!awaitRelease) return kj::READY_NOW;
        KJ_IF_MAYBE (released, run->released) return kj::mv(*released);
        return kj::READY_NOW;
      });
}

kj::Promise<std::vector<uint64_t>> ClusterService::Impl::checksumsOf(
    std::vector<BlockLocation> blocks) {
  return servedChecksums(std::move(blocks), {});
}

void ClusterService::Impl::logCorrupt(const char* event, const Key128& key,
                                      const std::string& node) {
  uint64_t id;
  std::memcpy(&id, key.bytes.data(), sizeof id);
  if (loggedCorrupt_.size() >= kMaxLoggedCorrupt) loggedCorrupt_.clear();
  if (!loggedCorrupt_.insert(id).second) return;
  logWarn(event, "node=" + node + " key=" + key.hex());
}

kj::Promise<std::vector<uint64_t>> ClusterService::Impl::servedChecksums(
    std::vector<BlockLocation> blocks, std::vector<std::optional<uint64_t>> stored) {
  std::vector<uint64_t> sums(blocks.size(), 0);
  std::vector<size_t> todo;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (i < stored.size() && stored[i]) {
      sums[i] = *stored[i];
    } else {
      todo.push_back(i);
    }
  }
  if (todo.empty()) return sums;
  struct Job {
    std::vector<const uint8_t*> data;
    std::vector<uint32_t> bytes;
    std::vector<uint64_t> out;
  };
  auto job = std::make_shared<Job>();
  for (size_t i : todo) {
    job->data.push_back(pool_.extentBase(blocks[i].extent) + blocks[i].offset);
    job->bytes.push_back(blocks[i].bytes);
  }
  return hasher_
      .run([job] {
        job->out.resize(job->data.size());
        for (size_t i = 0; i < job->data.size(); ++i)
          job->out[i] = XXH3_64bits(job->data[i], job->bytes[i]);
      })
      .then([job, todo = std::move(todo), sums = std::move(sums)]() mutable {
        for (size_t j = 0; j < todo.size(); ++j) sums[todo[j]] = job->out[j];
        return kj::mv(sums);
      });
}

// --- snapshots across nodes

kj::Promise<SnapshotId> ClusterService::Impl::pullSnapshot(SpaceId space, std::string node,
                                                           SnapshotId id) {
  auto link = linkTo(node);
  if (!link) {
    return toKjException(notLive(node));
  }
  const SpaceInfo info = engine_.space(space);
  struct Pull {
    kj::Maybe<peer::PinLease::Client> lease;
    std::unique_ptr<SnapshotLoad> load;
    std::vector<uint64_t> expected;  // per read
    std::vector<size_t> getOf;       // per read: its get, or SIZE_MAX when it cannot be read
    std::shared_ptr<std::vector<uint64_t>> sums;  // per read, filled on the hasher thread
    kj::Vector<kj::Promise<void>> hashing;
  };
  auto pull = std::make_shared<Pull>();
  auto release = [this, pull] { (void)releasePin(pull->lease); };
  return ensureTransport(link)
      .then([this, link, info, id]() {
        KJ_IF_MAYBE (p, link->peer) {
          auto req = p->pinSnapshotRequest();
          setNamespace(req, info);
          req.setId(id);
          req.setLeaseMs(static_cast<uint32_t>(options_.pinLease / kj::MILLISECONDS));
          return withDeadline(timer_, options_.peerTimeout, req.send());
        }
        return kj::Promise<capnp::Response<peer::Peer::PinSnapshotResults>>(
            KJ_EXCEPTION(DISCONNECTED, "peer is not connected"));
      })
      .then([this, link, info, space, id,
             pull](capnp::Response<peer::Peer::PinSnapshotResults> response) {
        pull->lease = response.getLease();
        auto bytes = response.getManifest();
        auto manifest = orThrow(decodeManifest(
            std::string_view(reinterpret_cast<const char*>(bytes.begin()), bytes.size()),
            info.fingerprint, info.salt, id));
        auto parts = response.getParts();
        const size_t blocks = manifest.blocks.size();
        if (parts.size() != blocks + manifest.checkpoints.size()) {
          throwRpcError(invalid("a snapshot's parts do not match its manifest"));
        }
        manifest.id = orThrow(engine_.reserveSnapshotId());  // ids are per node: a fresh one
        pull->load = std::make_unique<SnapshotLoad>(
            orThrow(engine_.beginSnapshotLoad(space, std::move(manifest))));
        // From here the load holds pins: it is finished on every path below.
        std::vector<UcxGet> gets;
        const auto& reads = pull->load->reads;
        pull->expected.assign(reads.size(), 0);
        pull->getOf.assign(reads.size(), SIZE_MAX);
        for (size_t r = 0; r < reads.size(); ++r) {
          const SnapshotRead& read = reads[r];
          auto part = parts[read.checkpoint ? blocks + read.index : read.index];
          auto region = link->regions.find(part.getExtent());
          if (part.getBytes() != read.bytes || region == link->regions.end() || !link->ucx) {
            continue;  // not readable: the load fails whole
          }
          pull->expected[r] = part.getChecksum();
          pull->getOf[r] = gets.size();
          gets.push_back(UcxGet{pool_.extentBase(read.dest.extent) + read.dest.offset,
                                regions_[read.dest.extent].get(), region->second.index,
                                region->second.address + part.getOffset(), read.bytes});
        }
        // Each part is checked on the hasher thread as soon as it has arrived, while the
        // others are still on the wire.
        std::vector<size_t> readOf(gets.size());
        for (size_t r = 0; r < pull->getOf.size(); ++r) {
          if (pull->getOf[r] != SIZE_MAX) readOf[pull->getOf[r]] = r;
        }
        pull->sums = std::make_shared<std::vector<uint64_t>>(reads.size(), 0);
        auto each = [this, pull, readOf](size_t g) {
          const SnapshotRead& read = pull->load->reads[readOf[g]];
          const uint8_t* data = pool_.extentBase(read.dest.extent) + read.dest.offset;
          pull->hashing.add(
              hasher_.run([sums = pull->sums, r = readOf[g], data, bytes = read.bytes] {
                (*sums)[r] = XXH3_64bits(data, bytes);
              }));
        };
        kj::Promise<std::vector<bool>> got = std::vector<bool>(gets.size(), false);
        if (link->ucx && !gets.empty()) {
          got = link->ucx->get(gets, timer_.now() + transferDeadline(gets), each);
        }
        return got.then([this, pull](std::vector<bool> ok) {
          return kj::joinPromises(pull->hashing.releaseAsArray()).then([this, pull, ok]() {
            const auto& reads = pull->load->reads;
            const std::vector<uint64_t>& sums = *pull->sums;
            std::vector<uint8_t> readOk(reads.size(), 0);
            for (size_t r = 0; r < reads.size(); ++r) {
              if (pull->getOf[r] == SIZE_MAX || !ok[pull->getOf[r]]) {
                ++stats_.fetchTransfer;
                continue;
              }
              if (sums[r] != pull->expected[r]) {
                ++stats_.fetchChecksum;
                logWarn("snapshot_checksum_mismatch", "read=" + std::to_string(r));
                continue;
              }
              // The writer's checksum, verified: kept with a sealed block read back.
              pull->load->reads[r].checksum = pull->expected[r];
              readOk[r] = 1;
              ++stats_.remoteHitBlocks;
              stats_.remoteHitBytes += reads[r].bytes;
            }
            auto info = engine_.finishSnapshotLoad(*pull->load, readOk, /*remote=*/true);
            pull->load = nullptr;
            if (cold_) cold_->kick();
            if (!info) {
              throwRpcError(makeError(
                  ErrorCode::kUnavailable,
                  "the snapshot could not be brought from its node: ", info.error().message()));
            }
            return info->id;
          });
        });
      })
      .then(
          [release](SnapshotId local) {
            release();
            return local;
          },
          [this, release, pull](kj::Exception&& e) -> SnapshotId {
            if (pull->load) {
              // Failed between begin and finish: nothing read, nothing kept.
              std::vector<uint8_t> none(pull->load->reads.size(), 0);
              (void)engine_.finishSnapshotLoad(*pull->load, none, /*remote=*/true);
              pull->load = nullptr;
            }
            release();
            countFailure(e);
            kj::throwFatalException(kj::mv(e));
          });
}

kj::Promise<void> ClusterService::Impl::dropRemoteSnapshot(SpaceId space, std::string node,
                                                           SnapshotId id) {
  auto link = linkTo(node);
  if (!link) {
    return toKjException(notLive(node));
  }
  KJ_IF_MAYBE (p, link->peer) {
    const SpaceInfo info = engine_.space(space);
    auto req = p->dropSnapshotRequest();
    setNamespace(req, info);
    req.setId(id);
    return withDeadline(timer_, options_.peerTimeout, req.send().ignoreResult());
  }
  return toKjException(makeError(ErrorCode::kUnavailable, "node ", node, " is not connected"));
}

// --- drain

kj::Promise<size_t> ClusterService::Impl::fetchFrom(SpaceId space, std::shared_ptr<Link> link,
                                                    std::vector<Key128> keys) {
  kj::Vector<kj::Promise<void>> pieces;
  for (size_t from = 0; from < keys.size(); from += kPinPieceBlocks) {
    const size_t to = std::min(keys.size(), from + kPinPieceBlocks);
    pieces.add(fetchRun(space, link, std::vector<Key128>(keys.begin() + from, keys.begin() + to),
                        /*replica=*/false,  // handed over: the source goes away or lets go
                        /*awaitRelease=*/true));
  }
  return kj::joinPromises(pieces.releaseAsArray()).then([this, space, keys = std::move(keys)]() {
    size_t held = 0;
    for (const Key128& k : keys) held += engine_.indexed(space, k);
    return held;
  });
}

kj::Promise<capnp::Response<peer::Peer::TakeResults>> ClusterService::Impl::askToTake(
    std::shared_ptr<Link> target, SpaceId space, SnapshotId snapshot, std::vector<Key128> keys) {
  KJ_IF_MAYBE (p, target->peer) {
    const SpaceInfo& info = engine_.space(space);
    auto req = p->takeRequest();
    setNamespace(req, info);
    req.setSnapshot(snapshot);
    packKeys(req.initKeys(keys.size() * 16), keys);
    req.setFrom(options_.nodeId);
    // A take moves bytes: its deadline grows with them (a round trip plus 10 ms a block).
    const kj::Duration deadline =
        options_.peerTimeout * 2 + (keys.size() + 1) * 10 * kj::MILLISECONDS;
    return withDeadline(timer_, deadline, req.send());
  }
  return toKjException(
      makeError(ErrorCode::kUnavailable, "node ", target->nodeId, " is not connected"));
}

kj::Promise<size_t> ClusterService::Impl::pushBlocks(SpaceId space, std::string node,
                                                     std::vector<Key128> keys) {
  auto target = linkTo(node);
  if (!target) return toKjException(notLive(node));
  // One take per piece of the peer protocol's key limit, in parallel; each fetches from here.
  kj::Vector<kj::Promise<size_t>> takes;
  for (size_t from = 0; from < keys.size(); from += kMaxChainKeys) {
    std::vector<Key128> part(keys.begin() + from,
                             keys.begin() + std::min(keys.size(), from + kMaxChainKeys));
    takes.add(askToTake(target, space, 0, std::move(part))
                  .then([](capnp::Response<peer::Peer::TakeResults> r) -> size_t {
                    return r.getBlocks();
                  }));
  }
  return kj::joinPromises(takes.releaseAsArray()).then([](kj::Array<size_t> held) {
    size_t total = 0;
    for (size_t n : held) total += n;
    return total;
  });
}

kj::Promise<DrainProgress> ClusterService::Impl::drainStep(uint32_t maxSnapshots,
                                                           uint32_t maxBlocks) {
  std::vector<std::shared_ptr<Link>> targets;
  std::vector<std::string> targetIds;
  for (const auto& [address, link] : links_) {
    if (link->up) {
      targets.push_back(link);
      targetIds.push_back(link->nodeId);
    }
  }
  if (targets.empty()) {
    return toKjException(makeError(ErrorCode::kUnavailable, "no other live member to drain ",
                                   options_.nodeId, " to"));
  }
  auto progress = std::make_shared<DrainProgress>();
  // Snapshots, one after another: the target pulls one, then it is dropped here.
  auto snapshots = engine_.snapshotList();
  if (snapshots.size() > maxSnapshots) snapshots.resize(maxSnapshots);
  kj::Promise<void> moving = kj::READY_NOW;
  for (const auto& [space, id] : snapshots) {
    auto target = targets[id % targets.size()];
    moving = moving.then([this, target, space = space, id = id, progress]() {
      return askToTake(target, space, id, {})
          .then([this, space, id, progress](capnp::Response<peer::Peer::TakeResults> r) {
            if (r.getSnapshot() == 0) kj::throwFatalException(KJ_EXCEPTION(FAILED, "not taken"));
            return dropLocalSnapshot(space, id).then([progress] { ++progress->snapshotsMoved; });
          })
          .catch_([this, progress, id](kj::Exception&& e) {
            ++progress->failures;
            logWarn("drain_snapshot_failed",
                    "snapshot=" + std::to_string(id) + " " +
                        std::string(e.getDescription().cStr()).substr(0, 200));
          });
    });
  }
  // Blocks in memory not yet handed over, each to its home among the others (they spread).
  return moving.then([this, maxBlocks, targets, targetIds, progress]() {
    std::map<std::pair<SpaceId, size_t>, std::vector<Key128>> batches;  // (space, target)
    size_t taken = 0;
    for (const auto& [space, key] : engine_.indexedBlocks()) {
      if (taken >= maxBlocks) break;
      const DirKey dk = dirKey(space, key);
      if (drained_.count(dk)) continue;
      const std::string& home = homeOf(dk, targetIds);
      const size_t t = std::find(targetIds.begin(), targetIds.end(), home) - targetIds.begin();
      batches[{space, t}].push_back(key);
      ++taken;
    }
    kj::Vector<kj::Promise<void>> sends;
    for (auto& [where, keys] : batches) {
      for (size_t from = 0; from < keys.size(); from += kMaxChainKeys) {
        std::vector<Key128> part(keys.begin() + from,
                                 keys.begin() + std::min(keys.size(), from + kMaxChainKeys));
        const SpaceId space = where.first;
        sends.add(
            askToTake(targets[where.second], space, 0, part)
                .then(
                    [this, space, part, progress](capnp::Response<peer::Peer::TakeResults> r) {
                      progress->blocksCopied += r.getBlocks();
                      if (r.getBlocks() == part.size()) {
                        for (const Key128& k : part) drained_.insert(dirKey(space, k));
                      } else {
                        progress->failures += part.size() - r.getBlocks();
                      }
                    },
                    [progress, n = part.size()](kj::Exception&& e) {
                      progress->failures += n;
                      logWarn("drain_blocks_failed",
                              std::string(e.getDescription().cStr()).substr(0, 200));
                    }));
      }
    }
    return kj::joinPromises(sends.releaseAsArray()).then([this, progress]() {
      progress->snapshotsLeft = engine_.snapshotList().size();
      for (const auto& [space, key] : engine_.indexedBlocks()) {
        progress->blocksLeft += !drained_.count(dirKey(space, key));
      }
      return *progress;
    });
  });
}

// --- serving

kj::Promise<void> ClusterService::Impl::acceptLoop() {
  return listener_->accept().then([this](kj::Own<kj::AsyncIoStream> stream) {
    if (connections_ >= kMaxPeerConnections) {
      logWarn("peer_refused", "reason=too_many_connections");
      return acceptLoop();
    }
    auto conn = kj::heap<Connection>(*this, peerStream(kj::mv(stream)));
    auto paf = kj::newPromiseAndFulfiller<void>();
    conn->drop = kj::mv(paf.fulfiller);
    conn->rpc = capnp::makeRpcServer(conn->network, kj::heap<PeerGateImpl>(*this, *conn));
    Connection& c = *conn;
    // Unauthenticated connections are dropped after the peer timeout.
    auto unauthenticated =
        timer_.afterDelay(options_.peerTimeout).then([&c]() -> kj::Promise<void> {
          if (c.authenticated) return kj::NEVER_DONE;
          logWarn("peer_refused", "reason=no_authentication");
          return kj::READY_NOW;
        });
    // A dropped connection ends on a later turn, after the call that dropped it has returned.
    auto dropped = paf.promise.then([] { return kj::evalLater([] {}); });
    tasks_.add(c.network.onDisconnect()
                   .exclusiveJoin(kj::mv(dropped))
                   .exclusiveJoin(kj::mv(unauthenticated))
                   .attach(kj::mv(conn)));
    return acceptLoop();
  });
}

RemoteStats ClusterService::Impl::stats() const {
  RemoteStats s = stats_;
  s.nodeId = options_.nodeId;
  s.members = etcd_ ? std::max<size_t>(etcdMembers_.size(), 1) : links_.size() + 1;
  s.membersUp = members_.size();
  s.directoryEntries = home_.size();
  s.heldKeys = held_.size();
  s.publishBacklog = held_.pending() + publishInFlight_;
  // The median heartbeat round trip over the live links (a peer call between event loops that
  // sleep between calls, as a miss's who-holds finds them).
  std::vector<double> rtts;
  for (const auto& [address, link] : links_) {
    if (!link->up) continue;
    for (size_t i = 0; i < std::min(link->rttCount, kRttSamples); ++i)
      rtts.push_back(link->rtts[i]);
  }
  if (!rtts.empty()) {
    std::nth_element(rtts.begin(), rtts.begin() + rtts.size() / 2, rtts.end());
    s.peerRttMicros = static_cast<uint64_t>(rtts[rtts.size() / 2]);
  }
  return s;
}

std::vector<RemoteMember> ClusterService::Impl::memberList() const {
  std::vector<RemoteMember> out;
  out.push_back(RemoteMember{options_.nodeId, advertise_, true, true});
  for (const auto& [address, link] : links_) {
    out.push_back(RemoteMember{link->nodeId, address, link->up, false});
  }
  return out;
}

// --- ClusterService

ClusterService::ClusterService(Engine& engine, HostPool& pool, ColdService* cold,
                               TierService* tiers, kj::AsyncIoContext& io, ClusterOptions options)
    : impl_(std::make_unique<Impl>(engine, pool, cold, tiers, io, std::move(options))) {}
ClusterService::~ClusterService() = default;
Status ClusterService::start() { return impl_->start(); }
const std::string& ClusterService::address() const { return impl_->advertise_; }
const std::string& ClusterService::nodeId() const { return impl_->options_.nodeId; }
kj::Promise<void> ClusterService::leave() { return impl_->leave(); }
bool ClusterService::active() const { return impl_->active(); }
kj::Promise<void> ClusterService::fetch(SpaceId space, std::vector<Key128> keys) {
  return impl_->fetch(space, std::move(keys));
}
RemoteStats ClusterService::stats() const { return impl_->stats(); }
kj::Promise<SnapshotId> ClusterService::pullSnapshot(SpaceId space, std::string node,
                                                     SnapshotId id) {
  return impl_->pullSnapshot(space, std::move(node), id);
}
kj::Promise<void> ClusterService::dropRemoteSnapshot(SpaceId space, std::string node,
                                                     SnapshotId id) {
  return impl_->dropRemoteSnapshot(space, std::move(node), id);
}
kj::Promise<size_t> ClusterService::pushBlocks(SpaceId space, std::string node,
                                               std::vector<Key128> keys) {
  return impl_->pushBlocks(space, std::move(node), std::move(keys));
}
kj::Promise<DrainProgress> ClusterService::drainStep(uint32_t maxSnapshots, uint32_t maxBlocks) {
  return impl_->drainStep(maxSnapshots, maxBlocks);
}
std::vector<RemoteMember> ClusterService::members() const { return impl_->memberList(); }

}  // namespace kvtier
