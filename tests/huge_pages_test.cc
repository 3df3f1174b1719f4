// The host pool's pages (kvtierd --huge-pages), with real daemons: a pool on 2 MiB hugetlb pages
// that clients map through descriptors handed over the daemon's socket, a pool on 4 KiB pages
// mapped by name, the fallback under auto and its reason, on refusing to start without huge pages,
// and what a SIGKILLed daemon leaves behind for each kind.
//
// Tests that need huge pages reserve them (vm.nr_hugepages, root only) and give them back, and
// skip, saying why, where they cannot (tests/huge_page_reservation.h).
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <fstream>

#include <string>
#include <vector>

#include "tests/huge_page_reservation.h"
#include "tests/test_support.h"
#include "tools/synthetic_kv.h"

namespace kvtier {
namespace {

using test::DaemonProcess;
using test::HugePageReservation;
using test::runPeer;
using test::testLayout;

constexpr uint64_t kHugePage = uint64_t{2} << 20;
constexpr uint64_t kPoolPages = 8;  // the pool of the huge-page daemons: 16 MiB
constexpr uint64_t kPoolBytes = kPoolPages * kHugePage;

// The value of `name` on a ready line ("" if absent), a quoted one without its quotes.
std::string readyField(const std::string& line, const std::string& name) {
  const size_t at = line.find(" " + name + "=");
  if (at == std::string::npos) return "";
  size_t from = at + name.size() + 2;
  if (line[from] == '"') return line.substr(from + 1, line.find('"', from + 1) - from - 1);
  return line.substr(from, line.find(' ', from) - from);
}

// Whether `reason` reads "only K huge pages free, N needed" with K < N.
bool saysTooFew(const std::string& reason, uint64_t needed) {
  const std::string tail = " huge pages free, " + std::to_string(needed) + " needed";
  if (!reason.starts_with("only ") || !reason.ends_with(tail)) return false;
  const std::string k = reason.substr(5, reason.size() - 5 - tail.size());
  return !k.empty() && k.find_first_not_of("0123456789") == std::string::npos &&
         std::stoull(k) < needed;
}

// A peer process puts a prompt through its own mapping of the pool; a client of this process,
// mapping it too, reads the same bytes in place.
void putByOneProcessAndReadByAnother(const DaemonProcess& daemon, uint64_t seed) {
  std::string out;
  ASSERT_EQ(runPeer({"put", daemon.socket(), "prompt", std::to_string(seed), "100"}, &out), 0)
      << out;
  EXPECT_NE(out.find("sealed=6"), std::string::npos) << out;
  EXPECT_NE(out.find("mapped=1"), std::string::npos)
      << "the writer moved its bytes inline: " << out;
  auto client = daemon.connect();
  auto space = client->open(testLayout()).value();
  ASSERT_TRUE(client->mapped());
  const auto tokens = synthetic::tokens(seed, 100);
  auto hit = space->lookup(tokens).value();
  ASSERT_EQ(hit.matchedTokens(), 96u);
  EXPECT_FALSE(hit.inlineData());
  std::vector<uint8_t> got(96 * testLayout().tokenKvBytes());
  ASSERT_TRUE(hit.copyTo(0, 96, got.data(), got.size()).ok());
  EXPECT_EQ(got, synthetic::packedKv(testLayout(), tokens, 0, 96));
}

// Reserves kPoolPages huge pages, or skips the test saying why.
#define RESERVE_POOL_PAGES(name)                        \
  auto name = HugePageReservation::reserve(kPoolPages); \
  if (!name)                                            \
    GTEST_SKIP() << "cannot reserve " << kPoolPages << " huge pages of 2 MiB: " << name.error();

TEST(HugePages, ClientsMapAHugePagePoolAndReadWhatAnotherProcessPut) {
  RESERVE_POOL_PAGES(reservation);
  const uint64_t before = HugePageReservation::available();
  DaemonProcess daemon(kPoolBytes, "", {"--huge-pages", "on", "--metrics-addr", "127.0.0.1:0"});
  EXPECT_EQ(readyField(daemon.readyLine(), "pool_pages"), "hugetlb-2M") << daemon.readyLine();
  EXPECT_EQ(readyField(daemon.readyLine(), "pool_pages_reason"), "") << daemon.readyLine();
  EXPECT_EQ(HugePageReservation::available(), before - kPoolPages);
  // The memory has no name: nothing under /dev/shm.
  EXPECT_TRUE(test::shmSegments(daemon.segmentPrefix()).empty());
  putByOneProcessAndReadByAnother(daemon, 41);

  auto stats = daemon.connect()->stats().value();
  EXPECT_EQ(stats.poolPages, "hugetlb-2M");
  EXPECT_EQ(stats.poolPagesReason, "");
  EXPECT_NE(stats.toJson().find("\"pool\": {\"pages\": \"hugetlb-2M\", \"reason\": \"\"}"),
            std::string::npos)
      << stats.toJson();
  EXPECT_NE(test::httpGet(daemon.metricsAddr(), "/metrics").find("\nkvtier_pool_huge_pages 1\n"),
            std::string::npos);
}

TEST(HugePages, ClientsMapAFourKiBPoolAndReadWhatAnotherProcessPut) {
  DaemonProcess daemon(kPoolBytes, "", {"--huge-pages", "off"});
  EXPECT_EQ(readyField(daemon.readyLine(), "pool_pages"), "4k") << daemon.readyLine();
  EXPECT_EQ(readyField(daemon.readyLine(), "pool_pages_reason"), "huge pages off");
  EXPECT_EQ(test::shmSegments(daemon.segmentPrefix()).size(), 1u);
  putByOneProcessAndReadByAnother(daemon, 42);
  auto stats = daemon.connect()->stats().value();
  EXPECT_EQ(stats.poolPages, "4k");
  EXPECT_EQ(stats.poolPagesReason, "huge pages off");
}

// Under auto (the default) a daemon that cannot have huge pages for its whole pool starts on
// 4 KiB pages and says why: on its ready line, in stats and in the metrics.
TEST(HugePages, AutoFallsBackToFourKiBPagesAndSaysWhy) {
  auto lock = HugePageReservation::reserve(0);  // no other test reserves any meanwhile
  ASSERT_TRUE(lock.ok()) << lock.error();
  const uint64_t free = HugePageReservation::available();
  if (free > 256) GTEST_SKIP() << "this machine has " << free << " huge pages free";
  const uint64_t needed = free + 1;
  DaemonProcess daemon(needed * kHugePage, "",
                       {"--huge-pages", "auto", "--metrics-addr", "127.0.0.1:0"});
  EXPECT_EQ(readyField(daemon.readyLine(), "pool_pages"), "4k") << daemon.readyLine();
  const std::string reason = readyField(daemon.readyLine(), "pool_pages_reason");
  EXPECT_TRUE(saysTooFew(reason, needed)) << daemon.readyLine();
  auto stats = daemon.connect()->stats().value();
  EXPECT_EQ(stats.poolPages, "4k");
  EXPECT_EQ(stats.poolPagesReason, reason);
  EXPECT_NE(test::httpGet(daemon.metricsAddr(), "/metrics").find("\nkvtier_pool_huge_pages 0\n"),
            std::string::npos);
  putByOneProcessAndReadByAnother(daemon, 43);
}

TEST(HugePages, OnRefusesToStartWithoutThem) {
  auto lock = HugePageReservation::reserve(0);
  ASSERT_TRUE(lock.ok()) << lock.error();
  const uint64_t free = HugePageReservation::available();
  if (free > 256) GTEST_SKIP() << "this machine has " << free << " huge pages free";
  std::string out;
  const int rc =
      test::runDaemonExpectingFailure((free + 1) * kHugePage, {"--huge-pages", "on"}, &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("event=startup_failed reason=\"--huge-pages on: no pool on 2 MiB huge "
                     "pages: only "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("echo N > /proc/sys/vm/nr_hugepages"), std::string::npos) << out;
}

// A pool larger than the memory the daemon can have is refused at start, with the figures, before
// any of it is allocated (it was killed by the OOM killer while faulting the pool in, leaving its
// segments behind).
TEST(PoolMemory, APoolLargerThanTheMemoryThereIsIsRefusedAtStartAndLeavesNoSegment) {
  std::ifstream meminfo("/proc/meminfo");
  uint64_t totalKiB = 0;
  for (std::string line; std::getline(meminfo, line);) {
    if (line.starts_with("MemTotal:")) totalKiB = std::stoull(line.substr(9));
  }
  ASSERT_GT(totalKiB, 0u);
  std::string out;
  const int rc =
      test::runDaemonExpectingFailure(2 * totalKiB * 1024, {"--huge-pages", "off"}, &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("event=startup_failed reason=\"a host pool of "), std::string::npos) << out;
  EXPECT_NE(out.find(" does not fit the memory this process can have (MemAvailable "),
            std::string::npos)
      << out;
  const size_t at = out.find(" segments=");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string prefix = out.substr(at + 10, out.find_first_of(" \n", at + 10) - at - 10);
  ASSERT_FALSE(prefix.empty());
  EXPECT_TRUE(test::shmSegments(prefix).empty());
}

// A SIGKILLed daemon on huge pages leaves nothing: its memory had no name and goes with the last
// process that maps it, so its pages are free again at once and a restart has them.
TEST(HugePages, ACrashedHugePageDaemonLeavesNothingAndARestartWorks) {
  RESERVE_POOL_PAGES(reservation);
  const uint64_t before = HugePageReservation::available();
  std::string dataDir, prefix;
  {
    DaemonProcess crashed(kPoolBytes, "", {"--huge-pages", "on"});
    dataDir = crashed.dataDir();
    prefix = crashed.segmentPrefix();
    std::string out;
    ASSERT_EQ(runPeer({"put", crashed.socket(), "prompt", "44", "100"}, &out), 0) << out;
    EXPECT_EQ(HugePageReservation::available(), before - kPoolPages);
    const int status = crashed.stop(SIGKILL);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  }
  EXPECT_TRUE(test::shmSegments(prefix).empty());
  EXPECT_EQ(HugePageReservation::available(), before);
  // The same data directory: the restart has all the pages it needs.
  DaemonProcess restarted(kPoolBytes, dataDir, {"--huge-pages", "on"});
  EXPECT_EQ(readyField(restarted.readyLine(), "pool_pages"), "hugetlb-2M");
  putByOneProcessAndReadByAnother(restarted, 45);
}

// A SIGKILLed daemon on 4 KiB pages leaves its named segments; the next daemon on the same data
// directory removes them and makes its own, and a clean stop then leaves nothing.
TEST(HugePages, ACrashedFourKiBDaemonsSegmentsGoAtRestartAndNothingIsLeftAfter) {
  std::string dataDir, prefix;
  {
    DaemonProcess crashed(kPoolBytes, "", {"--huge-pages", "off"});
    dataDir = crashed.dataDir();
    prefix = crashed.segmentPrefix();
    crashed.stop(SIGKILL);
  }
  EXPECT_EQ(test::shmSegments(prefix).size(), 1u);
  {
    DaemonProcess restarted(kPoolBytes, dataDir, {"--huge-pages", "off"});
    EXPECT_EQ(test::shmSegments(prefix).size(), 1u);
    putByOneProcessAndReadByAnother(restarted, 46);
    const int status = restarted.stop(SIGTERM);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  EXPECT_TRUE(test::shmSegments(prefix).empty());
}

}  // namespace
}  // namespace kvtier
