// WorkerThread: a thread that runs the jobs the daemon's event loop hands it (run), one at a time,
// in the order given; blocking disk and device work runs there, off the event loop.
//
// A job travels to the thread through a mutex-guarded queue and its result comes back through a
// KJ cross-thread fulfiller, which wakes the event loop that asked. Why not kj::Executor: KJ hands
// work over under its own futex-based mutex, which ThreadSanitizer cannot see, and the executor's
// event object is touched on both threads around it, so every job would be reported as a race
// (transport/cross_thread.h, docs/reliability.md). The queue's std::mutex is visible to TSAN; the
// result's hand-off is marked with a release on the worker and an acquire on the loop.
#pragma once

#include <kj/async.h>
#include <kj/debug.h>
#include <kj/function.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>

#include "transport/cross_thread.h"

namespace kvtier {

template <typename T>
struct IsPromise : std::false_type {};
template <typename T>
struct IsPromise<kj::Promise<T>> : std::true_type {};

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
  // Runs the jobs already handed over whose promises are still awaited, then joins.
  ~WorkerThread();
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;

  // Runs job() on the thread. The promise, on the calling thread's event loop, resolves with what
  // it returned or breaks with what it threw. `job` returns a value (or nothing), not a promise;
  // it is destroyed on the worker once it has run. A job whose promise was dropped before it
  // started is skipped (as kj::Executor cancels it); one under way finishes.
  template <typename F>
  kj::Promise<std::invoke_result_t<F&>> run(F&& job);

 private:
  void post(kj::Function<void()> job);
  void loop(const char* name, Priority priority);

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<kj::Function<void()>> jobs_;  // guarded by mutex_
  bool stopping_ = false;                  // guarded by mutex_
  std::thread thread_;
};

template <typename F>
kj::Promise<std::invoke_result_t<F&>> WorkerThread::run(F&& job) {
  using T = std::invoke_result_t<F&>;
  static_assert(!IsPromise<T>::value, "a job returns a value, not a promise");
  // The result waits in a slot of its own; the fulfiller only says it is there (so the value never
  // moves inside KJ's cross-thread code, and its hand-off is exactly the release and acquire).
  struct Slot {
    std::conditional_t<std::is_void_v<T>, bool, kj::Maybe<T>> value{};
    kj::Maybe<kj::Exception> error;
  };
  auto slot = std::make_shared<Slot>();
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  const void* token = this;
  post([job = kj::fwd<F>(job), fulfiller = kj::mv(paf.fulfiller), slot, token]() mutable {
    if (!fulfiller->isWaiting()) return;  // cancelled: nobody awaits the result
    slot->error = kj::runCatchingExceptions([&]() {
      if constexpr (std::is_void_v<T>) {
        job();
      } else {
        slot->value.emplace(job());
      }
    });
    handoffRelease(token);
    fulfiller->fulfill();
  });
  return paf.promise.then(
      [slot, token]() -> T {
        handoffAcquire(token);
        KJ_IF_MAYBE (e, slot->error) {
          kj::throwFatalException(kj::mv(*e));
        }
        if constexpr (!std::is_void_v<T>) return kj::mv(KJ_ASSERT_NONNULL(slot->value));
      },
      [token](kj::Exception&& e) -> T {
        handoffAcquire(token);
        kj::throwFatalException(kj::mv(e));
      });
}

}  // namespace kvtier
