// The scale-cluster suite: what a remote lookup costs the cluster's directory at 3 to 1,024
// members, measured in one process with the directory's real placement code (no sockets: the
// messages a lookup would send are counted).
//
//   kvtier-bench --suite scale-cluster [--json FILE] [--trace FILE]
//
// The model. A trace (Mooncake's format; by default the shared synthetic trace, then kvtier's
// synthetic workloads) is replayed against N virtual members. Each request goes to a member
// picked at random (a load balancer that knows nothing of prefixes); its prompt is expanded to
// kvtier's 16-token blocks (a 512-token trace block is 32 of them), each with a key unique to its
// prefix. The member matches the longest prefix it holds itself; the rest is a remote lookup: the
// directory is asked who holds it, the holders are pinned, and the blocks fetched; then the
// member holds the whole prompt. Members keep everything (no eviction: the directory's worst case
// in entries, and every holder of a block holds its whole prefix). What a home answers is the
// truth of who holds what (publishing is not modelled: it runs behind lookups, in batches).
//
// Two directories are measured with the same requests:
// - "per-key rendezvous" (the cluster's directory until now): every key has its own home, the
//   member with the highest rendezvous score (directory.h: homeOf); a lookup asks every distinct
//   home of its remaining keys at once, then pins each run of blocks on the holder that covers it
//   longest (the walk of daemon/cluster/fetch.cc);
// - "anchored ring": keys are filed by segment — the 64 blocks (1,024 tokens) after an anchor,
//   the key at a multiple of 64 — at the anchor's home on a consistent-hash ring (hash_ring.h), so
//   a home knows whole runs of a prefix; each holder also files, at the home of every anchor it
//   holds, the deeper anchors it holds along that chain. A lookup asks one home — the anchor's of
//   its first missing block — with its remaining anchors; the answer names the deepest anchor
//   anyone holds and its holders; the lookup pins its whole remaining chain on up to two of them
//   (a holder pins the longest prefix it has). Hot anchors are spread over `replicas` homes (the
//   next members on the ring), an asker picking one by its own id.
//
// Per run: round trips (sequential: a directory query, then the pins) and messages (queries +
// pins, one pin per holder asked) per remote lookup, the messages of a fresh prompt's miss, the
// directory queries each member answers (max over mean), the directory entries each member keeps
// (max over mean), the entries re-homed when a member joins against the ideal 1/(N+1) share, and
// the CPU of placement per lookup (finding the homes to ask).
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "bench/harness.h"
#include "daemon/cluster/directory.h"
#include "daemon/cluster/hash_ring.h"
#include "tools/replay.h"
#include "tools/synthetic_trace.h"

namespace kvtier::bench {
namespace {

constexpr size_t kBlocksPerTraceBlock = 32;  // 512-token trace blocks, 16-token kvtier blocks
constexpr size_t kAnchorBlocks = 64;         // a segment: 1,024 tokens
constexpr size_t kMaxChainKeys = 4096;       // what one lookup asks the cluster for (fetch.cc)
constexpr size_t kMaxPinBlocks = 1024;       // one pin's run under per-key rendezvous (fetch.cc)
constexpr size_t kMaxHolders = HomeDirectory::kMaxHoldersPerKey;
constexpr size_t kPlacementSamples = 200;    // remote lookups whose placement is timed
constexpr uint32_t kHotQueries = 4;     // queries after which an anchor is hot
constexpr size_t kAnchorReplicas = 3;   // homes of an anchor's entries (ring successors)

uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A block's key as the directory names it (a 64-bit id unique to its prefix, widened).
DirKey dirKey(uint64_t id) {
  DirKey k;
  const uint64_t a = mix(id), b = mix(id ^ 0x5851f42d4c957f2dull);
  std::memcpy(k.key.bytes.data(), &a, 8);
  std::memcpy(k.key.bytes.data() + 8, &b, 8);
  return k;
}

// A prompt's block ids: a trace block's hash id names its whole prefix, so (id, 0..31) does too.
std::vector<uint64_t> blockIds(const replay::TraceRequest& r) {
  std::vector<uint64_t> out;
  const size_t blocks = std::min(r.hashIds.size() * kBlocksPerTraceBlock,
                                 std::max<size_t>(1, r.inputLength / 16));
  out.reserve(blocks);
  for (size_t i = 0; i < blocks && i < kMaxChainKeys; ++i)
    out.push_back((r.hashIds[i / kBlocksPerTraceBlock] << 5) | (i % kBlocksPerTraceBlock));
  return out;
}

enum class Design { kPerKey, kAnchored };

struct RunResult {
  std::string workload, design;
  size_t members = 0, replicas = 1;
  uint64_t lookups = 0, remoteLookups = 0, freshMisses = 0, remoteMisses = 0;
  double roundTrips = 0, messages = 0, freshMissMessages = 0, remoteMissMessages = 0;  // means
  uint64_t maxRoundTrips = 0, maxMessages = 0, maxFreshMissMessages = 0;
  uint64_t pinPieces = 0;                 // per-key: pins of kPinPieceBlocks pieces, as sent today
  uint64_t remoteHitBlocks = 0, localHitBlocks = 0, blocks = 0;
  double maxMeanQueries = 0, maxMeanEntries = 0, rehomedVsIdeal = 0, placementUs = 0;
  double seconds = 0;
};

class Model {
 public:
  Model(Design design, size_t n, size_t replicas, bool leastLoaded)
      : design_(design), replicas_(replicas), leastLoaded_(leastLoaded) {
    for (size_t i = 0; i < n; ++i) {
      char id[32];
      std::snprintf(id, sizeof id, "node-%04zu", i);
      ids_.push_back(id);
    }
    std::sort(ids_.begin(), ids_.end());
    ring_ = HashRing(ids_);
    held_.resize(n);
    queries_.assign(n, 0);
  }

  void request(size_t index, const std::vector<uint64_t>& ids, RunResult& r) {
    const uint32_t asker = uint32_t(mix(index + 0x9e37) % ids_.size());
    auto& mine = held_[asker];
    size_t m = 0;
    while (m < ids.size() && mine.count(ids[m])) ++m;
    ++r.lookups;
    r.blocks += ids.size();
    r.localHitBlocks += m;
    if (m < ids.size() && ids_.size() > 1) {
      Lookup l = design_ == Design::kPerKey ? perKey(asker, ids, m) : anchored(asker, ids, m);
      ++r.remoteLookups;
      r.roundTrips += l.roundTrips;
      r.messages += l.messages;
      r.maxRoundTrips = std::max(r.maxRoundTrips, l.roundTrips);
      r.maxMessages = std::max(r.maxMessages, l.messages);
      r.pinPieces += l.pinPieces;
      r.remoteHitBlocks += l.hit;
      if (m == 0 && othersHold(asker, ids[0]) == 0) {  // a prompt nobody has cached
        ++r.freshMisses;
        r.freshMissMessages += l.messages;
        r.maxFreshMissMessages = std::max(r.maxFreshMissMessages, l.messages);
      }
      if (l.hit == 0) {  // any lookup that found nothing remote
        ++r.remoteMisses;
        r.remoteMissMessages += l.messages;
      }
      if (timed_ < kPlacementSamples) {
        ++timed_;
        placementNs_ += timePlacement(asker, ids, m);
      }
    }
    // The member now holds the whole prompt (fetched or computed).
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!mine.insert(ids[i]).second) continue;
      auto& h = holders_[ids[i]];
      if (h.size() >= kMaxHolders) h.erase(h.begin());
      h.push_back(asker);
      if (i % kAnchorBlocks == 0) {
        auto [it, fresh] = ancestors_.try_emplace(ids[i]);
        if (fresh)
          for (size_t a = 0; a < i; a += kAnchorBlocks) it->second.push_back(ids[a]);
      }
      anchorOf_.try_emplace(ids[i], ids[i - i % kAnchorBlocks]);
    }
  }

  void finish(RunResult& r) {
    const size_t n = ids_.size();
    if (r.remoteLookups) {
      r.roundTrips /= double(r.remoteLookups);
      r.messages /= double(r.remoteLookups);
    }
    if (r.freshMisses) r.freshMissMessages /= double(r.freshMisses);
  if (r.remoteMisses) r.remoteMissMessages /= double(r.remoteMisses);
    const double meanQ = double(std::accumulate(queries_.begin(), queries_.end(), uint64_t{0})) / n;
    r.maxMeanQueries =
        meanQ > 0 ? double(*std::max_element(queries_.begin(), queries_.end())) / meanQ : 0;
    r.placementUs = timed_ ? placementNs_ / 1e3 / double(timed_) : 0;
    // Entries per member, and what a joining member takes of them.
    std::vector<uint64_t> entries(n, 0);
    std::vector<std::string> joined = ids_;
    joined.push_back("node-joining");
    const HashRing ringJoined(joined);
    uint64_t total = 0, moved = 0, sampled = 0, sampledMoved = 0;
    size_t k = 0;
    for (const auto& [id, h] : holders_) {
      const uint64_t w = h.size();
      const bool sample = (k++ % rehomeSampleEvery()) == 0;
      if (design_ == Design::kPerKey) {
        const DirKey key = dirKey(id);
        entries[homeIndex(homeOf(key, ids_))] += w;
        if (sample) {
          sampled += w;
          sampledMoved += homeOf(key, joined) == "node-joining" ? w : 0;
        }
      } else {
        const uint64_t anchor = anchorOf_.at(id);
        for (size_t rep : ring_.homes(mix(anchor), replicas_)) entries[rep] += w;
        moved += joinedTakes(ringJoined, anchor) * w;
      }
      total += w;
    }
    if (design_ == Design::kAnchored) {
      // Deeper anchors filed at the homes of their ancestors' anchors.
      for (const auto& [anchor, up] : ancestors_) {
        const uint64_t w = holders_.at(anchor).size();
        for (uint64_t a : up) {
          if (hot_.count(a)) continue;  // a hot anchor's home keeps no descendants
          for (size_t rep : ring_.homes(mix(a), replicas_)) entries[rep] += w;
          moved += joinedTakes(ringJoined, a) * w;
          total += w;
        }
      }
      total *= replicas_;
      r.rehomedVsIdeal = double(moved) / (double(total) / double(n + 1));
    } else {
      r.rehomedVsIdeal = sampled ? double(sampledMoved) / (double(sampled) / double(n + 1)) : 0;
    }
    const double meanE = double(std::accumulate(entries.begin(), entries.end(), uint64_t{0})) / n;
    r.maxMeanEntries =
        meanE > 0 ? double(*std::max_element(entries.begin(), entries.end())) / meanE : 0;
  }

 private:
  struct Lookup {
    uint64_t roundTrips = 0, messages = 0, pinPieces = 0, hit = 0;
  };

  size_t homeIndex(const std::string& id) const {
    return size_t(std::lower_bound(ids_.begin(), ids_.end(), id) - ids_.begin());
  }
  // Per-key homes are O(N) to compute: cached per key (the CPU is timed separately).
  uint32_t perKeyHome(uint64_t id) {
    auto it = perKeyHomes_.find(id);
    if (it != perKeyHomes_.end()) return it->second;
    const uint32_t h = uint32_t(homeIndex(homeOf(dirKey(id), ids_)));
    perKeyHomes_.emplace(id, h);
    return h;
  }
  size_t rehomeSampleEvery() const { return ids_.size() >= 128 ? 16 : 1; }
  // How many of an anchor's replica homes the joining member takes over.
  uint64_t joinedTakes(const HashRing& joined, uint64_t anchor) const {
    uint64_t t = 0;
    for (size_t rep : joined.homes(mix(anchor), replicas_))
      t += joined.members()[rep] == "node-joining";
    return t;
  }
  size_t othersHold(uint32_t asker, uint64_t id) const {
    auto it = holders_.find(id);
    if (it == holders_.end()) return 0;
    return it->second.size() - std::count(it->second.begin(), it->second.end(), asker);
  }
  bool holds(uint32_t member, uint64_t id) const { return held_[member].count(id) != 0; }
  size_t runOn(uint32_t holder, const std::vector<uint64_t>& ids, size_t from, size_t most) const {
    size_t j = from;
    while (j < ids.size() && j - from < most && holds(holder, ids[j])) ++j;
    return j - from;
  }

  // Today's walk: ask every distinct home of the remaining keys, then pin runs.
  Lookup perKey(uint32_t asker, const std::vector<uint64_t>& ids, size_t m) {
    Lookup l;
    std::unordered_set<uint32_t> homes;
    for (size_t i = m; i < ids.size(); ++i) homes.insert(perKeyHome(ids[i]));
    for (uint32_t h : homes) {
      if (h == asker) continue;
      ++queries_[h];
      ++l.messages;
    }
    if (l.messages) l.roundTrips = 1;
    size_t i = m;
    uint64_t pins = 0;
    while (i < ids.size()) {
      auto it = holders_.find(ids[i]);
      size_t bestLen = 0;  // the holder that covers the longest stretch from here
      if (it != holders_.end()) {
        for (uint32_t h : it->second) {
          if (h != asker) bestLen = std::max(bestLen, runOn(h, ids, i, kMaxPinBlocks));
        }
      }
      if (bestLen == 0) break;
      ++pins;
      l.pinPieces += (bestLen + 7) / 8;
      i += bestLen;
    }
    l.messages += pins;
    if (pins) ++l.roundTrips;
    l.hit = i - m;
    return l;
  }

  // The anchored ring: one home, then the deepest anchor's holders. A hot anchor — one its home
  // has answered kHotQueries times — is known to every member with its newest holders (a short
  // list, spread as membership is); a lookup whose miss starts in a hot segment asks the home of
  // its first anchor that is not hot instead, and falls back to the hot anchor's holders.
  Lookup anchored(uint32_t asker, const std::vector<uint64_t>& ids, size_t m) {
    Lookup l;
    const size_t last = (ids.size() - 1) / kAnchorBlocks;
    size_t seg = m / kAnchorBlocks;
    std::vector<uint32_t> hotHolders;
    while (seg < last && hot_.count(ids[seg * kAnchorBlocks])) {
      hotHolders = othersOf(asker, ids[seg * kAnchorBlocks]);
      ++seg;
    }
    std::vector<uint32_t> candidates;
    const uint64_t anchor = ids[seg * kAnchorBlocks];
    if (!hot_.count(anchor)) {
      const auto reps = ring_.homes(mix(anchor), replicas_);
      size_t home = reps[mix(asker ^ anchor) % reps.size()];
      if (leastLoaded_) {
        for (size_t r : reps)
          if (queries_[r] < queries_[home]) home = r;
      }
      if (home != asker) {
        ++queries_[home];
        ++l.messages;
        l.roundTrips = 1;
      }
      if (++anchorQueries_[anchor] >= kHotQueries) hot_.insert(anchor);
      // The deepest probe the home can answer for: the asker's later anchors, then the keys
      // of its segment.
      for (size_t a = last; a > seg && candidates.empty(); --a)
        candidates = othersOf(asker, ids[a * kAnchorBlocks]);
      const size_t segEnd = std::min(ids.size(), (seg + 1) * kAnchorBlocks);
      const size_t segBegin = std::max(m, seg * kAnchorBlocks);
      for (size_t j = segEnd; j > segBegin && candidates.empty(); --j)
        candidates = othersOf(asker, ids[j - 1]);
    } else {
      hotHolders = othersOf(asker, anchor);
    }
    if (candidates.empty()) candidates = hotHolders;
    if (candidates.empty()) return l;  // a miss: nobody holds the first missing block
    size_t best = 0;
    const size_t pins = std::min<size_t>(2, candidates.size());
    for (size_t c = 0; c < pins; ++c)  // the newest holders
      best = std::max(best, runOn(candidates[candidates.size() - 1 - c], ids, m, kMaxChainKeys));
    l.messages += pins;
    ++l.roundTrips;
    l.hit = best;
    return l;
  }

  std::vector<uint32_t> othersOf(uint32_t asker, uint64_t id) const {
    std::vector<uint32_t> out;
    auto it = holders_.find(id);
    if (it == holders_.end()) return out;
    for (uint32_t h : it->second)
      if (h != asker) out.push_back(h);
    return out;
  }

  // The placement work of one lookup, uncached: the homes it asks.
  double timePlacement(uint32_t asker, const std::vector<uint64_t>& ids, size_t m) {
    const auto t0 = Clock::now();
    uint64_t sink = asker;
    if (design_ == Design::kPerKey) {
      for (size_t i = m; i < ids.size(); ++i) sink += homeOf(dirKey(ids[i]), ids_).size();
    } else {
      const uint64_t anchor = ids[(m / kAnchorBlocks) * kAnchorBlocks];
      for (size_t h : ring_.homes(mix(anchor), replicas_)) sink += h;
    }
    const double ns = seconds(t0, Clock::now()) * 1e9;
    sinkTotal_ += sink;
    return ns;
  }

  Design design_;
  size_t replicas_;
  bool leastLoaded_;
  std::unordered_map<uint64_t, uint32_t> anchorQueries_;
  std::unordered_set<uint64_t> hot_;
  std::vector<std::string> ids_;
  HashRing ring_;
  std::vector<std::unordered_set<uint64_t>> held_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> holders_;
  std::unordered_map<uint64_t, uint64_t> anchorOf_;                 // key -> its segment's anchor
  std::unordered_map<uint64_t, std::vector<uint64_t>> ancestors_;  // anchor -> earlier anchors
  std::unordered_map<uint64_t, uint32_t> perKeyHomes_;
  std::vector<uint64_t> queries_;
  uint64_t timed_ = 0;
  double placementNs_ = 0;
  uint64_t sinkTotal_ = 0;
};

RunResult runOne(const std::string& workload, const std::vector<std::vector<uint64_t>>& prompts,
                 Design design, size_t n, size_t replicas, bool leastLoaded = false) {
  const auto t0 = Clock::now();
  RunResult r;
  r.workload = workload;
  r.design = design == Design::kPerKey ? "per-key rendezvous"
             : leastLoaded                ? "anchored, least loaded"
                                          : "anchored, any replica";
  r.members = n;
  r.replicas = replicas;
  Model model(design, n, replicas, leastLoaded);
  for (size_t i = 0; i < prompts.size() && !gInterrupted; ++i) model.request(i, prompts[i], r);
  model.finish(r);
  r.seconds = secondsSince(t0);
  return r;
}

std::string runJson(const RunResult& r) {
  char buf[1024];
  std::snprintf(
      buf, sizeof buf,
      "{\"workload\": \"%s\", \"design\": \"%s\", \"members\": %zu, \"replicas\": %zu, "
      "\"lookups\": %" PRIu64 ", \"remote_lookups\": %" PRIu64
      ", \"round_trips_per_lookup\": %.3f, \"max_round_trips\": %" PRIu64
      ", \"messages_per_lookup\": %.3f, \"max_messages\": %" PRIu64
      ", \"fresh_misses\": %" PRIu64 ", \"fresh_miss_messages\": %.3f"
      ", \"max_fresh_miss_messages\": %" PRIu64 ", \"remote_misses\": %" PRIu64
      ", \"remote_miss_messages\": %.3f, \"max_mean_queries\": %.3f"
      ", \"max_mean_entries\": %.3f, \"rehomed_vs_ideal\": %.3f"
      ", \"placement_us_per_lookup\": %.2f, \"pin_pieces_per_lookup\": %.2f"
      ", \"remote_hit_blocks\": %" PRIu64 ", \"local_hit_blocks\": %" PRIu64
      ", \"blocks\": %" PRIu64 ", \"seconds\": %.1f}",
      r.workload.c_str(), r.design.c_str(), r.members, r.replicas, r.lookups, r.remoteLookups,
      r.roundTrips, r.maxRoundTrips, r.messages, r.maxMessages, r.freshMisses,
      r.freshMissMessages, r.maxFreshMissMessages, r.remoteMisses, r.remoteMissMessages,
      r.maxMeanQueries, r.maxMeanEntries,
      r.rehomedVsIdeal, r.placementUs,
      r.remoteLookups ? double(r.pinPieces) / double(r.remoteLookups) : 0.0, r.remoteHitBlocks,
      r.localHitBlocks, r.blocks, r.seconds);
  return buf;
}

void printRun(const RunResult& r) {
  std::printf("%-14s %-24s %5zu %3zu %7.2f %3" PRIu64 " %8.2f %5" PRIu64 " %6.2f %6.2f %6.2f %6.2f %9.2f %10" PRIu64
              "\n",
              r.workload.c_str(), r.design.c_str(), r.members, r.replicas, r.roundTrips,
              r.maxRoundTrips, r.messages, r.maxMessages, r.freshMissMessages, r.maxMeanQueries,
              r.maxMeanEntries, r.rehomedVsIdeal, r.placementUs, r.remoteHitBlocks);
  std::fflush(stdout);
}

Status runScaleCluster(const Options& options) {
  const char* env = std::getenv("KVTIER_TRACE");
  const std::string tracePath = env && *env ? env : KVTIER_TRACE_PATH;
  std::vector<std::pair<std::string, std::vector<std::vector<uint64_t>>>> workloads;
  {
    auto trace = replay::loadTrace(tracePath);
    if (!trace) return trace.error();
    std::vector<std::vector<uint64_t>> prompts;
    for (const auto& r : *trace) prompts.push_back(blockIds(r));
    workloads.emplace_back("mooncake", std::move(prompts));
  }
  for (auto kind : {replay::SyntheticKind::kSharedPrompts, replay::SyntheticKind::kScan,
                    replay::SyntheticKind::kAgents}) {
    std::vector<std::vector<uint64_t>> prompts;
    for (const auto& r : replay::syntheticTrace(kind)) prompts.push_back(blockIds(r));
    workloads.emplace_back(replay::syntheticName(kind), std::move(prompts));
  }
  std::printf("scale-cluster: the directory at N members, one process (trace %s)\n",
              tracePath.c_str());
  std::printf("%-14s %-24s %5s %3s %7s %3s %8s %5s %6s %6s %6s %6s %9s %10s\n", "workload",
              "design", "N", "rep", "RTT", "max", "messages", "max", "fresh", "q max",
              "e max", "rehome", "place us", "remote hit");
  std::vector<RunResult> runs, before;
  const size_t sizes[] = {3, 16, 128, 1024};
  for (const auto& [name, prompts] : workloads) {
    for (size_t n : sizes) {
      if (gInterrupted) return makeError(ErrorCode::kUnavailable, "interrupted");
      // The synthetic workloads at the extremes only: they check the design holds elsewhere.
      if (name != "mooncake" && n != 16 && n != 1024) continue;
      before.push_back(runOne(name, prompts, Design::kPerKey, n, 1));
      printRun(before.back());
      runs.push_back(runOne(name, prompts, Design::kAnchored, n, kAnchorReplicas));
      printRun(runs.back());
      runs.push_back(runOne(name, prompts, Design::kAnchored, n, kAnchorReplicas, true));
      printRun(runs.back());
    }
  }
  if (!options.json.empty()) {
    std::ofstream out(options.json);
    out << "{\"suite\": \"scale-cluster\", \"trace\": \"" << tracePath << "\",\n \"runs\": [\n";
    for (size_t i = 0; i < runs.size(); ++i)
      out << "  " << runJson(runs[i]) << (i + 1 < runs.size() ? ",\n" : "\n");
    out << " ],\n \"before\": [\n";
    for (size_t i = 0; i < before.size(); ++i)
      out << "  " << runJson(before[i]) << (i + 1 < before.size() ? ",\n" : "\n");
    out << " ]}\n";
    if (!out) return makeError(ErrorCode::kUnavailable, "cannot write ", options.json);
  }
  return {};
}

}  // namespace

extern const Suite kScaleClusterSuite = {
    "scale-cluster",
    "  scale-cluster   the cluster directory at 3..1,024 members in one process: round trips,\n"
    "                  messages, load per member, re-homing and placement CPU per lookup\n",
    runScaleCluster};

}  // namespace kvtier::bench
