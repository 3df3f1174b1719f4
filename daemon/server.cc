#include "daemon/server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <capnp/rpc-twoparty.h>
#include <kj/debug.h>

#include <cstdio>
#include <memory>

#include "daemon/config.h"
#include "daemon/lane.h"
#include "daemon/log.h"
#include "daemon/lookup.h"
#include "daemon/metrics.h"
#include "kernels/block_copy.h"
#include "schemas/kvtier.capnp.h"
#include "transport/buffered_stream.h"
#include "transport/pool_fds.h"
#include "transport/rpc_codec.h"
#include "transport/socket_stream.h"

#include "daemon/server_internal.h"

namespace kvtier {

using namespace server_internal;

namespace {

class SessionImpl final : public rpc::Session::Server {
 public:
  // `mapsPool`: the peer may be handed the pools' handles (peerMapsPool, daemon/access.h).
  SessionImpl(kvtier::Server& server, OwnerId owner, Salt salt, bool mapsPool,
              const PeerCredentials& peer)
      : server_(server),
        owner_(std::make_shared<OwnerScope>(server.engine(), server.cold(), owner)),
        salt_(salt),
        mapsPool_(mapsPool),
        lane_(LookupSite{server.engine(), server.cold(), server.tiers(), server.remote(), owner},
              peer, server.laneStats()) {
    server_.sessionOpened();
    server_.addLane(lane_);
  }
  ~SessionImpl() noexcept(false) {
    server_.removeLane(lane_);
    lane_.close();  // its leases go before the owner's sequences
    const OwnerId owner = owner_->id();
    owner_.reset();  // the sequences go now, or with the last of its spaces and write leases
    server_.sessionClosed();
    logInfo("session_closed", "owner=" + std::to_string(owner));
  }

  kj::Promise<void> open(OpenContext context) override {
    const Layout layout = layoutFromRpc(context.getParams().getLayout());
    const int device = context.getParams().getDevice();
    const GpuPoolExport* gpu = nullptr;
    for (const auto& g : server_.gpus()) {
      if (g.device == device) gpu = &g;
    }
    if (device != -1 && !gpu) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument,
                              "this kvtierd has no GPU pool on device ", device));
    }
    // A CUDA IPC handle maps the whole GPU pool, every tenant's blocks: only root and the
    // daemon's own user get one (GPU blocks never travel inline).
    if (gpu && !mapsPool_) {
      throwRpcError(makeError(
          ErrorCode::kPermissionDenied, "GPU pools are mapped only by root and ",
          "the daemon's user: open the space with device -1 (host pool, ", "bytes inline)"));
    }
    const SpaceId space = orThrow(server_.engine().openSpace(layout, salt_, !mapsPool_));
    auto out = context.getResults();
    out.setFingerprint(server_.engine().space(space).fingerprint);
    out.setBlockBytes(server_.engine().space(space).blockBytes);
    auto& pool = server_.hostPool();
    const size_t gpuExtents = gpu ? gpu->extents.size() : 0;
    auto extents = out.initExtents(pool.extentCount() + gpuExtents);
    for (uint32_t i = 0; i < pool.extentCount(); ++i) {
      extents[i].setId(i);
      // The segment's name (or descriptor) maps the whole pool: for root and the daemon's own
      // user only (the segment is theirs, 0600). Other tenants get neither and move bytes inline.
      const ShmSegment& segment = pool.segment(i);
      if (mapsPool_ && segment.anonymous()) {
        extents[i].setByDescriptor(true);  // fetched by a pool_fds connection (servePoolFds)
      } else if (mapsPool_) {
        extents[i].setShmName(segment.name());
      }
      extents[i].setBytes(segment.size());
    }
    for (uint32_t i = 0; i < gpuExtents; ++i) {
      auto x = extents[pool.extentCount() + i];
      x.setId(gpu->extents[i].id);
      x.setBytes(gpu->extents[i].bytes);
      x.setDevice(gpu->device);
      x.setIpcHandle(
          capnp::Data::Reader(gpu->extents[i].ipcHandle.data(), gpu->extents[i].ipcHandle.size()));
    }
    const uint8_t tier = gpu ? gpu->tier : uint8_t{0};
    out.setSpace(makeSpace(server_.engine(), owner_, space, server_.cold(), server_.tiers(), tier,
                           server_.remote()));
    out.setLane(lane_.addSpace(space, tier));
    return kj::READY_NOW;
  }

  kj::Promise<void> cluster(ClusterContext context) override {
    auto out = context.getResults();
    auto* remote = server_.remote();
    if (!remote) return kj::READY_NOW;
    const auto members = remote->members();
    out.setNodeId(remote->nodeId());
    auto list = out.initMembers(members.size());
    for (uint32_t i = 0; i < members.size(); ++i) {
      list[i].setNodeId(members[i].nodeId);
      list[i].setAddress(members[i].address);
      list[i].setUp(members[i].up);
      list[i].setSelf(members[i].self);
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> drain(DrainContext context) override {
    auto* remote = server_.remote();
    if (!remote) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument, "this kvtierd is not in a cluster"));
    }
    auto p = context.getParams();
    return remote->drainStep(p.getMaxSnapshots(), p.getMaxBlocks())
        .then([context](DrainProgress d) mutable {
          auto out = context.getResults().initProgress();
          out.setSnapshotsMoved(d.snapshotsMoved);
          out.setBlocksCopied(d.blocksCopied);
          out.setSnapshotsLeft(d.snapshotsLeft);
          out.setBlocksLeft(d.blocksLeft);
          out.setFailures(d.failures);
        });
  }

  const Lane::Token& laneToken() const { return lane_.token(); }

  kj::Promise<void> stats(StatsContext context) override {
    const EngineStats s = server_.engine().stats();
    auto out = context.getResults().initStats();
    out.setBlocksTotal(s.blocksTotal);
    out.setBlocksUsed(s.blocksUsed);
    out.setBlocksPinned(s.blocksPinned);
    out.setBlocksCached(s.blocksCached);
    out.setBytesTotal(s.bytesTotal);
    out.setBytesUsed(s.bytesUsed);
    out.setHits(s.hits);
    out.setMisses(s.misses);
    out.setEvictions(s.evictions);
    out.setEvictionPolicy(s.eviction);
    out.setEvictionFollowing(s.evictionFollowing);
    out.setEvictionSwitches(s.evictionSwitches);
    out.setBlocksCorrupt(s.corruptBlocks);
    out.setClients(server_.sessions());
    out.setSequences(s.sequences);
    out.setReadLeases(s.readLeases);
    out.setWriteLeases(s.writeLeases);
    out.setBytesPut(s.bytesPut);
    out.setBytesGot(s.bytesGot);
    out.setSnapshots(s.snapshots);
    out.setEntries(s.entries);
    out.setCheckpoints(s.checkpoints);
    out.setSpilled(s.spilled);
    out.setPromoted(s.promoted);
    out.setEvictedUnspilled(s.evictedUnspilled);
    out.setGpuBlocksTotal(s.gpuBlocksTotal);
    out.setGpuBlocksUsed(s.gpuBlocksUsed);
    out.setGpuDemoted(s.gpuDemoted);
    out.setGpuPromoted(s.gpuPromoted);
    // The asking tenant's own usage only: other tenants' are for the operator (metrics).
    out.setTenantBytesUsed(server_.engine().tenantBytesUsed(salt_));
    out.setTenantQuotaBytes(s.tenantQuotaBytes);
    const LaneStats& lanes = server_.laneStats();
    out.setLaneLookups(lanes.lookups);
    out.setLanesAttached(lanes.attached);
    out.setLanesRefused(lanes.refused);
    out.setLanePuts(lanes.puts);
    out.setPoolPages(pageKindName(server_.hostPool().pages()));
    out.setPoolPagesReason(server_.hostPool().pagesReason());
    if (auto* cold = server_.cold()) {
      const ColdServiceStats c = cold->stats();
      out.setColdRecords(c.tier.records);
      out.setColdBytes(c.tier.bytes);
      out.setColdDiskBytes(c.tier.diskBytes);
      out.setCorruptDropped(c.tier.corruptDropped);
      out.setColdQuarantined(c.tier.quarantined);
      out.setSpillErrors(c.spillErrors);
      out.setColdEvicted(c.tier.capacityEvicted);
      out.setColdSnapshots(c.tier.snapshots);
      out.setColdSnapshotsDropped(c.tier.snapshotsDropped);
    }
    if (auto* remote = server_.remote()) {
      const RemoteStats r = remote->stats();
      out.setClusterMembers(r.members);
      out.setClusterMembersUp(r.membersUp);
      out.setDirectoryEntries(r.directoryEntries);
      out.setHeldKeys(r.heldKeys);
      out.setPublishBacklog(r.publishBacklog);
      out.setDirectoryRehomed(r.rehomed);
      out.setRemoteLookups(r.remoteLookups);
      out.setRemoteLookupsCut(r.remoteLookupsCut);
      out.setLookupPeerMessages(r.lookupPeerMessages);
      out.setLookupPeerMessagesMax(r.lookupPeerMessagesMax);
      out.setDirectoryQueries(r.directoryQueries);
      out.setDirectoryKeys(r.directoryKeys);
      out.setRemoteHitBlocks(r.remoteHitBlocks);
      out.setRemoteHitBytes(r.remoteHitBytes);
      out.setServedBlocks(r.servedBlocks);
      out.setFetchTimeouts(r.fetchTimeouts);
      out.setFetchUnavailable(r.fetchUnavailable);
      out.setFetchTransfer(r.fetchTransfer);
      out.setFetchChecksum(r.fetchChecksum);
      out.setFetchFull(r.fetchFull);
      out.setPeerAuthFailures(r.authFailures);
      out.setPeerRttMicros(r.peerRttMicros);
    }
    auto spaces = out.initSpaces(s.spaces.size());
    for (uint32_t i = 0; i < s.spaces.size(); ++i) {
      spaces[i].setFingerprint(s.spaces[i].fingerprint);
      spaces[i].setBlockBytes(s.spaces[i].blockBytes);
      spaces[i].setBlocksTotal(s.spaces[i].blocksTotal);
      spaces[i].setBlocksUsed(s.spaces[i].blocksUsed);
      spaces[i].setSequences(s.spaces[i].sequences);
    }
    return kj::READY_NOW;
  }

 private:
  kvtier::Server& server_;
  std::shared_ptr<OwnerScope> owner_;
  Salt salt_;
  bool mapsPool_;
  Lane lane_;
};

class DaemonImpl final : public rpc::Daemon::Server {
 public:
  DaemonImpl(kvtier::Server& server, PeerCredentials peer, bool allowed)
      : server_(server), peer_(peer), allowed_(allowed) {}

  kj::Promise<void> hello(HelloContext context) override {
    if (!allowed_) {
      throwRpcError(makeError(ErrorCode::kPermissionDenied, "uid ", peer_.uid,
                              " may not use this kvtierd: only root, its user and members of ",
                              "group ", server_.access().allowedGid, " (--allow-group) may"));
    }
    auto p = context.getParams();
    if (p.getClientName().size() > kMaxClientNameBytes) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument, "client name of ",
                              p.getClientName().size(), " bytes exceeds ", kMaxClientNameBytes));
    }
    if (p.getProtocolVersion() != rpc::PROTOCOL_VERSION) {
      throwRpcError(makeError(ErrorCode::kProtocolMismatch, "client speaks protocol ",
                              p.getProtocolVersion(), ", this daemon speaks ",
                              rpc::PROTOCOL_VERSION));
    }
    // Tenancy: by default each Unix user is its own tenant, so two users never share blocks.
    const std::string tenant = "uid:" + std::to_string(peer_.uid);
    const Salt salt = saltFor(tenant);
    server_.nameTenant(salt, tenant);
    const OwnerId owner = server_.newOwner();
    logInfo("session_opened", "owner=" + std::to_string(owner) + " pid=" +
                                  std::to_string(peer_.pid) + " uid=" + std::to_string(peer_.uid) +
                                  " client=" + logQuoted(text(p.getClientName())));
    auto out = context.getResults();
    out.setProtocolVersion(rpc::PROTOCOL_VERSION);
    out.setDaemonVersion(daemonVersion());
    auto session =
        kj::heap<SessionImpl>(server_, owner, salt, peerMapsPool(peer_, server_.access()), peer_);
    const Lane::Token& token = session->laneToken();
    out.setLaneToken(capnp::Data::Reader(token.data(), token.size()));
    out.setSession(kj::mv(session));
    auto devices = out.initDevices(server_.gpus().size());
    auto pci = out.initDevicePciBusIds(server_.gpus().size());
    for (uint32_t i = 0; i < server_.gpus().size(); ++i) {
      devices.set(i, server_.gpus()[i].device);
      pci.set(i, server_.gpus()[i].pciBusId);
    }
    return kj::READY_NOW;
  }

 private:
  kvtier::Server& server_;
  PeerCredentials peer_;
  bool allowed_;
};

// One client connection: its stream, its two-party network and its RPC system.
struct Connection {
  Connection(kj::Own<kj::AsyncIoStream> s, rpc::Daemon::Client bootstrap)
      : stream(kj::mv(s)),
        network(*stream, capnp::rpc::twoparty::Side::SERVER, readerOptions()),
        rpcSystem(capnp::makeRpcServer(network, kj::mv(bootstrap))) {}
  kj::Own<kj::AsyncIoStream> stream;
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpcSystem;
};

}  // namespace

Server::Server(Engine& engine, HostPool& pool, ColdService* cold, TierService* tiers,
               std::vector<GpuPoolExport> gpus, BusyPoller* poller, RemoteTier* remote)
    : engine_(engine),
      pool_(pool),
      poller_(poller),
      cold_(cold),
      tiers_(tiers),
      remote_(remote),
      gpus_(std::move(gpus)),
      access_{static_cast<int64_t>(geteuid()), static_cast<int64_t>(getegid())},
      tasks_(*this) {}

void Server::nameTenant(const Salt& salt, std::string name) {
  for (const auto& [s, n] : tenantNames_) {
    if (s == salt) return;
  }
  tenantNames_.emplace_back(salt, std::move(name));
}

Server::~Server() = default;

kj::Promise<void> Server::acceptLoop(kj::ConnectionReceiver& listener, kj::UnixEventPort& port,
                                     kj::Timer& timer) {
  // (kj's accept() throws at once when accept(2) fails: evalNow makes that a rejection too.)
  return kj::evalNow([&listener] { return listener.accept(); })
      .then(
          [this, &listener, &port, &timer](kj::Own<kj::AsyncIoStream> stream) {
            accept(readWatchedSocket(port, kj::mv(stream)));
            return acceptLoop(listener, port, timer);
          },
          [this, &listener, &port, &timer](kj::Exception&& e) {
            logWarn("accept_failed", "reason=" + logQuoted(e.getDescription().cStr()));
            return timer.afterDelay(kAcceptRetryDelay).then([this, &listener, &port, &timer] {
              return acceptLoop(listener, port, timer);
            });
          });
}

void Server::accept(kj::Own<kj::AsyncIoStream> stream) {
  // The kernel's credentials of the peer as it connected (docs/security.md). A refused peer still
  // gets a connection, whose bootstrap answers hello with PERMISSION_DENIED and offers nothing
  // else: it learns why instead of seeing a closed socket.
  PeerCredentials peer;
  KJ_IF_MAYBE (fd, stream->getFd()) {
    auto read = readPeerCredentials(*fd, /*withGroups=*/false);
    // Supplementary groups only when the uid and the primary group do not decide already.
    if (read && !peerAllowed(*read, access_)) read = readPeerCredentials(*fd, true);
    if (read) {
      peer = std::move(read).value();
    } else {
      logWarn("peer_credentials_unavailable", read.error().message());
    }
  } else {
    logWarn("peer_credentials_unavailable", "the connection has no socket descriptor");
  }
  const bool allowed = peerAllowed(peer, access_);
  if (!allowed) {
    logWarn("peer_refused",
            describePeer(peer) + " allowed_gid=" + std::to_string(access_.allowedGid));
  }
  // A session's fast lane starts with lane::kMagic, a request for the pool's descriptors with
  // pool_fds::kMagic, a Cap'n Proto connection with its first message's segment count (never
  // that large): the first four bytes tell which this is, and a Cap'n Proto connection gets them
  // back.
  auto buffered = kj::heap<BufferedIoStream>(kj::mv(stream), poller_);
  auto first = kj::heap<uint32_t>(0);
  auto read = buffered->tryRead(first.get(), sizeof(uint32_t), sizeof(uint32_t));
  tasks_.add(read.then([this, buffered = kj::mv(buffered), first = kj::mv(first), peer,
                        allowed](size_t n) mutable -> kj::Promise<void> {
    if (n == sizeof(uint32_t) && *first == lane::kMagic && allowed) {
      return attachLane(kj::mv(buffered), peer);
    }
    if (n == sizeof(uint32_t) && *first == pool_fds::kMagic && allowed) {
      return servePoolFds(kj::mv(buffered), peer);
    }
    buffered->unread(n);
    serveRpc(kj::mv(buffered), peer, allowed);
    return kj::READY_NOW;
  }));
}

rpc::Daemon::Client Server::localClient() {
  PeerCredentials self;
  self.pid = ::getpid();
  self.uid = ::geteuid();
  self.gid = ::getegid();
  return kj::heap<DaemonImpl>(*this, self, peerAllowed(self, access_));
}

void Server::serveRpc(kj::Own<kj::AsyncIoStream> stream, const PeerCredentials& peer,
                      bool allowed) {
  auto connection =
      kj::heap<Connection>(kj::mv(stream), kj::heap<DaemonImpl>(*this, peer, allowed));
  auto done = connection->network.onDisconnect();
  tasks_.add(done.attach(kj::mv(connection)));
}

kj::Promise<void> Server::attachLane(kj::Own<kj::AsyncIoStream> stream,
                                     const PeerCredentials& peer) {
  // The rest of the Attach: version and token.
  auto attach = kj::heap<lane::Attach>();
  auto* rest = reinterpret_cast<kj::byte*>(attach.get()) + sizeof(uint32_t);
  constexpr size_t restBytes = sizeof(lane::Attach) - sizeof(uint32_t);
  auto read = stream->tryRead(rest, restBytes, restBytes);
  return read.then([this, stream = kj::mv(stream), attach = kj::mv(attach),
                    peer](size_t n) mutable -> kj::Promise<void> {
    Lane::Token token;
    std::memcpy(token.data(), attach->token, token.size());
    auto found = lanes_.find(token);
    Lane* lane = found == lanes_.end() ? nullptr : found->second;
    const char* refused = nullptr;
    if (n < restBytes) {
      refused = "the connection ended inside the attach";
    } else if (attach->version != lane::kVersion) {
      refused = "unknown lane version";
    } else if (!lane) {
      refused = "no session has this token";
    } else if (lane->attached()) {
      refused = "the session's lane is attached already";
    } else if (lane->peer().pid != peer.pid || lane->peer().uid != peer.uid) {
      refused = "the peer is not the session's process";
    }
    if (refused) {
      ++laneStats_.refused;
      logWarn("lane_refused", describePeer(peer) + " why=\"" + refused + "\"");
      return kj::READY_NOW;  // closes the connection
    }
    static constexpr uint32_t kAccepted = static_cast<uint32_t>(lane::AttachStatus::kAccepted);
    auto* s = stream.get();
    return s->write(&kAccepted, sizeof kAccepted)
        .then([this, token, stream = kj::mv(stream)]() mutable {
          // The session may have ended, or attached another lane, while this one was answered.
          auto again = lanes_.find(token);
          if (again != lanes_.end() && !again->second->attached()) {
            again->second->attach(kj::mv(stream));
          }
        });
  });
}

kj::Promise<void> Server::servePoolFds(kj::Own<kj::AsyncIoStream> stream,
                                       const PeerCredentials& peer) {
  // The rest of the Request: its version.
  auto version = kj::heap<uint32_t>(0);
  auto read = stream->tryRead(version.get(), sizeof(uint32_t), sizeof(uint32_t));
  return read.then([this, stream = kj::mv(stream), version = kj::mv(version), peer](size_t n) {
    // The connection ends with the stream, once answered (or when the peer left).
    if (n == sizeof(uint32_t)) answerPoolFds(*stream, *version, peer);
  });
}

void Server::answerPoolFds(const kj::AsyncIoStream& stream, uint32_t version,
                           const PeerCredentials& peer) {
  int fd = -1;
  KJ_IF_MAYBE (f, stream.getFd()) {
    fd = *f;
  }
  if (fd < 0) {
    logWarn("pool_fds_refused", describePeer(peer) + " why=\"the connection has no socket\"");
    return;
  }
  // The same check as for the segments' names in Session.open: the descriptors map the whole
  // pool, every tenant's blocks.
  pool_fds::ReplyStatus status = pool_fds::ReplyStatus::kAccepted;
  if (version != pool_fds::kVersion) {
    status = pool_fds::ReplyStatus::kUnknownVersion;
  } else if (!peerMapsPool(peer, access_)) {
    status = pool_fds::ReplyStatus::kRefused;
    logWarn("pool_fds_refused",
            describePeer(peer) + " why=\"only root and the daemon's user map the pool\"");
  }
  std::vector<pool_fds::ExtentFd> extents;
  for (uint32_t i = 0; i < pool_.extentCount(); ++i) {
    const ShmSegment& segment = pool_.segment(i);
    if (segment.fd() >= 0) extents.push_back({i, segment.size(), segment.fd()});
  }
  if (auto s = pool_fds::sendReply(fd, status, extents); !s) {
    logWarn("pool_fds_failed", describePeer(peer) + " why=\"" + s.error().message() + "\"");
  }
}
void Server::taskFailed(kj::Exception&& exception) {
  logWarn("connection_failed", exception.getDescription().cStr());
}

}  // namespace kvtier