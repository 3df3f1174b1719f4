#include "tools/replay.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <unordered_set>

#include "kvtier/client.h"
#include "tools/json_string.h"
#include "tools/synthetic_trace.h"

extern char** environ;

namespace kvtier::replay {
namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Skips spaces; true if `c` is next (and consumes it).
bool expect(std::string_view s, size_t& at, char c) {
  while (at < s.size() && (s[at] == ' ' || s[at] == '\t')) ++at;
  if (at >= s.size() || s[at] != c) return false;
  ++at;
  return true;
}

// A non-negative integer; a fractional part (a timestamp in fractional ms) is read and dropped.
std::optional<uint64_t> number(std::string_view s, size_t& at) {
  while (at < s.size() && (s[at] == ' ' || s[at] == '\t')) ++at;
  const size_t start = at;
  uint64_t v = 0;
  while (at < s.size() && s[at] >= '0' && s[at] <= '9') {
    if (v > (UINT64_MAX - 9) / 10) return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(s[at++] - '0');
  }
  if (at == start) return std::nullopt;
  if (at < s.size() && s[at] == '.') {
    ++at;
    while (at < s.size() && s[at] >= '0' && s[at] <= '9') ++at;
  }
  return v;
}

// Position right after `"name":`, or npos.
size_t fieldValue(std::string_view line, std::string_view name) {
  const std::string quoted = "\"" + std::string(name) + "\"";
  size_t at = line.find(quoted);
  if (at == std::string_view::npos) return at;
  at += quoted.size();
  if (!expect(line, at, ':')) return std::string_view::npos;
  return at;
}

std::string fixed(double v, int digits = 6) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

template <typename T>
std::string list(const std::vector<T>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  p.p50 = v[v.size() / 2];
  p.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  p.max = v.back();
  return p;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Total capacities of the ideal curve the report carries for the plot (blocks).
constexpr uint64_t kCurveCapacities[] = {500,   1000,  2000,  3000,  4000,  6000,  8000, 10000,
                                         12000, 15000, 20000, 25000, 30000, 40000, 50000};

// One node of the replay: its client, space, and counters at the start.
struct Node {
  std::string socket;
  std::unique_ptr<Client> client;
  std::unique_ptr<Space> space;
  Stats before;
};

Result<Stats> nodeStats(Node& node) { return node.client->stats(); }

uint64_t fetchErrorsOf(const Stats& s) {
  return s.fetchTimeouts + s.fetchUnavailable + s.fetchTransfer + s.fetchChecksum + s.fetchFull;
}

}  // namespace

Result<TraceRequest> parseTraceLine(std::string_view line) {
  TraceRequest r;
  const std::pair<const char*, uint64_t*> scalars[] = {{"timestamp", &r.timestampMs},
                                                       {"input_length", &r.inputLength},
                                                       {"output_length", &r.outputLength}};
  for (const auto& [name, out] : scalars) {
    size_t at = fieldValue(line, name);
    if (at == std::string_view::npos) {
      return makeError(ErrorCode::kInvalidArgument, "no \"", name, "\" field");
    }
    auto v = number(line, at);
    if (!v) return makeError(ErrorCode::kInvalidArgument, "\"", name, "\" is not a number >= 0");
    *out = *v;
  }
  size_t at = fieldValue(line, "hash_ids");
  if (at == std::string_view::npos || !expect(line, at, '[')) {
    return makeError(ErrorCode::kInvalidArgument, "no \"hash_ids\" list");
  }
  if (!expect(line, at, ']')) {
    do {
      auto v = number(line, at);
      if (!v) return makeError(ErrorCode::kInvalidArgument, "a hash id is not a number >= 0");
      if (r.hashIds.size() == kMaxBlocksPerRequest) {
        return makeError(ErrorCode::kInvalidArgument, "more than ", kMaxBlocksPerRequest,
                         " hash ids");
      }
      r.hashIds.push_back(*v);
    } while (expect(line, at, ','));
    if (!expect(line, at, ']')) return makeError(ErrorCode::kInvalidArgument, "bad hash_ids list");
  }
  if (r.hashIds.empty()) return makeError(ErrorCode::kInvalidArgument, "empty hash_ids");
  return r;
}

Result<std::vector<TraceRequest>> loadTrace(const std::string& path, size_t limit) {
  std::ifstream in(path);
  if (!in) return makeError(ErrorCode::kNotFound, "cannot read trace ", path);
  std::vector<TraceRequest> out;
  std::string line;
  for (size_t number = 1; (limit == 0 || out.size() < limit) && std::getline(in, line); ++number) {
    if (line.size() > kMaxTraceLineBytes) {
      return makeError(ErrorCode::kInvalidArgument, path, ":", number, ": line longer than ",
                       kMaxTraceLineBytes, " bytes");
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto r = parseTraceLine(line);
    if (!r)
      return makeError(ErrorCode::kInvalidArgument, path, ":", number, ": ", r.error().message());
    out.push_back(std::move(r).value());
  }
  if (out.empty()) return makeError(ErrorCode::kInvalidArgument, path, " holds no request");
  return out;
}

Layout replayLayout(uint32_t stateBlocks) {
  Layout layout{"replay/tiny", 1, 1, 16, DType::kFloat16, 16, {}};
  layout.stateBytes = uint64_t{stateBlocks} * layout.blockBytes();
  return layout;
}

Key128 blockKey(uint64_t hashId) {
  const std::string text = std::to_string(hashId);
  return contentKey(text.data(), text.size());
}

const char* routeName(Route route) { return route == Route::kSession ? "session" : "round-robin"; }

size_t routeRequest(Route route, size_t index, const TraceRequest& request, size_t nodes) {
  if (nodes <= 1) return 0;
  if (route == Route::kRoundRobin) return index % nodes;
  return static_cast<size_t>(splitmix64(request.hashIds.front()) % nodes);
}

size_t LruCache::run(std::span<const uint64_t> ids, size_t from) const {
  size_t n = 0;
  while (from + n < ids.size() && where_.count(ids[from + n])) ++n;
  return n;
}

void LruCache::touch(uint64_t id) {
  if (auto it = where_.find(id); it != where_.end()) {
    order_.splice(order_.end(), order_, it->second);
  }
}

void LruCache::insert(uint64_t id, bool leastRecent) {
  if (auto it = where_.find(id); it != where_.end()) {
    order_.splice(order_.end(), order_, it->second);
    return;
  }
  if (capacity_ == 0) return;
  if (order_.size() == capacity_) {
    where_.erase(order_.front());
    order_.pop_front();
  }
  where_.emplace(id, order_.insert(leastRecent ? order_.begin() : order_.end(), id));
}

size_t LruCache::access(std::span<const uint64_t> ids) {
  const size_t hits = run(ids, 0);
  for (uint64_t id : ids) insert(id);
  return hits;
}

void StateLru::touch(uint64_t id) {
  auto it = where_.find(id);
  if (it != where_.end()) order_.splice(order_.end(), order_, it->second.first);
}

void StateLru::insert(uint64_t id, uint64_t weight) {
  if (has(id)) return touch(id);
  order_.push_back(id);
  where_[id] = {std::prev(order_.end()), weight};
  used_ += weight;
  while (used_ > capacity_ && !order_.empty()) {
    auto victim = where_.find(order_.front());
    used_ -= victim->second.second;
    where_.erase(victim);
    order_.pop_front();
  }
}

size_t StateLru::access(std::span<const uint64_t> ids) {
  const size_t n = ids.size();
  size_t run = 0;
  while (run < n && has(ids[run])) ++run;
  size_t hit = run;
  while (hit > 0 && !has(stateId(ids[hit - 1]))) --hit;
  if (hit > 0) {
    touch(stateId(ids[hit - 1]));
    for (size_t b = hit; b-- > 0;) touch(ids[b]);
  }
  for (size_t b = hit; b < n; ++b) {
    insert(ids[b], 1);
    const size_t k = b + 1;
    if (k % spacing_ == 0 || k == n) insert(stateId(ids[b]), stateBlocks_);
  }
  return hit;
}

OfflineOptimum::OfflineOptimum(std::span<const TraceRequest> trace)
    : trace_(trace), nextUse_(trace.size()) {
  const uint64_t never = uint64_t{trace.size()} << 32;
  std::unordered_map<uint64_t, uint64_t> later;
  for (size_t r = trace.size(); r-- > 0;) {
    const auto& ids = trace[r].hashIds;
    nextUse_[r].resize(ids.size());
    for (size_t j = 0; j < ids.size(); ++j) {
      auto it = later.find(ids[j]);
      nextUse_[r][j] = it == later.end() ? never : it->second;
    }
    for (size_t j = ids.size(); j-- > 0;) later[ids[j]] = (uint64_t{r} << 32) | uint64_t{j};
  }
}

uint64_t OfflineOptimum::hitBlocks(uint64_t capacity) const {
  // The cache: each id's next use, and the ids ordered by it (farthest last).
  std::unordered_map<uint64_t, uint64_t> nextOf;
  std::set<std::pair<uint64_t, uint64_t>> byNext;
  std::unordered_set<uint64_t> current;
  uint64_t hits = 0;
  for (size_t r = 0; r < trace_.size(); ++r) {
    const auto& ids = trace_[r].hashIds;
    size_t hit = 0;
    while (hit < ids.size() && nextOf.count(ids[hit])) ++hit;
    hits += hit;
    current.clear();
    current.insert(ids.begin(), ids.end());
    // The request's cached ids first take their next use; none of them is evicted for the ones
    // it brings in.
    for (size_t j = 0; j < ids.size(); ++j) {
      auto it = nextOf.find(ids[j]);
      if (it == nextOf.end()) continue;
      byNext.erase({it->second, ids[j]});
      it->second = nextUse_[r][j];
      byNext.emplace(it->second, ids[j]);
    }
    for (size_t j = 0; j < ids.size(); ++j) {
      if (capacity == 0 || nextOf.count(ids[j])) continue;
      if (nextOf.size() >= capacity) {
        auto victim = byNext.rbegin();
        while (victim != byNext.rend() && current.count(victim->second)) ++victim;
        if (victim == byNext.rend()) continue;  // the cache holds only this request's ids
        nextOf.erase(victim->second);
        byNext.erase(std::next(victim).base());
      }
      nextOf.emplace(ids[j], nextUse_[r][j]);
      byNext.emplace(nextUse_[r][j], ids[j]);
    }
  }
  return hits;
}

uint64_t beladyHitBlocks(std::span<const TraceRequest> trace, uint64_t capacity) {
  return OfflineOptimum(trace).hitBlocks(capacity);
}

size_t clusterModelAccess(std::vector<LruCache>& nodes, size_t at, std::span<const uint64_t> ids,
                          bool fetchedLeastRecent) {
  const size_t local = nodes[at].run(ids, 0);
  size_t hit = local;
  while (hit < ids.size()) {
    size_t best = 0, holder = nodes.size();
    for (size_t o = 0; o < nodes.size(); ++o) {
      if (o == at) continue;
      if (const size_t r = nodes[o].run(ids, hit); r > best) best = r, holder = o;
    }
    if (best == 0) break;
    for (size_t b = hit; b < hit + best; ++b) nodes[holder].touch(ids[b]);
    hit += best;
  }
  LruCache& here = nodes[at];
  for (size_t b = 0; b < ids.size(); ++b) {
    if (!fetchedLeastRecent || b < local || b >= hit) here.insert(ids[b]);
  }
  if (fetchedLeastRecent) {
    for (size_t b = local; b < hit; ++b) here.insert(ids[b], /*leastRecent=*/true);
  }
  return hit;
}

Result<ReplayRun> replayTrace(std::span<const TraceRequest> trace, const ReplayOptions& options,
                              const ProgressFn& progress) {
  if (options.sockets.empty())
    return makeError(ErrorCode::kInvalidArgument, "no node to replay on");
  if (options.speedup < 0) return makeError(ErrorCode::kInvalidArgument, "negative speedup");
  if (options.stateBlocks > 0 && options.checkpointBlocks == 0) {
    return makeError(ErrorCode::kInvalidArgument, "states need a checkpoint spacing");
  }
  const bool states = options.stateBlocks > 0;
  const Layout layout = replayLayout(options.stateBlocks);
  const uint32_t bt = layout.blockTokens;
  // A state's bytes: the id of the block it follows, then zeros (checked when a lookup hits it).
  std::vector<uint8_t> state(layout.stateBytes, 0), stateRead(layout.stateBytes);
  const size_t n = options.sockets.size();

  // One client per node. A caller-thread client saves a thread hop per call, but a thread runs
  // one event loop: with several nodes each client runs its own thread.
  std::vector<Node> nodes(n);
  for (size_t i = 0; i < n; ++i) {
    Node& node = nodes[i];
    node.socket = options.sockets[i];
    ClientOptions co;
    co.socketPath = node.socket;
    co.clientName = "kvtier-replay";
    co.threading = n == 1 ? ClientThreading::kCallerThread : ClientThreading::kOwnThread;
    auto client = Client::connect(co);
    if (!client) {
      return makeError(client.error().code(), node.socket, ": ", client.error().message());
    }
    node.client = std::move(client).value();
    auto space = node.client->open(layout);
    if (!space) return makeError(space.error().code(), node.socket, ": ", space.error().message());
    node.space = std::move(space).value();
    auto stats = nodeStats(node);
    if (!stats) return makeError(stats.error().code(), node.socket, ": ", stats.error().message());
    node.before = std::move(stats).value();
  }

  ReplayRun run;
  run.tracePath = options.tracePath;
  run.daemonVersion = nodes[0].client->daemonVersion();
  run.route = options.route;
  run.speedup = options.speedup;
  run.whole = options.whole || states;
  run.stateBlocks = options.stateBlocks;
  run.checkpointBlocks = options.checkpointBlocks;
  run.nodes = n;
  run.requestsPerNode.assign(n, 0);
  for (Node& node : nodes) {
    uint64_t total = 0, used = 0;
    for (const auto& s : node.before.spaces) {
      if (s.fingerprint == node.space->fingerprint()) total = s.blocksTotal, used = s.blocksUsed;
    }
    run.daemonCapacityBlocks.push_back(total);
    run.warmBlocksPerNode.push_back(used);
    run.coldRecordsBefore += node.before.coldRecords;
  }
  run.capacityBlocks =
      options.capacityBlocks ? options.capacityBlocks : run.daemonCapacityBlocks[0];
  if (run.capacityBlocks == 0) {
    return makeError(ErrorCode::kInvalidArgument, "no capacity: pass --capacity BLOCKS");
  }

  LruCache ideal(run.capacityBlocks * n);
  std::vector<LruCache> isolated(n, LruCache(run.capacityBlocks));
  std::vector<LruCache> model(n, LruCache(run.capacityBlocks));
  std::vector<LruCache> modelFetchedLast(n, LruCache(run.capacityBlocks));
  std::vector<LruCache> curve;
  for (uint64_t c : kCurveCapacities) curve.emplace_back(c);
  std::vector<uint64_t> curveHits(curve.size(), 0);
  std::unordered_set<uint64_t> seen;
  StateLru statesModel(run.capacityBlocks * n, options.stateBlocks,
                       std::max<uint32_t>(options.checkpointBlocks, 1));
  StateLru everyBlockModel(run.capacityBlocks * n, options.stateBlocks, 1);

  // The private sequence each request's blocks pass through (one per replaying process).
  const std::string seq = "replay-" + std::to_string(::getpid());
  std::vector<Key128> keys;
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> kv;
  std::vector<double> lookupMs, requestMs;
  lookupMs.reserve(trace.size());
  requestMs.reserve(trace.size());
  const uint64_t tokenBytes = layout.tokenBytes();

  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < trace.size(); ++i) {
    const TraceRequest& req = trace[i];
    const size_t at = routeRequest(options.route, i, req, n);
    Node& node = nodes[at];
    if (options.speedup > 0) {
      const auto due =
          start +
          std::chrono::duration_cast<Clock::duration>(
              std::chrono::duration<double, std::milli>(double(req.timestampMs) / options.speedup));
      if (Clock::now() < due) std::this_thread::sleep_until(due);
      run.maxLagMs = std::max(
          run.maxLagMs, std::chrono::duration<double, std::milli>(Clock::now() - due).count());
    }
    const size_t blocks = req.hashIds.size();
    keys.resize(blocks);
    for (size_t b = 0; b < blocks; ++b) keys[b] = blockKey(req.hashIds[b]);

    const Clock::time_point t0 = Clock::now();
    auto failed = [&](const Error& e) -> std::optional<Error> {
      if (e.code() == ErrorCode::kUnavailable) {
        return makeError(e.code(), node.socket, ": ", e.message());
      }
      if (run.errors++ == 0) run.firstError = e.toString();
      return std::nullopt;
    };
    size_t hit = 0;
    {
      LookupOptions lo;
      if (!run.whole) lo.bindSeq = seq;
      auto found = node.space->lookupKeys(keys, lo);
      lookupMs.push_back(msSince(t0));
      if (lookupMs.back() >= 1000) ++run.slowLookups;
      if (!found) {
        if (auto fatal = failed(found.error())) return *fatal;
      } else {
        hit = found->blockCount();
        // Every hit block carries its hash id in its first 8 bytes (see below): a remote hit or
        // a reused block that came back with other bytes is counted, never silently taken.
        for (size_t b = 0; b < hit && b < blocks; ++b) {
          auto bytes = found->block(b);
          if (bytes.size() < 8) continue;
          uint64_t id;
          std::memcpy(&id, bytes.data(), 8);
          ++run.verifiedBlocks;
          if (id != req.hashIds[b]) ++run.wrongBlocks;
        }
        if (states && hit > 0) {
          // The state: its writer's, checked against its checksum, and the one of this prefix.
          uint64_t id = 0;
          if (auto s = found->copyState(stateRead.data(), stateRead.size()); !s) {
            if (auto fatal = failed(s.error())) return *fatal;
          } else {
            std::memcpy(&id, stateRead.data(), 8);
            ++run.verifiedBlocks;
            if (id != req.hashIds[hit - 1]) ++run.wrongBlocks;
          }
        }
        // Unpinned before the sequence goes, so that its removal settles the blocks in request
        // order (the sequence still holds the hit prefix meanwhile). A whole put reads its hit
        // blocks and lets them go before it puts them again, as an engine that copied them into
        // its own cache would.
        found->release();
      }
    }
    // The blocks put: the missed ones after the hit, or (whole) every block from position 0.
    const size_t from = run.whole ? 0 : hit;
    if (from < blocks) {
      const size_t miss = blocks - from;
      tokens.assign(miss * bt, 0);
      kv.assign(miss * layout.blockBytes(), 0);
      for (size_t b = 0; b < miss; ++b) {
        const uint64_t id = req.hashIds[from + b];
        for (uint32_t t = 0; t < bt; ++t) tokens[b * bt + t] = static_cast<uint32_t>(id);
        // Packed [layer][K|V][token][head][dim]: layer 0's K of the block's first token is the
        // block's first bytes once placed.
        std::memcpy(kv.data() + b * bt * tokenBytes, &id, 8);
      }
      PutOptions po;
      po.keys.assign(keys.begin() + static_cast<std::ptrdiff_t>(from), keys.end());
      auto put = node.space->put(seq, from * bt, tokens, kv.data(), kv.size(), po);
      if (!put) {
        if (auto fatal = failed(put.error())) return *fatal;
      }
    }
    if (states) {
      // A state at every checkpoint past the hit and at the request's end (a turn's end).
      for (size_t k = hit + 1; k <= blocks; ++k) {
        if (k % options.checkpointBlocks != 0 && k != blocks) continue;
        std::memcpy(state.data(), &req.hashIds[k - 1], 8);
        auto s = node.space->putStateKeys(std::span<const Key128>(keys).first(k), state.data(),
                                          state.size());
        if (!s) {
          if (auto fatal = failed(s.error())) return *fatal;
        } else {
          ++run.statesPut;
        }
      }
    }
    if (auto s = node.space->remove(seq, 0); !s) {
      if (auto fatal = failed(s.error())) return *fatal;
    }
    requestMs.push_back(msSince(t0));

    ++run.requests;
    ++run.requestsPerNode[at];
    run.blocks += blocks;
    run.hitBlocks += hit;
    run.idealHitBlocks += ideal.access(req.hashIds);
    run.isolatedHitBlocks += isolated[at].access(req.hashIds);
    if (n > 1) {
      run.modelHitBlocks += clusterModelAccess(model, at, req.hashIds, false);
      run.modelFetchedLastHitBlocks += clusterModelAccess(modelFetchedLast, at, req.hashIds, true);
    }
    for (size_t c = 0; c < curve.size(); ++c) curveHits[c] += curve[c].access(req.hashIds);
    if (states) {
      run.modelStatesHitBlocks += statesModel.access(req.hashIds);
      run.modelEveryBlockHitBlocks += everyBlockModel.access(req.hashIds);
    }
    size_t infinite = 0;
    while (infinite < blocks && seen.count(req.hashIds[infinite])) ++infinite;
    run.infiniteHitBlocks += infinite;
    seen.insert(req.hashIds.begin(), req.hashIds.end());
    if (progress) progress(i + 1, trace.size(), run);
  }
  run.wallSeconds = msSince(start) / 1000.0;
  run.distinctBlocks = seen.size();
  run.lookupMs = percentiles(std::move(lookupMs));
  run.requestMs = percentiles(std::move(requestMs));
  const OfflineOptimum optimum(trace);  // the next uses, found once for every capacity
  for (size_t c = 0; c < curve.size(); ++c) {
    run.idealCurve.emplace_back(curve[c].capacity(), curveHits[c]);
    run.optCurve.emplace_back(curve[c].capacity(), optimum.hitBlocks(curve[c].capacity()));
  }
  run.optHitBlocks = optimum.hitBlocks(run.capacityBlocks * n);

  // Counters over the run. In a cluster, wait (bounded) until every node has published what it
  // holds, so that held copies and distinct keys are counted on a settled directory.
  std::vector<Stats> after(n);
  const Clock::time_point settleBy = Clock::now() + std::chrono::seconds(5);
  for (;;) {
    bool settled = true;
    for (size_t i = 0; i < n; ++i) {
      auto s = nodeStats(nodes[i]);
      if (!s) return makeError(s.error().code(), nodes[i].socket, ": ", s.error().message());
      after[i] = std::move(s).value();
      settled = settled && after[i].publishBacklog == 0;
    }
    if (settled || Clock::now() > settleBy) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (size_t i = 0; i < n; ++i) {
    const Stats& a = after[i];
    const Stats& b = nodes[i].before;
    run.evictions += a.evictions - b.evictions;
    run.remoteHitBlocks += a.remoteHitBlocks - b.remoteHitBlocks;
    run.remoteLookups += a.remoteLookups - b.remoteLookups;
    run.fetchErrors += fetchErrorsOf(a) - fetchErrorsOf(b);
    run.promotedBlocks += a.promoted - b.promoted;
    run.heldKeys += a.heldKeys;
    run.distinctKeys += a.directoryKeys;
    run.blocksUsedPerNode.push_back(a.blocksUsed);
  }
  run.notComparable = whyNotComparable(run);
  return run;
}

std::vector<std::string> whyNotComparable(const ReplayRun& run) {
  std::vector<std::string> why;
  const std::string cap = std::to_string(run.capacityBlocks);
  for (size_t i = 0; i < run.daemonCapacityBlocks.size(); ++i) {
    if (run.daemonCapacityBlocks[i] == run.capacityBlocks) continue;
    why.push_back("node " + std::to_string(i) + "'s pool holds " +
                  std::to_string(run.daemonCapacityBlocks[i]) +
                  " blocks of the replay's layout, the anchors " + cap +
                  " (start the daemons with --host-pool-bytes $((" + cap +
                  " * 1024)), or pass --capacity " + std::to_string(run.daemonCapacityBlocks[i]) +
                  ")");
  }
  uint64_t warm = 0;
  for (uint64_t w : run.warmBlocksPerNode) warm += w;
  if (warm > 0 || run.coldRecordsBefore > 0) {
    why.push_back("the daemons held " + std::to_string(warm) + " blocks in memory and " +
                  std::to_string(run.coldRecordsBefore) +
                  " on disk before the run (a replay ran on them before?), while the anchors "
                  "start empty: replay on fresh daemons");
  }
  if (run.promotedBlocks > 0) {
    why.push_back(std::to_string(run.promotedBlocks) +
                  " blocks came back from the daemons' cold tiers, a capacity beyond their pools "
                  "(start them with --cold-tier off)");
  }
  return why;
}

std::string runJson(const ReplayRun& run) {
  const bool multi = run.nodes > 1;
  const uint64_t total = run.capacityBlocks * run.nodes;
  std::string o = "{";
  auto field = [&o](const char* name, const std::string& value) {
    if (o.size() > 1) o += ", ";
    o += "\"" + std::string(name) + "\": " + value;
  };
  field("trace", jsonString(run.tracePath));
  if (run.stateBlocks > 0) {
    field("state_blocks", std::to_string(run.stateBlocks));
    field("checkpoint_blocks", std::to_string(run.checkpointBlocks));
    field("states_put", std::to_string(run.statesPut));
    field("model_states_hit_rate", fixed(run.rate(run.modelStatesHitBlocks)));
    field("model_every_block_hit_rate", fixed(run.rate(run.modelEveryBlockHitBlocks)));
  }
  field("daemon_version", jsonString(run.daemonVersion));
  field("requests", std::to_string(run.requests));
  field("blocks", std::to_string(run.blocks));
  field("distinct_blocks", std::to_string(run.distinctBlocks));
  field("nodes", std::to_string(run.nodes));
  field("route", jsonString(multi ? routeName(run.route) : "single"));
  field("speedup", run.speedup > 0 ? fixed(run.speedup, 3) : "null");
  field("put", jsonString(run.whole ? "whole" : "missed"));
  field("capacity_blocks", std::to_string(run.capacityBlocks));
  field("total_capacity_blocks", std::to_string(total));
  field("daemon_capacity_blocks", list(run.daemonCapacityBlocks));
  field("warm_blocks_per_node", list(run.warmBlocksPerNode));
  field("cold_records_before", std::to_string(run.coldRecordsBefore));
  field("promoted_blocks", std::to_string(run.promotedBlocks));
  field("comparable", run.comparable() ? "true" : "false");
  std::string why = "[";
  for (size_t i = 0; i < run.notComparable.size(); ++i) {
    why += (i ? ", " : "") + jsonString(run.notComparable[i]);
  }
  field("not_comparable_because", why + "]");
  field("hit_blocks", std::to_string(run.hitBlocks));
  field("hit_rate", fixed(run.hitRate()));
  field("ideal_lru_capacity_blocks", std::to_string(total));
  field("ideal_lru_hit_blocks", std::to_string(run.idealHitBlocks));
  field("ideal_lru_hit_rate", fixed(run.idealHitRate()));
  field("diff_pp", fixed(100.0 * (run.hitRate() - run.idealHitRate()), 3));
  field("opt_hit_blocks", std::to_string(run.optHitBlocks));
  field("opt_hit_rate", fixed(run.rate(run.optHitBlocks)));
  field("gap_closed", std::isnan(run.gapClosed()) ? "null" : fixed(run.gapClosed(), 4));
  if (multi) {
    field("isolated_lru_hit_blocks", std::to_string(run.isolatedHitBlocks));
    field("isolated_lru_hit_rate", fixed(run.rate(run.isolatedHitBlocks)));
    field("ratio_to_isolated", run.isolatedHitBlocks
                                   ? fixed(double(run.hitBlocks) / double(run.isolatedHitBlocks), 4)
                                   : "null");
    field("cluster_model_hit_rate", fixed(run.rate(run.modelHitBlocks)));
    field("cluster_model_fetched_last_hit_rate", fixed(run.rate(run.modelFetchedLastHitBlocks)));
    field("held_keys", std::to_string(run.heldKeys));
    field("distinct_keys", std::to_string(run.distinctKeys));
    field("copies_per_key",
          run.distinctKeys ? fixed(double(run.heldKeys) / double(run.distinctKeys), 4) : "null");
  }
  field("infinite_cache_hit_rate", fixed(run.rate(run.infiniteHitBlocks)));
  std::string curve = "[";
  for (size_t i = 0; i < run.idealCurve.size(); ++i) {
    curve += (i ? ", [" : "[") + std::to_string(run.idealCurve[i].first) + ", " +
             fixed(run.rate(run.idealCurve[i].second)) + "]";
  }
  field("ideal_lru_curve", curve + "]");
  std::string opt = "[";
  for (size_t i = 0; i < run.optCurve.size(); ++i) {
    opt += (i ? ", [" : "[") + std::to_string(run.optCurve[i].first) + ", " +
           fixed(run.rate(run.optCurve[i].second)) + "]";
  }
  field("opt_curve", opt + "]");
  field("requests_per_node", list(run.requestsPerNode));
  field("blocks_used_per_node", list(run.blocksUsedPerNode));
  field("evictions", std::to_string(run.evictions));
  field("remote_lookups", std::to_string(run.remoteLookups));
  field("remote_hit_blocks", std::to_string(run.remoteHitBlocks));
  field("fetch_errors", std::to_string(run.fetchErrors));
  field("verified_blocks", std::to_string(run.verifiedBlocks));
  field("wrong_blocks", std::to_string(run.wrongBlocks));
  field("errors", std::to_string(run.errors));
  if (!run.firstError.empty()) field("first_error", jsonString(run.firstError));
  field("wall_s", fixed(run.wallSeconds, 3));
  field("requests_per_s", fixed(run.wallSeconds > 0 ? run.requests / run.wallSeconds : 0, 1));
  field("max_lag_ms", fixed(run.maxLagMs, 3));
  field("lookups_over_1s", std::to_string(run.slowLookups));
  field("lookup_ms", "{\"p50\": " + fixed(run.lookupMs.p50, 4) +
                         ", \"p99\": " + fixed(run.lookupMs.p99, 4) +
                         ", \"max\": " + fixed(run.lookupMs.max, 4) + "}");
  field("request_ms", "{\"p50\": " + fixed(run.requestMs.p50, 4) +
                          ", \"p99\": " + fixed(run.requestMs.p99, 4) +
                          ", \"max\": " + fixed(run.requestMs.max, 4) + "}");
  return o + "}";
}

std::string runsJson(std::span<const ReplayRun> runs) {
  std::string out = "{\"tool\": \"kvtier replay\", \"block_tokens\": 16, \"runs\": [\n";
  for (size_t i = 0; i < runs.size(); ++i) out += (i ? ",\n  " : "  ") + runJson(runs[i]);
  return out + "\n]}\n";
}

}  // namespace kvtier::replay
