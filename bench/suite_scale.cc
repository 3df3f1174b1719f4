// kvtier-bench --suite scale: the daemon's metadata at scale. Three kvtierd hold 10 k, 1 M and
// 10 M cached blocks of a tiny layout (one layer, one KV head of dimension 1, fp16: 64-byte
// blocks, so 10 M of them take a 640 MB pool), indexed by puts of 1,000-block prompts whose
// sequences are then removed (the blocks stay cached, evictable). Every daemon's pool holds
// its blocks and a few more, so that a later put evicts. KVTIER_SCALE_BLOCKS sets the largest size
// (at least 20,000; default 10,000,000) for a quick run; the middle one is a tenth of it.
// KVTIER_SCALE_COLD=0 leaves out the cold-tier daemon below.
//
// Reported (ratios in the same run, the smallest daemon the anchor):
//   bytes_per_block    the largest daemon's private memory (RssAnon: its metadata, not the
//                      shared pool, which clients map too) minus the smallest's, over the blocks
//                      between them: what one more indexed block costs, whatever the daemon
//                      allocates for it — target <= 128 bytes;
//   lookup_growth_10m  lookup latency on the largest daemon over the smallest, for a one-block
//                      lookup and for a 1,000-block one (both also reported; this is the larger)
//                      — target <= 1.25. Each lookup names a different random indexed prompt, so
//                      the index is probed where the caches do not already hold it;
//   eviction_growth_10m the time of a put of a fresh 1,000-block prompt into the full pool (it
//                      evicts 1,000 cached blocks) on the largest over the smallest (reported).
// Then a fourth kvtierd with the cold tier on indexes the largest size, waits until all of it is
// on disk, is stopped (the seconds SIGTERM takes to exit: flush and close) and started again on its
// data directory: the seconds until it is ready and until its first lookup has hit 1,000 blocks
// from disk, and its memory per block with the cold tier's directory (reported).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/harness.h"
#include "tools/json_string.h"
#include "tools/synthetic_kv.h"

namespace kvtier::bench {
namespace {

constexpr uint64_t kPromptBlocks = 1000;
constexpr uint64_t kSmallBlocks = 10'000;
constexpr uint64_t kDefaultLargeBlocks = 10'000'000;
constexpr uint64_t kPoolSlack = 256;
// Per repetition and daemon: one-block lookups and 1,000-block lookups (a repetition's figure is
// the median of each).
constexpr int kOneBlockLookups = 400;
constexpr int kPrefixLookups = 40;
// How long the cold-tier daemon may take to write its blocks, and to start again.
constexpr auto kSpillTimeout = std::chrono::minutes(15);
constexpr auto kRestartTimeout = std::chrono::minutes(5);
// How long the cold-tier daemon may take to stop cleanly (SIGTERM to exit: its database flushed
// and closed), reported; past it, it is killed and the restart replays the log instead.
constexpr auto kColdStopTimeout = std::chrono::minutes(3);

Layout scaleLayout() { return Layout{"bench/scale", 1, 1, 1, DType::kFloat16, 16, {}}; }

// The tokens of indexed prompt `p` (every daemon indexes prompts 0, 1, ... of the same seed).
std::vector<uint32_t> promptTokens(uint64_t p, uint32_t blockTokens) {
  return synthetic::tokens(0x5ca1e000 + p, kPromptBlocks * blockTokens);
}

// A fresh prompt, never indexed: the puts that evict.
std::vector<uint32_t> freshTokens(uint64_t n, uint32_t blockTokens) {
  return synthetic::tokens(0xf7e50000 + n, kPromptBlocks * blockTokens);
}

// Private memory (kB of RssAnon in /proc/PID/status) of process `pid`, in bytes.
Result<double> rssAnonBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0) {
      std::istringstream fields(line.substr(8));
      double kb = 0;
      fields >> kb;
      return kb * 1024;
    }
  }
  return unavailable("no RssAnon for pid ", pid);
}

// One daemon of the suite: its directory, process, client and namespace.
struct ScaleDaemon {
  uint64_t blocks = 0;  // indexed, and what its pool holds
  TempDir dir;
  BenchDaemon daemon;
  std::unique_ptr<Client> client;
  std::unique_ptr<Space> space;
  uint64_t fresh = 0;  // fresh prompts put so far

  explicit ScaleDaemon(TempDir d) : dir(std::move(d)) {}

  std::string socket() const { return dir.file("d.sock"); }

  std::vector<std::string> flags(bool cold, const Options& options) const {
    // kPoolSlack blocks more than it indexes (a pool of exactly its blocks lost the tail of the
    // last prompt to the first block another call took); the warm-up's put fills them.
    const uint64_t poolBytes = (blocks + kPoolSlack) * scaleLayout().blockBytes();
    const uint64_t extent = std::min<uint64_t>(poolBytes, uint64_t{1} << 30);
    return options.daemonFlags({"--host-pool-bytes", std::to_string(poolBytes), "--extent-bytes",
                                std::to_string(extent), "--cold-tier", cold ? "on" : "off",
                                "--gpus", "none"});
  }

  Status start(const Options& options, bool cold,
               std::chrono::milliseconds timeout = kStartTimeout) {
    return daemon.start(options.daemon, dir, socket(), flags(cold, options), {}, timeout);
  }

  // A client of this daemon, while it is measured: in the caller-thread mode a thread runs one
  // client's event loop at a time, so the suite connects to one daemon at a time.
  Status connect(const Options& options) {
    disconnect();
    auto c = startClient(socket(), options, options.threading, "kvtier-bench-scale");
    if (!c) return c.error();
    client = std::move(c).value();
    auto s = client->open(scaleLayout());
    if (!s) return s.error();
    space = std::move(s).value();
    return {};
  }

  void disconnect() {
    space.reset();
    client.reset();
  }

  void stop(std::chrono::milliseconds timeout = kStopTimeout) {
    disconnect();
    daemon.stop(timeout);
  }

  // Puts prompts 0 .. blocks/1000 - 1, each in a sequence removed at once (its blocks stay
  // cached).
  Status index() {
    const uint32_t bt = scaleLayout().blockTokens;
    const std::vector<uint8_t> kv(kPromptBlocks * scaleLayout().blockBytes(), 0x5a);
    for (uint64_t p = 0; p < blocks / kPromptBlocks; ++p) {
      if (gInterrupted) return unavailable("interrupted");
      const auto tokens = promptTokens(p, bt);
      if (auto r = space->put("index", 0, tokens, kv.data(), kv.size()); !r) return r.error();
      if (auto s = space->remove("index", 0); !s) return s;
    }
    return {};
  }

  // Seconds of one lookup of the first `blocks` blocks of a random indexed prompt, checked.
  Result<double> timeLookup(std::mt19937_64& rng, uint64_t lookupBlocks) {
    const uint32_t bt = scaleLayout().blockTokens;
    const uint64_t p = rng() % (blocks / kPromptBlocks);
    auto tokens = promptTokens(p, bt);
    tokens.resize(lookupBlocks * bt);
    const auto t0 = Clock::now();
    auto hit = space->lookup(tokens);
    if (!hit) return hit.error();
    hit->release();
    const double s = secondsSince(t0);
    if (auto ok = expectMatched(*hit, tokens.size()); !ok) return ok.error();
    return s;
  }

  // Seconds of a put of a fresh 1,000-block prompt into the full pool (and its sequence's
  // removal): 1,000 blocks evicted.
  Result<double> timeEvictingPut() {
    const uint32_t bt = scaleLayout().blockTokens;
    const auto tokens = freshTokens(fresh++, bt);
    const std::vector<uint8_t> kv(kPromptBlocks * scaleLayout().blockBytes(), 0xa5);
    const auto t0 = Clock::now();
    if (auto r = space->put("fresh", 0, tokens, kv.data(), kv.size()); !r) return r.error();
    const double s = secondsSince(t0);
    if (auto r = space->remove("fresh", 0); !r) return r.error();
    return s;
  }
};

// Microseconds to seconds (the series are printed in us, the ratio reports hold seconds).
std::vector<double> seconds(const std::vector<double>& micros) {
  std::vector<double> out;
  for (double us : micros) out.push_back(us * 1e-6);
  return out;
}

Result<std::unique_ptr<ScaleDaemon>> startIndexed(uint64_t blocks, const Options& options,
                                                  bool cold) {
  auto dir = TempDir::create();
  if (!dir) return dir.error();
  auto d = std::make_unique<ScaleDaemon>(std::move(dir).value());
  d->blocks = blocks;
  if (auto s = d->start(options, cold); !s) return s.error();
  if (auto s = d->connect(options); !s) return s.error();
  const auto t0 = Clock::now();
  if (auto s = d->index(); !s) return s.error();
  if (!cold) d->disconnect();
  std::printf("  indexed %llu blocks in %.1f s (%.0f blocks/s)%s\n",
              static_cast<unsigned long long>(blocks), secondsSince(t0), blocks / secondsSince(t0),
              cold ? ", cold tier on" : "");
  std::fflush(stdout);
  return d;
}

Status runScale(const Options& options) {
  uint64_t large = kDefaultLargeBlocks;
  if (const char* v = std::getenv("KVTIER_SCALE_BLOCKS")) {
    char* end = nullptr;
    large = std::strtoull(v, &end, 10);
    if (end == v || *end != '\0' || large < 2 * kSmallBlocks) {
      return makeError(ErrorCode::kInvalidArgument,
                       "KVTIER_SCALE_BLOCKS wants a number of blocks >= 20000, not '", v, "'");
    }
    large = large / kPromptBlocks * kPromptBlocks;
  }
  const uint64_t middle = std::max(kSmallBlocks, large / 10 / kPromptBlocks * kPromptBlocks);
  const std::vector<uint64_t> sizes = {kSmallBlocks, middle, large};
  std::printf("kvtier-bench --suite scale: %llu, %llu and %llu blocks of %llu bytes\n",
              static_cast<unsigned long long>(sizes[0]), static_cast<unsigned long long>(sizes[1]),
              static_cast<unsigned long long>(sizes[2]),
              static_cast<unsigned long long>(scaleLayout().blockBytes()));

  std::vector<std::unique_ptr<ScaleDaemon>> daemons;
  for (uint64_t n : sizes) {
    auto d = startIndexed(n, options, false);
    if (!d) return d.error();
    daemons.push_back(std::move(d).value());
  }
  if (auto s = daemons[0]->connect(options); !s) return s.error();
  const std::string daemonVersion = daemons[0]->client->daemonVersion();
  daemons[0]->disconnect();
  // Memory right after indexing (before any eviction adds history of evicted blocks).
  std::vector<double> rss;
  for (auto& d : daemons) {
    auto r = rssAnonBytes(d->daemon.pid());
    if (!r) return r.error();
    rss.push_back(*r);
  }

  auto bytesPerBlock =
      newReport("bytes_per_block", "private memory of the largest daemon over the smallest's",
                "blocks it holds more", "count", false, 128.0);
  bytesPerBlock.kvtier.perRep = {rss[2] - rss[0]};
  bytesPerBlock.anchor.perRep = {static_cast<double>(sizes[2] - sizes[0])};

  std::mt19937_64 rng(2026);
  NamedSeries lookups = {{"lookup_1_small_us", {}},     {"lookup_1_middle_us", {}},
                         {"lookup_1_large_us", {}},     {"lookup_1000_small_us", {}},
                         {"lookup_1000_middle_us", {}}, {"lookup_1000_large_us", {}}};
  // One warm-up repetition, then options.reps measured ones; the daemons in turn in each.
  for (int rep = 0; rep <= options.reps; ++rep) {
    if (gInterrupted) return unavailable("interrupted");
    for (size_t i = 0; i < daemons.size(); ++i) {
      if (auto s = daemons[i]->connect(options); !s) return s;
      std::vector<double> one, prefix;
      for (int k = 0; k < kOneBlockLookups; ++k) {
        auto s = daemons[i]->timeLookup(rng, 1);
        if (!s) return s.error();
        one.push_back(*s);
      }
      for (int k = 0; k < kPrefixLookups; ++k) {
        auto s = daemons[i]->timeLookup(rng, kPromptBlocks);
        if (!s) return s.error();
        prefix.push_back(*s);
      }
      daemons[i]->disconnect();
      if (rep == 0) continue;
      lookups[i].second.push_back(medianOf(one) * 1e6);
      lookups[3 + i].second.push_back(medianOf(prefix) * 1e6);
    }
  }
  auto growthOne = newReport("lookup_growth_10m_1", "one-block lookup, largest daemon",
                             "one-block lookup, smallest daemon", "s", false, 1.25);
  growthOne.kvtier.perRep = seconds(lookups[2].second);
  growthOne.anchor.perRep = seconds(lookups[0].second);
  auto growthPrefix = newReport("lookup_growth_10m_1000", "1,000-block lookup, largest daemon",
                                "1,000-block lookup, smallest daemon", "s", false, 1.25);
  growthPrefix.kvtier.perRep = seconds(lookups[5].second);
  growthPrefix.anchor.perRep = seconds(lookups[3].second);
  // The figure: the larger of the two growths, repetition by repetition.
  auto growth = newReport("lookup_growth_10m", "the slower-growing lookup, largest daemon",
                          "the same lookup, smallest daemon", "s", false, 1.25);
  for (size_t r = 0; r < growthOne.ratios().size(); ++r) {
    const bool prefixGrowsMore = growthPrefix.ratios()[r] > growthOne.ratios()[r];
    growth.kvtier.perRep.push_back(1e-6 *
                                   (prefixGrowsMore ? lookups[5].second[r] : lookups[2].second[r]));
    growth.anchor.perRep.push_back(1e-6 *
                                   (prefixGrowsMore ? lookups[3].second[r] : lookups[0].second[r]));
  }

  // Eviction: after the lookups, which must still find every indexed prompt.
  NamedSeries evictions = {
      {"evicting_put_small_us", {}}, {"evicting_put_middle_us", {}}, {"evicting_put_large_us", {}}};
  for (int rep = 0; rep <= options.reps; ++rep) {
    if (gInterrupted) return unavailable("interrupted");
    for (size_t i = 0; i < daemons.size(); ++i) {
      if (auto c = daemons[i]->connect(options); !c) return c;
      auto s = daemons[i]->timeEvictingPut();
      daemons[i]->disconnect();
      if (!s) return s.error();
      if (rep > 0) evictions[i].second.push_back(*s * 1e6);
    }
  }
  auto evictionGrowth = newReport("eviction_growth_10m", "put evicting 1,000 blocks, largest",
                                  "the same put, smallest daemon", "s", false, std::nullopt);
  evictionGrowth.kvtier.perRep = seconds(evictions[2].second);
  evictionGrowth.anchor.perRep = seconds(evictions[0].second);
  daemons.clear();  // their memory, before the cold-tier daemon takes as much again

  // Restart of a daemon whose cold tier holds the largest size (KVTIER_SCALE_COLD=0 skips it:
  // minutes at 10 M blocks, for runs that look at the in-memory figures only).
  NamedSeries restart = {{"rss_anon_cold_on_bytes_per_block", {}},
                         {"spill_all_s", {}},
                         {"stop_s", {}},
                         {"restart_ready_s", {}},
                         {"restart_first_hit_s", {}}};
  const char* coldEnv = std::getenv("KVTIER_SCALE_COLD");
  if (coldEnv == nullptr || std::string(coldEnv) != "0") {
    auto cold = startIndexed(large, options, true);
    if (!cold) return cold.error();
    ScaleDaemon& d = **cold;
    const auto t0 = Clock::now();
    for (;;) {
      auto stats = d.client->stats();
      if (!stats) return stats.error();
      if (stats->coldRecords >= large) break;
      if (Clock::now() - t0 > kSpillTimeout) {
        return unavailable("the cold tier holds ", stats->coldRecords, " of ", large,
                           " blocks after ", secondsSince(t0), " s");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    restart[1].second.push_back(secondsSince(t0));
    auto r = rssAnonBytes(d.daemon.pid());
    if (!r) return r.error();
    restart[0].second.push_back(*r / large);
    const auto stopAt = Clock::now();
    d.stop(kColdStopTimeout);
    restart[2].second.push_back(secondsSince(stopAt));
    const auto t1 = Clock::now();
    if (auto s = d.start(options, true,
                         std::chrono::duration_cast<std::chrono::milliseconds>(kRestartTimeout));
        !s) {
      return s;
    }
    restart[3].second.push_back(secondsSince(t1));
    if (auto s = d.connect(options); !s) return s;
    std::mt19937_64 one(7);
    auto hit = d.timeLookup(one, kPromptBlocks);
    if (!hit) return hit.error();
    restart[4].second.push_back(secondsSince(t1));
    d.stop(kColdStopTimeout);
  }

  std::vector<RatioReport> reports = {bytesPerBlock, growth, growthOne, growthPrefix,
                                      evictionGrowth};
  printTable("scale", reports, options.reps);
  std::printf("\n");
  printChecks(lookups, 34);
  printChecks(evictions, 34);
  printChecks(restart, 34);
  RunInfo info = runInfoOf("scale", options, {{"kvtierd", jsonString(daemonVersion)}});
  std::ostringstream setup;
  setup << "\"setup\": {\"blocks\": [" << sizes[0] << ", " << sizes[1] << ", " << sizes[2]
        << "], \"block_bytes\": " << scaleLayout().blockBytes()
        << ", \"rss_anon_bytes\": " << jsonArray(rss) << "}";
  info.extra.push_back(setup.str());
  info.extra.push_back(jsonSeriesMember("lookups", lookups));
  info.extra.push_back(jsonSeriesMember("evictions", evictions));
  info.extra.push_back(jsonSeriesMember("restart", restart));
  return writeReport(options, reports, {}, info);
}

}  // namespace

extern const Suite kScaleSuite = {
    "scale",
    "  scale: daemon memory per indexed block and lookup latency at 10 k, 1 M and 10 M cached\n"
    "         blocks (KVTIER_SCALE_BLOCKS: the largest), eviction cost, restart of a daemon\n"
    "         whose cold tier holds them all\n",
    runScale};

}  // namespace kvtier::bench
