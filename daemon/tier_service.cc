#include "daemon/tier_service.h"

#include <algorithm>

#include "daemon/log.h"
#include "store/checksum.h"
#include "transport/cross_thread.h"

namespace kvtier {

TierService::TierService(Engine& engine, BlockCopier copier, std::vector<uint8_t> gpuTiers,
                         double lowWater)
    : engine_(engine),
      copier_(std::move(copier)),
      gpuTiers_(std::move(gpuTiers)),
      lowWater_(lowWater),
      tasks_(*this) {
  engine_.setGpuDemotion(true);
}

TierService::~TierService() {
  engine_.setGpuDemotion(false);
  worker_.reset();
}

kj::Promise<TierService::Copied> TierService::copyOnWorker(const std::vector<MoveTicket>& tickets) {
  std::vector<BlockCopy> copies;
  struct Check {
    const uint8_t* at;
    uint64_t bytes, sum;
  };
  std::vector<Check> checks;  // each copy's end in host memory
  copies.reserve(tickets.size());
  checks.reserve(tickets.size());
  BlockMemory& memory = engine_.memory();
  for (const auto& t : tickets) {
    copies.push_back(BlockCopy{memory.extentBase(t.dst.extent) + t.dst.offset,
                               memory.extentBase(t.src.extent) + t.src.offset, t.src.bytes});
    checks.push_back({t.sumOfSource ? copies.back().src : copies.back().dst, t.src.bytes, t.sum});
  }
  // Both ends of every copy stay pinned until finishMoves: the worker reads and writes in place.
  // A copy that throws, or a worker that is gone, is a failed copy: the moves still finish.
  // After the copies, the end of each in host memory is checked against the block's checksum (a
  // promotion's source: bytes changed in the host pool never reach a GPU; a demotion's copy:
  // what the GPU held was the writer's), on the worker, off the event loop.
  return worker_
      ->run([this, copies = std::move(copies), checks = std::move(checks)]() {
        Copied out;
        out.ok = copier_(copies);
        out.damaged.assign(checks.size(), 0);
        if (!out.ok) return out;
        for (size_t i = 0; i < checks.size(); ++i) {
          const Check& c = checks[i];
          out.damaged[i] = c.sum != 0 && blockChecksum(c.at, c.bytes) != c.sum;
        }
        return out;
      })
      .catch_([](kj::Exception&& e) {
        logWarn("tier_copy_failed", e.getDescription().cStr());
        return Copied{};
      });
}

void TierService::kick() {
  if (inFlight_) return;
  for (uint8_t tier : gpuTiers_) {
    auto batch = engine_.takeDemoteBatch(tier, kBatchBlocks, lowWater_);
    if (batch.empty()) continue;
    startDemotion(std::move(batch));
    return;
  }
}

void TierService::makeRoom(uint8_t tier) {
  if (inFlight_) return;
  // A low-water mark of 1: any pool that is not wholly free qualifies.
  auto batch = engine_.takeDemoteBatch(tier, kBatchBlocks, 1.0);
  if (!batch.empty()) startDemotion(std::move(batch));
}

void TierService::startDemotion(std::vector<MoveTicket> batch) {
  inFlight_ = true;
  auto copied = copyOnWorker(batch);
  tasks_.add(copied.then([this, batch = std::move(batch)](Copied c) mutable {
    demotionFinished(std::move(batch), std::move(c));
  }));
}

namespace {

// Logs blocks a move found damaged (counted by the engine: blocks_corrupt).
void logDamaged(const std::vector<uint8_t>& damaged, const char* move) {
  const auto n = std::count(damaged.begin(), damaged.end(), 1);
  if (n > 0)
    logWarn("blocks_corrupt", std::string("move=") + move + " dropped=" + std::to_string(n));
}

}  // namespace

void TierService::demotionFinished(std::vector<MoveTicket> batch, Copied copied) {
  const bool ok = copied.ok;
  logDamaged(copied.damaged, "demotion");
  engine_.finishMoves(batch, ok, copied.damaged);
  inFlight_ = false;
  for (auto& waiter : settleWaiters_) waiter->fulfill();
  settleWaiters_.clear();
  if (!ok) {
    logWarn("gpu_demotion_failed", "blocks=" + std::to_string(batch.size()));
    return;  // the next allocation or commit kicks again
  }
  kick();
}

kj::Promise<void> TierService::whenSettles() {
  if (!inFlight_) return kj::READY_NOW;
  auto paf = kj::newPromiseAndFulfiller<void>();
  settleWaiters_.push_back(kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

kj::Maybe<kj::Promise<void>> TierService::whenRetryable(ErrorCode code, uint8_t tier) {
  if (code != ErrorCode::kFull || tier == 0) return nullptr;
  makeRoom(tier);
  if (!canMakeRoom()) return nullptr;
  return whenSettles();
}

kj::Maybe<kj::Promise<void>> TierService::bringTo(SpaceId space, std::span<const Key128> keys,
                                                  uint8_t tier) {
  auto tickets = engine_.beginMovesTo(space, keys, tier);
  if (tickets.empty()) return nullptr;
  auto done = copyOnWorker(tickets)
                  .then([this, tickets = std::move(tickets)](Copied c) {
                    logDamaged(c.damaged, "promotion");
                    engine_.finishMoves(tickets, c.ok, c.damaged);
                    kick();  // the promoted blocks may have taken the GPU pool below its mark
                  })
                  .fork();
  // The service keeps one branch, so the move always finishes (and unpins both blocks) even when
  // the lookup waiting for it is cancelled.
  tasks_.add(done.addBranch());
  return done.addBranch();
}

void TierService::taskFailed(kj::Exception&& exception) {
  logWarn("tier_task_failed", exception.getDescription().cStr());
}

}  // namespace kvtier
