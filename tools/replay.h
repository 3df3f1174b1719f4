// Trace replay: `kvtier replay TRACE` plays a Mooncake-format trace (one JSON object a line:
// timestamp, input_length, output_length, hash_ids) against running kvtierd daemons through the
// SDK, and in the same run computes the anchors its hit rate is judged against (BENCH.md): an
// offline ideal LRU of the same total capacity over the same request order and, for several
// nodes, as many isolated LRUs with the same routing. docs/replay.md describes the method.
//
// One trace block is one kvtier block of 16 tokens in a tiny layout (1 KiB blocks), so a daemon's
// pool of C KiB holds C blocks and capacity is counted in blocks on both sides.
//
// Not thread-safe: a replay runs on the calling thread and owns its clients.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/error.h"
#include "kvtier/layout.h"

namespace kvtier {

// The `kvtier replay` command; `argv` holds the `argc` arguments after "replay". `socket` is the
// tool's --socket (the node when --nodes is not given). Returns the process exit status: 0, 1 when
// the replay failed or met errors, 2 on bad arguments.
int replayMain(const std::string& socket, int argc, char** argv);

namespace replay {

struct TraceRequest {
  uint64_t timestampMs = 0;
  uint64_t inputLength = 0, outputLength = 0;
  std::vector<uint64_t> hashIds;  // one per trace block; never empty
};

// Bounds on what a trace file may hold (a line is input: checked, never trusted).
inline constexpr size_t kMaxTraceLineBytes = size_t{1} << 20;
// A request's blocks: kvtier's per-lease bound is far above any real prompt's 512-token blocks.
inline constexpr size_t kMaxBlocksPerRequest = 65536;

// One trace line. INVALID_ARGUMENT when a field is missing or not a non-negative integer, or
// hash_ids is empty or longer than kMaxBlocksPerRequest.
Result<TraceRequest> parseTraceLine(std::string_view line);
// The first `limit` requests of the file (0: all), blank lines skipped. INVALID_ARGUMENT naming
// the file and line of the first bad one; NOT_FOUND when the file cannot be read.
Result<std::vector<TraceRequest>> loadTrace(const std::string& path, size_t limit = 0);

// The layout a replay opens: 1 layer, 1 KV head, head dim 16, fp16, 16 tokens per block; with
// `stateBlocks`, a state of that many blocks' bytes (a hybrid model's cache).
Layout replayLayout(uint32_t stateBlocks = 0);
// A trace block's kvtier key: the first 16 bytes of SHA-256 of the hash id's decimal text.
Key128 blockKey(uint64_t hashId);

enum class Route : uint8_t {
  kRoundRobin,  // request i goes to node i mod N
  kSession,     // by the request's first hash id: requests sharing a prefix meet on one node
};
const char* routeName(Route route);
// The node (0..nodes-1) that serves request `index`.
size_t routeRequest(Route route, size_t index, const TraceRequest& request, size_t nodes);

// The offline ideal LRU, in blocks. access(): the hit is the longest prefix of `ids` present;
// then every id is touched in order (moved to most recently used, or inserted, evicting the
// least recently used beyond capacity). O(1) per id.
class LruCache {
 public:
  explicit LruCache(uint64_t capacity) : capacity_(capacity) {}
  // Returns the number of hit blocks.
  size_t access(std::span<const uint64_t> ids);
  // How many of ids[from..] are present, from `from` on, before the first that is not.
  size_t run(std::span<const uint64_t> ids, size_t from) const;
  // Moves `id` to most recently used if present.
  void touch(uint64_t id);
  // Touches `id` if present, else inserts it, evicting the least recently used beyond capacity;
  // `leastRecent`: a new id goes in as the least recently used (the next to go).
  void insert(uint64_t id, bool leastRecent = false);
  uint64_t size() const { return order_.size(); }
  uint64_t capacity() const { return capacity_; }

 private:
  uint64_t capacity_;
  std::list<uint64_t> order_;  // front: least recently used
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where_;
};

// An offline model of a cluster of LRUs (`nodes`, one per member) serving a request on node `at`:
// its local prefix, then runs held by other nodes (the holder of the longest run from each point,
// its blocks touched there as a pin and release does), up to the first block no node holds; then
// the request's blocks enter node `at` in order — a remote hit is a copy, as kvtier's fetch makes
// one. `fetchedLeastRecent`: the fetched copies go in as least recently used instead (a what-if:
// duplicates evicted first). Returns the hit blocks.
size_t clusterModelAccess(std::vector<LruCache>& nodes, size_t at, std::span<const uint64_t> ids,
                          bool fetchedLeastRecent);

// A hybrid model's prefix cache (prefix states, docs/cache-shapes.md) as an LRU of blocks and
// states, offline: a state takes `stateBlocks` blocks of the capacity. access(): the hit is the
// deepest block boundary k whose blocks [0, k) and state at k are all cached (a restore needs the
// state); they are touched (the state first, then the blocks last first, as a lookup's release
// does); then every block of the request enters, and a state at each `spacing`-th boundary past
// the hit and at the request's end, evicting the least recently used beyond capacity.
class StateLru {
 public:
  StateLru(uint64_t capacity, uint32_t stateBlocks, uint32_t spacing)
      : capacity_(capacity), stateBlocks_(stateBlocks), spacing_(spacing) {}
  // Returns the number of hit blocks.
  size_t access(std::span<const uint64_t> ids);
  uint32_t spacing() const { return spacing_; }

 private:
  // A state's id: the id of the block it follows with the top bit set (trace ids are chained:
  // the same id means the same prefix).
  static uint64_t stateId(uint64_t block) { return block | (uint64_t{1} << 63); }
  bool has(uint64_t id) const { return where_.count(id) != 0; }
  void touch(uint64_t id);
  void insert(uint64_t id, uint64_t weight);

  uint64_t capacity_, used_ = 0;
  uint32_t stateBlocks_, spacing_;
  std::list<uint64_t> order_;  // front: least recently used
  std::unordered_map<uint64_t, std::pair<std::list<uint64_t>::iterator, uint64_t>> where_;
};

// Belady's MIN, the offline optimum, over the request model of LruCache::access: the hit is the
// longest cached prefix of a request's ids; then each of its ids enters the cache (no bypass),
// and one that needs room evicts the cached id whose next request is farthest away — never one of
// the current request's own. Among ids the same next request needs, the deepest there goes first
// (that request's lookup stops at the first id it misses).
class OfflineOptimum {
 public:
  // One backward pass over `trace` (which must outlive this object): each block's next use.
  explicit OfflineOptimum(std::span<const TraceRequest> trace);
  // The hit blocks over the trace with `capacity` blocks. O(blocks log capacity).
  uint64_t hitBlocks(uint64_t capacity) const;

 private:
  std::span<const TraceRequest> trace_;
  // nextUse_[r][j]: the next use of request r's id j, (request << 32) | position, ordered
  // farthest last; never used again: trace.size() << 32.
  std::vector<std::vector<uint64_t>> nextUse_;
};

// OfflineOptimum(trace).hitBlocks(capacity).
uint64_t beladyHitBlocks(std::span<const TraceRequest> trace, uint64_t capacity);

struct ReplayOptions {
  std::vector<std::string> sockets;  // one per node, at least one
  // Blocks per node the anchors assume; 0: the first daemon's own (the space's blocks total).
  uint64_t capacityBlocks = 0;
  Route route = Route::kSession;
  double speedup = 0;  // replay at this multiple of the trace's timestamps; 0: as fast as possible
  std::string tracePath;  // for the report only
  // How a request puts its blocks. false: a lookup bound to the request's sequence, then a put of
  // the missed blocks after the hit. true (`--whole`): a plain lookup (its blocks read and let
  // go), then a put of the whole request from position 0 with all its keys, the hit blocks
  // included — what an engine that saves every request it computed does; the daemon reuses the
  // cached blocks instead of allocating for them.
  bool whole = false;
  // A hybrid model's cache (`--state-blocks S --checkpoint-blocks C`): the layout has a state of
  // S blocks' bytes; each request's lookup answers the deepest boundary with a state (whole
  // puts), and a state is put at every C-th block boundary past the hit and at the request's end.
  // 0: a plain KV cache.
  uint32_t stateBlocks = 0;
  uint32_t checkpointBlocks = 0;
};

struct Percentiles {
  double p50 = 0, p99 = 0, max = 0;
};

// What one replay measured. Rates are fractions of blocks, as the trace counts them: hit blocks
// over all request blocks.
struct ReplayRun {
  std::string tracePath, daemonVersion;
  Route route = Route::kSession;
  bool whole = false;  // ReplayOptions::whole
  double speedup = 0;
  size_t nodes = 0;
  uint64_t requests = 0, blocks = 0, distinctBlocks = 0;
  uint64_t capacityBlocks = 0;                 // per node, as the anchors assume
  std::vector<uint64_t> daemonCapacityBlocks;  // per node, as each daemon reports its space
  std::vector<uint64_t> requestsPerNode;
  uint64_t hitBlocks = 0;          // what the daemons' lookups matched (local and remote)
  uint64_t idealHitBlocks = 0;     // one ideal LRU of nodes x capacity
  uint64_t isolatedHitBlocks = 0;  // nodes isolated LRUs of capacity each, same routing
  uint64_t infiniteHitBlocks = 0;  // a cache that never evicts
  // Several nodes: clusterModelAccess over nodes LRUs of capacity each, same routing; fetched
  // blocks copied as most recent (what kvtier does) and as least recent (the what-if).
  uint64_t modelHitBlocks = 0, modelFetchedLastHitBlocks = 0;
  // Belady's MIN of the same total capacity over the same request order (beladyHitBlocks).
  uint64_t optHitBlocks = 0;
  // The ideal LRU and the optimum over the same requests at other total capacities (the plot's
  // curves).
  std::vector<std::pair<uint64_t, uint64_t>> idealCurve;  // (capacity, hit blocks)
  std::vector<std::pair<uint64_t, uint64_t>> optCurve;    // (capacity, hit blocks)
  // Daemon counters over the run, summed over the nodes.
  uint64_t evictions = 0, remoteHitBlocks = 0, remoteLookups = 0, fetchErrors = 0;
  // After the run (cluster only): copies held (sum of each node's published keys) and distinct
  // keys (sum of each home's directory entries), once nothing is left to publish.
  uint64_t heldKeys = 0, distinctKeys = 0;
  std::vector<uint64_t> blocksUsedPerNode;
  // A hybrid model's cache (ReplayOptions::stateBlocks): states put, and StateLru over the same
  // requests with the total capacity, states every checkpointBlocks and at every block.
  uint32_t stateBlocks = 0, checkpointBlocks = 0;
  uint64_t statesPut = 0;
  uint64_t modelStatesHitBlocks = 0, modelEveryBlockHitBlocks = 0;
  // What the daemons held before the run: blocks of the replay's block size in each node's pool,
  // and records in their cold tiers; and the blocks their cold tiers gave back during it.
  std::vector<uint64_t> warmBlocksPerNode;
  uint64_t coldRecordsBefore = 0, promotedBlocks = 0;
  // Why the daemons' hit rate cannot be set against the anchors, which simulate `nodes` empty
  // caches of capacityBlocks each and nothing else (pools of another size, a warm daemon, a cold
  // tier serving hits); empty when it can. The report then leaves its comparisons (pp, ratios,
  // gap closed) out; the JSON keeps them, beside "comparable": false and these reasons.
  std::vector<std::string> notComparable;
  bool comparable() const { return notComparable.empty(); }
  uint64_t verifiedBlocks = 0, wrongBlocks = 0;  // hit blocks (and states) whose bytes were checked
  uint64_t errors = 0;
  std::string firstError;
  uint64_t slowLookups = 0;  // lookups that took a second or more (a peer deadline is 2 s)
  double wallSeconds = 0, maxLagMs = 0;
  Percentiles lookupMs, requestMs;

  double rate(uint64_t hits) const { return blocks ? double(hits) / double(blocks) : 0.0; }
  double hitRate() const { return rate(hitBlocks); }
  double idealHitRate() const { return rate(idealHitBlocks); }
  // The share of the distance from the ideal LRU to the optimum that the daemons covered
  // (negative below the LRU; NaN when the optimum is the LRU: at this capacity there is no gap,
  // e.g. every distinct block fits).
  double gapClosed() const {
    return optHitBlocks == idealHitBlocks ? std::nan("")
                                          : (double(hitBlocks) - double(idealHitBlocks)) /
                                                (double(optHitBlocks) - double(idealHitBlocks));
  }
};

// Called after each request: requests done, of total, and the running hit and ideal blocks.
using ProgressFn = std::function<void(size_t done, size_t total, const ReplayRun& so_far)>;

// Replays `trace` in order, one request at a time. Per request, on its node: lookupKeys of its
// keys bound to a private sequence (the hit prefix becomes that sequence), a put of the missed
// blocks from the hit's end with their keys, then the sequence's removal, which leaves every
// block sealed, unpinned and evictable in the daemon's cache. With options.whole: a lookup not
// bound to any sequence, then a put of the whole request from position 0 with all its keys.
// Every hit block's bytes are checked either way. Errors: UNAVAILABLE when a daemon cannot be
// reached (then or midway); other failed calls are counted in the run.
Result<ReplayRun> replayTrace(std::span<const TraceRequest> trace, const ReplayOptions& options,
                              const ProgressFn& progress = {});

// ReplayRun::notComparable of a run: one sentence per reason, saying what to change.
std::vector<std::string> whyNotComparable(const ReplayRun& run);

// The run as one JSON object, and a document holding a list of runs.
std::string runJson(const ReplayRun& run);
std::string runsJson(std::span<const ReplayRun> runs);

}  // namespace replay
}  // namespace kvtier
