// StageWorker: every step filled once, never into a buffer the caller still reads, whether the
// worker or the caller (fillNext) fills it; finish() stops a run midway.
#include "integrations/llama/stage_worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

namespace kvtier::llama {
namespace {

// One pipelined run of `steps` with `buffers` buffers, the caller helping when it waits; the
// fills and loads take random short times. What each fill saw is checked after the run.
struct Record {
  std::atomic<int> fills{0};
  std::atomic<size_t> releasedWhenBegun{0};
  std::thread::id by;
};

void spin(std::mt19937& rng, int maxMicros) {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::microseconds(rng() % (maxMicros + 1));
  while (std::chrono::steady_clock::now() < until) {
  }
}

TEST(StageWorkerTest, EveryStepIsFilledOnceAndNeverIntoABufferStillInUse) {
  StageWorker worker;
  std::mt19937 rng(7);
  size_t byCaller = 0, byWorker = 0;
  for (int run = 0; run < 200; ++run) {
    const size_t steps = 1 + rng() % 12, buffers = 2 + run % 2;
    std::vector<Record> records(steps);
    std::atomic<size_t> released{0};
    std::mutex rngMutex;
    std::mt19937 fillRng(run);
    worker.start(
        steps,
        [&](size_t i) {
          Record& r = records[i];
          r.releasedWhenBegun = released.load();
          r.by = std::this_thread::get_id();
          std::mt19937 local;
          {
            std::lock_guard lock(rngMutex);
            local.seed(fillRng());
          }
          spin(local, 40);
          r.fills.fetch_add(1);
        },
        buffers);
    {
      StageRun guard(worker);
      for (size_t i = 0; i < steps; ++i) {
        while (!worker.filled(i) && worker.fillNext()) {
        }
        worker.await(i);
        ASSERT_EQ(records[i].fills.load(), 1) << "step " << i << " read before it was filled";
        spin(rng, 40);  // the caller's load of step i
        released = i + 1;
        worker.release(i);
      }
    }
    for (size_t i = 0; i < steps; ++i) {
      const Record& r = records[i];
      EXPECT_EQ(r.fills.load(), 1) << "run " << run << " step " << i;
      // Step i's buffer is step i - buffers': it was let go of before step i began.
      EXPECT_GE(r.releasedWhenBegun.load() + buffers, i + 1) << "run " << run << " step " << i;
      (r.by == std::this_thread::get_id() ? byCaller : byWorker) += 1;
    }
  }
  // Both sides did fill steps (the caller at least whenever it found the worker asleep).
  EXPECT_GT(byCaller, 0u);
  EXPECT_GT(byWorker, 0u);
}

TEST(StageWorkerTest, AStoreRunFillsEachStepOnlyAfterTheCallerWroteIt) {
  StageWorker worker;
  for (int run = 0; run < 50; ++run) {
    constexpr size_t kSteps = 8;
    std::atomic<size_t> written{0};
    std::vector<size_t> seen(kSteps, 0);
    worker.start(
        kSteps, [&](size_t i) { seen[i] = written.load(); }, /*lead=*/0);
    StageRun guard(worker);
    for (size_t i = 0; i < kSteps; ++i) {
      written = i + 1;
      worker.release(i);
    }
    worker.await(kSteps - 1);
    for (size_t i = 0; i < kSteps; ++i) EXPECT_GE(seen[i], i + 1) << "step " << i;
  }
}

TEST(StageWorkerTest, FinishStopsARunBeforeTheStepsNotBegunAndTheWorkerServesTheNext) {
  StageWorker worker;
  std::atomic<int> fills{0};
  // Two buffers and nothing released: steps 0 and 1 at most can begin.
  worker.start(
      10, [&](size_t) { fills.fetch_add(1); }, /*lead=*/2);
  worker.await(1);
  EXPECT_FALSE(worker.fillNext());  // step 2's buffer is step 0's, still held
  worker.finish();
  EXPECT_EQ(fills.load(), 2);
  // The same worker runs the next restore in full.
  std::atomic<int> next{0};
  worker.start(
      3, [&](size_t) { next.fetch_add(1); }, /*lead=*/3);
  worker.await(2);
  worker.finish();
  EXPECT_EQ(next.load(), 3);
}

}  // namespace
}  // namespace kvtier::llama
