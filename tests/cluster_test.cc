// The cluster with real processes: kvtierd daemons on loopback joined by static peers or by a
// real etcd (Debian's etcd-server, started by the test), clients in this process and in peer
// processes. What a user relies on: a prefix cached on any node is a hit on every other, with
// identical bytes; a dead, slow, lying or hostile peer costs misses, never wrong bytes, leaked
// blocks or a dead daemon.
// Here: fetches across nodes, membership (static and etcd) and what a remote lookup costs; faults
// and hostile peers in cluster_faults_test.cc; data moved between nodes (snapshots, drain, copy and
// move) in cluster_copy_test.cc; the helpers they share in cluster_support.h.
#include <signal.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "tests/cluster_support.h"
#include "tests/etcd_process.h"
#include "tests/temp_dir.h"
#include "tests/test_support.h"
#include "tools/synthetic_kv.h"

namespace kvtier::test {
namespace {

class ClusterTransports : public ::testing::TestWithParam<const char*> {};

TEST_P(ClusterTransports, APutOnOneNodeHitsOnEveryOtherWithIdenticalBytes) {
  ScopedEnv tls("UCX_TLS", GetParam());
  Cluster c(nodes(3));
  ASSERT_TRUE(c.formed(3));
  putPrompt(c[0], "chat", 1, 200);  // 12 full blocks and a partial one
  ASSERT_TRUE(c.published(0));
  for (size_t i : {1, 2}) {
    auto client = c[i].connect();
    const Hit hit = lookupPrompt(*client, 1, 200);
    EXPECT_EQ(hit.matched, 192u) << "node " << i;
    EXPECT_TRUE(hit.identical) << "node " << i;
    const Stats s = client->stats().value();
    EXPECT_EQ(s.remoteHitBlocks, 12u);
    EXPECT_EQ(s.remoteHitBytes, 12u * testLayout().blockBytes());
    // A second lookup is local: nothing more is fetched.
    EXPECT_EQ(lookupPrompt(*client, 1, 200).matched, 192u);
    EXPECT_EQ(client->stats().value().remoteHitBlocks, 12u);
  }
  EXPECT_GE(c[0].connect()->stats().value().servedBlocks, 12u);
  // Local-only lookups never ask the cluster.
  auto other = c[2].connect();
  EXPECT_EQ(lookupPrompt(*other, 99, 64, RemoteMode::kLocal).matched, 0u);
}

INSTANTIATE_TEST_SUITE_P(Ucx, ClusterTransports, ::testing::Values("tcp", nullptr),
                         [](const auto& info) {
                           return std::string(info.param ? info.param : "default");
                         });

TEST(Cluster, ConcurrentLookupsOfOnePrefixFetchItsBlocksOnce) {
  Cluster c(nodes(2));
  ASSERT_TRUE(c.formed(2));
  putPrompt(c[0], "doc", 7, 256 * 16);  // 256 blocks
  ASSERT_TRUE(c.published(0));
  // Eight lookups at once on node 1: one fetch brings the blocks, the others wait for it.
  constexpr int kLookups = 8;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kLookups; ++i) clients.push_back(c[1].connect());
  std::vector<Hit> hits(kLookups);
  std::atomic<int> ready = 0;
  std::vector<std::thread> threads;
  for (int i = 0; i < kLookups; ++i) {
    threads.emplace_back([&, i] {
      ++ready;
      while (ready < kLookups) std::this_thread::yield();
      hits[i] = lookupPrompt(*clients[i], 7, 256 * 16);
    });
  }
  for (auto& t : threads) t.join();
  for (const Hit& h : hits) {
    EXPECT_EQ(h.matched, 256u * 16);
    EXPECT_TRUE(h.identical);
  }
  const Stats s = clients[0]->stats().value();
  EXPECT_EQ(s.remoteHitBlocks, 256u) << "each block crossed once";
  EXPECT_EQ(s.remoteHitBytes, 256u * testLayout().blockBytes());
  clients.clear();
  expectNoLeakedBlocks(c[1]);
}

TEST(Cluster, HitsAndMissesCountEachNodesOwnClientsWhilePeersFetch) {
  // Node 0 holds eight prompts of 32 blocks; node 1's client fetches them one after another while
  // node 0's client looks up one of them and an unknown one, over and over. Each node's hits and
  // misses are its own clients' lookups, nothing of the blocks it pins and serves to the other.
  Cluster c(nodes(2));
  ASSERT_TRUE(c.formed(2));
  constexpr size_t kTokens = 32 * 16;
  constexpr uint64_t kPrompts = 8;
  for (uint64_t p = 0; p < kPrompts; ++p)
    putPrompt(c[0], "doc" + std::to_string(p), 100 + p, kTokens);
  ASSERT_TRUE(c.published(0));
  auto local = c[0].connect();
  auto remote = c[1].connect();
  const Stats before0 = local->stats().value(), before1 = remote->stats().value();
  uint64_t hits0 = 0, misses0 = 0, hits1 = 0, misses1 = 0;
  std::atomic<bool> fetching = true;
  std::thread fetcher([&] {
    for (uint64_t p = 0; p < kPrompts; ++p) {
      const Hit h = lookupPrompt(*remote, 100 + p, kTokens);
      EXPECT_TRUE(h.identical);
      hits1 += h.matched / 16;
      misses1 += h.matched < kTokens;
    }
    fetching = false;
  });
  int rounds = 0;
  while (fetching || rounds < 4) {
    const Hit held = lookupPrompt(*local, 100 + rounds % kPrompts, kTokens, RemoteMode::kLocal);
    const Hit unknown = lookupPrompt(*local, 999, kTokens, RemoteMode::kLocal);
    hits0 += held.matched / 16 + unknown.matched / 16;
    misses0 += (held.matched < kTokens) + (unknown.matched < kTokens);
    ++rounds;
  }
  fetcher.join();
  const Stats after0 = local->stats().value(), after1 = remote->stats().value();
  EXPECT_EQ(after1.remoteHitBlocks - before1.remoteHitBlocks, kPrompts * 32);
  EXPECT_EQ(after0.servedBlocks - before0.servedBlocks, kPrompts * 32);
  EXPECT_EQ(after0.hits - before0.hits, hits0);
  EXPECT_EQ(after0.misses - before0.misses, misses0);
  EXPECT_EQ(after1.hits - before1.hits, hits1);
  EXPECT_EQ(after1.misses - before1.misses, misses1);
}

// Keys as an engine that hashes its own blocks would bring: n distinct ones, `tag` apart from
// other tests'.
std::vector<Key128> clientKeys(size_t n, uint8_t tag) {
  std::vector<Key128> keys(n);
  for (size_t i = 0; i < n; ++i)
    keys[i].bytes[0] = static_cast<uint8_t>(i + 1), keys[i].bytes[15] = tag;
  return keys;
}

TEST(Cluster, ALookupPinsTheHolderThatReachesFurthestWithOneQueryAndOnePin) {
  // Client keys (as an engine that hashes its own blocks would bring): node 0 holds blocks 0-3
  // of the chain, node 1 all eight; node 2 gets all eight from node 1, asking one directory home
  // (none if it is that home itself) and pinning once.
  Cluster c(nodes(3));
  ASSERT_TRUE(c.formed(3));
  const Layout layout = testLayout();
  const auto tokens = synthetic::tokens(5, 128);
  const auto kv = synthetic::packedKv(layout, tokens, 0, tokens.size());
  const std::vector<Key128> chain = clientKeys(8, 0xc4);
  const std::span<const uint32_t> head(tokens.data(), 64);
  {
    auto client = c[0].connect();
    auto space = client->open(layout).value();
    const auto bytes = synthetic::packedKv(layout, tokens, 0, 64);
    PutOptions o{.keys = {chain.begin(), chain.begin() + 4}};
    ASSERT_TRUE(space->put("head", 0, head, bytes.data(), bytes.size(), o).ok());
  }
  {
    auto client = c[1].connect();
    auto space = client->open(layout).value();
    ASSERT_TRUE(
        space->put("whole", 0, tokens, kv.data(), kv.size(), PutOptions{.keys = chain}).ok());
  }
  ASSERT_TRUE(c.published(0));
  ASSERT_TRUE(c.published(1));
  auto client = c[2].connect();
  auto space = client->open(layout).value();
  auto hit = space->lookupKeys(chain);
  ASSERT_TRUE(hit.ok()) << hit.error().toString();
  ASSERT_EQ(hit->matchedTokens(), 128u);
  std::vector<uint8_t> got(kv.size());
  ASSERT_TRUE(hit->copyTo(0, 128, got.data(), got.size()).ok());
  EXPECT_TRUE(got == kv);
  const Stats s = client->stats().value();
  EXPECT_EQ(s.remoteHitBlocks, 8u);
  EXPECT_EQ(s.remoteLookups, 1u);
  EXPECT_GE(s.lookupPeerMessages, 1u) << "at least the pin";
  EXPECT_LE(s.lookupPeerMessages, 2u) << "a query and one pin";
  EXPECT_EQ(c[1].connect()->stats().value().servedBlocks, 8u);
  EXPECT_EQ(c[0].connect()->stats().value().servedBlocks, 0u);
}

TEST(Cluster, AFetchNeverEvictsTheLocalBlocksItsLookupJoinsItTo) {
  // Node 1 holds the second half of a chain, as its oldest blocks, in a full pool; node 0 holds
  // the whole chain. A lookup on node 1 fetches the first half and joins it to the local second
  // half: the fetch's fresh blocks take room from other blocks, never from those (the lookup
  // would answer with half the chain it found).
  std::vector<NodeSpec> specs = nodes(2);
  specs[1].poolBytes = 1 << 20;  // 64 blocks
  specs[1].extraArgs = {"--eviction", "lru"};
  Cluster c(specs);
  ASSERT_TRUE(c.formed(2));
  const Layout layout = testLayout();
  constexpr size_t kBlocks = 48, kHalf = 24, kBt = 16;
  const auto tokens = synthetic::tokens(9, kBlocks * kBt);
  const auto kv = synthetic::packedKv(layout, tokens, 0, tokens.size());
  const std::vector<Key128> chain = clientKeys(kBlocks, 0x5e);
  {
    auto client = c[0].connect();
    auto space = client->open(layout).value();
    ASSERT_TRUE(
        space->put("whole", 0, tokens, kv.data(), kv.size(), PutOptions{.keys = chain}).ok());
  }
  {
    auto client = c[1].connect();
    auto space = client->open(layout).value();
    const std::span<const uint32_t> tail(tokens.data() + kHalf * kBt, kHalf * kBt);
    const auto bytes = synthetic::packedKv(layout, tokens, kHalf * kBt, kBlocks * kBt);
    PutOptions o{.keys = {chain.begin() + kHalf, chain.end()}};
    ASSERT_TRUE(space->put("tail", 0, tail, bytes.data(), bytes.size(), o).ok());
  }
  putPrompt(c[1], "newer", 10, 40 * kBt);  // the pool is full: 24 + 40 blocks
  {
    const Stats s = c[1].connect()->stats().value();
    ASSERT_EQ(s.blocksUsed, s.blocksTotal);
  }
  ASSERT_TRUE(c.published(0));
  ASSERT_TRUE(c.published(1));
  auto client = c[1].connect();
  auto space = client->open(layout).value();
  auto hit = space->lookupKeys(chain);
  ASSERT_TRUE(hit.ok()) << hit.error().toString();
  ASSERT_EQ(hit->matchedTokens(), kBlocks * kBt) << "the local half was evicted by the fetch";
  std::vector<uint8_t> got(kv.size());
  ASSERT_TRUE(hit->copyTo(0, kBlocks * kBt, got.data(), got.size()).ok());
  EXPECT_TRUE(got == kv);
  EXPECT_EQ(client->stats().value().remoteHitBlocks, kHalf);
  hit->release();
  expectNoLeakedBlocks(c[1]);
}

TEST(Cluster, ALaterSegmentHeldWithoutItsAnchorIsFoundWithASecondQuery) {
  // An 80-block chain: segment 0 is blocks 0-63, segment 1 blocks 64-79 (anchor 64). Node 0 holds
  // blocks 0-69. Node 1 fetched those, sealed 70-79 itself, then needed room: the fetched copies
  // went first, so it holds 70-79 without their anchor. A lookup on node 2 learns of node 1 only
  // from segment 1's home, key by key: after node 0's pin comes back short at 70, it asks there
  // and pins the rest on node 1.
  std::vector<NodeSpec> specs = nodes(3);
  specs[1].poolBytes = 2 << 20;  // 128 blocks
  Cluster c(specs);
  ASSERT_TRUE(c.formed(3));
  const Layout layout = testLayout();
  constexpr size_t kBlocks = 80, kHead = 70, kBt = 16;
  const auto tokens = synthetic::tokens(12, kBlocks * kBt);
  const auto kv = synthetic::packedKv(layout, tokens, 0, tokens.size());
  const std::vector<Key128> chain = clientKeys(kBlocks, 0x7a);
  const std::span<const Key128> head(chain.data(), kHead);
  {
    auto client = c[0].connect();
    auto space = client->open(layout).value();
    const auto bytes = synthetic::packedKv(layout, tokens, 0, kHead * kBt);
    PutOptions o{.keys = {head.begin(), head.end()}};
    ASSERT_TRUE(
        space->put("head", 0, std::span(tokens.data(), kHead * kBt), bytes.data(), bytes.size(), o)
            .ok());
  }
  ASSERT_TRUE(c.published(0));
  {
    auto client = c[1].connect();
    auto space = client->open(layout).value();
    auto hit = space->lookupKeys(chain, LookupOptions{.bindSeq = "s"});
    ASSERT_TRUE(hit.ok()) << hit.error().toString();
    ASSERT_EQ(hit->matchedTokens(), kHead * kBt);
    hit->release();
    const auto bytes = synthetic::packedKv(layout, tokens, kHead * kBt, kBlocks * kBt);
    PutOptions o{.keys = {chain.begin() + kHead, chain.end()}};
    ASSERT_TRUE(space
                    ->put("s", kHead * kBt, std::span(tokens).subspan(kHead * kBt), bytes.data(),
                          bytes.size(), o)
                    .ok());
  }
  putPrompt(c[1], "fill", 13, 48 * kBt);  // the pool is full
  putPrompt(c[1], "more", 14, 70 * kBt);  // room for it: the 70 fetched copies go
  {
    auto client = c[1].connect();
    auto space = client->open(layout).value();
    auto local = space->lookupKeys(std::span(chain).subspan(kHead),
                                   LookupOptions{.remote = RemoteMode::kLocal});
    ASSERT_TRUE(local.ok());
    ASSERT_EQ(local->matchedTokens(), (kBlocks - kHead) * kBt) << "node 1 kept what it sealed";
    local->release();
    auto gone = space->lookupKeys(head, LookupOptions{.remote = RemoteMode::kLocal});
    ASSERT_TRUE(gone.ok());
    ASSERT_EQ(gone->matchedTokens(), 0u) << "and not the fetched copies";
  }
  ASSERT_TRUE(c.published(1));
  auto client = c[2].connect();
  auto space = client->open(layout).value();
  auto hit = space->lookupKeys(chain);
  ASSERT_TRUE(hit.ok()) << hit.error().toString();
  ASSERT_EQ(hit->matchedTokens(), kBlocks * kBt);
  std::vector<uint8_t> got(kv.size());
  ASSERT_TRUE(hit->copyTo(0, kBlocks * kBt, got.data(), got.size()).ok());
  EXPECT_TRUE(got == kv);
  const Stats s = client->stats().value();
  EXPECT_EQ(s.remoteHitBlocks, kBlocks);
  EXPECT_LE(s.lookupPeerMessagesMax, 4u) << "two queries and two pins at most";
  hit->release();
  expectNoLeakedBlocks(c[2]);
}

TEST(Cluster, ABlockOnlyInAColdTierIsServed) {
  std::vector<NodeSpec> specs = nodes(2);
  specs[0].coldTier = true;
  Cluster c(specs);
  ASSERT_TRUE(c.formed(2));
  putPrompt(c[0], "doc", 3, 160);  // 10 blocks
  // A graceful restart writes them to disk; the new process holds them only there.
  c[0].stop(SIGTERM);
  c.start(0);
  ASSERT_TRUE(c.formed(2));
  ASSERT_TRUE(c.published(0));
  EXPECT_EQ(c[0].connect()->stats().value().blocksUsed, 0u);
  auto client = c[1].connect();
  const Hit hit = lookupPrompt(*client, 3, 160);
  EXPECT_EQ(hit.matched, 160u);
  EXPECT_TRUE(hit.identical);
  EXPECT_EQ(client->stats().value().remoteHitBlocks, 10u);
  EXPECT_GE(c[0].connect()->stats().value().promoted, 10u);  // read back from disk to serve
}

TEST(ClusterEtcd, MembersJoinThroughEtcdAndADeadNodeLeavesWithinTheLeaseTtl) {
  if (!EtcdProcess::available()) GTEST_SKIP() << "no etcd binary (package etcd-server)";
  EtcdProcess etcd;
  Cluster c(nodes(3), etcd.endpoint());
  ASSERT_TRUE(c.formed(3));
  putPrompt(c[0], "e", 21, 64);
  ASSERT_TRUE(c.published(0));
  auto client = c[1].connect();
  EXPECT_EQ(lookupPrompt(*client, 21, 64).matched, 64u);
  // kill -9: no goodbye; the lease (TTL 2 s) expires and the others see the node leave.
  const auto t0 = Clock::now();
  c[2].stop(SIGKILL);
  ASSERT_TRUE(eventually([&] { return client->stats().value().clusterMembersUp == 2; },
                         std::chrono::seconds(10)));
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LE(seconds, 2.0 + 2.0) << "lease TTL 2 s plus a second, with a second of slack";
  // A graceful stop revokes the lease at once.
  c[0].stop(SIGTERM);
  EXPECT_TRUE(eventually([&] { return client->stats().value().clusterMembersUp == 1; },
                         std::chrono::seconds(2)));
}

TEST(ClusterEtcd, EtcdDownAndBackUnderALookupLoadCostsAtMostMisses) {
  if (!EtcdProcess::available()) GTEST_SKIP() << "no etcd binary (package etcd-server)";
  EtcdProcess etcd;
  Cluster c(nodes(2), etcd.endpoint());
  ASSERT_TRUE(c.formed(2));
  for (uint64_t seed = 30; seed < 40; ++seed) putPrompt(c[0], "s" + std::to_string(seed), seed, 64);
  ASSERT_TRUE(c.published(0));
  std::atomic<bool> stop = false;
  std::atomic<int> lookups = 0, wrong = 0, errors = 0, hits = 0;
  std::thread load([&] {
    auto client = c[1].connect();
    auto space = client->open(testLayout()).value();
    for (uint64_t i = 0; !stop; ++i) {
      const uint64_t seed = 30 + i % 10;
      const auto t = synthetic::tokens(seed, 64);
      auto hit = space->lookup(t);
      ++lookups;
      if (!hit) {
        ++errors;
        continue;
      }
      std::vector<uint8_t> got(hit->matchedTokens() * testLayout().tokenKvBytes());
      if (!hit->copyTo(0, hit->matchedTokens(), got.data(), got.size()).ok() ||
          got != synthetic::packedKv(testLayout(), t, 0, hit->matchedTokens())) {
        ++wrong;
      }
      hits += hit->matchedTokens() == 64;
      // Evict nothing on purpose; new blocks are fetched only once, then hit locally.
    }
  });
  eventually([&] { return lookups > 20; }, std::chrono::seconds(10));
  etcd.stop();
  // With etcd down the members keep the last membership they saw.
  const int before = lookups;
  eventually([&] { return lookups > before + 50; }, std::chrono::seconds(10));
  EXPECT_EQ(c[1].connect()->stats().value().clusterMembersUp, 2u);
  etcd.restart();
  ASSERT_TRUE(c.formed(2));
  const int after = lookups;
  eventually([&] { return lookups > after + 50; }, std::chrono::seconds(10));
  stop = true;
  load.join();
  EXPECT_EQ(errors, 0);
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(hits, 0);
  // A node that joins after etcd came back finds the others.
  putPrompt(c[0], "late", 41, 64);
  ASSERT_TRUE(c.published(0));
  auto client = c[1].connect();
  EXPECT_EQ(lookupPrompt(*client, 41, 64).matched, 64u);
}

TEST(ClusterStart, AListenerOffLoopbackWithoutAStrongTokenRefusesToStart) {
  TempDir dir;
  std::ofstream(dir.file("short")) << "too-short";
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--listen", "0.0.0.0:0"},
        std::vector<std::string>{"--listen", "0.0.0.0:0", "--cluster-token-file",
                                 dir.file("short")}}) {
    EXPECT_THROW(DaemonProcess(16 << 20, dir.path() + "/data", extra), std::runtime_error);
  }
  // On loopback no token is needed.
  DaemonProcess ok(16 << 20, dir.path() + "/data", {"--listen", "127.0.0.1:0"});
  EXPECT_NE(ok.peerAddr(), "off");
}

TEST(Cluster, PrefetchAnswersWithTheLocalHitAndFetchesTheRestBehind) {
  Cluster c(nodes(2));
  ASSERT_TRUE(c.formed(2));
  putPrompt(c[0], "pf", 14, 128);
  ASSERT_TRUE(c.published(0));
  auto client = c[1].connect();
  EXPECT_EQ(lookupPrompt(*client, 14, 128, RemoteMode::kPrefetch).matched, 0u);  // nothing local
  ASSERT_TRUE(eventually([&] { return client->stats().value().remoteHitBlocks == 8; },
                         std::chrono::seconds(10)));
  const Hit hit = lookupPrompt(*client, 14, 128, RemoteMode::kLocal);
  EXPECT_EQ(hit.matched, 128u);
  EXPECT_TRUE(hit.identical);
}

TEST(Cluster, AMemberJoiningMovesOnlyTheKeysItBecomesHomeFor) {
  Cluster c(nodes(5), "", 4);
  ASSERT_TRUE(c.formed(4));
  constexpr uint64_t kBlocks = 600;
  putPrompt(c[0], "many", 15, kBlocks * 16);
  ASSERT_TRUE(c.published(0));
  auto client = c[0].connect();
  const Stats before = client->stats().value();
  EXPECT_EQ(before.heldKeys, kBlocks);
  c.start(4);
  ASSERT_TRUE(c.formed(5));
  ASSERT_TRUE(c.published(0));
  const Stats after = client->stats().value();
  // Entries: one per key, filed under its segment's anchor, plus each of the 10 anchors under
  // every anchor before it (0 + 1 + ... + 9); each at three homes.
  constexpr uint64_t kEntries = kBlocks + 45;
  // The ring: the newcomer becomes one of the homes of the anchors near its points, and only the
  // entries filed under those are sent again (one add each, in batches), all of them to it.
  const uint64_t moved = after.directoryRehomed - before.directoryRehomed;
  EXPECT_GT(moved, 0u);
  EXPECT_LT(moved, kEntries);
  EXPECT_EQ(after.heldKeys, kBlocks);
  std::printf("membership 4 -> 5: %lu of %lu entries re-sent\n", static_cast<unsigned long>(moved),
              static_cast<unsigned long>(kEntries));
  // Every node's directory together holds each entry three times (the others dropped what the
  // newcomer took).
  ASSERT_TRUE(eventually(
      [&] {
        uint64_t entries = 0;
        for (size_t i = 0; i < 5; ++i) entries += c[i].connect()->stats().value().directoryEntries;
        return entries == 3 * kEntries;
      },
      std::chrono::seconds(10)));
  EXPECT_EQ(c[4].connect()->stats().value().directoryEntries, moved);
  // The newcomer finds the blocks through its own directory and the others'.
  auto newcomer = c[4].connect();
  const Hit hit = lookupPrompt(*newcomer, 15, kBlocks * 16);
  EXPECT_EQ(hit.matched, kBlocks * 16);
  EXPECT_TRUE(hit.identical);
}

// --- a cluster of ten: what a remote lookup costs, from the daemons' own counters

// A prompt that opens with a shared system prompt of `shared` tokens, then its own tokens.
std::vector<uint32_t> promptTokens(uint64_t seed, size_t shared, size_t tokens) {
  auto t = synthetic::tokens(7, shared);
  const auto own = synthetic::tokens(seed, tokens - shared);
  t.insert(t.end(), own.begin(), own.end());
  return t;
}

TEST(ClusterScale, TenDaemonsAnswerALookupWithOneDirectoryQueryAndAtMostTwoPins) {
  constexpr size_t kNodes = 10, kPrompts = 30, kShared = 70 * 16;
  std::vector<NodeSpec> specs = nodes(kNodes);
  specs[3].extraArgs = {"--metrics-addr", "127.0.0.1:0"};
  Cluster c(specs);
  ASSERT_TRUE(c.formed(kNodes, std::chrono::seconds(30)));
  const Layout layout = testLayout();
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<Space>> spaces;
  for (size_t i = 0; i < kNodes; ++i) {
    clients.push_back(c[i].connect());
    spaces.push_back(clients[i]->open(layout).value());
  }
  // 30 prompts of 130 to 275 blocks (2,080 to 4,400 tokens) sharing a 70-block system prompt,
  // each put on one node. The system prompt ends in the second segment, whose anchor every
  // lookup would ask about: it becomes hot, and lookups ask the home of their third one.
  std::vector<std::vector<uint32_t>> prompts;
  for (size_t p = 0; p < kPrompts; ++p) {
    prompts.push_back(promptTokens(100 + p, kShared, (130 + 5 * p) * 16));
    const auto kv = synthetic::packedKv(layout, prompts[p], 0, prompts[p].size());
    ASSERT_TRUE(
        spaces[p % kNodes]->put("p" + std::to_string(p), 0, prompts[p], kv.data(), kv.size()).ok());
  }
  for (size_t i = 0; i < kNodes; ++i) ASSERT_TRUE(c.published(i));
  auto lookup = [&](size_t node, const std::vector<uint32_t>& t) {
    auto hit = spaces[node]->lookup(t, LookupOptions{.remote = RemoteMode::kFetch});
    EXPECT_TRUE(hit.ok()) << hit.error().toString();
    if (!hit) return uint64_t{0};
    const uint64_t matched = hit->matchedTokens();
    std::vector<uint8_t> got(matched * layout.tokenKvBytes());
    EXPECT_TRUE(hit->copyTo(0, matched, got.data(), got.size()).ok());
    EXPECT_TRUE(got == synthetic::packedKv(layout, t, 0, matched))
        << "wrong bytes on node " << node;
    return matched;
  };
  // Each prompt looked up on five other nodes: a whole hit each time, from one holder. After
  // the first round the system prompt's anchor is hot, and a few heartbeats later every node
  // knows.
  auto directoryQueries = [&] {
    std::vector<uint64_t> out;
    for (size_t i = 0; i < kNodes; ++i) out.push_back(clients[i]->stats().value().directoryQueries);
    return out;
  };
  for (size_t p = 0; p < kPrompts; ++p) {
    EXPECT_EQ(lookup((p + 3) % kNodes, prompts[p]), prompts[p].size()) << "prompt " << p;
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const auto queriesBefore = directoryQueries();
  for (size_t p = 0; p < kPrompts; ++p) {
    for (size_t hop : {1, 5, 7, 9}) {
      EXPECT_EQ(lookup((p + hop) % kNodes, prompts[p]), prompts[p].size()) << "prompt " << p;
    }
  }
  const auto queriesAfter = directoryQueries();
  uint64_t lookups = 0, messages = 0, queries = 0, busiest = 0;
  std::string perNode;  // the second round's queries each node answered, for a failure's message
  for (size_t i = 0; i < kNodes; ++i) {
    const Stats s = clients[i]->stats().value();
    lookups += s.remoteLookups;
    messages += s.lookupPeerMessages;
    const uint64_t answered = queriesAfter[i] - queriesBefore[i];
    queries += answered;
    busiest = std::max(busiest, answered);
    perNode += " n" + std::to_string(i) + "=" + std::to_string(answered);
    EXPECT_LE(s.lookupPeerMessagesMax, 3u) << "node " << i << ": a query and two pins at most";
  }
  ASSERT_EQ(lookups, 5 * kPrompts);
  ASSERT_GT(queries, 0u);
  const double perLookup = double(messages) / double(lookups);
  const double spread = double(busiest) / (double(queries) / kNodes);
  std::printf(
      "10 daemons: %lu remote lookups, %.2f peer messages a lookup; second round: %lu "
      "directory queries, busiest/mean %.2f\n",
      static_cast<unsigned long>(lookups), perLookup, static_cast<unsigned long>(queries), spread);
  EXPECT_LE(perLookup, 3.0);
  // The hot anchor's home is no longer asked for it: the load is the 30 prompts' own anchors on
  // 10 homes (busiest/mean 1.4-1.8 here; which of an anchor's three homes a lookup asks follows
  // the load the heartbeats report, so it moves a little with timing). Were the system prompt's
  // homes still asked, they would answer most queries: 3.0 or more.
  EXPECT_LE(spread, 2.5) << "queries answered in the second round:" << perNode;
  // A prompt nobody holds past the system prompt: one message (the home says nobody) at most.
  for (size_t i = 0; i < kNodes; ++i) {
    const uint64_t before = clients[i]->stats().value().lookupPeerMessages;
    const uint64_t matched = lookup(i, promptTokens(900 + i, kShared, 150 * 16));
    EXPECT_LE(matched, kShared) << "nothing past the shared prompt is anywhere";
    EXPECT_LE(clients[i]->stats().value().lookupPeerMessages - before, 1u) << "node " << i;
  }
  // The same counters on /metrics.
  const Stats s3 = clients[3]->stats().value();
  const std::string page = httpGet(c[3].metricsAddr(), "/metrics");
  EXPECT_NE(page.find("\nkvtier_lookup_peer_messages_total " +
                      std::to_string(s3.lookupPeerMessages) + "\n"),
            std::string::npos)
      << page;
  EXPECT_NE(
      page.find("\nkvtier_directory_queries_total " + std::to_string(s3.directoryQueries) + "\n"),
      std::string::npos);
  spaces.clear();
  clients.clear();
  for (size_t i = 0; i < kNodes; ++i) expectNoLeakedBlocks(c[i]);
}

TEST(Cluster, TheCliListsTheMembersAndTheMetricsCountTheCluster) {
  std::vector<NodeSpec> specs = nodes(3);
  specs[1].extraArgs = {"--metrics-addr", "127.0.0.1:0"};
  Cluster c(specs);
  ASSERT_TRUE(c.formed(3));
  putPrompt(c[0], "m", 17, 64);
  ASSERT_TRUE(c.published(0));
  auto reader = c[1].connect();
  ASSERT_EQ(lookupPrompt(*reader, 17, 64).matched, 64u);
  const std::string page = httpGet(c[1].metricsAddr(), "/metrics");
  EXPECT_NE(page.find("\nkvtier_cluster_members_up 3\n"), std::string::npos) << page;
  EXPECT_NE(page.find("\nkvtier_remote_hit_blocks_total 4\n"), std::string::npos) << page;
  EXPECT_NE(page.find("\nkvtier_fetch_errors_total{kind=\"checksum\"} 0\n"), std::string::npos);
  EXPECT_NE(page.find("kvtier_directory_entries"), std::string::npos);
  std::string out;
  ASSERT_EQ(runTool({"--socket", c[1].socket(), "cluster"}, &out), 0) << out;
  EXPECT_NE(out.find("n1 "), std::string::npos) << out;
  EXPECT_NE(out.find("(this node)"), std::string::npos) << out;
  size_t up = 0;
  for (size_t at = out.find(" up"); at != std::string::npos; at = out.find(" up", at + 1)) ++up;
  EXPECT_EQ(up, 3u) << out;
  c[2].stop(SIGTERM);
  ASSERT_TRUE(eventually([&] { return c[1].connect()->stats().value().clusterMembersUp == 2; },
                         std::chrono::seconds(10)));
  ASSERT_EQ(runTool({"--socket", c[1].socket(), "cluster"}, &out), 0) << out;
  EXPECT_NE(out.find("down"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvtier::test
