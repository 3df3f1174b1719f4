#include "daemon/scheduling.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <thread>

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

TEST(Scheduling, AShortSliceKeepsThePolicyAndNicenessAndIsWhatTheKernelReports) {
  if (!kernelAtLeast(6, 12)) {
    GTEST_SKIP() << "per-thread slices need Linux 6.12 or later (EEVDF custom slices)";
  }
  std::thread([] {
    ASSERT_TRUE(requestShortSlice(std::chrono::microseconds(200)));
    Attr attr{};
    ASSERT_EQ(::syscall(SYS_sched_getattr, 0, &attr, sizeof attr, 0), 0);
    EXPECT_EQ(attr.policy, static_cast<uint32_t>(SCHED_OTHER));
    EXPECT_EQ(attr.nice, 0);
    EXPECT_EQ(attr.runtime, 200000u);
  }).join();
}

}  // namespace
}  // namespace kvtier
