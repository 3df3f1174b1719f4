// The Peer service other daemons call, the gate that checks their token, and the accept loop.
#include "daemon/cluster/cluster_impl.h"

namespace kvtier {

// A pin on blocks served to a peer: released when the peer releases or drops it, when its
// connection ends, or when its lease runs out — whichever comes first. While it stands, the peer
// may read the pinned blocks over UCX under its grant (and nothing else).
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
  // Lets the peer read `blocks` (host-pool locations) under a fresh grant; returns its token.
  capnp::Data::Reader grant(const std::vector<BlockLocation>& blocks) {
    std::vector<std::pair<const uint8_t*, uint64_t>> ranges;
    for (const BlockLocation& b : blocks) {
      if (b.bytes != 0) ranges.emplace_back(impl_.pool_.extentBase(b.extent) + b.offset, b.bytes);
    }
    if (id_ != 0) grant_ = impl_.ucx_->grant(std::move(ranges));
    return capnp::Data::Reader(reinterpret_cast<const uint8_t*>(grant_.data()), sizeof grant_);
  }
  void releaseNow() {
    if (id_ == 0) return;
    impl_.ucx_->revoke(grant_);
    impl_.ucx_->holdEnd();
    (void)impl_.engine_.releaseRead(std::exchange(id_, 0));
    if (impl_.cold_) impl_.cold_->kick();
  }

 private:
  Impl& impl_;
  LeaseId id_;
  UcxGrant grant_ = {};
  kj::Promise<void> expiry_ = nullptr;
};

class ClusterService::Impl::PeerImpl final : public peer::Peer::Server {
 public:
  PeerImpl(Impl& impl, std::string node) : impl_(impl), node_(std::move(node)) {}

  kj::Promise<void> ping(PingContext context) override {
    auto out = context.getResults();
    out.setNodeId(impl_.options_.nodeId);
    out.setQueries(impl_.stats_.directoryQueries);
    auto hot = out.initHot(impl_.hotAnchors_.size());
    for (size_t i = 0; i < impl_.hotAnchors_.size(); ++i) {
      const DirKey& a = impl_.hotAnchors_[i];
      hot[i].getSpace().setFingerprint(a.fingerprint);
      hot[i].getSpace().setSalt(capnp::Data::Reader(a.salt.data(), 16));
      hot[i].setAnchor(capnp::Data::Reader(a.key.bytes.data(), 16));
      const auto& holders = impl_.home_.holders(DirEntry{a, a.key});
      auto list = hot[i].initHolders(holders.size());
      for (size_t j = 0; j < holders.size(); ++j) list.set(j, holders[j]);
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> publish(PublishContext context) override {
    auto p = context.getParams();
    auto apply = [&](capnp::List<peer::KeyGroup>::Reader groups, bool add) {
      for (auto g : groups) {
        const Salt salt = saltFrom(g.getSpace().getSalt());
        const auto keys = unpackKeys(g.getKeys(), kMaxPublishKeys);
        const auto unders = unpackKeys(g.getUnders(), kMaxPublishKeys);
        auto own = g.getOwn();
        for (size_t i = 0; i < keys.size(); ++i) {
          const DirEntry e{DirKey{g.getSpace().getFingerprint(), salt, keys[i]}, unders[i],
                           own.size() == keys.size() && own[i] != 0};
          if (add) {
            impl_.home_.add(node_, e);
          } else {
            impl_.home_.withdraw(node_, e);
          }
        }
      }
    };
    // Validate both lists, and their size together, before changing anything.
    size_t total = 0;
    for (auto list : {p.getAdd(), p.getWithdraw()}) {
      for (auto g : list) {
        (void)saltFrom(g.getSpace().getSalt());
        const size_t keys = unpackKeys(g.getKeys(), kMaxPublishKeys).size();
        if (keys != unpackKeys(g.getUnders(), kMaxPublishKeys).size()) {
          throwRpcError(invalid("a key group names one anchor per key"));
        }
        total += keys;
        if (total > kMaxPublishKeys) {
          throwRpcError(makeError(ErrorCode::kInvalidArgument, "a publish of more than ",
                                  kMaxPublishKeys, " keys"));
        }
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
    const auto under = unpackKeys(p.getUnder(), 1);
    if (under.size() != 1) throwRpcError(invalid("who-holds names the anchor its keys are under"));
    ++impl_.stats_.directoryQueries;
    const DirKey anchor{p.getSpace().getFingerprint(), salt, under[0]};
    const bool hot = impl_.noteQuery(anchor);
    std::vector<std::string> nodes;
    std::vector<uint64_t> masks;
    for (const Key128& k : keys) {
      uint64_t mask = 0;
      const DirEntry e{DirKey{p.getSpace().getFingerprint(), salt, k}, under[0]};
      for (const auto& n : impl_.home_.holders(e)) {
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
    if (hot) {
      out.setHot(true);
      const auto& holders = impl_.home_.holders(DirEntry{anchor, anchor.key});
      auto a = out.initAnchorHolders(holders.size());
      for (size_t i = 0; i < holders.size(); ++i) a.set(i, holders[i]);
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> pin(PinContext context) override;

  kj::Promise<void> transportInfo(TransportInfoContext context) override {
    auto out = context.getResults();
    out.setUcxPort(impl_.ucxPort_);
    out.setTransports(impl_.ucx_->transports());
    auto extents = out.initExtents(impl_.regions_.size());
    for (uint32_t i = 0; i < impl_.regions_.size(); ++i) {
      const UcxRegion& r = *impl_.regions_[i];
      extents[i].setId(i);
      extents[i].setAddress(reinterpret_cast<uint64_t>(r.base()));
      extents[i].setBytes(r.bytes());
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
            out.setGrant(pinned->grant(parts));
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
      if (!onDisk && impl_.held_.drop(missing, impl_.ring_)) impl_.schedulePublish();
    }
    auto blocks = result.blocks;
    auto stored = result.checksums;
    return impl_.servedChecksums(std::move(blocks), std::move(stored))
        .then([this, context, space, result = std::move(result), keys = std::move(keys),
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
            if (const auto* under = impl_.held_.placeOf(impl_.dirKey(space, keys[i]))) {
              auto packed = list[i].initUnder(under->size() * 16);
              for (size_t u = 0; u < under->size(); ++u)
                std::memcpy(packed.begin() + 16 * u, (*under)[u].bytes.data(), 16);
            }
            ++impl_.stats_.servedBlocks;
            impl_.stats_.servedBytes += b.bytes;
          }
          out.setGrant(pinned->grant(result.blocks));
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
    // (Not counted as re-homed: nothing moved; the same entries may be queued by a membership
    // change at the same time, and are sent once.)
    (void)impl_.held_.resendTo(node, impl_.ring_);
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

kj::Promise<void> ClusterService::Impl::acceptLoop() {
  // A failed accept (out of descriptors) is logged and tried again after a pause: it never ends
  // the loop.
  return kj::evalNow([this] { return listener_->accept(); })
      .then(
          [this](kj::Own<kj::AsyncIoStream> stream) {
            servePeer(kj::mv(stream));
            return acceptLoop();
          },
          [this](kj::Exception&& e) {
            logWarn("accept_failed", "listener=peer reason=\"" +
                                         std::string(e.getDescription().cStr()).substr(0, 200) +
                                         "\"");
            return timer_.afterDelay(250 * kj::MILLISECONDS).then([this] { return acceptLoop(); });
          });
}

void ClusterService::Impl::servePeer(kj::Own<kj::AsyncIoStream> stream) {
  if (connections_ >= kMaxPeerConnections) {
    logWarn("peer_refused", "reason=too_many_connections");
    return;
  }
  auto conn = kj::heap<Connection>(*this, peerStream(kj::mv(stream)));
  auto paf = kj::newPromiseAndFulfiller<void>();
  conn->drop = kj::mv(paf.fulfiller);
  conn->rpc = capnp::makeRpcServer(conn->network, kj::heap<PeerGateImpl>(*this, *conn));
  Connection& c = *conn;
  // Unauthenticated connections are dropped after the peer timeout.
  auto unauthenticated = timer_.afterDelay(options_.peerTimeout).then([&c]() -> kj::Promise<void> {
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
}

void ClusterService::servePeer(kj::Own<kj::AsyncIoStream> stream) {
  impl_->servePeer(kj::mv(stream));
}

}  // namespace kvtier
