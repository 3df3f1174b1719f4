// Cold tier with real kvtierd processes: spill past memory, promote on lookup, keep the cache
// across restarts (graceful and SIGKILL), and never serve a corrupt record.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "daemon/cold_tier.h"
#include "tests/test_support.h"
#include "tools/synthetic_kv.h"

namespace kvtier {
namespace {

using test::DaemonProcess;
using test::testLayout;

constexpr uint64_t kBlockBytes = 16 << 10;  // testLayout()'s block
constexpr uint64_t kPromptTokens = 64;      // 4 blocks

std::vector<std::string> coldOn() { return {"--cold-tier", "on"}; }

std::vector<uint32_t> prompt(uint64_t i) { return synthetic::tokens(1000 + i, kPromptTokens); }

// Puts prompt i and drops its sequence: its sealed blocks stay cached, held by nothing.
void putPrompt(Space& space, uint64_t i) {
  const auto t = prompt(i);
  const auto kv = synthetic::packedKv(testLayout(), t, 0, t.size());
  auto r = space.put("p", 0, t, kv.data(), kv.size());
  ASSERT_TRUE(r.ok()) << "prompt " << i << ": " << r.error();
  ASSERT_TRUE(space.remove("p", 0).ok());
}

// Looks prompt i up; returns the tokens matched, after checking their bytes are the right ones.
uint64_t matchedWithRightBytes(Space& space, uint64_t i) {
  const auto t = prompt(i);
  auto hit = space.lookup(t);
  EXPECT_TRUE(hit.ok()) << hit.error();
  if (!hit) return 0;
  const uint64_t n = hit->matchedTokens();
  std::vector<uint8_t> got(n * testLayout().tokenKvBytes());
  EXPECT_TRUE(hit->copyTo(0, n, got.data(), got.size()).ok());
  EXPECT_EQ(got, synthetic::packedKv(testLayout(), t, 0, n)) << "wrong bytes for prompt " << i;
  EXPECT_EQ(n % testLayout().blockTokens, 0u);
  return n;
}

TEST(ColdIntegration, FillingFarPastMemoryEveryPrefixStillHitsFromDisk) {
  DaemonProcess daemon(16 * kBlockBytes, "", coldOn());  // 16 blocks of memory
  auto client = daemon.connect();
  auto space = client->open(testLayout()).value();
  constexpr uint64_t kPrompts = 30;  // 120 blocks: 7.5x the pool
  for (uint64_t i = 0; i < kPrompts; ++i) putPrompt(*space, i);
  for (uint64_t i = 0; i < kPrompts; ++i) {
    EXPECT_EQ(matchedWithRightBytes(*space, i), kPromptTokens) << "prompt " << i;
  }
  const Stats s = client->stats().value();
  EXPECT_GE(s.spilled, kPrompts * 4 - 16);
  EXPECT_GT(s.promoted, 0u);
  EXPECT_EQ(s.corruptDropped, 0u);
  EXPECT_EQ(s.evictedUnspilled, 0u);
}

TEST(ColdIntegration, GracefulRestartServesEverythingWrittenBefore) {
  std::string dataDir;
  {
    DaemonProcess first(16 * kBlockBytes, "", coldOn());
    dataDir = first.dataDir();
    auto client = first.connect();
    auto space = client->open(testLayout()).value();
    for (uint64_t i = 0; i < 10; ++i) putPrompt(*space, i);
    // One prompt still held by a live detached sequence: flushed at shutdown.
    const auto t = prompt(99);
    const auto kv = synthetic::packedKv(testLayout(), t, 0, t.size());
    ASSERT_TRUE(space->put("held", 0, t, kv.data(), kv.size(), {.detached = true}).ok());
    space.reset();
    client.reset();
    const int status = first.stop(SIGTERM);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  DaemonProcess second(16 * kBlockBytes, dataDir, coldOn());
  auto client = second.connect();
  auto space = client->open(testLayout()).value();
  for (uint64_t i = 0; i < 10; ++i) EXPECT_EQ(matchedWithRightBytes(*space, i), kPromptTokens);
  EXPECT_EQ(matchedWithRightBytes(*space, 99), kPromptTokens);
}

TEST(ColdIntegration, SigkillWhileSpillingLeavesHitsOrMissesNeverWrongBytes) {
  std::string dataDir;
  {
    DaemonProcess first(16 * kBlockBytes, "", coldOn());
    dataDir = first.dataDir();
    auto client = first.connect();
    auto space = client->open(testLayout()).value();
    for (uint64_t i = 0; i < 20; ++i) putPrompt(*space, i);
    // Killed with spill batches likely still in flight and blocks only in memory.
    first.stop(SIGKILL);
  }
  DaemonProcess second(16 * kBlockBytes, dataDir, coldOn());
  auto client = second.connect();
  auto space = client->open(testLayout()).value();
  uint64_t hits = 0;
  for (uint64_t i = 0; i < 20; ++i) hits += matchedWithRightBytes(*space, i) > 0;
  // The pool could not hold them all, so most had to be on disk before the kill.
  EXPECT_GE(hits, 10u);
}

TEST(ColdIntegration, CorruptRecordsOnDiskMissAndAreCounted) {
  std::string dataDir;
  {
    DaemonProcess first(16 * kBlockBytes, "", coldOn());
    dataDir = first.dataDir();
    auto client = first.connect();
    auto space = client->open(testLayout()).value();
    for (uint64_t i = 0; i < 6; ++i) putPrompt(*space, i);
    space.reset();
    client.reset();
    ASSERT_EQ(first.stop(SIGTERM), 0);
  }
  // Flip one payload byte in half of the records, through RocksDB itself.
  uint64_t flipped = 0;
  {
    auto tier =
        ColdTier::open({.path = dataDir + "/cold", .capacityBytes = 0, .fileSystem = nullptr})
            .value();
    auto* db = tier->rawDb();
    std::unique_ptr<rocksdb::Iterator> it(
        db->NewIterator(rocksdb::ReadOptions(), tier->blocksFamily()));
    std::vector<std::pair<std::string, std::string>> edits;
    uint64_t n = 0;
    for (it->SeekToFirst(); it->Valid(); it->Next(), ++n) {
      if (n % 2 != 0) continue;
      std::string value = it->value().ToString();
      value[value.size() - 1] ^= 0x40;
      edits.emplace_back(it->key().ToString(), std::move(value));
    }
    it.reset();
    for (const auto& [k, v] : edits) {
      ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), tier->blocksFamily(), k, v).ok());
    }
    flipped = edits.size();
    ASSERT_GT(flipped, 0u);
  }
  DaemonProcess second(16 * kBlockBytes, dataDir, coldOn());
  auto client = second.connect();
  auto space = client->open(testLayout()).value();
  uint64_t full = 0;
  for (uint64_t i = 0; i < 6; ++i) full += matchedWithRightBytes(*space, i) == kPromptTokens;
  EXPECT_LT(full, 6u) << "some prompts lost a block to corruption";
  const Stats s = client->stats().value();
  EXPECT_GT(s.corruptDropped, 0u);
  EXPECT_LE(s.corruptDropped, flipped);
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

TEST(ColdIntegration, KvtierStatsPrintsTheCountersAsJson) {
  DaemonProcess daemon(16 * kBlockBytes, "", coldOn());
  {
    auto client = daemon.connect();
    auto space = client->open(testLayout()).value();
    for (uint64_t i = 0; i < 8; ++i) putPrompt(*space, i);  // 32 blocks through 16: spills
    EXPECT_EQ(matchedWithRightBytes(*space, 0), kPromptTokens);
  }
  std::string out;
  ASSERT_EQ(test::runTool({"--socket", daemon.socket(), "stats"}, &out), 0) << out;
  for (const char* key :
       {"\"blocks\": {\"total\": 16",
        "\"used\":", "\"pinned\":", "\"hits\":", "\"misses\":", "\"evictions\":", "\"clients\": 1",
        "\"bytes\":", "\"cold\": {\"spilled\":", "\"promoted\":", "\"corrupt_dropped\": 0",
        "\"spill_errors\": 0"}) {
    EXPECT_NE(out.find(key), std::string::npos) << key << " missing from: " << out;
  }
  EXPECT_EQ(out.find("\"spilled\": 0,"), std::string::npos) << out;
  // A daemon that is not there: a clear error and a non-zero exit.
  EXPECT_NE(test::runTool({"--socket", "/tmp/kvtier-nothing-here.sock", "stats"}, &out), 0);
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

// A plain HTTP/1.1 GET over a TCP socket to the daemon's metrics address; the whole response.
std::string httpGet(const std::string& addr, const std::string& path) {
  const size_t colon = addr.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
  inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) return "";
  // Read the headers, then exactly Content-Length bytes (the server may keep the connection open).
  std::string out;
  char buf[4096];
  size_t want = std::string::npos;
  while (want == std::string::npos || out.size() < want) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    const size_t end = out.find("\r\n\r\n");
    const size_t cl = out.find("Content-Length: ");
    if (want == std::string::npos && end != std::string::npos && cl != std::string::npos) {
      want = end + 4 + std::stoul(out.substr(cl + 16));
    }
  }
  close(fd);
  return out;
}

TEST(ColdIntegration, MetricsEndpointServesPrometheusText) {
  DaemonProcess daemon(16 * kBlockBytes, "",
                       {"--cold-tier", "on", "--metrics-addr", "127.0.0.1:0"});
  ASSERT_NE(daemon.metricsAddr(), "off");
  {
    auto client = daemon.connect();
    auto space = client->open(testLayout()).value();
    for (uint64_t i = 0; i < 8; ++i) putPrompt(*space, i);
    EXPECT_EQ(matchedWithRightBytes(*space, 0), kPromptTokens);
  }
  const std::string page = httpGet(daemon.metricsAddr(), "/metrics");
  ASSERT_NE(page.find("200 OK"), std::string::npos) << page;
  for (const char* line :
       {"# TYPE kvtier_blocks_total gauge", "kvtier_blocks_total 16",
        "# TYPE kvtier_spilled_blocks_total counter", "kvtier_cold_records ",
        "kvtier_cold_corrupt_dropped_total 0", "kvtier_promoted_blocks_total "}) {
    EXPECT_NE(page.find(line), std::string::npos) << line << " missing from:\n" << page;
  }
  EXPECT_NE(httpGet(daemon.metricsAddr(), "/other").find("404"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
