// Eviction policies compared in process: a trace replayed through the real Engine (no daemon, no
// sockets) once per policy and capacity, with `kvtier replay`'s request model (docs/replay.md): a
// lookup of the request's keys bound to a sequence, a put of the missed blocks after the hit with
// their keys, the sequence's removal; one trace block is one 1 KiB block of replayLayout(). The
// hit counts are a daemon's with the same policy and pool, in seconds instead of minutes.
// Used by `kvtier replay --policies` and kvtier-policy-replay.
//
// Not thread-safe (each call builds its own engine).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "store/eviction.h"
#include "tools/replay.h"

namespace kvtier::replay {

struct PolicyOutcome {
  uint64_t blocks = 0, hits = 0, evictions = 0, errors = 0;
  // At the end: the policy that ordered the blocks (the adaptive policy's expert then), and how
  // many times the adaptive policy changed expert.
  std::string following;
  uint64_t switches = 0;
  double lookupNs = 0, requestNs = 0;  // means per request: the engine's control path
  double hitRate() const { return blocks ? double(hits) / double(blocks) : 0; }
};

// `trace` through an Engine whose pool holds `capacity` blocks, evicting with `kind`.
PolicyOutcome replayThroughEngine(std::span<const TraceRequest> trace, uint64_t capacity,
                                  EvictionKind kind);

// A Markdown table of every policy of `kinds` at each capacity (rows), beside the ideal LRU of
// the same trace, the best policy and the default's distance to it. `errors` gets the engine's
// errors summed (0 expected).
std::string policyTable(std::string_view workload, std::span<const TraceRequest> trace,
                        std::span<const uint64_t> capacities, std::span<const EvictionKind> kinds,
                        uint64_t& errors);

}  // namespace kvtier::replay
