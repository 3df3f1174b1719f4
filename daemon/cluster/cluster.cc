// ClusterService: start and leave, stats, and the public face over its implementation
// (cluster_impl.h lists the files that implement it).
#include "daemon/cluster/cluster_impl.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>

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
    auto places = loadPlaces();
    for (const ColdKey& k : cold_->blockKeys()) {
      const DirKey dk{k.fingerprint, k.salt, k.key};
      auto place = places.find(dk);
      held_.hold(dk, place == places.end() ? std::vector<Key128>{} : std::move(place->second),
                 ring_);
    }
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
  savePlaces();
  if (etcd_)
    return timer_.timeoutAfter(options_.peerTimeout, etcd_->leave()).catch_([](kj::Exception&&) {});
  return kj::READY_NOW;
}

// The places file: "KVTPLACE" then, per held key, its namespace and key (8 + 16 + 16 bytes), the
// number of anchors (4) and the anchors (16 each); written whole to a temporary file and renamed.
namespace {
constexpr char kPlacesMagic[8] = {'K', 'V', 'T', 'P', 'L', 'A', 'C', 'E'};
}  // namespace

void ClusterService::Impl::savePlaces() const {
  if (options_.placesFile.empty()) return;
  const std::string tmp = options_.placesFile + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) {
    logWarn("places_not_saved", "path=" + tmp + " " + std::strerror(errno));
    return;
  }
  bool ok = std::fwrite(kPlacesMagic, sizeof kPlacesMagic, 1, f) == 1;
  held_.forEach([&](const DirKey& k, const std::vector<Key128>& under) {
    if (!ok || (under.size() == 1 && under[0] == k.key)) return;  // unknown: nothing to keep
    const uint32_t n = static_cast<uint32_t>(under.size());
    ok = std::fwrite(&k.fingerprint, 8, 1, f) == 1 && std::fwrite(k.salt.data(), 16, 1, f) == 1 &&
         std::fwrite(k.key.bytes.data(), 16, 1, f) == 1 && std::fwrite(&n, 4, 1, f) == 1;
    for (const Key128& u : under) ok = ok && std::fwrite(u.bytes.data(), 16, 1, f) == 1;
  });
  ok = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0 && ok;
  std::fclose(f);
  if (!ok || std::rename(tmp.c_str(), options_.placesFile.c_str()) != 0) {
    logWarn("places_not_saved", "path=" + options_.placesFile);
    std::remove(tmp.c_str());
  }
}

std::unordered_map<DirKey, std::vector<Key128>, DirKeyHash> ClusterService::Impl::loadPlaces()
    const {
  std::unordered_map<DirKey, std::vector<Key128>, DirKeyHash> out;
  if (options_.placesFile.empty()) return out;
  FILE* f = std::fopen(options_.placesFile.c_str(), "rb");
  if (!f) return out;
  char magic[sizeof kPlacesMagic];
  if (std::fread(magic, sizeof magic, 1, f) == 1 && std::memcmp(magic, kPlacesMagic, 8) == 0) {
    while (true) {
      DirKey k;
      uint32_t n = 0;
      if (std::fread(&k.fingerprint, 8, 1, f) != 1 || std::fread(k.salt.data(), 16, 1, f) != 1 ||
          std::fread(k.key.bytes.data(), 16, 1, f) != 1 || std::fread(&n, 4, 1, f) != 1 || n == 0 ||
          n > kMaxAnchorsPerBlock) {
        break;  // the end, or a damaged tail: what was read so far stands
      }
      std::vector<Key128> under(n);
      bool whole = true;
      for (auto& u : under) whole = whole && std::fread(u.bytes.data(), 16, 1, f) == 1;
      if (!whole) break;
      out.emplace(k, std::move(under));
    }
  }
  std::fclose(f);
  // Read once: a crash later must not file blocks by places older than the ones it then holds.
  std::remove(options_.placesFile.c_str());
  logInfo("places_loaded", "blocks=" + std::to_string(out.size()));
  return out;
}

RemoteStats ClusterService::Impl::stats() const {
  RemoteStats s = stats_;
  s.nodeId = options_.nodeId;
  s.members = etcd_ ? std::max<size_t>(etcdMembers_.size(), 1) : links_.size() + 1;
  s.membersUp = members_.size();
  s.directoryEntries = home_.size();
  // A walk of the whole directory: done again only when it or the membership changed.
  if (keysCountedAt_ != std::make_pair(home_.version(), members_)) {
    keysCounted_ = home_.keysAsFirstHome(options_.nodeId, ring_);
    keysCountedAt_ = {home_.version(), members_};
  }
  s.directoryKeys = keysCounted_;
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
kj::Promise<void> ClusterService::fetch(SpaceId space, std::vector<Key128> chain, size_t from) {
  return impl_->fetch(space, std::move(chain), from);
}
kj::Promise<void> ClusterService::fetchState(SpaceId space, std::vector<uint32_t> tokens,
                                             std::vector<Key128> keys, std::vector<Key128> chain) {
  return impl_->fetchState(space, std::move(tokens), std::move(keys), std::move(chain));
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
