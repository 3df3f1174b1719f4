// Engine: the GPU tiers' rules — which blocks leave a GPU pool for the host pool, which come back,
// and how a move completes. The bytes move in the daemon (a worker thread with a CUDA stream); the
// engine only keeps the books. A move never changes what a reader sees: both blocks are pinned
// while the bytes travel, and the prefix index switches to the new block only if nothing but the
// index held the old one when the copy finished.
#include <algorithm>
#include <cassert>

#include "store/engine.h"

namespace kvtier {

MoveTicket Engine::beginMove(BlockId from, BlockId to) {
  pin(from);
  pin(to);
  MoveTicket t{from, to, pool_.location(from), pool_.location(to)};
  // A demotion checks the copy it made in the host pool (what the GPU held, as it arrived); a
  // promotion checks its source there, after the copy.
  if (const auto sum = pool_.checksum(from)) {
    if (pool_.tierOf(to) == 0) {
      t.sum = *sum;
    } else if (pool_.tierOf(from) == 0) {
      t.sum = *sum;
      t.sumOfSource = true;
    }
  }
  return t;
}

std::vector<MoveTicket> Engine::takeDemoteBatch(uint8_t tier, size_t max, double lowWater) {
  std::vector<MoveTicket> out;
  if (tier == 0) return out;
  for (uint32_t cls = 0; cls < pool_.classCount() && out.size() < max; ++cls) {
    if (pool_.classTier(cls) != tier) continue;
    const uint64_t total = pool_.blocksTotal(cls);
    const uint64_t free = total - pool_.blocksUsed(cls);
    if (static_cast<double>(free) >= lowWater * static_cast<double>(total)) continue;
    std::vector<BlockId> candidates;
    policy_->oldest(cls, max - out.size(), candidates);
    const uint32_t hostCls = pool_.sizeClass(pool_.classBytes(cls), 0);
    for (BlockId from : candidates) {
      const BlockMeta& m = pool_[from];
      if (m.entry || m.spilling) continue;
      // Demotion is the daemon's, not a tenant's put: never limited by a quota. The block is
      // charged to its tenant once the move completes (finishMoves).
      const BlockId to = allocateClass(hostCls, kNoTenant);
      if (to == kNoBlock) return out;  // the host pool is full too: nothing to demote into
      out.push_back(beginMove(from, to));
    }
  }
  return out;
}

std::vector<MoveTicket> Engine::beginMovesTo(SpaceId space, std::span<const Key128> keys,
                                             uint8_t tier) {
  std::vector<MoveTicket> out;
  if (!checkSpace(space) || !pool_.hasTier(tier)) return out;
  for (const Key128& key : keys) {
    const BlockId from = index_.find(space, key);
    if (from == kNoBlock) continue;
    const BlockMeta& m = pool_[from];
    if (pool_.tierOf(from) == tier || m.refs != 0 || m.pins != 0 || m.spilling || m.entry) continue;
    const BlockId to = allocate(space, tier);
    if (to == kNoBlock) break;
    out.push_back(beginMove(from, to));
  }
  return out;
}

void Engine::finishMoves(std::span<const MoveTicket> tickets, bool copied,
                         std::span<const uint8_t> damaged) {
  for (size_t i = 0; i < tickets.size(); ++i) {
    const MoveTicket& t = tickets[i];
    BlockMeta& src = pool_[t.from];
    BlockMeta& dst = pool_[t.to];
    assert(src.pins > 0 && dst.pins > 0 && dst.state == BlockState::kWriting);
    if (i < damaged.size() && damaged[i]) {
      // The bytes were not the writer's: they reach no one, in either tier.
      if (src.state == BlockState::kSealed && !src.corrupt) markCorrupt(t.from, src.space);
      unpin(t.from);
      unpin(t.to);
      continue;
    }
    const bool take = copied && src.state == BlockState::kSealed && src.refs == 0 &&
                      src.pins == 1 && index_.find(src.space, src.key) == t.from;
    if (!take) {
      unpin(t.from);  // back to where it was (evictable again if nothing else holds it)
      unpin(t.to);    // never sealed: freed
      continue;
    }
    dst.state = BlockState::kSealed;
    dst.space = src.space;
    dst.key = src.key;
    dst.onDisk = src.onDisk;  // a record on disk still holds these bytes
    // The checksum travels with the bytes; a GPU block that had none gets one as it reaches
    // host memory.
    if (const auto sum = pool_.checksum(t.from)) pool_.setChecksum(t.to, *sum);
    ensureChecksum(t.to, spaces_[src.space].info.blockBytes);
    pool_.setTenant(t.to, spaces_[src.space].info.tenant);  // host blocks only: GPU ones are not
    index_.replace(src.space, src.key, t.to);
    (pool_.tierOf(t.to) == 0 ? gpuDemoted_ : gpuPromoted_)++;
    // The old block leaves without passing through the eviction policy (a pinned block is not in
    // it) and without counting as an eviction: its bytes live on in `to`.
    policy_->moved(t.from, t.to);
    src.pins = 0;
    --pinnedBlocks_;
    pool_.release(t.from);
    unpin(t.to);  // sealed: evictable, and queued for the cold tier if it is a host block
  }
}

}  // namespace kvtier
