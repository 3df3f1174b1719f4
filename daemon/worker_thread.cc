#include "daemon/worker_thread.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "daemon/scheduling.h"

namespace kvtier {

WorkerThread::WorkerThread(const char* name, Priority priority)
    : thread_([this, name, priority] { loop(name, priority); }) {}

WorkerThread::~WorkerThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void WorkerThread::post(kj::Function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;  // dropped: its fulfiller breaks the promise
    jobs_.push_back(kj::mv(job));
  }
  wake_.notify_one();
}

void WorkerThread::loop(const char* name, Priority priority) {
  (void)::pthread_setname_np(::pthread_self(), name);
  if (priority == Priority::kBackground) {
    // Niceness is per thread on Linux; lowering it is always allowed.
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
    (void)requestSlice(kBackgroundSlice);  // any thread that wakes preempts it at once
  }
  while (true) {
    kj::Function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and nothing left
      job = kj::mv(jobs_.front());
      jobs_.pop_front();
    }
    job();  // catches what the job throws; its captures go with `job`, here
  }
}

}  // namespace kvtier
