#include "transport/busy_poll.h"

namespace kvtier {

void BusyPoller::arrived() {
  const auto now = std::chrono::steady_clock::now();
  if (!conversation_.arrived(now)) return;
  deadline_ = now + conversation_.window();
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
