#pragma once

#include <chrono>
#include <thread>

namespace kvtier::test {

template <typename Pred>
Stats waitForStats(Client& client, Pred pred) {
  // The daemon notices a dead peer asynchronously; wait for the effect itself, with a deadline.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  Stats last = client.stats().value();
  while (!pred(last) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    last = client.stats().value();
  }
  return last;
}

}  // namespace kvtier::test
