#include "store/engine.h"
#include "store/checksum.h"
#include "store/engine_util.h"

#include <algorithm>
#include <cassert>
#include <cstring>

namespace kvtier {
namespace {

using engine_util::ceilDiv;
using engine_util::checkName;
using engine_util::contentTag;
using engine_util::invalid;

}  // namespace

Engine::Engine(BlockPool& pool, BlockMemory& memory, std::unique_ptr<EvictionPolicy> policy,
               const KeyRotator* rotator)
    : pool_(pool),
      memory_(memory),
      policy_(policy ? std::move(policy) : makeEvictionPolicy(kDefaultEviction)),
      index_(pool),
      rotator_(rotator) {}

Result<SpaceId> Engine::openSpace(const Layout& layout, const Salt& salt, bool inlineWriters) {
  if (auto s = layout.validate(); !s) return s.error();
  const uint64_t fingerprint = layout.fingerprint();
  for (SpaceId id = 0; id < spaces_.size(); ++id) {
    if (spaces_[id].info.fingerprint == fingerprint && spaces_[id].info.salt == salt) {
      spaces_[id].info.clearsFreshBlocks |= inlineWriters;
      return id;
    }
  }
  const uint64_t largestExtent = pool_.largestExtentBytes();
  // Every block of the namespace has this size: its KV blocks and its states' chunks.
  const uint64_t blockBytes = layout.chunkBytes();
  if (blockBytes > largestExtent) {
    return invalid("a block of ", blockBytes, " bytes does not fit in a pool extent of ",
                   largestExtent);
  }
  TenantId tenant = 0;
  while (tenant < tenants_.size() && !(tenants_[tenant].salt == salt)) ++tenant;
  if (tenant == tenants_.size()) tenants_.push_back(Tenant{salt, {}});
  Space space;
  space.info.tenant = tenant;
  space.info.layout = layout;
  space.info.fingerprint = fingerprint;
  space.info.salt = salt;
  space.info.blockBytes = static_cast<uint32_t>(blockBytes);
  space.info.sizeClass = pool_.sizeClass(space.info.blockBytes);
  space.info.clearsFreshBlocks = inlineWriters;
  spaces_.push_back(std::move(space));
  return static_cast<SpaceId>(spaces_.size() - 1);
}

Status Engine::checkSpace(SpaceId space) const {
  if (space >= spaces_.size()) return invalid("unknown space ", space);
  return {};
}

Engine::Sequence* Engine::findSeq(SpaceId space, std::string_view name) {
  auto& seqs = spaces_[space].seqs;
  auto it = seqs.find(std::string(name));
  return it == seqs.end() ? nullptr : &it->second;
}

// ---------------------------------------------------------------------------------------------
// Block holding rules. A block is held by sequences (refs) and pinned by leases (pins). When both
// drop to zero: a sealed block becomes evictable (it stays in the prefix index), any other is
// freed.

void Engine::ref(BlockId id) {
  if (id == kNoBlock) return;  // a position a window released
  BlockMeta& m = pool_[id];
  if (m.refs++ == 0 && m.pins == 0) cacheErase(id);
}

void Engine::unref(BlockId id) {
  if (id == kNoBlock) return;
  BlockMeta& m = pool_[id];
  assert(m.refs > 0);
  if (--m.refs == 0 && m.pins == 0) settle(id);
}

void Engine::pin(BlockId id) {
  BlockMeta& m = pool_[id];
  if (m.pins++ == 0) {
    ++pinnedBlocks_;
    if (m.refs == 0) cacheErase(id);
  }
}

void Engine::unpin(BlockId id) {
  BlockMeta& m = pool_[id];
  assert(m.pins > 0);
  if (--m.pins == 0) {
    --pinnedBlocks_;
    if (m.refs == 0) settle(id);
  }
}

void Engine::prefetchHold(BlockId id) const {
  if (id == kNoBlock) return;
  __builtin_prefetch(&pool_[id], 1);
  policy_->prefetch(id);
  tenantLinks_.prefetch(id);
}

template <typename Op>
void Engine::forEachPrefetched(std::span<const BlockId> blocks, bool tailFirst, Op op) {
  const size_t n = blocks.size();
  for (size_t k = 0; k < n; ++k) {
    if (k + kPrefetchAhead < n) {
      prefetchHold(blocks[tailFirst ? n - 1 - k - kPrefetchAhead : k + kPrefetchAhead]);
    }
    op(blocks[tailFirst ? n - 1 - k : k]);
  }
}

void Engine::unrefTailFirst(std::span<const BlockId> blocks) {
  forEachPrefetched(blocks, true, [this](BlockId id) { unref(id); });
}

void Engine::unpinTailFirst(std::span<const BlockId> blocks) {
  forEachPrefetched(blocks, true, [this](BlockId id) { unpin(id); });
}

void Engine::settle(BlockId id) {
  BlockMeta& m = pool_[id];
  if (m.state == BlockState::kSealed && !m.corrupt) {
    const bool replica = m.replicaSettles > 0;
    if (replica) --m.replicaSettles;
    cacheInsert(id, replica);
    // The cold tier takes host blocks: GPU blocks reach it through the host pool.
    if (cold_ && !m.onDisk && !m.entry && pool_.tierOf(id) == 0) dirty_.push_back(id);
  } else if (!m.spilling) {  // a corrupt block the cold tier is writing: finishSpill frees it
    pool_.release(id);
  }
}

BlockLists::List& Engine::tenantOrder(TenantId tenant, uint32_t cls) {
  auto& cached = tenants_[tenant].cached;
  if (cached.size() <= cls) cached.resize(size_t{cls} + 1);
  return cached[cls];
}

void Engine::cacheInsert(BlockId id, bool first) {
  BlockMeta& m = pool_[id];
  policy_->insert(id, m.sizeClass, first, contentTag(m));
  if (m.tenant == kNoTenant) return;  // GPU blocks: not charged, never a quota's victim
  BlockLists::List& order = tenantOrder(m.tenant, m.sizeClass);
  if (m.tenantLinked) {
    tenantLinks_.unlink(order, id);
  } else {
    tenantLinks_.reserve(id);
  }
  tenantLinks_.link(order, id, first);
  m.tenantLinked = true;
}

void Engine::cacheErase(BlockId id) {
  BlockMeta& m = pool_[id];
  policy_->erase(id);
  if (!m.tenantLinked) return;
  tenantLinks_.unlink(tenantOrder(m.tenant, m.sizeClass), id);
  m.tenantLinked = false;
}

uint64_t Engine::tenantBytesUsed(const Salt& salt) const {
  for (TenantId t = 0; t < tenants_.size(); ++t) {
    if (tenants_[t].salt == salt) return pool_.tenantBytes(t);
  }
  return 0;
}

uint32_t Engine::classOf(SpaceId space, uint8_t tier) {
  if (tier == 0) return spaces_[space].info.sizeClass;
  return pool_.sizeClass(spaces_[space].info.blockBytes, tier);
}

BlockId Engine::allocate(SpaceId space, uint8_t tier) {
  if (tier != 0 && !pool_.hasTier(tier)) return kNoBlock;
  const BlockId id = allocateClass(classOf(space, tier), spaces_[space].info.tenant);
  if (id != kNoBlock) clearForInlineWriters(space, id);
  return id;
}

bool Engine::mayEvict(BlockId victim, uint32_t cls) const {
  const BlockMeta& v = pool_[victim];
  if (v.spilling) return false;  // the worker is reading it: never reuse it under the read
  // GPU blocks leave by demotion to the host pool (the daemon's tier service), never dropped.
  if (pool_.classTier(cls) != 0 && demoteGpuBlocks_) return false;
  // A block is dropped from memory only once its record is written; spilled blocks are queued
  // first, so the oldest being unwritten means none is ready: FULL until the spiller catches up.
  if (cold_ && !v.onDisk && !v.entry && pool_.classTier(cls) == 0 && !spillPaused_) return false;
  return true;
}

bool Engine::victimsFor(uint32_t cls, size_t n, std::span<const BlockId> keep,
                        std::vector<BlockId>& out, TenantId tenant, size_t own) const {
  out.clear();
  if (n == 0) return true;
  // GPU blocks leave by demotion only (mayEvict): none may be dropped.
  if (pool_.classTier(cls) != 0 && demoteGpuBlocks_) return false;
  std::span<const BlockId> skip = keep;
  if (own > 0) {
    // A tenant at its quota: its own blocks first, the oldest of its own order that may go.
    // Bounded like the walk below: a tenant whose first kMaxEvictionSkip cached blocks may not
    // go yet (being spilled) gets FULL until the spiller catches up.
    size_t skipped = 0;
    const bool listed = tenant < tenants_.size() && cls < tenants_[tenant].cached.size();
    for (BlockId b = listed ? tenants_[tenant].cached[cls].head : kNoBlock;
         b != kNoBlock && out.size() < own; b = tenantLinks_.next(b)) {
      if (!mayEvict(b, cls) || std::binary_search(keep.begin(), keep.end(), b)) {
        if (++skipped > kMaxEvictionSkip) return false;
        continue;
      }
      out.push_back(b);
    }
    if (out.size() < own) return false;
    if (out.size() == n) return true;
    // The rest from the eviction order, the blocks just chosen left out.
    skipScratch_.assign(keep.begin(), keep.end());
    skipScratch_.insert(skipScratch_.end(), out.begin(), out.end());
    std::sort(skipScratch_.begin(), skipScratch_.end());
    skip = skipScratch_;
  }
  // The eviction order's first blocks that may be dropped. Those that may not yet (being spilled,
  // not on disk yet: the spiller writes the blocks nearest eviction first) are passed over, at
  // most kMaxEvictionSkip of them, so that a put need not wait for the disk while memory holds
  // blocks that are on it already.
  const size_t base = out.size();
  const size_t more = n - base;
  std::vector<BlockId>& order = orderScratch_;
  size_t span = more + 8;
  for (;;) {
    order.clear();
    policy_->oldest(cls, span, order, skip);
    out.resize(base);
    size_t skipped = 0;
    for (BlockId victim : order) {
      if (!mayEvict(victim, cls)) {
        if (++skipped > kMaxEvictionSkip) return false;
        continue;
      }
      out.push_back(victim);
      if (out.size() == n) return true;
    }
    if (order.size() < span || span >= more + kMaxEvictionSkip) return false;
    span = std::min(span * 2, more + kMaxEvictionSkip);
  }
}

size_t Engine::ownVictimsNeeded(uint32_t cls, size_t n, TenantId tenant) const {
  if (tenantQuota_ == 0 || tenant == kNoTenant || n == 0 || pool_.classTier(cls) != 0) return 0;
  const uint64_t bytes = pool_.classBytes(cls);
  const uint64_t after = pool_.tenantBytes(tenant) + uint64_t{n} * bytes;
  if (after <= tenantQuota_) return 0;
  return static_cast<size_t>(std::min<uint64_t>(n, ceilDiv(after - tenantQuota_, bytes)));
}

bool Engine::planVictims(uint32_t cls, size_t n, TenantId tenant, std::span<const BlockId> keep,
                         std::vector<BlockId>& out) const {
  const uint64_t free = pool_.blocksTotal(cls) - pool_.blocksUsed(cls);
  const size_t own = ownVictimsNeeded(cls, n, tenant);
  const size_t need = std::max<size_t>(n > free ? static_cast<size_t>(n - free) : 0, own);
  return victimsFor(cls, need, keep, out, tenant, own);
}

BlockId Engine::allocateClass(uint32_t cls, TenantId tenant) {
  if (ownVictimsNeeded(cls, 1, tenant) == 0) {
    const BlockId id = pool_.allocate(cls, tenant);
    if (id != kNoBlock) return id;
  }
  if (!planVictims(cls, 1, tenant, {}, victimScratch_)) return kNoBlock;
  evictFor(cls, victimScratch_);
  return pool_.allocate(cls, tenant);
}

void Engine::evictFor(uint32_t cls, std::span<const BlockId> victims) {
  // The victims' metadata, and then their index slots, are prefetched ahead (a cache miss each
  // with millions of blocks indexed): eviction's cost per block stays flat as the index grows.
  constexpr size_t kSlotAhead = kPrefetchAhead / 2;
  for (size_t i = 0; i < victims.size(); ++i) {
    if (i + kPrefetchAhead < victims.size()) prefetchHold(victims[i + kPrefetchAhead]);
    if (i + kSlotAhead < victims.size()) {
      const BlockMeta& next = pool_[victims[i + kSlotAhead]];
      if (!next.entry) index_.prefetch(index_.hash(next.space, next.key));
    }
    const BlockMeta& v = pool_[victims[i]];
    if (cold_ && !v.onDisk && !v.entry && pool_.classTier(cls) == 0) ++evictedUnspilled_;
    evict(victims[i]);
  }
}

bool Engine::canAllocate(uint32_t cls, size_t n, TenantId tenant,
                         std::span<const BlockId> keep) const {
  const uint64_t free = pool_.blocksTotal(cls) - pool_.blocksUsed(cls);
  if (n <= free && ownVictimsNeeded(cls, n, tenant) == 0) return true;
  // What allocateMany will evict, in the order left once the blocks of `keep` are pinned.
  std::vector<BlockId> skip(keep.begin(), keep.end());
  std::sort(skip.begin(), skip.end());
  std::vector<BlockId> victims;
  return planVictims(cls, n, tenant, skip, victims);
}

void Engine::evict(BlockId victim) {
  BlockMeta& v = pool_[victim];
  assert(v.state == BlockState::kSealed && v.refs == 0 && v.pins == 0);
  if (v.tenantLinked) {
    tenantLinks_.unlink(tenantOrder(v.tenant, v.sizeClass), victim);
    v.tenantLinked = false;
  }
  policy_->evicted(victim, contentTag(v));
  if (cold_ && v.onDisk && !v.entry && pool_.tierOf(victim) == 0) {
    const SpaceInfo& info = spaces_[v.space].info;
    leftMemory_.push_back(
        LeftMemory{.fingerprint = info.fingerprint, .salt = info.salt, .key = v.key});
  }
  if (v.entry) {
    entries_.erase(IndexKey{v.space, v.key});
  } else {
    index_.erase(v.space, v.key);
    if (observer_) observer_->blockUnindexed(v.space, v.key);
  }
  pool_.release(victim);
  ++evictions_;
}

bool Engine::allocateMany(SpaceId space, size_t n, std::vector<BlockId>& out, uint8_t tier) {
  if (tier != 0 && !pool_.hasTier(tier)) return false;
  // Every mutation is atomic: a request that cannot be met must not evict on its way to FULL.
  // The victims are chosen once, all of them, before any is evicted.
  const uint32_t cls = classOf(space, tier);
  const TenantId tenant = spaces_[space].info.tenant;
  const uint64_t free = pool_.blocksTotal(cls) - pool_.blocksUsed(cls);
  if (n > free || ownVictimsNeeded(cls, n, tenant) > 0) {
    std::vector<BlockId> victims;
    if (!planVictims(cls, n, tenant, {}, victims)) return false;
    evictFor(cls, victims);
  }
  const size_t start = out.size();
  for (size_t i = 0; i < n; ++i) {
    const BlockId id = pool_.allocate(cls, tenant);
    if (id == kNoBlock) {  // not expected: the victims made room
      for (size_t j = start; j < out.size(); ++j) pool_.release(out[j]);
      out.resize(start);
      return false;
    }
    out.push_back(id);
  }
  for (size_t j = start; j < out.size(); ++j) clearForInlineWriters(space, out[j]);
  return true;
}

void Engine::clearForInlineWriters(SpaceId space, BlockId id) {
  if (!spaces_[space].info.clearsFreshBlocks) return;
  const BlockMeta& m = pool_[id];
  if (memory_.hostAddressable(m.extent))
    std::memset(memory_.blockData(m), 0, pool_.classBytes(m.sizeClass));
}

void Engine::copySlots(SpaceId space, BlockId from, BlockId to, uint32_t slots) {
  copySlotRange(space, from, to, 0, slots);
}

void Engine::copySlotRange(SpaceId space, BlockId from, BlockId to, uint32_t begin, uint32_t end) {
  const Layout& layout = spaces_[space].info.layout;
  const uint8_t* src = memory_.blockData(pool_[from]);
  uint8_t* dst = memory_.blockData(pool_[to]);
  const uint64_t run = uint64_t{end - begin} * layout.tokenBytes();
  for (uint32_t layer = 0; layer < layout.numLayers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      const uint64_t off = layout.slotOffset(layer, kv, begin);
      memory_.copy(dst + off, src + off, run);  // either block may be in GPU memory
    }
  }
}

BlockId Engine::seal(SpaceId space, Sequence& seq, size_t index, const Key128& key) {
  const BlockId id = seq.blocks[index];
  const BlockId twin = index_.insert(space, key, id);
  if (twin == kNoBlock) {
    ensureChecksum(id, spaces_[space].info.blockBytes);
    BlockMeta& m = pool_[id];
    m.state = BlockState::kSealed;
    m.space = space;
    m.key = key;
    if (observer_) {
      observer_->blockIndexed(space, key, std::span<const Key128>(seq.keys).first(index + 1));
    }
    return id;
  }
  // The same prefix was sealed before (by this or another sequence): share it, drop ours.
  ref(twin);
  seq.blocks[index] = twin;
  unref(id);
  return twin;
}

void Engine::ensureChecksum(BlockId id, uint64_t bytes) {
  const BlockMeta& m = pool_[id];
  if (m.summed || !memory_.hostAddressable(m.extent)) return;
  pool_.setChecksum(id, blockChecksum(memory_.blockData(m), bytes));
}

void Engine::replaceBlocks(Sequence& seq, std::vector<BlockId> blocks) {
  // Take the new references before dropping the old ones: they may share blocks.
  forEachPrefetched(blocks, false, [this](BlockId id) { ref(id); });
  unrefTailFirst(seq.blocks);
  seq.blocks = std::move(blocks);
}

void Engine::eraseSeq(SpaceId space, std::string_view name) {
  auto& seqs = spaces_[space].seqs;
  auto it = seqs.find(std::string(name));
  if (it == seqs.end()) return;
  unrefTailFirst(it->second.blocks);
  for (const auto& [pos, id] : it->second.checkpoints) unref(id);
  seqs.erase(it);
}

Engine::Sequence& Engine::createSeq(SpaceId space, std::string_view name, OwnerId owner,
                                    const SeqOptions& options) {
  auto [it, inserted] = spaces_[space].seqs.try_emplace(std::string(name));
  if (inserted) {
    it->second.owner = owner;
    it->second.options = options;
  }
  return it->second;
}

uint64_t Engine::neededFrom(const SeqOptions& options, uint64_t pos) {
  if (options.window > 0) return pos > options.window ? pos - options.window : 0;
  if (options.chunk > 0) return pos / options.chunk * options.chunk;
  return 0;
}

void Engine::applyRetention(Sequence& seq, uint32_t bt) {
  const uint64_t keepFrom = neededFrom(seq.options, seq.tokens.size());
  if (keepFrom <= seq.firstRetained) return;
  seq.firstRetained = keepFrom;
  const size_t released = std::min<size_t>(seq.blocks.size(), keepFrom / bt);
  unrefTailFirst(std::span<const BlockId>(seq.blocks).first(released));
  std::fill(seq.blocks.begin(), seq.blocks.begin() + released, kNoBlock);
}

void Engine::dropAllCheckpoints(Sequence& seq) {
  for (const auto& [pos, id] : seq.checkpoints) unref(id);
  seq.checkpoints.clear();
}

void Engine::dropCheckpointsAfter(Sequence& seq, uint64_t pos) {
  for (auto it = seq.checkpoints.upper_bound(pos); it != seq.checkpoints.end();) {
    unref(it->second);
    it = seq.checkpoints.erase(it);
  }
}

uint32_t Engine::sealFrom(SpaceId space, Sequence& seq, size_t from,
                          std::span<const Key128> given) {
  const uint32_t bt = blockTokens(space);
  const size_t full = seq.tokens.size() / bt;
  seq.keys.resize(std::min(seq.keys.size(), from));
  if (seq.unindexed) return 0;
  if (seq.keys.size() < from) {
    // A key of the chain is missing (client keys of a block this sequence did not complete):
    // nothing after it can be keyed, so nothing after it is indexed.
    seq.unindexed = true;
    return 0;
  }
  MemoHasher hasher(spaces_[space].info.fingerprint, spaces_[space].info.salt, space, &keyMemo_);
  uint32_t sealed = 0;
  // The blocks that enter the index now, for the eviction policy (the prefix they extend).
  std::vector<BlockId> fresh;
  size_t firstFresh = 0;
  for (size_t i = from; i < full; ++i) {
    Key128 key;
    if (!given.empty()) {
      if (i - from >= given.size()) break;
      key = given[i - from];
    } else {
      const Key128* prev = i == 0 ? nullptr : &seq.keys[i - 1];
      key = hasher.next(i, prev, std::span<const uint32_t>(seq.tokens).subspan(i * bt, bt));
    }
    seq.keys.push_back(key);
    const BlockId b = seq.blocks[i];
    if (b != kNoBlock && pool_[b].state != BlockState::kSealed && seal(space, seq, i, key) == b) {
      if (fresh.empty()) firstFresh = i;
      fresh.push_back(b);
    }
    ++sealed;
  }
  if (!fresh.empty()) {
    policy_->sealed(fresh, firstFresh > 0 ? seq.blocks[firstFresh - 1] : kNoBlock, firstFresh);
  }
  return sealed;
}

std::vector<Key128> Engine::putChain(SpaceId space, const Sequence* seq, uint64_t begin,
                                     std::span<const uint32_t> tokens,
                                     std::span<const Key128> keys) const {
  const uint32_t bt = blockTokens(space);
  const size_t first = begin / bt;
  const size_t completed = (begin + tokens.size()) / bt - first;
  std::vector<Key128> chain;
  // sealFrom seals nothing in an unindexed sequence or after a missing key of the chain.
  if (completed == 0 || (seq && (seq->unindexed || seq->keys.size() < first))) return chain;
  if (!keys.empty()) return {keys.begin(), keys.end()};
  const SpaceInfo& info = spaces_[space].info;
  MemoHasher hasher(info.fingerprint, info.salt, space, &keyMemo_);
  chain.reserve(completed);
  for (size_t j = 0; j < completed; ++j) {
    const size_t i = first + j;
    const Key128* prev = i == 0 ? nullptr : j == 0 ? &seq->keys[i - 1] : &chain.back();
    if (i * bt >= begin) {
      chain.push_back(hasher.next(i, prev, tokens.subspan(i * bt - begin, bt)));
    } else {
      // The block `begin` falls inside: the sequence's tokens before begin, then the put's.
      std::vector<uint32_t> block(seq->tokens.begin() + i * bt, seq->tokens.begin() + begin);
      block.insert(block.end(), tokens.begin(), tokens.begin() + (i * bt + bt - begin));
      chain.push_back(hasher.next(i, prev, block));
    }
  }
  return chain;
}

LeaseId Engine::newReadLease(std::vector<BlockId> blocks) {
  if (blocks.empty()) return 0;
  forEachPrefetched(blocks, false, [this](BlockId id) { pin(id); });
  const LeaseId id = nextLease_++;
  readLeases_.emplace(id, ReadLease{std::move(blocks)});
  return id;
}

// ---------------------------------------------------------------------------------------------
// Sequence edits

Status Engine::copyPrefix(OwnerId owner, SpaceId space, std::string_view src, std::string_view dst,
                          uint64_t len, const SeqOptions& options) {
  if (auto s = checkSpace(space); !s) return s;
  if (auto s = checkName(src, "source"); !s) return s;
  if (auto s = checkName(dst, "destination"); !s) return s;
  if (src == dst) return truncate(space, src, len);
  Sequence* from = findSeq(space, src);
  const uint64_t n = from ? std::min<uint64_t>(len, from->tokens.size()) : 0;
  if (n == 0) {
    eraseSeq(space, dst);
    return {};
  }
  if (neededFrom(from->options, n) < from->firstRetained) {
    return invalid("the copy would end at ", n, ", whose window starts before ",
                   from->firstRetained, ", where '", src, "' has released its tokens");
  }
  const uint32_t bt = blockTokens(space);
  const size_t full = n / bt;
  const uint32_t partial = static_cast<uint32_t>(n % bt);
  std::vector<BlockId> blocks(from->blocks.begin(), from->blocks.begin() + full);
  if (partial != 0) {
    // A partially covered block is copied, so later writes to dst never change src.
    const BlockId copy = allocate(space);
    if (copy == kNoBlock) {
      return makeError(ErrorCode::kFull, "pool has no block for the copied partial block");
    }
    copySlots(space, from->blocks[full], copy, partial);
    pool_[copy].state = BlockState::kPartial;
    blocks.push_back(copy);
  }
  // `from` stays valid: emplace into an unordered_map does not move other elements.
  const bool existed = findSeq(space, dst) != nullptr;
  Sequence& to = createSeq(space, dst, owner, options);
  replaceBlocks(to, std::move(blocks));
  // The copy point's recurrent state (and earlier ones) are shared with dst.
  dropAllCheckpoints(to);
  for (auto it = from->checkpoints.begin(); it != from->checkpoints.end() && it->first <= n; ++it) {
    ref(it->second);
    to.checkpoints[it->first] = it->second;
  }
  to.tokens.assign(from->tokens.begin(), from->tokens.begin() + n);
  to.keys.assign(from->keys.begin(), from->keys.begin() + std::min(from->keys.size(), full));
  to.clientKeyed = from->clientKeyed;
  to.unindexed = from->unindexed;
  to.options = SeqOptions{existed ? to.options.detached : options.detached, from->options.window,
                          from->options.chunk};
  to.firstRetained = from->firstRetained;
  applyRetention(to, bt);
  to.version = nextVersion_++;
  return {};
}

Status Engine::truncate(SpaceId space, std::string_view name, uint64_t len) {
  if (auto s = checkSpace(space); !s) return s;
  if (auto s = checkName(name, "sequence"); !s) return s;
  Sequence* seq = findSeq(space, name);
  if (!seq || len >= seq->tokens.size()) return {};
  if (len == 0) {
    eraseSeq(space, name);
    return {};
  }
  const uint32_t bt = blockTokens(space);
  const size_t keep = ceilDiv(len, bt);
  unrefTailFirst(std::span<const BlockId>(seq->blocks).subspan(keep));
  seq->blocks.resize(keep);
  seq->tokens.resize(len);
  seq->keys.resize(std::min<size_t>(seq->keys.size(), len / bt));
  dropCheckpointsAfter(*seq, len);
  seq->version = nextVersion_++;
  return {};
}

Status Engine::remove(SpaceId space, std::string_view name, uint64_t begin, uint64_t end) {
  if (auto s = checkSpace(space); !s) return s;
  if (auto s = checkName(name, "sequence"); !s) return s;
  if (end == kEnd) return truncate(space, name, begin);
  if (begin > end) return invalid("remove range [", begin, ", ", end, ") has begin after end");
  Sequence* seq = findSeq(space, name);
  if (!seq || begin == end || begin >= seq->tokens.size()) return {};
  if (end >= seq->tokens.size()) return truncate(space, name, begin);
  return middleRemove(space, *seq, begin, end);
}

Result<bool> Engine::canResume(SpaceId space, std::string_view name, uint64_t pos) {
  if (auto s = checkSpace(space); !s) return s.error();
  if (auto s = checkName(name, "sequence"); !s) return s.error();
  const Sequence* seq = findSeq(space, name);
  if (!seq) return pos == 0;
  if (pos > seq->tokens.size()) return false;
  if (neededFrom(seq->options, pos) < seq->firstRetained) return false;
  // A recurrent sequence continues from its state: behind the end only where a checkpoint is.
  if (!seq->checkpoints.empty() && pos < seq->tokens.size() && pos != 0) {
    return seq->checkpoints.count(pos) > 0;
  }
  return true;
}

Result<std::optional<uint64_t>> Engine::length(SpaceId space, std::string_view name) {
  if (auto s = checkSpace(space); !s) return s.error();
  if (auto s = checkName(name, "sequence"); !s) return s.error();
  const Sequence* seq = findSeq(space, name);
  return seq ? std::optional<uint64_t>(seq->tokens.size()) : std::nullopt;
}

void Engine::endOwner(OwnerId owner) {
  for (SpaceId space = 0; space < spaces_.size(); ++space) {
    std::vector<std::string> doomed;
    for (const auto& [name, seq] : spaces_[space].seqs) {
      if (seq.owner == owner && !seq.options.detached) doomed.push_back(name);
    }
    for (const auto& name : doomed) eraseSeq(space, name);
  }
}

size_t Engine::dropCorrupt(SpaceId space, std::span<const BlockLocation> refs) {
  if (!checkSpace(space)) return 0;
  size_t dropped = 0;
  for (const BlockLocation& ref : refs) {
    const BlockId id = pool_.find(ref.extent, ref.offset);
    if (id == kNoBlock) continue;
    BlockMeta& m = pool_[id];
    if (m.generation != ref.generation || m.state != BlockState::kSealed || m.space != space ||
        m.corrupt || !memory_.hostAddressable(m.extent)) {
      continue;
    }
    // The reader's word is not taken: the engine sums the bytes itself.
    const auto sum = pool_.checksum(id);
    if (!sum || blockChecksum(memory_.blockData(m), pool_.classBytes(m.sizeClass)) == *sum) {
      continue;
    }
    markCorrupt(id, space);
    ++dropped;
  }
  return dropped;
}

void Engine::markCorrupt(BlockId id, SpaceId space) {
  BlockMeta& m = pool_[id];
  m.corrupt = true;
  ++corruptBlocks_;
  if (m.entry) {
    entries_.erase(IndexKey{space, m.key});
  } else if (index_.find(space, m.key) == id) {
    index_.erase(space, m.key);
    if (observer_) observer_->blockUnindexed(space, m.key);
  }
  // Cached and free to go: freed now (or, while the cold tier writes it, when that is done).
  // Held or pinned: freed when the last holder lets go (settle), never cached again.
  if (m.refs == 0 && m.pins == 0) {
    cacheErase(id);
    if (!m.spilling) pool_.release(id);
  }
}

EngineStats Engine::stats() const {
  EngineStats s;
  for (uint32_t cls = 0; cls < pool_.classCount(); ++cls) {
    if (pool_.classTier(cls) == 0) {
      s.blocksUsed += pool_.blocksUsed(cls);
    } else {
      s.gpuBlocksTotal += pool_.blocksTotal(cls);
      s.gpuBlocksUsed += pool_.blocksUsed(cls);
    }
  }
  s.gpuDemoted = gpuDemoted_;
  s.gpuPromoted = gpuPromoted_;
  s.blocksPinned = pinnedBlocks_;
  s.blocksCached = policy_->size();
  s.bytesTotal = pool_.bytesTotal();
  s.bytesUsed = pool_.bytesUsed();
  s.hits = hits_;
  s.misses = misses_;
  s.evictions = evictions_;
  s.eviction = evictionName(policy_->kind());
  s.evictionFollowing = evictionName(policy_->following());
  s.evictionSwitches = policy_->switches();
  s.corruptBlocks = corruptBlocks_;
  s.readLeases = readLeases_.size();
  s.snapshots = snapshots_.size();
  s.spilled = spilled_;
  s.promoted = promoted_;
  s.remoteFetched = remoteFetched_;
  s.coldHits = coldHits_;
  s.evictedUnspilled = evictedUnspilled_;
  s.entries = entries_.size();
  s.writeLeases = writeLeases_.size();
  s.bytesPut = bytesPut_;
  s.bytesGot = bytesGot_;
  s.tenantQuotaBytes = tenantQuota_;
  for (TenantId t = 0; t < tenants_.size(); ++t) {
    EngineStats::Tenant x;
    x.salt = tenants_[t].salt;
    x.bytesUsed = pool_.tenantBytes(t);
    for (const auto& order : tenants_[t].cached) x.blocksCached += order.size;
    s.tenants.push_back(x);
  }
  for (const auto& sp : spaces_) {
    EngineStats::Space x;
    x.fingerprint = sp.info.fingerprint;
    x.blockBytes = sp.info.blockBytes;
    x.blocksTotal = pool_.blocksTotal(sp.info.sizeClass);
    x.blocksUsed = pool_.blocksUsed(sp.info.sizeClass);
    x.sequences = sp.seqs.size();
    for (const auto& [name, seq] : sp.seqs) s.checkpoints += seq.checkpoints.size();
    s.sequences += x.sequences;
    s.spaces.push_back(x);
  }
  // Exact for one block size; with several, blocks of every class in use plus what the largest
  // class could still carve.
  for (uint32_t cls = 0; cls < pool_.classCount(); ++cls) {
    if (pool_.classTier(cls) != 0) continue;
    s.blocksTotal =
        std::max(s.blocksTotal, pool_.blocksTotal(cls) + (s.blocksUsed - pool_.blocksUsed(cls)));
  }
  return s;
}

Result<std::vector<Key128>> Engine::sequenceKeys(SpaceId space, std::string_view name,
                                                 uint64_t begin, uint64_t end, bool whole) {
  if (auto s = checkSpace(space); !s) return s.error();
  if (auto s = checkName(name, "sequence"); !s) return s.error();
  const Sequence* seq = findSeq(space, name);
  if (!seq) return makeError(ErrorCode::kNotFound, "no sequence ", name);
  if (seq->unindexed) {
    return invalid("sequence ", name, " holds KV that is not a prefill of its tokens: ",
                   "it is not keyed, only a snapshot of it can go to another node");
  }
  end = std::min<uint64_t>(end, seq->tokens.size());
  if (begin > end) return invalid("range [", begin, ", ", end, ") has begin after end");
  const uint32_t bt = blockTokens(space);
  const size_t sealed = seq->keys.size();
  if (whole && end > sealed * bt) {
    return invalid("positions [", std::max<uint64_t>(begin, sealed * bt), ", ", end, ") of ", name,
                   " are in its unfilled last block, which cannot leave this node: move [", begin,
                   ", ", sealed * bt, ") or copy");
  }
  std::vector<Key128> out;
  const size_t last = std::min<size_t>(sealed, (end + bt - 1) / bt);
  for (size_t i = begin / bt; i < last; ++i) {
    if (i < seq->blocks.size() && seq->blocks[i] != kNoBlock) out.push_back(seq->keys[i]);
  }
  return out;
}

size_t Engine::dropCached(SpaceId space, std::span<const Key128> keys) {
  size_t freed = 0;
  for (const Key128& key : keys) {
    const BlockId id = index_.find(space, key);
    if (id == kNoBlock) continue;
    const BlockMeta& m = pool_[id];
    if (m.state != BlockState::kSealed || m.refs != 0 || m.pins != 0 || m.spilling) continue;
    evict(id);
    ++freed;
  }
  return freed;
}

}  // namespace kvtier
