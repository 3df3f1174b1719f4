// The engine's writes: a put's grant, its commit or abort, and the lease's blocks.
#include "store/engine.h"
#include "store/engine_util.h"

#include <algorithm>

namespace kvtier {
namespace {

using engine_util::ceilDiv;
using engine_util::checkName;
using engine_util::invalid;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Put / commit / abort

Result<PutGrant> Engine::put(OwnerId owner, SpaceId space, std::string_view name, uint64_t begin,
                             std::span<const uint32_t> tokens, std::span<const Key128> keys,
                             const SeqOptions& options, uint8_t tier) {
  if (auto s = checkSpace(space); !s) return s.error();
  if (auto s = checkName(name, "sequence"); !s) return s.error();
  if (tier != 0 && !pool_.hasTier(tier)) return invalid("this daemon has no GPU pool ", tier - 1);
  if (options.window > 0 && options.chunk > 0) {
    return invalid("a sequence has a window or a chunk size, not both");
  }
  if (tokens.empty()) return invalid("put of no tokens (use truncate to shorten a sequence)");
  if (!spaces_[space].info.layout.hasKv()) {
    return invalid("the namespace's layout has no KV: it stores states only (putState)");
  }
  if (tokens.size() > kMaxTokensPerCall) {
    return invalid("put of ", tokens.size(), " tokens exceeds ", kMaxTokensPerCall);
  }
  Space& sp = spaces_[space];
  Sequence* seq = findSeq(space, name);
  const uint64_t length = seq ? seq->tokens.size() : 0;
  if (begin > length) return invalid("begin ", begin, " is past the sequence length ", length);
  if (seq && neededFrom(seq->options, begin) < seq->firstRetained) {
    return invalid("position ", begin, " needs tokens from ", neededFrom(seq->options, begin),
                   " but the window released everything before ", seq->firstRetained);
  }
  if (sp.writers.count(std::string(name))) {
    return makeError(ErrorCode::kConflict, "sequence '", name, "' already has an open write lease");
  }
  const uint32_t bt = sp.info.layout.blockTokens;
  const uint64_t first = begin / bt;
  const uint64_t end = begin + tokens.size();
  const uint64_t blockCount = ceilDiv(end, bt) - first;
  if (blockCount > kMaxBlocksPerLease) {
    return invalid("put needs ", blockCount, " blocks, more than ", kMaxBlocksPerLease,
                   " per lease");
  }
  const uint64_t completed = end / bt - first;  // blocks this put fills to the end
  if (!keys.empty() && keys.size() != completed) {
    return invalid("put completes ", completed, " blocks but ", keys.size(), " keys were given");
  }
  if (keys.empty() && completed > 0 && seq && seq->clientKeyed && !seq->unindexed) {
    return invalid("sequence '", name,
                   "' is keyed by the client: pass keys for the blocks this put completes");
  }

  const uint32_t slot0 = static_cast<uint32_t>(begin % bt);
  // Appending at the end of the sequence's own partial block: write in place, no copy. Only when no
  // lease pins it: a reader may hold positions past today's length (taken before a truncate), and
  // its bytes must never change under it.
  const bool inPlace = slot0 != 0 && seq && begin == length && first == seq->blocks.size() - 1 &&
                       pool_[seq->blocks[first]].state == BlockState::kPartial &&
                       pool_[seq->blocks[first]].refs == 1 && pool_[seq->blocks[first]].pins == 0;

  WriteLease lease;
  lease.chain = putChain(space, seq, begin, tokens, keys);
  // A completed block whose key the prefix index holds is the cached block: the commit would drop
  // a fresh copy for it (seal's dedup), so none is allocated, and no other prefix is evicted for
  // one. The lease pins the cached block; what the client writes for it goes to the class's sink,
  // a scratch block nobody reads, so a block a reader holds never changes under it. The block
  // `begin` falls inside (copied or appended) is always the lease's own.
  std::vector<BlockId> cached(blockCount, kNoBlock), keep;
  for (size_t j = slot0 != 0 ? 1 : 0; j < lease.chain.size(); ++j) {
    const BlockId hit = index_.find(space, lease.chain[j]);
    if (hit == kNoBlock) continue;
    cached[j] = hit;
    keep.push_back(hit);
  }
  const uint32_t cls = classOf(space, tier);
  if (sinks_.size() <= cls) sinks_.resize(cls + 1, kNoBlock);
  const bool newSink = !keep.empty() && sinks_[cls] == kNoBlock;
  const size_t fresh = blockCount - (inPlace ? 1 : 0) - keep.size() + (newSink ? 1 : 0);
  // Nothing is evicted unless the whole grant can be had (on error nothing changed).
  if (!canAllocate(cls, fresh, sp.info.tenant, keep)) {
    if (ownVictimsNeeded(cls, fresh, sp.info.tenant) > 0) {
      return makeError(ErrorCode::kFull, "tenant quota of ", tenantQuota_, " bytes: this tenant ",
                       "holds ", pool_.tenantBytes(sp.info.tenant), " and has too few cached ",
                       "blocks of its own to evict for ", fresh, " of ", blockCount, " blocks");
    }
    return makeError(ErrorCode::kFull, "pool has no free or evictable block of ",
                     sp.info.blockBytes, " bytes for ", fresh, " of ", blockCount, " blocks");
  }
  for (BlockId id : keep) pin(id);  // before allocating: no allocation may evict them
  std::vector<BlockId> got;
  if (!allocateMany(space, fresh, got, tier)) {
    unpinTailFirst(keep);
    return makeError(ErrorCode::kFull, "pool has no free or evictable block of ",
                     sp.info.blockBytes, " bytes for ", blockCount, " blocks");
  }
  if (newSink) {
    sinks_[cls] = got.back();
    got.pop_back();
    pool_.setTenant(sinks_[cls], kNoTenant);  // shared scratch: nobody's
  }
  // The lease pins every block it grants: never evicted, freed when the lease ends unless the
  // sequence took them.
  if (inPlace) {
    pin(seq->blocks[first]);
    pool_.clearChecksum(seq->blocks[first]);  // its bytes change: a checksum it had is stale
  }
  for (BlockId id : got) pin(id);
  auto next = got.begin();
  for (size_t j = 0; j < blockCount; ++j) {
    if (j == 0 && inPlace) {
      lease.blocks.push_back(seq->blocks[first]);
    } else {
      lease.blocks.push_back(cached[j] != kNoBlock ? cached[j] : *next++);
    }
  }
  if (!keep.empty()) {
    lease.reused.resize(blockCount);
    for (size_t j = 0; j < blockCount; ++j) lease.reused[j] = cached[j] != kNoBlock;
    lease.sink = sinks_[cls];
    pin(lease.sink);
  }
  if (!inPlace && slot0 != 0) {
    // Copy-on-write: the block holding `begin` may be sealed or shared; start a private copy.
    copySlots(space, seq->blocks[first], lease.blocks[0], slot0);
  }
  lease.space = space;
  lease.seq = std::string(name);
  lease.owner = owner;
  lease.options = options;
  lease.begin = begin;
  lease.firstPosition = first * bt;
  lease.tokens.assign(tokens.begin(), tokens.end());
  lease.keys.assign(keys.begin(), keys.end());
  lease.firstInPlace = inPlace;
  lease.seqVersion = seq ? seq->version : 0;

  PutGrant grant;
  grant.firstPosition = lease.firstPosition;
  grant.blocks.reserve(lease.blocks.size());
  for (size_t j = 0; j < lease.blocks.size(); ++j) {
    const bool reused = !lease.reused.empty() && lease.reused[j];
    grant.blocks.push_back(pool_.location(reused ? lease.sink : lease.blocks[j]));
  }
  grant.lease = nextLease_++;
  sp.writers.emplace(lease.seq, grant.lease);
  writeLeases_.emplace(grant.lease, std::move(lease));
  return grant;
}

void Engine::finishWrite(LeaseId id, WriteLease& lease) {
  // Blocks the sequence took keep its reference; the others are freed (never sealed) or, when
  // reused from the cache, evictable again.
  unpinTailFirst(lease.blocks);
  if (lease.sink != kNoBlock) {
    BlockMeta& sink = pool_[lease.sink];
    if (sink.pins == 1) sinks_[sink.sizeClass] = kNoBlock;  // its last writer: it is freed
    unpin(lease.sink);
  }
  if (lease.kind == LeaseKind::kSequence || lease.kind == LeaseKind::kCheckpoint) {
    spaces_[lease.space].writers.erase(lease.seq);
  }
  writeLeases_.erase(id);
}

Result<CommitResult> Engine::commit(LeaseId id, uint64_t upTo, std::span<const uint64_t> sums) {
  auto it = writeLeases_.find(id);
  if (it == writeLeases_.end()) {
    return makeError(ErrorCode::kReleased, "write lease ", id, " is not open");
  }
  WriteLease& lease = it->second;
  if (lease.kind == LeaseKind::kState) return commitState(id, lease, sums);
  if (lease.kind != LeaseKind::kSequence) return commitBlob(id, lease);
  const uint64_t grantEnd = lease.begin + lease.tokens.size();
  if (upTo == kEnd) upTo = grantEnd;
  if (upTo < lease.begin || upTo > grantEnd) {
    return invalid("commit up to ", upTo, " is outside the granted positions [", lease.begin, ", ",
                   grantEnd, "]");
  }
  const SpaceId space = lease.space;
  Sequence* seq = findSeq(space, lease.seq);
  if ((seq ? seq->version : 0) != lease.seqVersion) {
    finishWrite(id, lease);
    return makeError(ErrorCode::kConflict,
                     "sequence changed while the write lease was open; nothing committed");
  }
  const uint32_t bt = blockTokens(space);
  const uint64_t first = lease.firstPosition / bt;
  const size_t needed = static_cast<size_t>(ceilDiv(upTo - lease.firstPosition, bt));
  const uint64_t filled = grantEnd / bt - first;  // blocks the grant fills to their end
  if (!sums.empty() && sums.size() != filled) {
    return invalid("commit carries ", sums.size(), " block checksums; the grant fills ", filled,
                   " blocks");
  }
  // The writer's checksums, for the blocks the commit fills that are its own (a block reused
  // from the cache keeps the checksum it has).
  for (size_t j = 0; j < sums.size() && (first + j + 1) * bt <= upTo; ++j) {
    if (lease.reused.empty() || !lease.reused[j]) pool_.setChecksum(lease.blocks[j], sums[j]);
  }

  if (upTo == 0) {
    // Replacing from position 0 with nothing: the sequence ends up empty.
    eraseSeq(space, lease.seq);
    finishWrite(id, lease);
    return CommitResult{0, 0};
  }
  if (!seq) seq = &createSeq(space, lease.seq, lease.owner, lease.options);
  // The sequence: its blocks before `first`, then the lease's first `needed` blocks.
  for (size_t i = seq->blocks.size(); i-- > first;) {  // tail first, as unrefTailFirst
    if (i == first && lease.firstInPlace) continue;
    unref(seq->blocks[i]);
  }
  seq->blocks.resize(first);
  for (size_t i = 0; i < needed; ++i) {
    const BlockId b = lease.blocks[i];
    if (!(i == 0 && lease.firstInPlace)) {
      ref(b);
      // A reused block stays sealed (when the commit ends inside it, the sequence holds it as its
      // partial last block, as a truncate would leave it; an append copies it first).
      if (lease.reused.empty() || !lease.reused[i]) pool_[b].state = BlockState::kPartial;
    }
    seq->blocks.push_back(b);
  }
  seq->tokens.resize(lease.begin);
  seq->tokens.insert(seq->tokens.end(), lease.tokens.begin(),
                     lease.tokens.begin() + (upTo - lease.begin));
  dropCheckpointsAfter(*seq, lease.begin);
  if (!lease.keys.empty()) seq->clientKeyed = true;

  CommitResult result;
  // The keys the put computed (the client's, or the chain of the tokens) are not hashed again.
  result.sealedBlocks = sealFrom(space, *seq, first, lease.keys.empty() ? lease.chain : lease.keys);
  applyRetention(*seq, bt);
  seq->version = nextVersion_++;
  bytesPut_ += (upTo - lease.begin) * spaces_[space].info.layout.tokenKvBytes();
  result.length = upTo;
  finishWrite(id, lease);
  return result;
}

Status Engine::abortWrite(LeaseId id) {
  auto it = writeLeases_.find(id);
  if (it == writeLeases_.end())
    return makeError(ErrorCode::kReleased, "write lease ", id, " is not open");
  finishWrite(id, it->second);
  return {};
}

Result<uint8_t*> Engine::leaseBlockData(LeaseId id, uint32_t index) {
  auto it = writeLeases_.find(id);
  if (it == writeLeases_.end())
    return makeError(ErrorCode::kReleased, "write lease ", id, " is not open");
  if (index >= it->second.blocks.size()) {
    return invalid("block ", index, " is outside the lease's ", it->second.blocks.size(),
                   " blocks");
  }
  const WriteLease& lease = it->second;
  const bool reused = !lease.reused.empty() && lease.reused[index];
  const BlockMeta& m = pool_[reused ? lease.sink : lease.blocks[index]];
  if (!memory_.hostAddressable(m.extent)) {
    return makeError(ErrorCode::kNotSupported,
                     "the block is in GPU memory: write it through the device pool");
  }
  return memory_.blockData(m);
}

}  // namespace kvtier
