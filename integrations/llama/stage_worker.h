// StageWorker: a second thread for a restore in steps, so that kvtier's copy of step i+1 out of
// the pool (and its check against the writer's checksums) runs while llama.cpp loads step i.
//
// A restore is synchronous (the engine waits for it before it evaluates anything), so its
// llama.cpp threads are idle meanwhile; the worker takes a second core for the restore's length
// only. Buffers take turns: step i is filled into buffer i % lead once the caller has let go of
// step i - lead (release), the caller loads step i once it is filled (await). Steps are begun in
// order by whichever side is free: the worker takes the next one, and a caller waiting for step i
// may fill the next one itself (fillNext), so that neither core idles when kvtier's copy of a
// step takes longer than llama.cpp's load of one. Both sides spin briefly before they yield: a
// step takes from tens of microseconds to a few milliseconds, and a wake-up from sleep costs tens
// on the machines measured. Between restores the worker sleeps.
// A store in steps runs the other way round: llama.cpp writes step i + 1's state while the worker
// scatters step i into the pool.
//
// The worker never calls llama.cpp or the daemon: what it finds (a block that fails its check)
// it records for the caller, which reports it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace kvtier::llama {

class StageWorker {
 public:
  StageWorker();
  ~StageWorker();
  StageWorker(const StageWorker&) = delete;
  StageWorker& operator=(const StageWorker&) = delete;

  // Starts fill(0), fill(1), ..., fill(steps - 1), each once and begun in order; fill(i) begins
  // once release(i - lead) was called (lead buffers: the worker fills buffers the caller then
  // reads, a restore; lead 0: the worker reads what the caller wrote, a store). Only while no
  // other run is under way.
  void start(size_t steps, std::function<void(size_t)> fill, size_t lead);
  // Whether fill(i) has returned (its writes visible to the caller).
  bool filled(size_t i) const;
  // Returns once fill(i) has returned.
  void await(size_t i);
  // Runs the next fill not yet begun on the caller's thread when its buffer is free; false when
  // there is none to begin now.
  bool fillNext();
  // The caller is done with step i's buffer.
  void release(size_t i);
  // Ends the run: the worker stops before the next step it has not begun and this returns once it
  // is idle. Every run ends with finish(), also after its last step.
  void finish();

 private:
  void serve();
  // Takes step i as the next to begin, when its buffer is free and no one has begun it.
  bool claim(size_t i);

  std::mutex mutex_;
  std::condition_variable wake_;
  // The run (guarded by mutex_ while idle_; the worker's own while it runs).
  std::function<void(size_t)> fill_;
  size_t steps_ = 0;
  size_t lead_ = 0;
  bool idle_ = true;                 // guarded by mutex_
  bool stop_ = false;                // guarded by mutex_: the worker exits
  std::unique_ptr<std::atomic<bool>[]> filled_;  // per step: fill(i) returned
  std::atomic<size_t> next_{0};                  // the first step not begun
  std::atomic<size_t> released_{0};  // steps the caller let go of
  std::atomic<bool> cancel_{false};
  std::thread thread_;  // last: starts once the rest exists
};

// Ends a worker's run when it goes out of scope (StageWorker::finish), on every path.
class StageRun {
 public:
  explicit StageRun(StageWorker& worker) : worker_(worker) {}
  ~StageRun() { worker_.finish(); }
  StageRun(const StageRun&) = delete;
  StageRun& operator=(const StageRun&) = delete;

 private:
  StageWorker& worker_;
};

}  // namespace kvtier::llama
