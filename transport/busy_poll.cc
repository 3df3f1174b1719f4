#include "transport/busy_poll.h"

#include <algorithm>

namespace kvtier {

void BusyPoller::arrived() {
  const std::chrono::nanoseconds window = conversation_.window();
  if (window.count() == 0) return;
  const auto now = std::chrono::steady_clock::now();
  const auto until = now + (conversation_.arrived(now)
                                ? window
                                : std::min<std::chrono::nanoseconds>(window, kFollowUpPoll));
  if (until <= deadline_) return;
  deadline_ = until;
  if (polling_) return;
  polling_ = true;
  task_ = poll().eagerlyEvaluate(nullptr);
}

kj::Promise<void> BusyPoller::poll() {
  // Due already: the loop's next wait for I/O polls instead of sleeping, then fires this.
  return timer_.atTime(timer_.now()).then([this]() -> kj::Promise<void> {
    if (std::chrono::steady_clock::now() < deadline_) return poll();
    polling_ = false;
    return kj::READY_NOW;
  });
}

}  // namespace kvtier
