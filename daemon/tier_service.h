// TierService: moves blocks between the GPU pools and the host pool, off the event loop.
//
// - Demotion: when a GPU pool's free blocks fall below a low-water mark, its least recently used
//   cached blocks are copied device -> host by a worker thread and then switch tiers (the engine
//   keeps the rules: both blocks pinned meanwhile, the switch only if nothing took the block). A
//   call short of GPU blocks waits for the batch in flight instead of failing.
// - Promotion: a lookup from a GPU session brings the host-pool blocks of its prefix to that GPU
//   before it answers (host -> device, from pinned host memory, asynchronous on the worker's
//   stream).
//
// The copier runs on the worker thread; on a GPU machine it is CudaBlockMover (cudaMemcpyAsync on
// its own stream). Everything else runs on the daemon's event loop.
#pragma once

#include <kj/async.h>

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "daemon/worker_thread.h"
#include "store/engine.h"

namespace kvtier {

using BlockCopier = std::function<bool(std::span<const BlockCopy>)>;

class TierService final : private kj::TaskSet::ErrorHandler {
 public:
  static constexpr size_t kBatchBlocks = 32;
  static constexpr double kDefaultLowWater = 0.125;  // keep 1/8 of every GPU pool free

  // `engine` is borrowed. `gpuTiers` are the engine tiers of the GPU pools (1 + device index).
  TierService(Engine& engine, BlockCopier copier, std::vector<uint8_t> gpuTiers,
              double lowWater = kDefaultLowWater);
  ~TierService();

  // Starts a demotion batch if a GPU pool is below its low-water mark and none is in flight.
  void kick();
  // A call needs GPU blocks of `tier` now: demotes a batch of its least recently used cached
  // blocks whatever the mark (unless a batch is in flight already).
  void makeRoom(uint8_t tier);
  bool canMakeRoom() const { return inFlight_; }
  // Resolves when the batch in flight (if any) has finished.
  kj::Promise<void> whenSettles();
  // What a call that failed with `code` needing blocks of `tier` may wait for before it tries
  // again: for FULL in a GPU tier, a demotion batch started for it; nullptr when that cannot help.
  kj::Maybe<kj::Promise<void>> whenRetryable(ErrorCode code, uint8_t tier);
  // Brings the blocks of `keys` held only by the index to `tier` (a GPU's, or the host pool's);
  // resolves when they have moved (or could not: they are then served where they are). Nothing
  // when no block needs to move (the caller answers at once).
  kj::Maybe<kj::Promise<void>> bringTo(SpaceId space, std::span<const Key128> keys, uint8_t tier);

 private:
  void taskFailed(kj::Exception&& exception) override;
  // Copies the tickets' bytes on the worker; resolves with whether every copy succeeded.
  // What a batch of copies did: all copied, and per ticket whether its bytes in host memory
  // failed their checksum after the copy (MoveTicket::sum).
  struct Copied {
    bool ok = false;
    std::vector<uint8_t> damaged;
  };
  kj::Promise<Copied> copyOnWorker(const std::vector<MoveTicket>& tickets);
  void demotionFinished(std::vector<MoveTicket> batch, Copied copied);
  void startDemotion(std::vector<MoveTicket> batch);

  Engine& engine_;
  BlockCopier copier_;
  std::vector<uint8_t> gpuTiers_;
  double lowWater_;
  std::unique_ptr<WorkerThread> worker_ = std::make_unique<WorkerThread>("kvtier-gpu-copy");
  bool inFlight_ = false;
  std::vector<kj::Own<kj::PromiseFulfiller<void>>> settleWaiters_;
  kj::TaskSet tasks_;
};

}  // namespace kvtier
