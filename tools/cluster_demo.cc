// The cross-node demo (tools/cluster_demo.h): a prefill worker on one node hands its request to a
// decode worker on another through a snapshot named "node:id", and a third node's lookup of a
// prompt sharing the prefix is served from the cluster.
#include "tools/cluster_demo.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/client.h"
#include "tools/cli_numbers.h"
#include "tools/synthetic_kv.h"

namespace kvtier {
namespace {

// The single-node demo's layout (Llama-3-8B's KV shape): 2 MiB per 16-token block.
Layout clusterDemoLayout() {
  return Layout{"demo/llama-3-8b", 32, 8, 128, DType::kFloat16, 16, {}};
}

// A shared 200-token system prompt; A adds a 50-token question, C a 30-token one, and B decodes
// 6 tokens after A's prompt. Each part has its own stream of the seed.
constexpr size_t kSystemTokens = 200, kQuestionA = 50, kQuestionC = 30, kDecodeTokens = 6;

std::vector<uint32_t> prompt(uint64_t seed, uint64_t part, size_t questionTokens) {
  auto out = synthetic::tokens(seed * 4 + 0, kSystemTokens);
  const auto question = synthetic::tokens(seed * 4 + part, questionTokens);
  out.insert(out.end(), question.begin(), question.end());
  return out;
}
std::vector<uint32_t> promptA(uint64_t seed) { return prompt(seed, 1, kQuestionA); }
std::vector<uint32_t> promptC(uint64_t seed) { return prompt(seed, 2, kQuestionC); }
std::vector<uint32_t> decodedTokens(uint64_t seed) {
  return synthetic::tokens(seed * 4 + 3, kDecodeTokens);
}

double mib(uint64_t bytes) { return bytes / 1048576.0; }
double msSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// One process of the demo: its client, its space, and the "[A pid N, node1]" it prints before
// every line.
struct Worker {
  std::unique_ptr<Client> client;
  std::unique_ptr<Space> space;
  std::string node, tag;
};

// Connects and opens the demo's space; nullptr (after saying why on stderr) when the daemon does
// not answer or is not in a cluster.
std::unique_ptr<Worker> connectWorker(const std::string& socket, const char* role) {
  const std::string name = std::string("cluster-demo-") + role;
  auto client = Client::connect({.socketPath = socket, .clientName = name});
  if (!client) {
    std::fprintf(stderr, "[%s] cannot reach kvtierd at %s: %s\n", role, socket.c_str(),
                 client.error().toString().c_str());
    return nullptr;
  }
  auto w = std::make_unique<Worker>();
  w->client = std::move(client).value();
  auto cluster = w->client->cluster();
  if (!cluster || cluster->second.empty()) {
    std::fprintf(stderr, "[%s] kvtierd at %s is not in a cluster%s%s\n", role, socket.c_str(),
                 cluster ? "" : ": ", cluster ? "" : cluster.error().toString().c_str());
    return nullptr;
  }
  w->node = cluster->first;
  w->tag = std::string("[") + role + " pid " + std::to_string(getpid()) + ", " + w->node + "]";
  auto space = w->client->open(clusterDemoLayout());
  if (!space) {
    std::fprintf(stderr, "%s open failed: %s\n", w->tag.c_str(), space.error().toString().c_str());
    return nullptr;
  }
  w->space = std::move(space).value();
  return w;
}

// The seed argument at args[index], 1 when absent; false (after saying why) when it is not a
// number.
bool parseSeed(const std::vector<std::string>& args, size_t index, uint64_t& seed) {
  seed = 1;
  if (args.size() <= index) return true;
  auto parsed = cli::parseCount(args[index], "SEED");
  if (parsed) {
    seed = *parsed;
    return true;
  }
  std::fprintf(stderr, "kvtier: %s\n", parsed.error().message().c_str());
  return false;
}

// Positions [0, n) of a handle read back and compared with the synthetic KV of `tokens`.
bool sameAsComputed(Worker& w, const ReadHandle& handle, std::span<const uint32_t> tokens,
                    uint64_t n) {
  std::vector<uint8_t> got(n * w.space->layout().tokenKvBytes());
  if (auto s = handle.copyTo(0, n, got.data(), got.size()); !s) {
    std::fprintf(stderr, "%s copy failed: %s\n", w.tag.c_str(), s.error().toString().c_str());
    return false;
  }
  const bool same = got == synthetic::packedKv(w.space->layout(), tokens, 0, n);
  std::printf(
      "%s %.1f MiB of KV read %s: %s\n", w.tag.c_str(), mib(got.size()),
      w.client->mapped() ? "in place from this node's shared pool" : "inline over the socket",
      same ? "identical to what A computed" : "MISMATCH");
  return same;
}

}  // namespace

int clusterDemoPrefill(const std::string& socket, const std::vector<std::string>& args) {
  uint64_t seed;
  if (args.size() > 1 || !parseSeed(args, 0, seed)) {
    std::fprintf(stderr, "usage: kvtier --socket S cluster-demo-prefill [SEED]\n");
    return 2;
  }
  auto w = connectWorker(socket, "A");
  if (!w) return 1;
  const auto tokens = promptA(seed);
  const auto kv = synthetic::packedKv(w->space->layout(), tokens, 0, tokens.size());
  const auto t0 = std::chrono::steady_clock::now();
  // The sequence ends with this session; the snapshot outlives it (and shares its blocks).
  auto put = w->space->put("cluster-demo-A", 0, tokens, kv.data(), kv.size());
  if (!put) {
    std::fprintf(stderr, "%s put failed: %s\n", w->tag.c_str(), put.error().toString().c_str());
    return 1;
  }
  std::printf(
      "%s prefill: put %zu tokens of 'cluster-demo-A' (%u full blocks sealed, %zu tokens "
      "in a partial one), %.1f MiB written %s in %.1f ms\n",
      w->tag.c_str(), tokens.size(), put->sealedBlocks,
      tokens.size() % w->space->layout().blockTokens, mib(kv.size()),
      w->client->mapped() ? "straight into the shared pool" : "inline", msSince(t0));
  auto snap = w->space->snapshot("cluster-demo-A", 0);
  if (!snap) {
    std::fprintf(stderr, "%s snapshot failed: %s\n", w->tag.c_str(),
                 snap.error().toString().c_str());
    return 1;
  }
  if (snap->node.empty()) {
    std::fprintf(stderr,
                 "%s the snapshot names no node: the daemon predates cross-node "
                 "snapshots\n",
                 w->tag.c_str());
    return 1;
  }
  // A lookup elsewhere finds these blocks through their home nodes: wait (bounded) until this
  // node has told every home, so the next step cannot outrun the directory.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    auto stats = w->client->stats();
    if (stats && stats->publishBacklog == 0) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::fprintf(stderr, "%s blocks still unpublished after 10 s\n", w->tag.c_str());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::printf(
      "%s snapshot %s:%lu of positions [%lu, %lu); its blocks are in the cluster's "
      "directory\n",
      w->tag.c_str(), snap->node.c_str(), static_cast<unsigned long>(snap->id),
      static_cast<unsigned long>(snap->from), static_cast<unsigned long>(snap->to));
  return 0;
}

int clusterDemoDecode(const std::string& socket, const std::vector<std::string>& args) {
  uint64_t seed;
  const size_t colon = args.empty() ? std::string::npos : args[0].rfind(':');
  uint64_t id = 0;
  bool ok = args.size() >= 1 && args.size() <= 2 && colon != std::string::npos && colon > 0 &&
            parseSeed(args, 1, seed);
  if (ok) {
    auto parsed = cli::parseCount(args[0].substr(colon + 1), "ID");
    ok = parsed.ok();
    if (ok) id = *parsed;
  }
  if (!ok) {
    std::fprintf(stderr, "usage: kvtier --socket S cluster-demo-decode NODE:ID [SEED]\n");
    return 2;
  }
  const std::string node = args[0].substr(0, colon);
  auto w = connectWorker(socket, "B");
  if (!w) return 1;
  const auto tokens = promptA(seed);
  const uint64_t n = tokens.size();
  const auto t0 = std::chrono::steady_clock::now();
  if (auto s = w->space->restore("cluster-demo-B", id, n, PutOptions{}, node); !s) {
    std::fprintf(stderr, "%s restore of %s failed: %s\n", w->tag.c_str(), args[0].c_str(),
                 s.error().toString().c_str());
    return 1;
  }
  std::printf(
      "%s restored snapshot %s into 'cluster-demo-B': %lu tokens, %.1f MiB pulled from "
      "%s in %.1f ms\n",
      w->tag.c_str(), args[0].c_str(), static_cast<unsigned long>(n),
      mib(n * w->space->layout().tokenKvBytes()), node.c_str(), msSince(t0));
  {
    auto got = w->space->get("cluster-demo-B", 0, n);
    if (!got) {
      std::fprintf(stderr, "%s get failed: %s\n", w->tag.c_str(), got.error().toString().c_str());
      return 1;
    }
    if (!sameAsComputed(*w, *got, tokens, n)) return 1;
  }
  // Decode: one token at a time after the restored prompt, each with the KV its prefix implies.
  auto all = tokens;
  const auto more = decodedTokens(seed);
  all.insert(all.end(), more.begin(), more.end());
  for (uint64_t p = n; p < all.size(); ++p) {
    const auto kv = synthetic::packedKv(w->space->layout(), all, p, p + 1);
    auto put =
        w->space->put("cluster-demo-B", p, std::span(all).subspan(p, 1), kv.data(), kv.size());
    if (!put) {
      std::fprintf(stderr, "%s decode step at %lu failed: %s\n", w->tag.c_str(),
                   static_cast<unsigned long>(p), put.error().toString().c_str());
      return 1;
    }
  }
  auto length = w->space->length("cluster-demo-B");
  if (!length || length->value_or(0) != all.size()) {
    std::fprintf(stderr, "%s 'cluster-demo-B' should hold %zu tokens after decoding\n",
                 w->tag.c_str(), all.size());
    return 1;
  }
  std::printf("%s decoded %zu tokens after them: 'cluster-demo-B' holds %zu tokens on %s\n",
              w->tag.c_str(), more.size(), all.size(), w->node.c_str());
  return 0;
}

int clusterDemoLookup(const std::string& socket, const std::vector<std::string>& args) {
  uint64_t seed;
  if (args.size() > 1 || !parseSeed(args, 0, seed)) {
    std::fprintf(stderr, "usage: kvtier --socket S cluster-demo-lookup [SEED]\n");
    return 2;
  }
  auto w = connectWorker(socket, "C");
  if (!w) return 1;
  auto before = w->client->stats();
  if (!before) {
    std::fprintf(stderr, "%s stats failed: %s\n", w->tag.c_str(),
                 before.error().toString().c_str());
    return 1;
  }
  const auto tokens = promptC(seed);
  const auto t0 = std::chrono::steady_clock::now();
  auto hit = w->space->lookup(tokens);  // RemoteMode::kFetch: ask the cluster before answering
  const double ms = msSince(t0);
  if (!hit) {
    std::fprintf(stderr, "%s lookup failed: %s\n", w->tag.c_str(), hit.error().toString().c_str());
    return 1;
  }
  auto after = w->client->stats();
  if (!after) {
    std::fprintf(stderr, "%s stats failed: %s\n", w->tag.c_str(), after.error().toString().c_str());
    return 1;
  }
  const uint64_t matched = hit->matchedTokens();
  const uint64_t remoteBlocks = after->remoteHitBlocks - before->remoteHitBlocks;
  const uint64_t remoteBytes = after->remoteHitBytes - before->remoteHitBytes;
  std::printf(
      "%s lookup of a %zu-token prompt sharing A's first %zu tokens: hit %lu tokens "
      "(%zu blocks) in %.1f ms, miss %lu tokens to recompute\n",
      w->tag.c_str(), tokens.size(), kSystemTokens, static_cast<unsigned long>(matched),
      hit->blockCount(), ms, static_cast<unsigned long>(tokens.size() - matched));
  std::printf(
      "%s remote hit: %lu blocks, %.1f MiB fetched from the cluster (stats: "
      "cluster.remote_hit_blocks +%lu, cluster.remote_hit_bytes +%lu)\n",
      w->tag.c_str(), static_cast<unsigned long>(remoteBlocks), mib(remoteBytes),
      static_cast<unsigned long>(remoteBlocks), static_cast<unsigned long>(remoteBytes));
  if (!sameAsComputed(*w, *hit, tokens, matched)) return 1;
  const uint64_t bt = w->space->layout().blockTokens;
  const uint64_t expected = kSystemTokens / bt * bt;
  if (matched != expected) {
    std::fprintf(stderr, "%s expected the longest block-aligned shared prefix, %lu tokens\n",
                 w->tag.c_str(), static_cast<unsigned long>(expected));
    return 1;
  }
  if (remoteBlocks == 0) {
    std::fprintf(stderr,
                 "%s expected the blocks to come from another node (this node already "
                 "held them: run with a fresh SEED)\n",
                 w->tag.c_str());
    return 1;
  }
  return 0;
}

}  // namespace kvtier
