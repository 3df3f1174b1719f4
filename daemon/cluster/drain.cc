// Blocks copied or moved to other nodes (pushBlocks) and a node drained before maintenance.
#include "daemon/cluster/cluster_impl.h"

namespace kvtier {

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
          .catch_([progress, id](kj::Exception&& e) {
            ++progress->failures;
            logWarn("drain_snapshot_failed",
                    "snapshot=" + std::to_string(id) + " " +
                        std::string(e.getDescription().cStr()).substr(0, 200));
          });
    });
  }
  // Blocks in memory not yet handed over, each chain to one of the others (chains spread, and a
  // chain stays whole: a lookup finds it on one holder).
  return moving.then([this, maxBlocks, targets, targetIds, progress]() {
    std::map<std::pair<SpaceId, size_t>, std::vector<Key128>> batches;  // (space, target)
    size_t taken = 0;
    for (const auto& [space, key] : engine_.indexedBlocks()) {
      if (taken >= maxBlocks) break;
      const DirKey dk = dirKey(space, key);
      if (drained_.count(dk)) continue;
      const std::string& home = homeOf(DirKey{dk.fingerprint, dk.salt, chainRoot(dk)}, targetIds);
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

}  // namespace kvtier
