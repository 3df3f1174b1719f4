// Remote hits: asking homes who holds a chain, pinning runs on holders, UCX gets into fresh
// local blocks, and checking each block against the checksum its writer took.
#include "daemon/cluster/cluster_impl.h"

namespace kvtier {

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
  if (fetchesInFlight_ >= kMaxFetchesInFlight) {
    ++stats_.fetchFull;
    return kj::READY_NOW;
  }
  ++fetchesInFlight_;
  auto job = fetchChain(space, std::move(keys))
                 .catch_([this](kj::Exception&& e) { countFailure(e); })
                 .then([this] { --fetchesInFlight_; })
                 .fork();
  tasks_.add(job.addBranch());  // goes on if the lookup that asked is dropped
  // The lookup waits for its fetch one peer deadline at most, whatever the steps inside took
  // (a home's answer, a new endpoint, a pin, the transfer: each with its own deadline, in
  // sequence): then it answers with what has arrived, and the fetch finishes in the background
  // for the next lookup.
  return job.addBranch().exclusiveJoin(
      timer_.afterDelay(options_.peerTimeout).then([this] { ++stats_.remoteLookupsCut; }));
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
        const UcxGrant grant = grantFrom(response.getGrant());
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
                                region->second.index, region->second.address + b.getOffset(),
                                t.location.bytes, grant});
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

}  // namespace kvtier
