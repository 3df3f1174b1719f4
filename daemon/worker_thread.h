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
    // Niceness 10: a small share of a busy CPU (about a tenth of a normal thread's), so that
    // background writes yield to the event loop but still progress on a loaded node. (SCHED_IDLE
    // was measured too, twice: hot lookup p99 within the noise of this, spill ~12 % slower, and
    // it can starve spilling on a node whose cores are all busy.)
    kBackground,
  };

  // `name` (at most 15 characters) is what top, perf and /proc show for the thread.
  explicit WorkerThread(const char* name, Priority priority = Priority::kNormal);
  // Ends the loop (closures not yet started are cancelled) and joins.
  ~WorkerThread();
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;

  const kj::Executor& executor() const { return *executor_; }

 private:
  std::thread thread_;
  const kj::Executor* executor_ = nullptr;
  kj::Own<kj::PromiseFulfiller<void>> stop_;  // the thread's own: fulfilled on it
};

}  // namespace kvtier
