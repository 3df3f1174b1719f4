#include "daemon/cold_service.h"

#include <kj/debug.h>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <future>

#include "daemon/log.h"

namespace kvtier {
namespace {

// Blocks per spill batch: one RocksDB write batch (a few MiB to tens of MiB).
constexpr size_t kSpillBatchBlocks = 64;

std::string promoteKey(SpaceId space, const Key128& key) {
  return std::to_string(space) + ":" + key.hex();
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
  std::promise<void> ready;
  worker_ = std::thread([this, &ready] {
    // Spills and promotes yield the CPU to the event loop: hot lookups must not wait behind disk
    // work on a small machine (Linux niceness is per thread).
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
    kj::EventLoop loop;
    kj::WaitScope waitScope(loop);
    auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
    workerExecutor_ = &kj::getCurrentThreadExecutor();
    stopWorker_ = kj::mv(paf.fulfiller);
    ready.set_value();
    paf.promise.wait(waitScope);
  });
  ready.get_future().wait();
  engine_.setColdDirectory(&directory_);
}

ColdService::~ColdService() {
  engine_.setColdDirectory(nullptr);
  stopWorker_->fulfill();
  worker_.join();
}

bool ColdService::canMakeRoom() const {
  return !paused_ && (spillInFlight_ || engine_.spillBacklog() > 0);
}

void ColdService::kick() {
  if (spillInFlight_ || paused_) return;
  auto batch = engine_.takeSpillBatch(kSpillBatchBlocks);
  if (batch.empty()) return;
  spillInFlight_ = true;
  std::vector<ColdRecord> records;
  for (const auto& item : batch) {
    const uint8_t* data = engine_.memory().extentBase(item.location.extent) + item.location.offset;
    records.push_back(
        ColdRecord{ColdKey{item.fingerprint, item.salt, item.key}, data, item.location.bytes});
  }
  // The blocks stay pinned until spillFinished: the worker reads them in place.
  auto written = workerExecutor_->executeAsync(
      [this, records = std::move(records)]() { return tier_->putBatch(records).ok(); });
  tasks_.add(written.then(
      [this, batch = std::move(batch)](bool ok) mutable { spillFinished(std::move(batch), ok); }));
}

void ColdService::spillFinished(std::vector<SpillItem> batch, bool ok) {
  engine_.finishSpill(batch, ok);
  spillInFlight_ = false;
  for (auto& waiter : settleWaiters_) waiter->fulfill();
  settleWaiters_.clear();
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

kj::Promise<void> ColdService::whenSpillSettles() {
  if (!spillInFlight_) return kj::READY_NOW;
  auto paf = kj::newPromiseAndFulfiller<void>();
  settleWaiters_.push_back(kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

kj::Promise<void> ColdService::promote(SpaceId space, std::vector<Key128> keys) {
  kj::Vector<kj::Promise<void>> pending;
  for (const auto& key : keys) pending.add(promoteOne(space, key, 0));
  return kj::joinPromises(pending.releaseAsArray());
}

kj::Promise<void> ColdService::promoteOne(SpaceId space, Key128 key, int waits) {
  const std::string id = promoteKey(space, key);
  auto it = promoting_.find(id);
  if (it != promoting_.end()) return it->second.addBranch();  // the same read, already going
  auto ticket = engine_.beginPromote(space, key);
  if (!ticket) {
    // No block to read into: as for any allocating call, wait for the spill batch in flight when
    // it can make room; otherwise the block stays cold and the lookup stops before it.
    if (ticket.code() == ErrorCode::kFull && waits < kMaxRoomWaits && canMakeRoom()) {
      kick();
      return whenSpillSettles().then(
          [this, space, key, waits] { return promoteOne(space, key, waits + 1); });
    }
    return kj::READY_NOW;
  }
  if (ticket->block == kNoBlock) return kj::READY_NOW;  // already back in memory
  const SpaceInfo& sp = engine_.space(space);
  const ColdKey coldKey{sp.fingerprint, sp.salt, key};
  uint8_t* dest = engine_.memory().extentBase(ticket->location.extent) + ticket->location.offset;
  const uint32_t bytes = ticket->location.bytes;
  auto read = workerExecutor_->executeAsync([this, coldKey, dest, bytes]() {
    // Missing, corrupt or of the wrong size: a miss (the lookup stops before this block).
    return tier_->getInto(coldKey, dest, bytes).ok();
  });
  // The service owns one branch, so the read always finishes (and unpins its block) even when
  // every lookup waiting for it is cancelled; that branch, not the read itself, forgets the
  // entry, so the fork is never destroyed while it runs.
  auto done = read.then([this, t = *ticket](bool ok) { engine_.finishPromote(t, ok); });
  auto forked = done.fork();
  auto branch = forked.addBranch();
  tasks_.add(forked.addBranch().then([this, id] { promoting_.erase(id); }));
  promoting_.emplace(id, kj::mv(forked));
  return branch;
}

void ColdService::flushAll(kj::WaitScope& waitScope) {
  whenSpillSettles().wait(waitScope);
  auto items = engine_.takeAllUnspilled();
  size_t written = 0;
  for (size_t start = 0; start < items.size(); start += kSpillBatchBlocks) {
    const size_t end = std::min(items.size(), start + kSpillBatchBlocks);
    std::vector<ColdRecord> records;
    for (size_t i = start; i < end; ++i) {
      const auto& item = items[i];
      records.push_back(
          ColdRecord{ColdKey{item.fingerprint, item.salt, item.key},
                     engine_.memory().extentBase(item.location.extent) + item.location.offset,
                     item.location.bytes});
    }
    const bool ok = tier_->putBatch(records).ok();
    engine_.finishSpill(std::span(items).subspan(start, end - start), ok);
    if (ok) written += end - start;
  }
  logInfo("cold_flush",
          "blocks=" + std::to_string(written) + " of=" + std::to_string(items.size()));
}

ColdServiceStats ColdService::stats() const {
  return ColdServiceStats{tier_->stats(), spillErrors_, paused_};
}

void ColdService::taskFailed(kj::Exception&& exception) {
  logWarn("cold_task_failed", exception.getDescription().cStr());
}

}  // namespace kvtier
