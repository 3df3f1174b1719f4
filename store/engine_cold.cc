// Engine: the cold tier's rules — what to spill, when a block may be dropped, how a cold block
// comes back. The bytes move in the daemon (worker threads); the engine only keeps the books.
#include <algorithm>
#include <cassert>

#include "store/engine.h"
#include "store/engine_util.h"

namespace kvtier {

// Blocks being spilled keep their place in the eviction order and are not pinned: eviction
// takes only blocks already on disk (and never one marked spilling), so the worker can read
// them in place, and clean blocks leave in least-recently-used order.
SpillItem Engine::markSpilling(BlockId b) {
  BlockMeta& m = pool_[b];
  m.spilling = true;
  const SpaceInfo& sp = spaces_[m.space].info;
  return SpillItem{b, pool_.location(b), sp.fingerprint, sp.salt, m.key, pool_.checksum(b)};
}

std::vector<SpillItem> Engine::takeSpillBatch(size_t max, uint64_t maxBytes, size_t min) {
  std::vector<SpillItem> out;
  uint64_t bytes = 0;
  auto full = [&] {
    return out.size() >= max || (out.size() >= std::max<size_t>(min, 1) && bytes >= maxBytes);
  };
  auto take = [&](BlockId b) {
    const BlockMeta& m = pool_[b];
    // Only what eviction waits for: sealed blocks nothing holds, not on disk, not being written.
    if (m.state != BlockState::kSealed || m.entry || m.onDisk || m.spilling || m.refs != 0 ||
        m.pins != 0 || pool_.tierOf(b) != 0) {
      return;
    }
    out.push_back(markSpilling(b));
    bytes += out.back().location.bytes;
  };
  // The blocks nearest eviction first: a policy that evicts new blocks early (ARC's T1) would
  // otherwise find them unwritten, behind older blocks of the queue. The walk is as long as the
  // queue at most, so that it costs O(1) per block spilled where the head is clean (LRU).
  std::vector<BlockId>& order = orderScratch_;
  const size_t walk = std::min(max, dirty_.size());
  for (uint32_t cls = 0; cls < pool_.classCount() && !full() && walk > 0; ++cls) {
    if (pool_.classTier(cls) != 0) continue;
    order.clear();
    policy_->oldest(cls, walk, order);
    for (size_t i = 0; i < order.size() && !full(); ++i) take(order[i]);
  }
  // The queue holds hints: blocks spilled, freed, or taken by a sequence since are skipped.
  while (!full() && !dirty_.empty()) {
    const BlockId b = dirty_.front();
    dirty_.pop_front();
    take(b);
  }
  return out;
}

std::vector<SpillItem> Engine::takeAllUnspilled() {
  std::vector<SpillItem> out;
  for (BlockId b = 0; pool_.valid(b); ++b) {
    BlockMeta& m = pool_[b];
    if (m.state != BlockState::kSealed || m.entry || m.onDisk || m.spilling) continue;
    if (pool_.tierOf(b) != 0) continue;  // GPU blocks are not written from the GPU
    out.push_back(markSpilling(b));
  }
  return out;
}

std::vector<SpillItem> Engine::takeAllUnspilledByValue() {
  auto unspilled = [this](BlockId b) {
    const BlockMeta& m = pool_[b];
    return m.state == BlockState::kSealed && !m.entry && !m.onDisk && !m.spilling && !m.corrupt &&
           pool_.tierOf(b) == 0;
  };
  std::vector<SpillItem> out;
  for (BlockId b = 0; pool_.valid(b); ++b) {
    const BlockMeta& m = pool_[b];
    if (unspilled(b) && (m.refs > 0 || m.pins > 0)) out.push_back(markSpilling(b));
  }
  std::vector<BlockId> order;
  for (uint32_t cls = 0; cls < pool_.classCount(); ++cls) {
    if (pool_.classTier(cls) != 0) continue;
    order.clear();
    policy_->oldest(cls, policy_->size(), order);
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      if (unspilled(*it)) out.push_back(markSpilling(*it));
    }
  }
  // Anything the two passes missed (a sealed block neither held nor in the order), last.
  for (BlockId b = 0; pool_.valid(b); ++b) {
    if (unspilled(b)) out.push_back(markSpilling(b));
  }
  return out;
}

void Engine::finishSpill(std::span<const SpillItem> items, bool written) {
  for (const auto& item : items) {
    BlockMeta& m = pool_[item.block];
    assert(m.spilling && m.state == BlockState::kSealed);
    m.spilling = false;
    if (m.corrupt) {  // found bad while it was written (its record fails its check when read)
      if (m.refs == 0 && m.pins == 0) pool_.release(item.block);
      continue;
    }
    if (written) {
      m.onDisk = true;
      ++spilled_;
    } else if (m.refs == 0 && m.pins == 0) {
      dirty_.push_back(item.block);  // back in line for the next try
    }
  }
}

Result<std::vector<Engine::PlanStep>> Engine::lookupPlan(SpaceId space,
                                                         std::span<const uint32_t> tokens,
                                                         std::span<const Key128> keys,
                                                         bool withState) {
  if (auto s = checkLookupInput(space, tokens, keys); !s) return s.error();
  const SpaceInfo& info = spaces_[space].info;
  auto onDisk = [&](const Key128& key) {
    return cold_ && cold_->contains(info.fingerprint, info.salt, key);
  };
  std::vector<PlanStep> plan;
  if (info.layout.hasKv() || !withState) {  // (a layout without KV: a peer's chunks)
    walkKeys(space, tokens, keys, {}, [&](size_t, const Key128& key) {
      const bool hot = index_.find(space, key) != kNoBlock;
      if (!hot && !onDisk(key)) return false;
      plan.push_back(PlanStep{key, hot});
      return true;
    });
  }
  if (info.layout.hasState() && withState) {
    // The blocks before the deepest position whose state is in memory or on disk, then the
    // state's chunks (engine_states.cc).
    std::vector<Key128> chain;
    chain.reserve(plan.size());
    for (const PlanStep& step : plan) chain.push_back(step.key);
    StateFind state = findState(space, tokens, keys, chain, plan.size(), [&](const Key128& key) {
      return index_.find(space, key) != kNoBlock || onDisk(key);
    });
    plan.resize(info.layout.hasKv() ? state.position / info.layout.blockTokens : 0);
    for (const Key128& key : state.chunks) {
      plan.push_back(PlanStep{key, index_.find(space, key) != kNoBlock, true});
    }
  }
  std::vector<BlockId> hotBlocks;
  for (const PlanStep& step : plan) {
    if (step.hot) hotBlocks.push_back(index_.find(space, step.key));
  }
  // The promotes that follow allocate, and an allocation evicts the first block of the eviction
  // order, where the plan's blocks in memory may sit: the lookup would then stop at the first of
  // them, its prefix lost for a block promoted behind it. Used now, they go to the recent end
  // (tail first, as a release puts them), so the promotes take older blocks. An allocation can
  // still reach them only by evicting everything older, i.e. a cache smaller than the prefix.
  for (size_t i = hotBlocks.size(); i-- > 0;) {
    const BlockMeta& m = pool_[hotBlocks[i]];
    if (m.refs == 0 && m.pins == 0) {
      cacheInsert(hotBlocks[i]);
    }
  }
  return plan;
}

Result<PromoteTicket> Engine::beginPromote(SpaceId space, const Key128& key) {
  if (auto s = checkSpace(space); !s) return s.error();
  if (index_.find(space, key) != kNoBlock) return PromoteTicket{};  // came back meanwhile
  const BlockId b = allocate(space);
  if (b == kNoBlock) return makeError(ErrorCode::kFull, "pool has no block to promote into");
  pin(b);
  return PromoteTicket{b, pool_.location(b), space, key};
}

Result<std::vector<PromoteTicket>> Engine::beginPromotes(SpaceId space,
                                                         std::span<const Key128> keys) {
  if (auto s = checkSpace(space); !s) return s.error();
  std::vector<size_t> wanted;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (index_.find(space, keys[i]) == kNoBlock) wanted.push_back(i);
  }
  std::vector<BlockId> blocks;
  if (!allocateMany(space, wanted.size(), blocks)) {
    return makeError(ErrorCode::kFull, "pool has no room to promote ", wanted.size(), " blocks");
  }
  std::vector<PromoteTicket> out(keys.size());
  for (size_t j = 0; j < wanted.size(); ++j) {
    const BlockId b = blocks[j];
    pin(b);
    out[wanted[j]] = PromoteTicket{b, pool_.location(b), space, keys[wanted[j]]};
  }
  return out;
}

bool Engine::indexPromoted(SpaceId space, const Key128& key, BlockId block,
                           std::optional<uint64_t> checksum, bool remote, bool replica) {
  if (index_.insert(space, key, block) != kNoBlock) return false;
  // The checksum the bytes were verified against comes with them.
  if (checksum) pool_.setChecksum(block, *checksum);
  ensureChecksum(block, spaces_[space].info.blockBytes);
  BlockMeta& m = pool_[block];
  m.state = BlockState::kSealed;
  m.space = space;
  m.key = key;
  if (remote) {
    // Not on this node's disk: it is spilled like any block sealed here.
    ++remoteFetched_;
    m.replicaSettles = replica ? 2 : 0;
  } else {
    m.onDisk = true;  // its record is still there: dropping it again costs nothing
    ++promoted_;
    ++coldHits_;
  }
  if (observer_) observer_->blockIndexed(space, key, {});
  return true;
}

void Engine::finishPromote(const PromoteTicket& ticket, bool ok, bool remote, bool replica) {
  if (ticket.block == kNoBlock) return;
  if (ok) {
    (void)indexPromoted(ticket.space, ticket.key, ticket.block, ticket.checksum, remote, replica);
  }
  unpin(ticket.block);  // a sealed block becomes evictable; a failed one is freed
}

}  // namespace kvtier
