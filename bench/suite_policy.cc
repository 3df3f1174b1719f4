// The policy suite: what each eviction policy costs the engine per eviction, against ARC (the
// default until now) doing the same work in the same run.
//
// The work: the shared trace replayed through the real Engine in process (tools/policy_sim.h: a
// lookup of each request's keys bound to a sequence, a put of the missed blocks, the sequence's
// removal) at a capacity of 6,000 blocks, where about two thirds of the blocks put evict one.
// Time per eviction: the whole replay's time over its evictions, so the policy's share of every
// call (insert on release, erase on a hit, victims when a put needs room) is counted. Each
// repetition runs every policy kPasses times, the policies in an order rotated by one each time.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "bench/harness.h"
#include "tools/json_string.h"
#include "tools/policy_sim.h"
#include "tools/replay.h"

namespace kvtier::bench {
namespace {

constexpr uint64_t kCapacity = 6000;
constexpr int kPasses = 5;  // replays a measurement (one takes ~50 ms)
constexpr EvictionKind kAnchor = EvictionKind::kArc;
constexpr EvictionKind kMeasured[] = {EvictionKind::kLru, EvictionKind::kTwoQ,
                                      EvictionKind::kS3Fifo, EvictionKind::kSieve,
                                      EvictionKind::kAdaptive};

Status run(const Options& options) {
  const char* env = std::getenv("KVTIER_TRACE");
  const std::string tracePath = env && *env ? env : KVTIER_TRACE_PATH;
  auto trace = replay::loadTrace(tracePath);
  if (!trace) return trace.error();
  std::vector<EvictionKind> kinds{kAnchor};
  kinds.insert(kinds.end(), std::begin(kMeasured), std::end(kMeasured));
  std::vector<std::vector<double>> nsPerEviction(kinds.size());
  std::vector<double> hitRate(kinds.size());
  // A warm-up round, then the repetitions.
  for (int rep = -1; rep < options.reps; ++rep) {
    for (size_t i = 0; i < kinds.size(); ++i) {
      if (gInterrupted) return unavailable("interrupted");
      const size_t k = (i + static_cast<size_t>(rep + 1)) % kinds.size();
      double s = 0;
      uint64_t evictions = 0;
      for (int pass = 0; pass < kPasses; ++pass) {
        const auto t0 = Clock::now();
        const replay::PolicyOutcome o = replay::replayThroughEngine(*trace, kCapacity, kinds[k]);
        s += secondsSince(t0);
        if (o.errors != 0) return unavailable(evictionName(kinds[k]), ": ", o.errors, " errors");
        hitRate[k] = o.hitRate();
        evictions += o.evictions;
      }
      if (rep >= 0 && evictions > 0) nsPerEviction[k].push_back(1e9 * s / double(evictions));
    }
  }
  std::vector<RatioReport> reports;
  for (size_t k = 1; k < kinds.size(); ++k) {
    const std::string name = evictionName(kinds[k]);
    // The adaptive policy is held to ARC's cost; the others are reported.
    std::optional<double> target;
    if (kinds[k] == EvictionKind::kAdaptive) target = 1.1;
    RatioReport r =
        newReport("policy_" + name + "_vs_arc",
                  name + ": engine time per eviction, shared trace at 6,000 blocks",
                  "arc: the same replay, same run", "s", /*higherIsBetter=*/false, target);
    for (size_t rep = 0; rep < nsPerEviction[k].size(); ++rep) {
      r.kvtier.perRep.push_back(nsPerEviction[k][rep] * 1e-9);
      r.anchor.perRep.push_back(nsPerEviction[0][rep] * 1e-9);
    }
    reports.push_back(std::move(r));
  }
  printTable("policy", reports, options.reps);
  NamedSeries hits;
  for (size_t k = 0; k < kinds.size(); ++k) {
    hits.emplace_back(std::string("hit_rate_") + evictionName(kinds[k]),
                      std::vector<double>{hitRate[k]});
  }
  std::printf("\n");
  printChecks(hits, 22);
  RunInfo info = runInfoOf("policy", options, {});
  std::ostringstream setup;
  setup << "\"setup\": {\"trace\": " << jsonString(tracePath)
        << ", \"capacity_blocks\": " << kCapacity << "}";
  info.extra.push_back(setup.str());
  info.extra.push_back(jsonSeriesMember("checks", hits));
  return writeReport(options, reports, {}, info);
}

}  // namespace

extern const Suite kPolicySuite{
    "policy",
    "  --suite policy  the eviction policies' cost: engine time per eviction replaying the\n"
    "                  shared trace in process, each policy vs ARC in the same run\n",
    run};

}  // namespace kvtier::bench
