// Busy polling: a thread that expects a message within microseconds polls for it instead of
// sleeping in epoll_wait.
//
// Why: on small VMs a thread that sleeps lets its vCPU halt, and waking a halted vCPU costs tens of
// microseconds, more than the rest of a round trip. One Cap'n Proto call is three messages (Call,
// Return, Finish) where a raw ping-pong is two, and each may land on a sleeping thread. Polling for
// a few tens of microseconds after the last message (what Linux's SO_BUSY_POLL does for one socket)
// keeps the next message of a conversation from having to wake anyone. The CPU this spends is
// bounded: at most one window of polling after each burst of messages, none while none arrive.
#pragma once

#include <kj/async.h>
#include <kj/timer.h>

#include <chrono>

namespace kvtier {

// Keeps one thread's KJ event loop polling for I/O (epoll_wait without a timeout) rather than
// sleeping until `window` has passed since the last touch(). It works through the loop's timer:
// while polling, a timer that is always due makes the loop's wait return at once, and the loop
// still runs every other event in between. Belongs to the loop's thread, like the timer.
class BusyPoller {
 public:
  // `window` zero: never polls.
  BusyPoller(kj::Timer& timer, std::chrono::nanoseconds window) : timer_(timer), window_(window) {}
  BusyPoller(const BusyPoller&) = delete;
  BusyPoller& operator=(const BusyPoller&) = delete;

  // There was I/O: keep polling until `window` from now. Hot path: one clock read.
  void touch();

 private:
  kj::Promise<void> poll();

  kj::Timer& timer_;
  const std::chrono::nanoseconds window_;
  std::chrono::steady_clock::time_point deadline_;
  bool polling_ = false;
  kj::Promise<void> task_ = kj::READY_NOW;
};

// Waits for `promise` on the caller's event loop, polling for up to `window` before it sleeps: for a
// thread that has just sent a request and expects the answer soon.
template <typename T>
T waitBusyPolling(kj::Promise<T>&& promise, kj::WaitScope& waitScope,
                  std::chrono::nanoseconds window) {
  if (window.count() > 0) {
    const auto deadline = std::chrono::steady_clock::now() + window;
    while (!promise.poll(waitScope) && std::chrono::steady_clock::now() < deadline) {
    }
  }
  return promise.wait(waitScope);
}

}  // namespace kvtier
