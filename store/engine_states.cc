// Prefix states: what a restore at a position needs besides the KV blocks before it, for models
// with recurrent layers (Layout::stateBytes; docs/cache-shapes.md).
//
// A state is kept as chunks of the namespace's block size, sealed in the prefix index under keys
// derived from the prefix's content (StateKeyHasher), so any process finds another's and the
// chunks are evicted, spilled to the cold tier, promoted and counted as blocks are. A client's
// lookup in such a namespace answers the deepest position whose whole state is cached, with the
// blocks before it and the state's chunks under one read lease: never blocks without their state.
#include <algorithm>

#include "store/engine.h"
#include "store/engine_util.h"

namespace kvtier {

namespace {

using engine_util::ChainKeys;
using engine_util::invalid;

// Positions inside a block (not on a block boundary) hold a state only where an engine stored
// one at the end of a turn; they are searched after the deepest block the chain reaches (and a
// few blocks before it), each costing one hash per candidate position.
constexpr size_t kMaxInnerSearchBlocks = 64;

}  // namespace

Result<PutGrant> Engine::putState(SpaceId space, std::span<const uint32_t> tokens,
                                  std::span<const Key128> keys) {
  if (auto s = checkSpace(space); !s) return s.error();
  const SpaceInfo& info = spaces_[space].info;
  const Layout& layout = info.layout;
  if (!layout.hasState()) {
    return invalid("the namespace's layout declares no state (Layout::stateBytes)");
  }
  const uint32_t bt = layout.blockTokens;
  if (!keys.empty() && !tokens.empty()) return invalid("a state is named by tokens or by keys");
  if (tokens.size() > kMaxTokensPerCall) {
    return invalid("state after ", tokens.size(), " tokens: at most ", kMaxTokensPerCall);
  }
  if (keys.size() > kMaxBlocksPerLease) {
    return invalid("state after ", keys.size(), " blocks: at most ", kMaxBlocksPerLease);
  }
  if (tokens.empty() && keys.empty()) return invalid("a state after no tokens");
  // Its keys: anchored at the prefix's last whole block, named by the tokens after it.
  const size_t whole = keys.empty() ? tokens.size() / bt : keys.size();
  const auto partial = static_cast<uint32_t>(keys.empty() ? tokens.size() % bt : 0);
  StateKeyHasher hasher(info.fingerprint, info.salt);
  WriteLease lease;
  if (whole == 0) {
    hasher.begin(hasher.root());
  } else if (!keys.empty()) {
    hasher.begin(keys.back());
    if (observer_) lease.keys.assign(keys.begin(), keys.end());
  } else {
    ChainKeys chain(info, space, &keyMemo_, tokens.first(whole * bt), {}, {});
    Key128 anchor;
    for (size_t i = 0; i < whole; ++i) {
      anchor = chain.next();
      // The cluster's directory files the chunks as if they followed the prefix's blocks.
      if (observer_) lease.keys.push_back(anchor);
    }
    hasher.begin(anchor);
  }
  for (uint32_t t = 0; t < partial; ++t) hasher.add(tokens[whole * bt + t]);
  const uint32_t chunks = layout.stateChunks(partial);

  lease.kind = LeaseKind::kState;
  lease.space = space;
  lease.begin = whole * bt + partial;
  lease.chain.reserve(chunks);
  for (uint32_t j = 0; j < chunks; ++j) lease.chain.push_back(hasher.chunk(j));
  // Chunks the index holds already are kept (pinned, as a put's cached blocks are); what the
  // client writes for them goes to the class's sink, a scratch block nobody reads.
  std::vector<BlockId> cached(chunks, kNoBlock), keep;
  for (uint32_t j = 0; j < chunks; ++j) {
    const BlockId hit = index_.find(space, lease.chain[j]);
    if (hit == kNoBlock) continue;
    cached[j] = hit;
    keep.push_back(hit);
  }
  const uint32_t cls = info.sizeClass;
  if (sinks_.size() <= cls) sinks_.resize(cls + 1, kNoBlock);
  const bool newSink = !keep.empty() && sinks_[cls] == kNoBlock;
  const size_t fresh = chunks - keep.size() + (newSink ? 1 : 0);
  if (!canAllocate(cls, fresh, info.tenant, keep)) {
    return makeError(ErrorCode::kFull, "pool has no free or evictable block of ", info.blockBytes,
                     " bytes for ", fresh, " of the state's ", chunks, " chunks");
  }
  for (BlockId id : keep) pin(id);
  std::vector<BlockId> got;
  if (!allocateMany(space, fresh, got)) {
    unpinTailFirst(keep);
    return makeError(ErrorCode::kFull, "pool has no room for the state's ", chunks, " chunks");
  }
  if (newSink) {
    sinks_[cls] = got.back();
    got.pop_back();
    pool_.setTenant(sinks_[cls], kNoTenant);
  }
  for (BlockId id : got) pin(id);
  auto next = got.begin();
  for (uint32_t j = 0; j < chunks; ++j) {
    lease.blocks.push_back(cached[j] != kNoBlock ? cached[j] : *next++);
  }
  if (!keep.empty()) {
    lease.reused.resize(chunks);
    for (uint32_t j = 0; j < chunks; ++j) lease.reused[j] = cached[j] != kNoBlock;
    lease.sink = sinks_[cls];
    pin(lease.sink);
  }
  PutGrant grant;
  grant.firstPosition = lease.begin;
  for (uint32_t j = 0; j < chunks; ++j) {
    const bool reused = !lease.reused.empty() && lease.reused[j];
    grant.blocks.push_back(pool_.location(reused ? lease.sink : lease.blocks[j]));
  }
  grant.lease = nextLease_++;
  writeLeases_.emplace(grant.lease, std::move(lease));
  return grant;
}

Result<CommitResult> Engine::commitState(LeaseId id, WriteLease& lease,
                                         std::span<const uint64_t> sums) {
  if (!sums.empty() && sums.size() != lease.blocks.size()) {
    return invalid("commit carries ", sums.size(), " checksums; the state has ",
                   lease.blocks.size(), " chunks");
  }
  const SpaceId space = lease.space;
  const uint32_t bytes = spaces_[space].info.blockBytes;
  uint32_t sealed = 0;
  for (size_t j = 0; j < lease.blocks.size(); ++j) {
    if (!lease.reused.empty() && lease.reused[j]) continue;  // cached already: kept as it is
    const BlockId b = lease.blocks[j];
    // A twin sealed meanwhile (another writer of the same state) is kept; ours is freed when the
    // lease lets go of it.
    if (index_.insert(space, lease.chain[j], b) != kNoBlock) continue;
    if (!sums.empty()) {
      pool_.setChecksum(b, sums[j]);
    } else {
      ensureChecksum(b, bytes);
    }
    BlockMeta& m = pool_[b];
    m.state = BlockState::kSealed;
    m.space = space;
    m.key = lease.chain[j];
    if (observer_) {
      // Filed as if the chunks followed the prefix's blocks (stateCandidates).
      std::vector<Key128> chain = lease.keys;
      chain.insert(chain.end(), lease.chain.begin(), lease.chain.begin() + j + 1);
      observer_->blockIndexed(space, lease.chain[j], chain);
    }
    ++sealed;
  }
  bytesPut_ += spaces_[space].info.layout.stateBytes;
  const uint64_t position = lease.begin;
  finishWrite(id, lease);
  return CommitResult{position, sealed};
}

Engine::StateFind Engine::findState(SpaceId space, std::span<const uint32_t> tokens,
                                    std::span<const Key128> keys, std::span<const Key128> chain,
                                    size_t blocks,
                                    const std::function<bool(const Key128&)>& has) const {
  const SpaceInfo& info = spaces_[space].info;
  const Layout& layout = info.layout;
  const uint32_t bt = layout.blockTokens;
  const uint64_t length = keys.empty() ? tokens.size() : keys.size() * uint64_t{bt};
  // The deepest block boundary a restore can start from: the chain's available blocks, or for a
  // layout without KV every whole block of the prompt. Its anchors: the chain's keys (hashed
  // here for a layout without KV).
  std::vector<Key128> hashed;
  size_t top = blocks;
  if (!layout.hasKv()) {
    top = std::min<size_t>(length / bt, kMaxBlocksPerLease);
    if (!keys.empty()) {
      chain = keys.first(top);
    } else {
      ChainKeys walk(info, space, &keyMemo_, tokens.first(top * bt), {}, {});
      hashed.reserve(top);
      for (size_t i = 0; i < top; ++i) hashed.push_back(walk.next());
      chain = hashed;
    }
  }
  StateKeyHasher hasher(info.fingerprint, info.salt);
  auto anchor = [&](size_t k) -> const Key128& { return k == 0 ? hasher.root() : chain[k - 1]; };
  // Every chunk of the state at hasher's current position, or nothing.
  auto whole = [&](StateFind& found) {
    const uint32_t n = layout.stateChunks(hasher.partial());
    found.chunks.clear();
    for (uint32_t j = 0; j < n; ++j) {
      Key128 key = hasher.chunk(j);
      if (!has(key)) return false;
      found.chunks.push_back(key);
    }
    return true;
  };
  StateFind found;
  // The deepest block boundary with a state (one key per boundary tried).
  size_t aligned = 0;
  for (size_t k = top; k > 0; --k) {
    hasher.begin(anchor(k));
    if (whole(found)) {
      aligned = k;
      found.position = k * uint64_t{bt};
      break;
    }
  }
  // A state inside a block past it beats it: searched from the deepest boundary down to it. Only
  // tokens name such states (client keys name whole blocks).
  if (tokens.empty()) return found;
  const size_t lowest =
      std::max(aligned, top >= kMaxInnerSearchBlocks ? top - kMaxInnerSearchBlocks + 1 : 0);
  StateFind inner;
  for (size_t k = top + 1; k-- > lowest;) {
    const uint64_t start = k * uint64_t{bt};
    if (start >= length) continue;
    const auto most = static_cast<uint32_t>(std::min<uint64_t>(bt - 1, length - start));
    hasher.begin(anchor(k));
    uint32_t best = 0;
    // Keys of chunk 0 for r = 1..most, each one more token hashed; the deepest one held wins.
    for (uint32_t r = 1; r <= most; ++r) {
      hasher.add(tokens[start + r - 1]);
      if (has(hasher.chunk(0))) best = r;
    }
    if (best == 0) continue;
    hasher.begin(anchor(k));
    for (uint32_t r = 1; r <= best; ++r) hasher.add(tokens[start + r - 1]);
    if (whole(inner)) {
      inner.position = start + best;
      return inner;
    }
  }
  return found;
}

std::vector<Engine::StateCandidate> Engine::stateCandidates(SpaceId space,
                                                            std::span<const uint32_t> tokens,
                                                            std::span<const Key128> keys,
                                                            std::span<const Key128> chain) const {
  const SpaceInfo& info = spaces_[space].info;
  const Layout& layout = info.layout;
  const uint32_t bt = layout.blockTokens;
  auto here = [&](const Key128& key) {
    return index_.find(space, key) != kNoBlock ||
           (cold_ && cold_->contains(info.fingerprint, info.salt, key));
  };
  // The blocks held here: as far as a restore can reach.
  size_t top = 0;
  if (layout.hasKv()) {
    while (top < chain.size() && here(chain[top])) ++top;
  } else {
    top = chain.size();
  }
  const StateFind local = findState(space, tokens, keys, chain, top, here);
  const uint64_t length = keys.empty() ? tokens.size() : keys.size() * uint64_t{bt};
  std::vector<StateCandidate> out;
  StateKeyHasher hasher(info.fingerprint, info.salt);
  auto anchor = [&](size_t k) -> const Key128& { return k == 0 ? hasher.root() : chain[k - 1]; };
  // Inside the block after the deepest held one (tokens only), deepest first.
  if (!tokens.empty() && top * uint64_t{bt} < length) {
    const uint64_t start = top * uint64_t{bt};
    const auto most = static_cast<uint32_t>(std::min<uint64_t>(bt - 1, length - start));
    hasher.begin(anchor(top));
    std::vector<StateCandidate> inner;
    for (uint32_t r = 1; r <= most; ++r) {
      hasher.add(tokens[start + r - 1]);
      if (start + r > local.position) inner.push_back({start + r, hasher.chunk(0)});
    }
    out.insert(out.end(), inner.rbegin(), inner.rend());
  }
  const size_t lowest = top > kMaxInnerSearchBlocks ? top - kMaxInnerSearchBlocks : 0;
  for (size_t k = top; k > lowest && k * uint64_t{bt} > local.position; --k) {
    hasher.begin(anchor(k));
    out.push_back({k * uint64_t{bt}, hasher.chunk(0)});
  }
  return out;
}

std::vector<Key128> Engine::stateChunkKeys(SpaceId space, std::span<const uint32_t> tokens,
                                           std::span<const Key128> keys, uint64_t position) const {
  const SpaceInfo& info = spaces_[space].info;
  const uint32_t bt = info.layout.blockTokens;
  const size_t whole = position / bt;
  const auto partial = static_cast<uint32_t>(position % bt);
  if (keys.empty() ? position > tokens.size() : partial != 0 || whole > keys.size()) return {};
  StateKeyHasher hasher(info.fingerprint, info.salt);
  if (whole == 0) {
    hasher.begin(hasher.root());
  } else if (!keys.empty()) {
    hasher.begin(keys[whole - 1]);
  } else {
    ChainKeys chain(info, space, &keyMemo_, tokens.first(whole * bt), {}, {});
    Key128 anchor;
    for (size_t i = 0; i < whole; ++i) anchor = chain.next();
    hasher.begin(anchor);
  }
  for (uint32_t t = 0; t < partial; ++t) hasher.add(tokens[whole * bt + t]);
  std::vector<Key128> out;
  const uint32_t chunks = info.layout.stateChunks(info.layout.hasKv() ? partial : 0);
  for (uint32_t j = 0; j < chunks; ++j) out.push_back(hasher.chunk(j));
  return out;
}

void Engine::answerWithState(SpaceId space, std::span<const uint32_t> tokens,
                             std::span<const Key128> keys, std::span<const Key128> chain,
                             int servedTier, std::vector<BlockId>& blocks, LookupResult& result) {
  const uint32_t bt = blockTokens(space);
  StateFind state = findState(space, tokens, keys, chain, blocks.size(), [&](const Key128& key) {
    const BlockId b = index_.find(space, key);
    return b != kNoBlock && reachable(b, servedTier);
  });
  result.matchedTokens = state.position;
  blocks.resize(spaces_[space].info.layout.hasKv() ? state.position / bt : 0);
  result.stateBlocks = static_cast<uint32_t>(state.chunks.size());
  for (const Key128& key : state.chunks) blocks.push_back(index_.find(space, key));
}

}  // namespace kvtier
