// Fuzz harness: client -> daemon protocol (schemas/kvtier.capnp), delivered in process to
// kvtierd's RPC server: calls through its local client, bytes over one end of a socket pair (the
// server reads the peer's credentials from it as from an accepted connection; nothing is
// listened on or connected to).
//
// Input: its first byte picks the mode.
// - even: a conversation of calls (tests/fuzz/rpc_calls.h) on Daemon, Session, Space, WriteLease
//   and ReadLease, with the capabilities the answers hand out, made on the server's objects
//   without a connection (Server::localClient);
// - odd: raw bytes written to the socket as they are (Cap'n Proto RPC framing included), then the
//   connection is closed: what a broken or hostile client can send;
// - 0xF0 and above (before the two above): a session's fast lane (transport/lane_codec.h). The
//   harness says hello, opens the test layout, commits a 40-token sequence (tokens as the seeds'
//   fillTokens(1)), attaches the session's lane (a second socket pair) and writes the rest of
//   the input to it as it is, then closes the lane and the session.
// One engine and server over one host pool serve every input, as a daemon serves its clients one
// after another (a fresh one every 256 inputs, and for each lane input). After each client is
// gone the daemon must hold no session, lease, pin or write block for it: a leak aborts (a
// finding).
#include <sys/stat.h>
#include <unistd.h>

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/async-unix.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "daemon/server.h"
#include "kernels/rope.h"
#include "schemas/kvtier.capnp.h"
#include "store/engine.h"
#include "store/eviction.h"
#include "tests/fuzz/fuzz_env.h"
#include "tests/fuzz/rpc_calls.h"
#include "transport/host_pool.h"
#include "transport/lane_codec.h"
#include "transport/rpc_codec.h"

namespace kvtier::fuzz {
namespace {

// 8 MiB: a few hundred of the seeds' 16 KiB blocks, small enough that puts meet a full pool.
constexpr uint64_t kPoolBytes = uint64_t{8} << 20;
// Raw mode: bytes written to the socket per input (the daemon's own bound on a message is far
// above; what matters is that it reads, refuses and closes).
constexpr size_t kMaxRawBytes = size_t{1} << 20;

struct Harness {
  Harness() : io(kj::setupAsyncIo()) {
    segmentPrefix = "kvtier-fuzz-" + std::to_string(::getpid()) + "-";
    auto created = HostPool::create(segmentPrefix, kPoolBytes, kPoolBytes);
    if (!created) {
      std::fprintf(stderr, "host pool: %s\n", created.error().message().c_str());
      std::abort();
    }
    pool = std::move(created).value();
    // One extent, "<prefix>0": unlinked at exit (the pool itself is never destroyed).
    removeAtExit("/dev/shm/" + segmentPrefix + "0");
    reset();
  }

  // A fresh engine and server over the pool. Inputs may leave what outlives a session (detached
  // sequences, snapshots) until the pool has nothing left to evict: every kInputsPerEngine
  // inputs the daemon starts over, as after a restart.
  void reset() {
    server.reset();
    engine.reset();
    blocks = std::make_unique<BlockPool>(pool->extents());
    engine =
        std::make_unique<Engine>(*blocks, *pool, makeEvictionPolicy(kDefaultEviction), &rotator);
    server = std::make_unique<Server>(*engine, *pool);
    inputs = 0;
    startOver = false;
  }
  static constexpr uint64_t kInputsPerEngine = 256;
  uint64_t inputs = 0;
  bool startOver = false;  // set by an input that found the pool with nothing left to evict

  // A client's connection: one end of a fresh socket pair, the other served by the server.
  kj::Own<kj::AsyncIoStream> connect() {
    auto pipe = io.provider->newTwoWayPipe();
    server->serve(kj::mv(pipe.ends[1]));
    return kj::mv(pipe.ends[0]);
  }

  kj::AsyncIoContext io;
  std::string segmentPrefix;
  std::unique_ptr<HostPool> pool;
  std::unique_ptr<BlockPool> blocks;
  kernels::CpuKeyRotator rotator;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Server> server;
};

Harness& harness() {
  static Harness* h = new Harness();  // lives until exit: libFuzzer may exit from any input
  return *h;
}

std::vector<Interface> interfaces() {
  return {Interface::of<rpc::Daemon>(), Interface::of<rpc::Session>(), Interface::of<rpc::Space>(),
          Interface::of<rpc::WriteLease>(), Interface::of<rpc::ReadLease>()};
}

// Runs the loop until the engine holds nothing for the gone client; aborts after 10 s.
void expectReleased(Harness& h) {
  Server& server = *h.server;
  Engine& engine = *h.engine;
  for (int i = 0; i < 10000; ++i) {
    const EngineStats s = engine.stats();
    if (server.sessions() == 0 && s.readLeases == 0 && s.writeLeases == 0 && s.blocksPinned == 0)
      return;
    // The hang-up is usually handled by the next turns of the loop: no sleep for it.
    if (i < 4) {
      h.io.waitScope.poll();
    } else {
      h.io.provider->getTimer().afterDelay(1 * kj::MILLISECONDS).wait(h.io.waitScope);
    }
  }
  const EngineStats s = engine.stats();
  std::fprintf(stderr,
               "kvtier fuzz: after the client left: sessions=%llu read_leases=%llu "
               "write_leases=%llu pinned=%llu\n",
               static_cast<unsigned long long>(server.sessions()),
               static_cast<unsigned long long>(s.readLeases),
               static_cast<unsigned long long>(s.writeLeases),
               static_cast<unsigned long long>(s.blocksPinned));
  std::abort();
}

// Calls on the daemon's objects without a connection (Server::localClient): the parameters are
// still the fuzzer's bytes read as a message and copied into each request; only the encoding on
// the wire is left out, which the raw mode covers.
void playCalls(Harness& h, const uint8_t* data, size_t size) {
  CallDriver driver(h.io.waitScope, h.io.provider->getTimer(), h.server->localClient(),
                    interfaces());
  driver.play(data, size);
}

void drainUntilClosed(Harness& h, kj::AsyncIoStream& stream);

void playRaw(Harness& h, kj::AsyncIoStream& stream, const uint8_t* data, size_t size) {
  size = std::min(size, kMaxRawBytes);
  // The daemon may close first (it refuses the bytes): a failed write is an answer too.
  kj::runCatchingExceptions([&] {
    stream.write(data, size).wait(h.io.waitScope);
    stream.shutdownWrite();
  });
  drainUntilClosed(h, stream);
}

// Reads until the daemon closes its side: it answers or closes within the deadline.
void drainUntilClosed(Harness& h, kj::AsyncIoStream& stream) {
  auto& timer = h.io.provider->getTimer();
  const kj::TimePoint deadline = timer.now() + CallDriver::kCallDeadline;
  kj::byte buffer[4096];
  for (;;) {
    size_t n = 0;
    bool timedOut = false;
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] {
                   const kj::Duration left = deadline - timer.now();
                   n = timer.timeoutAfter(left, stream.tryRead(buffer, 1, sizeof buffer))
                           .wait(h.io.waitScope);
                 })) {
      // A reset connection is closed too; only the timer's own exception is a hang.
      timedOut = e->getType() == kj::Exception::Type::OVERLOADED;
    }
    if (timedOut) {
      std::fprintf(stderr, "kvtier fuzz: the daemon kept a half-closed connection open\n");
      std::abort();
    }
    if (n == 0) return;
  }
}

void playLane(Harness& h, kj::AsyncIoStream& stream, const uint8_t* data, size_t size) {
  capnp::TwoPartyClient client(stream);
  auto& ws = h.io.waitScope;
  auto hello = client.bootstrap().castAs<rpc::Daemon>().helloRequest();
  hello.setProtocolVersion(rpc::PROTOCOL_VERSION);
  auto said = hello.send().wait(ws);
  auto session = said.getSession();
  auto token = said.getLaneToken();
  auto open = session.openRequest();
  layoutToRpc(Layout{"test/tiny", 4, 2, 32, DType::kFloat16, 16, {}}, open.initLayout());
  auto space = open.send().wait(ws).getSpace();
  auto put = space.putRequest();
  put.setSeq("s");
  auto tokens = put.initTokens(40);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens.set(i, 7919 + i);
  KJ_IF_MAYBE (e, kj::runCatchingExceptions(
                      [&] { put.send().wait(ws).getLease().commitRequest().send().wait(ws); })) {
    // FULL: what earlier inputs left has nothing left to evict (detached sequences, snapshots).
    // The daemon's answer, not a finding: this input is done, and the engine starts over after.
    (void)e;
    h.startOver = true;
    return;
  }

  auto lane = h.connect();
  lane::Attach attach;
  if (token.size() != sizeof attach.token) std::abort();
  std::memcpy(attach.token, token.begin(), sizeof attach.token);
  lane->write(&attach, sizeof attach).wait(ws);
  uint32_t status = 1;
  if (lane->tryRead(&status, sizeof status, sizeof status).wait(ws) != sizeof status ||
      status != 0) {
    std::fprintf(stderr, "kvtier fuzz: the daemon refused the session's own lane\n");
    std::abort();
  }
  size = std::min(size, kMaxRawBytes);
  kj::runCatchingExceptions([&] {
    lane->write(data, size).wait(ws);
    lane->shutdownWrite();
  });
  drainUntilClosed(h, *lane);
  // The session still answers over Cap'n Proto, whatever the lane was sent.
  session.statsRequest().send().wait(ws);
}

}  // namespace
}  // namespace kvtier::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier;
  using namespace kvtier::fuzz;
  if (size == 0) return 0;
  Harness& h = harness();
  // A lane input starts from a fresh engine: its frames name leases by number, and the seeds'
  // numbers are those of a fresh engine (make_seeds.cc).
  if (++h.inputs > Harness::kInputsPerEngine || h.startOver || data[0] >= 0xF0) h.reset();
  if (data[0] < 0xF0 && data[0] % 2 == 0) {
    playCalls(h, data + 1, size - 1);
  } else {
    auto stream = h.connect();
    if (data[0] >= 0xF0) {
      playLane(h, *stream, data + 1, size - 1);
    } else {
      playRaw(h, *stream, data + 1, size - 1);
    }
  }
  expectReleased(h);
  return 0;
}
