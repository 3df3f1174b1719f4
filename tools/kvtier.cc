// kvtier: the command-line tool. `kvtier stats` prints the daemon's counters as JSON;
// `kvtier demo` runs the two-process prefix-sharing demo against a running daemon; the sequence,
// snapshot, entry and checkpoint commands make one SDK call each (kUsage lists them).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvtier/client.h"
#include "tools/cli_numbers.h"
#include "tools/cluster_demo.h"
#include "tools/json_string.h"
#include "tools/replay.h"
#include "tools/synthetic_kv.h"

extern char** environ;

namespace kvtier {
namespace {

const char* kUsage =
    "usage: kvtier [--socket PATH] [--layout SPEC] COMMAND [ARGS]   (kvtier --version: its "
    "version)\n"
    "  stats                         the daemon's counters as JSON\n"
    "  cluster                       the cluster members the daemon sees, and their state\n"
    "  drain                         move this node's snapshots and blocks to the other members\n"
    "  demo                          two processes share a prompt's KV (A puts, B looks up)\n"
    "  replay TRACE [--help]         replay a Mooncake trace; hit rate against an ideal LRU\n"
    "The cross-node demo (scripts/cluster-demo.sh), one process per step, each on its own node:\n"
    "  cluster-demo-prefill [SEED]          put a prompt, snapshot it, print its NODE:ID\n"
    "  cluster-demo-decode NODE:ID [SEED]   restore that snapshot from NODE, check it, decode\n"
    "  cluster-demo-lookup [SEED]           a prompt sharing the prefix: a remote hit\n"
    "Sequences and snapshots of a namespace (SPEC names the layout, default the demo's):\n"
    "  put SEQ BEGIN TOKENS KV [--window W] [--chunk C]\n"
    "                                store KV for TOKENS at BEGIN of SEQ; a put at 0 creates SEQ,\n"
    "                                keeping the last W tokens (sliding window) or the current\n"
    "                                chunk of C (chunked attention); default: every token\n"
    "  lookup TOKENS [--bind SEQ [--window W] [--chunk C]]\n"
    "                                the longest cached prefix of TOKENS; --bind makes it SEQ\n"
    "      TOKENS: a file of token ids (decimal, separated by spaces, commas or new lines);\n"
    "      KV: a file of their packed KV, [layer][K|V][token][kv_head][head_dim] in SPEC's dtype\n"
    "  length SEQ                    truncate SEQ N           remove SEQ BEGIN [END]\n"
    "  copy-prefix SRC DST LEN       can-resume SEQ POS       checkpoints SEQ\n"
    "  snapshot SEQ [FROM]           snapshot-info ID         drop-snapshot ID\n"
    "  restore SEQ [NODE:]ID TARGET  rewind SEQ TARGET   (NODE: a snapshot another node holds)\n"
    "  copy-snapshot NODE:ID         move-snapshot NODE:ID   (to this node; a move drops the "
    "source)\n"
    "  copy-range NODE SEQ [BEGIN [END]]   move-range ...   (SEQ's blocks to NODE's cache)\n"
    "  copy-keys NODE KEY_HEX...           move-keys ...    (blocks by key to NODE's cache)\n"
    "  merge ID_A ID_B               split ID AT\n"
    "  put-entry FILE                get-entry KEY_HEX [OUT]  (content-keyed blobs)\n"
    "  put-checkpoint SEQ POS FILE   get-checkpoint SEQ POS [OUT]  (recurrent state)\n"
    "Sequences the tool creates are detached (they outlive its session).\n"
    "SPEC: model:layers:kv_heads:head_dim:dtype:block_tokens[:neox|gptj:rotary_dims:base]\n"
    "      dtype one of f16 bf16 f32 f8e4m3 f8e5m2 i8; e.g. "
    "llama3:32:8:128:f16:16:neox:128:500000\n"
    "The socket defaults to $KVTIER_SOCKET, else kvtier-data/kvtierd.sock.\n";

// A small real layout (Llama-3-8B's KV shape): 32 layers, 8 KV heads, head dim 128, fp16,
// 16 tokens per block -> 128 KiB per token, 2 MiB per block.
Layout demoLayout() { return Layout{"demo/llama-3-8b", 32, 8, 128, DType::kFloat16, 16, {}}; }

// Process A's prompt: a 100-token system prompt and its own question. Process B shares the system
// prompt and asks something else, so the prompts diverge at position 100.
std::vector<uint32_t> demoPrompt(bool second) {
  auto system = synthetic::tokens(42, 100);
  auto question = synthetic::tokens(second ? 7 : 6, second ? 28 : 16);
  system.insert(system.end(), question.begin(), question.end());
  return system;
}

double mib(uint64_t bytes) { return bytes / 1048576.0; }

std::unique_ptr<Client> connectOrDie(const std::string& socket, const char* name) {
  auto client = Client::connect({.socketPath = socket, .clientName = name});
  if (!client) {
    std::fprintf(stderr, "kvtier: %s\n  (is kvtierd running? start it with build/daemon/kvtierd)\n",
                 client.error().toString().c_str());
    std::exit(1);
  }
  return std::move(client).value();
}

int demoWriter(const std::string& socket) {
  auto client = connectOrDie(socket, "demo-A");
  auto space = client->open(demoLayout()).value();
  const auto prompt = demoPrompt(false);
  const auto kv = synthetic::packedKv(space->layout(), prompt, 0, prompt.size());
  const auto t0 = std::chrono::steady_clock::now();
  auto info = space->put("chat-A", 0, prompt, kv.data(), kv.size());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!info) {
    std::fprintf(stderr, "[A pid %d] put failed: %s\n", getpid(), info.error().toString().c_str());
    return 1;
  }
  std::printf(
      "[A pid %d] put %zu tokens of 'chat-A': %u full blocks sealed and indexed, %zu tokens in a "
      "partial "
      "block; %.1f MiB written %s in %.1f ms\n",
      getpid(), prompt.size(), info->sealedBlocks, prompt.size() % space->layout().blockTokens,
      mib(kv.size()), client->mapped() ? "straight into the shared pool" : "inline", ms);
  return 0;
}

int demoReader(const std::string& socket) {
  auto client = connectOrDie(socket, "demo-B");
  auto space = client->open(demoLayout()).value();
  const auto prompt = demoPrompt(true);
  auto hit = space->lookup(prompt);
  if (!hit) {
    std::fprintf(stderr, "[B pid %d] lookup failed: %s\n", getpid(),
                 hit.error().toString().c_str());
    return 1;
  }
  const uint64_t matched = hit->matchedTokens();
  std::printf(
      "[B pid %d] lookup of a %zu-token prompt sharing A's first 100 tokens: hit %lu tokens (%zu "
      "blocks), "
      "miss %lu tokens to recompute\n",
      getpid(), prompt.size(), static_cast<unsigned long>(matched), hit->blockCount(),
      static_cast<unsigned long>(prompt.size() - matched));
  std::vector<uint8_t> got(matched * space->layout().tokenKvBytes());
  if (auto s = hit->copyTo(0, matched, got.data(), got.size()); !s) {
    std::fprintf(stderr, "[B pid %d] copy failed: %s\n", getpid(), s.error().toString().c_str());
    return 1;
  }
  const auto expected = synthetic::packedKv(space->layout(), prompt, 0, matched);
  const bool same = got == expected;
  std::printf("[B pid %d] %.1f MiB of cached KV read %s: %s\n", getpid(), mib(got.size()),
              client->mapped() ? "in place from shared memory" : "inline",
              same ? "identical to what A computed" : "MISMATCH");
  const uint64_t bt = space->layout().blockTokens;
  const uint64_t expectedMatch = 100 / bt * bt;
  if (matched != expectedMatch) {
    std::printf("[B pid %d] expected the longest block-aligned shared prefix, %lu tokens\n",
                getpid(), static_cast<unsigned long>(expectedMatch));
    return 1;
  }
  return same ? 0 : 1;
}

int runChild(const std::string& socket, const char* role) {
  std::string self = "/proc/self/exe";
  std::vector<std::string> args = {"kvtier", "--socket", socket, role};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
    std::perror("posix_spawn");
    return 1;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int demo(const std::string& socket) {
  std::printf("kvtier demo: two separate processes share KV through kvtierd at %s\n",
              socket.c_str());
  std::fflush(stdout);
  if (int rc = runChild(socket, "demo-writer"); rc != 0) return rc;
  if (int rc = runChild(socket, "demo-reader"); rc != 0) return rc;
  auto client = connectOrDie(socket, "demo-stats");
  auto stats = client->stats().value();
  std::printf("daemon stats: %s\n", stats.toJson().c_str());
  std::printf("demo passed\n");
  return 0;
}

Result<Layout> parseLayout(const std::string& spec) {
  std::vector<std::string> f;
  for (size_t start = 0;;) {
    const size_t colon = spec.find(':', start);
    f.push_back(spec.substr(start, colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (f.size() != 6 && f.size() != 9) {
    return makeError(ErrorCode::kInvalidArgument, "layout '", spec, "' needs 6 or 9 fields");
  }
  Layout l;
  l.modelId = f[0];
  try {
    auto field = [&](size_t i, const char* what) {
      return static_cast<uint32_t>(cli::countOrThrow(f[i], what, 0, UINT32_MAX));
    };
    l.numLayers = field(1, "the layout's layers");
    l.numKvHeads = field(2, "the layout's KV heads");
    l.headDim = field(3, "the layout's head dim");
    l.blockTokens = field(5, "the layout's block tokens");
    if (f.size() == 9) {
      l.rope.rotaryDims = field(7, "the layout's rotary dims");
      size_t used = 0;
      l.rope.base = std::stod(f[8], &used);
      if (used != f[8].size() || !(l.rope.base > 0)) {
        throw std::invalid_argument("the layout's RoPE base wants a positive number, not '" + f[8] +
                                    "'");
      }
    }
  } catch (const std::exception& e) {
    return makeError(ErrorCode::kInvalidArgument, "layout '", spec, "': ", e.what());
  }
  const std::pair<const char*, DType> dtypes[] = {
      {"f16", DType::kFloat16},       {"bf16", DType::kBFloat16},     {"f32", DType::kFloat32},
      {"f8e4m3", DType::kFloat8E4M3}, {"f8e5m2", DType::kFloat8E5M2}, {"i8", DType::kInt8}};
  bool known = false;
  for (const auto& [name, dtype] : dtypes) {
    if (f[4] == name) l.dtype = dtype, known = true;
  }
  if (!known) return makeError(ErrorCode::kInvalidArgument, "unknown dtype '", f[4], "'");
  if (f.size() == 9) {
    if (f[6] != "neox" && f[6] != "gptj") {
      return makeError(ErrorCode::kInvalidArgument, "rope style is neox or gptj, not '", f[6], "'");
    }
    l.rope.style = f[6] == "neox" ? RopeStyle::kNeox : RopeStyle::kGptj;
  }
  if (auto v = l.validate(); !v) return v.error();
  return l;
}

Result<std::vector<uint8_t>> readFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return makeError(ErrorCode::kInvalidArgument, "cannot read ", path);
  std::vector<uint8_t> out;
  uint8_t buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.insert(out.end(), buf, buf + n);
  std::fclose(f);
  if (out.empty()) return makeError(ErrorCode::kInvalidArgument, path, " is empty");
  return out;
}

// A file of token ids: decimal numbers separated by white space or commas (what a tokenizer's
// ids printed as a list give). INVALID_ARGUMENT naming the first thing that is not a token id.
Result<std::vector<uint32_t>> readTokens(const std::string& path) {
  auto bytes = readFile(path);
  if (!bytes) return bytes.error();
  std::vector<uint32_t> tokens;
  const std::string text(bytes->begin(), bytes->end());
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find_first_of(" \t\r\n,", at);
    const std::string word = text.substr(at, end - at);
    at = end == std::string::npos ? text.size() : end + 1;
    if (word.empty()) continue;
    auto id = cli::parseCount(word, "token " + std::to_string(tokens.size()) + " of " + path, 0,
                              UINT32_MAX);
    if (!id) return id.error();
    tokens.push_back(static_cast<uint32_t>(*id));
  }
  if (tokens.empty()) return makeError(ErrorCode::kInvalidArgument, path, " holds no token id");
  return tokens;
}

void writeFile(const std::string& path, std::span<const uint8_t> bytes) {
  if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
}

std::string snapshotJson(const SnapshotInfo& s) {
  std::string out = "{\"id\": " + std::to_string(s.id) + ", \"from\": " + std::to_string(s.from) +
                    ", \"to\": " + std::to_string(s.to) + ", \"checkpoints\": [";
  for (size_t i = 0; i < s.checkpoints.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(s.checkpoints[i]);
  }
  out += "]";
  if (!s.node.empty()) out += ", \"node\": \"" + s.node + "\", \"name\": \"" + s.node + ":" + std::to_string(s.id) + "\"";
  return out + "}";
}

// "NODE:ID" (a snapshot of another cluster node) or "ID" (this node's).
// A 32-digit hex key (as `kvtier put-entry` prints); throws std::invalid_argument otherwise.
Key128 parseKey(const std::string& hex) {
  if (hex.size() != 32) throw std::invalid_argument("a key has 32 hex digits");
  Key128 key;
  if (hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    throw std::invalid_argument("a key has 32 hex digits, not '" + hex + "'");
  }
  for (size_t i = 0; i < 16; ++i) {
    key.bytes[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  return key;
}

std::string transferJson(const BlockTransfer& t) {
  return "{\"blocks\": " + std::to_string(t.blocks) + ", \"held\": " + std::to_string(t.held) +
         ", \"dropped\": " + std::to_string(t.dropped) + "}";
}

std::pair<std::string, uint64_t> snapshotName(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) return {"", cli::countOrThrow(text, "the snapshot id")};
  return {text.substr(0, colon), cli::countOrThrow(text.substr(colon + 1), "the snapshot id")};
}

// The options of put and lookup (--window W, --chunk C, --bind SEQ), taken out of `a`; throws
// std::invalid_argument for another option or one without its value.
struct SequenceFlags {
  uint64_t window = 0, chunk = 0;
  std::string bind;
};
SequenceFlags takeSequenceFlags(std::vector<std::string>& a) {
  SequenceFlags flags;
  std::vector<std::string> rest;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].rfind("--", 0) != 0) {
      rest.push_back(a[i]);
      continue;
    }
    if (i + 1 >= a.size()) throw std::invalid_argument(a[i] + " needs a value");
    const std::string& value = a[++i];
    if (a[i - 1] == "--window") {
      flags.window = cli::countOrThrow(value, "--window");
    } else if (a[i - 1] == "--chunk") {
      flags.chunk = cli::countOrThrow(value, "--chunk");
    } else if (a[i - 1] == "--bind" && a[0] == "lookup") {
      flags.bind = value;
    } else {
      throw std::invalid_argument("'" + a[0] + "' takes no " + a[i - 1]);
    }
  }
  a = std::move(rest);
  return flags;
}

// The sequence and snapshot commands: one call each, answered with one JSON line.
int spaceCommand(const std::string& socket, const Layout& layout, std::vector<std::string> a) {
  auto client = connectOrDie(socket, "kvtier-cli");
  auto opened = client->open(layout);
  if (!opened) {
    std::fprintf(stderr, "kvtier: %s\n", opened.error().toString().c_str());
    return 1;
  }
  Space& space = **opened;
  // Argument i as a number (a position, a length, an id).
  auto num = [&](size_t i) {
    return cli::countOrThrow(a.at(i), "argument " + std::to_string(i) + " of '" + a[0] + "'");
  };
  auto report = [](const auto& result, auto&& print) {
    if (!result.ok()) {
      std::fprintf(stderr, "kvtier: %s\n", result.error().toString().c_str());
      return 1;
    }
    print();
    return 0;
  };
  auto done = [] { std::printf("{\"ok\": true}\n"); };
  const std::string cmd = a[0];
  try {
    if (cmd == "put" || cmd == "lookup") {
      const SequenceFlags flags = takeSequenceFlags(a);
      if (cmd == "put" && a.size() == 5) {
        const uint64_t begin = num(2);
        auto tokens = readTokens(a[3]);
        if (!tokens) return report(tokens, [] {});
        const auto kv = readFile(a[4]);
        if (!kv) return report(kv, [] {});
        const PutOptions options{
            .detached = true, .window = flags.window, .chunk = flags.chunk, .keys = {}};
        auto r = space.put(a[1], begin, *tokens, kv->data(), kv->size(), options);
        return report(r, [&] {
          std::printf("{\"length\": %lu, \"sealed_blocks\": %u}\n",
                      static_cast<unsigned long>(r->length), r->sealedBlocks);
        });
      }
      if (cmd == "lookup" && a.size() == 2) {
        if (flags.bind.empty() && (flags.window || flags.chunk)) {
          throw std::invalid_argument("--window and --chunk apply to the sequence --bind makes");
        }
        auto tokens = readTokens(a[1]);
        if (!tokens) return report(tokens, [] {});
        LookupOptions options;
        options.bindSeq = flags.bind;
        options.detached = true;
        options.window = flags.window;
        options.chunk = flags.chunk;
        auto r = space.lookup(*tokens, options);
        return report(r, [&] {
          const std::string bound =
              flags.bind.empty() ? "" : ", \"bound\": " + jsonString(flags.bind);
          std::printf("{\"matched_tokens\": %lu, \"blocks\": %zu%s}\n",
                      static_cast<unsigned long>(r->matchedTokens()), r->blockCount(),
                      bound.c_str());
        });
      }
    }
    if (cmd == "length" && a.size() == 2) {
      auto r = space.length(a[1]);
      return report(r, [&] {
        std::printf("{\"exists\": %s, \"length\": %lu}\n", r->has_value() ? "true" : "false",
                    static_cast<unsigned long>(r->value_or(0)));
      });
    }
    if (cmd == "truncate" && a.size() == 3) return report(space.truncate(a[1], num(2)), done);
    if (cmd == "remove" && (a.size() == 3 || a.size() == 4)) {
      return report(space.remove(a[1], num(2), a.size() == 4 ? num(3) : kEndPosition), done);
    }
    if (cmd == "copy-prefix" && a.size() == 4) {
      return report(space.copyPrefix(a[1], a[2], num(3), /*detached=*/true), done);
    }
    if (cmd == "can-resume" && a.size() == 3) {
      auto r = space.canResume(a[1], num(2));
      return report(r, [&] { std::printf("{\"can_resume\": %s}\n", *r ? "true" : "false"); });
    }
    if (cmd == "checkpoints" && a.size() == 2) {
      auto r = space.checkpoints(a[1]);
      return report(r, [&] {
        std::string list;
        for (uint64_t p : *r) list += (list.empty() ? "" : ", ") + std::to_string(p);
        std::printf("{\"checkpoints\": [%s]}\n", list.c_str());
      });
    }
    if (cmd == "snapshot" && (a.size() == 2 || a.size() == 3)) {
      auto r = space.snapshot(a[1], a.size() == 3 ? num(2) : 0);
      return report(r, [&] { std::printf("%s\n", snapshotJson(*r).c_str()); });
    }
    if (cmd == "snapshot-info" && a.size() == 2) {
      auto r = space.snapshotInfo(num(1));
      return report(r, [&] { std::printf("%s\n", snapshotJson(*r).c_str()); });
    }
    if (cmd == "drop-snapshot" && a.size() == 2) return report(space.dropSnapshot(num(1)), done);
    if (cmd == "restore" && a.size() == 4) {
      const auto [node, id] = snapshotName(a[2]);
      return report(space.restore(a[1], id, num(3),
                                  PutOptions{.detached = true, .window = 0, .chunk = 0, .keys = {}},
                                  node),
                    done);
    }
    if ((cmd == "copy-snapshot" || cmd == "move-snapshot") && a.size() == 2) {
      const auto [node, id] = snapshotName(a[1]);
      auto r = space.copySnapshot(node, id, cmd == "move-snapshot");
      return report(r, [&] { std::printf("%s\n", snapshotJson(*r).c_str()); });
    }
    if ((cmd == "copy-range" || cmd == "move-range") && a.size() >= 3 && a.size() <= 5) {
      auto r = space.copyRange(a[1], a[2], a.size() >= 4 ? num(3) : 0,
                               a.size() == 5 ? num(4) : kEndPosition, cmd == "move-range");
      return report(r, [&] { std::printf("%s\n", transferJson(*r).c_str()); });
    }
    if ((cmd == "copy-keys" || cmd == "move-keys") && a.size() >= 3) {
      std::vector<Key128> keys;
      for (size_t i = 2; i < a.size(); ++i) keys.push_back(parseKey(a[i]));
      auto r = space.copyKeys(a[1], keys, cmd == "move-keys");
      return report(r, [&] { std::printf("%s\n", transferJson(*r).c_str()); });
    }
    if (cmd == "rewind" && a.size() == 3) return report(space.rewind(a[1], num(2)), done);
    if (cmd == "merge" && a.size() == 3) {
      auto r = space.mergeSnapshots(num(1), num(2));
      return report(r, [&] { std::printf("%s\n", snapshotJson(*r).c_str()); });
    }
    if (cmd == "split" && a.size() == 3) {
      auto r = space.splitSnapshot(num(1), num(2));
      return report(r, [&] {
        std::printf("{\"left\": %s, \"right\": %s}\n", snapshotJson(r->first).c_str(),
                    snapshotJson(r->second).c_str());
      });
    }
    if (cmd == "put-entry" && a.size() == 2) {
      const auto bytes = readFile(a[1]);
      if (!bytes) return report(bytes, [] {});
      const Key128 key = contentKey(bytes->data(), bytes->size());
      return report(space.putEntry(key, bytes->data(), bytes->size()), [&] {
        std::printf("{\"key\": \"%s\", \"bytes\": %zu}\n", key.hex().c_str(), bytes->size());
      });
    }
    if (cmd == "get-entry" && (a.size() == 2 || a.size() == 3) && a[1].size() == 32) {
      const Key128 key = parseKey(a[1]);
      auto r = space.getEntry(key);
      return report(r, [&] {
        if (a.size() == 3) writeFile(a[2], r->data());
        std::printf("{\"bytes\": %zu, \"content_key\": \"%s\"}\n", r->data().size(),
                    contentKey(r->data().data(), r->data().size()).hex().c_str());
      });
    }
    if (cmd == "put-checkpoint" && a.size() == 4) {
      const auto bytes = readFile(a[3]);
      if (!bytes) return report(bytes, [] {});
      return report(space.putCheckpoint(a[1], num(2), bytes->data(), bytes->size()), done);
    }
    if (cmd == "get-checkpoint" && (a.size() == 3 || a.size() == 4)) {
      auto r = space.getCheckpoint(a[1], num(2));
      return report(r, [&] {
        if (a.size() == 4) writeFile(a[3], r->data());
        std::printf("{\"bytes\": %zu}\n", r->data().size());
      });
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvtier: %s (keys: 32 hex digits)\n%s", e.what(), kUsage);
    return 2;
  }
  std::fprintf(stderr, "kvtier: bad command or arguments: %s\n%s", cmd.c_str(), kUsage);
  return 2;
}

// `kvtier drain`: hands the node's snapshots and blocks to the other members, step by step, with
// a progress bar; safe to interrupt and run again.
int drain(const std::string& socket) {
  auto client = connectOrDie(socket, "kvtier-drain");
  uint64_t moved = 0, copied = 0, total = 0;
  const bool tty = ::isatty(STDERR_FILENO);
  for (int round = 0;; ++round) {
    auto step = client->drain(/*maxSnapshots=*/16, /*maxBlocks=*/1024);
    if (!step) {
      std::fprintf(stderr, "%skvtier: drain: %s\n", tty ? "\n" : "", step.error().toString().c_str());
      return 1;
    }
    moved += step->snapshotsMoved;
    copied += step->blocksCopied;
    const uint64_t left = step->snapshotsLeft + step->blocksLeft;
    total = std::max(total, moved + copied + left);
    const int width = 40;
    const int filled = total ? static_cast<int>(width * double(moved + copied) / double(total)) : width;
    std::fprintf(stderr, "%sdrain [%.*s%*s] %lu snapshots moved, %lu blocks copied, %lu left%s",
                 tty ? "\r" : "", filled, "########################################",
                 width - filled, "", static_cast<unsigned long>(moved),
                 static_cast<unsigned long>(copied), static_cast<unsigned long>(left),
                 tty ? "" : "\n");
    if (left == 0) break;
    if (step->snapshotsMoved + step->blocksCopied == 0 && round > 0) {
      std::fprintf(stderr, "\nkvtier: drain: %lu items could not be handed over; run it again\n",
                   static_cast<unsigned long>(step->failures));
      return 1;
    }
  }
  std::fprintf(stderr, "%s", tty ? "\n" : "");
  std::printf("{\"snapshots_moved\": %lu, \"blocks_copied\": %lu, \"left\": 0}\n",
              static_cast<unsigned long>(moved), static_cast<unsigned long>(copied));
  return 0;
}

// `kvtier cluster`: the members the daemon sees, one a line.
int cluster(const std::string& socket) {
  auto client = connectOrDie(socket, "kvtier-cluster");
  auto c = client->cluster();
  if (!c) {
    std::fprintf(stderr, "kvtier: %s\n", c.error().toString().c_str());
    return 1;
  }
  if (c->second.empty()) {
    std::printf("not in a cluster (start kvtierd with --listen and --peers or --etcd)\n");
    return 0;
  }
  std::printf("%-24s %-24s %s\n", "NODE", "ADDRESS", "STATE");
  for (const auto& m : c->second) {
    std::printf("%-24s %-24s %s%s\n", m.nodeId.empty() ? "?" : m.nodeId.c_str(),
                m.address.c_str(), m.up ? "up" : "down", m.self ? " (this node)" : "");
  }
  return 0;
}

int stats(const std::string& socket) {
  auto client = connectOrDie(socket, "kvtier-stats");
  auto s = client->stats();
  if (!s) {
    std::fprintf(stderr, "kvtier: %s\n", s.error().toString().c_str());
    return 1;
  }
  std::printf("%s\n", s->toJson().c_str());
  return 0;
}

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) {
  std::string socket =
      std::getenv("KVTIER_SOCKET") ? std::getenv("KVTIER_SOCKET") : "kvtier-data/kvtierd.sock";
  std::string layoutSpec;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) {
      socket = argv[++i];
    } else if (a.rfind("--socket=", 0) == 0) {
      socket = a.substr(9);
    } else if (a == "--layout" && i + 1 < argc) {
      layoutSpec = argv[++i];
    } else if (a == "-h" || a == "--help") {
      std::fputs(kvtier::kUsage, stdout);
      return 0;
    } else if (a == "--version") {
      std::printf("kvtier %s\n", KVTIER_VERSION);
      return 0;
    } else {
      break;
    }
  }
  if (i >= argc) {
    std::fputs(kvtier::kUsage, stderr);
    return 2;
  }
  const std::string command = argv[i];
  if (command == "stats") return kvtier::stats(socket);
  if (command == "cluster") return kvtier::cluster(socket);
  if (command == "drain") return kvtier::drain(socket);
  if (command == "demo") return kvtier::demo(socket);
  if (command == "replay") return kvtier::replayMain(socket, argc - i - 1, argv + i + 1);
  if (command == "demo-writer") return kvtier::demoWriter(socket);
  if (command == "demo-reader") return kvtier::demoReader(socket);
  if (command == "cluster-demo-prefill" || command == "cluster-demo-decode" ||
      command == "cluster-demo-lookup") {
    const std::vector<std::string> args(argv + i + 1, argv + argc);
    if (command == "cluster-demo-prefill") return kvtier::clusterDemoPrefill(socket, args);
    if (command == "cluster-demo-decode") return kvtier::clusterDemoDecode(socket, args);
    return kvtier::clusterDemoLookup(socket, args);
  }
  kvtier::Layout layout = kvtier::demoLayout();
  if (!layoutSpec.empty()) {
    auto parsed = kvtier::parseLayout(layoutSpec);
    if (!parsed) {
      std::fprintf(stderr, "kvtier: %s\n", parsed.error().toString().c_str());
      return 2;
    }
    layout = *parsed;
  }
  static const char* kSpaceCommands[] = {
      "put",           "lookup",     "length",         "truncate",       "remove",
      "copy-prefix",   "can-resume", "checkpoints",    "snapshot",       "snapshot-info",
      "drop-snapshot", "restore",    "rewind",         "merge",          "split",
      "get-entry",     "put-entry",  "put-checkpoint", "get-checkpoint", "copy-snapshot",
      "move-snapshot", "copy-range", "move-range",     "copy-keys",      "move-keys"};
  for (const char* c : kSpaceCommands) {
    if (command == c) {
      return kvtier::spaceCommand(socket, layout, std::vector<std::string>(argv + i, argv + argc));
    }
  }
  std::fprintf(stderr, "kvtier: unknown command '%s'\n%s", command.c_str(), kvtier::kUsage);
  return 2;
}
