// Busy polling: a thread that expects a message within microseconds polls for it instead of
// sleeping in epoll_wait, while the conversation is hot.
//
// Why: on small VMs a thread that sleeps lets its vCPU halt, and waking a halted vCPU costs tens of
// microseconds, more than the rest of a round trip. One Cap'n Proto call is three messages (Call,
// Return, Finish) where a raw ping-pong is two, and each may land on a sleeping thread. Polling for
// a few tens of microseconds (what Linux's SO_BUSY_POLL does for one socket) keeps the next message
// of a conversation from having to wake anyone.
//
// Only while the conversation is hot, that is when the previous message came within the window:
// the first message after a pause finds its peer asleep, and a Unix-socket write wakes the sleeper
// as a "sync" wakeup, which the scheduler places on the writer's core expecting the writer to sleep
// next. A writer that polls instead holds that core, and the peer waits for it (measured: a lookup
// after a 500 us pause took 190 us with polling against 110 us without). The CPU this spends is
// bounded: at most one window of polling after each message of a hot conversation, none while no
// messages arrive.
#pragma once

#include <kj/async.h>
#include <kj/timer.h>

#include <chrono>

namespace kvtier {

// The longest window kvtierd and the SDK accept: polling longer than a scheduler slice only burns
// CPU (the thread would be preempted anyway).
inline constexpr std::chrono::microseconds kMaxBusyPoll{10000};

// Tells whether a conversation is hot: arrived() within `window` of the previous arrival.
class Conversation {
 public:
  explicit Conversation(std::chrono::nanoseconds window) : window_(window) {}

  // A message arrived now; returns whether the previous one came within the window (never with a
  // zero window). Hot path: one clock read.
  bool arrived(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) {
    const bool wasHot = hot(now);
    last_ = now;
    return wasHot;
  }
  // Whether a message now would be hot, without recording one.
  bool hot(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) const {
    return window_.count() > 0 && now - last_ <= window_;
  }
  std::chrono::nanoseconds window() const { return window_; }

 private:
  const std::chrono::nanoseconds window_;
  std::chrono::steady_clock::time_point last_;
};

// Keeps one thread's KJ event loop polling for I/O (epoll_wait without a timeout) rather than
// sleeping, for `window` after each message of a hot conversation, and briefly (kFollowUpPoll)
// after any other: the rest of a call's messages (its Finish, a lease's Release, the next call)
// follow within microseconds. Measured: a one-block lookup 24 µs with the brief poll against
// 34 µs without, and the hot lookups under spill no worse. It works through the loop's
// timer: while polling, a timer that is always due makes the loop's wait return at once, and the
// loop still runs every other event in between. Belongs to the loop's thread, like the timer.
class BusyPoller {
 public:
  static constexpr std::chrono::microseconds kFollowUpPoll{10};

  // `window` zero: never polls.
  BusyPoller(kj::Timer& timer, std::chrono::nanoseconds window)
      : timer_(timer), conversation_(window) {}
  BusyPoller(const BusyPoller&) = delete;
  BusyPoller& operator=(const BusyPoller&) = delete;

  // A message arrived: poll until `window` from now if the conversation is hot, else until
  // kFollowUpPoll from now (never shortening a poll under way).
  void arrived();
  bool polling() const { return polling_; }

 private:
  kj::Promise<void> poll();

  kj::Timer& timer_;
  Conversation conversation_;
  std::chrono::steady_clock::time_point deadline_;
  bool polling_ = false;
  kj::Promise<void> task_ = kj::READY_NOW;
};

// Waits on the caller's event loop for the answer to a request just sent, polling for up to the
// window before it sleeps if `answers` is hot (the previous answer came within the window, so the
// daemon is likely still polling); records the answer's arrival.
template <typename T>
T waitForAnswer(kj::Promise<T>&& promise, kj::WaitScope& waitScope, Conversation& answers) {
  const auto sent = std::chrono::steady_clock::now();
  if (answers.hot(sent)) {
    const auto deadline = sent + answers.window();
    while (!promise.poll(waitScope) && std::chrono::steady_clock::now() < deadline) {
    }
  }
  if constexpr (std::is_void_v<T>) {
    promise.wait(waitScope);
    answers.arrived();
  } else {
    T value = promise.wait(waitScope);
    answers.arrived();
    return value;
  }
}

}  // namespace kvtier
