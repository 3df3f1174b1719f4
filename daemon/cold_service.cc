#include "daemon/cold_service.h"

#include <kj/debug.h>

#include <algorithm>
#include <memory>

#include "daemon/log.h"
#include "daemon/snapshot_codec.h"
#include "transport/cross_thread.h"
#include "transport/rpc_codec.h"

namespace kvtier {
namespace {

// Blocks per spill batch: one RocksDB write batch (a few MiB to tens of MiB).
constexpr size_t kSpillBatchBlocks = 64;
// Small blocks fill a batch up to this many bytes instead: every batch ends in a flush (the
// spill skips the write-ahead log) and leaves a table file, and 64 blocks of 1 KiB made one file
// per 64 KiB: flushes, fsyncs and compactions took more time than the replay itself
// (docs/cold-tier.md, "Speed").
constexpr uint64_t kSpillBatchBytes = uint64_t{4} << 20;
constexpr size_t kMaxSpillBatchBlocks = 65536;
// A spill batch in flight is what a stop must wait for (it cannot be cut short): on a disk whose
// measured speed would make a batch longer than this, batches are cut to about this much writing
// (at least one block). A default batch of large blocks (64 of 2 MiB) took 2.5 s at 50 MB/s.
constexpr double kSpillBatchSeconds = 0.5;
// Batches that would take less than this long at the disk's speed keep the default size.
constexpr uint64_t kDefaultBatchMaxBytes = uint64_t{128} << 20;

std::string promoteKey(SpaceId space, const Key128& key) {
  return std::to_string(space) + ":" + key.hex();
}

std::string loadKey(SpaceId space, SnapshotId id) {
  return std::to_string(space) + "#" + std::to_string(id);
}

// Runs `job` (which returns whether it succeeded) on `worker`. A job that throws, or a worker
// that is gone, counts as a failure: whatever waits on it still finishes and unpins.
template <typename F>
kj::Promise<bool> attempt(WorkerThread& worker, F&& job) {
  return worker.run(kj::fwd<F>(job)).catch_([](kj::Exception&&) { return false; });
}

}  // namespace

ColdService::ColdService(Engine& engine, std::unique_ptr<ColdTier> tier, kj::Timer& timer,
                         kj::Duration spillRetryDelay)
    : engine_(engine),
      tier_(std::move(tier)),
      directory_(*tier_),
      timer_(timer),
      spillRetryDelay_(spillRetryDelay),
      tasks_(*this) {
  // Two workers: background writes (spill, snapshot writes and deletes, in order) at lowered
  // priority, so that they yield the CPU to the event loop serving hot lookups; and reads a
  // lookup or restore waits for (promotes, snapshot loads), at normal priority, never queued
  // behind a write batch.
  writer_ = std::make_unique<WorkerThread>("kvtier-spill", WorkerThread::Priority::kBackground);
  reader_ = std::make_unique<WorkerThread>("kvtier-promote", WorkerThread::Priority::kNormal);
  // Snapshot ids start above everything an earlier run may have handed out, and none is handed
  // out before its chunk is reserved on disk (if this write fails, the first snapshot call
  // tries again).
  const SnapshotId floor = tier_->snapshotIdFloor();
  engine_.setSnapshotIds(floor, floor);
  if (tier_->storeSnapshotIdLimit(floor + kSnapshotIdChunk)) {
    engine_.setSnapshotIds(floor, floor + kSnapshotIdChunk);
  }
  engine_.setColdDirectory(&directory_);
}

ColdService::~ColdService() {
  engine_.setColdDirectory(nullptr);
  erasePending();  // a drop the client was told of must not come back after a restart
  writer_.reset();
  reader_.reset();
}

bool ColdService::canMakeRoom() const {
  return !paused_ && (spillInFlight_ || engine_.spillBacklog() > 0);
}

void ColdService::kick() {
  // Blocks evicted since: their records are now the only copies (memory-only bookkeeping).
  if (auto left = engine_.takeLeftMemory(); !left.empty()) {
    std::vector<ColdKey> keys;
    keys.reserve(left.size());
    for (const LeftMemory& block : left)
      keys.push_back(ColdKey{block.fingerprint, block.salt, block.key});
    tier_->leftMemory(keys);
  }
  kickSpill();
  writeSnapshots();
  reserveSnapshotIds();
}

void ColdService::kickSpill() {
  if (spillInFlight_ || paused_ || closing_) return;  // closing: flushAll writes the rest
  // kSpillBatchBlocks blocks, or more while under kSpillBatchBytes (small blocks); on a slow disk
  // about kSpillBatchSeconds of writing.
  double speed = spillBytesPerSecond_;
  if (const uint64_t given = tier_->writeBytesPerSecond(); given > 0) {
    speed = speed > 0 ? std::min(speed, static_cast<double>(given)) : static_cast<double>(given);
  }
  const double timeCap = speed * kSpillBatchSeconds;
  auto batch =
      speed > 0 && timeCap < static_cast<double>(kDefaultBatchMaxBytes)
          ? engine_.takeSpillBatch(kMaxSpillBatchBlocks,
                                   std::max<uint64_t>(1, static_cast<uint64_t>(timeCap)), 1)
          : engine_.takeSpillBatch(kMaxSpillBatchBlocks, kSpillBatchBytes, kSpillBatchBlocks);
  if (batch.empty()) return;
  spillInFlight_ = true;
  std::vector<ColdRecord> records;
  for (const auto& item : batch) {
    const uint8_t* data = engine_.memory().extentBase(item.location.extent) + item.location.offset;
    records.push_back(ColdRecord{ColdKey{item.fingerprint, item.salt, item.key}, data,
                                 item.location.bytes, item.checksum});
  }
  // The blocks stay pinned until spillFinished: the worker reads them in place.
  auto took = std::make_shared<double>(0);
  auto written = attempt(*writer_, [this, took, records = std::move(records)]() {
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = tier_->putBatch(records).ok();
    *took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return ok;
  });
  tasks_.add(written.then([this, took, batch = std::move(batch)](bool ok) mutable {
    if (ok && *took > 0) {
      uint64_t bytes = 0;
      for (const SpillItem& item : batch) bytes += item.location.bytes;
      const double measured = static_cast<double>(bytes) / *took;
      // A moving average: one slow batch (a compaction beside it) does not halve the next.
      spillBytesPerSecond_ =
          spillBytesPerSecond_ > 0 ? 0.7 * spillBytesPerSecond_ + 0.3 * measured : measured;
    }
    spillFinished(std::move(batch), ok);
  }));
}

void ColdService::spillFinished(std::vector<SpillItem> batch, bool ok) {
  engine_.finishSpill(batch, ok);
  spillInFlight_ = false;
  wakeAll(settleWaiters_);
  if (ok) {
    kick();
    return;
  }
  // Pause: serve from memory (eviction may drop unwritten blocks) and retry later.
  ++spillErrors_;
  paused_ = true;
  engine_.setSpillPaused(true);
  logWarn("spill_paused", "blocks=" + std::to_string(batch.size()));
  tasks_.add(timer_.afterDelay(spillRetryDelay_).then([this] {
    paused_ = false;
    engine_.setSpillPaused(false);
    kick();
  }));
}

kj::Promise<void> ColdService::waitOn(std::vector<kj::Own<kj::PromiseFulfiller<void>>>& waiters) {
  auto paf = kj::newPromiseAndFulfiller<void>();
  waiters.push_back(kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

void ColdService::wakeAll(std::vector<kj::Own<kj::PromiseFulfiller<void>>>& waiters) {
  for (auto& waiter : waiters) waiter->fulfill();
  waiters.clear();
}

kj::Promise<void> ColdService::whenSpillSettles() {
  if (!spillInFlight_) return kj::READY_NOW;
  return waitOn(settleWaiters_);
}

kj::Promise<void> ColdService::promote(SpaceId space, std::vector<Key128> keys) {
  return promoteBatch(space, std::move(keys), 0);
}

kj::Promise<void> ColdService::promoteBatch(SpaceId space, std::vector<Key128> keys, int waits) {
  // One read job on the worker for the whole batch: a lookup's cold blocks used to cost a thread
  // round trip each (a wake-up of the worker, then of the loop), and those, not the reads, were
  // most of a cold lookup's time (docs/cold-tier.md, "Speed").
  kj::Vector<kj::Promise<void>> pending;
  std::vector<Key128> fresh;
  for (const Key128& key : keys) {
    auto it = promoting_.find(promoteKey(space, key));
    if (it != promoting_.end()) {
      pending.add(it->second.addBranch());  // the same read, already going
    } else {
      fresh.push_back(key);
    }
  }
  std::vector<PromoteTicket> tickets;
  std::vector<Key128> noRoom;
  ErrorCode noRoomCode = ErrorCode::kOk;
  // Blocks for all of them at once; short of room for all, for as many as there is room for.
  auto all = engine_.beginPromotes(space, fresh);
  if (all) {
    tickets = std::move(all).value();
  } else {
    for (const Key128& key : fresh) {
      if (!noRoom.empty()) {  // the pool is short already: the rest waits with it
        noRoom.push_back(key);
        continue;
      }
      auto ticket = engine_.beginPromote(space, key);
      if (!ticket) {
        noRoom.push_back(key);
        noRoomCode = ticket.code();
        continue;
      }
      tickets.push_back(*ticket);
    }
  }
  // A key back in memory meanwhile has nothing to read.
  std::erase_if(tickets, [](const PromoteTicket& t) { return t.block == kNoBlock; });
  if (!tickets.empty()) {
    std::vector<ColdTier::Read> reads;
    // The checksum each record was verified against: the promoted block's own from here.
    auto sums = std::make_shared<std::vector<uint64_t>>(tickets.size());
    for (size_t i = 0; i < tickets.size(); ++i) {
      const PromoteTicket& t = tickets[i];
      const SpaceInfo& sp = engine_.space(space);
      reads.push_back({ColdKey{sp.fingerprint, sp.salt, t.key},
                       engine_.memory().extentBase(t.location.extent) + t.location.offset,
                       t.location.bytes, &(*sums)[i]});
    }
    auto read = reader_
                    ->run([this, reads = std::move(reads), sums]() {
                      // Missing, corrupt or of the wrong size: a miss (the lookup stops there).
                      std::vector<Status> got = tier_->getManyInto(reads);
                      std::vector<uint8_t> ok(got.size());
                      for (size_t i = 0; i < got.size(); ++i) ok[i] = got[i].ok();
                      return ok;
                    })
                    .catch_([n = tickets.size()](kj::Exception&&) {
                      return std::vector<uint8_t>(n, 0);  // the worker is gone: all misses
                    });
    // The service owns one branch, so the reads always finish (and unpin their blocks) even when
    // every lookup waiting for them is cancelled; that branch, not the reads themselves, forgets
    // the entries, so no fork is destroyed while it runs.
    auto done = read.then([this, tickets, sums](std::vector<uint8_t> ok) mutable {
      for (size_t i = 0; i < tickets.size(); ++i) {
        if (ok[i]) tickets[i].checksum = (*sums)[i];
        engine_.finishPromote(tickets[i], ok[i] != 0);
      }
    });
    auto forked = done.fork();
    pending.add(forked.addBranch());
    std::vector<std::string> ids;
    for (const PromoteTicket& t : tickets) {
      ids.push_back(promoteKey(space, t.key));
      promoting_.emplace(ids.back(), forked.addBranch().fork());
    }
    tasks_.add(forked.addBranch().then([this, ids = std::move(ids)] {
      for (const std::string& id : ids) promoting_.erase(id);
    }));
  }
  if (!noRoom.empty() && waits < kMaxRoomWaits) {
    // No block to read into: as for any allocating call, wait for the spill batch in flight when
    // it can make room; otherwise the blocks stay cold and the lookup stops before them.
    KJ_IF_MAYBE (room, whenRetryable(noRoomCode)) {
      pending.add(room->then([this, space, noRoom = std::move(noRoom), waits]() mutable {
        return promoteBatch(space, std::move(noRoom), waits + 1);
      }));
    }
  }
  return kj::joinPromises(pending.releaseAsArray());
}

bool ColdService::flushAll(kj::WaitScope& waitScope,
                           std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  closing_ = true;  // no new snapshot write or id reservation starts
  // The write in flight (a spill batch, a snapshot write, an id reservation) runs on a worker and
  // cannot be cut short: it is waited for until the deadline, and abandoned past it.
  while (spillInFlight_ || snapshotWriteInFlight_ || reservingIds_) {
    kj::Promise<void> settled = spillInFlight_           ? whenSpillSettles()
                                : snapshotWriteInFlight_ ? waitOn(snapshotWriteWaiters_)
                                                         : waitOn(idWaiters_);
    // (A year stands for no deadline: kj's timer adds the delay to its clock.)
    const auto left = std::clamp<Clock::duration>(deadline - Clock::now(), Clock::duration::zero(),
                                                  std::chrono::hours(24 * 365));
    const bool inTime =
        settled.then([] { return true; })
            .exclusiveJoin(
                timer_
                    .afterDelay(std::chrono::duration_cast<std::chrono::nanoseconds>(left).count() *
                                kj::NANOSECONDS)
                    .then([] { return false; }))
            .wait(waitScope);
    if (!inTime) {
      logWarn("cold_flush_abandoned",
              "reason=\"a write in flight did not finish by the shutdown deadline\" unspilled=" +
                  std::to_string(engine_.spillBacklog()));
      return false;
    }
  }
  // From here on nothing runs the event loop: no call interleaves with the writes below.
  erasePending();
  // Snapshots in memory whose block records the capacity bound took are written again.
  const size_t rewritten = engine_.rewriteSnapshotsMissing([this](SpaceId space, const Key128& k) {
    const SpaceInfo& sp = engine_.space(space);
    return tier_->contains(ColdKey{sp.fingerprint, sp.salt, k});
  });

  // Snapshots first: they are promised to outlive the daemon, blocks are a cache. Each write
  // carries the records of the sealed blocks it names.
  engine_.setSnapshotIds(0, engine_.nextSnapshotId());  // no new id from here
  size_t snapshots = 0;
  for (bool ok = true; ok && Clock::now() < deadline;) {
    const auto writes = engine_.takeSnapshotWrites(kSpillBatchBlocks);
    if (writes.empty()) break;
    ok = snapshotPuts(writes).write(engine_.memory(), *tier_);
    engine_.finishSnapshotWrites(writes, ok);
    if (ok) snapshots += writes.size();
  }
  const bool idsStored = tier_->storeSnapshotIdLimit(engine_.nextSnapshotId()).ok();
  logInfo("cold_flush_snapshots",
          "snapshots=" + std::to_string(snapshots) + " rewritten=" + std::to_string(rewritten) +
              " left=" + std::to_string(engine_.snapshotWriteBacklog()) + " next_id=" +
              std::to_string(engine_.nextSnapshotId()) + " ids_stored=" + (idsStored ? "1" : "0"));

  // Then the blocks, most useful first, in batches sized to the time left at the rate the disk
  // has shown: the last batch ends about at the deadline rather than a whole batch past it.
  const auto items = engine_.takeAllUnspilledByValue();
  size_t at = 0, written = 0;
  uint64_t writtenBytes = 0;
  double bytesPerSecond = 0;  // measured; 0 until the first batch
  while (at < items.size()) {
    const auto now = Clock::now();
    if (now >= deadline) break;
    size_t end = std::min(items.size(), at + kSpillBatchBlocks);
    if (bytesPerSecond > 0) {
      const double fits = bytesPerSecond * std::chrono::duration<double>(deadline - now).count();
      uint64_t bytes = 0;
      size_t n = 0;
      while (at + n < end && bytes + items[at + n].location.bytes <= fits) {
        bytes += items[at + n].location.bytes;
        ++n;
      }
      if (n == 0) break;  // not even one more block would make it
      end = at + n;
    }
    std::vector<ColdRecord> records;
    uint64_t bytes = 0;
    for (size_t i = at; i < end; ++i) {
      const auto& item = items[i];
      records.push_back(
          ColdRecord{ColdKey{item.fingerprint, item.salt, item.key},
                     engine_.memory().extentBase(item.location.extent) + item.location.offset,
                     item.location.bytes, item.checksum});
      bytes += item.location.bytes;
    }
    const auto t0 = Clock::now();
    const bool ok = tier_->putBatch(records).ok();
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    engine_.finishSpill(std::span(items).subspan(at, end - at), ok);
    if (ok) {
      written += end - at;
      writtenBytes += bytes;
      bytesPerSecond = took > 0 ? static_cast<double>(bytes) / took : 0;
    }
    at = end;
  }
  // What the deadline left: still only in memory, lost with it (a cache's loss, counted here).
  uint64_t leftBytes = 0;
  for (size_t i = at; i < items.size(); ++i) leftBytes += items[i].location.bytes;
  engine_.finishSpill(std::span(items).subspan(at), false);
  (at < items.size() ? logWarn : logInfo)(
      "cold_flush", "blocks=" + std::to_string(written) + " of=" + std::to_string(items.size()) +
                        " bytes=" + std::to_string(writtenBytes) +
                        " left=" + std::to_string(items.size() - at) +
                        " left_bytes=" + std::to_string(leftBytes) +
                        (at < items.size() ? " reason=\"shutdown deadline\"" : ""));
  return true;
}

// ---------------------------------------------------------------------------------------------
// Snapshots

SnapshotKey ColdService::snapshotKey(SpaceId space, SnapshotId id) const {
  const SpaceInfo& sp = engine_.space(space);
  return SnapshotKey{sp.fingerprint, sp.salt, id};
}

ColdService::SnapshotBatch ColdService::snapshotPuts(const std::vector<SnapshotWrite>& writes) {
  SnapshotBatch batch;
  batch.staging = std::make_shared<std::vector<std::vector<uint8_t>>>();
  // Host-pool blocks are read in place; a GPU block is staged through host memory first.
  size_t staged = 0;
  for (const auto& w : writes) {
    for (const auto& b : w.sealed) staged += !engine_.memory().hostAddressable(b.location.extent);
    for (const auto& b : w.own) staged += !engine_.memory().hostAddressable(b.location.extent);
  }
  batch.staging->reserve(staged);  // no reallocation: the puts point into its buffers
  auto at = [this, &batch](const BlockLocation& l, uint32_t bytes) -> const uint8_t* {
    uint8_t* block = engine_.memory().extentBase(l.extent) + l.offset;
    if (engine_.memory().hostAddressable(l.extent)) return block;
    batch.staging->emplace_back(bytes);
    batch.copies.push_back(BlockCopy{batch.staging->back().data(), block, bytes});
    return batch.staging->back().data();
  };
  for (const auto& w : writes) {
    SnapshotPut put{&w.manifest, {}, {}};
    for (const auto& b : w.sealed) {
      put.sealed.push_back(ColdRecord{ColdKey{w.manifest.fingerprint, w.manifest.salt, b.key},
                                      at(b.location, b.bytes), b.bytes, b.checksum});
    }
    for (const auto& b : w.own) {
      put.own.push_back(SnapshotRecord{b.slot, at(b.location, b.bytes), b.bytes, b.checksum});
    }
    batch.puts.push_back(std::move(put));
  }
  return batch;
}

bool ColdService::SnapshotBatch::write(BlockMemory& memory, ColdTier& tier) const {
  for (const auto& c : copies) memory.copy(c.dst, c.src, c.bytes);
  return tier.putSnapshots(puts).ok();
}

void ColdService::writeSnapshots() {
  if (snapshotWriteInFlight_ || snapshotWritesPaused_ || closing_) return;
  auto writes = std::make_shared<const std::vector<SnapshotWrite>>(
      engine_.takeSnapshotWrites(kSpillBatchBlocks));
  if (writes->empty()) return;
  snapshotWriteInFlight_ = true;
  // The writes' blocks stay pinned until snapshotsWritten: the worker reads them in place, and
  // the puts point into *writes, which both closures keep alive.
  auto written = attempt(*writer_, [this, writes, batch = snapshotPuts(*writes)]() {
    return batch.write(engine_.memory(), *tier_);
  });
  tasks_.add(written.then([this, writes](bool ok) { snapshotsWritten(*writes, ok); }));
}

void ColdService::snapshotsWritten(const std::vector<SnapshotWrite>& writes, bool ok) {
  engine_.finishSnapshotWrites(writes, ok);
  snapshotWriteInFlight_ = false;
  wakeAll(snapshotWriteWaiters_);
  if (ok) {
    writeSnapshots();
    return;
  }
  // A full or failing disk: the snapshots stay in memory and are tried again later.
  snapshotWritesPaused_ = true;
  logWarn("snapshot_writes_paused", "snapshots=" + std::to_string(writes.size()));
  tasks_.add(timer_.afterDelay(spillRetryDelay_).then([this] {
    snapshotWritesPaused_ = false;
    writeSnapshots();
  }));
}

void ColdService::reserveSnapshotIds() {
  const SnapshotId next = engine_.nextSnapshotId(), limit = engine_.snapshotIdLimit();
  if (reservingIds_ || idsPaused_ || closing_ || limit - next >= kSnapshotIdChunk / 2) return;
  reservingIds_ = true;
  const SnapshotId newLimit = next + kSnapshotIdChunk;
  auto stored =
      attempt(*reader_, [this, newLimit]() { return tier_->storeSnapshotIdLimit(newLimit).ok(); });
  tasks_.add(stored.then([this, newLimit](bool ok) {
    reservingIds_ = false;
    // Only a limit on disk may be used: ids below it are never handed out again.
    if (ok && !closing_) engine_.setSnapshotIds(0, std::max(newLimit, engine_.snapshotIdLimit()));
    if (!ok) {
      // A failing disk: back off like spilling (each try may reopen the database).
      logWarn("snapshot_ids_not_reserved", "limit=" + std::to_string(newLimit));
      idsPaused_ = true;
      tasks_.add(timer_.afterDelay(spillRetryDelay_).then([this] {
        idsPaused_ = false;
        reserveSnapshotIds();
      }));
    }
    wakeAll(idWaiters_);
  }));
}

kj::Maybe<kj::Promise<void>> ColdService::whenRetryable(ErrorCode code) {
  if (code == ErrorCode::kFull && canMakeRoom()) {
    kick();
    return whenSpillSettles();
  }
  if (code == ErrorCode::kUnavailable) {
    reserveSnapshotIds();
    if (reservingIds_) return waitOn(idWaiters_);
  }
  return nullptr;
}

kj::Promise<void> ColdService::loadSnapshot(SpaceId space, SnapshotId id) {
  if (engine_.hasSnapshot(space, id)) return kj::READY_NOW;
  const std::string name = loadKey(space, id);
  KJ_IF_MAYBE (going, loadInFlight(name)) return going->promise.addBranch();  // coalesce
  const SnapshotKey key = snapshotKey(space, id);
  // Nowhere (or dropped, its deletion still queued): the engine answers NOT_FOUND.
  if (erasing_.count(name) || !tier_->hasSnapshot(key)) return kj::READY_NOW;
  auto read = reader_->run([this, key]() {
    // A manifest that fails its checks is dropped (and counted) by the tier.
    auto manifest = tier_->getSnapshot(key);
    if (!manifest) throwRpcError(manifest.error());
    return std::make_shared<const SnapshotManifest>(std::move(manifest).value());
  });
  auto done = read.then(
      [this, space, key](std::shared_ptr<const SnapshotManifest> manifest) {
        return loadBlocks(space, key, kj::mv(manifest), 0);
      },
      [](kj::Exception&& e) -> kj::Promise<void> {
        if (fromKjException(e).code() == ErrorCode::kNotFound) return kj::READY_NOW;  // raced
        return kj::mv(e);
      });
  // As for promotes: a service-owned branch finishes every load (its pins are always released)
  // and forgets it, even when every caller waiting for it went away. A call that comes between
  // the end of the load and that branch does not join the settled load: it starts afresh.
  auto settled = std::make_shared<bool>(false);
  auto forked = done.then([settled]() { *settled = true; },
                          [settled](kj::Exception&& e) {
                            *settled = true;
                            kj::throwRecoverableException(kj::mv(e));
                          })
                    .fork();
  auto branch = forked.addBranch();
  const uint64_t generation = ++loadGeneration_;
  auto forget = [this, name, generation]() {
    auto entry = loading_.find(name);
    if (entry != loading_.end() && entry->second.generation == generation) loading_.erase(entry);
  };
  tasks_.add(
      forked.addBranch().then([forget]() { forget(); }, [forget](kj::Exception&&) { forget(); }));
  loading_.erase(name);  // a settled one: its own branch will not touch the new entry
  loading_.emplace(name, Loading{kj::mv(forked), settled, generation});
  return branch;
}

kj::Maybe<ColdService::Loading&> ColdService::loadInFlight(const std::string& name) {
  auto it = loading_.find(name);
  if (it == loading_.end() || *it->second.done) return nullptr;
  return it->second;
}

kj::Promise<void> ColdService::loadBlocks(SpaceId space, SnapshotKey key,
                                          std::shared_ptr<const SnapshotManifest> manifest,
                                          int waits) {
  if (engine_.hasSnapshot(space, key.id)) return kj::READY_NOW;
  auto begun = engine_.beginSnapshotLoad(space, *manifest);
  if (!begun) {
    if (begun.code() == ErrorCode::kFull) {
      // As for any allocating call: wait for the spill batch in flight when it can make room.
      if (waits < kMaxRoomWaits) {
        KJ_IF_MAYBE (room, whenRetryable(ErrorCode::kFull)) {
          return room->then([this, space, key, manifest, waits]() mutable {
            return loadBlocks(space, key, kj::mv(manifest), waits + 1);
          });
        }
      }
      return toKjException(begun.error());
    }
    if (begun.code() == ErrorCode::kConflict) return kj::READY_NOW;  // in memory already
    if (begun.code() != ErrorCode::kInvalidArgument) return toKjException(begun.error());
    // Does not fit its namespace: dropped like a corrupt manifest, never half-used.
    return dropBroken(key, makeError(ErrorCode::kChecksumMismatch, "snapshot ", key.id,
                                     " cannot be restored: ", begun.error().message()));
  }
  auto load = std::make_shared<SnapshotLoad>(std::move(begun).value());
  struct Job {
    uint8_t* dest;
    uint32_t bytes;
    bool sealed;
    ColdKey block;
    uint32_t slot;
  };
  std::vector<Job> jobs;
  for (const auto& r : load->reads) {
    jobs.push_back(Job{engine_.memory().extentBase(r.dest.extent) + r.dest.offset, r.bytes,
                       r.sealed, ColdKey{key.fingerprint, key.salt, r.key}, r.slot});
  }
  struct Outcome {
    std::vector<uint8_t> ok;     // per read
    std::vector<uint64_t> sums;  // per read of a sealed block: the checksum it was verified against
    ErrorCode code = ErrorCode::kOk;
    std::string message = {};
  };
  // The fresh blocks stay pinned until finishSnapshotLoad: the worker writes them in place.
  auto read = reader_->run([this, key, jobs = std::move(jobs)]() {
    Outcome out{std::vector<uint8_t>(jobs.size(), 0), std::vector<uint64_t>(jobs.size(), 0)};
    for (size_t i = 0; i < jobs.size(); ++i) {
      const Job& j = jobs[i];
      const Status s = j.sealed ? tier_->getInto(j.block, j.dest, j.bytes, &out.sums[i])
                                : tier_->getSnapshotRecordInto(key, j.slot, j.dest, j.bytes);
      if (!s) {
        out.code = s.code();
        out.message = s.error().message();
        break;
      }
      out.ok[i] = 1;
    }
    return out;
  });
  // A job that throws (or a worker that is gone) read nothing: the load still finishes and unpins.
  const size_t reads = load->reads.size();
  read = read.catch_([reads](kj::Exception&& e) {
    return Outcome{std::vector<uint8_t>(reads, 0), std::vector<uint64_t>(reads, 0),
                   ErrorCode::kUnavailable, e.getDescription().cStr()};
  });
  return read.then([this, key, load](Outcome r) -> kj::Promise<void> {
    for (size_t i = 0; i < load->reads.size(); ++i) {
      if (r.ok[i] && load->reads[i].sealed) load->reads[i].checksum = r.sums[i];
    }
    auto info = engine_.finishSnapshotLoad(*load, r.ok);
    kick();  // blocks read back and not kept are evictable now
    if (r.code == ErrorCode::kUnavailable) {
      return toKjException(Error(r.code, r.message));  // the disk, not the snapshot: kept
    }
    if (r.code != ErrorCode::kOk) {
      // Gone (the capacity bound took a block record) or corrupt: it can never be restored.
      return dropBroken(key,
                        makeError(r.code == ErrorCode::kNotFound ? ErrorCode::kNotFound
                                                                 : ErrorCode::kChecksumMismatch,
                                  "snapshot ", key.id, " cannot be restored: ", r.message));
    }
    if (!info) return toKjException(info.error());
    return kj::READY_NOW;
  });
}

kj::Promise<void> ColdService::dropBroken(SnapshotKey key, Error why) {
  logWarn("snapshot_dropped", "id=" + std::to_string(key.id) + " reason=\"" + why.message() + "\"");
  return reader_->run([this, key]() { (void)tier_->eraseSnapshot(key, /*broken=*/true); })
      .then([why = std::move(why)]() -> kj::Promise<void> { return toKjException(why); });
}

kj::Promise<void> ColdService::dropSnapshot(SpaceId space, SnapshotId id) {
  KJ_IF_MAYBE (going, loadInFlight(loadKey(space, id))) {  // drop what the load leaves
    return going->promise.addBranch().then(
        [this, space, id]() { return dropSnapshot(space, id); },
        [this, space, id](kj::Exception&&) { return dropSnapshot(space, id); });
  }
  const SnapshotKey key = snapshotKey(space, id);
  if (engine_.hasSnapshot(space, id)) {
    const bool onDisk = engine_.snapshotOnDisk(space, id);
    if (auto dropped = engine_.dropSnapshot(space, id); !dropped) {
      return toKjException(dropped.error());
    }
    if (onDisk) {
      // Queued after any write of it in flight (the worker runs its tasks in order): the delete
      // comes last, and nothing can write it again (the engine no longer holds it).
      // Until it has run, the snapshot counts as gone (a load must not bring it back).
      const std::string name = loadKey(space, id);
      erasing_.emplace(name, key);
      eraseLater(name, key);
    }
    kick();
    return kj::READY_NOW;
  }
  if (erasing_.count(loadKey(space, id)) || !tier_->hasSnapshot(key))
    return toKjException(makeError(ErrorCode::kNotFound, "no snapshot ", id));
  return reader_->run([this, key, id]() {
    auto erased = tier_->eraseSnapshot(key, /*broken=*/false);
    if (!erased) throwRpcError(erased.error());
    if (!*erased) throwRpcError(makeError(ErrorCode::kNotFound, "no snapshot ", id));
  });
}

kj::Promise<size_t> ColdService::eraseBlocks(SpaceId space, std::vector<Key128> keys) {
  const SpaceInfo& info = engine_.space(space);
  std::vector<ColdKey> held;
  for (const Key128& k : keys) {
    ColdKey key{info.fingerprint, info.salt, k};
    if (tier_->contains(key)) held.push_back(key);
  }
  if (held.empty()) return size_t{0};
  // On the writer, in order: after any batch in flight that might write one of them.
  return writer_->run([this, held = std::move(held)]() {
    for (const ColdKey& key : held) {
      if (auto erased = tier_->erase(key); !erased) throwRpcError(erased.error());
    }
    return held.size();
  });
}

void ColdService::eraseLater(const std::string& name, SnapshotKey key) {
  tasks_.add(attempt(*writer_, [this, key]() {
               return tier_->eraseSnapshot(key, false).ok();
             }).then([this, name, key](bool ok) -> kj::Promise<void> {
    if (ok) {
      erasing_.erase(name);
      return kj::READY_NOW;
    }
    // A failing disk: the snapshot stays gone for every call, and the delete is
    // tried again (a restart would otherwise bring it back).
    logWarn("snapshot_delete_retry", "id=" + std::to_string(key.id));
    return timer_.afterDelay(spillRetryDelay_).then([this, name, key]() {
      if (erasing_.count(name)) eraseLater(name, key);
    });
  }));
}

void ColdService::erasePending() {
  for (auto it = erasing_.begin(); it != erasing_.end();) {
    if (tier_->eraseSnapshot(it->second, false)) {
      it = erasing_.erase(it);
    } else {
      ++it;
    }
  }
}

kj::Promise<std::string> ColdService::encodedManifest(uint64_t fingerprint, const Salt& salt,
                                                      SnapshotId id) {
  const SnapshotKey key{fingerprint, salt, id};
  return reader_->run([this, key]() {
    auto manifest = tier_->getSnapshot(key);
    if (!manifest) throwRpcError(manifest.error());
    return encodeManifest(*manifest);
  });
}

ColdServiceStats ColdService::stats() const {
  return ColdServiceStats{tier_->stats(), spillErrors_, paused_};
}

void ColdService::taskFailed(kj::Exception&& exception) {
  logWarn("cold_task_failed", exception.getDescription().cStr());
}

}  // namespace kvtier
