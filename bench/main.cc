// kvtier-bench: kvtier's local data and control paths, its cold tier, its cluster and its GPU
// paths, each quoted as a ratio against an anchor measured in the same run on the same machine
// (absolute times on small shared machines are noise).
//
//   kvtier-bench --suite local --json bench/results/local.json [--reps N] [--daemon PATH]
//   kvtier-bench --suite cold --json bench/results/cold.json [--reps N] [--daemon PATH]
//   kvtier-bench --suite cluster --json bench/results/cluster.json [--reps N] [--daemon PATH]
//   kvtier-bench --suite scale --json bench/results/scale.json [--reps N] [--daemon PATH]
//   kvtier-bench --suite scale-cluster --json bench/results/scale-cluster.json
//   kvtier-bench --suite policy --json bench/results/policy.json [--reps N]
//
// This file parses the arguments and runs the suite asked for. Each suite is a bench/suite_NAME.cc
// (what it starts, measures and reports is described there) over the shared harness
// (bench/harness.h). After one warm-up repetition, every repetition measures each kvtier figure
// next to its anchor; a ratio is computed per repetition and reported as the median and min-max
// over repetitions, in a table and as JSON. The exit status is 0 whenever the measurements ran,
// targets met or not: this is a measurement, not a test.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "bench/harness.h"
#include "transport/busy_poll.h"

namespace kvtier::bench {

// The suites, in the order --help lists them. A new suite: its bench/suite_NAME.cc, and its name
// in these two lines and in bench/CMakeLists.txt.
extern const Suite kLocalSuite, kColdSuite, kGpuSuite, kClusterSuite, kScaleSuite,
    kScaleClusterSuite, kPolicySuite, kLlamaSuite;
const Suite* const kSuites[] = {&kLocalSuite, &kColdSuite,         &kGpuSuite,    &kClusterSuite,
                                &kScaleSuite, &kScaleClusterSuite, &kPolicySuite,
#ifdef KVTIER_BENCH_LLAMA  // built with llama.cpp (integrations/llama/)
                                &kLlamaSuite
#endif
};

namespace {

extern "C" void onInterrupt(int) { gInterrupted = 1; }

const Suite* findSuite(std::string_view name) {
  for (const Suite* suite : kSuites) {
    if (suite->name == name) return suite;
  }
  return nullptr;
}

std::string usage() {
  std::string names, suites;
  for (const Suite* suite : kSuites) {
    names += (names.empty() ? "" : "|") + std::string(suite->name);
    suites += suite->help;
  }
  return "usage: kvtier-bench --suite " + names + " [--json FILE] [--reps N] [--daemon PATH]\n" +
         suites +
         "  --json FILE     also write the figures as JSON (e.g. bench/results/local.json)\n"
         "  --reps N        measured repetitions after one warm-up (default 7)\n"
         "  --daemon PATH   the kvtierd to start (default: the one built with this binary)\n"
         "  --threading M   SDK mode: caller (default; no thread hop per call) or own\n"
         "  --busy-poll-us N  busy polling of kvtierd and the bench's clients (default: theirs, "
         "50)\n"
         "  --hot-samples FILE  cold suite: also write every measured hot lookup as a line\n"
         "                  'REP idle|spilling START_S LATENCY_US' (START_S: CLOCK_MONOTONIC, the\n"
         "                  clock of 'perf record -k CLOCK_MONOTONIC', to line traces up)\n";
}

Result<Options> parseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> Result<std::string> {
      if (i + 1 >= argc) return makeError(ErrorCode::kInvalidArgument, a, " needs a value");
      return std::string(argv[++i]);
    };
    if (a == "-h" || a == "--help") {
      std::fputs(usage().c_str(), stdout);
      std::exit(0);
    } else if (a == "--suite" || a == "--json" || a == "--reps" || a == "--daemon" ||
               a == "--threading" || a == "--busy-poll-us" || a == "--hot-samples") {
      auto v = value();
      if (!v) return v.error();
      // A whole number from lo to hi, or a typed error naming the flag.
      auto number = [&](long lo, long hi) -> Result<long> {
        char* end = nullptr;
        const long n = std::strtol(v->c_str(), &end, 10);
        if (end == v->c_str() || *end != '\0' || n < lo || n > hi) {
          return makeError(ErrorCode::kInvalidArgument, a, " wants a number from ", lo, " to ", hi,
                           ", not '", *v, "'");
        }
        return n;
      };
      if (a == "--busy-poll-us") {
        auto us = number(0, kMaxBusyPoll.count());
        if (!us) return us.error();
        o.busyPollMicros = static_cast<uint32_t>(*us);
      } else if (a == "--threading") {
        if (*v != "caller" && *v != "own") {
          return makeError(ErrorCode::kInvalidArgument, "--threading is caller or own, not '", *v,
                           "'");
        }
        o.threading = *v == "own" ? ClientThreading::kOwnThread : ClientThreading::kCallerThread;
      } else if (a == "--suite") {
        o.suite = *v;
      } else if (a == "--json") {
        o.json = *v;
      } else if (a == "--hot-samples") {
        o.hotSamples = *v;
      } else if (a == "--daemon") {
        o.daemon = *v;
      } else {
        auto reps = number(1, 1000);
        if (!reps) return reps.error();
        o.reps = static_cast<int>(*reps);
      }
    } else {
      return makeError(ErrorCode::kInvalidArgument, "unknown argument '", a, "'");
    }
  }
  if (findSuite(o.suite) == nullptr)
    return makeError(ErrorCode::kInvalidArgument, "unknown suite '", o.suite, "'");
  return o;
}

int benchMain(int argc, char** argv) {
  // A server that dies mid-write must show up as an error, not kill the bench.
  ::signal(SIGPIPE, SIG_IGN);
  struct sigaction interrupt {};
  interrupt.sa_handler = onInterrupt;
  interrupt.sa_flags = SA_RESTART;
  sigemptyset(&interrupt.sa_mask);
  ::sigaction(SIGINT, &interrupt, nullptr);
  ::sigaction(SIGTERM, &interrupt, nullptr);
  auto options = parseArgs(argc, argv);
  if (!options) {
    std::fprintf(stderr, "kvtier-bench: %s\n%s", options.error().message().c_str(),
                 usage().c_str());
    return 2;
  }
  if (options->reps < 5) std::fprintf(stderr, "kvtier-bench: note: fewer than 5 repetitions\n");
  // Caught (not left to std::terminate) so that the stack unwinds and every server a suite
  // started is stopped and its directory removed.
  auto status = [&]() -> Status {
    try {
      return findSuite(options->suite)->run(*options);
    } catch (const std::exception& e) {
      return makeError(ErrorCode::kInternal, "exception: ", e.what());
    }
  }();
  if (!status) {
    std::fprintf(stderr, "kvtier-bench: %s\n", status.error().toString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::bench

int main(int argc, char** argv) { return kvtier::bench::benchMain(argc, argv); }
