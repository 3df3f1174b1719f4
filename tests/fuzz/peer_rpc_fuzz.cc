// Fuzz harness: daemon <-> daemon protocol (schemas/peer.capnp), delivered in process to the peer
// service of a ClusterService (a one-member static cluster) over one end of a socket pair, which
// it serves as it serves each connection its listener accepts.
//
// Input: a conversation of calls (tests/fuzz/rpc_calls.h) on PeerGate, Peer and PinLease. The
// bootstrap capability is the PeerGate, so calls before a successful authenticate meet the gate
// and nothing else; the seeds authenticate with kFuzzToken first and then call the Peer it hands
// out. The node holds the blocks of peer_fuzz_world.h, so pins find something. After each
// connection is gone the node must hold no pin for it: a leak aborts (a finding).
#include <unistd.h>

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/async-unix.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "daemon/cluster/cluster.h"
#include "kernels/rope.h"
#include "schemas/peer.capnp.h"
#include "store/engine.h"
#include "store/eviction.h"
#include "tests/fuzz/fuzz_env.h"
#include "tests/fuzz/peer_fuzz_world.h"
#include "tests/fuzz/rpc_calls.h"
#include "transport/host_pool.h"

namespace kvtier::fuzz {
namespace {

constexpr uint64_t kPoolBytes = uint64_t{8} << 20;

struct Harness {
  Harness() : io(kj::setupAsyncIo()) {
    segmentPrefix = "kvtier-fuzz-peer-" + std::to_string(::getpid()) + "-";
    auto created = HostPool::create(segmentPrefix, kPoolBytes, kPoolBytes);
    if (!created) {
      std::fprintf(stderr, "host pool: %s\n", created.error().message().c_str());
      std::abort();
    }
    pool = std::move(created).value();
    removeAtExit("/dev/shm/" + segmentPrefix + "0");
    blocks = std::make_unique<BlockPool>(pool->extents());
    engine =
        std::make_unique<Engine>(*blocks, *pool, makeEvictionPolicy(kDefaultEviction), &rotator);
    fillWorld();
    ClusterOptions options;
    options.nodeId = "fuzz-node";
    options.listen = "127.0.0.1:0";
    options.token = kFuzzToken;
    options.peerTimeout = 1 * kj::SECONDS;
    options.pinLease = 1 * kj::SECONDS;
    cluster = std::make_unique<ClusterService>(*engine, *pool, nullptr, nullptr, io, options);
    if (auto s = cluster->start(); !s) {
      std::fprintf(stderr, "cluster: %s\n", s.error().message().c_str());
      std::abort();
    }
  }

  // The namespace of peer_fuzz_world.h with its blocks committed (a detached sequence), so that
  // pins and lookups find something.
  void fillWorld() {
    auto space = engine->openSpace(worldLayout(), worldSalt());
    if (!space) std::abort();
    const uint32_t blockTokens = worldLayout().blockTokens;
    std::vector<uint32_t> tokens(kWorldBlocks * blockTokens);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i);
    std::vector<Key128> keys;
    for (uint32_t b = 0; b < kWorldBlocks; ++b) keys.push_back(worldKey(b));
    auto grant = engine->put(1, *space, "world", 0, tokens, keys, SeqOptions{.detached = true});
    if (!grant || !engine->commit(grant->lease, kEnd)) std::abort();
  }

  kj::AsyncIoContext io;
  std::string segmentPrefix;
  std::unique_ptr<HostPool> pool;
  std::unique_ptr<BlockPool> blocks;
  kernels::CpuKeyRotator rotator;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<ClusterService> cluster;
};

Harness& harness() {
  static Harness* h = new Harness();  // lives until exit: libFuzzer may exit from any input
  return *h;
}

// Runs the loop until no block is pinned for a gone peer; aborts after 10 s.
void expectReleased(Harness& h) {
  for (int i = 0; i < 10000; ++i) {
    if (h.engine->stats().blocksPinned == 0) return;
    // The hang-up is usually handled by the next turns of the loop: no sleep for it.
    if (i < 4) {
      h.io.waitScope.poll();
    } else {
      h.io.provider->getTimer().afterDelay(1 * kj::MILLISECONDS).wait(h.io.waitScope);
    }
  }
  std::fprintf(stderr, "kvtier fuzz: %llu blocks still pinned after the peer left\n",
               static_cast<unsigned long long>(h.engine->stats().blocksPinned));
  std::abort();
}

}  // namespace
}  // namespace kvtier::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier;
  using namespace kvtier::fuzz;
  Harness& h = harness();
  {
    auto pipe = h.io.provider->newTwoWayPipe();
    h.cluster->servePeer(kj::mv(pipe.ends[1]));
    auto stream = kj::mv(pipe.ends[0]);
    capnp::TwoPartyClient client(*stream);
    CallDriver driver(h.io.waitScope, h.io.provider->getTimer(), client.bootstrap(),
                      {Interface::of<rpc::peer::PeerGate>(), Interface::of<rpc::peer::Peer>(),
                       Interface::of<rpc::peer::PinLease>()});
    driver.play(data, size);
  }
  expectReleased(h);
  return 0;
}
