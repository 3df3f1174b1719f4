// ColdService: moves blocks between the engine's pool and the RocksDB cold tier, off the event
// loop.
//
// - Write-behind spill: sealed blocks that nothing holds are written in batches by a worker
//   thread while they stay pinned; once written, the engine may drop them from memory at no cost.
//   A failing disk pauses spilling (counted) and lets eviction drop unwritten blocks, so the
//   daemon keeps serving from memory; spilling retries after a back-off.
// - Promote: a lookup that reaches blocks held only on disk reads them back into fresh pool blocks
//   on the worker thread before it answers; concurrent promotes of one block coalesce.
// - Flush: a graceful shutdown writes every sealed block still only in memory.
//
// Thread-safety: everything here runs on the daemon's event loop, except the closures handed to
// the worker through its kj::Executor, which touch only the (thread-safe) ColdTier and pinned
// pool memory.
#pragma once

#include <kj/async.h>
#include <kj/timer.h>
#include <kj/vector.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/cold_tier.h"
#include "store/cold_directory.h"
#include "store/engine.h"

namespace kvtier {

struct ColdServiceStats {
  ColdStats tier;
  uint64_t spillErrors = 0;
  bool spillPaused = false;
};

// The engine's view of which blocks the cold tier holds.
class ColdTierDirectory final : public ColdDirectory {
 public:
  explicit ColdTierDirectory(const ColdTier& tier) : tier_(tier) {}
  bool contains(uint64_t fingerprint, const Salt& salt, const Key128& key) const override {
    return tier_.contains(ColdKey{fingerprint, salt, key});
  }

 private:
  const ColdTier& tier_;
};

class ColdService final : private kj::TaskSet::ErrorHandler {
 public:
  // How many spill batches a call short of memory waits for before it gives up (FULL, or a
  // promote that leaves its block cold). Shared by the server's calls and promotes.
  static constexpr int kMaxRoomWaits = 32;
  // After a failed spill (a full or failing disk), wait this long before trying again.
  static constexpr kj::Duration kDefaultSpillRetryDelay = 1 * kj::SECONDS;

  // `engine` and `timer` are borrowed and must outlive the service. Starts the worker thread.
  ColdService(Engine& engine, std::unique_ptr<ColdTier> tier, kj::Timer& timer,
              kj::Duration spillRetryDelay = kDefaultSpillRetryDelay);
  ~ColdService();

  // Starts a spill batch if there is work and none is in flight.
  void kick();
  // Resolves when the batch in flight (if any) has finished.
  kj::Promise<void> whenSpillSettles();
  // True when waiting for the spiller can free memory (work queued or in flight, not paused).
  bool canMakeRoom() const;
  // Reads the cold blocks `keys` of `space` back into the pool; resolves when all are done
  // (a block that cannot be read, or has no room, simply stays cold: the lookup stops before it).
  kj::Promise<void> promote(SpaceId space, std::vector<Key128> keys);
  // Writes every sealed block not yet on disk. Blocking; for shutdown.
  void flushAll(kj::WaitScope& waitScope);

  ColdServiceStats stats() const;

 private:
  void taskFailed(kj::Exception&& exception) override;
  void spillFinished(std::vector<SpillItem> batch, bool ok);
  // Reads one cold block back; waits for the spiller when the pool has no room yet.
  kj::Promise<void> promoteOne(SpaceId space, Key128 key, int waits);

  Engine& engine_;
  std::unique_ptr<ColdTier> tier_;
  ColdTierDirectory directory_;
  kj::Timer& timer_;
  kj::Duration spillRetryDelay_;
  std::thread worker_;
  const kj::Executor* workerExecutor_ = nullptr;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stopWorker_;  // ends the worker's loop
  bool spillInFlight_ = false;
  bool paused_ = false;
  uint64_t spillErrors_ = 0;
  std::vector<kj::Own<kj::PromiseFulfiller<void>>> settleWaiters_;
  std::map<std::string, kj::ForkedPromise<void>> promoting_;  // (space, key) -> promote in flight
  kj::TaskSet tasks_;
};

}  // namespace kvtier
