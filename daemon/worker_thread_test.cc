// WorkerThread: jobs run off the event loop, in order, and their results and exceptions come back
// to the loop that asked; a job nobody awaits any more is skipped; destruction runs what is still
// awaited, then joins.
#include "daemon/worker_thread.h"

#include <gtest/gtest.h>
#include <kj/async.h>
#include <kj/debug.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace kvtier {
namespace {

TEST(WorkerThread, RunsJobsOffTheLoopInOrderAndReturnsTheirResults) {
  kj::EventLoop loop;
  kj::WaitScope waitScope(loop);
  WorkerThread worker("kvtier-test");
  const auto loopThread = std::this_thread::get_id();
  std::vector<int> order;  // written only by the worker, read after every job is done
  std::vector<kj::Promise<std::string>> results;
  for (int i = 0; i < 50; ++i) {
    results.push_back(worker.run([i, &order, loopThread]() {
      EXPECT_NE(std::this_thread::get_id(), loopThread);
      order.push_back(i);
      return std::to_string(i * i);
    }));
  }
  for (int i = 0; i < 50; ++i) EXPECT_EQ(results[i].wait(waitScope), std::to_string(i * i));
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
  // A job with no result.
  std::atomic<bool> ran{false};
  worker.run([&ran]() { ran = true; }).wait(waitScope);
  EXPECT_TRUE(ran);
}

// The description of the exception `f` throws ("" if none).
template <typename F>
std::string thrown(F&& f) {
  KJ_IF_MAYBE (e, kj::runCatchingExceptions(kj::fwd<F>(f))) {
    return e->getDescription().cStr();
  }
  return "";
}

TEST(WorkerThread, AJobsExceptionBreaksItsPromiseOnly) {
  kj::EventLoop loop;
  kj::WaitScope waitScope(loop);
  WorkerThread worker("kvtier-test");
  auto bad = worker.run([]() -> int { KJ_FAIL_REQUIRE("the disk is gone"); });
  auto good = worker.run([]() { return 7; });
  EXPECT_NE(thrown([&]() { bad.wait(waitScope); }).find("the disk is gone"), std::string::npos);
  EXPECT_EQ(good.wait(waitScope), 7);
  auto voidBad = worker.run([]() { KJ_FAIL_REQUIRE("no room"); });
  EXPECT_NE(thrown([&]() { voidBad.wait(waitScope); }).find("no room"), std::string::npos);
}

// A job whose promise is dropped before it starts does not run; destruction still runs the jobs
// whose results are awaited (their promises resolve afterwards on the loop).
TEST(WorkerThread, SkipsJobsNobodyAwaitsAndDrainsTheRestWhenDestroyed) {
  kj::EventLoop loop;
  kj::WaitScope waitScope(loop);
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  kj::Promise<int> kept = nullptr;
  {
    WorkerThread worker("kvtier-test");
    auto blocker = worker.run([&release]() {
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    { auto dropped = worker.run([&ran]() { ran += 100; }); }  // dropped before it can start
    kept = worker.run([&ran]() {
      ran += 1;
      return 42;
    });
    release = true;
    blocker.wait(waitScope);
  }  // joins after running `kept`'s job
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(kept.wait(waitScope), 42);
}

}  // namespace
}  // namespace kvtier
