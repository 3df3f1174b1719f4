// kvtier-policy-replay: a trace replayed in process through the real Engine (no daemon, no
// sockets), once per eviction policy and capacity, beside the ideal LRU and Belady's optimum of
// the same run. The request model is `kvtier replay`'s (docs/replay.md): a lookup of the request's
// keys bound to a sequence, a put of the missed blocks after the hit with their keys, the
// sequence's removal; one trace block is one 1 KiB block of replayLayout(). So the hit counts are
// the daemon's for the same policy (docs/cache-policy.md compares them), and a policy can be
// measured on every workload in seconds.
//
//   kvtier-policy-replay [--trace FILE | --synthetic KIND [--seed N]] [--capacity C[,C...]]
//                        [--eviction P[,P...]] [--limit N] [--no-opt]
//
// One line of JSON a (workload, capacity, policy): hit rate, the ideal LRU's and the optimum's,
// the share of the LRU->optimum gap closed, evictions, the policy that ordered the blocks at the
// end and the adaptive policy's changes of expert, and the engine's time per lookup and per
// request (the policy's share of the control path: lookups pin and unpin, puts evict and insert).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "store/eviction.h"
#include "tools/cli_numbers.h"
#include "tools/policy_sim.h"
#include "tools/replay.h"
#include "tools/synthetic_trace.h"

namespace kvtier {
namespace {

using replay::TraceRequest;
std::vector<std::string> splitList(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const size_t comma = s.find(',');
    out.emplace_back(s.substr(0, comma));
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return out;
}

int usage() {
  std::fprintf(stderr,
               "usage: kvtier-policy-replay [--trace FILE | --synthetic KIND [--seed N]] "
               "[--capacity C[,C...]] [--eviction P[,P...]] [--limit N] [--no-opt]\n");
  return 2;
}

int run(int argc, char** argv) {
  std::string tracePath, workload;
  std::string synthetic;
  uint64_t seed = 1;
  size_t limit = 0;
  bool opt = true;
  std::vector<uint64_t> capacities{1000, 6000, 20000};
  std::vector<EvictionKind> kinds{EvictionKind::kLru,   EvictionKind::kArc,
                                  EvictionKind::kTwoQ,  EvictionKind::kS3Fifo,
                                  EvictionKind::kSieve, EvictionKind::kAdaptive};
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool more = i + 1 < argc;
    if (a == "--trace" && more) {
      tracePath = argv[++i];
    } else if (a == "--synthetic" && more) {
      synthetic = argv[++i];
    } else if (a == "--seed" && more) {
      seed = cli::countOrThrow(argv[++i], a);
    } else if (a == "--limit" && more) {
      limit = cli::countOrThrow(argv[++i], a);
    } else if (a == "--no-opt") {
      opt = false;
    } else if (a == "--capacity" && more) {
      capacities.clear();
      for (const std::string& c : splitList(argv[++i]))
        capacities.push_back(cli::countOrThrow(c, a, 1));
    } else if (a == "--eviction" && more) {
      kinds.clear();
      for (const std::string& name : splitList(argv[++i])) {
        auto k = parseEvictionKind(name);
        if (!k.ok()) {
          std::fprintf(stderr, "%s\n", k.error().toString().c_str());
          return 2;
        }
        kinds.push_back(*k);
      }
    } else {
      return usage();
    }
  }
  std::vector<TraceRequest> trace;
  if (!synthetic.empty()) {
    auto k = replay::parseSyntheticKind(synthetic);
    if (!k.ok()) {
      std::fprintf(stderr, "%s\n", k.error().toString().c_str());
      return 2;
    }
    trace = replay::syntheticTrace(*k, seed);
    if (limit > 0 && trace.size() > limit) trace.resize(limit);
    workload = synthetic + (seed != 1 ? "/seed" + std::to_string(seed) : "");
  } else if (!tracePath.empty()) {
    auto t = replay::loadTrace(tracePath, limit);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.error().toString().c_str());
      return 1;
    }
    trace = std::move(*t);
    workload = "trace";
  } else {
    return usage();
  }
  std::unique_ptr<replay::OfflineOptimum> optimum;
  if (opt) optimum = std::make_unique<replay::OfflineOptimum>(trace);
  for (uint64_t capacity : capacities) {
    replay::LruCache lru(capacity);
    uint64_t blocks = 0, lruHits = 0;
    for (const TraceRequest& r : trace) {
      lruHits += lru.access(r.hashIds);
      blocks += r.hashIds.size();
    }
    const uint64_t optHits = optimum ? optimum->hitBlocks(capacity) : 0;
    for (EvictionKind kind : kinds) {
      const replay::PolicyOutcome o = replay::replayThroughEngine(trace, capacity, kind);
      const double rate = double(o.hits) / double(std::max<uint64_t>(1, o.blocks));
      const double lruRate = double(lruHits) / double(std::max<uint64_t>(1, blocks));
      const double optRate = double(optHits) / double(std::max<uint64_t>(1, blocks));
      const double gap = optHits > lruHits
                             ? (double(o.hits) - double(lruHits)) / double(optHits - lruHits)
                             : std::nan("");
      std::printf(
          "{\"workload\":\"%s\",\"capacity\":%llu,\"eviction\":\"%s\",\"hit_rate\":%.5f,"
          "\"ideal_lru_hit_rate\":%.5f,\"opt_hit_rate\":%.5f,\"gap_closed\":%.4f,"
          "\"hit_blocks\":%llu,\"blocks\":%llu,\"evictions\":%llu,\"errors\":%llu,"
          "\"following\":\"%s\",\"switches\":%llu,\"lookup_ns\":%.0f,\"request_ns\":%.0f}\n",
          workload.c_str(), static_cast<unsigned long long>(capacity), evictionName(kind), rate,
          lruRate, optimum ? optRate : std::nan(""), optimum ? gap : std::nan(""),
          static_cast<unsigned long long>(o.hits), static_cast<unsigned long long>(o.blocks),
          static_cast<unsigned long long>(o.evictions), static_cast<unsigned long long>(o.errors),
          o.following.c_str(), static_cast<unsigned long long>(o.switches), o.lookupNs,
          o.requestNs);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) {
  try {
    return kvtier::run(argc, argv);
  } catch (const std::invalid_argument& e) {  // a bad number (cli::countOrThrow)
    std::fprintf(stderr, "kvtier-policy-replay: %s\n", e.what());
    return kvtier::usage();
  }
}
