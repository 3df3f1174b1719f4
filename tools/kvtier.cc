// kvtier: the command-line tool. `kvtier stats` prints the daemon's counters as JSON;
// `kvtier demo` runs the two-process prefix-sharing demo against a running daemon.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvtier/client.h"
#include "tools/synthetic_kv.h"

extern char** environ;

namespace kvtier {
namespace {

const char* kUsage =
    "usage: kvtier [--socket PATH] COMMAND\n"
    "  stats    print the daemon's counters as JSON\n"
    "  demo     two processes share a prompt's KV through the daemon (A puts, B looks up)\n"
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
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) {
      socket = argv[++i];
    } else if (a.rfind("--socket=", 0) == 0) {
      socket = a.substr(9);
    } else if (a == "-h" || a == "--help") {
      std::fputs(kvtier::kUsage, stdout);
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
  if (command == "demo") return kvtier::demo(socket);
  if (command == "demo-writer") return kvtier::demoWriter(socket);
  if (command == "demo-reader") return kvtier::demoReader(socket);
  std::fprintf(stderr, "kvtier: unknown command '%s'\n%s", command.c_str(), kvtier::kUsage);
  return 2;
}
