// Work and results handed between threads through KJ's cross-thread executor, made visible to
// ThreadSanitizer.
//
// A kj::Executor runs a function on another thread's event loop and hands its result back. KJ
// synchronises both hand-offs with its own mutex over raw futex calls, and Debian's libkj is not
// built with TSAN: the sanitizer sees neither side of that synchronisation, and would report every
// value that crosses (a request built here and read there, a result written there and read here)
// as a data race. The helpers below mark each hand-off where it happens — a release on the thread
// that gives data away, an acquire on the thread that takes it, on one token per executor — so
// that TSAN knows the order KJ guarantees and still reports any access outside it.
// (scripts/sanitize.sh tsan, docs/reliability.md.) Outside TSAN builds they compile to nothing.
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

// `promise`, calling `g()` when it settles (with a value or an exception), before the result
// moves on.
template <typename T, typename G>
kj::Promise<T> onSettle(kj::Promise<T>&& promise, G g) {
  if constexpr (std::is_void_v<T>) {
    return promise.then([g]() mutable { g(); },
                        [g](kj::Exception&& e) mutable {
                          g();
                          kj::throwFatalException(kj::mv(e));
                        });
  } else {
    return promise.then(
        [g](T&& v) mutable -> T {
          g();
          return kj::mv(v);
        },
        [g](kj::Exception&& e) mutable -> T {
          g();
          kj::throwFatalException(kj::mv(e));
        });
  }
}

// On the thread that runs a function for an executor: the token of that thread's executor (the
// one the requesting thread names). Read from KJ's thread-local state, not from anything the
// requesting thread wrote: the acquire must come before this thread reads any of that.
inline const void* currentExecutorToken() { return &kj::getCurrentThreadExecutor(); }

// On the thread that runs a function for an executor: `promise` (what the function returned),
// releasing this thread's token when KJ drops it. KJ drops it after storing its result in the
// cross-thread event and before waking the requesting thread, so the release covers that store.
template <typename T>
kj::Promise<T> releaseWhenDropped(kj::Promise<T>&& promise) {
  return promise.attach(kj::defer([token = currentExecutorToken()]() { handoffRelease(token); }));
}

// A capture that releases `token` when it is moved: the last capture of a function handed to
// executeAsync, which moves the function into its event, so that the release follows the move of
// every other capture (what KJ writes after it is done inside executeAsync: scripts/tsan.supp).
struct ReleaseOnMove {
  const void* token;
  explicit ReleaseOnMove(const void* t) : token(t) {}
  ReleaseOnMove(ReleaseOnMove&& other) noexcept : token(other.token) { handoffRelease(token); }
  ReleaseOnMove(const ReleaseOnMove&) = delete;
  ReleaseOnMove& operator=(const ReleaseOnMove&) = delete;
};

// executor.executeAsync(job), with the hand-offs marked for TSAN (the same call otherwise).
template <typename F>
kj::PromiseForResult<F, void> executeOn(const kj::Executor& executor, F&& job) {
#ifdef KVTIER_TSAN
  using T = kj::_::UnwrapPromise<kj::PromiseForResult<F, void>>;
  const void* token = &executor;
  auto done =
      executor.executeAsync([job = kj::fwd<F>(job), release = ReleaseOnMove(token)]() mutable {
        handoffAcquire(currentExecutorToken());
        return releaseWhenDropped(callNow(job));
      });
  return onSettle<T>(kj::mv(done), [token]() { handoffAcquire(token); });
#else
  return executor.executeAsync(kj::fwd<F>(job));
#endif
}

}  // namespace kvtier
