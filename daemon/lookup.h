// What kvtierd's two front ends for lookups and puts share — the Cap'n Proto Space
// (daemon/server.cc) and the fast lane (daemon/lane.h): bringing a prompt's prefix into place
// before the engine answers, and waiting for room when the pools are full.
#pragma once

#include <kj/async.h>

#include <cstdint>
#include <vector>

#include "daemon/cold_service.h"
#include "daemon/remote_tier.h"
#include "daemon/tier_service.h"
#include "schemas/kvtier.capnp.h"
#include "store/engine.h"

namespace kvtier {

// Where a lookup runs: the daemon's services (borrowed; null when absent) and the asking
// session's owner, namespace and tier (0 host, 1 + d GPU d).
struct LookupSite {
  Engine& engine;
  ColdService* cold = nullptr;
  TierService* tiers = nullptr;
  RemoteTier* remote = nullptr;
  OwnerId owner = 0;
  SpaceId space = 0;
  uint8_t tier = 0;
};

// Before Engine::lookup: blocks of the prefix held only on disk come back into the pool, a GPU
// session's prefix comes to its GPU, and the blocks past the local prefix are asked of the
// cluster (`mode`). Returns the promise to wait for before answering, or nothing when the engine
// can answer now. `chain` receives the prompt's keys the plan hashed, for Engine::lookup to
// reuse. `binds`: the lookup binds a sequence (in a namespace with prefix states it then matches
// blocks alone). Errors are thrown as RPC errors (transport/rpc_codec.h).
kj::Maybe<kj::Promise<void>> prepareLookup(const LookupSite& site,
                                           const std::vector<uint32_t>& tokens,
                                           const std::vector<Key128>& keys, rpc::RemoteMode mode,
                                           std::vector<Key128>& chain, bool binds = false);

// Runs `attempt`; when it throws for want of room (GPU blocks, host blocks, snapshot ids) and a
// service can make some (demotion to the host pool, the spiller, the snapshot reservation), runs
// it again once room is made, at most ColdService::kMaxRoomWaits times. Returns the promise of the
// retries, or nothing when the first attempt succeeded; an error that cannot wait is thrown.
kj::Maybe<kj::Promise<void>> tryWithRoom(const LookupSite& site, kj::Function<void()> attempt);

}  // namespace kvtier
