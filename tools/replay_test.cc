// `kvtier replay` against real kvtierd processes: a slice of the shared Mooncake trace through a
// small pool, its hit rate checked against an LRU computed here, independently of replay.cc (its
// own trace reading, its own LRU, its own routing).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <list>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "tests/test_support.h"
#include "tools/policy_sim.h"
#include "tools/replay.h"
#include "tools/synthetic_trace.h"

namespace kvtier {
namespace {

const char* const kTrace = KVTIER_TRACE_PATH;
// A slice where the hits depend on the policy and the exact capacity: an LRU of 4096 blocks hits
// 3543 of its 49580 blocks, one of 4088 hits 3513, one of 4104 hits 3569, a FIFO of 4096 3494.
constexpr size_t kRequests = 2000;
// Blocks of 1 KiB: the pool is a whole number of pages, so the daemon holds exactly this many.
constexpr uint64_t kCapacity = 4096;
constexpr uint64_t kBlockBytes = 1024;

// The hash_ids of the first `n` lines, read with nothing but string search.
std::vector<std::vector<uint64_t>> readHashIds(size_t n) {
  std::ifstream in(kTrace);
  std::vector<std::vector<uint64_t>> out;
  std::string line;
  while (out.size() < n && std::getline(in, line)) {
    const size_t open = line.find('[', line.find("\"hash_ids\""));
    const size_t close = line.find(']', open);
    std::stringstream ids(line.substr(open + 1, close - open - 1));
    std::vector<uint64_t> request;
    for (std::string id; std::getline(ids, id, ',');) request.push_back(std::stoull(id));
    out.push_back(std::move(request));
  }
  return out;
}

// A textbook LRU over block ids: a request hits the longest prefix it finds, then uses every
// block in order (most recent last), evicting the least recent beyond `capacity`. `tailFirst`:
// the blocks are used last block first, so that a prefix's head is the last of it to go — what
// the daemon does when a request lets go of its blocks (docs/cache-policy.md).
class SimpleLru {
 public:
  explicit SimpleLru(uint64_t capacity, bool tailFirst = false)
      : capacity_(capacity), tailFirst_(tailFirst) {}
  uint64_t request(const std::vector<uint64_t>& ids) {
    uint64_t hits = 0;
    while (hits < ids.size() && pos_.count(ids[hits])) ++hits;
    std::vector<uint64_t> order(ids);
    if (tailFirst_) std::reverse(order.begin(), order.end());
    for (uint64_t id : order) {
      if (auto it = pos_.find(id); it != pos_.end()) order_.erase(it->second);
      order_.push_back(id);
      pos_[id] = std::prev(order_.end());
      if (order_.size() > capacity_) {
        pos_.erase(order_.front());
        order_.pop_front();
      }
    }
    return hits;
  }

 private:
  uint64_t capacity_;
  bool tailFirst_;
  std::list<uint64_t> order_;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> pos_;
};

// The number after "name": in a JSON text (the first one, or the first element of a list); -1
// when absent.
double jsonNumber(const std::string& json, const std::string& name) {
  size_t at = json.find("\"" + name + "\":");
  if (at == std::string::npos) return -1;
  at = json.find_first_of("0123456789-", at + name.size() + 3);
  return std::strtod(json.c_str() + at, nullptr);
}

std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Belady's MIN over the replay's request model, written plainly: at each eviction, every cached
// id's next use is found in a table of its uses (request, position); the farthest goes, never
// one of the current request's. Quadratic: for short traces.
uint64_t naiveOptimum(const std::vector<std::vector<uint64_t>>& trace, uint64_t capacity) {
  std::unordered_map<uint64_t, std::vector<std::pair<size_t, size_t>>> uses;
  for (size_t r = 0; r < trace.size(); ++r) {
    for (size_t j = 0; j < trace[r].size(); ++j) uses[trace[r][j]].emplace_back(r, j);
  }
  const auto nextUse = [&](uint64_t id, size_t after) {
    const auto& u = uses[id];
    auto it = std::upper_bound(u.begin(), u.end(), std::make_pair(after, SIZE_MAX));
    return it == u.end() ? std::make_pair(SIZE_MAX, size_t{0}) : *it;
  };
  std::vector<uint64_t> cache;
  const auto cached = [&](uint64_t id) {
    return std::find(cache.begin(), cache.end(), id) != cache.end();
  };
  uint64_t hits = 0;
  for (size_t r = 0; r < trace.size(); ++r) {
    const auto& ids = trace[r];
    size_t hit = 0;
    while (hit < ids.size() && cached(ids[hit])) ++hit;
    hits += hit;
    for (uint64_t id : ids) {
      if (cached(id)) continue;
      if (cache.size() >= capacity) {
        size_t victim = cache.size();
        for (size_t i = 0; i < cache.size(); ++i) {
          if (std::find(ids.begin(), ids.end(), cache[i]) != ids.end()) continue;
          if (victim == cache.size() || nextUse(cache[i], r) > nextUse(cache[victim], r))
            victim = i;
        }
        if (victim == cache.size()) continue;
        cache.erase(cache.begin() + static_cast<std::ptrdiff_t>(victim));
      }
      cache.push_back(id);
    }
  }
  return hits;
}

std::vector<replay::TraceRequest> asRequests(const std::vector<std::vector<uint64_t>>& ids) {
  std::vector<replay::TraceRequest> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) out[i].hashIds = ids[i];
  return out;
}

TEST(ReplayOptimum, EvictsTheFarthestNeverTheCurrentRequestsAndKeepsPrefixes) {
  // Ids 1 and 2 are both needed next by the third request: the deeper one (2) goes, so that the
  // third request still hits its first block. An LRU would drop 1 and hit nothing.
  EXPECT_EQ(replay::beladyHitBlocks(asRequests({{1, 2}, {3}, {1, 2}}), 2), 1u);
  // A request longer than the cache keeps what it found (its own ids are never evicted).
  EXPECT_EQ(replay::beladyHitBlocks(asRequests({{1, 2}, {1, 2, 3}, {1, 2}}), 2), 4u);
  // What is never used again goes first.
  EXPECT_EQ(replay::beladyHitBlocks(asRequests({{1}, {2}, {3}, {1}, {3}}), 2), 2u);
  EXPECT_EQ(replay::beladyHitBlocks(asRequests({{1, 2}, {1, 2}}), 0), 0u);
}

TEST(ReplayOptimum, MatchesAPlainBeladyAndIsNeverBelowTheLru) {
  if (!std::filesystem::exists(kTrace)) GTEST_SKIP() << "the shared trace is absent";
  const auto ids = readHashIds(300);
  const auto requests = asRequests(ids);
  for (uint64_t capacity : {64, 512, 2000}) {
    SCOPED_TRACE(capacity);
    const uint64_t opt = replay::beladyHitBlocks(requests, capacity);
    EXPECT_EQ(opt, naiveOptimum(ids, capacity));
    SimpleLru lru(capacity);
    uint64_t lruHits = 0;
    for (const auto& r : ids) lruHits += lru.request(r);
    EXPECT_GE(opt, lruHits);
  }
}

class ReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kTrace)) {
      GTEST_SKIP() << "the shared trace is absent (" << kTrace << "): nothing to replay";
    }
    trace_ = readHashIds(kRequests);
    ASSERT_EQ(trace_.size(), kRequests);
    for (const auto& r : trace_) blocks_ += r.size();
  }
  // `kvtier replay` of the first `limit` requests against `daemon` at kCapacity, with `extra`
  // arguments: false (a failure naming the tool's output) unless it exits 0; `doc` gets its JSON,
  // `output` (if given) what it printed.
  [[nodiscard]] static bool replaySlice(const test::DaemonProcess& daemon, std::string& doc,
                                        const std::vector<std::string>& extra = {},
                                        size_t limit = kRequests, std::string* output = nullptr) {
    const std::string json = daemon.dataDir() + "/replay.json";
    std::vector<std::string> args = {"--socket", daemon.socket(),       "replay",
                                     kTrace,     "--capacity",          std::to_string(kCapacity),
                                     "--limit",  std::to_string(limit), "--json",
                                     json};
    args.insert(args.end(), extra.begin(), extra.end());
    std::string printed;
    const int status = test::runTool(args, &printed);
    if (output) *output = printed;
    EXPECT_EQ(status, 0) << printed;
    doc = readAll(json);
    return status == 0;
  }
  std::vector<std::vector<uint64_t>> trace_;
  uint64_t blocks_ = 0;
};

// The daemon with its eviction policy set to LRU (the default is ARC: docs/cache-policy.md).
const std::vector<std::string> kLru = {"--eviction", "lru"};

// One daemon, cold tier off: what it keeps is what an LRU of its pool keeps, request by request.
TEST_F(ReplayTest, OneNodeHitsWhatAnLruOfItsPoolHits) {
  test::DaemonProcess daemon(kCapacity * kBlockBytes, "", kLru);
  std::string doc;
  ASSERT_TRUE(replaySlice(daemon, doc));
  for (const char* field : {"runs", "capacity_blocks", "nodes", "requests", "hit_rate",
                            "ideal_lru_hit_rate", "hit_blocks", "ideal_lru_hit_blocks"}) {
    EXPECT_NE(doc.find("\"" + std::string(field) + "\":"), std::string::npos) << field;
  }
  EXPECT_EQ(jsonNumber(doc, "requests"), kRequests);
  EXPECT_EQ(jsonNumber(doc, "blocks"), blocks_);
  EXPECT_EQ(jsonNumber(doc, "nodes"), 1);
  EXPECT_EQ(jsonNumber(doc, "capacity_blocks"), kCapacity);
  EXPECT_EQ(jsonNumber(doc, "daemon_capacity_blocks"), kCapacity);  // the pool holds exactly that
  EXPECT_EQ(jsonNumber(doc, "errors"), 0);
  EXPECT_EQ(jsonNumber(doc, "wrong_blocks"), 0);

  SimpleLru lru(kCapacity);
  uint64_t hits = 0;
  for (const auto& r : trace_) hits += lru.request(r);
  ASSERT_EQ(hits, 3543u) << "this LRU, or the slice of the trace, is not what it was";
  // The tool's own anchor is the same LRU.
  EXPECT_EQ(jsonNumber(doc, "ideal_lru_hit_blocks"), hits);
  // The daemon: exactly the hits of an LRU that lets a request's blocks go tail first (a
  // sequential replay on one node is deterministic), which are at least the textbook LRU's.
  SimpleLru tailFirst(kCapacity, /*tailFirst=*/true);
  uint64_t tailFirstHits = 0;
  for (const auto& r : trace_) tailFirstHits += tailFirst.request(r);
  EXPECT_EQ(jsonNumber(doc, "hit_blocks"), tailFirstHits);
  EXPECT_GE(tailFirstHits, hits);
  EXPECT_NEAR(jsonNumber(doc, "hit_rate"), double(tailFirstHits) / double(blocks_), 1e-6);
  EXPECT_GT(jsonNumber(doc, "evictions"), 0);
  // The offline optimum of the same capacity, and the share of the LRU-to-optimum gap closed.
  std::vector<replay::TraceRequest> requests(trace_.size());
  for (size_t i = 0; i < trace_.size(); ++i) requests[i].hashIds = trace_[i];
  const uint64_t opt = replay::beladyHitBlocks(requests, kCapacity);
  EXPECT_GT(opt, tailFirstHits);
  EXPECT_EQ(jsonNumber(doc, "opt_hit_blocks"), opt);
  EXPECT_NEAR(jsonNumber(doc, "opt_hit_rate"), double(opt) / double(blocks_), 1e-6);
  EXPECT_NEAR(jsonNumber(doc, "gap_closed"),
              (double(tailFirstHits) - double(hits)) / (double(opt) - double(hits)), 1e-4);
  EXPECT_NE(doc.find("\"opt_curve\": [[500, "), std::string::npos);
}

// Two daemons that are not a cluster, requests dealt round-robin: each keeps what an LRU of its
// own requests keeps, and the report's isolated anchor says so.
TEST_F(ReplayTest, TwoIsolatedNodesRoundRobinHitWhatTwoLrusHit) {
  constexpr uint64_t kEach = kCapacity / 2;
  test::DaemonProcess a(kEach * kBlockBytes, "", kLru), b(kEach * kBlockBytes, "", kLru);
  const std::string json = a.dataDir() + "/replay.json";
  std::string output;
  ASSERT_EQ(test::runTool({"replay", kTrace, "--nodes", a.socket() + "," + b.socket(), "--route",
                           "round-robin", "--capacity", std::to_string(kEach), "--limit",
                           std::to_string(kRequests), "--json", json},
                          &output),
            0)
      << output;
  const std::string doc = readAll(json);
  SimpleLru lrus[2] = {SimpleLru(kEach), SimpleLru(kEach)}, whole(2 * kEach);
  uint64_t hits = 0, wholeHits = 0;
  for (size_t i = 0; i < trace_.size(); ++i) {
    hits += lrus[i % 2].request(trace_[i]);
    wholeHits += whole.request(trace_[i]);
  }
  EXPECT_EQ(jsonNumber(doc, "nodes"), 2);
  EXPECT_EQ(jsonNumber(doc, "requests_per_node"), kRequests / 2);
  EXPECT_EQ(jsonNumber(doc, "isolated_lru_hit_blocks"), hits);
  EXPECT_EQ(jsonNumber(doc, "ideal_lru_hit_blocks"), wholeHits);
  EXPECT_EQ(jsonNumber(doc, "hit_blocks"), hits);
  EXPECT_EQ(jsonNumber(doc, "errors"), 0);
  EXPECT_EQ(jsonNumber(doc, "wrong_blocks"), 0);
}

// `--whole`: every request put from position 0, hit blocks included, as an engine that saves
// every request it computed does. The daemon reuses the blocks it holds instead of allocating
// for them, so such an engine loses nothing: it hits what one that puts only the missed blocks
// hits (less at most one block: the scratch block a whole put writes reused blocks into), and
// the daemon evicts no more than the missed blocks need.
TEST_F(ReplayTest, WholePutsHitWhatPutsOfTheMissedBlocksHit) {
  std::string docs[2];
  for (int whole = 0; whole < 2; ++whole) {
    test::DaemonProcess daemon(kCapacity * kBlockBytes, "", kLru);
    ASSERT_TRUE(
        replaySlice(daemon, docs[whole],
                    whole ? std::vector<std::string>{"--whole"} : std::vector<std::string>{}));
  }
  const std::string& missed = docs[0];
  const std::string& whole = docs[1];
  EXPECT_NE(missed.find("\"put\": \"missed\""), std::string::npos);
  EXPECT_NE(whole.find("\"put\": \"whole\""), std::string::npos);
  const double hits = jsonNumber(whole, "hit_blocks");
  EXPECT_LE(hits, jsonNumber(missed, "hit_blocks"));
  EXPECT_GE(hits, jsonNumber(missed, "hit_blocks") - 1);
  EXPECT_GE(hits, jsonNumber(whole, "ideal_lru_hit_blocks"));
  // Each missed block is allocated once; the pool starts empty: evictions are the missed blocks
  // beyond the pool, plus at most the scratch block.
  EXPECT_LE(jsonNumber(whole, "evictions"), double(blocks_) - hits - double(kCapacity) + 1);
  EXPECT_EQ(jsonNumber(whole, "verified_blocks"), hits) << "every hit block is checked";
  EXPECT_EQ(jsonNumber(whole, "wrong_blocks"), 0);
  EXPECT_EQ(jsonNumber(whole, "errors"), 0);
}

// The daemon's default policy (adaptive: 2Q on this trace) hits at least 1 pp of the blocks more
// than the ideal LRU anchor of the same capacity, with either way of putting.
// A hybrid model's cache through a real daemon under LRU: its hits are about what an LRU of blocks
// and states (computed here, independently of replay.cc) hits, every hit's blocks and state are
// the ones put, and states every 8 blocks hit no more than states at every block would in the same
// LRU (at twice the states' bytes here: the spacing's cost and its saving, as figures).
class StateModel {
 public:
  StateModel(uint64_t capacity, uint64_t stateBlocks, uint64_t spacing)
      : capacity_(capacity), state_(stateBlocks), spacing_(spacing) {}
  uint64_t request(const std::vector<uint64_t>& ids) {
    const uint64_t kState = uint64_t{1} << 63;
    size_t hit = 0;
    while (hit < ids.size() && pos_.count(ids[hit])) ++hit;
    while (hit > 0 && !pos_.count(ids[hit - 1] | kState)) --hit;
    if (hit > 0) {
      use(ids[hit - 1] | kState, state_);
      for (size_t b = hit; b-- > 0;) use(ids[b], 1);
    }
    for (size_t b = hit; b < ids.size(); ++b) {
      use(ids[b], 1);
      if ((b + 1) % spacing_ == 0 || b + 1 == ids.size()) use(ids[b] | kState, state_);
    }
    return hit;
  }

 private:
  void use(uint64_t id, uint64_t weight) {
    if (auto it = pos_.find(id); it != pos_.end()) {
      order_.splice(order_.end(), order_, it->second.first);
      return;
    }
    order_.push_back(id);
    pos_[id] = {std::prev(order_.end()), weight};
    used_ += weight;
    while (used_ > capacity_) {
      auto victim = pos_.find(order_.front());
      used_ -= victim->second.second;
      pos_.erase(victim);
      order_.pop_front();
    }
  }
  uint64_t capacity_, state_, spacing_, used_ = 0;
  std::list<uint64_t> order_;
  std::unordered_map<uint64_t, std::pair<std::list<uint64_t>::iterator, uint64_t>> pos_;
};

TEST_F(ReplayTest, AHybridModelsCacheHitsWhatAnLruOfBlocksAndStatesHits) {
  constexpr size_t kHybridRequests = 600;
  test::DaemonProcess daemon(kCapacity * kBlockBytes, "", kLru);
  std::string doc, output;
  ASSERT_TRUE(replaySlice(daemon, doc, {"--state-blocks", "2", "--checkpoint-blocks", "8"},
                          kHybridRequests, &output));
  StateModel spaced(kCapacity, 2, 8), every(kCapacity, 2, 1);
  uint64_t spacedHits = 0, everyHits = 0, blocks = 0;
  for (const auto& ids : readHashIds(kHybridRequests)) {
    spacedHits += spaced.request(ids);
    everyHits += every.request(ids);
    blocks += ids.size();
  }
  EXPECT_GT(spacedHits, 0u);
  // The daemon's LRU differs from the model in the order a request's blocks and states become
  // evictable (the states at their commits, the blocks at the sequence's removal) and in the
  // scratch block of whole puts: within 3% of the model's hits.
  EXPECT_NEAR(jsonNumber(doc, "hit_blocks"), double(spacedHits), 0.03 * double(spacedHits))
      << output;
  EXPECT_NEAR(jsonNumber(doc, "model_states_hit_rate"), double(spacedHits) / blocks, 1e-6);
  EXPECT_NEAR(jsonNumber(doc, "model_every_block_hit_rate"), double(everyHits) / blocks, 1e-6);
  EXPECT_GT(jsonNumber(doc, "states_put"), 0);
  EXPECT_EQ(jsonNumber(doc, "wrong_blocks"), 0);
  EXPECT_EQ(jsonNumber(doc, "errors"), 0);
}

TEST_F(ReplayTest, TheDefaultPolicyBeatsTheLruAnchorByAPointInBothPutModes) {
  for (const bool whole : {false, true}) {
    test::DaemonProcess daemon(kCapacity * kBlockBytes);
    std::string doc;
    ASSERT_TRUE(replaySlice(
        daemon, doc, whole ? std::vector<std::string>{"--whole"} : std::vector<std::string>{}));
    SCOPED_TRACE(whole ? "whole" : "missed");
    EXPECT_GE(jsonNumber(doc, "hit_blocks"),
              jsonNumber(doc, "ideal_lru_hit_blocks") + double(blocks_) / 100);
    EXPECT_GE(jsonNumber(doc, "diff_pp"), 1.0);
    EXPECT_EQ(jsonNumber(doc, "wrong_blocks"), 0);
    EXPECT_EQ(jsonNumber(doc, "errors"), 0);
  }
}

// Every policy, run by a daemon, hits exactly what the same policy hits through the engine in
// process (what `kvtier replay --policies` and the policy figures rest on), and every hit block's
// bytes are the ones put.
TEST_F(ReplayTest, EveryPolicyOnADaemonHitsWhatTheEngineInProcessHits) {
  const auto requests = asRequests(trace_);
  for (const char* name : {"s3fifo", "sieve", "adaptive", "2q"}) {
    SCOPED_TRACE(name);
    auto kind = parseEvictionKind(name);
    ASSERT_TRUE(kind.ok());
    const replay::PolicyOutcome inProcess = replay::replayThroughEngine(requests, kCapacity, *kind);
    ASSERT_EQ(inProcess.errors, 0u);
    test::DaemonProcess daemon(kCapacity * kBlockBytes, "", {"--eviction", name});
    std::string doc;
    ASSERT_TRUE(replaySlice(daemon, doc));
    EXPECT_EQ(jsonNumber(doc, "hit_blocks"), double(inProcess.hits));
    EXPECT_EQ(jsonNumber(doc, "verified_blocks"), double(inProcess.hits));
    EXPECT_EQ(jsonNumber(doc, "wrong_blocks"), 0);
    EXPECT_EQ(jsonNumber(doc, "errors"), 0);
  }
}

// The report sets the daemons' hit rate against the anchors only when they simulate what the
// daemons are: a fresh daemon whose pool is the capacity. A pool of another size, or a daemon that
// held blocks before the run, is said before the table, with what to change, and the comparisons
// are left out; an optimum equal to the LRU is said in words. Nothing reads "nan".
TEST_F(ReplayTest, TheReportComparesOnlyWhatTheAnchorsSimulate) {
  auto replay = [&](const test::DaemonProcess& daemon, size_t limit, std::string* out) {
    std::string doc;
    (void)replaySlice(daemon, doc, {}, limit, out);  // a failure is reported; the checks go on
    EXPECT_EQ(out->find("nan"), std::string::npos) << *out;
    return doc;
  };
  // Where the warning stands: before the table (whose header names the hit rate).
  auto warnedUpFront = [](const std::string& out) {
    const size_t warning = out.find("NOT COMPARABLE");
    return warning != std::string::npos && warning < out.find("hit rate");
  };
  auto compares = [](const std::string& out) {
    return out.find(" pp") != std::string::npos || out.find("closed") != std::string::npos;
  };

  test::DaemonProcess daemon(kCapacity * kBlockBytes, "", kLru);
  std::string out;
  std::string doc = replay(daemon, kRequests, &out);
  EXPECT_FALSE(warnedUpFront(out)) << out;
  EXPECT_TRUE(compares(out)) << out;
  EXPECT_NE(doc.find("\"comparable\": true"), std::string::npos);
  EXPECT_NE(doc.find("\"not_comparable_because\": []"), std::string::npos);

  // The same daemon again: it holds the first run's blocks, the anchors start empty.
  doc = replay(daemon, kRequests, &out);
  EXPECT_TRUE(warnedUpFront(out)) << out;
  EXPECT_NE(out.find("blocks in memory and 0 on disk before the run"), std::string::npos) << out;
  EXPECT_NE(out.find("replay on fresh daemons"), std::string::npos) << out;
  EXPECT_FALSE(compares(out)) << out;
  EXPECT_NE(doc.find("\"comparable\": false"), std::string::npos);
  EXPECT_GT(jsonNumber(doc, "warm_blocks_per_node"), 0);
  EXPECT_GT(jsonNumber(doc, "hit_blocks"), jsonNumber(doc, "ideal_lru_hit_blocks"));

  // A pool twice the capacity the anchors assume.
  test::DaemonProcess bigger(2 * kCapacity * kBlockBytes, "", kLru);
  doc = replay(bigger, kRequests, &out);
  EXPECT_TRUE(warnedUpFront(out)) << out;
  EXPECT_NE(out.find("node 0's pool holds 8192 blocks of the replay's layout, the anchors 4096 "
                     "(start the daemons with --host-pool-bytes $((4096 * 1024)), or pass "
                     "--capacity 8192)"),
            std::string::npos)
      << out;
  EXPECT_FALSE(compares(out)) << out;
  EXPECT_NE(doc.find("\"comparable\": false"), std::string::npos);

  // So few requests that every distinct block fits: the optimum is the LRU, no gap to close.
  test::DaemonProcess fresh(kCapacity * kBlockBytes, "", kLru);
  doc = replay(fresh, 50, &out);
  EXPECT_FALSE(warnedUpFront(out)) << out;
  EXPECT_NE(out.find("no gap: the LRU is optimal at this capacity"), std::string::npos) << out;
  EXPECT_EQ(jsonNumber(doc, "opt_hit_blocks"), jsonNumber(doc, "ideal_lru_hit_blocks"));
  EXPECT_NE(doc.find("\"gap_closed\": null"), std::string::npos);
}

// --plot draws from the run's JSON: --json's file when given, else a temporary one that is gone
// afterwards; the tool says where it wrote what it wrote, and writes nothing else. (The plot
// script is replaced by one that copies its input to the PNG's path: the seam the tool has for it.)
TEST(ReplayPlot, WritesWhatItAnnouncesAndNothingElse) {
  test::DaemonProcess daemon(1000 * kBlockBytes);
  const std::string dir = daemon.dataDir() + "/plot";
  const std::string tmp = daemon.dataDir() + "/tmp";
  std::filesystem::create_directories(dir);
  std::filesystem::create_directories(tmp);
  const std::string script = dir + "/copy.py";
  std::ofstream(script) << "import shutil, sys\nshutil.copy(sys.argv[-1], sys.argv[2])\n";
  struct Env {
    std::string name, saved;
    bool had;
    Env(const char* n, const std::string& value) : name(n) {
      const char* old = std::getenv(n);
      had = old != nullptr;
      saved = old ? old : "";
      ::setenv(n, value.c_str(), 1);
    }
    ~Env() {
      had ? (void)::setenv(name.c_str(), saved.c_str(), 1) : (void)::unsetenv(name.c_str());
    }
  } plotScript("KVTIER_PLOT_SCRIPT", script), tmpDir("TMPDIR", tmp);

  std::string out;
  const std::string png = dir + "/replay.png";
  ASSERT_EQ(test::runTool({"--socket", daemon.socket(), "replay", "--synthetic", "scan", "--limit",
                           "50", "--plot", png},
                          &out),
            0)
      << out;
  EXPECT_NE(out.find("wrote " + png), std::string::npos) << out;
  EXPECT_NE(readAll(png).find("\"runs\""), std::string::npos) << "the plot got the run's JSON";
  EXPECT_FALSE(std::filesystem::exists(png + ".json")) << "an unannounced file";
  EXPECT_TRUE(std::filesystem::is_empty(tmp)) << "the temporary JSON was left behind";
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  EXPECT_EQ(files.size(), 2u) << "the script and the plot, nothing else";

  // With --json, the plot is drawn from that file, and both are announced.
  const std::string json = dir + "/run.json";
  ASSERT_EQ(test::runTool({"--socket", daemon.socket(), "replay", "--synthetic", "scan", "--limit",
                           "50", "--plot", png, "--json", json},
                          &out),
            0)
      << out;
  EXPECT_NE(out.find("wrote " + json), std::string::npos) << out;
  EXPECT_NE(out.find("wrote " + png), std::string::npos) << out;
  EXPECT_EQ(readAll(png), readAll(json));
}

// A synthetic workload is written as a Mooncake-format trace (kept with --trace-out), read back
// as such and replayed; the same seed gives the same workload.
TEST(ReplaySynthetic, WorkloadsAreTracesThatReplay) {
  for (const char* name :
       {"shared-prompts", "scan", "agents", "hot-prompts", "documents", "mixed"}) {
    auto kind = replay::parseSyntheticKind(name);
    ASSERT_TRUE(kind.ok()) << name;
    const auto a = replay::syntheticTrace(*kind, 7), b = replay::syntheticTrace(*kind, 7);
    const auto c = replay::syntheticTrace(*kind, 8);
    ASSERT_GT(a.size(), 1000u) << name;
    ASSERT_EQ(a.size(), b.size());
    bool same = true, differs = a.size() != c.size();
    for (size_t i = 0; i < a.size(); ++i) {
      same = same && a[i].hashIds == b[i].hashIds && a[i].timestampMs == b[i].timestampMs;
      if (i < c.size()) differs = differs || a[i].hashIds != c[i].hashIds;
      auto parsed = replay::parseTraceLine(replay::traceLine(a[i]));
      ASSERT_TRUE(parsed.ok()) << parsed.error().toString();
      ASSERT_EQ(parsed->hashIds, a[i].hashIds);
      ASSERT_EQ(parsed->inputLength, a[i].hashIds.size() * 512);
      if (i > 0) {
        ASSERT_GE(a[i].timestampMs, a[i - 1].timestampMs);
      }
    }
    EXPECT_TRUE(same) << name << ": not deterministic";
    EXPECT_TRUE(differs) << name << ": the seed changes nothing";
  }
  EXPECT_EQ(replay::parseSyntheticKind("zipf").code(), ErrorCode::kInvalidArgument);

  test::DaemonProcess daemon(1000 * kBlockBytes);
  const std::string trace = daemon.dataDir() + "/scan.jsonl";
  const std::string json = daemon.dataDir() + "/replay.json";
  std::string output;
  ASSERT_EQ(test::runTool({"--socket", daemon.socket(), "replay", "--synthetic", "scan", "--limit",
                           "300", "--trace-out", trace, "--json", json},
                          &output),
            0)
      << output;
  auto written = replay::loadTrace(trace);
  ASSERT_TRUE(written.ok()) << written.error().toString();
  const auto expected = replay::syntheticTrace(replay::SyntheticKind::kScan, 1);
  ASSERT_EQ(written->size(), expected.size()) << "the whole workload is kept, --limit or not";
  EXPECT_EQ(written->back().hashIds, expected.back().hashIds);
  const std::string doc = readAll(json);
  EXPECT_EQ(jsonNumber(doc, "requests"), 300);
  EXPECT_GT(jsonNumber(doc, "hit_blocks"), 0);
  EXPECT_EQ(jsonNumber(doc, "errors"), 0);
  // Without --trace-out the trace lives in a temporary directory under $TMPDIR, removed after
  // the run.
  const std::string tmp = daemon.dataDir() + "/tmp";
  std::filesystem::create_directory(tmp);
  const char* oldTmp = std::getenv("TMPDIR");
  const std::string saved = oldTmp ? oldTmp : "";
  ::setenv("TMPDIR", tmp.c_str(), 1);
  const int status = test::runTool(
      {"--socket", daemon.socket(), "replay", "--synthetic", "agents", "--limit", "50"}, &output);
  if (oldTmp) {
    ::setenv("TMPDIR", saved.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find("synthetic:agents seed 1"), std::string::npos) << output;
  EXPECT_TRUE(std::filesystem::is_empty(tmp)) << "the temporary trace was left behind";
  // Neither a trace nor a workload, or both: a usage error.
  EXPECT_EQ(test::runTool({"--socket", daemon.socket(), "replay"}, &output), 2);
  EXPECT_EQ(test::runTool({"--socket", daemon.socket(), "replay", kTrace, "--synthetic", "scan"},
                          &output),
            2);
}

// `kvtier replay --policies`: no daemon, a table of every policy named at each capacity, the best
// and the default's distance to it; a policy it does not know is a usage error.
TEST(ReplayPolicies, ATableOfEveryPolicyAtEachCapacity) {
  std::string output;
  ASSERT_EQ(test::runTool({"replay", "--synthetic", "hot-prompts", "--limit", "1500", "--policies",
                           "lru,arc,sieve", "--capacity", "500,2000"},
                          &output),
            0)
      << output;
  EXPECT_NE(output.find("| capacity | ideal LRU | lru | arc | sieve | best | "), std::string::npos)
      << output;
  EXPECT_NE(output.find("\n| 500 | "), std::string::npos) << output;
  EXPECT_NE(output.find("\n| 2,000 | "), std::string::npos) << output;
  EXPECT_EQ(output.find("nan"), std::string::npos) << output;
  // Every policy by default.
  ASSERT_EQ(test::runTool({"replay", "--synthetic", "agents", "--limit", "300", "--policies",
                           "--capacity", "200"},
                          &output),
            0)
      << output;
  EXPECT_NE(output.find("| lru | arc | 2q | s3fifo | sieve | adaptive (default) |"),
            std::string::npos)
      << output;
  EXPECT_EQ(
      test::runTool({"replay", "--synthetic", "agents", "--policies", "fifo,lru"}, &output, true),
      2);
  EXPECT_NE(output.find("s3fifo"), std::string::npos) << output;
  // One capacity only without --policies (a daemon replay has one anchor).
  EXPECT_EQ(
      test::runTool({"replay", "--synthetic", "agents", "--capacity", "100,200"}, &output, true),
      2);
  EXPECT_NE(output.find("--capacity takes one number"), std::string::npos) << output;
}

// The adaptive policy follows the expert its shadows measure best: on a workload of a few hot
// system prompts in a small cache, where the FIFO family hits far more than ARC (docs/
// cache-policy.md), it leaves ARC and gains most of the difference; where ARC and LRU are best
// (agents) it loses nothing that counts.
TEST(ReplayPolicies, TheAdaptivePolicyFollowsTheBetterExpert) {
  const auto hot = replay::syntheticTrace(replay::SyntheticKind::kHotPrompts);
  const auto arcRun = replay::replayThroughEngine(hot, 1000, EvictionKind::kArc);
  const double arc = arcRun.hitRate();
  EXPECT_EQ(arcRun.following, "arc");  // a fixed policy follows itself
  EXPECT_EQ(arcRun.switches, 0u);
  const double sieve = replay::replayThroughEngine(hot, 1000, EvictionKind::kSieve).hitRate();
  const auto adaptive = replay::replayThroughEngine(hot, 1000, EvictionKind::kAdaptive);
  EXPECT_EQ(adaptive.errors, 0u);
  // The engine's stats say whom it followed: 2Q at first, then the FIFO family, which hits most.
  EXPECT_GE(adaptive.switches, 1u);
  EXPECT_TRUE(adaptive.following == "sieve" || adaptive.following == "s3fifo")
      << adaptive.following;
  ASSERT_GT(sieve, arc + 0.05) << "the workload no longer separates the experts";
  EXPECT_GT(adaptive.hitRate(), arc + 0.6 * (sieve - arc))
      << "arc " << arc << ", sieve " << sieve << ", adaptive " << adaptive.hitRate();
  const auto agents = replay::syntheticTrace(replay::SyntheticKind::kAgents);
  const double arcAgents = replay::replayThroughEngine(agents, 6000, EvictionKind::kArc).hitRate();
  EXPECT_GE(replay::replayThroughEngine(agents, 6000, EvictionKind::kAdaptive).hitRate(),
            arcAgents - 0.002);
}

TEST(ReplayTrace, ParsesALineAndRefusesBadOnes) {
  auto r = replay::parseTraceLine(
      R"({"timestamp": 40, "input_length": 23769, "output_length": 3, "hash_ids": [151, 152]})");
  ASSERT_TRUE(r.ok()) << r.error().toString();
  EXPECT_EQ(r->timestampMs, 40u);
  EXPECT_EQ(r->inputLength, 23769u);
  EXPECT_EQ(r->outputLength, 3u);
  EXPECT_EQ(r->hashIds, (std::vector<uint64_t>{151, 152}));
  for (const char* bad :
       {R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": []})",
        R"({"timestamp": 0, "input_length": 1, "output_length": 1})",
        R"({"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]})",
        R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1, x]})",
        R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1, 2)"}) {
    EXPECT_EQ(replay::parseTraceLine(bad).code(), ErrorCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace kvtier
