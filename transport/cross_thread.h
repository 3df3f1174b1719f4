// Hand-offs between threads, made visible to ThreadSanitizer.
//
// kvtier moves work and results between threads through std::mutex-guarded queues (which TSAN
// sees) and wakes an event loop with a KJ cross-thread fulfiller. KJ synchronises that wake-up with
// its own mutex over raw futex calls, and Debian's libkj is not built with TSAN: where a value
// crosses with the wake-up rather than under one of kvtier's mutexes (a worker's result: see
// daemon/worker_thread.h), the helpers below mark the hand-off — a release on the thread that
// gives data away, an acquire on the thread that takes it, on one token — so that TSAN knows the
// order KJ guarantees and still reports any access outside it (scripts/sanitize.sh tsan,
// docs/reliability.md). Outside TSAN builds they compile to nothing.
#pragma once

#include <kj/async.h>

#include <type_traits>

#if defined(__SANITIZE_THREAD__)
#define KVTIER_TSAN 1
extern "C" {
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
}
#endif

namespace kvtier {

inline void handoffRelease([[maybe_unused]] const void* token) {
#ifdef KVTIER_TSAN
  __tsan_release(const_cast<void*>(token));
#endif
}

inline void handoffAcquire([[maybe_unused]] const void* token) {
#ifdef KVTIER_TSAN
  __tsan_acquire(const_cast<void*>(token));
#endif
}

// f() as a promise, an exception it throws as a broken one (kj::evalNow, which in KJ 0.9 does not
// take a function that returns void).
template <typename F>
kj::PromiseForResult<F&, void> callNow(F& f) {
  if constexpr (std::is_void_v<decltype(f())>) {
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() { f(); })) {
      return kj::mv(*e);
    }
    return kj::READY_NOW;
  } else {
    return kj::evalNow(f);
  }
}

}  // namespace kvtier
