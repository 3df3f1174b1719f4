#include "daemon/worker_thread.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <future>

namespace kvtier {

WorkerThread::WorkerThread(Priority priority) {
  std::promise<void> ready;
  thread_ = std::thread([this, priority, &ready] {
    if (priority == Priority::kIdle) {
      // Per thread on Linux (pid 0 with sched_setscheduler is the calling thread). Lowering is
      // always allowed; if it is refused anyway, fall back to the weakest niceness.
      sched_param param{};
      if (::sched_setscheduler(0, SCHED_IDLE, &param) != 0) {
        (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
      }
    }
    kj::EventLoop loop;
    kj::WaitScope waitScope(loop);
    auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
    executor_ = &kj::getCurrentThreadExecutor();
    stop_ = kj::mv(paf.fulfiller);
    ready.set_value();
    paf.promise.wait(waitScope);
  });
  ready.get_future().wait();
}

WorkerThread::~WorkerThread() {
  stop_->fulfill();
  thread_.join();
}

}  // namespace kvtier
