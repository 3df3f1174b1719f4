// WorkerThread: a thread with its own KJ event loop that runs the closures the daemon's event
// loop hands it (executor().executeAsync), one at a time, in the order given; blocking disk and
// device work runs there, off the event loop.
#pragma once

#include <kj/async.h>

#include <thread>

namespace kvtier {

class WorkerThread {
 public:
  enum class Priority {
    kNormal,
    // SCHED_IDLE: runs only on CPU time nothing else wants, and any other thread that wakes
    // preempts it. For background writes that must never delay a lookup.
    kIdle,
  };

  explicit WorkerThread(Priority priority = Priority::kNormal);
  // Ends the loop (closures not yet started are cancelled) and joins.
  ~WorkerThread();
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;

  const kj::Executor& executor() const { return *executor_; }

 private:
  std::thread thread_;
  const kj::Executor* executor_ = nullptr;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stop_;
};

}  // namespace kvtier
