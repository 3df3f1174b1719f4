// The cluster with real processes, when things go wrong: a holder killed or stopped mid-fetch,
// fetchers killed at random moments, a peer with another token, tenant or layout, garbage on the
// peer port, blocks corrupted in flight or in the holder's pool, and the peer protocol spoken
// directly. Each costs misses, never wrong bytes, leaked pins or blocks, or a dead daemon.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include <capnp/ez-rpc.h>

#include "daemon/snapshot_codec.h"
#include "schemas/peer.capnp.h"
#include "tests/cluster_support.h"
#include "tests/test_support.h"
#include "tools/synthetic_kv.h"
#include "transport/rpc_codec.h"

namespace kvtier::test {
namespace {

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

TEST(Cluster, KillingTheHolderMidFetchCostsAShorterHitNeverWrongBytes) {
  std::vector<NodeSpec> specs = nodes(2);
  specs[0].poolBytes = specs[1].poolBytes = 96 << 20;
  Cluster c(specs);
  ASSERT_TRUE(c.formed(2));
  constexpr size_t kTokens = 4096 * 16;  // 4096 blocks, 64 MiB
  putPrompt(c[0], "big", 8, kTokens);
  ASSERT_TRUE(c.published(0));
  auto client = c[1].connect();
  std::atomic<bool> done = false;
  Hit hit;
  const auto t0 = Clock::now();
  std::thread fetcher([&] {
    hit = lookupPrompt(*client, 8, kTokens);
    done = true;
  });
  // Kill the holder as soon as the fetch has started.
  auto watcher = c[1].connect();
  eventually([&] { return done || watcher->stats().value().remoteLookups > 0; },
             std::chrono::seconds(10));
  c[0].stop(SIGKILL);
  fetcher.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LE(hit.matched, kTokens);
  EXPECT_TRUE(hit.identical);  // whatever arrived is right
  EXPECT_LT(seconds, 10.0) << "the lookup must end within the peer deadlines";
  // The dead node leaves: static peers detect it by its connection and heartbeat.
  EXPECT_TRUE(eventually([&] { return watcher->stats().value().clusterMembersUp == 1; },
                         std::chrono::seconds(5)));
  expectNoLeakedBlocks(c[1]);
  // And the survivor still serves.
  putPrompt(c[1], "after", 9, 64);
  EXPECT_EQ(lookupPrompt(*client, 9, 64).matched, 64u);
}

// Whether process `pid` runs (a child that died is a zombie until reaped: not alive).
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t end = line.rfind(')');
  return end != std::string::npos && end + 2 < line.size() && line[end + 2] != 'Z' &&
         line[end + 2] != 'X';
}

// How many fetchers FetchersKilledAtRandomMomentsNeverTakeTheHolderDown kills (KVTIER_TEST_KILLS
// overrides it).
size_t fetcherKills() {
  const char* env = std::getenv("KVTIER_TEST_KILLS");
  return env ? std::strtoul(env, nullptr, 10) : 200;
}

// ctest runs it twice, with UCX's own transports and with UCX_TLS=tcp (tests/CMakeLists.txt);
// scripts/fetcher-kills.sh loops it.
TEST(ClusterFaults, FetchersKilledAtRandomMomentsNeverTakeTheHolderDown) {
  // A fetcher dies (SIGKILL) at a random moment of its start, its link and UCX endpoint setup to
  // the holder, or its gets: the holder never dies, and every pin the dead fetcher held on it is
  // released (by its connection's end, at the latest by its lease).
  std::vector<NodeSpec> specs = nodes(2);
  specs[0].extraArgs = {"--pin-lease-ms", "2000"};
  Cluster c(specs);
  ASSERT_TRUE(c.formed(2));
  constexpr size_t kTokens = 64 * 16;  // 64 blocks
  putPrompt(c[0], "held", 31, kTokens);
  ASSERT_TRUE(c.published(0));
  std::mt19937_64 rng(2026);
  const pid_t holder = c[0].pid();
  const size_t kills = fetcherKills();
  for (size_t k = 0; k < kills; ++k) {
    if (k > 0) c.start(1);  // a fresh fetcher on the same address
    const std::string segments = c[1].segmentPrefix();
    std::thread lookups;
    if (k % 4 != 0) {
      // Three kills in four come while the fetcher fetches (its first fetch sets its endpoint
      // up); the others while it starts and links.
      ASSERT_TRUE(eventually([&] { return c[1].connect()->stats().value().clusterMembersUp == 2; },
                             std::chrono::seconds(10)));
      lookups = std::thread([&, socket = c[1].socket()] {
        // The daemon may be gone before this connects: an error, never a crash here.
        auto client = Client::connect(ClientOptions{.socketPath = socket});
        if (!client) return;
        auto space = (*client)->open(testLayout());
        if (!space) return;
        for (int i = 0; i < 50; ++i) {
          // The daemon dies under these calls: any answer or error is fine, never a crash here.
          (void)(*space)->lookup(synthetic::tokens(31, kTokens));
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 20000));
    c[1].stop(SIGKILL);
    if (lookups.joinable()) lookups.join();
    for (const auto& name : shmSegments(segments)) ::shm_unlink(("/" + name).c_str());
    ASSERT_TRUE(alive(holder)) << "the holder died at kill " << k;
  }
  // The holder still serves its own clients, and holds no pin of any dead fetcher.
  auto client = c[0].connect();
  const Hit hit = lookupPrompt(*client, 31, kTokens);
  EXPECT_EQ(hit.matched, kTokens);
  EXPECT_TRUE(hit.identical);
  expectNoLeakedBlocks(c[0]);
}

TEST(Cluster, AHolderThatStopsAnsweringCostsAMissWithinTheDeadline) {
  Cluster c(nodes(2));  // --peer-timeout-ms 1000
  ASSERT_TRUE(c.formed(2));
  putPrompt(c[0], "frozen", 19, 128);
  ASSERT_TRUE(c.published(0));
  ::kill(c[0].pid(), SIGSTOP);  // alive, connected, silent
  auto client = c[1].connect();
  const auto t0 = Clock::now();
  const Hit hit = lookupPrompt(*client, 19, 128);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  ::kill(c[0].pid(), SIGCONT);
  EXPECT_EQ(hit.matched, 0u);
  EXPECT_LT(seconds, 5.0) << "a silent peer costs a deadline, never a hang";
  const Stats s = client->stats().value();
  EXPECT_GT(s.fetchTimeouts + s.fetchUnavailable, 0u);
  expectNoLeakedBlocks(c[1]);
  // Awake again, it serves (the link may have been re-established meanwhile).
  ASSERT_TRUE(c.formed(2));
  EXPECT_TRUE(eventually([&] { return lookupPrompt(*client, 19, 128).matched == 128; },
                         std::chrono::seconds(10)));
}

// A lookup's remote steps run in sequence — ask the homes, then pin on the holder — each with its
// own deadline; a silent holder that is also home of some keys used to cost more than one (1.5 s
// here). The lookup itself waits one deadline at most, and answers with what it has.
TEST(Cluster, ALookupWaitsForPeersOneDeadlineAtMostWhateverStepsTimeOut) {
  Cluster c(nodes(3));  // --peer-timeout-ms 1000
  ASSERT_TRUE(c.formed(3));
  putPrompt(c[0], "frozen", 23, 2048);  // 128 blocks: homes on every node
  ASSERT_TRUE(c.published(0));
  auto client = c[2].connect();
  const uint64_t cutBefore = client->stats().value().remoteLookupsCut;
  ::kill(c[0].pid(), SIGSTOP);
  const auto t0 = Clock::now();
  const Hit hit = lookupPrompt(*client, 23, 2048);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  ::kill(c[0].pid(), SIGCONT);
  EXPECT_EQ(hit.matched, 0u);
  EXPECT_LT(seconds, 5.0) << "a silent peer costs a deadline, never a hang";
  EXPECT_EQ(client->stats().value().remoteLookupsCut, cutBefore + 1)
      << "answered at one peer deadline, while the fetch's own steps went on";
  // The fetch went on in the background and ended within its own deadlines: nothing is left
  // allocated on the asker, and the holder serves again once awake.
  expectNoLeakedBlocks(c[2]);
  ASSERT_TRUE(c.formed(3));
  EXPECT_TRUE(eventually([&] { return lookupPrompt(*client, 23, 2048).matched == 2048; },
                         std::chrono::seconds(10)));
}

TEST(Cluster, NoBlockCrossesTokensTenantsOrLayouts) {
  std::vector<NodeSpec> specs = nodes(3);
  specs[2].token = "a-different-token-that-is-long-enough-0000";
  Cluster c(specs);
  ASSERT_TRUE(eventually(
      [&] {
        return c[0].connect()->stats().value().clusterMembersUp == 2 &&
               c[1].connect()->stats().value().clusterMembersUp == 2;
      },
      std::chrono::seconds(15)));
  putPrompt(c[0], "secret", 11, 96);
  ASSERT_TRUE(c.published(0));
  // The node with the wrong token never joins and never gets a block.
  auto outsider = c[2].connect();
  EXPECT_EQ(outsider->stats().value().clusterMembersUp, 1u);
  EXPECT_EQ(lookupPrompt(*outsider, 11, 96).matched, 0u);
  EXPECT_GT(c[0].connect()->stats().value().peerAuthFailures, 0u);
  // Another tenant (another uid) on a member: its salt names other keys. (The uid must reach
  // the socket through the test's private directory.)
  ::chmod(c[1].dataDir().substr(0, c[1].dataDir().rfind('/')).c_str(), 0755);
  std::string out;
  ASSERT_EQ(runPeer({"verify-as", "4321", c[1].socket(), "11", "96"}, &out), 0) << out;
  EXPECT_NE(out.find("MATCHED 0"), std::string::npos) << out;
  // Another layout: another fingerprint, other keys.
  {
    auto client = c[1].connect();
    Layout other = testLayout();
    other.modelId = "test/other";
    auto space = client->open(other).value();
    auto hit = space->lookup(synthetic::tokens(11, 96));
    ASSERT_TRUE(hit.ok());
    EXPECT_EQ(hit->matchedTokens(), 0u);
    EXPECT_EQ(client->stats().value().remoteHitBlocks, 0u);
  }
  // The right tenant and layout do hit.
  auto member = c[1].connect();
  EXPECT_EQ(lookupPrompt(*member, 11, 96).matched, 96u);
}

// Connects to HOST:PORT, writes `bytes`, and waits for the daemon to close the connection.
bool daemonCloses(const std::string& hostPort, const std::string& bytes, bool halfClose) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(hostPort.substr(hostPort.rfind(':') + 1))));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return false;
  }
  (void)!::write(fd, bytes.data(), bytes.size());
  if (halfClose) ::shutdown(fd, SHUT_WR);
  bool closed = false;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) > 0) {
      char buf[256];
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) {
        closed = true;
        break;
      }
    }
  }
  ::close(fd);
  return closed;
}

TEST(Cluster, GarbageOnThePeerPortDropsTheConnectionAndHarmsNothing) {
  Cluster c(nodes(2));
  ASSERT_TRUE(c.formed(2));
  putPrompt(c[0], "p", 12, 64);
  std::mt19937 rng(1234);
  std::string noise(4096, '\0');
  for (auto& ch : noise) ch = static_cast<char>(rng());
  EXPECT_TRUE(daemonCloses(c[0].peerAddr(), noise, false));
  // A frame header that promises more than it sends, then silence.
  const std::string truncated("\x00\x00\x00\x00\x00\x10\x00\x00partial", 15);
  EXPECT_TRUE(daemonCloses(c[0].peerAddr(), truncated, true));
  // A connection that never authenticates is dropped after the peer timeout.
  EXPECT_TRUE(daemonCloses(c[0].peerAddr(), "", false));
  ASSERT_TRUE(c.published(0));
  auto client = c[1].connect();
  const Hit hit = lookupPrompt(*client, 12, 64);
  EXPECT_EQ(hit.matched, 64u);
  EXPECT_TRUE(hit.identical);
  EXPECT_EQ(c[0].connect()->stats().value().clusterMembersUp, 2u);
}

TEST(Cluster, ABlockCorruptedInFlightIsAMissNeverServed) {
  // The test hook makes each daemon describe the blocks it serves with checksums that do not
  // match their bytes, as if they had been corrupted on the way.
  std::unique_ptr<Cluster> c;
  {
    ScopedEnv corrupt("KVTIER_TEST_CORRUPT_SERVED", "1");
    c = std::make_unique<Cluster>(nodes(2));
  }
  Cluster& pair = *c;
  ASSERT_TRUE(pair.formed(2));
  putPrompt(pair[0], "lie", 13, 80);
  ASSERT_TRUE(pair.published(0));
  auto client = pair[1].connect();
  const Hit hit = lookupPrompt(*client, 13, 80);
  EXPECT_EQ(hit.matched, 0u);
  const Stats s = client->stats().value();
  EXPECT_GT(s.fetchChecksum, 0u);
  EXPECT_EQ(s.remoteHitBlocks, 0u);
  expectNoLeakedBlocks(pair[1]);
  EXPECT_EQ(s.blocksUsed, 0u);  // nothing that failed was kept
}

// Flips a bit of block `block` of the prompt tokens(seed, n) where node `d` holds it, as a stray
// write into the shared pool (or bad memory) would, after the block was sealed.
void flipInPool(DaemonProcess& d, uint64_t seed, size_t n, size_t block) {
  auto client = d.connect();
  auto space = client->open(testLayout()).value();
  auto held =
      space->lookup(synthetic::tokens(seed, n), LookupOptions{.remote = RemoteMode::kLocal});
  ASSERT_TRUE(held.ok());
  ASSERT_GT(held->blockCount(), block);
  // The SDK maps the pool read-write (it writes puts there): the read view is the same memory.
  const_cast<uint8_t*>(held->block(block).data())[17] ^= 0x08;
}

TEST(Cluster, ABlockChangedInTheHoldersPoolAfterItsWriteIsAMissNeverServed) {
  // The checksum a fetcher verifies is the one the writer took as it wrote the block, not one
  // the holder takes when it first serves it: bytes that change in between fail the check on the
  // very first fetch.
  Cluster pair(nodes(2));
  ASSERT_TRUE(pair.formed(2));
  putPrompt(pair[0], "flip", 14, 80);  // five blocks
  flipInPool(pair[0], 14, 80, 2);
  ASSERT_TRUE(pair.published(0));
  auto client = pair[1].connect();
  const Hit hit = lookupPrompt(*client, 14, 80);
  EXPECT_EQ(hit.matched, 2u * testLayout().blockTokens);  // the blocks before the changed one
  EXPECT_TRUE(hit.identical);
  const Stats s = client->stats().value();
  EXPECT_EQ(s.fetchChecksum, 1u);
  // Asked again: still a miss at that block, never its changed bytes.
  const Hit again = lookupPrompt(*client, 14, 80);
  EXPECT_EQ(again.matched, 2u * testLayout().blockTokens);
  EXPECT_TRUE(again.identical);
  expectNoLeakedBlocks(pair[1]);
  expectNoLeakedBlocks(pair[0]);
}

// A peer as another daemon sees it: authenticate, then call.
TEST(Cluster, ThePeerProtocolServesSnapshotManifestsOnlyAfterTheToken) {
  std::vector<NodeSpec> specs = nodes(1);
  specs[0].coldTier = true;
  Cluster c(specs);
  auto client = c[0].connect();
  auto space = client->open(testLayout()).value();
  const auto t = synthetic::tokens(16, 80);
  const auto kv = synthetic::packedKv(testLayout(), t, 0, t.size());
  ASSERT_TRUE(space->put("s", 0, t, kv.data(), kv.size()).ok());
  const auto snap = space->snapshot("s", 16).value();
  ASSERT_TRUE(eventually([&] { return client->stats().value().coldSnapshots == 1; },
                         std::chrono::seconds(10)));
  capnp::EzRpcClient rpc(c[0].peerAddr());
  auto& ws = rpc.getWaitScope();
  auto gate = rpc.getMain<rpc::peer::PeerGate>();
  const Salt salt = saltFor("uid:" + std::to_string(::getuid()));
  {
    auto bad = gate.authenticateRequest();
    bad.setToken(capnp::Data::Reader(reinterpret_cast<const uint8_t*>("nope"), 4));
    bad.setProtocolVersion(rpc::peer::PEER_PROTOCOL_VERSION);
    bad.setNodeId("intruder");
    EXPECT_ANY_THROW(bad.send().wait(ws));
  }
  capnp::EzRpcClient rpc2(c[0].peerAddr());
  auto& ws2 = rpc2.getWaitScope();
  auto req = rpc2.getMain<rpc::peer::PeerGate>().authenticateRequest();
  req.setToken(capnp::Data::Reader(reinterpret_cast<const uint8_t*>(kToken.data()), kToken.size()));
  req.setProtocolVersion(rpc::peer::PEER_PROTOCOL_VERSION);
  req.setNodeId("tester");
  auto peer = req.send().wait(ws2).getPeer();
  auto ask = peer.snapshotManifestRequest();
  ask.getSpace().setFingerprint(space->fingerprint());
  ask.getSpace().setSalt(capnp::Data::Reader(salt.data(), salt.size()));
  ask.setId(snap.id);
  auto answer = ask.send().wait(ws2);
  auto bytes = answer.getManifest();
  auto manifest =
      decodeManifest(std::string_view(reinterpret_cast<const char*>(bytes.begin()), bytes.size()),
                     space->fingerprint(), salt, snap.id);
  ASSERT_TRUE(manifest.ok()) << manifest.error().toString();
  EXPECT_EQ(manifest->from, 16u);
  EXPECT_EQ(manifest->to, 80u);
  // Another tenant's salt names no snapshot.
  auto other = peer.snapshotManifestRequest();
  other.getSpace().setFingerprint(space->fingerprint());
  const Salt otherSalt = saltFor("uid:4321");
  other.getSpace().setSalt(capnp::Data::Reader(otherSalt.data(), otherSalt.size()));
  other.setId(snap.id);
  EXPECT_ANY_THROW(other.send().wait(ws2));
  // Bad input is refused, typed, and the peer keeps serving.
  auto bad = peer.whoHoldsRequest();
  bad.getSpace().setSalt(capnp::Data::Reader(salt.data(), 3));
  EXPECT_ANY_THROW(bad.send().wait(ws2));
  EXPECT_EQ(text(peer.pingRequest().send().wait(ws2).getNodeId()), "n0");
}

// A fetcher that pins and then never releases, or vanishes: the holder's pins end with their
// lease, or with the connection.
TEST(Cluster, NoPinOutlivesItsLeaseOrItsConnection) {
  Cluster c(nodes(1));
  putPrompt(c[0], "held", 18, 96);  // 6 blocks
  auto client = c[0].connect();
  auto space = client->open(testLayout()).value();
  const Salt salt = saltFor("uid:" + std::to_string(::getuid()));
  BlockKeyHasher hasher(space->fingerprint(), salt);
  const auto tokens = synthetic::tokens(18, 96);
  std::vector<Key128> keys;
  for (size_t i = 0; i < 6; ++i) {
    keys.push_back(hasher.next(i == 0 ? nullptr : &keys.back(),
                               std::span<const uint32_t>(tokens).subspan(i * 16, 16)));
  }
  auto pin = [&](capnp::EzRpcClient& rpc, uint32_t leaseMs) {
    auto auth = rpc.getMain<rpc::peer::PeerGate>().authenticateRequest();
    auth.setToken(
        capnp::Data::Reader(reinterpret_cast<const uint8_t*>(kToken.data()), kToken.size()));
    auth.setProtocolVersion(rpc::peer::PEER_PROTOCOL_VERSION);
    auth.setNodeId("fetcher");
    auto peer = auth.send().wait(rpc.getWaitScope()).getPeer();
    auto req = peer.pinRequest();
    layoutToRpc(testLayout(), req.initLayout());
    req.setSalt(capnp::Data::Reader(salt.data(), salt.size()));
    auto packed = req.initKeys(keys.size() * 16);
    for (size_t i = 0; i < keys.size(); ++i)
      std::memcpy(packed.begin() + 16 * i, keys[i].bytes.data(), 16);
    req.setLeaseMs(leaseMs);
    return req.send().wait(rpc.getWaitScope());
  };
  {
    capnp::EzRpcClient rpc(c[0].peerAddr());
    auto answer = pin(rpc, 300);  // the lease capability is held, never released
    ASSERT_EQ(answer.getBlocks().size(), 6u);
    for (auto b : answer.getBlocks()) EXPECT_EQ(b.getBytes(), testLayout().blockBytes());
    EXPECT_EQ(client->stats().value().blocksPinned, 6u);
    const Stats s = waitForStats(*client, [](const Stats& s) { return s.blocksPinned == 0; });
    EXPECT_EQ(s.blocksPinned, 0u);  // the lease ran out
  }
  {
    // A fetcher process that pins and is killed: its connection ends, and so do its pins.
    PeerProcess fetcher({"pin-and-hang", c[0].peerAddr(), kToken, "18", "96"});
    ASSERT_EQ(fetcher.waitForLine("PINNED"), "PINNED 6");
    EXPECT_EQ(client->stats().value().blocksPinned, 6u);
    fetcher.kill(SIGKILL);
    fetcher.wait();
    const Stats s = waitForStats(*client, [](const Stats& s) { return s.blocksPinned == 0; });
    EXPECT_EQ(s.blocksPinned, 0u);
  }
  // A pin of keys nobody holds pins nothing.
  keys[0].bytes[0] ^= 1;
  capnp::EzRpcClient rpc(c[0].peerAddr());
  EXPECT_EQ(pin(rpc, 1000).getBlocks().size(), 0u);
}

}  // namespace
}  // namespace kvtier::test
