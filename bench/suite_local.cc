// kvtier-bench --suite local: kvtier's local data and control paths. A reader's get (lookup of a
// 64-block, 16 MiB prefix, copyTo out of the shared pool, release) and a writer's put (lease,
// write into the pool, commit) against one core's memcpy of the same bytes; a one-block lookup
// against a 64-byte Unix-socket ping-pong; get and put against redis-server's pipelined GET and SET
// of the same 64 chunks.
//
// The suite starts its own kvtierd (a fresh temporary data directory, a 256 MiB pool) and, when
// redis-server is on PATH, its own redis-server on a Unix socket in the same directory; both are
// stopped at the end, on failure too. Key hashing: the chained SHA-256 keys of a 128k-token prompt
// (what a lookup or put of it computes) against `openssl speed -evp sha256 -bytes 64`, OpenSSL
// hashing 64-byte messages (one 16-token block's worth), in tokens per second. After one warm-up
// repetition, every repetition measures each kvtier figure next to its anchor, interleaved round by
// round.
//
// The suite's daemon keeps its pool on 4 KiB pages (--huge-pages off). A second daemon, its pool
// on 2 MiB huge pages, takes the same puts in the same rounds (put_vs_memcpy_hugepages); the bench
// reserves those pages itself (vm.nr_hugepages, root only) while that daemon starts, and puts the
// old value back as soon as the daemon's pool holds them (they stay its own until it exits). Where
// they cannot be had the figure is skipped, with the reason.
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/harness.h"
#include "bench/local_anchors.h"
#include "bench/local_pool_copies.h"
#include "bench/local_workload.h"
#include "client/bench_hooks.h"
#include "tests/huge_page_reservation.h"
#include "tools/json_string.h"

namespace kvtier::bench {
namespace {

constexpr const char* kPoolBytes = "256M";
constexpr uint64_t kPoolHugePages = 128;  // kPoolBytes in 2 MiB pages
// A repetition is kRounds rounds; a round runs every measurement once, back to back. Per
// repetition that is 32 gets, puts and memcpys of 16 MiB, 8 pipelined redis batches each way, and
// 2000 round trips of each kind (a repetition's round-trip figure is their median).
constexpr int kRounds = 8;
constexpr int kBandwidthIterationsPerRound = 4;
constexpr int kRttIterationsPerRound = 250;
constexpr int kPerBlockIterationsPerRound = 50;  // of each kind (samplePerBlock)

// The anchor for bytes: one core's memcpy of the same 16 MiB.
double timeMemcpy(Workload& w, int iterations) {
  const auto t0 = Clock::now();
  for (int i = 0; i < iterations; ++i) {
    std::memcpy(w.out.data(), w.kv.data(), w.bytes());
    // Keep the compiler from treating the copies as dead or merging them.
    asm volatile("" : : "r"(w.out.data()) : "memory");
  }
  return secondsSince(t0);
}

// A reader's whole path: lookup of the 1024-token prompt (one round trip, 64 blocks pinned),
// copyTo of all of it out of the shared pool into its own buffer, release (one round trip).
Result<double> timeGet(Space& space, Workload& w, int iterations) {
  const auto t0 = Clock::now();
  for (int i = 0; i < iterations; ++i) {
    auto hit = space.lookup(w.tokens);
    if (!hit) return hit.error();
    if (auto s = expectMatched(*hit, kPrefixTokens); !s) return s.error();
    if (auto s = hit->copyTo(0, kPrefixTokens, w.out.data(), w.out.size()); !s) return s.error();
    hit->release();
  }
  return secondsSince(t0);
}

// A writer's whole path: put of a new 1024-token prompt at position 0 of one sequence (lease round
// trip, 16 MiB written into 64 freshly granted pool blocks, commit round trip that seals and
// indexes them). Each put replaces the sequence's previous contents; the blocks of the previous
// prompts stay cached until the pool needs them back.
Result<double> timePut(Space& space, Workload& w, int iterations) {
  const auto t0 = Clock::now();
  for (int i = 0; i < iterations; ++i) {
    auto info = space.put("bench-put", 0, w.nextPutTokens(), w.kv.data(), w.kv.size());
    if (!info) return info.error();
    if (info->sealedBlocks != kPrefixBlocks) {
      return makeError(ErrorCode::kInternal, "put sealed ", info->sealedBlocks,
                       " blocks, expected ", kPrefixBlocks);
    }
  }
  return secondsSince(t0);
}

// A writer that puts continuously: the same `iterations` new prompts as timePut, handed over in one
// putMany, which has the daemon grant each next prompt's blocks while this one's are copied.
Result<double> timePutMany(Space& space, Workload& w, int iterations) {
  std::vector<std::vector<uint32_t>> prompts;
  std::vector<std::string> names;
  for (int i = 0; i < iterations; ++i) {
    const auto t = w.nextPutTokens();
    prompts.emplace_back(t.begin(), t.end());
    names.push_back("bench-put-many-" + std::to_string(i));
  }
  std::vector<PutItem> items;
  for (int i = 0; i < iterations; ++i) {
    items.push_back({names[i], 0, prompts[i], w.kv.data(), w.kv.size()});
  }
  const auto t0 = Clock::now();
  auto results = space.putMany(items);
  const double seconds = secondsSince(t0);
  for (const auto& r : results) {
    if (!r) return r.error();
    if (r->sealedBlocks != kPrefixBlocks) {
      return makeError(ErrorCode::kInternal, "putMany sealed ", r->sealedBlocks,
                       " blocks of a prompt, expected ", kPrefixBlocks);
    }
  }
  return seconds;
}

// Seconds of each lookup that hits exactly one block, its ReadHandle dropped right after (the drop
// sends the release without waiting for an answer).
Status sampleLookups(Space& space, const Workload& w, int iterations, std::vector<double>& out) {
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = Clock::now();
    {
      auto hit = space.lookup(w.firstBlock);
      if (!hit) return hit.error();
      if (auto s = expectMatched(*hit, w.layout.blockTokens); !s) return s;
    }
    out.push_back(secondsSince(t0));
  }
  return {};
}

// The daemon's cost per block, against the same call for one block (lookup_64_vs_1,
// store_calls_64_vs_1): seconds of each kind, interleaved call by call so that the machine's
// state hits both alike. A lookup of the 64-block prefix with its read lease, its handle then
// released, against the same for the prefix's first block; and a store's calls without its bytes
// (the grant of fresh blocks and the commit that seals and indexes them, no write and no writer
// checksums: what a store asks of kvtierd) for 64 blocks against 1.
struct PerBlockSamples {
  std::vector<double> lookup64, lookup1, store64, store1;
};

Status samplePerBlock(Space& space, Workload& w, int iterations, PerBlockSamples& out) {
  const auto lookupOf = [&](std::span<const uint32_t> tokens) -> Result<double> {
    const auto t0 = Clock::now();
    auto hit = space.lookup(tokens);
    if (!hit) return hit.error();
    if (auto s = expectMatched(*hit, tokens.size()); !s) return s.error();
    hit->release();
    return secondsSince(t0);
  };
  const auto storeOf = [&](size_t tokens) -> Result<double> {
    auto prompt = w.nextPutTokens().first(tokens);
    bench_hooks::setWriterChecksums(false);
    const auto t0 = Clock::now();
    auto lease = space.beginPut("bench-calls", 0, prompt);
    auto committed = lease ? lease->commit() : Result<CommitInfo>(lease.error());
    const double took = secondsSince(t0);
    bench_hooks::setWriterChecksums(true);
    if (!committed) return committed.error();
    if (committed->sealedBlocks != tokens / w.layout.blockTokens) {
      return makeError(ErrorCode::kInternal, "a store of ", tokens, " tokens sealed ",
                       committed->sealedBlocks, " blocks");
    }
    return took;
  };
  const auto keep = [](Result<double> took, std::vector<double>& samples) -> Status {
    if (!took) return took.error();
    samples.push_back(*took);
    return {};
  };
  // The lookups, then the stores: a store of 64 fresh blocks leaves the caches colder for the call
  // after it (measured: a 64-block lookup right after one took ~1.4x as long), so each kind of
  // call is timed beside its one-block twin under the same conditions.
  for (int i = 0; i < iterations; ++i) {
    if (auto s = keep(lookupOf(w.tokens), out.lookup64); !s) return s;
    if (auto s = keep(lookupOf(w.firstBlock), out.lookup1); !s) return s;
  }
  for (int i = 0; i < iterations; ++i) {
    if (auto s = keep(storeOf(kPrefixTokens), out.store64); !s) return s;
    if (auto s = keep(storeOf(w.layout.blockTokens), out.store1); !s) return s;
  }
  return {};
}

// A thread that runs what it is handed, one thing at a time, until destroyed. The huge-page pool's
// client lives there: a client in the suite's default mode (ClientThreading::kCallerThread) runs
// its event loop on the thread that made it, and this one has the suite's client already.
class WorkerThread {
 public:
  WorkerThread() : thread_([this] { serve(); }) {}
  ~WorkerThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;

  // Runs `f` there and waits for its result.
  template <typename F>
  auto run(F&& f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::forward<F>(f));
    auto result = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back([&task] { task(); });
    }
    wake_.notify_all();
    return result.get();
  }

 private:
  void serve() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;  // guarded by mutex_
  bool stop_ = false;                        // guarded by mutex_
  std::thread thread_;                       // last: starts once the rest exists
};

// The second daemon, its pool on 2 MiB huge pages, with its client and a space of `layout` (both
// made, used and closed on `worker`); or, in `skipped`, why there is none.
struct HugePagePool {
  ~HugePagePool() {
    if (worker) {
      worker->run([this] {
        space.reset();
        client.reset();
      });
    }
  }
  std::optional<TempDir> dir;
  BenchDaemon daemon;  // after dir: stopped before the directory goes
  std::unique_ptr<WorkerThread> worker;
  std::unique_ptr<Client> client;
  std::unique_ptr<Space> space;
  std::string skipped;
};

// One repetition's figures: bytes/s for the bandwidths, median seconds for the round trips.
struct RepFigures {
  double memcpy = 0, get = 0, getUnchecked = 0, put = 0, putUnsummed = 0, putMany = 0,
         lookupRtt = 0, echoRtt = 0, pollingEchoRtt = 0;
  // Median seconds of samplePerBlock's calls.
  double lookup64 = 0, lookup1 = 0, store64 = 0, store1 = 0;
  // The SDK's copies and a raw copy on the same pool blocks (timePoolCopies), bytes/s.
  double poolWrite = 0, poolWriteUnsummed = 0, rawInto = 0, copyOut = 0, copyOutUnchecked = 0,
         rawOut = 0;
  std::optional<double> putHugePages, redisSet, redisGet;
};

// One repetition is kRounds rounds of every measurement back to back, so a change in the shared
// machine's load hits kvtier and its anchors alike instead of whichever ran at the time.
// `huge`, when not null, is the daemon whose pool is on huge pages, with a space of the same
// layout.
Result<RepFigures> measureRepetition(Space& space, HugePagePool* huge, Workload& w, EchoPeer& echo,
                                     EchoPeer& pollingEcho, redisContext* redis, bool verify) {
  double memcpySeconds = 0, putManySeconds = 0, setSeconds = 0, redisGetSeconds = 0;
  double getSeconds[2] = {};  // checked, unchecked
  PoolCopySeconds pool;
  enum PutKind { kSummed, kUnsummed, kHugePages, kPutKinds };
  double putSeconds[kPutKinds] = {};
  std::vector<double> lookups, pings, pollingPings;
  PerBlockSamples perBlock;
  for (int round = 0; round < kRounds; ++round) {
    if (gInterrupted) return unavailable("interrupted");
    memcpySeconds += timeMemcpy(w, kBandwidthIterationsPerRound);
    // The same gets without the reader's checks (a bench-only switch), to see what they cost;
    // which goes first alternates by round.
    for (int k = 0; k < 2; ++k) {
      const bool checked = (k + round) % 2 == 0;
      bench_hooks::setReaderChecks(checked);
      auto get = timeGet(space, w, kBandwidthIterationsPerRound);
      bench_hooks::setReaderChecks(true);
      if (!get) return get.error();
      getSeconds[checked ? 0 : 1] += *get;
    }
    // The same puts without the writer's checksums (a bench-only switch), to see what they cost,
    // and into the pool on huge pages; which goes first rotates by round (the first put after the
    // gets runs on a colder cache).
    std::vector<PutKind> kinds = {kSummed, kUnsummed};
    if (huge) kinds.push_back(kHugePages);
    std::rotate(kinds.begin(), kinds.begin() + round % kinds.size(), kinds.end());
    for (PutKind kind : kinds) {
      bench_hooks::setWriterChecksums(kind != kUnsummed);
      // The huge-page pool's puts run on its client's thread; the time is taken there.
      auto put = kind == kHugePages ? huge->worker->run([&] {
        return timePut(*huge->space, w, kBandwidthIterationsPerRound);
      })
                                    : timePut(space, w, kBandwidthIterationsPerRound);
      bench_hooks::setWriterChecksums(true);
      if (!put) return put.error();
      putSeconds[kind] += *put;
    }
    auto putMany = timePutMany(space, w, kBandwidthIterationsPerRound);
    if (!putMany) return putMany.error();
    putManySeconds += *putMany;
    auto copies = timePoolCopies(space, w, kBandwidthIterationsPerRound);
    if (!copies) return copies.error();
    pool.write += copies->write;
    pool.writeUnsummed += copies->writeUnsummed;
    pool.copyOut += copies->copyOut;
    pool.copyOutUnchecked += copies->copyOutUnchecked;
    for (int m = 0; m < 2; ++m) {
      pool.rawInto[m] += copies->rawInto[m];
      pool.rawOut[m] += copies->rawOut[m];
    }
    if (redis) {
      auto set = timeRedisSet(redis, {w.kv.data(), w.bytes()}, kPrefixBlocks);
      if (!set) return set.error();
      setSeconds += *set;
      auto got = timeRedisGet(redis, {w.kv.data(), w.bytes()}, kPrefixBlocks, verify && round == 0);
      if (!got) return got.error();
      redisGetSeconds += *got;
    }
    if (auto s = sampleLookups(space, w, kRttIterationsPerRound, lookups); !s) return s.error();
    if (auto s = samplePerBlock(space, w, kPerBlockIterationsPerRound, perBlock); !s)
      return s.error();
    if (auto s = samplePings(echo, kRttIterationsPerRound, pings); !s) return s.error();
    if (auto s = samplePings(pollingEcho, kRttIterationsPerRound, pollingPings); !s) {
      return s.error();
    }
  }
  const double bandwidthBytes = double(w.bytes()) * kBandwidthIterationsPerRound * kRounds;
  const double redisBytes = double(w.bytes()) * kRounds;
  RepFigures f;
  f.memcpy = bandwidthBytes / memcpySeconds;
  f.get = bandwidthBytes / getSeconds[0];
  f.getUnchecked = bandwidthBytes / getSeconds[1];
  f.put = bandwidthBytes / putSeconds[kSummed];
  f.putUnsummed = bandwidthBytes / putSeconds[kUnsummed];
  if (huge) f.putHugePages = bandwidthBytes / putSeconds[kHugePages];
  f.putMany = bandwidthBytes / putManySeconds;
  f.poolWrite = bandwidthBytes / pool.write;
  f.poolWriteUnsummed = bandwidthBytes / pool.writeUnsummed;
  const auto fastest = [&](const double (&s)[2]) {
    return bandwidthBytes / (s[1] > 0 ? std::min(s[0], s[1]) : s[0]);
  };
  f.rawInto = fastest(pool.rawInto);
  f.copyOut = bandwidthBytes / pool.copyOut;
  f.copyOutUnchecked = bandwidthBytes / pool.copyOutUnchecked;
  f.rawOut = fastest(pool.rawOut);
  f.lookupRtt = medianOf(std::move(lookups));
  f.echoRtt = medianOf(std::move(pings));
  f.pollingEchoRtt = medianOf(std::move(pollingPings));
  f.lookup64 = medianOf(std::move(perBlock.lookup64));
  f.lookup1 = medianOf(std::move(perBlock.lookup1));
  f.store64 = medianOf(std::move(perBlock.store64));
  f.store1 = medianOf(std::move(perBlock.store1));
  if (redis) {
    f.redisSet = redisBytes / setSeconds;
    f.redisGet = redisBytes / redisGetSeconds;
  }
  return f;
}

// Where one get, one put and one small call spend their time: medians over kBreakdownIterations
// of each step on its own, for whoever chases a missed target. Not part of any ratio.
Result<Breakdown> measureBreakdown(Space& space, Workload& w, EchoPeer& pollingEcho) {
  std::vector<double> lookup, copy, release, begin, write, commit, bare, lookup1, drop, copies;
  std::vector<double> hotBegin, unsummedWrite;
  for (int i = 0; i < kBreakdownIterations; ++i) {
    auto t0 = Clock::now();
    auto hit = space.lookup(w.tokens);
    if (!hit) return hit.error();
    auto t1 = Clock::now();
    if (auto s = hit->copyTo(0, kPrefixTokens, w.out.data(), w.out.size()); !s) return s.error();
    auto t2 = Clock::now();
    hit->release();
    auto t3 = Clock::now();
    lookup.push_back(seconds(t0, t1));
    copy.push_back(seconds(t1, t2));
    release.push_back(seconds(t2, t3));

    // A put, and the same without the writer's checksums; which goes first alternates (the
    // first reads a source the get's copy has pushed out of the caches).
    for (bool summed : {i % 2 == 0, i % 2 != 0}) {
      bench_hooks::setWriterChecksums(summed);
      t0 = Clock::now();
      auto lease = space.beginPut("bench-put", 0, w.nextPutTokens());
      if (!lease) return lease.error();
      t1 = Clock::now();
      auto written = lease->write(0, kPrefixTokens, w.kv.data(), w.kv.size());
      t2 = Clock::now();
      auto committed = written ? lease->commit() : Result<CommitInfo>(written.error());
      t3 = Clock::now();
      bench_hooks::setWriterChecksums(true);
      if (!committed) return committed.error();
      if (summed) {
        begin.push_back(seconds(t0, t1));
        write.push_back(seconds(t1, t2));
        commit.push_back(seconds(t2, t3));
      } else {
        unsummedWrite.push_back(seconds(t1, t2));
      }
    }

    copies.push_back(timeMemcpy(w, 1));
  }
  // The put's grant alone, back to back: what it costs when the daemon and the caches are warm
  // (above, the 16 MiB copy between the calls evicts the caches and lets the daemon fall asleep).
  // Nothing is written, so nothing is committed: the abort is one-way.
  for (int i = 0; i < kBreakdownIterations * 8; ++i) {
    const auto t0 = Clock::now();
    auto lease = space.beginPut("bench-put", 0, w.nextPutTokens());
    if (!lease) return lease.error();
    hotBegin.push_back(seconds(t0, Clock::now()));
    if (auto s = lease->abort(); !s) return s.error();
  }
  for (int i = 0; i < kBreakdownIterations * 8; ++i) {
    const auto t0 = Clock::now();
    if (auto s = space.length("bench-prefix"); !s) return s.error();
    const auto t1 = Clock::now();
    auto hit = space.lookup(w.firstBlock);
    if (!hit) return hit.error();
    const auto t2 = Clock::now();
    { ReadHandle dropped = std::move(*hit); }
    const auto t3 = Clock::now();
    bare.push_back(seconds(t0, t1));
    lookup1.push_back(seconds(t1, t2));
    drop.push_back(seconds(t2, t3));
  }
  std::vector<double> pings;
  if (auto s = samplePings(pollingEcho, kBreakdownIterations * 8, pings); !s) return s.error();
  Breakdown b;
  b.steps = {
      {"memcpy 16 MiB", medianOf(copies)},
      {"get: lookup 64 blocks", medianOf(lookup)},
      {"get: copyTo 16 MiB", medianOf(copy)},
      {"get: release", medianOf(release)},
      {"put: beginPut 64 blocks", medianOf(begin)},
      {"put: write 16 MiB", medianOf(write)},
      {"put: write 16 MiB, no checksums", medianOf(unsummedWrite)},
      {"put: commit", medianOf(commit)},
      {"put: beginPut, back to back", medianOf(hotBegin)},
      {"length() (smallest call)", medianOf(bare)},
      {"lookup 1 block", medianOf(lookup1)},
      {"drop of its ReadHandle", medianOf(drop)},
      {"uds ping-pong, both polling " + std::to_string(pollingEcho.busyPoll().count()) + " us",
       medianOf(pings)}};
  return b;
}

void startHugePagePool(const Options& options, const Layout& layout, HugePagePool& pool) {
  auto dir = TempDir::create();
  if (!dir) {
    pool.skipped = dir.error().message();
    return;
  }
  pool.dir.emplace(std::move(dir).value());
  const std::string socket = pool.dir->file("kvtierd.sock");
  {
    // Held only while the daemon starts: its pool then holds the pages, and the old
    // vm.nr_hugepages goes back when this ends.
    auto reservation = test::HugePageReservation::reserve(kPoolHugePages);
    if (!reservation) {
      pool.skipped = "cannot reserve " + std::to_string(kPoolHugePages) +
                     " huge pages of 2 MiB: " + reservation.error().message();
      return;
    }
    const auto flags = options.daemonFlags(
        {"--host-pool-bytes", kPoolBytes, "--cold-tier", "off", "--huge-pages", "on"});
    if (auto s = pool.daemon.start(options.daemon, *pool.dir, socket, flags); !s) {
      pool.skipped = "kvtierd --huge-pages on did not start: " + s.error().message();
      return;
    }
  }
  pool.worker = std::make_unique<WorkerThread>();
  pool.skipped = pool.worker->run([&]() -> std::string {
    auto client = startClient(socket, options, options.threading);
    if (!client) return client.error().message();
    pool.client = std::move(client).value();
    auto space = pool.client->open(layout);
    if (!space) return space.error().message();
    pool.space = std::move(space).value();
    if (!pool.client->mapped()) return "the client could not map the pool on huge pages";
    return "";
  });
}

// Everything the suite owns lives in this function's scope, so any early return stops the
// daemon, redis and the echo peer and removes the temporary directory.
Status run(const Options& options) {
  auto echo = EchoPeer::start();  // first: fork while this process has no threads
  if (!echo) return echo.error();
  // For the breakdown only: the same ping-pong polling like kvtier does.
  const std::chrono::microseconds busyPoll =
      std::chrono::microseconds(options.busyPollMicros.value_or(ClientOptions{}.busyPoll.count()));
  auto pollingEcho = EchoPeer::start(busyPoll);
  if (!pollingEcho) return pollingEcho.error();
  auto dir = TempDir::create();
  if (!dir) return dir.error();

  const std::string socket = dir->file("kvtierd.sock");
  BenchDaemon daemon;
  if (auto s = daemon.start(options.daemon, *dir, socket,
                            options.daemonFlags({"--host-pool-bytes", kPoolBytes,
                                                 // Memory only: the cold suite measures spills.
                                                 "--cold-tier", "off",
                                                 // 4 KiB pages: huge pages are the second daemon's.
                                                 "--huge-pages", "off"}));
      !s)
    return s;

  std::unique_ptr<RedisServer> redis;
  std::string redisSkipped;
  if (auto exe = findOnPath("redis-server")) {
    auto started = RedisServer::start(*exe, *dir);
    if (started) {
      redis = std::move(started).value();
    } else {
      redisSkipped = started.error().message();
    }
  } else {
    redisSkipped = "redis-server is not on PATH (scripts/install-deps.sh installs it)";
  }
  if (!redisSkipped.empty())
    std::fprintf(stderr, "kvtier-bench: %s; get/put_vs_redis are null\n", redisSkipped.c_str());

  auto client = startClient(socket, options, options.threading);
  if (!client) return client.error();
  Workload w;
  auto space = (*client)->open(w.layout);
  if (!space) return space.error();
  if (!(*client)->mapped()) {
    return unavailable(
        "the client could not map the daemon's pool; the local suite measures the mapped path");
  }
  if (w.layout.blockBytes() * kPrefixBlocks != w.bytes())
    return makeError(ErrorCode::kInternal, "bad workload size");
  HugePagePool huge;
  startHugePagePool(options, w.layout, huge);
  if (!huge.skipped.empty()) {
    std::fprintf(stderr, "kvtier-bench: %s; put_vs_memcpy_hugepages is skipped\n",
                 huge.skipped.c_str());
  }

  // The prefix every reader looks up, checked once end to end before anything is timed.
  if (auto info = (*space)->put("bench-prefix", 0, w.tokens, w.kv.data(), w.kv.size()); !info)
    return info.error();
  {
    auto hit = (*space)->lookup(w.tokens);
    if (!hit) return hit.error();
    if (hit->matchedTokens() != kPrefixTokens) {
      return makeError(ErrorCode::kInternal, "fresh prefix matched only ", hit->matchedTokens(),
                       " tokens");
    }
    if (auto s = hit->copyTo(0, kPrefixTokens, w.out.data(), w.out.size()); !s) return s.error();
    if (std::memcmp(w.out.data(), w.kv.data(), w.bytes()) != 0) {
      return makeError(ErrorCode::kInternal, "bytes read back differ from the bytes put");
    }
  }

  const auto report = newReport;
  // The targets of issue 18.
  RatioReport getMem = report("get_vs_memcpy", "lookup+copyTo", "memcpy", "bytes/s", true, 0.95);
  // The same gets with the reader's checks turned off, in the same rounds: get_vs_memcpy may be
  // at most 0.05 below this (the check is fused into the copy).
  RatioReport getUncheckedMem = report("get_vs_memcpy_no_checks", "lookup+copyTo, no reader checks",
                                       "memcpy", "bytes/s", true, std::nullopt);
  RatioReport putMem = report("put_vs_memcpy", "put+commit", "memcpy", "bytes/s", true, 0.9);
  // The same puts with the writer's checksums turned off, in the same rounds: put_vs_memcpy may
  // be at most 0.05 below this (the checksum is fused into the put's copy).
  RatioReport putUnsummedMem =
      report("put_vs_memcpy_no_checksums", "put+commit, no writer checksums", "memcpy", "bytes/s",
             true, std::nullopt);
  // The same puts into a pool on 2 MiB huge pages, in the same rounds.
  RatioReport putHugeMem = report("put_vs_memcpy_hugepages", "put+commit, pool on 2 MiB huge pages",
                                  "memcpy", "bytes/s", true, std::nullopt);
  putHugeMem.skipped = huge.skipped;
  // The same target for a writer that puts continuously, pipelined (Space::putMany).
  RatioReport putManyMem =
      report("put_many_vs_memcpy", "putMany of 4 prompts", "memcpy", "bytes/s", true, 0.9);
  // The data path against a raw copy of the same runs on the same pool blocks (timePoolCopies).
  RatioReport putWriteRaw =
      report("put_write_vs_raw_pool_copy", "a put's write of 16 MiB into its granted blocks",
             "raw copy of the same runs into the same blocks, best of memcpy and streaming",
             "bytes/s", true, 0.95);
  RatioReport putWriteUnsummedRaw = report(
      "put_write_vs_raw_pool_copy_no_checksums", "the same write, no writer checksums",
      "raw copy of the same runs into the same blocks, best of memcpy and streaming", "bytes/s",
      true, std::nullopt);
  RatioReport getCopyRaw =
      report("get_copy_vs_raw_pool_copy", "a get's copyTo of 16 MiB out of its pinned blocks",
             "raw copy of the same runs out of the same blocks, best of memcpy and streaming",
             "bytes/s", true, 0.95);
  RatioReport getCopyUncheckedRaw =
      report("get_copy_vs_raw_pool_copy_no_checks", "the same copyTo, no reader checks",
             "raw copy of the same runs out of the same blocks, best of memcpy and streaming",
             "bytes/s", true, std::nullopt);
  RatioReport rtt =
      report("rpc_vs_uds_rtt", "lookup 1 block", "uds ping-pong 64 B", "s", false, 1.3);
  RatioReport sha = report("sha256_vs_openssl", "chained keys of 128k tokens",
                           "openssl speed -evp sha256 -bytes 64", "tokens/s", true, 0.8);
  // The lookup polls as the SDK and the daemon do by default; so does this anchor's both ends.
  RatioReport pollingRtt = report("rpc_vs_polling_rtt", "lookup 1 block",
                                  "uds ping-pong 64 B, both ends polling", "s", false, 3.0);
  // The daemon's cost per block: a call for a 64-block prefix against the same call for one.
  RatioReport lookupPerBlock =
      report("lookup_64_vs_1", "lookup of 64 blocks with its lease and release",
             "the same for 1 block", "s", false, 3.0);
  RatioReport storePerBlock =
      report("store_calls_64_vs_1", "a store's grant and commit of 64 blocks, no bytes",
             "the same for 1 block", "s", false, 3.0);
  const auto openssl = findOnPath("openssl");
  if (!openssl) sha.skipped = "openssl is not on PATH";
  RatioReport getRedis =
      report("get_vs_redis", "lookup+copyTo", "redis GET x64", "bytes/s", true, 5);
  RatioReport putRedis = report("put_vs_redis", "put+commit", "redis SET x64", "bytes/s", true, 5);
  getRedis.skipped = putRedis.skipped = redisSkipped;

  // Repetition 0 is the warm-up: it faults in the client's view of the blocks it uses, fills
  // caches and redis' keyspace, checks redis' bytes, and is not reported.
  for (int rep = 0; rep <= options.reps; ++rep) {
    const bool warmup = rep == 0;
    const auto t0 = Clock::now();
    auto f = measureRepetition(**space, huge.space ? &huge : nullptr, w, *echo, *pollingEcho,
                               redis ? redis->context() : nullptr, warmup);
    if (!f) return f.error();
    std::fprintf(
        stderr,
        "%s %d: memcpy %s, get %s, put %s (no checksums %s, huge pages %s), putMany %s, redis "
        "GET %s SET %s, lookup rtt %s, uds rtt %s, lookup 64/1 %.2f, store calls 64/1 %.2f (%.1f "
        "s)\n",
        warmup ? "warm-up" : "rep", rep, human(f->memcpy, "bytes/s").c_str(),
        human(f->get, "bytes/s").c_str(), human(f->put, "bytes/s").c_str(),
        human(f->putUnsummed, "bytes/s").c_str(),
        human(f->putHugePages.value_or(std::nan("")), "bytes/s").c_str(),
        human(f->putMany, "bytes/s").c_str(),
        human(f->redisGet.value_or(std::nan("")), "bytes/s").c_str(),
        human(f->redisSet.value_or(std::nan("")), "bytes/s").c_str(),
        human(f->lookupRtt, "s").c_str(), human(f->echoRtt, "s").c_str(), f->lookup64 / f->lookup1,
        f->store64 / f->store1, secondsSince(t0));
    double keys = std::nan(""), opensslKeys = std::nan("");
    if (openssl) {
      keys = chainedSha256TokensPerSecond(w.layout);
      auto anchor = opensslSha256TokensPerSecond(*openssl, *dir);
      if (!anchor) return anchor.error();
      opensslKeys = *anchor;
      std::fprintf(stderr, "%s %d: chained keys %s, openssl sha256 %s\n",
                   warmup ? "warm-up" : "rep", rep, human(keys, "tokens/s").c_str(),
                   human(opensslKeys, "tokens/s").c_str());
    }
    if (warmup) continue;
    if (openssl) {
      sha.kvtier.perRep.push_back(keys);
      sha.anchor.perRep.push_back(opensslKeys);
    }
    getMem.kvtier.perRep.push_back(f->get);
    getMem.anchor.perRep.push_back(f->memcpy);
    getUncheckedMem.kvtier.perRep.push_back(f->getUnchecked);
    getUncheckedMem.anchor.perRep.push_back(f->memcpy);
    putMem.kvtier.perRep.push_back(f->put);
    putMem.anchor.perRep.push_back(f->memcpy);
    putUnsummedMem.kvtier.perRep.push_back(f->putUnsummed);
    putUnsummedMem.anchor.perRep.push_back(f->memcpy);
    if (f->putHugePages) {
      putHugeMem.kvtier.perRep.push_back(*f->putHugePages);
      putHugeMem.anchor.perRep.push_back(f->memcpy);
    }
    putManyMem.kvtier.perRep.push_back(f->putMany);
    putManyMem.anchor.perRep.push_back(f->memcpy);
    putWriteRaw.kvtier.perRep.push_back(f->poolWrite);
    putWriteRaw.anchor.perRep.push_back(f->rawInto);
    putWriteUnsummedRaw.kvtier.perRep.push_back(f->poolWriteUnsummed);
    putWriteUnsummedRaw.anchor.perRep.push_back(f->rawInto);
    getCopyRaw.kvtier.perRep.push_back(f->copyOut);
    getCopyRaw.anchor.perRep.push_back(f->rawOut);
    getCopyUncheckedRaw.kvtier.perRep.push_back(f->copyOutUnchecked);
    getCopyUncheckedRaw.anchor.perRep.push_back(f->rawOut);
    rtt.kvtier.perRep.push_back(f->lookupRtt);
    rtt.anchor.perRep.push_back(f->echoRtt);
    pollingRtt.kvtier.perRep.push_back(f->lookupRtt);
    pollingRtt.anchor.perRep.push_back(f->pollingEchoRtt);
    lookupPerBlock.kvtier.perRep.push_back(f->lookup64);
    lookupPerBlock.anchor.perRep.push_back(f->lookup1);
    storePerBlock.kvtier.perRep.push_back(f->store64);
    storePerBlock.anchor.perRep.push_back(f->store1);
    if (redis) {
      getRedis.kvtier.perRep.push_back(f->get);
      getRedis.anchor.perRep.push_back(*f->redisGet);
      putRedis.kvtier.perRep.push_back(f->put);
      putRedis.anchor.perRep.push_back(*f->redisSet);
    }
  }
  auto breakdown = measureBreakdown(**space, w, *pollingEcho);
  if (!breakdown) return breakdown.error();

  const std::vector<RatioReport> reports = {
      getMem,         getUncheckedMem,     putMem,      putUnsummedMem,
      putHugeMem,     putManyMem,          putWriteRaw, putWriteUnsummedRaw,
      getCopyRaw,     getCopyUncheckedRaw, rtt,         pollingRtt,
      lookupPerBlock, storePerBlock,       sha,         getRedis,
      putRedis};
  printTable("local", reports, options.reps);
  printBreakdown(*breakdown);
  return writeReport(options, reports, *breakdown,
                     runInfoOf("local", options,
                               {{"kvtierd", jsonString((*client)->daemonVersion())},
                                {"redis", redis ? jsonString(redis->version()) : "null"}}));
}

}  // namespace

extern const Suite kLocalSuite{
    "local",
    "  --suite local   the local suite: shared-pool get/put vs memcpy, lookup round trip vs a\n"
    "                  Unix-socket ping-pong, chained key hashing vs openssl speed, get/put vs\n"
    "                  redis-server\n",
    run};

}  // namespace kvtier::bench
