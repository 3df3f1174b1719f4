// Snapshots across nodes: pulled from the node that holds them, dropped there after a move.
#include "daemon/cluster/cluster_impl.h"

namespace kvtier {

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
        const UcxGrant grant = grantFrom(response.getGrant());
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
                                region->second.index, region->second.address + part.getOffset(),
                                read.bytes, grant});
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

}  // namespace kvtier
