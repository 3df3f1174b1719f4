// ColdService: moves blocks between the engine's pool and the RocksDB cold tier, off the event
// loop.
//
// - Write-behind spill: sealed blocks that nothing holds are written in batches by a worker
//   thread while they stay pinned; once written, the engine may drop them from memory at no cost.
//   A failing disk pauses spilling (counted) and lets eviction drop unwritten blocks, so the
//   daemon keeps serving from memory; spilling retries after a back-off.
// - Promote: a lookup that reaches blocks held only on disk reads them back into fresh pool blocks
//   on the worker thread before it answers; concurrent promotes of one block coalesce.
// - Snapshots (write-behind): every new snapshot's manifest, the sealed blocks it names and its
//   own records (partial blocks, checkpoints) are written in one batch while its blocks stay
//   pinned. A snapshot unknown in memory (after a restart) is read back from its manifest on
//   demand; one whose manifest or records fail their checks or are gone is dropped, never
//   half-restored. Snapshot ids are reserved on disk in chunks, so that none is handed out twice
//   across restarts, crashes included.
// - Flush: a graceful shutdown writes every sealed block and snapshot still only in memory.
//
// Thread-safety: everything here runs on the daemon's event loop, except the closures handed to
// the worker through its kj::Executor, which touch only the (thread-safe) ColdTier and pinned
// pool memory.
#pragma once

#include <chrono>

#include <kj/async.h>
#include <kj/timer.h>
#include <kj/vector.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/cold_tier.h"
#include "daemon/worker_thread.h"
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
  // Snapshot ids are reserved on disk this many at a time, again when half are used: a restart
  // after a crash skips at most this many (a graceful one none).
  static constexpr uint64_t kSnapshotIdChunk = uint64_t{1} << 20;

  // `engine` and `timer` are borrowed and must outlive the service. Starts the worker threads
  // and reserves the first snapshot ids (a blocking write).
  ColdService(Engine& engine, std::unique_ptr<ColdTier> tier, kj::Timer& timer,
              kj::Duration spillRetryDelay = kDefaultSpillRetryDelay);
  ~ColdService();

  // Starts a spill batch and a snapshot write if there is work and none is in flight.
  void kick();
  // Resolves when the batch in flight (if any) has finished.
  kj::Promise<void> whenSpillSettles();
  // True when waiting for the spiller can free memory (work queued or in flight, not paused).
  bool canMakeRoom() const;
  // Reads the cold blocks `keys` of `space` back into the pool; resolves when all are done
  // (a block that cannot be read, or has no room, simply stays cold: the lookup stops before it).
  kj::Promise<void> promote(SpaceId space, std::vector<Key128> keys);
  // Writes what is not yet on disk until `deadline`: every snapshot (with the sealed blocks it
  // names) and the exact snapshot id high-water mark first, then sealed blocks most useful first
  // (Engine::takeAllUnspilledByValue), in batches sized to the time left; logs what it wrote and
  // what it left. Blocking; for shutdown (no snapshot is created afterwards). False when a write
  // already in flight did not finish by the deadline: it still runs on its worker, so the caller
  // must not destroy the service (or the pool it reads) but end the process.
  bool flushAll(kj::WaitScope& waitScope, std::chrono::steady_clock::time_point deadline =
                                              std::chrono::steady_clock::time_point::max());

  // Brings snapshot `id` of `space` back from disk when the engine does not hold it (after a
  // restart): its manifest and records are read on the worker into fresh pool blocks. Resolves
  // when the snapshot is in memory, or when the disk has none either (the engine then answers
  // NOT_FOUND). Rejects with a typed error (transport/rpc_codec.h): FULL when the pool has no
  // room; NOT_FOUND or CHECKSUM_MISMATCH when its manifest or a record it needs is gone or fails
  // its checks — it is then dropped from disk (counted) and nothing else changes; UNAVAILABLE on
  // a disk error. Loads of one snapshot coalesce. Only the (fingerprint, salt) of `space` is
  // searched: another tenant's snapshot of the same id is not found.
  kj::Promise<void> loadSnapshot(SpaceId space, SnapshotId id);
  // Drops snapshot `id` of `space` from memory and disk (after any load or write of it in
  // flight). Rejects with NOT_FOUND when neither holds it.
  kj::Promise<void> dropSnapshot(SpaceId space, SnapshotId id);
  // Deletes the records of blocks `keys` of `space` (a move's last step), after any write in
  // flight. Resolves to how many the disk held; rejects with UNAVAILABLE on a disk error.
  kj::Promise<size_t> eraseBlocks(SpaceId space, std::vector<Key128> keys);
  // What a call that failed with `code` may wait for before it tries again: the spill batch in
  // flight (FULL, when it can make room) or the reservation of snapshot ids (UNAVAILABLE, when
  // the engine ran out of them); nullptr when waiting cannot help.
  kj::Maybe<kj::Promise<void>> whenRetryable(ErrorCode code);

  ColdServiceStats stats() const;
  // Which blocks the cold tier holds (thread-safe, cheap).
  const ColdDirectory& directory() const { return directory_; }
  // The encoded manifest (daemon/snapshot_codec.h) of snapshot `id` of the namespace
  // (fingerprint, salt) as written on disk, read on the worker: for a peer that restores it.
  // Rejects with NOT_FOUND when the disk has none (not written yet, or dropped) and with
  // CHECKSUM_MISMATCH when it fails its checks.
  kj::Promise<std::string> encodedManifest(uint64_t fingerprint, const Salt& salt, SnapshotId id);
  // Every block the cold tier holds (a copy; for the cluster's directory at start).
  std::vector<ColdKey> blockKeys() const { return tier_->blockKeys(); }

 private:
  void taskFailed(kj::Exception&& exception) override;
  void spillFinished(std::vector<SpillItem> batch, bool ok);
  // The disk's write speed as spill batches measured it (bytes per second; 0 until one did),
  // never above the tier's configured bandwidth.
  double spillBytesPerSecond_ = 0;
  // Reads cold blocks back, in one job on the reader; the blocks that find no room wait for the
  // spiller (at most kMaxRoomWaits times in all) and are read in a batch of their own.
  kj::Promise<void> promoteBatch(SpaceId space, std::vector<Key128> keys, int waits);
  void kickSpill();
  // Starts writing the snapshots waiting for it, if no write is in flight.
  void writeSnapshots();
  void snapshotsWritten(const std::vector<SnapshotWrite>& writes, bool ok);
  // What a batch of snapshot writes puts, pointing into pinned pool blocks; blocks in GPU memory
  // are first copied (`copies`, run on the thread that writes) into host `staging`.
  struct SnapshotBatch {
    std::vector<SnapshotPut> puts;
    std::shared_ptr<std::vector<std::vector<uint8_t>>> staging;
    std::vector<BlockCopy> copies;
    // Runs the copies, then writes the puts. Blocking: for the worker (or shutdown).
    bool write(BlockMemory& memory, ColdTier& tier) const;
  };
  SnapshotBatch snapshotPuts(const std::vector<SnapshotWrite>& writes);
  // Reserves the next chunk of snapshot ids on disk when fewer than half a chunk are left.
  void reserveSnapshotIds();
  SnapshotKey snapshotKey(SpaceId space, SnapshotId id) const;
  kj::Promise<void> loadBlocks(SpaceId space, SnapshotKey key,
                               std::shared_ptr<const SnapshotManifest> manifest, int waits);
  // Drops a snapshot whose manifest or records failed (counted), then rejects with `why`.
  kj::Promise<void> dropBroken(SnapshotKey key, Error why);
  static kj::Promise<void> waitOn(std::vector<kj::Own<kj::PromiseFulfiller<void>>>& waiters);
  static void wakeAll(std::vector<kj::Own<kj::PromiseFulfiller<void>>>& waiters);

  Engine& engine_;
  std::unique_ptr<ColdTier> tier_;
  ColdTierDirectory directory_;
  kj::Timer& timer_;
  kj::Duration spillRetryDelay_;
  std::unique_ptr<WorkerThread> writer_;  // spill and snapshot writes/deletes, niceness 10
  std::unique_ptr<WorkerThread> reader_;  // promotes, snapshot loads, id reservations
  // Snapshots dropped whose deletion on disk is still queued (or failed and is retried): they
  // count as gone. Name -> key.
  std::map<std::string, SnapshotKey> erasing_;
  // Queues the deletion of a dropped snapshot on the writer (after its writes), retrying on error.
  void eraseLater(const std::string& name, SnapshotKey key);
  // Runs the deletions still pending, here and now (shutdown: queued ones would be cancelled).
  void erasePending();
  bool spillInFlight_ = false;
  bool paused_ = false;
  uint64_t spillErrors_ = 0;
  std::vector<kj::Own<kj::PromiseFulfiller<void>>> settleWaiters_;
  bool snapshotWriteInFlight_ = false;
  bool snapshotWritesPaused_ = false;
  std::vector<kj::Own<kj::PromiseFulfiller<void>>> snapshotWriteWaiters_;
  bool reservingIds_ = false;
  bool idsPaused_ = false;  // a reservation failed: the next waits for the retry delay
  bool closing_ = false;    // flushAll froze the snapshot ids
  std::vector<kj::Own<kj::PromiseFulfiller<void>>> idWaiters_;
  std::map<std::string, kj::ForkedPromise<void>> promoting_;  // (space, key) -> promote in flight
  struct Loading {
    kj::ForkedPromise<void> promise;
    std::shared_ptr<bool> done;  // settled: a later call starts afresh instead of joining it
    uint64_t generation;
  };
  // A load still in flight, by (space, id).
  kj::Maybe<Loading&> loadInFlight(const std::string& name);
  std::map<std::string, Loading> loading_;  // (space, id) -> load in flight
  uint64_t loadGeneration_ = 0;
  kj::TaskSet tasks_;
};

}  // namespace kvtier
