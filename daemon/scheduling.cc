#include "daemon/scheduling.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace kvtier {
namespace {

// struct sched_attr of sched_setattr(2) (glibc 2.36 has no wrapper; <linux/sched/types.h> clashes
// with <sched.h>). Layout fixed by the kernel ABI (SCHED_ATTR_SIZE_VER1).
struct SchedAttr {
  uint32_t size;
  uint32_t policy;
  uint64_t flags;
  int32_t nice;
  uint32_t priority;
  uint64_t runtime;  // for SCHED_OTHER since Linux 6.12: the requested slice, ns
  uint64_t deadline;
  uint64_t period;
  uint32_t utilMin;
  uint32_t utilMax;
};

constexpr uint64_t kKeepPolicy = 0x08;  // SCHED_FLAG_KEEP_POLICY

}  // namespace

bool requestSlice(std::chrono::nanoseconds slice) {
  errno = 0;
  const int nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
  if (nice == -1 && errno != 0) return false;
  SchedAttr attr{};
  attr.size = sizeof attr;
  // The thread's policy stays as it is (an operator may have set SCHED_BATCH, or real time: for
  // those the kernel refuses the call and nothing changes).
  attr.flags = kKeepPolicy;
  attr.policy = SCHED_OTHER;
  attr.nice = nice;
  attr.runtime = static_cast<uint64_t>(slice.count());
  return ::syscall(SYS_sched_setattr, 0, &attr, 0) == 0;
}

void lowerCallingThread(const char* name) {
  // Niceness is per thread on Linux; lowering it is always allowed.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), kRocksDbNiceness);
  (void)requestSlice(kBackgroundSlice);
  (void)::pthread_setname_np(::pthread_self(), name);
}

}  // namespace kvtier
