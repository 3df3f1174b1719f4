#include "daemon/worker_thread.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <future>

#include "daemon/scheduling.h"
#include "transport/cross_thread.h"

namespace kvtier {

WorkerThread::WorkerThread(const char* name, Priority priority) {
  std::promise<void> ready;
  thread_ = std::thread([this, name, priority, &ready] {
    (void)::pthread_setname_np(::pthread_self(), name);
    if (priority == Priority::kBackground) {
      // Niceness is per thread on Linux; lowering it is always allowed.
      (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
      (void)requestSlice(kBackgroundSlice);  // any thread that wakes preempts it at once
    }
    kj::EventLoop loop;
    kj::WaitScope waitScope(loop);
    auto paf = kj::newPromiseAndFulfiller<void>();
    executor_ = &kj::getCurrentThreadExecutor();
    stop_ = kj::mv(paf.fulfiller);
    ready.set_value();
    paf.promise.wait(waitScope);
  });
  ready.get_future().wait();
}

WorkerThread::~WorkerThread() {
  // Stopped through the executor, on the thread itself (a cross-thread fulfiller would do the
  // same, but its hand-off is one ThreadSanitizer cannot see: transport/cross_thread.h).
  auto stop = [this]() {
    handoffAcquire(currentExecutorToken());
    stop_->fulfill();
  };
  handoffRelease(executor_);
  executor_->executeSync(stop);
  thread_.join();
}

}  // namespace kvtier
