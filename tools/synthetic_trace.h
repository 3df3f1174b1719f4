// Synthetic workloads in the Mooncake trace format, for `kvtier replay --synthetic KIND`: the
// shared trace is one workload, and a cache policy must not be tuned to it alone
// (docs/cache-policy.md). Each generator is deterministic for its seed. hash_ids are chained
// prefix ids as in the trace: the same id at the same place means the same prefix.
//
// Not thread-safe (pure functions over their arguments).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/error.h"
#include "tools/replay.h"

namespace kvtier::replay {

enum class SyntheticKind : uint8_t {
  // Many chat sessions, each opening with one of a few long system prompts (16 to 64 blocks,
  // Zipf popularity) and growing by 2 to 6 blocks a turn over up to 12 turns, interleaved with
  // the turns of 64 other live sessions.
  kSharedPrompts,
  // A RAG service: 400 documents (10 to 30 blocks after a 4-block shared prompt, Zipf
  // popularity) queried again and again, and now and then a batch job's burst of 10 to 40
  // one-off long prompts (64 to 256 blocks) that are never seen again: a scan.
  kScan,
  // Agents: each task a chain of many short steps over one growing context, a few tasks at
  // once; every block is reused at short distance, what LRU is best at.
  kAgents,
  // A few hot system prompts (4, of 32 to 128 blocks, Zipf popularity) and short one-off
  // questions after them (1 to 4 blocks); now and then a one-off document (20 to 100 blocks)
  // after a prompt: what a cache must keep is a handful of prefixes reused by everyone.
  kHotPrompts,
  // Long documents (40 to 300 blocks after one of 8 short prompts), each asked 1 to 4 questions
  // at a random later time (a geometric gap, a mean of 200 requests), most of them once: long
  // reuse distances, a stream that would flush a recency order.
  kDocuments,
  // A service's mix, interleaved: chat sessions over shared system prompts, agent tasks, and
  // documents read once or twice.
  kMixed,
};

// "shared-prompts", "scan", "agents", "hot-prompts", "documents", "mixed".
const char* syntheticName(SyntheticKind kind);
inline constexpr SyntheticKind kSyntheticKinds[] = {
    SyntheticKind::kSharedPrompts, SyntheticKind::kScan,      SyntheticKind::kAgents,
    SyntheticKind::kHotPrompts,    SyntheticKind::kDocuments, SyntheticKind::kMixed};
Result<SyntheticKind> parseSyntheticKind(std::string_view name);

// The workload's requests, timestamps included (Poisson arrivals, 250 ms apart on average).
std::vector<TraceRequest> syntheticTrace(SyntheticKind kind, uint64_t seed = 1);

// One request as a Mooncake trace line (no newline); parseTraceLine reads it back.
std::string traceLine(const TraceRequest& request);
// Writes the requests as JSON lines. INVALID_ARGUMENT naming the path when it cannot be written.
Status writeTrace(const std::string& path, const std::vector<TraceRequest>& requests);

}  // namespace kvtier::replay
