// A separate client process for integration tests. Each subcommand connects to a daemon, does one
// thing and exits 0 on success; results are printed on stdout for the test to check.
//
//   put SOCKET SEQ SEED N [detached]         put tokens(SEED, N) with their synthetic KV
//   verify SOCKET SEED N DIVERGE EXPECTED    lookup tokens(SEED, N) altered from DIVERGE on;
//                                            exit 0 iff EXPECTED tokens match with identical bytes
//   verify-seq SOCKET SEQ SEED N             get SEQ; exit 0 iff it is N tokens of tokens(SEED, N)
//   hold SOCKET SEED N                       lookup tokens(SEED, N) (read lease) and write an
//                                            uncommitted put of tokens(SEED + 1000, 64) to seq
//                                            "uncommitted"; print "READY <pinned>"; sleep until
//                                            killed
//   verify-as UID SOCKET SEED N              as uid UID (group 0: still let in, another
//                                            tenant), lookup tokens(SEED, N); print "MATCHED <n>"
//   pin-and-hang PEERADDR TOKEN SEED N       as a peer daemon would: authenticate on PEERADDR,
//                                            pin the blocks of tokens(SEED, N) for a minute,
//                                            print "PINNED <blocks>"; sleep until killed
//   connect-as UID SOCKET                    setuid(UID), connect, print "CONNECT <error code
//   name>"
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <capnp/ez-rpc.h>

#include <cstring>

#include "kvtier/client.h"
#include "schemas/peer.capnp.h"
#include "transport/rpc_codec.h"
#include "tests/test_support.h"
#include "tools/synthetic_kv.h"

using namespace kvtier;

namespace {

std::unique_ptr<Client> connectTo(const std::string& socket) {
  auto client = Client::connect({.socketPath = socket, .clientName = "test-peer"});
  if (!client) {
    std::printf("ERROR connect %s\n", client.error().toString().c_str());
    std::exit(3);
  }
  return std::move(client).value();
}

[[noreturn]] void fail(const std::string& what, const Error& e) {
  std::printf("ERROR %s: %s\n", what.c_str(), e.toString().c_str());
  std::fflush(stdout);
  std::exit(4);
}

std::vector<uint32_t> alteredTokens(uint64_t seed, size_t n, size_t divergeAt) {
  auto tokens = synthetic::tokens(seed, n);
  for (size_t i = divergeAt; i < n; ++i) tokens[i] = tokens[i] ^ 0x5a5a5u;
  return tokens;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  if (a.empty()) return 2;
  const Layout layout = test::testLayout();
  if (a[0] == "put" && a.size() >= 5) {
    auto client = connectTo(a[1]);
    auto space = client->open(layout).value();
    const auto tokens = synthetic::tokens(std::stoull(a[3]), std::stoull(a[4]));
    const auto kv = synthetic::packedKv(layout, tokens, 0, tokens.size());
    PutOptions options;
    options.detached = a.size() > 5 && a[5] == "detached";
    auto info = space->put(a[2], 0, tokens, kv.data(), kv.size(), options);
    if (!info) fail("put", info.error());
    std::printf("OK sealed=%u length=%lu\n", info->sealedBlocks,
                static_cast<unsigned long>(info->length));
    return 0;
  }
  if (a[0] == "verify" && a.size() == 6) {
    auto client = connectTo(a[1]);
    auto space = client->open(layout).value();
    const auto tokens = alteredTokens(std::stoull(a[2]), std::stoull(a[3]), std::stoull(a[4]));
    auto hit = space->lookup(tokens);
    if (!hit) fail("lookup", hit.error());
    const uint64_t matched = hit->matchedTokens();
    std::vector<uint8_t> got(matched * layout.tokenKvBytes());
    if (auto s = hit->copyTo(0, matched, got.data(), got.size()); !s) fail("copy", s.error());
    const bool same = got == synthetic::packedKv(layout, tokens, 0, matched);
    std::printf("MATCHED %lu %s\n", static_cast<unsigned long>(matched),
                same ? "identical" : "DIFFERENT");
    return matched == std::stoull(a[5]) && same ? 0 : 1;
  }
  if (a[0] == "verify-seq" && a.size() == 5) {
    auto client = connectTo(a[1]);
    auto space = client->open(layout).value();
    const auto tokens = synthetic::tokens(std::stoull(a[3]), std::stoull(a[4]));
    auto held = space->get(a[2]);
    if (!held) fail("get", held.error());
    std::vector<uint8_t> got(held->end() * layout.tokenKvBytes());
    if (auto s = held->copyTo(0, held->end(), got.data(), got.size()); !s) fail("copy", s.error());
    const bool same = held->end() == tokens.size() &&
                      got == synthetic::packedKv(layout, tokens, 0, tokens.size());
    std::printf("SEQ %lu %s\n", static_cast<unsigned long>(held->end()),
                same ? "identical" : "DIFFERENT");
    return same ? 0 : 1;
  }
  if (a[0] == "hold" && a.size() == 4) {
    auto client = connectTo(a[1]);
    auto space = client->open(layout).value();
    const auto tokens = synthetic::tokens(std::stoull(a[2]), std::stoull(a[3]));
    auto hit = space->lookup(tokens);
    if (!hit) fail("lookup", hit.error());
    const auto other = synthetic::tokens(std::stoull(a[2]) + 1000, 64);
    auto write = space->beginPut("uncommitted", 0, other);
    if (!write) fail("beginPut", write.error());
    const auto kv = synthetic::packedKv(layout, other, 0, other.size());
    if (auto s = write->write(0, other.size(), kv.data(), kv.size()); !s) fail("write", s.error());
    std::printf("READY %zu\n", hit->blockCount());
    std::fflush(stdout);
    while (true) pause();
  }
  if (a[0] == "snapshot" && a.size() == 6) {
    auto client = connectTo(a[1]);
    auto space = client->open(layout).value();
    const auto tokens = synthetic::tokens(std::stoull(a[3]), std::stoull(a[4]));
    const auto kv = synthetic::packedKv(layout, tokens, 0, tokens.size());
    if (auto r = space->put(a[2], 0, tokens, kv.data(), kv.size()); !r) fail("put", r.error());
    auto snap = space->snapshot(a[2], std::stoull(a[5]));
    if (!snap) fail("snapshot", snap.error());
    if (auto r = space->remove(a[2], 0); !r) fail("remove", r.error());
    std::printf("SNAPSHOT %lu\n", static_cast<unsigned long>(snap->id));
    return 0;
  }
  if (a[0] == "continue" && a.size() == 6) {
    auto client = connectTo(a[1]);
    auto space = client->open(layout).value();
    const uint64_t n = std::stoull(a[4]), m = std::stoull(a[5]);
    const auto tokens = synthetic::tokens(std::stoull(a[3]), n + m);
    if (space->length(a[2]).value() != std::optional<uint64_t>(n)) {
      std::printf("ERROR sequence is not %lu tokens long\n", static_cast<unsigned long>(n));
      return 1;
    }
    const auto kv = synthetic::packedKv(layout, tokens, n, n + m);
    auto r = space->put(a[2], n, std::span(tokens).subspan(n), kv.data(), kv.size());
    if (!r) fail("put", r.error());
    std::printf("CONTINUED %lu\n", static_cast<unsigned long>(r->length));
    return 0;
  }
  if (a[0] == "verify-as" && a.size() == 5) {
    const auto id = static_cast<uid_t>(std::stoul(a[1]));
    if (setgid(0) != 0 || setuid(id) != 0) {
      std::printf("MATCHED setuid-failed\n");
      return 5;
    }
    auto client = connectTo(a[2]);
    auto space = client->open(layout).value();
    auto hit = space->lookup(synthetic::tokens(std::stoull(a[3]), std::stoull(a[4])));
    if (!hit) fail("lookup", hit.error());
    std::printf("MATCHED %lu\n", static_cast<unsigned long>(hit->matchedTokens()));
    return 0;
  }
  if (a[0] == "pin-and-hang" && a.size() == 5) {
    const uint64_t fingerprint = layout.fingerprint();
    const Salt salt = saltFor("uid:" + std::to_string(::getuid()));
    BlockKeyHasher hasher(fingerprint, salt);
    const auto tokens = synthetic::tokens(std::stoull(a[3]), std::stoull(a[4]));
    std::vector<Key128> keys;
    for (size_t i = 0; (i + 1) * layout.blockTokens <= tokens.size(); ++i) {
      keys.push_back(hasher.next(keys.empty() ? nullptr : &keys.back(),
                                 std::span<const uint32_t>(tokens).subspan(
                                     i * layout.blockTokens, layout.blockTokens)));
    }
    capnp::EzRpcClient rpc(a[1]);
    auto& ws = rpc.getWaitScope();
    auto auth = rpc.getMain<rpc::peer::PeerGate>().authenticateRequest();
    auth.setToken(capnp::Data::Reader(reinterpret_cast<const uint8_t*>(a[2].data()), a[2].size()));
    auth.setProtocolVersion(rpc::peer::PEER_PROTOCOL_VERSION);
    auth.setNodeId("test-fetcher");
    auto peer = auth.send().wait(ws).getPeer();
    auto req = peer.pinRequest();
    layoutToRpc(layout, req.initLayout());
    req.setSalt(capnp::Data::Reader(salt.data(), salt.size()));
    auto packed = req.initKeys(keys.size() * 16);
    for (size_t i = 0; i < keys.size(); ++i) {
      std::memcpy(packed.begin() + 16 * i, keys[i].bytes.data(), 16);
    }
    req.setLeaseMs(60000);
    auto answer = req.send().wait(ws);
    std::printf("PINNED %u\n", answer.getBlocks().size());
    std::fflush(stdout);
    kj::NEVER_DONE.wait(ws);
  }
  if (a[0] == "connect-as" && a.size() == 3) {
    const auto id = static_cast<uid_t>(std::stoul(a[1]));
    if (setgid(id) != 0 || setuid(id) != 0) {
      std::printf("CONNECT setuid-failed\n");
      return 5;
    }
    auto client = Client::connect({.socketPath = a[2], .clientName = "test-peer"});
    std::printf("CONNECT %s\n", client ? "OK" : errorName(client.error().code()));
    return 0;
  }
  std::fprintf(stderr, "test_peer: bad arguments\n");
  return 2;
}
