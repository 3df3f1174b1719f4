#include "tools/synthetic_trace.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kvtier::replay {
namespace {

// A small deterministic generator (splitmix64): the same seed gives the same workload anywhere.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t x = (state_ += 0x9e3779b97f4a7c15ULL);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  // An integer in [lo, hi].
  uint64_t between(uint64_t lo, uint64_t hi) { return lo + next() % (hi - lo + 1); }
  double exponential(double mean) { return -mean * std::log(1.0 - uniform()); }

 private:
  uint64_t state_;
};

// Zipf(s) over n items: item i (0-based) with probability proportional to 1 / (i + 1)^s.
class Zipf {
 public:
  Zipf(size_t n, double s) : cdf_(n) {
    double sum = 0;
    for (size_t i = 0; i < n; ++i) cdf_[i] = sum += 1.0 / std::pow(double(i + 1), s);
    for (double& c : cdf_) c /= sum;
  }
  size_t draw(Random& r) const {
    const auto it = std::lower_bound(cdf_.begin(), cdf_.end(), r.uniform());
    return std::min<size_t>(static_cast<size_t>(it - cdf_.begin()), cdf_.size() - 1);
  }

 private:
  std::vector<double> cdf_;
};

constexpr uint64_t kTraceBlockTokens = 512;  // the Mooncake trace's tokens per hash id
constexpr double kMeanGapMs = 250;

// Appends the request with its timestamp and lengths.
class Builder {
 public:
  explicit Builder(Random& r) : r_(r) {}
  uint64_t newId() { return nextId_++; }
  // Appends `n` new ids to `ids` (new content: blocks no request had before).
  void appendNew(std::vector<uint64_t>& ids, uint64_t n) {
    for (; n > 0; --n) ids.push_back(nextId_++);
  }
  // `count` prompts of new ids, each of lo to hi of them.
  std::vector<std::vector<uint64_t>> newPrompts(size_t count, uint64_t lo, uint64_t hi) {
    std::vector<std::vector<uint64_t>> prompts(count);
    for (auto& p : prompts) appendNew(p, r_.between(lo, hi));
    return prompts;
  }
  void add(std::vector<uint64_t> ids, uint64_t outputTokens) {
    clock_ += r_.exponential(kMeanGapMs);
    TraceRequest q;
    q.timestampMs = static_cast<uint64_t>(clock_);
    q.inputLength = ids.size() * kTraceBlockTokens;
    q.outputLength = outputTokens;
    q.hashIds = std::move(ids);
    out.push_back(std::move(q));
  }
  std::vector<TraceRequest> out;

 private:
  Random& r_;
  uint64_t nextId_ = 0;
  double clock_ = 0;
};

std::vector<TraceRequest> sharedPrompts(Random& r) {
  constexpr size_t kPrompts = 32, kSessions = 2500, kLive = 768;
  Builder b(r);
  const auto prompts = b.newPrompts(kPrompts, 16, 64);
  const Zipf popularity(kPrompts, 1.0);
  struct Session {
    std::vector<uint64_t> context;
    size_t turnsLeft;
  };
  std::vector<Session> live;
  size_t started = 0;
  while (started < kSessions || !live.empty()) {
    const bool start = started < kSessions &&
                       (live.size() < kLive / 2 || (live.size() < kLive && r.uniform() < 0.25));
    size_t at;
    if (start) {
      live.push_back(Session{prompts[popularity.draw(r)], r.between(1, 12)});
      ++started;
      at = live.size() - 1;
    } else {
      at = r.next() % live.size();
    }
    Session& s = live[at];
    // The turn's new blocks: the last answer and the new message.
    b.appendNew(s.context, r.between(2, 6));
    b.add(s.context, r.between(64, 512));
    if (--s.turnsLeft == 0) {
      live[at] = std::move(live.back());
      live.pop_back();
    }
  }
  return std::move(b.out);
}

std::vector<TraceRequest> scan(Random& r) {
  constexpr size_t kDocs = 400, kRequests = 6000;
  Builder b(r);
  std::vector<uint64_t> prompt;
  b.appendNew(prompt, 4);
  std::vector<std::vector<uint64_t>> docs(kDocs, prompt);
  for (auto& d : docs) b.appendNew(d, r.between(10, 30));
  const Zipf popularity(kDocs, 0.9);
  size_t burst = 0;
  while (b.out.size() < kRequests) {
    if (burst == 0 && r.uniform() < 0.02) burst = r.between(10, 40);
    std::vector<uint64_t> ids;
    if (burst > 0) {
      --burst;
      b.appendNew(ids, r.between(64, 256));
    } else {
      ids = docs[popularity.draw(r)];
      ids.push_back(b.newId());  // the question
    }
    b.add(std::move(ids), r.between(32, 256));
  }
  return std::move(b.out);
}

std::vector<TraceRequest> agents(Random& r) {
  constexpr size_t kTasks = 2000, kLive = 800;
  Builder b(r);
  std::vector<uint64_t> prompt;
  b.appendNew(prompt, 8);
  struct Task {
    std::vector<uint64_t> context;
    size_t stepsLeft;
  };
  std::vector<Task> live;
  size_t started = 0;
  while (started < kTasks || !live.empty()) {
    while (live.size() < kLive && started < kTasks) {
      live.push_back(Task{prompt, r.between(4, 30)});
      ++started;
    }
    const size_t at = r.next() % live.size();
    Task& t = live[at];
    b.appendNew(t.context, r.between(1, 3));
    b.add(t.context, r.between(16, 256));
    if (--t.stepsLeft == 0) {
      live[at] = std::move(live.back());
      live.pop_back();
    }
  }
  return std::move(b.out);
}

std::vector<TraceRequest> hotPrompts(Random& r) {
  constexpr size_t kPrompts = 24, kRequests = 8000;
  Builder b(r);
  const auto prompts = b.newPrompts(kPrompts, 32, 128);
  const Zipf popularity(kPrompts, 1.0);
  while (b.out.size() < kRequests) {
    std::vector<uint64_t> ids = prompts[popularity.draw(r)];
    const bool document = r.uniform() < 0.2;
    b.appendNew(ids, document ? r.between(20, 200) : r.between(1, 4));
    b.add(std::move(ids), r.between(32, 256));
  }
  return std::move(b.out);
}

std::vector<TraceRequest> documents(Random& r) {
  constexpr size_t kPrompts = 8, kRequests = 6000;
  Builder b(r);
  const auto prompts = b.newPrompts(kPrompts, 2, 8);
  // Questions waiting for their turn: (request index, the document's blocks).
  std::vector<std::pair<size_t, std::vector<uint64_t>>> pending;
  while (b.out.size() < kRequests) {
    const size_t now = b.out.size();
    auto due = std::find_if(pending.begin(), pending.end(),
                            [now](const auto& p) { return p.first <= now; });
    std::vector<uint64_t> ids;
    if (due != pending.end()) {
      ids = std::move(due->second);
      pending.erase(due);
    } else {
      ids = prompts[r.next() % kPrompts];
      b.appendNew(ids, r.between(40, 300));
      for (uint64_t q = r.between(1, 4) - 1; q > 0 && r.uniform() < 0.6; --q) {
        pending.emplace_back(now + 1 + static_cast<size_t>(r.exponential(200)), ids);
      }
    }
    ids.push_back(b.newId());  // the question
    b.add(std::move(ids), r.between(32, 512));
  }
  return std::move(b.out);
}

std::vector<TraceRequest> mixed(Random& r) {
  // Each part generated on its own generator, then interleaved by drawing which part's next
  // request comes (in proportion to what each has left); hash ids kept apart by an offset.
  std::vector<std::vector<TraceRequest>> parts;
  Random chat(r.next()), agent(r.next()), doc(r.next());
  parts.push_back(sharedPrompts(chat));
  parts.push_back(agents(agent));
  parts.push_back(documents(doc));
  parts[0].resize(parts[0].size() / 2);
  parts[1].resize(parts[1].size() / 3);
  parts[2].resize(parts[2].size() / 2);
  uint64_t offset = 0;
  for (auto& part : parts) {
    uint64_t top = 0;
    for (auto& q : part) {
      for (auto& id : q.hashIds) {
        top = std::max(top, id);
        id += offset;
      }
    }
    offset += top + 1;
  }
  Builder b(r);
  std::vector<size_t> next(parts.size(), 0);
  for (;;) {
    size_t left = 0;
    for (size_t i = 0; i < parts.size(); ++i) left += parts[i].size() - next[i];
    if (left == 0) break;
    uint64_t pick = r.next() % left;
    size_t i = 0;
    while (pick >= parts[i].size() - next[i]) {
      pick -= parts[i].size() - next[i];
      ++i;
    }
    TraceRequest& q = parts[i][next[i]++];
    b.add(std::move(q.hashIds), q.outputLength);
  }
  return std::move(b.out);
}

}  // namespace

const char* syntheticName(SyntheticKind kind) {
  switch (kind) {
    case SyntheticKind::kSharedPrompts:
      return "shared-prompts";
    case SyntheticKind::kScan:
      return "scan";
    case SyntheticKind::kAgents:
      return "agents";
    case SyntheticKind::kHotPrompts:
      return "hot-prompts";
    case SyntheticKind::kDocuments:
      return "documents";
    case SyntheticKind::kMixed:
      return "mixed";
  }
  return "?";
}

Result<SyntheticKind> parseSyntheticKind(std::string_view name) {
  for (SyntheticKind k : kSyntheticKinds) {
    if (name == syntheticName(k)) return k;
  }
  return makeError(ErrorCode::kInvalidArgument,
                   "a synthetic workload is shared-prompts, scan, agents, hot-prompts, documents "
                   "or mixed, not '",
                   name, "'");
}

std::vector<TraceRequest> syntheticTrace(SyntheticKind kind, uint64_t seed) {
  Random r(seed * 0x2545f4914f6cdd1dULL + static_cast<uint64_t>(kind));
  switch (kind) {
    case SyntheticKind::kSharedPrompts:
      return sharedPrompts(r);
    case SyntheticKind::kScan:
      return scan(r);
    case SyntheticKind::kAgents:
      return agents(r);
    case SyntheticKind::kHotPrompts:
      return hotPrompts(r);
    case SyntheticKind::kDocuments:
      return documents(r);
    case SyntheticKind::kMixed:
      return mixed(r);
  }
  return {};
}

std::string traceLine(const TraceRequest& q) {
  std::string line = "{\"timestamp\": " + std::to_string(q.timestampMs) +
                     ", \"input_length\": " + std::to_string(q.inputLength) +
                     ", \"output_length\": " + std::to_string(q.outputLength) + ", \"hash_ids\": [";
  for (size_t i = 0; i < q.hashIds.size(); ++i) {
    if (i) line += ", ";
    line += std::to_string(q.hashIds[i]);
  }
  return line + "]}";
}

Status writeTrace(const std::string& path, const std::vector<TraceRequest>& requests) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return makeError(ErrorCode::kInvalidArgument, "cannot write ", path);
  bool ok = true;
  for (const TraceRequest& q : requests) {
    const std::string line = traceLine(q) + "\n";
    ok = ok && std::fwrite(line.data(), 1, line.size(), f) == line.size();
  }
  ok = std::fclose(f) == 0 && ok;
  if (!ok) return makeError(ErrorCode::kInvalidArgument, "cannot write ", path);
  return {};
}

}  // namespace kvtier::replay
