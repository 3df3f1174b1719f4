#include "tools/policy_sim.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kvtier/block_key.h"
#include "store/block_pool.h"
#include "store/engine.h"

namespace kvtier::replay {
namespace {

using Clock = std::chrono::steady_clock;

double nsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

std::string percent(double rate) {
  char s[32];
  std::snprintf(s, sizeof s, "%.3f%%", 100 * rate);
  return s;
}

std::string withCommas(uint64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

}  // namespace

PolicyOutcome replayThroughEngine(std::span<const TraceRequest> trace, uint64_t capacity,
                                  EvictionKind kind) {
  const Layout layout = replayLayout();
  BlockPool pool({{0, capacity * layout.blockBytes()}});
  HeapBlockMemory memory(pool.extents());
  Engine engine(pool, memory, makeEvictionPolicy(kind));
  PolicyOutcome out;
  auto space = engine.openSpace(layout, saltFor("policy-replay"));
  if (!space.ok()) {
    out.errors = 1;
    return out;
  }
  const uint32_t bt = layout.blockTokens;
  std::vector<Key128> keys;
  std::vector<uint32_t> tokens;
  double lookupNs = 0, requestNs = 0;
  for (const TraceRequest& req : trace) {
    const size_t blocks = req.hashIds.size();
    keys.resize(blocks);
    for (size_t b = 0; b < blocks; ++b) keys[b] = blockKey(req.hashIds[b]);
    const Clock::time_point t0 = Clock::now();
    size_t hit = 0;
    auto found = engine.lookup(1, *space, {}, keys, "req", {});
    lookupNs += nsSince(t0);
    if (!found.ok()) {
      ++out.errors;
    } else {
      hit = found->blocks.size();
      if (found->lease != 0 && !engine.releaseRead(found->lease).ok()) ++out.errors;
    }
    if (hit < blocks) {
      tokens.assign((blocks - hit) * bt, 0);
      for (size_t b = hit; b < blocks; ++b) {
        std::fill_n(tokens.begin() + static_cast<std::ptrdiff_t>((b - hit) * bt), bt,
                    static_cast<uint32_t>(req.hashIds[b]));
      }
      auto g = engine.put(1, *space, "req", hit * bt, tokens,
                          std::span<const Key128>(keys).subspan(hit), {});
      if (!g.ok() || !engine.commit(g->lease, kEnd).ok()) ++out.errors;
    }
    if (!engine.remove(*space, "req", 0, kEnd).ok()) ++out.errors;
    requestNs += nsSince(t0);
    out.blocks += blocks;
    out.hits += hit;
  }
  const EngineStats stats = engine.stats();
  out.evictions = stats.evictions;
  out.following = stats.evictionFollowing;
  out.switches = stats.evictionSwitches;
  out.lookupNs = trace.empty() ? 0 : lookupNs / double(trace.size());
  out.requestNs = trace.empty() ? 0 : requestNs / double(trace.size());
  return out;
}

std::string policyTable(std::string_view workload, std::span<const TraceRequest> trace,
                        std::span<const uint64_t> capacities, std::span<const EvictionKind> kinds,
                        uint64_t& errors) {
  uint64_t blocks = 0;
  for (const TraceRequest& r : trace) blocks += r.hashIds.size();
  std::string out = "policies through the engine in process, " + std::string(workload) + ": " +
                    withCommas(trace.size()) + " requests, " + withCommas(blocks) +
                    " blocks; hit blocks / blocks\n\n| capacity | ideal LRU |";
  std::string rule = "|---|---|";
  // With the default among them, "best" is the best of the others: what the default is judged by.
  const bool withDefault =
      kinds.size() > 1 && std::find(kinds.begin(), kinds.end(), kDefaultEviction) != kinds.end();
  for (EvictionKind k : kinds) {
    out += std::string(" ") + evictionName(k) + (k == kDefaultEviction ? " (default)" : "") + " |";
    rule += "---|";
  }
  out += withDefault ? " best other | default − best other |\n" : " best | default − best |\n";
  out += rule + "---|---|\n";
  for (uint64_t capacity : capacities) {
    LruCache lru(capacity);
    uint64_t lruHits = 0;
    for (const TraceRequest& r : trace) lruHits += lru.access(r.hashIds);
    out +=
        "| " + withCommas(capacity) + " | " + percent(blocks ? double(lruHits) / blocks : 0) + " |";
    double best = -1, byDefault = -1;
    const char* bestName = "";
    for (EvictionKind k : kinds) {
      const PolicyOutcome o = replayThroughEngine(trace, capacity, k);
      errors += o.errors;
      out += " " + percent(o.hitRate()) + " |";
      if (o.hitRate() > best && (k != kDefaultEviction || !withDefault)) {
        best = o.hitRate();
        bestName = evictionName(k);
      }
      if (k == kDefaultEviction) byDefault = o.hitRate();
    }
    char tail[64];
    if (byDefault >= 0) {
      std::snprintf(tail, sizeof tail, " %s | %+.3f pp |\n", bestName, 100 * (byDefault - best));
    } else {
      std::snprintf(tail, sizeof tail, " %s | (not run) |\n", bestName);
    }
    out += tail;
  }
  return out;
}

}  // namespace kvtier::replay
