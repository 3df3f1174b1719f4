#include "integrations/llama/stage_worker.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvtier::llama {

namespace {

// Waits until done() holds: spinning first, then yielding the core.
template <typename Done>
void waitFor(Done done) {
  for (unsigned n = 0; !done(); ++n) {
    if (n < (1u << 14)) {
#if defined(__x86_64__)
      _mm_pause();
#endif
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace

StageWorker::StageWorker() : thread_([this] { serve(); }) {}

StageWorker::~StageWorker() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StageWorker::start(size_t steps, std::function<void(size_t)> fill, size_t lead) {
  {
    std::lock_guard lock(mutex_);
    fill_ = std::move(fill);
    steps_ = steps;
    lead_ = lead;
    filled_ = std::make_unique<std::atomic<bool>[]>(steps);  // all false
    next_.store(0, std::memory_order_relaxed);
    released_.store(0, std::memory_order_relaxed);
    cancel_.store(false, std::memory_order_relaxed);
    idle_ = false;
  }
  wake_.notify_all();
}

bool StageWorker::filled(size_t i) const { return filled_[i].load(std::memory_order_acquire); }

void StageWorker::await(size_t i) {
  waitFor([&] { return filled(i); });
}

bool StageWorker::claim(size_t i) {
  return i < steps_ && released_.load(std::memory_order_acquire) + lead_ > i &&
         next_.compare_exchange_strong(i, i + 1, std::memory_order_acq_rel);
}

bool StageWorker::fillNext() {
  const size_t i = next_.load(std::memory_order_acquire);
  if (!claim(i)) return false;
  fill_(i);
  filled_[i].store(true, std::memory_order_release);
  return true;
}

void StageWorker::release(size_t i) { released_.store(i + 1, std::memory_order_release); }

void StageWorker::finish() {
  cancel_.store(true, std::memory_order_release);
  std::unique_lock lock(mutex_);
  wake_.wait(lock, [&] { return idle_; });
  fill_ = nullptr;
}

void StageWorker::serve() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || !idle_; });
      if (stop_) return;
    }
    for (;;) {
      // The next step, once the caller has let go of step i - lead (or has begun it itself).
      const size_t i = next_.load(std::memory_order_acquire);
      if (i >= steps_) break;
      waitFor([&] {
        return cancel_.load(std::memory_order_acquire) ||
               released_.load(std::memory_order_acquire) + lead_ > i ||
               next_.load(std::memory_order_acquire) != i;
      });
      if (cancel_.load(std::memory_order_acquire)) break;
      if (!claim(i)) continue;  // the caller began it
      fill_(i);
      filled_[i].store(true, std::memory_order_release);
    }
    {
      std::lock_guard lock(mutex_);
      idle_ = true;
    }
    wake_.notify_all();
  }
}

}  // namespace kvtier::llama
