#include "transport/host_pool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "tests/huge_page_reservation.h"
#include "tests/temp_dir.h"

namespace kvtier {
namespace {

using test::HugePageReservation;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A unique segment prefix for this test process.
std::string testPrefix() { return "kvtier-pooltest-" + std::to_string(::getpid()) + "-"; }

// Names under /dev/shm starting with `prefix`.
std::vector<std::string> shmNames(const std::string& prefix) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(prefix)) names.push_back(name);
  }
  return names;
}

// The fields of this process's /proc/self/smaps entry for the mapping that starts at `address`,
// in kB ("Rss", "KernelPageSize", "Shared_Hugetlb", ...); empty if there is none.
std::map<std::string, uint64_t> smapsOf(const void* address) {
  std::ifstream in("/proc/self/smaps");
  std::map<std::string, uint64_t> fields;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    const size_t dash = line.find('-');
    const size_t space = line.find(' ');
    const bool header = dash != std::string::npos && space != std::string::npos && dash < space &&
                        line.find(':') > space;
    if (header) {
      if (inside) break;
      inside =
          std::stoull(line.substr(0, dash), nullptr, 16) == reinterpret_cast<uintptr_t>(address);
      continue;
    }
    if (!inside) continue;
    const size_t colon = line.find(':');
    std::istringstream value(line.substr(colon + 1));
    uint64_t kb = 0;
    if (value >> kb) fields[line.substr(0, colon)] = kb;
  }
  return fields;
}

// A copy of the kernel's hugepages-2048kB counts directory saying `available` pages are free.
class FakeCounts {
 public:
  explicit FakeCounts(uint64_t available) {
    write("nr_hugepages", available);
    write("free_hugepages", available);
    write("resv_hugepages", 0);
  }
  const std::string& path() const { return dir_.path(); }

 private:
  void write(const std::string& name, uint64_t value) {
    std::ofstream(dir_.file(name)) << value << "\n";
  }
  test::TempDir dir_;
};

TEST(HugePages, TheShortfallSaysWhyAPoolCannotGoOnHugePages) {
  const Result<HugePageCounts> plenty = HugePageCounts{600, 600, 0};
  EXPECT_EQ(hugePageShortfall(1024 * kMiB, 1024 * kMiB, plenty), "");
  const Result<HugePageCounts> few = HugePageCounts{20, 20, 8};  // 12 of them promised already
  EXPECT_EQ(hugePageShortfall(1024 * kMiB, 1024 * kMiB, few),
            "only 12 huge pages free, 512 needed");
  // The pool takes whole huge pages only: 5 MiB + 1 needs 2.
  EXPECT_EQ(hugePageShortfall(5 * kMiB + 1, 1024 * kMiB, HugePageCounts{2, 2, 0}), "");
  EXPECT_EQ(hugePageShortfall(kMiB, 1024 * kMiB, plenty),
            "the pool is smaller than one huge page (2 MiB)");
  EXPECT_EQ(hugePageShortfall(64 * kMiB, kMiB, plenty),
            "extents are smaller than one huge page (2 MiB)");
  const Result<HugePageCounts> none = makeError(ErrorCode::kUnavailable, "cannot read x");
  EXPECT_EQ(hugePageShortfall(64 * kMiB, 64 * kMiB, none),
            "the kernel offers no 2 MiB huge pages (cannot read x)");
}

TEST(HugePages, CountsAreReadFromTheKernelsDirectory) {
  FakeCounts fake(7);
  auto counts = readHugePageCounts(fake.path());
  ASSERT_TRUE(counts.ok()) << counts.error();
  EXPECT_EQ(counts->total, 7u);
  EXPECT_EQ(counts->available(), 7u);
  EXPECT_EQ(readHugePageCounts(fake.path() + "/missing").code(), ErrorCode::kUnavailable);
}

TEST(HostPool, AFourKiBPoolIsFaultedInWhenMade) {
  auto pool = HostPool::create(testPrefix(), 8 * kMiB, 4 * kMiB);
  ASSERT_TRUE(pool.ok()) << pool.error();
  EXPECT_EQ((*pool)->pages(), PageKind::k4K);
  EXPECT_EQ((*pool)->pagesReason(), "huge pages off");
  ASSERT_EQ((*pool)->extentCount(), 2u);
  for (uint32_t i = 0; i < 2; ++i) {
    const ShmSegment& seg = (*pool)->segment(i);
    EXPECT_FALSE(seg.anonymous());
    EXPECT_EQ(seg.fd(), -1);
    // Every page is in this process's page tables already: no write will fault.
    auto smaps = smapsOf(seg.data());
    EXPECT_EQ(smaps["Rss"], seg.size() / 1024) << "extent " << i;
    EXPECT_EQ(smaps["KernelPageSize"], 4u);
  }
}

// A /proc/meminfo, /proc/self/cgroup and cgroup tree of a test's own.
class FakeMemory {
 public:
  FakeMemory(uint64_t availableKiB, const std::string& cgroupLine) {
    std::ofstream(dir_.file("meminfo"))
        << "MemTotal:       99999999 kB\nMemFree:          1000 kB\n"
        << "MemAvailable:   " << availableKiB << " kB\n";
    std::ofstream(dir_.file("cgroup")) << "9:pids:/\n" << cgroupLine << "\n";
    std::filesystem::create_directories(dir_.file("root/memory"));
  }
  // Writes `file` of cgroup directory `dir` (under the fake root).
  void set(const std::string& dir, const std::string& file, const std::string& value) {
    std::filesystem::create_directories(dir_.file("root") + dir);
    std::ofstream(dir_.file("root") + dir + "/" + file) << value << "\n";
  }
  MemorySources sources() const {
    return {dir_.file("meminfo"), dir_.file("cgroup"), dir_.file("root")};
  }

 private:
  test::TempDir dir_;
};

TEST(MemoryRoom, TheSmallestOfMemAvailableAndEveryCgroupLimitAboveTheProcess) {
  {
    // cgroup v2: the process's group has no limit, its parent one of 3 GiB with 1 GiB used.
    FakeMemory fake(8 * 1024 * 1024, "0::/a/b");
    fake.set("/a/b", "memory.max", "max");
    fake.set("/a/b", "memory.current", "12345");
    fake.set("/a", "memory.max", std::to_string(3 * 1024 * kMiB));
    fake.set("/a", "memory.current", std::to_string(1024 * kMiB));
    const MemoryRoom room = memoryRoom(fake.sources());
    EXPECT_EQ(room.bytes, 2048 * kMiB);
    EXPECT_EQ(room.detail, "MemAvailable 8.0 GiB, cgroup /a memory.max 3.0 GiB (used 1.0 GiB)");
  }
  {
    // cgroup v1, the limit "unlimited" (a page counter's maximum): MemAvailable decides.
    FakeMemory fake(512 * 1024, "4:memory:/c");
    fake.set("/memory/c", "memory.limit_in_bytes", "9223372036854771712");
    fake.set("/memory/c", "memory.usage_in_bytes", "100");
    EXPECT_EQ(memoryRoom(fake.sources()).bytes, 512 * kMiB);
    fake.set("/memory/c", "memory.limit_in_bytes", std::to_string(256 * kMiB));
    EXPECT_EQ(memoryRoom(fake.sources()).bytes, 256 * kMiB - 100);
  }
  // Nothing readable: no figure, no refusal.
  EXPECT_EQ(memoryRoom({"/nonexistent/meminfo", "/nonexistent/cgroup", "/nonexistent"}).bytes,
            UINT64_MAX);
  // This machine's own figures are there and plausible.
  const MemoryRoom here = memoryRoom();
  EXPECT_LT(here.bytes, UINT64_MAX);
  EXPECT_NE(here.detail.find("MemAvailable"), std::string::npos);
}

TEST(HostPool, APoolLargerThanTheMemoryThereIsIsRefusedWithTheFiguresAndLeavesNothing) {
  // 200 MiB available: a pool of 160 MiB leaves less than the 64 MiB kept beside it.
  FakeMemory fake(200 * 1024, "0::/");
  const std::string prefix = testPrefix() + "toolarge-";
  auto pool = HostPool::create(HostPoolOptions{.prefix = prefix,
                                               .bytes = 160 * kMiB,
                                               .extentBytes = 16 * kMiB,
                                               .hugePages = HugePages::kAuto,
                                               .hugePageCountsDir = FakeCounts(0).path(),
                                               .memory = fake.sources()});
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.code(), ErrorCode::kUnavailable);
  EXPECT_EQ(pool.error().message(),
            "a host pool of 160.0 MiB does not fit the memory this process can have "
            "(MemAvailable 200.0 MiB; 64.0 MiB kept beside the pool): ask for a smaller pool");
  EXPECT_TRUE(shmNames(prefix).empty());
  // 128 MiB fits.
  auto fits = HostPool::create(HostPoolOptions{
      .prefix = prefix, .bytes = 128 * kMiB, .extentBytes = 64 * kMiB, .memory = fake.sources()});
  ASSERT_TRUE(fits.ok()) << fits.error();
}

TEST(HostPool, AutoFallsBackToFourKiBWhenTooFewHugePagesAreFreeAndSaysWhy) {
  FakeCounts fake(3);
  auto pool = HostPool::create(HostPoolOptions{.prefix = testPrefix(),
                                               .bytes = 16 * kMiB,
                                               .extentBytes = 16 * kMiB,
                                               .hugePages = HugePages::kAuto,
                                               .hugePageCountsDir = fake.path()});
  ASSERT_TRUE(pool.ok()) << pool.error();
  EXPECT_EQ((*pool)->pages(), PageKind::k4K);
  EXPECT_EQ((*pool)->pagesReason(), "only 3 huge pages free, 8 needed");
  EXPECT_EQ((*pool)->bytes(), 16 * kMiB);
  EXPECT_FALSE((*pool)->segment(0).anonymous());
}

TEST(HostPool, OnRefusesWhenTooFewHugePagesAreFree) {
  FakeCounts fake(3);
  auto pool = HostPool::create(HostPoolOptions{.prefix = testPrefix(),
                                               .bytes = 16 * kMiB,
                                               .extentBytes = 16 * kMiB,
                                               .hugePages = HugePages::kOn,
                                               .hugePageCountsDir = fake.path()});
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.code(), ErrorCode::kUnavailable);
  EXPECT_EQ(pool.error().message(),
            "no pool on 2 MiB huge pages: only 3 huge pages free, 8 needed");
}

// The counts are only a first look: when the kernel then has too few pages (here it has none,
// whatever the counts said), on fails and auto falls back — an error at start, never a SIGBUS.
TEST(HostPool, TheAllocationHasTheLastWord) {
  auto lock = HugePageReservation::reserve(0);  // no other test reserves pages meanwhile
  ASSERT_TRUE(lock.ok()) << lock.error();
  if (HugePageReservation::available() >= 8) {
    GTEST_SKIP() << "this machine has huge pages free: the allocation would succeed";
  }
  FakeCounts fake(1000);
  HostPoolOptions options{.prefix = testPrefix(),
                          .bytes = 16 * kMiB,
                          .extentBytes = 4 * kMiB,
                          .hugePages = HugePages::kOn,
                          .hugePageCountsDir = fake.path()};
  auto on = HostPool::create(options);
  ASSERT_FALSE(on.ok());
  EXPECT_NE(on.error().message().find("huge pages of 2 MiB"), std::string::npos) << on.error();
  options.hugePages = HugePages::kAuto;
  auto fallback = HostPool::create(options);
  ASSERT_TRUE(fallback.ok()) << fallback.error();
  EXPECT_EQ((*fallback)->pages(), PageKind::k4K);
  EXPECT_NE((*fallback)->pagesReason().find("huge pages of 2 MiB"), std::string::npos)
      << (*fallback)->pagesReason();
  EXPECT_EQ((*fallback)->extentCount(), 4u);
}

TEST(HostPool, AHugePagePoolIsOnTwoMiBPagesFaultedInAndMapsFromItsDescriptor) {
  auto reservation = HugePageReservation::reserve(8);
  if (!reservation) GTEST_SKIP() << "cannot reserve huge pages: " << reservation.error();
  const uint64_t before = HugePageReservation::available();
  // 17 MiB in extents of 5 MiB: whole huge pages only, 16 MiB in 4 + 4 + 4 + 4.
  auto pool = HostPool::create(HostPoolOptions{.prefix = testPrefix(),
                                               .bytes = 17 * kMiB,
                                               .extentBytes = 5 * kMiB,
                                               .hugePages = HugePages::kOn});
  ASSERT_TRUE(pool.ok()) << pool.error();
  EXPECT_EQ((*pool)->pages(), PageKind::kHuge2M);
  EXPECT_EQ((*pool)->pagesReason(), "");
  EXPECT_EQ((*pool)->bytes(), 16 * kMiB);
  ASSERT_EQ((*pool)->extentCount(), 4u);
  EXPECT_EQ(HugePageReservation::available(), before - 8);
  for (uint32_t i = 0; i < 4; ++i) {
    const ShmSegment& seg = (*pool)->segment(i);
    EXPECT_EQ(seg.size(), 4 * kMiB);
    EXPECT_TRUE(seg.anonymous());
    EXPECT_EQ(seg.pages(), PageKind::kHuge2M);
    EXPECT_EQ(seg.name(), testPrefix() + std::to_string(i));
    ASSERT_GE(seg.fd(), 0);
    auto smaps = smapsOf(seg.data());
    EXPECT_EQ(smaps["KernelPageSize"], 2048u) << "extent " << i;
    EXPECT_EQ(smaps["Shared_Hugetlb"] + smaps["Private_Hugetlb"], seg.size() / 1024)
        << "extent " << i << ": not faulted in";
  }
  // Nothing under /dev/shm: the memory has no name.
  EXPECT_TRUE(shmNames(testPrefix()).empty());

  // What a client does with the descriptor it is handed: the same memory.
  const ShmSegment& seg = (*pool)->segment(2);
  auto mapped =
      ShmSegment::adopt(kj::AutoCloseFd(::fcntl(seg.fd(), F_DUPFD_CLOEXEC, 0)), seg.size());
  ASSERT_TRUE(mapped.ok()) << mapped.error();
  EXPECT_EQ((*mapped)->pages(), PageKind::kHuge2M);
  ASSERT_TRUE((*mapped)->populate().ok());
  std::memset(seg.data() + 3 * kMiB, 0x5c, 4096);
  EXPECT_EQ((*mapped)->data()[3 * kMiB + 4095], 0x5c);
  (*mapped)->data()[17] = 0x11;
  EXPECT_EQ(seg.data()[17], 0x11);
  // A size that is not whole huge pages cannot be mapped.
  EXPECT_FALSE(
      ShmSegment::adopt(kj::AutoCloseFd(::fcntl(seg.fd(), F_DUPFD_CLOEXEC, 0)), 3 * kMiB).ok());
  // Sealed: a holder of the descriptor cannot shrink the segment under the daemon.
  EXPECT_NE(::ftruncate(seg.fd(), 2 * kMiB), 0);
}

}  // namespace
}  // namespace kvtier
