#include "daemon/lookup.h"

#include "store/limits.h"
#include "transport/rpc_codec.h"

namespace kvtier {

kj::Maybe<kj::Promise<void>> prepareLookup(const LookupSite& site,
                                           const std::vector<uint32_t>& tokens,
                                           const std::vector<Key128>& keys, rpc::RemoteMode mode,
                                           std::vector<Key128>& chain, bool binds) {
  if (mode > rpc::RemoteMode::PREFETCH) {
    throwRpcError(makeError(ErrorCode::kInvalidArgument, "unknown remote mode ",
                            static_cast<uint32_t>(mode)));
  }
  // With GPU pools, every lookup brings its prefix to the session's tier: a GPU session's to its
  // GPU, a host session's to the host pool (which it can read).
  const bool moveTiers = site.tiers != nullptr;
  const bool askCluster =
      site.remote != nullptr && site.remote->active() && mode != rpc::RemoteMode::LOCAL_ONLY;
  if (!site.cold && !moveTiers && !askCluster) return nullptr;
  const auto plan = orThrow(site.engine.lookupPlan(site.space, tokens, keys, !binds));
  std::vector<Key128> cold;
  size_t blocks = 0;  // the plan's blocks (a state's chunks follow them)
  for (const auto& step : plan) {
    // The chain's keys only: a state's chunks are not part of it.
    if (!step.state) {
      chain.push_back(step.key);
      ++blocks;
    }
    if (!step.hot) cold.push_back(step.key);
  }
  kj::Vector<kj::Promise<void>> waits;
  if (askCluster) {
    const Layout& layout = site.engine.space(site.space).layout;
    const size_t bt = layout.blockTokens;
    const size_t candidates =
        keys.empty() ? std::min(tokens.size() / bt, kMaxBlocksPerLease) : keys.size();
    const bool moreBlocks = layout.hasKv() && blocks < candidates;
    // In a namespace with prefix states, a client's lookup that waits for the cluster also asks
    // it for a deeper state, once the blocks before it are here (a prefetch brings blocks only).
    const bool state = layout.hasState() && !binds && mode == rpc::RemoteMode::FETCH;
    if (moreBlocks || state) {
      auto all = orThrow(site.engine.chainKeys(site.space, tokens, keys, chain));
      kj::Promise<void> fetched =
          moreBlocks ? site.remote->fetch(site.space, all, blocks) : kj::READY_NOW;
      if (state) {
        fetched = fetched.then([remote = site.remote, space = site.space, tokens, keys,
                                all = std::move(all)]() mutable {
          return remote->fetchState(space, std::move(tokens), std::move(keys), std::move(all));
        });
      }
      if (mode == rpc::RemoteMode::FETCH) waits.add(kj::mv(fetched));
    }
  }
  if (!cold.empty()) waits.add(site.cold->promote(site.space, std::move(cold)));
  if (!waits.empty()) {
    kj::Promise<void> ready = kj::joinPromises(waits.releaseAsArray());
    if (moveTiers) {
      ready = ready.then(
          [tiers = site.tiers, space = site.space, tier = site.tier, chain]() -> kj::Promise<void> {
            KJ_IF_MAYBE (moving, tiers->bringTo(space, chain, tier)) return kj::mv(*moving);
            return kj::READY_NOW;
          });
    }
    return kj::mv(ready);
  }
  if (moveTiers && !chain.empty()) return site.tiers->bringTo(site.space, chain, site.tier);
  return nullptr;
}

namespace {

kj::Maybe<kj::Promise<void>> attemptOrWait(const LookupSite& site, kj::Function<void()> attempt,
                                           int tries) {
  KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] { attempt(); })) {
    if (tries < ColdService::kMaxRoomWaits) {
      const ErrorCode code = fromKjException(*e).code();
      kj::Maybe<kj::Promise<void>> wait = nullptr;
      if (site.tiers) wait = site.tiers->whenRetryable(code, site.tier);
      if (wait == nullptr && site.cold) wait = site.cold->whenRetryable(code);
      KJ_IF_MAYBE (w, wait) {
        return w->then([site, attempt = kj::mv(attempt), tries]() mutable -> kj::Promise<void> {
          KJ_IF_MAYBE (more, attemptOrWait(site, kj::mv(attempt), tries + 1)) return kj::mv(*more);
          return kj::READY_NOW;
        });
      }
    }
    kj::throwFatalException(kj::mv(*e));
  }
  return nullptr;
}

}  // namespace

kj::Maybe<kj::Promise<void>> tryWithRoom(const LookupSite& site, kj::Function<void()> attempt) {
  return attemptOrWait(site, kj::mv(attempt), 0);
}

}  // namespace kvtier
