// ClusterService: start and leave, stats, and the public face over its implementation
// (cluster_impl.h lists the files that implement it).
#include "daemon/cluster/cluster_impl.h"

namespace kvtier {

bool isLoopbackHost(const std::string& hostPort) {
  const std::string host = hostOf(hostPort);
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

Status ClusterService::Impl::start() {
  auto ucx = UcxWorker::create(io_.unixEventPort, timer_);
  if (!ucx) return ucx.error();
  ucx_ = std::move(ucx).value();
  // UCX's listener on the host of the peer listener (a fetcher reaches it where it reaches that).
  auto ucxPort = ucx_->listen(hostOf(options_.listen));
  if (!ucxPort) return ucxPort.error();
  ucxPort_ = *ucxPort;
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
