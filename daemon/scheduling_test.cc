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

// A thread of this process, found by name: its id and the scheduler slice the kernel reports for
// it (se.slice in ns; empty where the kernel reports none).
struct Task {
  id_t tid;
  std::string slice;
};

std::vector<Task> threadsNamed(const std::string& name) {
  std::vector<Task> found;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string threadName;
    std::getline(comm, threadName);
    if (threadName != name) continue;
    Task t{static_cast<id_t>(std::stoul(task.path().filename().string())), {}};
    std::ifstream sched(task.path() / "sched");
    for (std::string line; std::getline(sched, line);) {
      if (line.rfind("se.slice", 0) == 0) t.slice = line.substr(line.find(':') + 1);
    }
    found.push_back(t);
  }
  return found;
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

// RocksDB's flush threads take the long slice when a flush starts (putBatch flushes), and keep
// their niceness.
TEST(Scheduling, RocksDbBackgroundThreadsRunWithTheLongSlice) {
  if (!kernelAtLeast(6, 12)) {
    GTEST_SKIP() << "per-thread slices need Linux 6.12 or later (EEVDF custom slices)";
  }
  test::TempDir dir;
  const std::vector<uint8_t> bytes(64 << 10, 7);
  ColdKey key;
  key.fingerprint = 1;
  const ColdRecord record{key, bytes.data(), static_cast<uint32_t>(bytes.size())};
  auto tier = ColdTier::open({.path = dir.file("cold")}).value();
  ASSERT_TRUE(tier->putBatch(std::span(&record, 1)).ok());  // flushed on RocksDB's flush thread
  const auto flushThreads = threadsNamed("rocksdb:high");
  ASSERT_FALSE(flushThreads.empty()) << "no flush thread found";
  ASSERT_FALSE(flushThreads.back().slice.empty());
  EXPECT_EQ(std::stoull(flushThreads.back().slice), 20000000u);
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

    const auto trash = threadsNamed(ColdTier::kTrashThreadName);
    ASSERT_EQ(trash.size(), 1u) << "the tier's trash thread";
    EXPECT_EQ(::getpriority(PRIO_PROCESS, trash[0].tid), kRocksDbNiceness);
    if (kernelAtLeast(6, 12)) {
      ASSERT_FALSE(trash[0].slice.empty());
      EXPECT_EQ(std::stoull(trash[0].slice), 20000000u);
    }
  }).join();
}

}  // namespace
}  // namespace kvtier
