// `kvtier replay`'s command line: its arguments, the table it prints, the plot, the JSON file
// (replay.cc runs the replay itself).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tools/cli_numbers.h"
#include "tools/policy_sim.h"
#include "tools/replay.h"
#include "tools/synthetic_trace.h"

extern char** environ;

namespace kvtier::replay {
namespace {

const char* kReplayUsage =
    "usage: kvtier [--socket PATH] replay TRACE|--synthetic KIND [options]\n"
    "Replays a Mooncake-format trace (JSON lines: timestamp, input_length, output_length,\n"
    "hash_ids) against running kvtierd daemons; one trace block = one 1 KiB kvtier block.\n"
    "  --capacity BLOCKS        blocks per node the anchors assume (default: the daemon's)\n"
    "  --nodes S1,S2,...        the daemons' sockets (default: --socket)\n"
    "  --route session|round-robin  session: by the request's first hash id (default)\n"
    "  --speedup X              replay at X times the trace's timestamps (default: at once)\n"
    "  --limit N                the first N requests\n"
    "  --whole                  put each request whole from position 0, hit blocks included\n"
    "                           (default: a lookup bound to the sequence, then the missed blocks)\n"
    "  --state-blocks S         a hybrid model's cache: a state of S blocks' bytes is put at\n"
    "                           every --checkpoint-blocks C-th boundary past the hit and at each\n"
    "                           request's end; a hit needs the state (whole puts); the table\n"
    "                           adds an LRU model with states every C blocks and every block\n"
    "  --checkpoint-blocks C    the states' spacing in blocks (default 8 with --state-blocks)\n"
    "  --synthetic KIND         replay a generated workload instead of TRACE: shared-prompts,\n"
    "                           scan, agents, hot-prompts, documents or mixed, written as a\n"
    "                           trace into a temporary directory (removed after) or --trace-out\n"
    "                           FILE\n"
    "  --seed N                 the synthetic workload's seed (default 1)\n"
    "  --trace-out FILE         keep the synthetic trace (Mooncake JSON lines) in FILE\n"
    "  --json FILE              write the run as JSON ({\"runs\": [...]})\n"
    "  --plot FILE.png          plot it (scripts/plot-replay.py, matplotlib; from --json's\n"
    "                           file, or from a temporary one, removed after)\n"
    "  --progress               a progress bar even when stderr is not a terminal\n"
    "  --policies [P1,P2,...]   no daemon: every eviction policy (or those named) through the\n"
    "                           engine in process at each --capacity C1,C2,... (default\n"
    "                           1000,6000,20000), a table of hit rates beside the ideal LRU\n";

// A fresh directory under $TMPDIR (or /tmp) for a generated trace or the plot's input, removed
// with what it holds.
struct TempDir {
  std::string path;
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/kvtier-replay-XXXXXX";
    if (::mkdtemp(pattern.data())) path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// Every policy kvtierd offers, by name.
std::vector<std::string> allPolicyNames() {
  return {"lru", "arc", "2q", "s3fifo", "sieve", "adaptive"};
}
// Whether `arg` (the word after --policies) names policies rather than the TRACE: a list, or
// one policy's name.
bool policyNames(const std::string& arg) {
  return arg.find(',') != std::string::npos || parseEvictionKind(arg).ok();
}

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  for (size_t start = 0;;) {
    const size_t comma = s.find(',', start);
    std::string part = s.substr(start, comma - start);
    if (!part.empty()) out.push_back(part);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

void printTable(const ReplayRun& r) {
  const uint64_t total = r.capacityBlocks * r.nodes;
  std::printf("kvtier replay %s: %lu requests, %lu blocks (%lu distinct)\n", r.tracePath.c_str(),
              (unsigned long)r.requests, (unsigned long)r.blocks, (unsigned long)r.distinctBlocks);
  std::printf("  %zu node%s x %lu blocks", r.nodes, r.nodes > 1 ? "s" : "",
              (unsigned long)r.capacityBlocks);
  if (r.nodes > 1) std::printf(", route %s", routeName(r.route));
  if (r.speedup > 0) std::printf(", speedup %.1fx (max lag %.1f ms)", r.speedup, r.maxLagMs);
  std::printf(", %s\n", r.whole ? "whole puts" : "puts of the missed blocks");
  // Said before the table: the anchors simulate empty caches of the capacity, nothing else.
  const bool comparable = r.comparable();
  if (!comparable) {
    std::printf(
        "\n  NOT COMPARABLE: the anchors below simulate %zu empty cache%s of %lu blocks, "
        "but\n",
        r.nodes, r.nodes > 1 ? "s" : "", (unsigned long)r.capacityBlocks);
    for (const std::string& why : r.notComparable) std::printf("  - %s\n", why.c_str());
    std::printf(
        "  kvtier's hit rate is what the daemons hit; its comparisons with the anchors are "
        "left out.\n");
  }
  std::printf("\n  %-38s %9s %12s\n", "", "hit rate", "hit blocks");
  // A comparison column, or nothing when the run is not comparable.
  char compared[96];
  auto compare = [&](const char* format, double value) -> const char* {
    if (!comparable) return "";
    std::snprintf(compared, sizeof compared, format, value);
    return compared;
  };
  char label[96];
  std::snprintf(label, sizeof label, "kvtier (%zu node%s)", r.nodes, r.nodes > 1 ? "s" : "");
  std::printf("  %-38s %8.2f%% %12lu\n", label, 100 * r.hitRate(), (unsigned long)r.hitBlocks);
  std::snprintf(label, sizeof label, "ideal LRU of %lu blocks", (unsigned long)total);
  std::printf("  %-38s %8.2f%% %12lu%s\n", label, 100 * r.idealHitRate(),
              (unsigned long)r.idealHitBlocks,
              compare("   kvtier %+.2f pp", 100 * (r.hitRate() - r.idealHitRate())));
  if (r.nodes > 1) {
    std::snprintf(label, sizeof label, "%zu isolated LRUs of %lu (%s)", r.nodes,
                  (unsigned long)r.capacityBlocks, routeName(r.route));
    std::printf("  %-38s %8.2f%% %12lu%s\n", label, 100 * r.rate(r.isolatedHitBlocks),
                (unsigned long)r.isolatedHitBlocks,
                r.isolatedHitBlocks
                    ? compare("   kvtier x%.3f", double(r.hitBlocks) / double(r.isolatedHitBlocks))
                    : "");
  }
  if (r.nodes > 1) {
    std::printf("  %-38s %8.2f%% %12lu\n", "model: remote hits copied (as kvtier)",
                100 * r.rate(r.modelHitBlocks), (unsigned long)r.modelHitBlocks);
    std::printf("  %-38s %8.2f%% %12lu\n", "model: copies evicted first (what-if)",
                100 * r.rate(r.modelFetchedLastHitBlocks),
                (unsigned long)r.modelFetchedLastHitBlocks);
  }
  // No gap (the LRU hits what the optimum hits, e.g. every distinct block fits): nothing to close.
  const char* gap =
      std::isnan(r.gapClosed())
          ? (comparable ? "   no gap: the LRU is optimal at this capacity" : "")
          : compare("   kvtier closed %.1f%% of the LRU-to-optimum gap", 100 * r.gapClosed());
  std::printf("  %-38s %8.2f%% %12lu%s\n", "Belady's optimum (offline)",
              100 * r.rate(r.optHitBlocks), (unsigned long)r.optHitBlocks, gap);
  std::printf("  %-38s %8.2f%% %12lu\n", "infinite cache", 100 * r.rate(r.infiniteHitBlocks),
              (unsigned long)r.infiniteHitBlocks);
  if (r.stateBlocks > 0) {
    std::printf("\n  a hybrid model's cache: states of %u blocks, %lu put\n", r.stateBlocks,
                (unsigned long)r.statesPut);
    std::snprintf(label, sizeof label, "model: LRU, a state every %u blocks", r.checkpointBlocks);
    std::printf(
        "  %-38s %8.2f%% %12lu%s\n", label, 100 * r.rate(r.modelStatesHitBlocks),
        (unsigned long)r.modelStatesHitBlocks,
        compare("   kvtier %+.2f pp", 100 * (r.hitRate() - r.rate(r.modelStatesHitBlocks))));
    std::printf("  %-38s %8.2f%% %12lu   the spacing %+.2f pp\n",
                "model: LRU, a state at every block", 100 * r.rate(r.modelEveryBlockHitBlocks),
                (unsigned long)r.modelEveryBlockHitBlocks,
                100 * (r.rate(r.modelStatesHitBlocks) - r.rate(r.modelEveryBlockHitBlocks)));
  }
  std::printf("\n  evictions %lu", (unsigned long)r.evictions);
  if (r.nodes > 1) {
    std::printf(", remote hit blocks %lu in %lu remote lookups, fetch errors %lu\n",
                (unsigned long)r.remoteHitBlocks, (unsigned long)r.remoteLookups,
                (unsigned long)r.fetchErrors);
    std::printf("  held copies %lu of %lu distinct keys (%.3f copies per key)",
                (unsigned long)r.heldKeys, (unsigned long)r.distinctKeys,
                r.distinctKeys ? double(r.heldKeys) / double(r.distinctKeys) : 0.0);
  }
  std::printf("\n  hit blocks checked %lu, wrong %lu; errors %lu%s%s\n",
              (unsigned long)r.verifiedBlocks, (unsigned long)r.wrongBlocks,
              (unsigned long)r.errors, r.errors ? ", first: " : "", r.firstError.c_str());
  std::printf(
      "  %.2f s, %.0f requests/s; lookup p50 %.3f ms p99 %.3f ms max %.1f ms (%lu over 1 s); "
      "request p50 %.3f ms p99 %.3f ms\n",
      r.wallSeconds, r.wallSeconds > 0 ? r.requests / r.wallSeconds : 0.0, r.lookupMs.p50,
      r.lookupMs.p99, r.lookupMs.max, (unsigned long)r.slowLookups, r.requestMs.p50,
      r.requestMs.p99);
}

// Runs scripts/plot-replay.py on a JSON file; the exit status of the script (127: not started).
int plot(const std::string& json, const std::string& png) {
  const char* script = std::getenv("KVTIER_PLOT_SCRIPT");
  std::string scriptPath = script ? script : KVTIER_PLOT_SCRIPT;
  // Debian's python3 sees python3-matplotlib; another python3 first on the PATH may not.
  const char* python = std::getenv("KVTIER_PYTHON");
  std::string pythonPath =
      python ? python : (access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3");
  std::vector<std::string> args = {pythonPath, scriptPath, "--out", png, json};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  if (posix_spawnp(&pid, pythonPath.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
    std::fprintf(stderr, "kvtier replay: cannot start %s\n", pythonPath.c_str());
    return 127;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace
}  // namespace kvtier::replay

namespace kvtier {

int replayMain(const std::string& socket, int argc, char** argv) {
  using namespace replay;
  std::string tracePath, json, png, nodes, synthetic, traceOut, capacities;
  std::optional<std::vector<EvictionKind>> policies;
  uint64_t seed = 1;
  ReplayOptions options;
  std::vector<uint64_t> capacityList;
  size_t limit = 0;
  bool progress = isatty(STDERR_FILENO) != 0;
  try {
    for (int i = 0; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        return argv[++i];
      };
      if (a == "--capacity") {
        capacities = value();
      } else if (a == "--policies") {
        policies.emplace();
        const bool named = i + 1 < argc && argv[i + 1][0] != '-' && policyNames(argv[i + 1]);
        for (const std::string& name : named ? splitList(argv[++i]) : allPolicyNames()) {
          auto kind = parseEvictionKind(name);
          if (!kind) throw std::invalid_argument(kind.error().message());
          policies->push_back(*kind);
        }
      } else if (a == "--nodes") {
        nodes = value();
      } else if (a == "--route") {
        const std::string r = value();
        if (r == "session") {
          options.route = Route::kSession;
        } else if (r == "round-robin") {
          options.route = Route::kRoundRobin;
        } else {
          throw std::invalid_argument("--route is session or round-robin, not " + r);
        }
      } else if (a == "--speedup") {
        options.speedup = std::stod(value());
        if (!(options.speedup > 0)) throw std::invalid_argument("--speedup must be > 0");
      } else if (a == "--limit") {
        limit = cli::countOrThrow(value(), a);
      } else if (a == "--json") {
        json = value();
      } else if (a == "--plot") {
        png = value();
      } else if (a == "--whole") {
        options.whole = true;
      } else if (a == "--state-blocks") {
        options.stateBlocks = static_cast<uint32_t>(cli::countOrThrow(value(), a, 0, UINT32_MAX));
      } else if (a == "--checkpoint-blocks") {
        options.checkpointBlocks =
            static_cast<uint32_t>(cli::countOrThrow(value(), a, 1, UINT32_MAX));
      } else if (a == "--synthetic") {
        synthetic = value();
      } else if (a == "--seed") {
        seed = cli::countOrThrow(value(), a);
      } else if (a == "--trace-out") {
        traceOut = value();
      } else if (a == "--progress") {
        progress = true;
      } else if (a == "-h" || a == "--help") {
        std::fputs(kReplayUsage, stdout);
        return 0;
      } else if (!a.empty() && a[0] != '-' && tracePath.empty()) {
        tracePath = a;
      } else {
        throw std::invalid_argument("unknown argument " + a);
      }
    }
    // One capacity for the daemons' anchors; a list with --policies.
    for (const std::string& c : splitList(capacities)) {
      capacityList.push_back(cli::countOrThrow(c, "--capacity", 1));
    }
    if (capacityList.size() > 1 && !policies) {
      throw std::invalid_argument("--capacity takes one number (a list with --policies)");
    }
    if (!capacityList.empty()) options.capacityBlocks = capacityList.front();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvtier replay: %s\n%s", e.what(), kReplayUsage);
    return 2;
  }
  if (options.stateBlocks > 0 && options.checkpointBlocks == 0) options.checkpointBlocks = 8;
  if (tracePath.empty() == synthetic.empty()) {
    std::fprintf(stderr, "kvtier replay: give a TRACE or --synthetic KIND, not %s\n%s",
                 tracePath.empty() ? "neither" : "both", kReplayUsage);
    return 2;
  }
  // A synthetic workload is written as a trace file and replayed from it, so that what was
  // replayed can be kept and replayed again (--trace-out) or by other tools.
  std::optional<TempDir> tempDir;
  if (!synthetic.empty()) {
    auto kind = parseSyntheticKind(synthetic);
    if (!kind) {
      std::fprintf(stderr, "kvtier replay: %s\n", kind.error().message().c_str());
      return 2;
    }
    if (traceOut.empty()) {
      tempDir.emplace();
      if (tempDir->path.empty()) {
        std::fprintf(stderr, "kvtier replay: cannot make a temporary directory\n");
        return 1;
      }
      traceOut = tempDir->path + "/" + synthetic + ".jsonl";
    }
    if (auto s = writeTrace(traceOut, syntheticTrace(*kind, seed)); !s) {
      std::fprintf(stderr, "kvtier replay: %s\n", s.error().message().c_str());
      return 1;
    }
    tracePath = traceOut;
  }
  options.sockets = nodes.empty() ? std::vector<std::string>{socket} : splitList(nodes);
  options.tracePath = tracePath;
  if (tempDir) options.tracePath = "synthetic:" + synthetic + " seed " + std::to_string(seed);
  auto trace = loadTrace(tracePath, limit);
  if (!trace) {
    std::fprintf(stderr, "kvtier replay: %s\n", trace.error().toString().c_str());
    return 2;
  }
  if (policies) {
    if (capacityList.empty()) capacityList = {1000, 6000, 20000};
    uint64_t errors = 0;
    const std::string workload = synthetic.empty() ? tracePath : "synthetic " + synthetic;
    std::fputs(policyTable(workload, *trace, capacityList, *policies, errors).c_str(), stdout);
    if (errors) std::printf("  %llu engine errors\n", static_cast<unsigned long long>(errors));
    return errors == 0 ? 0 : 1;
  }

  ProgressFn bar;
  if (progress) {
    bar = [last = std::chrono::steady_clock::time_point()](size_t done, size_t total,
                                                           const ReplayRun& r) mutable {
      const auto now = std::chrono::steady_clock::now();
      if (done != total && now - last < std::chrono::milliseconds(100)) return;
      last = now;
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(kWidth * done / total);
      std::fprintf(stderr, "\r[%.*s%*s] %5.1f%% %zu/%zu  hit %.2f%%  ideal LRU %.2f%% ", filled,
                   "##############################", kWidth - filled, "", 100.0 * done / total,
                   done, total, 100 * r.hitRate(), 100 * r.idealHitRate());
      if (done == total) std::fputc('\n', stderr);
    };
  }
  auto run = replayTrace(*trace, options, bar);
  if (!run) {
    if (progress) std::fputc('\n', stderr);
    std::fprintf(stderr, "kvtier replay: %s\n", run.error().toString().c_str());
    return 1;
  }
  printTable(*run);
  std::fflush(stdout);

  // The plot is drawn from the JSON: --json's file, or without it a temporary one that goes
  // with the plot's temporary directory (nothing is written that was not asked for).
  const std::string doc = runsJson(std::span<const ReplayRun>(&*run, 1));
  std::optional<TempDir> plotDir;
  std::string jsonPath = json;
  if (jsonPath.empty() && !png.empty()) {
    plotDir.emplace();
    if (plotDir->path.empty()) {
      std::fprintf(stderr, "kvtier replay: cannot make a temporary directory\n");
      return 1;
    }
    jsonPath = plotDir->path + "/replay.json";
  }
  if (!jsonPath.empty()) {
    std::FILE* f = std::fopen(jsonPath.c_str(), "w");
    bool written = f && std::fwrite(doc.data(), 1, doc.size(), f) == doc.size();
    if (f && std::fclose(f) != 0) written = false;
    if (!written) {
      std::fprintf(stderr, "kvtier replay: cannot write %s\n", jsonPath.c_str());
      return 1;
    }
    if (!json.empty()) std::printf("  wrote %s\n", json.c_str());
  }
  if (!png.empty()) {
    if (plot(jsonPath, png) != 0) {
      std::fprintf(stderr, "kvtier replay: the plot failed (python3-matplotlib installed?)\n");
      return 1;
    }
    std::printf("  wrote %s\n", png.c_str());
  }
  return run->errors == 0 && run->wrongBlocks == 0 ? 0 : 1;
}

}  // namespace kvtier
