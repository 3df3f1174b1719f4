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
#include "daemon/trash_thread_fs.h"
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
  // Reopening flushes the recovered log (the tier's own metadata) on a new flush thread.
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

// What RocksDB's delete scheduler does first with each file in its trash (read its size) lowers
// the thread it does it on, once, and names it; the main thread, a thread already lowered, and any
// file outside the trash leave the caller as it was.
TEST(TrashThreadFileSystem, LowersAndNamesTheThreadThatEmptiesTheTrash) {
  test::TempDir dir;
  const std::string trash = dir.file("000004.log.trash");
  const std::string plain = dir.file("000005.log");
  for (const auto& name : {trash, plain}) std::ofstream(name) << "x";
  TrashThreadFileSystem fs(rocksdb::FileSystem::Default());
  auto size = [&](const std::string& name) {
    uint64_t bytes = 0;
    EXPECT_TRUE(fs.GetFileSize(name, rocksdb::IOOptions(), &bytes, nullptr).ok());
    EXPECT_EQ(bytes, 1u);
  };
  struct Seen {
    int nice = 0;
    uint64_t slice = 0;
    std::string name;
  };
  auto seen = [] {
    char name[16] = {};
    ::pthread_getname_np(::pthread_self(), name, sizeof name);
    return Seen{::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid))),
                current().runtime, name};
  };
  const Seen mainBefore = seen();

  size(trash);  // the main thread: never lowered
  EXPECT_EQ(seen().nice, mainBefore.nice);
  EXPECT_EQ(seen().name, mainBefore.name);

  std::thread([&] {
    size(plain);  // not in the trash: unchanged
    EXPECT_EQ(seen().nice, mainBefore.nice);
    size(trash);  // the delete scheduler's first step
    const Seen after = seen();
    EXPECT_EQ(after.nice, TrashThreadFileSystem::kNiceness);
    EXPECT_EQ(after.name, TrashThreadFileSystem::kThreadName);
    if (kernelAtLeast(6, 12)) {
      EXPECT_EQ(after.slice, 20000000u);
    }
  }).join();

  std::thread([&] {
    // Already lowered (the spill worker at niceness 10): left as it is.
    ASSERT_EQ(::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10), 0);
    EXPECT_TRUE(fs.DeleteFile(trash, rocksdb::IOOptions(), nullptr).ok());
    EXPECT_EQ(seen().nice, 10);
    EXPECT_NE(seen().name, TrashThreadFileSystem::kThreadName);
  }).join();
  EXPECT_FALSE(std::filesystem::exists(trash));
}

TEST(TrashThreadFileSystem, KnowsATrashFileByItsName) {
  EXPECT_TRUE(TrashThreadFileSystem::inTrash("/data/cold/000012.sst.trash"));
  EXPECT_TRUE(TrashThreadFileSystem::inTrash(".trash"));
  EXPECT_FALSE(TrashThreadFileSystem::inTrash("/data/cold/000012.sst"));
  EXPECT_FALSE(TrashThreadFileSystem::inTrash("/data/cold.trash/000012.sst"));
  EXPECT_FALSE(TrashThreadFileSystem::inTrash("trash"));
}

}  // namespace
}  // namespace kvtier
