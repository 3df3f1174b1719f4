#include "daemon/shutdown_watchdog.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "daemon/log.h"

namespace kvtier {

ShutdownWatchdog::ShutdownWatchdog(std::chrono::steady_clock::time_point deadline,
                                   std::string socketPath, std::vector<std::string> segments)
    : deadline_(deadline),
      socketPath_(std::move(socketPath)),
      segments_(std::move(segments)),
      thread_([this] { watch(); }) {}

ShutdownWatchdog::~ShutdownWatchdog() {
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ShutdownWatchdog::watch() {
  {
    std::unique_lock lock(mu_);
    if (cv_.wait_until(lock, deadline_, [this] { return done_; })) return;
  }
  // The main thread is still stopping (in a write, a close, a call to etcd): end here.
  endNow("still stopping at the shutdown deadline");
}

void ShutdownWatchdog::endNow(const char* reason) {
  // Only names are touched; the memory and the files stay as they are until the process is gone.
  for (const std::string& name : segments_) ::shm_unlink(("/" + name).c_str());
  ::unlink(socketPath_.c_str());
  logWarn("shutdown_forced", std::string("reason=\"") + reason +
                                 "\" segments_removed=" + std::to_string(segments_.size()));
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(0);
}

}  // namespace kvtier
