// kvtier-bench --suite cluster: kvtierds on loopback in clusters of two (static peers). A remote
// hit (a lookup on B of a prompt only A holds: the keys' homes asked who holds them, the blocks
// pinned on A, read with UCX into fresh blocks of B, checked with xxh3 and sealed before the
// answer) against ucx_perftest's (ucx-utils) ucp_get bandwidth with the same transports and
// message size; a lookup that misses everywhere against the same lookup kept local, and its extra
// time against a TCP loopback round trip; puts on a member against puts on a daemon in no cluster.
//
// Two pairs run side by side for the whole suite, one whose daemons (and its ucx_perftest) run
// with UCX_TLS=tcp and one with UCX's default transports, so that every repetition measures both
// next to their anchors without restarting a daemon; a fifth daemon, started without --listen,
// takes the lone puts. Each has a 512 MiB pool (256 blocks) and the cold tier off.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <capnp/ez-rpc.h>

#include "bench/harness.h"
#include "schemas/peer.capnp.h"
#include "tools/json_string.h"
#include "tools/synthetic_kv.h"

namespace kvtier::bench {
namespace {

// Blocks of 2 MiB: 32 layers x 8 KV heads x head dim 128 x fp16 = 128 KiB of K and V per token,
// 16 tokens per block. A prompt is 64 blocks (1024 tokens, 128 MiB).
Layout clusterLayout() { return Layout{"bench/2m", 32, 8, 128, DType::kFloat16, 16, {}}; }
constexpr uint32_t kClusterPromptBlocks = 64;
constexpr uint64_t kClusterPromptTokens = 1024;
constexpr const char* kClusterPoolBytes = "512M";
constexpr uint64_t kClusterPoolBlocks = 256;
// Per repetition and pair: kFetchesPerRep remote hits, half before and half after two
// ucx_perftest runs of kPerftestIterations gets of one block's size: the anchor, with up to
// kPerftestOutstanding gets in flight (as a fetch has) on endpoints with peer failure handling
// (as the daemon's are), and for the record one get at a time without it; then kFetchesPerRep
// snapshot restores across nodes of the same size.
constexpr int kFetchesPerRep = 4;
constexpr int kPerftestIterations = 200;
constexpr int kPerftestOutstanding = 64;
constexpr auto kPerftestTimeout = std::chrono::seconds(60);
// Per repetition: kMissesPerRep lookups that miss everywhere in each mode (alternating), a TCP
// ping-pong after each pair; kPutRounds rounds of kPutsPerRound puts on the member, then as many on
// the lone daemon (the order alternating between rounds).
constexpr int kMissesPerRep = 100;
constexpr int kPutRounds = 6;
constexpr int kPutsPerRound = 4;
// Before the first repetition every daemon takes this many fresh prompts, so every block of its
// pool has been written once (no first-touch page faults in a timed window).
constexpr int kPrefaultPrompts = kClusterPoolBlocks / kClusterPromptBlocks + 1;

// The suite's bytes: one prompt's packed KV (put for every prompt: blocks are keyed by their
// tokens, and the daemons do not check the bytes against them) and a reader's buffer.
struct ClusterWorkload {
  ClusterWorkload() {
    const auto packed =
        synthetic::packedKv(layout, tokens(0, kClusterPromptTokens), 0, kClusterPromptTokens);
    std::memcpy(kv.data(), packed.data(), kv.size());
  }
  // Fresh tokens for every seed: no daemon holds a prompt before the bench puts it.
  std::vector<uint32_t> tokens(uint64_t seed, uint64_t count) const {
    return synthetic::tokens(seed, count);
  }
  uint64_t bytesOf(uint64_t tokens) const { return tokens * layout.tokenKvBytes(); }

  Layout layout = clusterLayout();
  HostBuffer kv{kClusterPromptTokens * layout.tokenKvBytes()};
  HostBuffer out{kClusterPromptTokens * layout.tokenKvBytes()};
  uint64_t nextSeed = 1;  // the next fresh prompt
};

// `count` distinct TCP ports free on 127.0.0.1 right now (bound together, then released).
Result<std::vector<uint16_t>> freeLoopbackPorts(size_t count) {
  std::vector<int> fds;
  std::vector<uint16_t> ports;
  Status status;
  for (size_t i = 0; i < count && status; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      status = unavailable("cannot bind a loopback port: ", std::strerror(errno));
    } else {
      ports.push_back(ntohs(addr.sin_port));
    }
    if (fd >= 0) fds.push_back(fd);
  }
  for (const int fd : fds) ::close(fd);
  if (!status) return status.error();
  return ports;
}

// Whether a TCP socket listens on `port` (any address), from /proc/net/tcp and tcp6: the bench
// waits for ucx_perftest's server this way, without a connection that server would take for its
// client's.
bool tcpListening(uint16_t port) {
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      // "  0: 0100007F:3449 00000000:0000 0A ...": local address:port, remote, state (0A: LISTEN)
      char local[64], remote[64];
      unsigned localPort = 0, state = 0;
      if (std::sscanf(line.c_str(), " %*u: %63[0-9A-Fa-f]:%x %63[0-9A-Fa-f]:%*x %x", local,
                      &localPort, remote, &state) == 4 &&
          localPort == port && state == 0x0A) {
        return true;
      }
    }
  }
  return false;
}

// ucx_perftest's ucp_get bandwidth on loopback: its server, then its client reading
// kPerftestIterations messages of `bytes` each (with `outstanding`, up to that many in flight),
// both with UCX_TLS=`tls` (UCX's defaults when unset). Bytes per second: the client's "Final:"
// overall bandwidth, whose MB are 2^20 bytes.
Result<double> runUcxPerftest(const std::string& exe, const TempDir& dir,
                              const std::optional<std::string>& tls, uint64_t bytes,
                              int outstanding = 0, bool errorHandling = false) {
  auto ports = freeLoopbackPorts(1);
  if (!ports) return ports.error();
  const uint16_t port = ports->front();
  const auto env = environmentWith("UCX_TLS", tls);
  const std::string log = dir.file("ucx_perftest.log");
  auto server = ChildProcess::spawn({exe, "-p", std::to_string(port)}, log, false, env);
  if (!server) return server.error();
  const auto deadline = Clock::now() + kStartTimeout;
  while (!tcpListening(port)) {
    if (server->poll())
      return unavailable("ucx_perftest's server exited at startup; its log:\n", lastLines(log));
    if (Clock::now() >= deadline)
      return unavailable("ucx_perftest's server is not listening on port ", port);
    if (gInterrupted) return unavailable("interrupted");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::vector<std::string> argv = {
      exe,  "127.0.0.1",           "-t", "ucp_get",
      "-s", std::to_string(bytes), "-n", std::to_string(kPerftestIterations),
      "-p", std::to_string(port)};
  if (outstanding > 0) {
    argv.push_back("-O");
    argv.push_back(std::to_string(outstanding));
  }
  if (errorHandling) argv.push_back("-e");
  auto client = ChildProcess::spawn(argv, log, true, env);
  if (!client) return client.error();
  auto line = client->waitForLine("Final:", kPerftestTimeout);
  if (!line)
    return unavailable("ucx_perftest: ", line.error().message(), "; its log:\n", lastLines(log));
  if (!client->waitExit(kStopTimeout)) return unavailable("ucx_perftest's client hangs");
  if (const int status = *client->poll(); !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return unavailable("ucx_perftest's client exited with status ", status, "; its log:\n",
                       lastLines(log));
  }
  server->waitExit(kStopTimeout);  // it exits after its one test; its destructor stops it if not
  // "Final: ITERS LAT50 LAT_AVG LAT_OVERALL BW_AVG BW_OVERALL MSGRATE_AVG MSGRATE_OVERALL"
  double iterations = 0, lat50 = 0, latAvg = 0, latAll = 0, bwAvg = 0, bwAll = 0, mrAvg = 0,
         mrAll = 0;
  if (std::sscanf(line->c_str(), "Final: %lf %lf %lf %lf %lf %lf %lf %lf", &iterations, &lat50,
                  &latAvg, &latAll, &bwAvg, &bwAll, &mrAvg, &mrAll) != 8 ||
      bwAll <= 0) {
    return unavailable("cannot parse ucx_perftest's line '", *line, "'");
  }
  return bwAll * 1048576.0;
}

// One kvtierd of the suite: its own directory, the bench's client and its space. Members are
// destroyed in reverse: client first, the daemon stopped, then its directory removed. A thread
// can hold only one caller-thread client: that of the node whose misses are timed (the second
// pair's B) follows --threading; the others run their own thread, whose hop per call is noise
// next to the 128 MiB each of their timed calls moves.
struct ClusterNode {
  std::string name;
  std::string peerAddr;  // HOST:PORT of its peer listener (members only)
  ClientThreading threading = ClientThreading::kOwnThread;
  std::optional<TempDir> dir;
  BenchDaemon daemon;
  std::unique_ptr<Client> client;
  std::unique_ptr<Space> space;
};

Status startNode(ClusterNode& node, const Options& options, const ClusterWorkload& w,
                 std::vector<std::string> clusterFlags, const std::optional<std::string>& ucxTls) {
  auto dir = TempDir::create();
  if (!dir) return dir.error();
  node.dir.emplace(std::move(dir).value());
  std::vector<std::string> flags = {"--host-pool-bytes", kClusterPoolBytes, "--cold-tier", "off"};
  flags.insert(flags.end(), clusterFlags.begin(), clusterFlags.end());
  const std::string socket = node.dir->file("kvtierd.sock");
  if (auto s = node.daemon.start(options.daemon, *node.dir, socket, options.daemonFlags(flags),
                                 environmentWith("UCX_TLS", ucxTls));
      !s) {
    return makeError(s.error().code(), node.name, ": ", s.error().message());
  }
  auto client = startClient(socket, options, node.threading, "kvtier-bench-" + node.name);
  if (!client) return client.error();
  node.client = std::move(client).value();
  auto space = node.client->open(w.layout);
  if (!space) return space.error();
  node.space = std::move(space).value();
  if (!node.client->mapped())
    return unavailable(node.name, ": the client could not map the daemon's pool");
  return {};
}

// Two members that list each other as static peers, their UCX on `ucxTls` (defaults if unset).
struct ClusterPair {
  std::optional<std::string> ucxTls;
  ClusterNode a, b;
  std::string transports() const { return ucxTls ? "UCX_TLS=" + *ucxTls : "UCX defaults"; }
};

Status startPair(ClusterPair& pair, const Options& options, const ClusterWorkload& w) {
  auto ports = freeLoopbackPorts(2);
  if (!ports) return ports.error();
  const std::string tag = pair.ucxTls.value_or("default");
  const std::string addrA = "127.0.0.1:" + std::to_string((*ports)[0]);
  const std::string addrB = "127.0.0.1:" + std::to_string((*ports)[1]);
  pair.a.name = tag + "-a";
  pair.b.name = tag + "-b";
  pair.a.peerAddr = addrA;
  pair.b.peerAddr = addrB;
  if (auto s =
          startNode(pair.a, options, w,
                    {"--listen", addrA, "--peers", addrB, "--node-id", pair.a.name}, pair.ucxTls);
      !s)
    return s;
  if (auto s =
          startNode(pair.b, options, w,
                    {"--listen", addrB, "--peers", addrA, "--node-id", pair.b.name}, pair.ucxTls);
      !s)
    return s;
  for (ClusterNode* node : {&pair.a, &pair.b}) {
    if (auto s = waitForStats(
            *node->client, [](const Stats& st) { return st.clusterMembersUp == 2; },
            node->name + " to see both members up");
        !s)
      return s;
  }
  return {};
}

// Puts `prompts` fresh prompts of `tokens` tokens on `node`, each at position 0 of one sequence
// (replacing the previous prompt's blocks, which stay cached and evictable); returns the seconds
// of the puts alone (the tokens are made before the clock starts).
Result<double> timeFreshPuts(ClusterNode& node, ClusterWorkload& w, int prompts, uint64_t tokens,
                             const char* seq) {
  std::vector<std::vector<uint32_t>> all;
  for (int i = 0; i < prompts; ++i) all.push_back(w.tokens(w.nextSeed++, tokens));
  const uint32_t blocks = static_cast<uint32_t>(tokens / w.layout.blockTokens);
  const auto t0 = Clock::now();
  for (const auto& t : all) {
    auto info = node.space->put(seq, 0, t, w.kv.data(), w.bytesOf(tokens));
    if (!info) return info.error();
    if (info->sealedBlocks != blocks) {
      return makeError(ErrorCode::kInternal, node.name, ": put sealed ", info->sealedBlocks,
                       " blocks, expected ", blocks);
    }
  }
  return secondsSince(t0);
}

// One remote hit: a fresh prompt of `tokens` tokens put on pair.a (untimed) and published (a's
// publish backlog drained: its homes have acknowledged the keys), then looked up on pair.b, which
// holds none of it. Returns the seconds of that lookup alone. `verify`: also compare the bytes b
// hands out with those put.
Result<double> timeRemoteHit(ClusterPair& pair, ClusterWorkload& w, uint64_t tokens, bool verify) {
  const auto prompt = w.tokens(w.nextSeed, tokens);  // the prompt timeFreshPuts puts next
  if (auto put = timeFreshPuts(pair.a, w, 1, tokens, "bench-remote"); !put) return put.error();
  if (auto s = waitForStats(
          *pair.a.client, [](const Stats& st) { return st.publishBacklog == 0; },
          pair.a.name + "'s publish backlog to drain");
      !s)
    return s.error();
  const auto t0 = Clock::now();
  auto hit = pair.b.space->lookup(prompt);  // RemoteMode::kFetch, the default
  const double elapsed = secondsSince(t0);
  if (!hit) return hit.error();
  if (hit->matchedTokens() != tokens) {
    return makeError(ErrorCode::kInternal, pair.b.name, " matched ", hit->matchedTokens(), " of ",
                     tokens, " tokens that ", pair.a.name,
                     " holds (see stats' fetch* counters and both logs)");
  }
  if (verify) {
    if (auto s = hit->copyTo(0, tokens, w.out.data(), w.bytesOf(tokens)); !s) return s.error();
    if (std::memcmp(w.out.data(), w.kv.data(), w.bytesOf(tokens)) != 0)
      return makeError(ErrorCode::kInternal, "fetched bytes differ from the bytes put");
  }
  return elapsed;
}

// One restore across nodes: a fresh prompt put on pair.a and snapshotted there (untimed), then
// restored on pair.b from a's snapshot (the manifest and every block pulled and checked). Returns
// the seconds of the restore alone; both sides are cleaned up after.
Result<double> timeRemoteRestore(ClusterPair& pair, ClusterWorkload& w, uint64_t tokens) {
  if (auto put = timeFreshPuts(pair.a, w, 1, tokens, "bench-snap"); !put) return put.error();
  auto snap = pair.a.space->snapshot("bench-snap", 0);
  if (!snap) return snap.error();
  const auto t0 = Clock::now();
  Status restored = pair.b.space->restore("bench-restored", snap->id, tokens, {}, snap->node);
  const double elapsed = secondsSince(t0);
  if (!restored) return restored.error();
  auto length = pair.b.space->length("bench-restored");
  if (!length || length->value_or(0) != tokens) {
    return makeError(ErrorCode::kInternal, pair.b.name, ": the restored sequence is not whole");
  }
  if (auto s = pair.b.space->remove("bench-restored", 0); !s) return s.error();
  if (auto s = pair.a.space->dropSnapshot(snap->id); !s) return s.error();
  return elapsed;
}

// Seconds of one lookup on `node` of a fresh prompt nobody holds, asking the cluster or not.
Result<double> timeMiss(ClusterNode& node, ClusterWorkload& w, RemoteMode mode) {
  const auto prompt = w.tokens(w.nextSeed++, kClusterPromptTokens);
  LookupOptions o;
  o.remote = mode;
  const auto t0 = Clock::now();
  auto hit = node.space->lookup(prompt, o);
  const double elapsed = secondsSince(t0);
  if (!hit) return hit.error();
  if (hit->matchedTokens() != 0)
    return makeError(ErrorCode::kInternal, "a prompt nobody holds matched ", hit->matchedTokens());
  return elapsed;
}

// One repetition's figures, per pair where there are two (tcp first, then defaults).
struct ClusterRep {
  double fetch[2] = {0, 0};                      // bytes/s of remote hits
  double restore[2] = {0, 0};                    // bytes/s of snapshot restores across nodes
  std::vector<double> fetchSeconds[2];           // each remote hit
  std::optional<double> perftest[2];             // ucx_perftest, bytes/s
  std::optional<double> perftestOutstanding[2];  // one get in flight, no failure handling
  double hitBlocksPerFetch[2] = {0, 0};          // b's remoteHitBlocks delta / fetches
  double missRemote = 0, missLocal = 0;          // median seconds
  double remoteLookupsPerMiss = 0;               // b's remoteLookups delta / kFetch misses
  double tcpRtt = 0;                             // median seconds
  double peerRtt = 0;                  // median Peer.ping round trip to the asker's peer (seconds)
  double heartbeatRtt = 0;             // the asker's own median heartbeat round trip (kvtier stats)
  double putCluster = 0, putLone = 0;  // bytes/s
};

// Median round trip of `n` Peer.ping calls to the daemon listening at `addr`, made as another
// daemon makes them (authenticated over the peer protocol; the suite's daemons listen on loopback
// without a token), one at a time, from a thread of its own (its own event loop).
Result<double> samplePeerPings(const std::string& addr, int n) {
  std::vector<double> out;
  std::string error;
  std::thread t([&] {
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] {
                   capnp::EzRpcClient rpc(addr);
                   auto& ws = rpc.getWaitScope();
                   auto auth = rpc.getMain<rpc::peer::PeerGate>().authenticateRequest();
                   auth.setProtocolVersion(rpc::peer::PEER_PROTOCOL_VERSION);
                   auth.setNodeId("kvtier-bench");
                   auto peer = auth.send().wait(ws).getPeer();
                   for (int i = 0; i < n; ++i) {
                     const auto t0 = Clock::now();
                     peer.pingRequest().send().wait(ws);
                     out.push_back(secondsSince(t0));
                     // As far apart as the misses: the daemon's loop sleeps in between.
                     std::this_thread::sleep_for(std::chrono::microseconds(200));
                   }
                 })) {
      error = e->getDescription().cStr();
    }
  });
  t.join();
  if (!error.empty()) return unavailable("peer pings to ", addr, ": ", error);
  return medianOf(out);
}

Result<ClusterRep> measureClusterRepetition(ClusterPair (&pairs)[2], ClusterNode& lone,
                                            ClusterWorkload& w, EchoPeer& tcpEcho,
                                            const std::optional<std::string>& perftest,
                                            const TempDir& scratch, bool verify) {
  ClusterRep r;
  const double promptBytes = double(w.bytesOf(kClusterPromptTokens));
  for (int p = 0; p < 2; ++p) {
    ClusterPair& pair = pairs[p];
    auto before = pair.b.client->stats();
    if (!before) return before.error();
    double seconds = 0;
    for (int i = 0; i < kFetchesPerRep; ++i) {
      if (gInterrupted) return unavailable("interrupted");
      if (i == kFetchesPerRep / 2 && perftest) {
        // The anchor: gets as the daemon issues them (all of a prompt's blocks in flight at
        // once) on endpoints with peer failure handling, as the daemon's are.
        auto bw = runUcxPerftest(*perftest, scratch, pair.ucxTls, w.layout.blockBytes(),
                                 kPerftestOutstanding, /*errorHandling=*/true);
        if (!bw) return bw.error();
        r.perftest[p] = *bw;
        // For the record: one get at a time, without failure handling (with UCX's defaults on
        // one host that is shared memory, which no failure-handling endpoint gets in UCX 1.13).
        bw = runUcxPerftest(*perftest, scratch, pair.ucxTls, w.layout.blockBytes());
        if (!bw) return bw.error();
        r.perftestOutstanding[p] = *bw;
      }
      auto t = timeRemoteHit(pair, w, kClusterPromptTokens, verify && i == 0);
      if (!t) return t.error();
      seconds += *t;
      r.fetchSeconds[p].push_back(*t);
    }
    auto after = pair.b.client->stats();
    if (!after) return after.error();
    r.fetch[p] = promptBytes * kFetchesPerRep / seconds;
    r.hitBlocksPerFetch[p] =
        double(after->remoteHitBlocks - before->remoteHitBlocks) / kFetchesPerRep;
    double restoreSeconds = 0;
    for (int i = 0; i < kFetchesPerRep; ++i) {
      if (gInterrupted) return unavailable("interrupted");
      auto t = timeRemoteRestore(pair, w, kClusterPromptTokens);
      if (!t) return t.error();
      restoreSeconds += *t;
    }
    r.restore[p] = promptBytes * kFetchesPerRep / restoreSeconds;
  }

  // Misses on the second pair's b (no bytes move: the transports do not matter).
  ClusterNode& asker = pairs[1].b;
  std::vector<double> remote, local, pings;
  auto before = asker.client->stats();
  if (!before) return before.error();
  // A ping-pong after every pair of misses: the machine's state (which core sleeps, what else
  // runs) changes over a repetition, and both figures should see the same states.
  for (int i = 0; i < kMissesPerRep; ++i) {
    if (gInterrupted) return unavailable("interrupted");
    for (const RemoteMode mode : i % 2 ? std::array{RemoteMode::kLocal, RemoteMode::kFetch}
                                       : std::array{RemoteMode::kFetch, RemoteMode::kLocal}) {
      auto t = timeMiss(asker, w, mode);
      if (!t) return t.error();
      (mode == RemoteMode::kFetch ? remote : local).push_back(*t);
    }
    if (auto s = samplePings(tcpEcho, 1, pings); !s) return s.error();
  }
  auto after = asker.client->stats();
  if (!after) return after.error();
  r.missRemote = medianOf(remote);
  r.missLocal = medianOf(local);
  r.remoteLookupsPerMiss = double(after->remoteLookups - before->remoteLookups) / kMissesPerRep;
  r.tcpRtt = medianOf(pings);
  r.heartbeatRtt = after->peerRttMicros * 1e-6;
  // The asker's peer (the home of about half of each miss's keys), pinged as the asker would.
  auto rtt = samplePeerPings(pairs[1].a.peerAddr, kMissesPerRep);
  if (!rtt) return rtt.error();
  r.peerRtt = *rtt;

  // Puts on the first member of the second pair and on the lone daemon. The member's publishing
  // of its last round is waited for before the lone daemon's puts are timed, so it does not land
  // on them.
  ClusterNode& member = pairs[1].a;
  double memberSeconds = 0, loneSeconds = 0;
  for (int round = 0; round < kPutRounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      if (gInterrupted) return unavailable("interrupted");
      const bool onMember = (round + k) % 2 == 0;
      auto t = timeFreshPuts(onMember ? member : lone, w, kPutsPerRound, kClusterPromptTokens,
                             "bench-put");
      if (!t) return t.error();
      (onMember ? memberSeconds : loneSeconds) += *t;
      if (auto s = waitForStats(
              *member.client, [](const Stats& st) { return st.publishBacklog == 0; },
              member.name + "'s publish backlog to drain");
          !s)
        return s.error();
    }
  }
  r.putCluster = promptBytes * kPutRounds * kPutsPerRound / memberSeconds;
  r.putLone = promptBytes * kPutRounds * kPutsPerRound / loneSeconds;
  return r;
}

// Where a remote hit's time goes, from the client's side: the same hit of one block (the fixed
// cost: who-holds, pin, UCX set-up and one get, seal), and what the bench's own core takes to
// hash (xxh3, as the holder does when it pins and the asker when it checks) and to copy the
// prompt's bytes.
Result<Breakdown> measureClusterBreakdown(ClusterPair (&pairs)[2], ClusterWorkload& w,
                                          const std::vector<double> (&fetchSeconds)[2]) {
  Breakdown b;
  for (int p = 0; p < 2; ++p) {
    std::vector<double> one;
    for (int i = 0; i < kBreakdownIterations; ++i) {
      auto t = timeRemoteHit(pairs[p], w, w.layout.blockTokens, false);
      if (!t) return t.error();
      one.push_back(*t);
    }
    b.steps.emplace_back("remote hit 64 blocks, " + pairs[p].transports(),
                         medianOf(fetchSeconds[p]));
    b.steps.emplace_back("remote hit 1 block, " + pairs[p].transports(), medianOf(one));
  }
  std::vector<double> hash, copy;
  uint64_t sink = 0;
  for (int i = 0; i < kBreakdownIterations; ++i) {
    auto t0 = Clock::now();
    for (uint32_t k = 0; k < kClusterPromptBlocks; ++k)
      sink ^= XXH3_64bits(w.kv.data() + k * w.layout.blockBytes(), w.layout.blockBytes());
    hash.push_back(secondsSince(t0));
    t0 = Clock::now();
    std::memcpy(w.out.data(), w.kv.data(), w.kv.size());
    asm volatile("" : : "r"(w.out.data()), "r"(sink) : "memory");
    copy.push_back(secondsSince(t0));
  }
  b.steps.emplace_back("xxh3 of 64 blocks (bench)", medianOf(hash));
  b.steps.emplace_back("memcpy of 64 blocks (bench)", medianOf(copy));
  return b;
}

Status run(const Options& options) {
  auto tcpEcho = EchoPeer::start({}, /*tcp=*/true);  // first: fork while there are no threads
  if (!tcpEcho) return tcpEcho.error();
  auto scratch = TempDir::create();
  if (!scratch) return scratch.error();
  const std::optional<std::string> perftest = findOnPath("ucx_perftest");
  std::string perftestSkipped;
  if (!perftest) {
    perftestSkipped = "ucx_perftest is not on PATH (ucx-utils; scripts/install-deps.sh)";
    std::fprintf(stderr, "kvtier-bench: %s; fetch_vs_ucx_* are null\n", perftestSkipped.c_str());
  }
  const std::optional<std::string> ucxInfo = findOnPath("ucx_info");
  const std::string ucxVersion = ucxInfo ? versionOf({*ucxInfo, "-v"}, "# Version ") : "unknown";
  ClusterWorkload w;
  if (w.layout.blockBytes() != (2u << 20) ||
      w.bytesOf(kClusterPromptTokens) != w.layout.blockBytes() * kClusterPromptBlocks) {
    return makeError(ErrorCode::kInternal, "bad cluster workload size");
  }

  ClusterPair pairs[2];
  pairs[0].ucxTls = "tcp";
  pairs[1].b.threading = options.threading;  // the node whose misses are timed
  ClusterNode lone;
  lone.name = "lone";
  for (ClusterPair& pair : pairs) {
    if (auto s = startPair(pair, options, w); !s) return s;
  }
  if (auto s = startNode(lone, options, w, {}, std::nullopt); !s) return s;
  std::string daemonVersion = lone.client->daemonVersion();
  for (ClusterNode* node : {&pairs[0].a, &pairs[0].b, &pairs[1].a, &pairs[1].b, &lone}) {
    auto s = node->client->stats();
    if (!s) return s.error();
    const bool member = node != &lone;
    if (s->blocksTotal != kClusterPoolBlocks || (s->clusterMembers != 0) != member) {
      return makeError(ErrorCode::kInternal, node->name, ": ", s->blocksTotal,
                       " pool blocks (expected ", kClusterPoolBlocks, "), ", s->clusterMembers,
                       " cluster members");
    }
    if (auto t = timeFreshPuts(*node, w, kPrefaultPrompts, kClusterPromptTokens, "bench-prefault");
        !t)
      return t.error();
    if (auto r = node->space->remove("bench-prefault", 0); !r) return r;
  }

  const auto report = newReport;
  RatioReport fetchTcp = report("fetch_vs_ucx_tcp", "remote hit, UCX_TLS=tcp",
                                "ucx_perftest get 2 MiB -O64 -e, tcp", "bytes/s", true, 0.8);
  RatioReport fetchDefault =
      report("fetch_vs_ucx_default", "remote hit, UCX defaults",
             "ucx_perftest get 2 MiB -O64 -e, defaults", "bytes/s", true, 0.8);
  RatioReport restoreTcp = report("restore_vs_ucx_tcp", "snapshot restore across nodes, tcp",
                                  "ucx_perftest get 2 MiB -O64 -e, tcp", "bytes/s", true, 0.8);
  RatioReport restoreDefault =
      report("restore_vs_ucx_default", "snapshot restore across nodes, defaults",
             "ucx_perftest get 2 MiB -O64 -e, defaults", "bytes/s", true, 0.8);
  RatioReport miss = report("remote_miss_overhead", "miss, remote=fetch", "miss, remote=local", "s",
                            false, std::nullopt);
  RatioReport missRtt = report("remote_miss_extra_vs_peer_rtt", "extra of remote=fetch",
                               "peer round trip (Peer.ping)", "s", false, 2.0);
  RatioReport put = report("put_cluster_vs_local", "put on a member", "put on a lone daemon",
                           "bytes/s", true, 0.95);
  fetchTcp.skipped = fetchDefault.skipped = restoreTcp.skipped = restoreDefault.skipped =
      perftestSkipped;
  NamedSeries checks = {{"remote_hit_blocks_per_fetch_tcp", {}},
                        {"remote_hit_blocks_per_fetch_default", {}},
                        {"remote_hit_ms_tcp", {}},
                        {"remote_hit_ms_default", {}},
                        {"ucx_perftest_MBps_tcp", {}},
                        {"ucx_perftest_MBps_default", {}},
                        {"ucx_perftest_O1_no_errhandling_MBps_tcp", {}},
                        {"ucx_perftest_O1_no_errhandling_MBps_default", {}},
                        {"fetch_vs_ucx_O1_no_errhandling_tcp", {}},
                        {"fetch_vs_ucx_O1_no_errhandling_default", {}},
                        {"miss_remote_fetch_us", {}},
                        {"miss_remote_local_us", {}},
                        {"miss_extra_us", {}},
                        {"tcp_rtt_us", {}},
                        {"miss_extra_vs_tcp_rtt", {}},
                        {"heartbeat_rtt_us", {}},
                        {"remote_lookups_per_fetch_miss", {}}};
  std::vector<double> allFetchSeconds[2];

  for (int rep = 0; rep <= options.reps; ++rep) {
    if (gInterrupted) return unavailable("interrupted");
    const bool warmup = rep == 0;
    const auto t0 = Clock::now();
    auto f = measureClusterRepetition(pairs, lone, w, *tcpEcho, perftest, *scratch, warmup);
    if (!f) return f.error();
    const double nan = std::nan("");
    std::fprintf(stderr,
                 "%s %d: remote hit %s (tcp) vs perftest %s, %s (defaults) vs %s; miss %s vs %s "
                 "local, peer rtt %s, tcp rtt %s; put %s member vs %s lone (%.1f s)\n",
                 warmup ? "warm-up" : "rep", rep, human(f->fetch[0], "bytes/s").c_str(),
                 human(f->perftest[0].value_or(nan), "bytes/s").c_str(),
                 human(f->fetch[1], "bytes/s").c_str(),
                 human(f->perftest[1].value_or(nan), "bytes/s").c_str(),
                 human(f->missRemote, "s").c_str(), human(f->missLocal, "s").c_str(),
                 human(f->peerRtt, "s").c_str(), human(f->tcpRtt, "s").c_str(),
                 human(f->putCluster, "bytes/s").c_str(), human(f->putLone, "bytes/s").c_str(),
                 secondsSince(t0));
    if (warmup) continue;
    RatioReport* fetches[2] = {&fetchTcp, &fetchDefault};
    RatioReport* restores[2] = {&restoreTcp, &restoreDefault};
    for (int p = 0; p < 2; ++p) {
      if (f->perftest[p]) {
        fetches[p]->kvtier.perRep.push_back(f->fetch[p]);
        fetches[p]->anchor.perRep.push_back(*f->perftest[p]);
        restores[p]->kvtier.perRep.push_back(f->restore[p]);
        restores[p]->anchor.perRep.push_back(*f->perftest[p]);
      }
      allFetchSeconds[p].insert(allFetchSeconds[p].end(), f->fetchSeconds[p].begin(),
                                f->fetchSeconds[p].end());
    }
    miss.kvtier.perRep.push_back(f->missRemote);
    miss.anchor.perRep.push_back(f->missLocal);
    missRtt.kvtier.perRep.push_back(f->missRemote - f->missLocal);
    missRtt.anchor.perRep.push_back(f->peerRtt);
    put.kvtier.perRep.push_back(f->putCluster);
    put.anchor.perRep.push_back(f->putLone);
    const double values[] = {f->hitBlocksPerFetch[0],
                             f->hitBlocksPerFetch[1],
                             medianOf(f->fetchSeconds[0]) * 1e3,
                             medianOf(f->fetchSeconds[1]) * 1e3,
                             f->perftest[0].value_or(nan) / 1048576.0,
                             f->perftest[1].value_or(nan) / 1048576.0,
                             f->perftestOutstanding[0].value_or(nan) / 1048576.0,
                             f->perftestOutstanding[1].value_or(nan) / 1048576.0,
                             f->fetch[0] / f->perftestOutstanding[0].value_or(nan),
                             f->fetch[1] / f->perftestOutstanding[1].value_or(nan),
                             f->missRemote * 1e6,
                             f->missLocal * 1e6,
                             (f->missRemote - f->missLocal) * 1e6,
                             f->tcpRtt * 1e6,
                             (f->missRemote - f->missLocal) / f->tcpRtt,
                             f->heartbeatRtt * 1e6,
                             f->remoteLookupsPerMiss};
    for (size_t i = 0; i < checks.size(); ++i) checks[i].second.push_back(values[i]);
  }
  auto breakdown = measureClusterBreakdown(pairs, w, allFetchSeconds);
  if (!breakdown) return breakdown.error();

  const std::vector<RatioReport> reports = {fetchTcp, fetchDefault, restoreTcp, restoreDefault,
                                            miss,     missRtt,      put};
  printTable("cluster", reports, options.reps);
  std::printf(
      "\nsetup: two 2-node clusters on loopback (static peers; one with UCX_TLS=tcp, one with "
      "UCX's "
      "defaults)\nand a lone daemon, %s pools of %llu blocks of %llu KiB, cold tier off. Per "
      "repetition and\ncluster, %d remote hits of a fresh %u-block prompt put on A beforehand "
      "(lookup on B, timed to its\nanswer) around one ucx_perftest ucp_get run (%d x %llu bytes, "
      "same UCX_TLS); %d misses each way\non B of fresh %u-block prompts, as many TCP loopback "
      "ping-pongs; %d puts of fresh %u-block\nprompts on a member and as many on the lone daemon. "
      "UCX %s.\n",
      kClusterPoolBytes, static_cast<unsigned long long>(kClusterPoolBlocks),
      static_cast<unsigned long long>(w.layout.blockBytes() >> 10), kFetchesPerRep,
      kClusterPromptBlocks, kPerftestIterations,
      static_cast<unsigned long long>(w.layout.blockBytes()), kMissesPerRep, kClusterPromptBlocks,
      kPutRounds * kPutsPerRound, kClusterPromptBlocks, ucxVersion.c_str());
  std::printf("\nchecks (median [min-max] per repetition):\n");
  printChecks(checks, 36);
  printBreakdown(*breakdown);

  if (!options.json.empty()) {
    RunInfo info =
        runInfoOf("cluster", options,
                  {{"kvtierd", jsonString(daemonVersion)}, {"ucx", jsonString(ucxVersion)}});
    std::ostringstream setup;
    setup << "\"setup\": {\"block_bytes\": " << w.layout.blockBytes()
          << ", \"prompt_blocks\": " << kClusterPromptBlocks
          << ", \"pool_blocks\": " << kClusterPoolBlocks
          << ", \"fetches_per_rep\": " << kFetchesPerRep
          << ", \"misses_per_rep\": " << kMissesPerRep
          << ", \"puts_per_rep\": " << kPutRounds * kPutsPerRound << ", \"daemon_flags\": "
          << jsonString(std::string("--host-pool-bytes ") + kClusterPoolBytes +
                        " --cold-tier off --listen 127.0.0.1:P --peers 127.0.0.1:Q --node-id ID "
                        "(lone: no cluster flags); env UCX_TLS=tcp or unset")
          << ",\n    \"ucx_perftest\": "
          << jsonString(
                 "server: ucx_perftest -p PORT; client: ucx_perftest 127.0.0.1 -t ucp_get "
                 "-s " +
                 std::to_string(w.layout.blockBytes()) + " -n " +
                 std::to_string(kPerftestIterations) + " -p PORT -O " +
                 std::to_string(kPerftestOutstanding) +
                 " -e (as many gets in flight as a fetch has, endpoints with peer failure "
                 "handling like the daemon's); the Final line's overall bandwidth (MB = 2^20 "
                 "bytes); the O1_no_errhandling checks drop -O and -e")
          << ",\n    \"remote_hit\": "
          << jsonString(
                 "bytes of a fresh 64-block prompt / seconds of one lookup on B (remote = "
                 "fetch) of a prompt A put and published beforehand, untimed")
          << ",\n    \"miss\": "
          << jsonString(
                 "median seconds of a lookup on B of a fresh 64-block prompt nobody "
                 "holds, remote = fetch vs remote = local, alternating")
          << ",\n    \"put\": "
          << jsonString(
                 "bytes / seconds of puts of fresh 64-block prompts at position 0 of one "
                 "sequence; rounds alternate member and lone; the member's publish backlog "
                 "drained between")
          << ",\n    \"client_threading\": "
          << jsonString(
                 "as above for the node whose misses are timed (the default pair's B); the "
                 "other clients run their own thread")
          << "}";
    info.extra.push_back(setup.str());
    info.extra.push_back(jsonSeriesMember("checks", checks));
    return writeReport(options, reports, *breakdown, info);
  }
  return {};
}

}  // namespace

extern const Suite kClusterSuite{
    "cluster",
    "  --suite cluster the cluster suite: remote hits between two daemons on loopback vs\n"
    "                  ucx_perftest ucp_get (UCX_TLS=tcp and UCX's defaults), a lookup missing\n"
    "                  everywhere vs a local miss, puts on a member vs on a lone daemon\n",
    run};

}  // namespace kvtier::bench
