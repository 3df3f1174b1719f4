// Links to the other members: connections with backoff, heartbeats, membership (static or
// etcd), and the UCX endpoint to each.
#include "daemon/cluster/cluster_impl.h"

namespace kvtier {

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
      return withDeadline(timer_, options_.peerTimeout, p->pingRequest().send())
          .then([this, &link, sent](auto response) {
            link.rtts[link.rttCount++ % kRttSamples] =
                std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - sent)
                    .count();
            // Load: the queries it answered since the last heartbeat (a total would make a
            // home that just joined look idle until it caught up).
            const uint64_t answered = response.getQueries();
            link.load = answered >= link.queriesSeen ? answered - link.queriesSeen : 0;
            link.queriesSeen = answered;
            // The hot anchors the peer is home for, as of now.
            auto& known = hotKnown_[link.nodeId];
            known.clear();
            auto hot = response.getHot();
            for (size_t i = 0; i < hot.size() && i < kMaxHotAnchors; ++i) {
              auto anchor = hot[i].getAnchor();
              auto salt = hot[i].getSpace().getSalt();
              if (anchor.size() != 16 || salt.size() != 16) continue;
              DirKey k;
              k.fingerprint = hot[i].getSpace().getFingerprint();
              std::memcpy(k.salt.data(), salt.begin(), 16);
              std::memcpy(k.key.bytes.data(), anchor.begin(), 16);
              auto& holders = known[k];
              for (size_t j = 0; j < hot[i].getHolders().size() && j < kMaxAnswerNodes; ++j) {
                const std::string node = text(hot[i].getHolders()[j]);
                if (validNodeId(node)) holders.push_back(node);
              }
            }
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
  ++link.transportEpoch;  // a setup still under way changes nothing when it ends
  link.ucx = nullptr;     // force-closes: gets in flight fail, their blocks are freed
  link.regions.clear();
  link.rpc = nullptr;
  link.stream = nullptr;
  link.publishing = false;
  link.rttCount = 0;
  hotKnown_.erase(link.nodeId);
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
  HashRing beforeRing = std::move(ring_);
  ring_ = HashRing(members_);
  for (const auto& n : before) {
    if (!std::binary_search(members_.begin(), members_.end(), n)) {
      home_.forgetNode(n);
      held_.dropQueue(n);
    }
  }
  const size_t moved = held_.rehome(beforeRing, ring_);
  stats_.rehomed += moved;
  const size_t dropped = home_.dropNotHome(options_.nodeId, ring_, kAnchorReplicas);
  // Hot anchors: counted again by their homes on the new ring.
  anchorQueries_.clear();
  std::erase_if(hotAnchors_, [&](const DirKey& a) {
    const auto homes = homesOf(DirEntry{a, a.key}, ring_, kAnchorReplicas);
    return std::find(homes.begin(), homes.end(), options_.nodeId) == homes.end();
  });
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

kj::Promise<void> ClusterService::Impl::ensureTransport(std::shared_ptr<Link> link) {
  if (link->ucx && !link->ucx->failed()) return kj::READY_NOW;
  KJ_IF_MAYBE (setup, link->ucxSetup) return setup->addBranch();
  link->ucx = nullptr;
  link->regions.clear();
  KJ_IF_MAYBE (p, link->peer) {
    const uint64_t epoch = ++link->transportEpoch;
    auto setup =
        withDeadline(timer_, options_.peerTimeout, p->transportInfoRequest().send())
            .then([this, link, epoch](capnp::Response<peer::Peer::TransportInfoResults> response) {
              auto extents = response.getExtents();
              if (extents.size() > kMaxRemoteExtents) {
                throwRpcError(invalid("a peer described too many extents"));
              }
              if (response.getUcxPort() == 0) throwRpcError(invalid("a peer without a UCX port"));
              // The peer's UCX listener, on the host this node reaches its peer port at.
              std::shared_ptr<UcxEndpoint> ep =
                  orThrow(ucx_->connect(hostOf(link->address), response.getUcxPort()));
              auto ready = ep->connected(timer_.now() + options_.peerTimeout);
              return ready.then([link, ep, epoch, response = kj::mv(response)]() mutable {
                if (link->transportEpoch != epoch) {
                  throwRpcError(makeError(ErrorCode::kUnavailable, "the link to ", link->nodeId,
                                          " changed while its transport was set up"));
                }
                for (auto x : response.getExtents()) {
                  const uint32_t index = orThrow(ep->addRemoteRegion(x.getAddress(), x.getBytes()));
                  link->regions[x.getId()] = Link::Region{index, x.getAddress(), x.getBytes()};
                }
                link->ucx = ep;
                logInfo("ucx_endpoint", "node=" + link->nodeId);
              });
            })
            .then(
                [link, epoch] {
                  if (link->transportEpoch == epoch) link->ucxSetup = nullptr;
                },
                [link, epoch](kj::Exception&& e) {
                  if (link->transportEpoch == epoch) {
                    link->ucxSetup = nullptr;
                    link->regions.clear();
                  }
                  kj::throwFatalException(kj::mv(e));
                })
            .fork();
    auto branch = setup.addBranch();
    link->ucxSetup = kj::mv(setup);
    return branch;
  }
  return KJ_EXCEPTION(DISCONNECTED, "peer is not connected");
}

}  // namespace kvtier
