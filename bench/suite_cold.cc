// kvtier-bench --suite cold: blocks spilled to and promoted from the RocksDB cold tier against
// RocksDB's own db_bench (fillrandom, readrandom; Debian's rocksdb-tools) with the same value
// size, and hot lookups while the spiller runs against the same lookups on an idle daemon. Every
// repetition starts from nothing: a fresh temporary directory, a fresh db_bench database and a
// fresh kvtierd (cold tier on, a 64 MiB pool).
#include <sys/wait.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/harness.h"
#include "tools/json_string.h"
#include "tools/synthetic_kv.h"

namespace kvtier::bench {
namespace {

// Blocks are the local suite's (256 KiB: 16 tokens of 8 layers x 8 heads x 64 x fp16, K and V).
// A prompt is 16 blocks (256 tokens, 4 MiB).
constexpr uint32_t kColdPromptBlocks = 16;
constexpr uint64_t kColdPromptTokens = 256;
// The pool is 64 MiB, 256 blocks; the hot prefix holds 16 of them for the whole repetition.
constexpr const char* kColdPoolBytes = "64M";
constexpr uint64_t kColdPoolBlocks = 256;
// The spill phase writes 96 prompts, 1536 blocks (384 MiB, 6x the pool). The promote phase looks
// up the middle third, prompts 32-63 (512 blocks): whichever end of the spilled prompts the
// eviction policy keeps in memory (the first ones, or the last 240 blocks), the middle ones are
// only on disk by then.
constexpr uint32_t kSpillPrompts = 96;
constexpr uint32_t kPromoteFirst = kSpillPrompts / 3;
constexpr uint32_t kPromotePrompts = kSpillPrompts / 3;
constexpr uint64_t kSpillBlocks = uint64_t{kSpillPrompts} * kColdPromptBlocks;
// Hot lookups, one every 500 us (an engine's scheduler asking at a steady pace: the same offered
// load idle and spilling), in kHotWindows idle windows alternating with as many spilling ones, so
// that whatever else the shared machine runs meanwhile falls on both sides. 2000 lookups of each
// kind per repetition: p99 is about the 20th slowest.
constexpr int kHotSamples = 2000;
constexpr int kHotWindows = 4;
constexpr int kHotWarmupLookups = 100;
constexpr auto kHotInterval = std::chrono::microseconds(500);
// An idle window starts once the daemon's spilled count has not moved for this long.
constexpr auto kSpillQuiet = std::chrono::milliseconds(200);
// db_bench: as many records as kvtier spills (so as many memtable flushes), and readrandom reads
// of which about 63% find a key (fillrandom draws its keys with replacement).
constexpr int kDbBenchReads = 800;
constexpr auto kDbBenchTimeout = std::chrono::seconds(60);
// Bound on any one phase waiting for the daemon (a spill that never completes is an error).
constexpr auto kColdPhaseTimeout = std::chrono::seconds(60);

// The suite's data, made once: the hot prompt and the spill prompts with their packed KV.
struct ColdWorkload {
  ColdWorkload() {
    hotTokens = synthetic::tokens(77, kColdPromptTokens);
    const auto hot = synthetic::packedKv(layout, hotTokens, 0, kColdPromptTokens);
    hotKv = std::make_unique<HostBuffer>(hot.size());
    std::memcpy(hotKv->data(), hot.data(), hot.size());
    for (uint32_t i = 0; i < kSpillPrompts; ++i) {
      tokens.push_back(synthetic::tokens(5000 + i, kColdPromptTokens));
      const auto packed = synthetic::packedKv(layout, tokens.back(), 0, kColdPromptTokens);
      kv.push_back(std::make_unique<HostBuffer>(packed.size()));
      std::memcpy(kv.back()->data(), packed.data(), packed.size());
    }
  }
  uint64_t blockBytes() const { return layout.blockBytes(); }

  Layout layout = benchLayout();
  std::vector<uint32_t> hotTokens;
  std::unique_ptr<HostBuffer> hotKv;
  std::vector<std::vector<uint32_t>> tokens;    // spill prompt i
  std::vector<std::unique_ptr<HostBuffer>> kv;  // its packed KV, 4 MiB
};

// One db_bench benchmark's summary line, e.g.
//   "readrandom   :     581.715 micros/op 1718 ops/sec 0.233 seconds 400 operations; ... (234 of
//   400 found)".
struct DbBenchFigure {
  double opsPerSec = 0, seconds = 0;
  uint64_t ops = 0;
  std::optional<uint64_t> found;  // readrandom: reads that found their key
  // Records per second actually written or read: for readrandom only the reads that found a
  // record count (a miss reads no 256 KiB value and costs a small fraction of a hit).
  double recordsPerSec() const { return found ? double(*found) / seconds : opsPerSec; }
};

Result<DbBenchFigure> parseDbBenchLine(const std::string& line) {
  const size_t colon = line.find(':');
  DbBenchFigure f;
  double micros = 0;
  unsigned long long ops = 0;
  if (colon == std::string::npos ||
      std::sscanf(line.c_str() + colon + 1,
                  " %lf micros/op %lf ops/sec %lf seconds %llu operations", &micros, &f.opsPerSec,
                  &f.seconds, &ops) != 4 ||
      f.seconds <= 0) {
    return unavailable("cannot parse db_bench's line '", line, "'");
  }
  f.ops = ops;
  unsigned long long found = 0, of = 0;
  if (const size_t at = line.rfind('(');
      at != std::string::npos &&
      std::sscanf(line.c_str() + at, "(%llu of %llu found)", &found, &of) == 2) {
    f.found = found;
  }
  return f;
}

// The db_bench flags both anchors share: kvtier's value and key sizes, its integrated BlobDB
// settings (daemon/cold_tier.cc), no compression, one thread, WAL on and no sync as kvtier writes.
std::vector<std::string> dbBenchFlags(const std::string& db, uint64_t valueBytes) {
  return {"--db=" + db,
          "--num=" + std::to_string(kSpillBlocks),
          "--value_size=" + std::to_string(valueBytes),
          "--key_size=40",
          "--compression_type=none",
          "--threads=1",
          "--enable_blob_files=true",
          "--min_blob_size=4096",
          "--enable_blob_garbage_collection=true"};
}

Result<DbBenchFigure> runDbBench(const std::string& exe, const TempDir& dir,
                                 const std::string& benchmark, std::vector<std::string> flags) {
  std::vector<std::string> argv = {exe, "--benchmarks=" + benchmark};
  argv.insert(argv.end(), flags.begin(), flags.end());
  const std::string log = dir.file("db_bench.log");
  auto child = ChildProcess::spawn(argv, log, true);
  if (!child) return child.error();
  auto line = child->waitForLine(benchmark + " ", kDbBenchTimeout);
  if (!line) {
    return unavailable("db_bench ", benchmark, ": ", line.error().message(), "; its log:\n",
                       lastLines(log));
  }
  if (!child->waitExit(kDbBenchTimeout)) return unavailable("db_bench ", benchmark, " hangs");
  const int status = *child->poll();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return unavailable("db_bench ", benchmark, " exited with status ", status, "; its log:\n",
                       lastLines(log));
  }
  return parseDbBenchLine(*line);
}

std::string dbBenchVersion(const std::string& exe) {
  return versionOf({exe, "--version"}, "db_bench version ");
}

// A second client that puts prompts through the pool as fast as the daemon takes them: each at
// position 0 of one sequence, the sequence removed right after, so its blocks become evictable
// and the daemon's write-behind spiller has to write them before their memory can be reused.
struct Spiller {
  Status status;
  Clock::time_point firstPut{}, lastPutDone{};
  uint64_t fullRetries = 0;          // puts the daemon answered FULL after its own waiting
  std::atomic<uint64_t> prompts{0};  // put and removed so far
  std::atomic<bool> pause{false};    // set: park before the next put
  std::atomic<bool> parked{false};   // parked, or gone
  std::atomic<bool> exited{false};   // gone (done, stopped or failed): `status` is final
  std::atomic<bool> stop{false};
};

// Runs on its own thread (a caller-thread client belongs to the thread that connects it). Puts
// `count` prompts (or until `stop`); prompt i has the tokens `tokensOf(i)` and spill prompt i %
// kSpillPrompts' bytes. Whoever resumes it after a pause waits for `prompts` to move before
// pausing it again, so `parked` is never stale.
void runSpiller(const std::string& socket, const Options& options, const ColdWorkload& w,
                const std::function<std::vector<uint32_t>(uint64_t)>& tokensOf, uint64_t count,
                Spiller& out) {
  out.status = [&]() -> Status {
    auto client = startClient(socket, options, options.threading, "kvtier-bench-spiller");
    if (!client) return client.error();
    auto space = (*client)->open(w.layout);
    if (!space) return space.error();
    for (uint64_t i = 0; i < count; ++i) {
      while (out.pause.load() && !out.stop.load() && !gInterrupted) {
        out.parked.store(true);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      out.parked.store(false);
      if (out.stop.load() || gInterrupted) break;
      const std::vector<uint32_t> tokens = tokensOf(i);
      const HostBuffer& kv = *w.kv[i % kSpillPrompts];
      if (i == 0) out.firstPut = Clock::now();
      const auto deadline = Clock::now() + kColdPhaseTimeout;
      for (;;) {
        auto info = (*space)->put("bench-spill", 0, tokens, kv.data(), kv.size());
        if (info) {
          if (info->sealedBlocks != kColdPromptBlocks) {
            return makeError(ErrorCode::kInternal, "spill put sealed ", info->sealedBlocks,
                             " blocks, expected ", kColdPromptBlocks);
          }
          break;
        }
        // FULL: the daemon already waited for its spiller (32 batches) and gave up; try again.
        if (info.error().code() != ErrorCode::kFull || Clock::now() >= deadline) {
          return info.error();
        }
        ++out.fullRetries;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (auto s = (*space)->remove("bench-spill", 0); !s) return s;
      out.lastPutDone = Clock::now();
      out.prompts.fetch_add(1);
    }
    return {};
  }();
  // Also on failure: nobody waits for a spiller that is gone.
  out.parked.store(true);
  out.exited.store(true);
}

// Waits until `done()` holds, up to kColdPhaseTimeout.
template <typename Done>
Status waitUntil(Done&& done, const char* what) {
  const auto deadline = Clock::now() + kColdPhaseTimeout;
  while (!done()) {
    if (Clock::now() >= deadline) return unavailable("timed out waiting for ", what);
    if (gInterrupted) return unavailable("interrupted");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return {};
}

// Waits until the daemon's spilled count has not moved for kSpillQuiet: nothing left to spill.
Status waitSpillQuiet(Client& client) {
  const auto deadline = Clock::now() + kColdPhaseTimeout;
  uint64_t last = UINT64_MAX;
  auto since = Clock::now();
  for (;;) {
    auto stats = client.stats();
    if (!stats) return stats.error();
    const auto now = Clock::now();
    if (stats->spilled != last) {
      last = stats->spilled;
      since = now;
    } else if (now - since >= kSpillQuiet) {
      return {};
    }
    if (now >= deadline) return unavailable("the daemon never stopped spilling");
    if (gInterrupted) return unavailable("interrupted");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Waits (polling the daemon's counters) until its spilled count reaches `target`; returns when.
Result<Clock::time_point> waitSpilled(Client& client, uint64_t target) {
  const auto deadline = Clock::now() + kColdPhaseTimeout;
  for (;;) {
    auto stats = client.stats();
    if (!stats) return stats.error();
    const auto now = Clock::now();
    if (stats->spilled >= target) return now;
    if (gInterrupted) return unavailable("interrupted");
    if (now >= deadline) {
      return unavailable("the daemon spilled ", stats->spilled, " blocks, not ", target, " within ",
                         kColdPhaseTimeout.count(), " s (spill errors ", stats->spillErrors, ")");
    }
    std::this_thread::sleep_for(kStatsPollInterval);
  }
}

// One hot lookup: taken while spilling or idle, its start (seconds of the steady clock,
// CLOCK_MONOTONIC) and its seconds (lookup, then dropping its handle, which releases without
// waiting).
struct HotSample {
  bool spilling;
  double start, seconds;
};

// The seconds of the samples of one kind.
std::vector<double> secondsOf(const std::vector<HotSample>& samples, bool spilling) {
  std::vector<double> out;
  for (const auto& h : samples) {
    if (h.spilling == spilling) out.push_back(h.seconds);
  }
  return out;
}

// Lookups of the hot prefix, each kHotInterval after the previous one started (right after it, if
// it took longer: a slow lookup is not followed by a burst that catches up), appended to `out`.
Status sampleHot(Space& space, const ColdWorkload& w, int samples, bool spilling,
                 std::vector<HotSample>& out) {
  auto next = Clock::now();
  for (int i = 0; i < samples; ++i) {
    if (gInterrupted) return unavailable("interrupted");
    std::this_thread::sleep_until(next);
    const auto t0 = Clock::now();
    next = t0 + kHotInterval;
    {
      auto hit = space.lookup(w.hotTokens);
      if (!hit) return hit.error();
      if (auto s = expectMatched(*hit, kColdPromptTokens); !s) return s;
    }
    out.push_back(
        {spilling, std::chrono::duration<double>(t0.time_since_epoch()).count(), secondsSince(t0)});
  }
  return {};
}

// One repetition's figures; seconds of each phase go to `phases`.
struct ColdRep {
  std::optional<DbBenchFigure> fill, read;
  double spillRate = 0, promoteRate = 0, hotIdleP99 = 0, hotSpillP99 = 0;
  double hotIdleP50 = 0, hotSpillP50 = 0;
  uint64_t promoted = 0, promoteLookedUp = 0, fullRetries = 0;
  double spillWindowRate = 0;         // blocks/s the daemon spilled while the hot lookups ran
  std::vector<HotSample> hotSamples;  // every measured hot lookup, in the order taken
  std::vector<std::pair<std::string, double>> phases;
  std::string daemonVersion;
};

Result<ColdRep> measureColdRepetition(const Options& options, const ColdWorkload& w,
                                      const std::optional<std::string>& dbBench, bool verify) {
  ColdRep r;
  auto dir = TempDir::create();
  if (!dir) return dir.error();
  auto phase = [&](const char* name, Clock::time_point t0) {
    r.phases.emplace_back(name, secondsSince(t0));
  };

  // The anchors first, while nothing else runs; their database is gone before kvtierd starts.
  if (dbBench) {
    const std::string db = dir->file("db_bench");
    auto t0 = Clock::now();
    auto fill = runDbBench(*dbBench, *dir, "fillrandom", dbBenchFlags(db, w.blockBytes()));
    if (!fill) return fill.error();
    phase("db_bench fillrandom (run)", t0);
    auto flags = dbBenchFlags(db, w.blockBytes());
    flags.push_back("--use_existing_db=1");
    flags.push_back("--reads=" + std::to_string(kDbBenchReads));
    t0 = Clock::now();
    auto read = runDbBench(*dbBench, *dir, "readrandom", flags);
    if (!read) return read.error();
    phase("db_bench readrandom (run)", t0);
    r.fill = *fill;
    r.read = *read;
    std::error_code ec;
    std::filesystem::remove_all(db, ec);
  }

  auto t0 = Clock::now();
  const std::string socket = dir->file("kvtierd.sock");
  BenchDaemon daemon;
  if (auto s = daemon.start(options.daemon, *dir, socket,
                            options.daemonFlags({"--host-pool-bytes", kColdPoolBytes, "--cold-tier",
                                                 "on", "--flush-on-exit", "off"}));
      !s) {
    return s.error();
  }
  auto client = startClient(socket, options, options.threading);
  if (!client) return client.error();
  r.daemonVersion = (*client)->daemonVersion();
  auto space = (*client)->open(w.layout);
  if (!space) return space.error();
  if (w.blockBytes() * kColdPromptBlocks != w.hotKv->size())
    return makeError(ErrorCode::kInternal, "bad cold workload size");
  {
    auto s0 = (*client)->stats();
    if (!s0) return s0.error();
    if (s0->blocksTotal != kColdPoolBlocks) {
      return makeError(ErrorCode::kInternal, "the pool has ", s0->blocksTotal, " blocks, expected ",
                       kColdPoolBlocks);
    }
  }
  // The hot prefix: held by a live sequence of this client, so it is never evicted or spilled.
  if (auto info = (*space)->put("bench-hot", 0, w.hotTokens, w.hotKv->data(), w.hotKv->size());
      !info) {
    return info.error();
  }
  phase("kvtierd start + hot put", t0);

  std::vector<HotSample> scratch;
  if (auto s = sampleHot(**space, w, kHotWarmupLookups, false, scratch); !s) return s.error();

  // Spill: wall time from the first put until the daemon has written every block of the phase.
  auto before = (*client)->stats();
  if (!before) return before.error();
  {
    Spiller spiller;
    std::thread thread(
        runSpiller, socket, std::cref(options), std::cref(w),
        [&w](uint64_t i) { return w.tokens[i]; }, kSpillPrompts, std::ref(spiller));
    thread.join();
    if (!spiller.status) return spiller.status.error();
    auto done = waitSpilled(**client, before->spilled + kSpillBlocks);
    if (!done) return done.error();
    r.spillRate = double(kSpillBlocks) / seconds(spiller.firstPut, *done);
    r.phases.emplace_back("spill: puts", seconds(spiller.firstPut, spiller.lastPutDone));
    r.phases.emplace_back("spill: after the last put", seconds(spiller.lastPutDone, *done));
    r.fullRetries += spiller.fullRetries;
  }

  // Promote: lookups of prompts whose blocks are only on disk; the daemon reads them back into
  // the pool before it answers.
  before = (*client)->stats();
  if (!before) return before.error();
  t0 = Clock::now();
  std::optional<HostBuffer> check;
  if (verify) check.emplace(w.kv[0]->size());
  for (uint32_t i = kPromoteFirst; i < kPromoteFirst + kPromotePrompts; ++i) {
    auto hit = (*space)->lookup(w.tokens[i]);
    if (!hit) return hit.error();
    r.promoteLookedUp += kColdPromptBlocks;
    if (verify) {  // the warm-up checks the bytes that came back
      if (auto s = expectMatched(*hit, kColdPromptTokens); !s) return s.error();
      if (auto s = hit->copyTo(0, kColdPromptTokens, check->data(), check->size()); !s)
        return s.error();
      if (std::memcmp(check->data(), w.kv[i]->data(), check->size()) != 0)
        return makeError(ErrorCode::kInternal, "promoted bytes of prompt ", i, " differ");
    }
  }
  const double promoteSeconds = secondsSince(t0);
  auto after = (*client)->stats();
  if (!after) return after.error();
  r.promoted = after->promoted - before->promoted;
  r.promoteRate = double(r.promoted) / promoteSeconds;
  r.phases.emplace_back("promote", promoteSeconds);

  // Hot lookups, idle windows alternating with windows while another client keeps the spiller
  // busy the whole time.
  t0 = Clock::now();
  {
    Spiller spiller;
    spiller.pause.store(true);
    std::thread thread(
        runSpiller, socket, std::cref(options), std::cref(w),
        [](uint64_t i) { return synthetic::tokens(900000 + i, kColdPromptTokens); }, UINT64_MAX,
        std::ref(spiller));
    auto sampleWindow = [&](bool spillingWindow) {
      return sampleHot(**space, w, kHotSamples / kHotWindows, spillingWindow, r.hotSamples);
    };
    uint64_t windowSpilled = 0;
    double windowSeconds = 0;
    const Status sampled = [&]() -> Status {
      for (int window = 0; window < 2 * kHotWindows; ++window) {
        if (window % 2 == 0) {  // idle: the spiller parked, the daemon done writing
          spiller.pause.store(true);
          if (auto s = waitUntil([&] { return spiller.parked.load(); }, "the spiller to pause"); !s)
            return s;
          if (spiller.exited.load()) {
            return spiller.status ? unavailable("the spiller stopped") : spiller.status;
          }
          if (auto s = waitSpillQuiet(**client); !s) return s;
          if (auto s = sampleWindow(false); !s) return s;
          continue;
        }
        // Spilling: resumed, and its first prompt in (so its blocks are being written).
        const uint64_t p0 = spiller.prompts.load();
        spiller.pause.store(false);
        if (auto s = waitUntil([&] { return spiller.prompts.load() > p0 || spiller.exited.load(); },
                               "the spiller to start");
            !s)
          return s;
        if (spiller.exited.load()) {
          return spiller.status ? unavailable("the spiller stopped") : spiller.status;
        }
        auto s0 = (*client)->stats();
        if (!s0) return s0.error();
        const auto w0 = Clock::now();
        if (auto s = sampleWindow(true); !s) return s;
        auto s1 = (*client)->stats();
        if (!s1) return s1.error();
        windowSeconds += secondsSince(w0);
        windowSpilled += s1->spilled - s0->spilled;
      }
      return {};
    }();
    spiller.stop.store(true);
    thread.join();
    if (!sampled) return sampled.error();
    if (!spiller.status) return spiller.status.error();
    const std::vector<double> idle = secondsOf(r.hotSamples, false);
    const std::vector<double> spilling = secondsOf(r.hotSamples, true);
    r.hotIdleP99 = percentile(idle, 0.99);
    r.hotIdleP50 = percentile(idle, 0.50);
    r.hotSpillP99 = percentile(spilling, 0.99);
    r.hotSpillP50 = percentile(spilling, 0.50);
    r.spillWindowRate = double(windowSpilled) / windowSeconds;
    r.fullRetries += spiller.fullRetries;
  }
  phase("hot lookups, idle and spilling", t0);
  return r;
}

Status run(const Options& options) {
  const std::optional<std::string> dbBench = findOnPath("db_bench");
  std::string dbBenchSkipped;
  if (!dbBench) {
    dbBenchSkipped = "db_bench is not on PATH (rocksdb-tools; scripts/install-deps.sh installs it)";
    std::fprintf(stderr, "kvtier-bench: %s; spill/promote_vs_dbbench are null\n",
                 dbBenchSkipped.c_str());
  }
  const std::string dbVersion = dbBench ? dbBenchVersion(*dbBench) : "";
  const ColdWorkload w;

  const auto report = newReport;
  RatioReport spill =
      report("spill_vs_dbbench", "spill", "db_bench fillrandom", "blocks/s", true, 0.5);
  RatioReport promote =
      report("promote_vs_dbbench", "promote", "db_bench readrandom (found)", "blocks/s", true, 0.5);
  RatioReport hot = report("hot_p99_under_spill", "hot lookup p99, spilling",
                           "hot lookup p99, idle", "s", false, 1.5);
  spill.skipped = promote.skipped = dbBenchSkipped;

  // Per-repetition figures that are not ratios but say whether the ratios mean what they claim.
  NamedSeries checks = {{"promoted_fraction", {}},
                        {"put_full_retries", {}},
                        {"dbbench_fill_ops_per_s", {}},
                        {"dbbench_read_ops_per_s", {}},
                        {"dbbench_read_found_fraction", {}},
                        {"spill_blocks_per_s_during_hot", {}},
                        {"hot_p50_idle_us", {}},
                        {"hot_p50_spilling_us", {}}};
  NamedSeries phases;
  std::string daemonVersion = "unknown";
  std::unique_ptr<FILE, int (*)(FILE*)> hotSamples(nullptr, &std::fclose);
  if (!options.hotSamples.empty()) {
    hotSamples.reset(std::fopen(options.hotSamples.c_str(), "w"));
    if (!hotSamples) {
      return makeError(ErrorCode::kInvalidArgument, "cannot write --hot-samples ",
                       options.hotSamples, ": ", std::strerror(errno));
    }
  }

  for (int rep = 0; rep <= options.reps; ++rep) {
    if (gInterrupted) return unavailable("interrupted");
    const bool warmup = rep == 0;
    const auto t0 = Clock::now();
    auto f = measureColdRepetition(options, w, dbBench, warmup);
    if (!f) return f.error();
    const double repSeconds = secondsSince(t0);
    daemonVersion = f->daemonVersion;
    std::fprintf(stderr,
                 "%s %d: spill %.0f blocks/s vs fillrandom %.0f, promote %.0f blocks/s (%llu of "
                 "%llu) vs readrandom %.0f, hot p99 %.1f us spilling vs %.1f us idle (%.1f s)\n",
                 warmup ? "warm-up" : "rep", rep, f->spillRate,
                 f->fill ? f->fill->recordsPerSec() : std::nan(""), f->promoteRate,
                 static_cast<unsigned long long>(f->promoted),
                 static_cast<unsigned long long>(f->promoteLookedUp),
                 f->read ? f->read->recordsPerSec() : std::nan(""), f->hotSpillP99 * 1e6,
                 f->hotIdleP99 * 1e6, repSeconds);
    if (warmup) continue;
    if (f->fill && f->read) {
      spill.kvtier.perRep.push_back(f->spillRate);
      spill.anchor.perRep.push_back(f->fill->recordsPerSec());
      promote.kvtier.perRep.push_back(f->promoteRate);
      promote.anchor.perRep.push_back(f->read->recordsPerSec());
    }
    hot.kvtier.perRep.push_back(f->hotSpillP99);
    if (hotSamples) {
      for (const auto& h : f->hotSamples) {
        std::fprintf(hotSamples.get(), "%d %s %.6f %.1f\n", rep, h.spilling ? "spilling" : "idle",
                     h.start, h.seconds * 1e6);
      }
    }
    hot.anchor.perRep.push_back(f->hotIdleP99);
    const double nan = std::nan("");
    const double values[] = {
        double(f->promoted) / double(f->promoteLookedUp),
        double(f->fullRetries),
        f->fill ? f->fill->opsPerSec : nan,
        f->read ? f->read->opsPerSec : nan,
        f->read && f->read->found ? double(*f->read->found) / double(f->read->ops) : nan,
        f->spillWindowRate,
        f->hotIdleP50 * 1e6,
        f->hotSpillP50 * 1e6};
    for (size_t i = 0; i < checks.size(); ++i) checks[i].second.push_back(values[i]);
    f->phases.emplace_back("repetition", repSeconds);
    if (phases.empty()) {
      for (const auto& [name, s] : f->phases) phases.push_back({name, {}});
    }
    for (size_t i = 0; i < phases.size() && i < f->phases.size(); ++i) {
      phases[i].second.push_back(f->phases[i].second);
    }
  }
  const std::vector<RatioReport> reports = {spill, promote, hot};
  printTable("cold", reports, options.reps);
  std::printf(
      "\nsetup: %llu KiB blocks, %s pool (%llu blocks, %u held by the hot prefix), cold tier on; "
      "per repetition\n%llu blocks spilled (%u prompts of %u blocks, each sequence removed after "
      "its put), %u blocks looked\nup from disk, %d hot lookups of %u blocks (one every %lld us) "
      "idle and as many while another\nclient spills, in %d alternating windows of each. spill = "
      "blocks / (first put -> spilled count\nreached); promote = promoted / lookup wall time. "
      "db_bench %s: same value size, %llu records,\nblob files, no compression, 1 thread; "
      "readrandom counts only the reads that found a record.\n",
      static_cast<unsigned long long>(w.blockBytes() >> 10), kColdPoolBytes,
      static_cast<unsigned long long>(kColdPoolBlocks), kColdPromptBlocks,
      static_cast<unsigned long long>(kSpillBlocks), kSpillPrompts, kColdPromptBlocks,
      kPromotePrompts * kColdPromptBlocks, kHotSamples, kColdPromptBlocks,
      static_cast<long long>(kHotInterval.count()), kHotWindows,
      dbBench ? dbVersion.c_str() : "(absent)", static_cast<unsigned long long>(kSpillBlocks));
  std::printf("\nchecks (median [min-max] per repetition):\n");
  printChecks(checks, 32);
  std::printf("\nwhere the time goes (median [min-max] seconds per repetition):\n");
  for (const auto& [name, v] : phases) {
    const Spread s = spreadOf(v);
    std::printf("  %-32s %8.3f s  [%.3f-%.3f]\n", name.c_str(), s.median, s.min, s.max);
  }

  if (!options.json.empty()) {
    std::string dbFlags;
    for (const auto& f : dbBenchFlags("<tmp>/db_bench", w.blockBytes())) {
      dbFlags += (dbFlags.empty() ? "" : " ") + f;
    }
    RunInfo info = runInfoOf("cold", options,
                             {{"kvtierd", jsonString(daemonVersion)},
                              {"db_bench", dbBench ? jsonString(dbVersion) : "null"}});
    std::ostringstream setup;
    setup << "\"setup\": {\"block_bytes\": " << w.blockBytes()
          << ", \"host_pool_bytes\": " << (kColdPoolBlocks * w.blockBytes())
          << ", \"pool_blocks\": " << kColdPoolBlocks
          << ", \"hot_prefix_blocks\": " << kColdPromptBlocks
          << ", \"prompt_blocks\": " << kColdPromptBlocks << ", \"spill_blocks\": " << kSpillBlocks
          << ", \"promote_blocks\": " << kPromotePrompts * kColdPromptBlocks
          << ", \"hot_samples\": " << kHotSamples
          << ", \"hot_interval_us\": " << kHotInterval.count()
          << ", \"hot_windows_each\": " << kHotWindows << ", \"daemon_flags\": "
          << jsonString(std::string("--host-pool-bytes ") + kColdPoolBytes +
                        " --cold-tier on --flush-on-exit off")
          << ",\n    \"spill_rate\": "
          << jsonString(
                 "spill_blocks / wall time from the first put until stats().spilled has "
                 "grown by spill_blocks (puts included)")
          << ",\n    \"promote_rate\": "
          << jsonString("stats().promoted delta / wall time of lookups of prompts only on disk")
          << ",\n    \"hot_p99\": "
          << jsonString(
                 "nearest-rank p99 of lookup of a 16-block prefix held by a live sequence, "
                 "paced; idle windows alternate with windows while another client puts and removes "
                 "prompts as fast as it can")
          << ",\n    \"db_bench\": {\"fill\": " << jsonString("--benchmarks=fillrandom " + dbFlags)
          << ", \"read\": "
          << jsonString("--benchmarks=readrandom " + dbFlags +
                        " --use_existing_db=1 --reads=" + std::to_string(kDbBenchReads))
          << ", \"fill_anchor\": \"ops/sec\", \"read_anchor\": \"found reads / seconds\"}}";
    info.extra.push_back(setup.str());
    info.extra.push_back(jsonSeriesMember("checks", checks));
    info.extra.push_back(jsonSeriesMember("phases_s", phases));
    return writeReport(options, reports, Breakdown{}, info);
  }
  return {};
}

}  // namespace

extern const Suite kColdSuite{
    "cold",
    "  --suite cold    the cold suite: blocks spilled to and promoted from the RocksDB cold tier\n"
    "                  vs db_bench fillrandom/readrandom, hot lookup p99 while spilling vs idle\n",
    run};

}  // namespace kvtier::bench
