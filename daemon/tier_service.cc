#include "daemon/tier_service.h"

#include <algorithm>
#include <span>
#include <thread>

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

namespace {

// A block to check against its writer's checksum after (or while) it is copied; `ticket` is its
// move's index in the batch.
struct Check {
  const uint8_t* at;
  uint64_t bytes, sum;
  size_t ticket;
};

// Below this many bytes a batch is checked on the copying thread, after its copy: a thread of
// its own would cost more than it saves.
constexpr uint64_t kSpreadCheckBytes = 4ull << 20;
// At most this many checking threads for one batch (XXH3 runs at ~40 GB/s a core, a copy engine
// moves 50-55 GB/s host to device: two keep up with it, the third is for a slower core).
constexpr unsigned kMaxCheckThreads = 3;

// damaged[c.ticket] for each check: its bytes are not the writer's.
void checkRange(std::span<const Check> checks, uint8_t* damaged) {
  for (const Check& c : checks) damaged[c.ticket] = blockChecksum(c.at, c.bytes) != c.sum;
}

// Starts checking `checks` on threads of their own (parts of about equal bytes), each writing its
// checks' damaged[c.ticket]; the threads are joined when the returned vector goes. None when the
// batch is small: then the caller checks it itself (checkRange).
std::vector<std::jthread> startChecks(std::span<const Check> checks, uint8_t* damaged) {
  uint64_t total = 0;
  for (const Check& c : checks) total += c.bytes;
  std::vector<std::jthread> threads;
  if (total < kSpreadCheckBytes) return threads;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const unsigned parts = std::clamp(cores / 4, 1u, kMaxCheckThreads);
  size_t begin = 0;
  uint64_t done = 0;
  for (unsigned p = 1; p <= parts && begin < checks.size(); ++p) {
    size_t end = begin;
    while (end < checks.size() && (p == parts || done < total * p / parts))
      done += checks[end++].bytes;
    threads.emplace_back(
        [part = checks.subspan(begin, end - begin), damaged] { checkRange(part, damaged); });
    begin = end;
  }
  return threads;
}

}  // namespace

kj::Promise<TierService::Copied> TierService::copyOnWorker(const std::vector<MoveTicket>& tickets) {
  std::vector<BlockCopy> copies;
  std::vector<Check> sources, copied;  // promotions' sources; demotions' copies, in host memory
  copies.reserve(tickets.size());
  BlockMemory& memory = engine_.memory();
  for (size_t i = 0; i < tickets.size(); ++i) {
    const MoveTicket& t = tickets[i];
    copies.push_back(BlockCopy{memory.extentBase(t.dst.extent) + t.dst.offset,
                               memory.extentBase(t.src.extent) + t.src.offset, t.src.bytes});
    if (t.sum == 0) continue;  // no checksum to hold it to
    if (t.sumOfSource) {
      sources.push_back({copies.back().src, t.src.bytes, t.sum, i});
    } else {
      copied.push_back({copies.back().dst, t.src.bytes, t.sum, i});
    }
  }
  // Both ends of every copy stay pinned until finishMoves: the worker reads and writes in place.
  // A copy that throws, or a worker that is gone, is a failed copy: the moves still finish.
  // Each block's end in host memory is checked against its checksum, off the event loop: a
  // promotion's source (bytes changed in the host pool never reach a GPU) while the copy engine
  // reads it too, a demotion's copy (what the GPU held was the writer's) once it has arrived.
  return worker_
      ->run([this, copies = std::move(copies), sources = std::move(sources),
             copied = std::move(copied), n = tickets.size()]() {
        Copied out;
        out.damaged.assign(n, 0);  // each thread writes its own checks' entries
        {
          std::vector<std::jthread> checking = startChecks(sources, out.damaged.data());
          out.ok = copier_(copies);
          if (checking.empty()) checkRange(sources, out.damaged.data());
        }
        if (!out.ok) {
          out.damaged.clear();  // a failed batch moves nothing; what its checks found is moot
          return out;
        }
        {
          std::vector<std::jthread> checking = startChecks(copied, out.damaged.data());
          if (checking.empty()) checkRange(copied, out.damaged.data());
        }  // joined before `out` is returned
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
