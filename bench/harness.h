// kvtier-bench's shared harness: what every suite needs to start the servers it measures, time
// them against their anchors and report the ratios. A suite (bench/suite_*.cc) is one function
// from the Options to a Status, listed in bench/main.cc.
//
// Conventions every suite follows (../shared/BENCH.md): one warm-up repetition, then
// Options::reps measured ones; a kvtier figure and its anchor are measured side by side in every
// repetition, their ratio computed per repetition and reported as median [min-max] in a table
// (printTable) and, with --json, as JSON (writeReport). Everything a suite starts (daemons,
// servers, child processes, temporary directories) is an RAII object in the suite's scope, so an
// early return or an exception stops and removes it. A suite checks gInterrupted between rounds.
//
// Not thread-safe unless said: a suite runs on the main thread and owns what it creates.
#pragma once

#include <hiredis/hiredis.h>
#include <sys/types.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvtier/client.h"

namespace kvtier::bench {

using Clock = std::chrono::steady_clock;

// How long a child server may take to say it is ready, and to exit after SIGTERM.
inline constexpr auto kStartTimeout = std::chrono::seconds(15);
inline constexpr auto kStopTimeout = std::chrono::seconds(5);
// Iterations of the per-step breakdown printed after the ratios (it is not part of any ratio).
inline constexpr int kBreakdownIterations = 16;
// The message of one ping-pong round trip (the anchor for one control-plane call).
inline constexpr size_t kPingBytes = 64;
// waitForStats: how long it waits at most, and how often it asks.
inline constexpr auto kStatsWaitTimeout = std::chrono::seconds(60);
inline constexpr auto kStatsPollInterval = std::chrono::microseconds(500);

// Set by SIGINT and SIGTERM (main installs the handler). A suite stops at its next round and
// cleans up (daemons, servers, temporary directories) instead of leaving its servers running. A
// global because a signal handler needs one.
extern volatile std::sig_atomic_t gInterrupted;

double seconds(Clock::time_point t0, Clock::time_point t1);
double secondsSince(Clock::time_point t0);

Error unavailable(auto&&... args) { return makeError(ErrorCode::kUnavailable, args...); }

// The last `maxBytes` of a file (a child's log), for error messages.
std::string lastLines(const std::string& path, size_t maxBytes = 2000);

// The local, cold and GPU suites' shapes. 8 layers x 8 KV heads x head dim 64 x fp16 = 1 KiB per
// token and layer, so 16 KiB of K and V per token and 256 KiB per 16-token block.
Layout benchLayout();

// ---------------------------------------------------------------------------------------------
// Processes and directories the bench owns.

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  static Result<TempDir> create();
  TempDir(TempDir&& o) noexcept : path_(std::exchange(o.path_, {})) {}
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(std::string_view name) const { return path_ + "/" + std::string(name); }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// This process's environment with `name` removed, then set to `value` when there is one.
std::vector<std::string> environmentWith(std::string_view name,
                                         const std::optional<std::string>& value);

// A child process started with posix_spawn: stdin from /dev/null, stdout into a pipe this process
// reads (or into the log), stderr appended to a log file; the bench's environment, or `env`.
// Destruction sends SIGTERM and reaps it (SIGKILL after kStopTimeout), so a failing bench never
// leaves a server behind.
class ChildProcess {
 public:
  static Result<ChildProcess> spawn(const std::vector<std::string>& argv,
                                    const std::string& logPath, bool pipeStdout,
                                    const std::optional<std::vector<std::string>>& env = {});

  ChildProcess(ChildProcess&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)),
        stdout_(std::exchange(o.stdout_, -1)),
        log_(std::move(o.log_)) {}
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  const std::string& logPath() const { return log_; }
  pid_t pid() const { return pid_; }

  // Reads the child's stdout until a line starting with `prefix`; returns that line. UNAVAILABLE
  // if the child closes its stdout (exits) first or `timeout` passes.
  Result<std::string> waitForLine(std::string_view prefix, std::chrono::milliseconds timeout);

  // Exit status once the child has exited (reaping it), nullopt while it runs.
  std::optional<int> poll();

  // Waits up to `timeout` for the child to exit on its own (after a shutdown request).
  bool waitExit(std::chrono::milliseconds timeout);

  // SIGTERM, then reap; SIGKILL if it has not exited within `timeout`. Idempotent.
  void stop(std::chrono::milliseconds timeout = kStopTimeout);

 private:
  ChildProcess(pid_t pid, int stdoutFd, std::string log)
      : pid_(pid), stdout_(stdoutFd), log_(std::move(log)) {}
  pid_t pid_;
  int stdout_;
  std::string log_;
  std::optional<int> exitStatus_;
};

// Removes the shared-memory segments of a daemon that could not remove them itself (killed,
// crashed): no later kvtierd reuses this run's temporary data directory, so nothing else would
// ever free them. Declare it before the daemon's ChildProcess, so it runs once the daemon is gone.
class SegmentSweeper {
 public:
  SegmentSweeper() = default;
  SegmentSweeper(const SegmentSweeper&) = delete;
  SegmentSweeper& operator=(const SegmentSweeper&) = delete;
  ~SegmentSweeper();

  // Takes the prefix from kvtierd's ready line ("... segments=kvtier-<digest>-"); a line without
  // one leaves nothing to sweep.
  void watchReadyLine(std::string_view line);

 private:
  std::string prefix_;
};

// A kvtierd the bench started in its temporary directory: stopped (SIGTERM, then reaped) on
// destruction, and its shared-memory segments swept once it is gone.
class BenchDaemon {
 public:
  // Starts `exe` on `dir` and `socket` with `flags` (and `env`, or the bench's environment) and
  // waits for its ready line; its log is dir/kvtierd.log.
  Status start(const std::string& exe, const TempDir& dir, const std::string& socket,
               const std::vector<std::string>& flags,
               const std::optional<std::vector<std::string>>& env = {},
               std::chrono::milliseconds timeout = kStartTimeout);
  // SIGTERM and reap (ChildProcess::stop, SIGKILL after `timeout`); start may be called again.
  void stop(std::chrono::milliseconds timeout = kStopTimeout) {
    if (process_) process_->stop(timeout);
    process_.reset();
  }
  // The daemon's pid, -1 when it is not running.
  pid_t pid() const { return process_ ? process_->pid() : -1; }

 private:
  SegmentSweeper sweeper_;  // declared first: destroyed after the process is stopped
  std::optional<ChildProcess> process_;
};

// The anchor for one control-plane round trip: a forked child that echoes whatever arrives on its
// end of a socketpair(AF_UNIX, SOCK_STREAM), or with `tcp` of a TCP connection over loopback
// (TCP_NODELAY, as peers talk). Start it before any thread exists (fork). With a `busyPoll`
// window, both ends poll that long for the next message before they block, the policy kvtierd and
// the SDK follow (transport/busy_poll.h): the floor for a polling round trip.
class EchoPeer {
 public:
  static Result<EchoPeer> start(std::chrono::microseconds busyPoll = {}, bool tcp = false);
  EchoPeer(EchoPeer&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)), fd_(std::exchange(o.fd_, -1)), busyPoll_(o.busyPoll_) {}
  EchoPeer(const EchoPeer&) = delete;
  EchoPeer& operator=(const EchoPeer&) = delete;
  ~EchoPeer();

  std::chrono::microseconds busyPoll() const { return busyPoll_; }

  // One round trip of `bytes` bytes from `buf`; false if the peer is gone.
  bool pingPong(uint8_t* buf, size_t bytes);

 private:
  EchoPeer(pid_t pid, int fd, std::chrono::microseconds busyPoll)
      : pid_(pid), fd_(fd), busyPoll_(busyPoll) {}

  pid_t pid_;
  int fd_;
  std::chrono::microseconds busyPoll_;
};

struct RedisFree {
  void operator()(redisContext* c) const { redisFree(c); }
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using RedisContextPtr = std::unique_ptr<redisContext, RedisFree>;
using RedisReplyPtr = std::unique_ptr<redisReply, RedisFree>;

// Debian's redis-server on a Unix socket in the bench's directory, nothing persisted, and one
// hiredis connection to it. Destruction asks it to SHUTDOWN NOSAVE, then SIGTERM as a fallback.
class RedisServer {
 public:
  static Result<std::unique_ptr<RedisServer>> start(const std::string& exe, const TempDir& dir);
  ~RedisServer();

  redisContext* context() { return context_.get(); }
  const std::string& version() const { return version_; }

 private:
  explicit RedisServer(ChildProcess child) : child_(std::move(child)) {}
  ChildProcess child_;
  RedisContextPtr context_;
  std::string version_ = "unknown";
};

// The first executable `name` in $PATH.
std::optional<std::string> findOnPath(const std::string& name);

// The rest of the first line `argv` prints that starts with `prefix`, or "unknown".
std::string versionOf(const std::vector<std::string>& argv, std::string_view prefix);

// ---------------------------------------------------------------------------------------------
// Measuring.

// A page-aligned host buffer, written in full at construction so no page fault lands in a timed
// window. Page-aligned like the pinned buffers engines hand kvtier, and so that every copy in the
// suite has mutually aligned source and destination: with glibc 2.36 on AMD EPYC, memcpy of
// 16-256 KiB runs (rep movsb) is ~2x slower when destination and source differ by 16 bytes mod
// 64, which would otherwise let malloc's placement decide the figures.
class HostBuffer {
 public:
  explicit HostBuffer(size_t bytes);
  uint8_t* data() const { return data_.get(); }
  size_t size() const { return bytes_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  size_t bytes_;
  std::unique_ptr<uint8_t, Free> data_;
};

// Evicts what a timed call's data may have left in the CPU caches, so that a call and its anchor
// both start from memory, not one from a buffer another step just wrote: reads a buffer of twice
// the last-level cache (sysconf; at least 64 MiB), written once at construction.
class CacheFlusher {
 public:
  CacheFlusher();
  void flush();

 private:
  HostBuffer buffer_;
};

// INTERNAL unless `hit` matched exactly `tokens` tokens.
Status expectMatched(const ReadHandle& hit, uint64_t tokens);

// Appends the seconds of `iterations` ping-pongs of kPingBytes with `echo` to `out`.
Status samplePings(EchoPeer& echo, int iterations, std::vector<double>& out);

// Polls `client`'s counters until `done` holds, up to kStatsWaitTimeout.
Status waitForStats(Client& client, const std::function<bool(const Stats&)>& done,
                    const std::string& what);

// The median of `v` (NaN if empty); the mean of the two middle values for an even count.
double medianOf(std::vector<double> v);

struct Spread {
  double median = std::nan(""), min = std::nan(""), max = std::nan("");
};
Spread spreadOf(const std::vector<double>& v);

// Nearest-rank percentile `p` (0-1) of `v` (NaN if empty).
double percentile(std::vector<double> v, double p);

// ---------------------------------------------------------------------------------------------
// Reporting.

struct Figure {
  std::string what;
  std::string unit;  // "bytes/s", "blocks/s", "tokens/s", "count", "1/s" (one over a time) or "s"
  std::vector<double> perRep;
};

// One ratio of a suite: a kvtier figure over its anchor, per repetition.
struct RatioReport {
  std::string name;  // its JSON name in "ratios", stable across runs
  Figure kvtier, anchor;
  bool higherIsBetter = true;    // ratio >= target passes; else ratio <= target passes
  std::optional<double> target;  // none: reported, not judged
  std::string skipped;           // why it was not measured; empty if it was

  std::vector<double> ratios() const;
  bool measured() const { return skipped.empty() && !kvtier.perRep.empty(); }
  bool pass() const;
};

// An empty report of one ratio: what kvtier and its anchor measure, and the target.
RatioReport newReport(std::string name, std::string kvtierWhat, std::string anchorWhat,
                      std::string unit, bool higherIsBetter, std::optional<double> target);

// `value` in `unit` for a person: "12.34 GB/s", "1234 blocks/s", "12.3 us", "-" for NaN.
std::string human(double value, const std::string& unit);

// The suite's ratio table on stdout.
void printTable(const std::string& suite, const std::vector<RatioReport>& reports, int reps);

// Where the time goes: named steps, not part of any ratio.
struct Breakdown {
  std::vector<std::pair<std::string, double>> steps;  // name, median seconds
};
void printBreakdown(const Breakdown& b);

// Named per-repetition values that are not ratios (a suite's checks, its phases).
using NamedSeries = std::vector<std::pair<std::string, std::vector<double>>>;

// "  NAME VALUE  [MIN-MAX]" per series on stdout, names padded to `nameWidth`.
void printChecks(const NamedSeries& series, int nameWidth);

std::string jsonNumber(double v);
std::string jsonArray(const std::vector<double>& v);
// {"median", "min", "max", "per_rep"} of `v`.
std::string jsonSpreadOf(const std::vector<double>& v);
// The top-level JSON member `"name": {"series": spread, ...}`, one series a line.
std::string jsonSeriesMember(const std::string& name, const NamedSeries& series);

struct Options;

// What a suite's JSON says about the run besides its ratios.
struct RunInfo {
  std::string suite;
  int reps = 0;
  std::string threading;
  // Name and JSON value of each program measured, kvtierd first.
  std::vector<std::pair<std::string, std::string>> versions;
  // More top-level members, already JSON ("\"name\": value" each), after the breakdown.
  std::vector<std::string> extra;
  std::optional<uint32_t> busyPollMicros;  // --busy-poll-us; unset: the programs' defaults
};

// The RunInfo of `suite` run with `options`, measuring `versions`.
RunInfo runInfoOf(std::string suite, const Options& options,
                  std::vector<std::pair<std::string, std::string>> versions);

std::string toJson(const std::vector<RatioReport>& reports, const Breakdown& breakdown,
                   const RunInfo& info);

// Writes toJson(...) to options.json (creating its directory) and says so on stdout; does nothing
// without --json.
Status writeReport(const Options& options, const std::vector<RatioReport>& reports,
                   const Breakdown& breakdown, const RunInfo& info);

// ---------------------------------------------------------------------------------------------
// Options and clients.

struct Options {
  std::string suite = "local";
  std::string json;
  int reps = 7;
  std::string daemon = KVTIER_DAEMON_PATH;
  // The SDK's caller-thread mode is what a serving engine's scheduler thread uses; "own" measures
  // the default mode, whose calls hop to the client's event-loop thread and back.
  ClientThreading threading = ClientThreading::kCallerThread;
  // Busy polling of the daemon (--busy-poll-us) and of the bench's clients; unset: their defaults.
  std::optional<uint32_t> busyPollMicros;
  std::string hotSamples;  // --hot-samples: the cold suite's hot lookups, one line each

  // The daemon's flags: the suite's own, then --busy-poll-us when set.
  std::vector<std::string> daemonFlags(std::vector<std::string> flags) const;
};

// A client of the daemon on `socket` in mode `threading`, polling as --busy-poll-us says.
Result<std::unique_ptr<Client>> startClient(const std::string& socket, const Options& options,
                                            ClientThreading threading,
                                            const std::string& name = "kvtier-bench");

const char* threadingName(ClientThreading t);

// ---------------------------------------------------------------------------------------------
// Suites.

// One suite of kvtier-bench: a bench/suite_NAME.cc defines its `extern const Suite kNameSuite`,
// and bench/main.cc lists it.
struct Suite {
  std::string_view name;  // what --suite takes
  std::string_view help;  // its lines of --help, each ending in a newline
  // Runs every repetition and reports. The exit status is 0 whenever the measurements ran,
  // targets met or not: this is a measurement, not a test.
  Status (*run)(const Options& options);
};

}  // namespace kvtier::bench
