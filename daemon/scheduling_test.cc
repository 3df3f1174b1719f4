#include "daemon/scheduling.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon/cold_tier.h"
#include "tests/temp_dir.h"

namespace kvtier {
namespace {

// sched_getattr's view of the calling thread: policy and (Linux 6.12+) its slice in ns.
struct Attr {
  uint32_t size, policy;
  uint64_t flags;
  int32_t nice;
  uint32_t priority;
  uint64_t runtime, deadline, period;
  uint32_t utilMin, utilMax;
};

bool kernelAtLeast(int major, int minor) {
  utsname u{};
  ::uname(&u);
  int ma = 0, mi = 0;
  if (std::sscanf(u.release, "%d.%d", &ma, &mi) != 2) return false;
  return ma > major || (ma == major && mi >= minor);
}

Attr current() {
  Attr attr{};
  EXPECT_EQ(::syscall(SYS_sched_getattr, 0, &attr, sizeof attr, 0), 0);
  return attr;
}

TEST(Scheduling, ASliceIsWhatTheKernelReportsAndKeepsPolicyAndNiceness) {
  if (!kernelAtLeast(6, 12)) {
    GTEST_SKIP() << "per-thread slices need Linux 6.12 or later (EEVDF custom slices)";
  }
  std::thread([] {
    ASSERT_TRUE(requestSlice(kShortestSlice));
    EXPECT_EQ(current().runtime, 100000u);
    EXPECT_EQ(current().policy, static_cast<uint32_t>(SCHED_OTHER));
    EXPECT_EQ(current().nice, 0);
    // A background thread, niced first: the long slice keeps its niceness.
    ASSERT_EQ(::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10), 0);
    ASSERT_TRUE(requestSlice(kBackgroundSlice));
    EXPECT_EQ(current().runtime, 20000000u);
    EXPECT_EQ(current().nice, 10);
  }).join();
}

TEST(Scheduling, ASliceRequestKeepsAPolicyAnOperatorChose) {
  if (!kernelAtLeast(6, 12)) {
    GTEST_SKIP() << "per-thread slices need Linux 6.12 or later (EEVDF custom slices)";
  }
  std::thread([] {
    const sched_param none{};
    ASSERT_EQ(::pthread_setschedparam(::pthread_self(), SCHED_BATCH, &none), 0);
    ASSERT_TRUE(requestSlice(kBackgroundSlice));
    EXPECT_EQ(current().policy, static_cast<uint32_t>(SCHED_BATCH));
    EXPECT_EQ(current().runtime, 20000000u);
  }).join();
}

// RocksDB's flush threads take the long slice when a flush starts (reopening the tier flushes the
// recovered log), and keep their niceness.
TEST(Scheduling, RocksDbBackgroundThreadsRunWithTheLongSlice) {
  if (!kernelAtLeast(6, 12)) {
    GTEST_SKIP() << "per-thread slices need Linux 6.12 or later (EEVDF custom slices)";
  }
  test::TempDir dir;
  const std::vector<uint8_t> bytes(64 << 10, 7);
  ColdKey key;
  key.fingerprint = 1;
  const ColdRecord record{key, bytes.data(), static_cast<uint32_t>(bytes.size())};
  ASSERT_TRUE(
      ColdTier::open({.path = dir.file("cold")}).value()->putBatch(std::span(&record, 1)).ok());
  // putBatch flushed on one of RocksDB's (process-wide) flush threads.
  auto tier = ColdTier::open({.path = dir.file("cold")}).value();
  std::string slice;  // the flush thread's se.slice, ns
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name != "rocksdb:high") continue;
    std::ifstream sched(task.path() / "sched");
    for (std::string line; std::getline(sched, line);) {
      if (line.rfind("se.slice", 0) == 0) slice = line.substr(line.find(':') + 1);
    }
  }
  ASSERT_FALSE(slice.empty()) << "no flush thread found";
  EXPECT_EQ(std::stoull(slice), 20000000u);
}

// The thread RocksDB deletes obsolete files on (its delete scheduler, which has no priority
// setting) runs lowered like the flush and compaction threads, and named; the thread that opened
// the tier is left as it was, whatever it is (here an ordinary worker, not the main thread).
TEST(Scheduling, RocksDbDeletesObsoleteFilesOnALoweredThread) {
  test::TempDir dir;
  std::thread([&] {
    const int niceBefore = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
    ASSERT_EQ(::pthread_setname_np(::pthread_self(), "kvtier-promote"), 0);
    auto tier = ColdTier::open({.path = dir.file("cold")}).value();
    char name[16] = {};
    ::pthread_getname_np(::pthread_self(), name, sizeof name);
    EXPECT_STREQ(name, "kvtier-promote");
    EXPECT_EQ(::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid))), niceBefore);

    int found = 0;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
      std::ifstream comm(task.path() / "comm");
      std::string threadName;
      std::getline(comm, threadName);
      if (threadName != ColdTier::kTrashThreadName) continue;
      ++found;
      const auto tid = static_cast<id_t>(std::stoul(task.path().filename().string()));
      EXPECT_EQ(::getpriority(PRIO_PROCESS, tid), kRocksDbNiceness);
      if (kernelAtLeast(6, 12)) {
        std::ifstream sched(task.path() / "sched");
        std::string slice;
        for (std::string line; std::getline(sched, line);) {
          if (line.rfind("se.slice", 0) == 0) slice = line.substr(line.find(':') + 1);
        }
        ASSERT_FALSE(slice.empty());
        EXPECT_EQ(std::stoull(slice), 20000000u);
      }
    }
    EXPECT_EQ(found, 1) << "the tier's trash thread";
  }).join();
}

}  // namespace
}  // namespace kvtier
