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

kj::Promise<void> ClusterService::Impl::fetch(SpaceId space, std::vector<Key128> chain,
                                              size_t from) {
  if (!active() || from >= chain.size()) return kj::READY_NOW;
  if (chain.size() - from > kMaxChainKeys) chain.resize(from + kMaxChainKeys);
  ++stats_.remoteLookups;
  if (fetchesInFlight_ >= kMaxFetchesInFlight) {
    ++stats_.fetchFull;
    return kj::READY_NOW;
  }
  ++fetchesInFlight_;
  auto held = std::make_shared<LocalHold>(engine_, owner_);
  held->add(space, chain);
  auto job = fetchChain(space, std::move(chain), from, held)
                 .catch_([this](kj::Exception&& e) { countFailure(e); })
                 .then([this, held]() {
                   held->release();
                   --fetchesInFlight_;
                 })
                 .fork();
  tasks_.add(job.addBranch());  // goes on if the lookup that asked is dropped
  // The lookup waits for its fetch one peer deadline at most, whatever the steps inside took
  // (a home's answer, a new endpoint, a pin, the transfer: each with its own deadline, in
  // sequence): then it answers with what has arrived, and the fetch finishes in the background
  // for the next lookup.
  return job.addBranch().exclusiveJoin(
      timer_.afterDelay(options_.peerTimeout).then([this] { ++stats_.remoteLookupsCut; }));
}

void ClusterService::Impl::LocalHold::add(SpaceId space, std::span<const Key128> chain) {
  for (size_t i = 0; i < chain.size();) {
    if (!engine.indexed(space, chain[i])) {
      ++i;
      continue;
    }
    size_t end = i + 1;
    while (end < chain.size() && engine.indexed(space, chain[end])) ++end;
    // Not this node's hit or miss (the lookup that follows counts those).
    auto held = engine.lookup(owner, space, {}, chain.subspan(i, end - i), "", {}, {}, -1,
                              LookupFor::kHold);
    if (held && held->lease != 0) leases.push_back(held->lease);
    i = end;
  }
}

void ClusterService::Impl::LocalHold::release() {
  for (LeaseId lease : leases) (void)engine.releaseRead(lease);
  leases.clear();
}

void ClusterService::Impl::countLookupMessages(uint32_t messages) {
  stats_.lookupPeerMessages += messages;
  stats_.lookupPeerMessagesMax = std::max<uint64_t>(stats_.lookupPeerMessagesMax, messages);
}

bool ClusterService::Impl::noteQuery(const DirKey& anchor) {
  if (std::find(hotAnchors_.begin(), hotAnchors_.end(), anchor) != hotAnchors_.end()) return true;
  // Only an anchor this node is a home of counts (a peer cannot make others' anchors hot here).
  const auto homes = homesOf(DirEntry{anchor, anchor.key}, ring_, kAnchorReplicas);
  if (std::find(homes.begin(), homes.end(), options_.nodeId) == homes.end()) return false;
  if (anchorQueries_.size() >= kMaxCountedAnchors) anchorQueries_.clear();
  if (++anchorQueries_[anchor] < kHotQueries) return false;
  anchorQueries_.erase(anchor);
  if (hotAnchors_.size() >= kMaxHotAnchors) hotAnchors_.erase(hotAnchors_.begin());
  hotAnchors_.push_back(anchor);
  logInfo("anchor_hot", "key=" + anchor.key.hex());
  return true;
}

const std::vector<std::string>* ClusterService::Impl::hotHolders(const DirKey& anchor) const {
  for (const std::string& h : homesOf(DirEntry{anchor, anchor.key}, ring_, kAnchorReplicas)) {
    auto home = hotKnown_.find(h);
    if (home == hotKnown_.end()) continue;
    auto it = home->second.find(anchor);
    if (it != home->second.end()) return &it->second;
  }
  return nullptr;
}

std::string ClusterService::Impl::directoryHomeFor(const DirKey& anchor) {
  const auto homes = homesOf(DirEntry{anchor, anchor.key}, ring_, kAnchorReplicas);
  if (std::find(homes.begin(), homes.end(), options_.nodeId) != homes.end())
    return options_.nodeId;  // asks nobody
  // The least loaded it knows of; among equals, a choice that differs by asker and anchor.
  std::shared_ptr<Link> pick;
  const size_t start = std::hash<Key128>()(anchor.key) ^ std::hash<std::string>()(options_.nodeId);
  for (size_t i = 0; i < homes.size(); ++i) {
    auto link = linkTo(homes[(start + i) % homes.size()]);
    if (link && (!pick || link->load < pick->load)) pick = link;
  }
  if (!pick) return homes.empty() ? options_.nodeId : homes.front();
  ++pick->load;
  return pick->nodeId;
}

kj::Promise<void> ClusterService::Impl::fetchChain(SpaceId space, std::vector<Key128> chain,
                                                   size_t from, std::shared_ptr<LocalHold> held) {
  // A block another lookup's fetch is bringing: wait for that fetch instead (it brings the chain
  // from there on as far as its holders reach).
  if (auto f = fetching_.find(dirKey(space, chain[from])); f != fetching_.end()) {
    countLookupMessages(0);
    return f->second->addBranch();
  }
  const SpaceInfo& info = engine_.space(space);
  const size_t n = chain.size();
  auto anchorAt = [&](size_t segment) {
    return DirKey{info.fingerprint, info.salt, chain[segment * kSegmentBlocks]};
  };
  // One home knows a segment key by key, and how far each holder reaches down the chain past it
  // (the holders of each later anchor): that of the first missing block's segment, unless its
  // anchor is hot (a popular prefix's) and a later one is not. Then the hot segments' holders
  // come from the heartbeats, and the asked home's anchor holders hold the prefix before it.
  auto plan = std::make_shared<PinInputs>();
  plan->from = from;
  plan->held = std::move(held);
  // (A chain that ends in hot segments asks its last segment's home: only it knows that one.)
  const size_t last = (n - 1) / kSegmentBlocks;
  size_t asked = from / kSegmentBlocks;
  while (asked < last) {
    const std::vector<std::string>* hot = hotHolders(anchorAt(asked));
    if (!hot) break;
    plan->hot.push_back(HotSegment{asked * kSegmentBlocks, (asked + 1) * kSegmentBlocks, *hot});
    ++asked;
  }
  plan->keyedFrom = std::max(from, asked * kSegmentBlocks);
  auto shared = std::make_shared<std::vector<Key128>>(std::move(chain));
  kj::Maybe<kj::Promise<uint32_t>> answered = askHome(space, *shared, plan);
  KJ_IF_MAYBE (a, answered) {
    return a->then([this, space, shared, from, plan](uint32_t queries) -> kj::Promise<void> {
      // Another lookup's fetch may have set out for the same blocks while the home answered.
      if (auto f = fetching_.find(dirKey(space, (*shared)[from])); f != fetching_.end()) {
        countLookupMessages(queries);
        return f->second->addBranch();
      }
      return pinAndFetch(space, shared, plan, from, kMaxLookupPins, queries);
    });
  }
  countLookupMessages(0);
  return kj::READY_NOW;  // the home is not reachable: nobody to ask until membership settles
}

kj::Maybe<kj::Promise<ClusterService::Impl::HomeAnswer>> ClusterService::Impl::queryHome(
    const DirKey& anchor, const std::vector<Key128>& keys) {
  const std::string home = directoryHomeFor(anchor);
  if (home == options_.nodeId) {
    HomeAnswer answer;
    for (const Key128& key : keys) {
      answer.holders.push_back(
          home_.holders(DirEntry{DirKey{anchor.fingerprint, anchor.salt, key}, anchor.key}));
    }
    return kj::Promise<HomeAnswer>(std::move(answer));
  }
  auto link = linkTo(home);
  if (!link) return nullptr;
  KJ_IF_MAYBE (p, link->peer) {
    auto req = p->whoHoldsRequest();
    req.getSpace().setFingerprint(anchor.fingerprint);
    req.getSpace().setSalt(capnp::Data::Reader(anchor.salt.data(), 16));
    req.setUnder(capnp::Data::Reader(anchor.key.bytes.data(), 16));
    auto packed = req.initKeys(keys.size() * 16);
    for (size_t j = 0; j < keys.size(); ++j)
      std::memcpy(packed.begin() + 16 * j, keys[j].bytes.data(), 16);
    const size_t n = keys.size();
    return withDeadline(timer_, options_.peerTimeout, req.send())
        .then([this, anchor, home, n](auto response) -> HomeAnswer {
          HomeAnswer answer;
          answer.holders.resize(n);
          answer.messages = 1;
          auto nodes = response.getNodes();
          auto masks = response.getHolders();
          const size_t m = std::min<size_t>(masks.size(), n);
          for (size_t j = 0; j < m; ++j) {
            for (size_t b = 0; b < nodes.size() && b < 64; ++b) {
              if (masks[j] & (uint64_t{1} << b)) answer.holders[j].push_back(text(nodes[b]));
            }
          }
          // Hot now: the next lookups through it skip it (until the heartbeats say so).
          if (response.getHot()) {
            auto& holders = hotKnown_[home][anchor];
            holders.clear();
            for (auto h : response.getAnchorHolders()) {
              if (holders.size() >= kMaxAnswerNodes) break;
              if (validNodeId(text(h))) holders.push_back(text(h));
            }
          }
          return answer;
        });
  }
  return nullptr;
}

kj::Maybe<kj::Promise<uint32_t>> ClusterService::Impl::askHome(SpaceId space,
                                                               const std::vector<Key128>& chain,
                                                               std::shared_ptr<PinInputs> plan) {
  const SpaceInfo& info = engine_.space(space);
  const size_t n = chain.size();
  const size_t segment = plan->keyedFrom / kSegmentBlocks;
  plan->keyedEnd = std::min(n, (segment + 1) * kSegmentBlocks);
  plan->asked.clear();
  for (size_t i = plan->keyedFrom; i < plan->keyedEnd; ++i) plan->asked.push_back(i);
  for (size_t a = plan->keyedEnd; a < n; a += kSegmentBlocks) plan->asked.push_back(a);
  const DirKey anchor{info.fingerprint, info.salt, chain[segment * kSegmentBlocks]};
  std::vector<Key128> keys;
  for (size_t i : plan->asked) keys.push_back(chain[i]);
  KJ_IF_MAYBE (answered, queryHome(anchor, keys)) {
    return answered->then([plan](HomeAnswer&& answer) {
      plan->holders = std::move(answer.holders);
      plan->holders.resize(plan->asked.size());
      return answer.messages;
    });
  }
  return nullptr;
}

kj::Promise<void> ClusterService::Impl::fetchState(SpaceId space, std::vector<uint32_t> tokens,
                                                   std::vector<Key128> keys,
                                                   std::vector<Key128> chain) {
  if (!active()) return kj::READY_NOW;
  const SpaceInfo& info = engine_.space(space);
  const auto candidates = engine_.stateCandidates(space, tokens, keys, chain);
  if (candidates.empty()) return kj::READY_NOW;
  // A state at block boundary k is filed as if its chunks followed chain[0, k): under the anchor
  // of chain position k's segment, and (when position k opens a segment) under the anchor before
  // it as well. The deepest candidates' anchor is asked, about every candidate filed under it.
  const uint32_t bt = info.layout.blockTokens;
  auto anchorOf = [&](uint64_t position) -> std::optional<Key128> {
    const uint64_t k = position / bt;
    if (k == 0 || k > chain.size()) return std::nullopt;  // the first block's: not filed so
    return chain[(k - 1) / kSegmentBlocks * kSegmentBlocks];
  };
  const std::optional<Key128> under = anchorOf(candidates.front().position);
  if (!under) return kj::READY_NOW;
  std::vector<Key128> asked;
  std::vector<uint64_t> positions;
  for (const auto& c : candidates) {
    if (anchorOf(c.position) != under) continue;
    asked.push_back(c.firstChunk);
    positions.push_back(c.position);
  }
  KJ_IF_MAYBE (answered, queryHome(DirKey{info.fingerprint, info.salt, *under}, asked)) {
    return answered
        ->then([this, space, tokens = std::move(tokens), keys = std::move(keys),
                chain = std::move(chain), positions](HomeAnswer&& answer) -> kj::Promise<void> {
          countLookupMessages(answer.messages);
          for (size_t j = 0; j < positions.size() && j < answer.holders.size(); ++j) {
            const auto& holders = answer.holders[j];
            const bool elsewhere = std::any_of(holders.begin(), holders.end(), [&](const auto& h) {
              return h != options_.nodeId && linkTo(h) != nullptr;
            });
            if (!elsewhere) continue;
            // The deepest one another node holds: its chunks, fetched as a chain's continuation.
            const uint64_t k = positions[j] / engine_.space(space).layout.blockTokens;
            std::vector<Key128> run(chain.begin(), chain.begin() + std::min(k, chain.size()));
            const size_t from = run.size();
            auto chunks = engine_.stateChunkKeys(space, tokens, keys, positions[j]);
            run.insert(run.end(), chunks.begin(), chunks.end());
            return fetch(space, std::move(run), from);
          }
          return kj::READY_NOW;
        })
        .catch_([this](kj::Exception&& e) { countFailure(e); });
  }
  return kj::READY_NOW;
}

kj::Promise<void> ClusterService::Impl::pinAndFetch(SpaceId space,
                                                    std::shared_ptr<std::vector<Key128>> chain,
                                                    std::shared_ptr<PinInputs> plan, size_t at,
                                                    size_t pinsLeft, uint32_t messages) {
  // Blocks this node holds already (a drain spreads a chain over several nodes) are no gap: a
  // holder's reach runs past them, and no pin asks for them.
  const size_t n = chain->size();
  plan->local.assign(n, false);
  for (size_t i = plan->from; i < n; ++i) plan->local[i] = engine_.indexed(space, (*chain)[i]);
  const auto pins = planPins(n, *plan, at, pinsLeft);
  if (pins.empty()) {
    if (plan->requeried || at < plan->keyedEnd || pinsLeft == 0 ||
        messages + 2 > kMaxLookupMessages) {
      countLookupMessages(messages);
      return kj::READY_NOW;
    }
    // A gap after the pins, in a segment the home knew only by its anchor, that no holder it
    // named covers: a node may hold that part of the chain without its anchor (the head went
    // first where room was needed). That segment's home knows it key by key: one more query.
    plan->requeried = true;
    plan->from = plan->keyedFrom = at;
    plan->hot.clear();
    KJ_IF_MAYBE (answered, askHome(space, *chain, plan)) {
      return answered->then([this, space, chain, plan, at, pinsLeft,
                             messages](uint32_t queries) -> kj::Promise<void> {
        const uint32_t sent = messages + queries;
        return pinAndFetch(space, chain, plan, at,
                           std::min<size_t>(pinsLeft, kMaxLookupMessages - sent), sent);
      });
    }
    countLookupMessages(messages);
    return kj::READY_NOW;
  }
  messages += static_cast<uint32_t>(pins.size());
  kj::Vector<kj::Promise<void>> runs;
  for (const PinPlan& pin : pins) {
    // The keys not held here, each filed as this node's chain says (not as the holder's answer
    // would have it).
    std::vector<Key128> keys;
    std::vector<std::vector<Key128>> places;
    for (size_t i = pin.begin; i < pin.end; ++i) {
      if (plan->local[i]) continue;
      keys.push_back((*chain)[i]);
      places.push_back(anchorsFiledUnder(std::span<const Key128>(*chain).first(i + 1)));
    }
    auto run = std::make_shared<kj::ForkedPromise<void>>(
        fetchRun(space, pin.link, keys, true, false, std::move(places), plan->held).fork());
    for (const Key128& k : keys) fetching_[dirKey(space, k)] = run;
    // Once done (it never rejects), its blocks are no longer in flight.
    runs.add(run->addBranch().then([this, space, keys = std::move(keys), run]() {
      for (const Key128& k : keys) {
        auto f = fetching_.find(dirKey(space, k));
        if (f != fetching_.end() && f->second == run) fetching_.erase(f);
      }
    }));
  }
  return kj::joinPromises(runs.releaseAsArray())
      .then([this, space, chain, plan, pins, pinsLeft, messages]() -> kj::Promise<void> {
        // A holder past the first segment is known by the anchors it holds, not key by key: one
        // that came back short (it holds less of that segment than its anchor suggested) leaves
        // a gap the next best holder may fill, or that segment's home may name, with the pins
        // left.
        const size_t n = chain->size();
        size_t p = plan->from;
        while (p < n && engine_.indexed(space, (*chain)[p])) ++p;
        const size_t left = pinsLeft - pins.size();
        if (p >= n || left == 0) {
          countLookupMessages(messages);
          return kj::READY_NOW;
        }
        for (const PinPlan& pin : pins) {
          if (pin.begin <= p && p < pin.end) plan->tried.push_back(pin.link->nodeId);
        }
        return pinAndFetch(space, chain, plan, p, left, messages);
      });
}

std::vector<ClusterService::Impl::PinPlan> ClusterService::Impl::planPins(size_t chainSize,
                                                                          const PinInputs& in,
                                                                          size_t at,
                                                                          size_t maxPins) const {
  const size_t from = in.from;
  // What each live holder covers from `from` on, as far as the answer tells: the keys the home
  // named it for, exactly; past that segment, the segment of each later anchor it holds (likely
  // whole: a segment's tail goes before its head). Not the segments between: a node may hold a
  // chain's later part without its head (a replica fetched for a lookup goes first when room is
  // needed, the blocks the node sealed itself after it stay). Past skipped hot segments, the
  // holders of the anchor asked about hold the prefix before it (nothing else is known there);
  // not the rest of a hot segment: a popular prefix ends in it, and what follows differs per
  // prompt — a fresh prompt's miss would cost a pin.
  // In the order the answer names them: a home lists a key's holders oldest first, and among
  // holders that reach as far the oldest is chosen — the block's first holder rather than a
  // replica fetched from it (which then stays first to go where it was fetched to).
  std::vector<std::pair<std::string, std::vector<bool>>> covers;
  auto cover = [&](const std::string& node, size_t begin, size_t end) {
    if (node == options_.nodeId || !linkTo(node) ||
        std::find(in.tried.begin(), in.tried.end(), node) != in.tried.end()) {
      return;  // this node, one gone, or one whose pin came back short of this point
    }
    auto it =
        std::find_if(covers.begin(), covers.end(), [&](const auto& c) { return c.first == node; });
    if (it == covers.end()) it = covers.insert(covers.end(), {node, {}});
    auto& c = it->second;
    c.resize(chainSize - from, false);
    for (size_t p = std::max(begin, from); p < std::min(end, chainSize); ++p) c[p - from] = true;
  };
  for (const HotSegment& h : in.hot) {
    // A hot segment the lookup needs whole (it lacks the popular prefix): its anchor's holders
    // likely hold it (a short pin is followed by another). One it needs from the middle on (it
    // holds the prefix's head): only the anchor, as above.
    for (const auto& node : h.holders) cover(node, h.begin, h.begin >= from ? h.end : h.begin + 1);
  }
  for (size_t j = 0; j < in.asked.size(); ++j) {
    const size_t p = in.asked[j];
    for (const auto& node : in.holders[j]) {
      if (p == in.keyedFrom && p > from) {
        cover(node, from, p + 1);  // the anchor past skipped hot segments: and its prefix
      } else if (p < in.keyedEnd) {
        cover(node, p, p + 1);
      } else {
        cover(node, p, p + kSegmentBlocks);
      }
    }
  }
  auto holds = [&](const std::vector<bool>& c, size_t p) { return c[p - from]; };
  // Where a holder's reach from `p` ends: the first block neither it nor this node holds.
  auto endFrom = [&](const std::vector<bool>& c, size_t p) {
    while (p < chainSize && (in.local[p] || holds(c, p))) ++p;
    return p;
  };
  auto best = [&](size_t p) -> const std::pair<std::string, std::vector<bool>>* {
    const std::pair<std::string, std::vector<bool>>* pick = nullptr;
    size_t pickEnd = p;
    for (const auto& c : covers) {
      if (!holds(c.second, p)) continue;
      const size_t e = endFrom(c.second, p);
      if (e > pickEnd) pick = &c, pickEnd = e;
    }
    return pick;
  };
  // Pins, at most maxPins: from `at`, the holder that reaches furthest from there; then from where
  // it stops, the same again.
  std::vector<PinPlan> plan;
  while (plan.size() < maxPins && at < chainSize) {
    const auto* pick = best(at);
    if (!pick) break;
    const size_t end = std::min(endFrom(pick->second, at), at + kMaxPinBlocks);
    plan.push_back(PinPlan{linkTo(pick->first), at, end});
    at = end;
    while (at < chainSize && in.local[at]) ++at;
  }
  return plan;
}

kj::Promise<void> ClusterService::Impl::fetchRun(SpaceId space, std::shared_ptr<Link> link,
                                                 std::vector<Key128> keys, bool replica,
                                                 bool awaitRelease,
                                                 std::vector<std::vector<Key128>> places,
                                                 std::shared_ptr<LocalHold> hold) {
  struct Run {
    std::vector<PromoteTicket> tickets;
    std::vector<bool> finished;
    // The anchors the holder files each block under: this node files it the same.
    std::vector<std::vector<Key128>> under;
    kj::Maybe<peer::PinLease::Client> lease;
    kj::Maybe<kj::Promise<void>> released;
  };
  auto run = std::make_shared<Run>();
  if (keys.empty()) return kj::READY_NOW;
  run->under = std::move(places);
  // Seals the blocks `which` that arrived good; the others are freed.
  auto finish = [this, space, run, replica, hold](const std::vector<size_t>& which,
                                                  const std::vector<bool>& good) {
    std::vector<Key128> sealed;
    for (size_t j = 0; j < which.size(); ++j) {
      const size_t i = which[j];
      if (run->finished[i]) continue;
      run->finished[i] = true;
      const bool ok = j < good.size() && good[j];
      {
        PlaceHint hint(placeHint_, &run->under[i]);
        engine_.finishPromote(run->tickets[i], ok, /*remote=*/true, replica);
      }
      if (ok && run->tickets[i].block != kNoBlock) {
        ++stats_.remoteHitBlocks;
        stats_.remoteHitBytes += run->tickets[i].location.bytes;
        sealed.push_back(run->tickets[i].key);
      }
    }
    // Held from here, in this turn: no other allocation comes between (a fetched replica is the
    // first to go).
    if (hold) hold->add(space, sealed);
  };
  // Frees what did not arrive and lets the holder's pin go.
  auto finishAll = [this, run, finish]() {
    std::vector<size_t> all(run->tickets.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    finish(all, {});
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
      .then([this, space, link, run, keys,
             finish](capnp::Response<peer::Peer::PinResults> response) {
        run->lease = response.getLease();
        const UcxGrant grant = grantFrom(response.getGrant());
        auto blocks = response.getBlocks();
        // The answer is checked before anything changes here: the run ends at the first block
        // that does not describe the key asked for (a key, an extent or an offset not ours).
        std::vector<const Link::Region*> regions;  // each described block's holder region
        while (regions.size() < std::min<size_t>(blocks.size(), keys.size())) {
          auto b = blocks[regions.size()];
          auto key = b.getKey();
          auto region = link->regions.find(b.getExtent());
          if (key.size() != 16 ||
              std::memcmp(key.begin(), keys[regions.size()].bytes.data(), 16) != 0 ||
              region == link->regions.end() || b.getOffset() > region->second.bytes) {
            ++stats_.fetchChecksum;
            break;
          }
          regions.push_back(&region->second);
        }
        const size_t described = regions.size();
        // Fresh pinned local blocks for those (no more: a block allocated for nothing would have
        // evicted one); the run is cut where the pool has no room.
        for (size_t i = 0; i < described; ++i) {
          auto t = engine_.beginPromote(space, keys[i]);
          if (!t) {
            ++stats_.fetchFull;
            break;
          }
          run->tickets.push_back(*t);
        }
        run->finished.assign(run->tickets.size(), false);
        const bool holderPlaces = run->under.empty();
        run->under.resize(run->tickets.size());
        std::vector<UcxGet> gets;
        std::vector<size_t> which;
        std::vector<uint64_t> expected;
        const size_t n = std::min<size_t>(blocks.size(), run->tickets.size());
        for (size_t i = 0; i < n; ++i) {
          const PromoteTicket& t = run->tickets[i];
          if (t.block == kNoBlock) continue;  // indexed meanwhile: nothing to read
          auto b = blocks[i];  // key, extent and offset checked above, before allocating
          const Link::Region& region = *regions[i];
          if (b.getBytes() != t.location.bytes) {
            ++stats_.fetchChecksum;  // an answer that does not describe the block asked for
            break;
          }
          gets.push_back(UcxGet{pool_.extentBase(t.location.extent) + t.location.offset,
                                region.index, region.address + b.getOffset(), t.location.bytes,
                                grant});
          which.push_back(i);
          expected.push_back(b.getChecksum());
          // Without the chain (a drain's blocks), the place the holder gives: distinct anchors,
          // a few (an anchor's earlier ones), or none (filed under the key itself).
          auto under = b.getUnder();
          if (holderPlaces && under.size() % 16 == 0 && under.size() / 16 <= kMaxHolderAnchors) {
            std::vector<Key128> place;
            for (size_t u = 0; u < under.size(); u += 16) {
              Key128 k;
              std::memcpy(k.bytes.data(), under.begin() + u, 16);
              if (std::find(place.begin(), place.end(), k) != place.end()) {
                place.clear();
                break;
              }
              place.push_back(k);
            }
            run->under[i] = std::move(place);
          }
        }
        if (gets.empty() || !link->ucx) return kj::Promise<void>(kj::READY_NOW);
        // The run is read in pieces, all at once: each piece is checked and sealed as soon as
        // it is here, while the next are still on the wire.
        const kj::TimePoint deadline = timer_.now() + transferDeadline(gets);
        const kj::TimePoint started = timer_.now();
        kj::Vector<kj::Promise<void>> pieces;
        for (size_t p = 0; p < gets.size(); p += kPinPieceBlocks) {
          const size_t q = std::min(gets.size(), p + kPinPieceBlocks);
          std::vector<UcxGet> pg(gets.begin() + p, gets.begin() + q);
          std::vector<size_t> pw(which.begin() + p, which.begin() + q);
          std::vector<uint64_t> pe(expected.begin() + p, expected.begin() + q);
          pieces.add(
              link->ucx->get(pg, deadline)
                  .then([this, run, pw, pe, link, started, finish](std::vector<bool> ok) mutable {
                    const size_t failed = std::count(ok.begin(), ok.end(), false);
                    if (failed > 0) {
                      logWarn("fetch_transfer_failed",
                              "node=" + link->nodeId + " failed=" + std::to_string(failed) +
                                  " of=" + std::to_string(ok.size()) + " ms=" +
                                  std::to_string((timer_.now() - started) / kj::MILLISECONDS) +
                                  " endpoint_failed=" +
                                  (link->ucx && link->ucx->failed() ? "yes" : "no"));
                    }
                    std::vector<BlockLocation> verify;
                    for (size_t j = 0; j < pw.size(); ++j) {
                      if (j < ok.size() && ok[j]) verify.push_back(run->tickets[pw[j]].location);
                    }
                    return checksumsOf(std::move(verify))
                        .then([this, run, pw = std::move(pw), pe = std::move(pe), ok,
                               node = link->nodeId, finish](std::vector<uint64_t> sums) {
                          std::vector<bool> good(pw.size(), false);
                          size_t s = 0;
                          for (size_t j = 0; j < pw.size(); ++j) {
                            if (j < ok.size() && ok[j]) {
                              PromoteTicket& t = run->tickets[pw[j]];
                              good[j] = sums[s++] == pe[j];
                              if (good[j]) {
                                t.checksum = pe[j];  // the writer's, verified
                              } else {
                                ++stats_.fetchChecksum;
                                logCorrupt("fetch_checksum_mismatch", t.key, node);
                              }
                            } else {
                              ++stats_.fetchTransfer;
                            }
                          }
                          // A block after a gap is still a valid block: keep it (a
                          // later lookup may reach it once the gap is filled).
                          finish(pw, good);
                        });
                  }));
        }
        return kj::joinPromises(pieces.releaseAsArray());
      })
      .then([finishAll]() { finishAll(); },
            [this, finishAll](kj::Exception&& e) {
              countFailure(e);
              finishAll();
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
