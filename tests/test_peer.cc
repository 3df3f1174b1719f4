// A separate client process for integration tests. Each subcommand connects to a daemon, does one
// thing and exits 0 on success; results are printed on stdout for the test to check.
//
//   put SOCKET SEQ SEED N [detached]         put tokens(SEED, N) with their synthetic KV; print
//                                            "OK sealed=.. length=.. mapped=0|1"
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
//   as-user UID GID COMMAND ...              drop to uid UID, group GID and no supplementary
//                                            groups (as login would), then run COMMAND ...
//   connect SOCKET                           connect; print "CONNECT OK" or "CONNECT <code>"
//   pool-fds SOCKET                          ask for the pool's descriptors (transport/pool_fds.h);
//                                            print "POOL_FDS OK <count>" or "POOL_FDS <code>"
//   put-entry SOCKET SEED                    put a 4 KiB entry under keyOf(SEED)
//   probe SOCKET SEQ SNAPSHOT SEED           try to reach another tenant's sequence SEQ,
//                                            snapshot SNAPSHOT, entry keyOf(SEED) and the first
//                                            blocks of the pool by guessed reference; print one
//                                            line per attempt ("GET NOT_FOUND", ...)
//   flood SOCKET SEED COUNT N                put COUNT sequences of N tokens, each removed after
//                                            (cached); print "FLOODED ok=.. full=.." and
//                                            "TENANT <bytes used> <quota bytes>"
//   inline-fresh SOCKET                      over raw calls: a block written in part, one not
//                                            written, an entry not written; read back inline:
//                                            print "PARTIAL|UNWRITTEN|ENTRY nonzero=<bytes>"
#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <capnp/ez-rpc.h>

#include <cstring>

#include "kvtier/client.h"
#include "schemas/peer.capnp.h"
#include "tests/raw_connection.h"
#include "tests/test_support.h"
#include "tools/synthetic_kv.h"
#include "transport/pool_fds.h"
#include "transport/rpc_codec.h"

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

// The 16-byte entry key of a seed.
Key128 entryKey(uint64_t seed) {
  Key128 k;
  for (size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<uint8_t>(seed * 31 + i);
  return k;
}

const char* codeOf(const Status& s) { return s ? "OK" : errorName(s.error().code()); }
template <typename T>
const char* codeOf(const Result<T>& r) {
  return r ? "OK" : errorName(r.error().code());
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
  if (a[0] == "as-user" && a.size() >= 4) {
    const auto uid = static_cast<uid_t>(std::stoul(a[1]));
    const auto gid = static_cast<gid_t>(std::stoul(a[2]));
    if (setgroups(1, &gid) != 0 || setgid(gid) != 0 || setuid(uid) != 0 || getuid() != uid ||
        geteuid() != uid) {
      std::printf("ERROR cannot become uid %s gid %s: %s\n", a[1].c_str(), a[2].c_str(),
                  std::strerror(errno));
      return 5;
    }
    a.erase(a.begin(), a.begin() + 3);
  }
  if (a[0] == "pool-fds" && a.size() == 2) {
    // The pool's descriptors, asked for as a client does for a pool on huge pages.
    auto got = pool_fds::request(a[1], std::chrono::milliseconds(5000));
    if (got) {
      std::printf("POOL_FDS OK %zu\n", got->size());
    } else {
      std::printf("POOL_FDS %s\n", errorName(got.error().code()));
    }
    return 0;
  }
  if (a[0] == "connect" && a.size() == 2) {
    auto client = Client::connect({.socketPath = a[1], .clientName = "test-peer"});
    std::printf("CONNECT %s\n", client ? "OK" : errorName(client.error().code()));
    return 0;
  }
  if (a[0] == "put-entry" && a.size() == 3) {
    auto client = connectTo(a[1]);
    auto space = client->open(layout).value();
    const std::vector<uint8_t> bytes(4096, 0x5a);
    if (auto s = space->putEntry(entryKey(std::stoull(a[2])), bytes.data(), bytes.size()); !s) {
      fail("putEntry", s.error());
    }
    std::printf("ENTRY OK\n");
    return 0;
  }
  if (a[0] == "probe" && a.size() == 5) {
    auto client = connectTo(a[1]);
    auto space = client->open(layout).value();
    std::printf("MAPPED %d\n", client->mapped() ? 1 : 0);
    auto length = space->length(a[2]);
    std::printf("LENGTH %s\n", !length               ? errorName(length.error().code())
                               : length->has_value() ? "exists"
                                                     : "absent");
    std::printf("GET %s\n", codeOf(space->get(a[2])));
    const uint64_t snap = std::stoull(a[3]);
    std::printf("SNAPSHOT %s\n", codeOf(space->snapshotInfo(snap)));
    std::printf("RESTORE %s\n", codeOf(space->restore("probe", snap, 16)));
    std::printf("DROP %s\n", codeOf(space->dropSnapshot(snap)));
    std::printf("ENTRY %s\n", codeOf(space->getEntry(entryKey(std::stoull(a[4])))));
    // References to the first blocks of the pool, as a tenant could guess them: none may read.
    int readable = 0;
    for (uint64_t block = 0; block < 8; ++block) {
      for (uint64_t generation = 1; generation <= 4; ++generation) {
        const BlockRef ref{0, block * layout.blockBytes(),
                           static_cast<uint32_t>(layout.blockBytes()), generation};
        if (space->readRefs(std::span<const BlockRef>(&ref, 1))) ++readable;
      }
    }
    std::printf("REFS readable=%d\n", readable);
    return 0;
  }
  if (a[0] == "flood" && a.size() == 5) {
    auto client = connectTo(a[1]);
    auto space = client->open(layout).value();
    const uint64_t seed = std::stoull(a[2]), count = std::stoull(a[3]), n = std::stoull(a[4]);
    int ok = 0, full = 0;
    for (uint64_t i = 0; i < count; ++i) {
      const auto tokens = synthetic::tokens(seed + i, n);
      const auto kv = synthetic::packedKv(layout, tokens, 0, tokens.size());
      const std::string seq = "flood-" + std::to_string(i);
      auto r = space->put(seq, 0, tokens, kv.data(), kv.size());
      if (!r && r.error().code() != ErrorCode::kFull) fail("put", r.error());
      (r ? ok : full)++;
      if (auto s = space->remove(seq, 0); !s) fail("remove", s.error());
    }
    auto stats = client->stats();
    if (!stats) fail("stats", stats.error());
    std::printf("FLOODED ok=%d full=%d\n", ok, full);
    std::printf("TENANT %lu %lu\n", static_cast<unsigned long>(stats->tenantBytesUsed),
                static_cast<unsigned long>(stats->tenantQuotaBytes));
    return 0;
  }
  if (a[0] == "put" && a.size() >= 5) {
    auto client = connectTo(a[1]);
    auto space = client->open(layout).value();
    const auto tokens = synthetic::tokens(std::stoull(a[3]), std::stoull(a[4]));
    const auto kv = synthetic::packedKv(layout, tokens, 0, tokens.size());
    PutOptions options;
    options.detached = a.size() > 5 && a[5] == "detached";
    auto info = space->put(a[2], 0, tokens, kv.data(), kv.size(), options);
    if (!info) fail("put", info.error());
    std::printf("OK sealed=%u length=%lu mapped=%d\n", info->sealedBlocks,
                static_cast<unsigned long>(info->length), client->mapped() ? 1 : 0);
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
      keys.push_back(hasher.next(
          keys.empty() ? nullptr : &keys.back(),
          std::span<const uint32_t>(tokens).subspan(i * layout.blockTokens, layout.blockTokens)));
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
    // Root's supplementary groups go too: they would let the peer in (SO_PEERGROUPS).
    const auto gid = static_cast<gid_t>(id);
    if (setgroups(1, &gid) != 0 || setgid(id) != 0 || setuid(id) != 0) {
      std::printf("CONNECT setuid-failed\n");
      return 5;
    }
    auto client = Client::connect({.socketPath = a[2], .clientName = "test-peer"});
    std::printf("CONNECT %s\n", client ? "OK" : errorName(client.error().code()));
    return 0;
  }
  if (a[0] == "inline-fresh" && a.size() == 2) {
    // Raw calls (the SDK writes every byte it puts): blocks written in part or not at all, read
    // back whole, inline.
    test::RawConnection conn(a[1]);
    auto& ws = conn.ws();
    auto hello = conn.daemon().helloRequest();
    hello.setProtocolVersion(rpc::PROTOCOL_VERSION);
    hello.setClientName("inline-fresh");
    auto session = hello.send().wait(ws).getSession();
    auto open = session.openRequest();
    layoutToRpc(layout, open.initLayout());
    auto space = open.send().wait(ws).getSpace();
    const auto nonZero = [](capnp::Data::Reader data) {
      return std::count_if(data.begin(), data.end(), [](uint8_t x) { return x != 0; });
    };
    const auto readBack = [&](const char* seq) {
      auto get = space.getRequest();
      get.setSeq(seq);
      get.setInline(true);
      auto got = get.send().wait(ws);
      long n = 0;
      for (auto block : got.getData()) n += nonZero(block);
      return n;
    };
    // One token of a block, written (as zeros); the rest of the block never written.
    auto partial = space.putRequest();
    partial.setSeq("partial");
    partial.initTokens(1).set(0, 1);
    auto partialLease = partial.send().wait(ws).getLease();
    auto write = partialLease.writeRequest();
    write.setSlots(1);
    write.initData(layout.tokenKvBytes());
    write.send().wait(ws);
    partialLease.commitRequest().send().wait(ws);
    std::printf("PARTIAL nonzero=%ld\n", readBack("partial"));
    // A whole block committed without a write.
    auto unwritten = space.putRequest();
    unwritten.setSeq("unwritten");
    auto tokens = unwritten.initTokens(layout.blockTokens);
    for (uint32_t i = 0; i < tokens.size(); ++i) tokens.set(i, 100 + i);
    unwritten.send().wait(ws).getLease().commitRequest().send().wait(ws);
    std::printf("UNWRITTEN nonzero=%ld\n", readBack("unwritten"));
    // An entry of a block's size, committed without a write.
    const Key128 key = entryKey(77);
    auto putEntry = space.putEntryRequest();
    putEntry.setKey(capnp::Data::Reader(key.bytes.data(), key.bytes.size()));
    putEntry.setBytes(layout.blockBytes());
    putEntry.send().wait(ws).getLease().commitRequest().send().wait(ws);
    auto getEntry = space.getEntryRequest();
    getEntry.setKey(capnp::Data::Reader(key.bytes.data(), key.bytes.size()));
    getEntry.setInline(true);
    std::printf("ENTRY nonzero=%ld\n", nonZero(getEntry.send().wait(ws).getData()));
    return 0;
  }
  std::fprintf(stderr, "test_peer: bad arguments\n");
  return 2;
}
