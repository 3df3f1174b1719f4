// The bound of kvtierd's stop: a thread that, if the daemon is still stopping at the deadline —
// a write to a slow or hung disk, RocksDB waiting for a compaction, etcd gone — removes the names
// it would leave behind (its socket, its pool's shared-memory segments), says so, and ends the
// process. What the cold tier holds stays consistent: RocksDB recovers from an end at any point
// (a write in flight is a miss after the restart, never wrong bytes). Destroyed before the
// deadline, it does nothing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvtier {

class ShutdownWatchdog {
 public:
  // `segments`: the pool's named segments (as shm_open names them, without the leading '/').
  ShutdownWatchdog(std::chrono::steady_clock::time_point deadline, std::string socketPath,
                   std::vector<std::string> segments);
  // Cancels (the stop finished in time) and joins.
  ~ShutdownWatchdog();
  // Ends the process now, as at the deadline (a stop that cannot finish: a write in flight that
  // must not have its memory destroyed under it).
  [[noreturn]] void endNow(const char* reason);
  ShutdownWatchdog(const ShutdownWatchdog&) = delete;
  ShutdownWatchdog& operator=(const ShutdownWatchdog&) = delete;

 private:
  void watch();

  const std::chrono::steady_clock::time_point deadline_;
  const std::string socketPath_;
  const std::vector<std::string> segments_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace kvtier
