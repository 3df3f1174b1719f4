// The engine's reads: get, lookup (a prefix's blocks by their chain of keys) and read leases.
#include "store/engine.h"
#include "store/engine_util.h"

#include <algorithm>

namespace kvtier {
namespace {

using engine_util::ceilDiv;
using engine_util::ChainKeys;
using engine_util::checkName;
using engine_util::invalid;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Reads

bool Engine::reachable(BlockId id, int servedTier) const {
  if (servedTier < 0) return true;
  const uint8_t tier = pool_.tierOf(id);
  return tier == 0 || tier == servedTier;
}

Result<ReadGrant> Engine::get(SpaceId space, std::string_view name, uint64_t begin, uint64_t end,
                              int servedTier) {
  if (auto s = checkSpace(space); !s) return s.error();
  if (auto s = checkName(name, "sequence"); !s) return s.error();
  Sequence* seq = findSeq(space, name);
  if (!seq) return makeError(ErrorCode::kNotFound, "no sequence '", name, "'");
  const uint64_t length = seq->tokens.size();
  if (end == kEnd) end = length;
  if (begin > end || end > length) {
    return invalid("range [", begin, ", ", end, ") is outside the sequence's [0, ", length, ")");
  }
  if (begin < end && begin < seq->firstRetained) {
    return invalid("positions before ", seq->firstRetained, " were released by the window");
  }
  const uint32_t bt = blockTokens(space);
  ReadGrant grant;
  grant.firstPosition = begin / bt * bt;
  grant.end = end;
  if (begin == end) {
    grant.firstPosition = begin;
    return grant;
  }
  const size_t firstBlock = begin / bt, lastBlock = ceilDiv(end, bt);
  if (lastBlock - firstBlock > kMaxBlocksPerLease) {
    return invalid("range covers ", lastBlock - firstBlock, " blocks, more than ",
                   kMaxBlocksPerLease, " per lease");
  }
  std::vector<BlockId> blocks(seq->blocks.begin() + firstBlock, seq->blocks.begin() + lastBlock);
  for (BlockId id : blocks) {
    if (!reachable(id, servedTier)) {
      return makeError(ErrorCode::kNotSupported,
                       "blocks of this range are in a GPU pool this session did not open: open "
                       "the space on that device");
    }
  }
  grant.blocks.reserve(blocks.size());
  for (BlockId id : blocks) {
    grant.blocks.push_back(pool_.location(id));
    // A sealed block's writer's checksum; a partial block has none (its bytes may still grow).
    const BlockMeta& m = pool_[id];
    grant.sums.push_back(m.state == BlockState::kSealed ? pool_.checksum(id).value_or(0) : 0);
  }
  bytesGot_ += (end - begin) * spaces_[space].info.layout.tokenKvBytes();
  grant.lease = newReadLease(std::move(blocks));
  return grant;
}

Status Engine::checkLookupInput(SpaceId space, std::span<const uint32_t> tokens,
                                std::span<const Key128> keys) const {
  if (auto s = checkSpace(space); !s) return s;
  if (!tokens.empty() && !keys.empty()) return invalid("lookup takes tokens or keys, not both");
  if (tokens.size() > kMaxTokensPerCall) {
    return invalid("lookup of ", tokens.size(), " tokens exceeds ", kMaxTokensPerCall);
  }
  if (keys.size() > kMaxBlocksPerLease) {
    return invalid("lookup of ", keys.size(), " keys exceeds ", kMaxBlocksPerLease);
  }
  return {};
}

Result<std::vector<Key128>> Engine::chainKeys(SpaceId space, std::span<const uint32_t> tokens,
                                              std::span<const Key128> keys,
                                              std::span<const Key128> known) const {
  if (auto s = checkLookupInput(space, tokens, keys); !s) return s.error();
  std::vector<Key128> out;
  walkKeys(space, tokens, keys, known, [&](size_t, const Key128& key) {
    out.push_back(key);
    return true;
  });
  return out;
}

size_t Engine::walkKeys(SpaceId space, std::span<const uint32_t> tokens,
                        std::span<const Key128> keys, std::span<const Key128> known,
                        const std::function<bool(size_t, const Key128&)>& visit) const {
  ChainKeys chain(spaces_[space].info, space, &keyMemo_, tokens, keys, known);
  for (size_t i = 0; i < chain.size(); ++i) {
    if (!visit(i, chain.next())) break;
  }
  return chain.size();
}

Result<LookupResult> Engine::lookup(OwnerId owner, SpaceId space, std::span<const uint32_t> tokens,
                                    std::span<const Key128> keys, std::string_view bindSeq,
                                    const SeqOptions& options, std::span<const Key128> knownKeys,
                                    int servedTier, LookupFor who, size_t maxBlocks) {
  if (auto s = checkLookupInput(space, tokens, keys); !s) return s.error();
  if (!bindSeq.empty()) {
    if (auto s = checkName(bindSeq, "sequence"); !s) return s.error();
    if (options.window > 0 && options.chunk > 0) {
      return invalid("a sequence has a window or a chunk size, not both");
    }
  }
  const uint32_t bt = blockTokens(space);
  const Layout& layout = spaces_[space].info.layout;
  // A client's lookup in a namespace with prefix states answers a prefix whose state is cached
  // too (engine_states.cc); binding a sequence, or a peer's pin, is about blocks alone.
  const bool withState = layout.hasState() && who == LookupFor::kClient && bindSeq.empty();
  if (!layout.hasKv() && !bindSeq.empty()) {
    return invalid("a layout without KV has no blocks to bind a sequence to");
  }
  ChainKeys chain(spaces_[space].info, space, &keyMemo_, tokens, keys, knownKeys);
  // (A client's lookup in a layout without KV has no blocks to match: only states. A peer's pin
  // or a hold matches the keys it names, a state's chunks among them.)
  const size_t candidates = layout.hasKv() || !withState ? chain.size() : 0;
  std::vector<BlockId> blocks;
  std::vector<Key128> batch;
  // Keys are hashed and probed in batches, so that the probes of a long prefix overlap their
  // cache misses (PrefixIndex::findRun); the batches double from 4, so that a lookup that misses
  // early hashes at most about twice the keys it needed.
  for (size_t want = 4; chain.taken() < candidates; want = std::min<size_t>(want * 2, 256)) {
    batch.clear();
    for (size_t n = std::min(want, candidates - chain.taken()); n > 0; --n) {
      batch.push_back(chain.next());
    }
    const size_t before = blocks.size();
    const size_t found = index_.findRun(space, batch, blocks);
    // A block the session cannot reach (another GPU's pool; any GPU's for a host session) ends
    // the match: a miss, never a reference the client cannot read.
    size_t reached = 0;
    while (reached < found && reachable(blocks[before + reached], servedTier)) ++reached;
    blocks.resize(before + reached);
    if (reached < batch.size()) break;
  }
  LookupResult result;
  result.matchedTokens = blocks.size() * bt;
  if (withState) {
    std::vector<Key128> matched;
    matched.reserve(blocks.size());
    for (BlockId id : blocks) matched.push_back(pool_[id].key);
    answerWithState(space, tokens, keys, matched, servedTier, blocks, result);
  }
  if (blocks.size() > maxBlocks) {
    return invalid("the cached prefix of ", blocks.size(), " blocks exceeds the ", maxBlocks,
                   " an answer may carry inline; map the pool or ask for less");
  }
  if (who == LookupFor::kClient) {
    const uint64_t wanted = keys.empty() ? tokens.size() / bt * bt : keys.size() * uint64_t{bt};
    hits_ += blocks.size();
    if (result.matchedTokens < std::min<uint64_t>(wanted, kMaxBlocksPerLease * uint64_t{bt})) {
      ++misses_;
    }
  }

  if (!bindSeq.empty()) {
    if (blocks.empty()) {
      eraseSeq(space, bindSeq);
    } else {
      Sequence& seq = createSeq(space, bindSeq, owner, options);
      replaceBlocks(seq, blocks);
      dropAllCheckpoints(seq);
      seq.firstRetained = 0;
      seq.unindexed = false;
      seq.keys.clear();
      if (keys.empty()) {
        seq.tokens.assign(tokens.begin(), tokens.begin() + result.matchedTokens);
        seq.clientKeyed = false;
      } else {
        seq.tokens.assign(result.matchedTokens, 0);
        seq.clientKeyed = true;
      }
      for (BlockId id : blocks) seq.keys.push_back(pool_[id].key);
      applyRetention(seq, bt);
      seq.version = nextVersion_++;
    }
  }
  result.blocks.reserve(blocks.size());
  for (BlockId id : blocks) result.blocks.push_back(pool_.location(id));
  if (who == LookupFor::kClient) {
    result.sums.reserve(blocks.size());
    for (BlockId id : blocks) result.sums.push_back(pool_.checksum(id).value_or(0));
  }
  if (who == LookupFor::kPeer) {
    for (BlockId id : blocks) result.checksums.push_back(pool_.checksum(id));
  }
  if (who == LookupFor::kHold) {
    // The settle this hold's release brings is not one of the replica's own (the fetch's and
    // its lookup's read): it must not spend one.
    for (BlockId id : blocks) {
      BlockMeta& m = pool_[id];
      if (m.replicaSettles > 0 && m.replicaSettles < 255 && m.pins == 0 && m.refs == 0)
        ++m.replicaSettles;
    }
  }
  bytesGot_ += result.matchedTokens * layout.tokenKvBytes() +
               (result.stateBlocks > 0 ? layout.stateBytes : 0);
  result.lease = newReadLease(std::move(blocks));
  return result;
}

Status Engine::releaseRead(LeaseId id) {
  auto it = readLeases_.find(id);
  if (it == readLeases_.end())
    return makeError(ErrorCode::kReleased, "read lease ", id, " is not open");
  unpinTailFirst(it->second.blocks);
  readLeases_.erase(it);
  return {};
}

Result<const uint8_t*> Engine::resolveSealed(SpaceId space, const BlockLocation& ref) {
  if (auto s = checkSpace(space); !s) return s.error();
  const BlockId id = pool_.find(ref.extent, ref.offset);
  if (id == kNoBlock) {
    return invalid("reference names no block (extent ", ref.extent, ", offset ", ref.offset, ")");
  }
  const BlockMeta& m = pool_[id];
  if (ref.bytes != pool_.classBytes(m.sizeClass))
    return invalid("reference has the wrong block size");
  if (m.generation != ref.generation || m.state != BlockState::kSealed || m.space != space) {
    return makeError(ErrorCode::kStaleReference, "block at extent ", ref.extent, " offset ",
                     ref.offset, " was reused (generation ", m.generation, ", reference ",
                     ref.generation, ")");
  }
  // A reference reads one KV block of the namespace: an entry (a blob of its own size, read with
  // getEntry) is not one, and its block may be smaller than the namespace's.
  if (m.entry || ref.bytes != spaces_[space].info.blockBytes) {
    return invalid("reference names an entry, not a KV block of this namespace");
  }
  if (!memory_.hostAddressable(m.extent)) {
    return makeError(ErrorCode::kNotSupported,
                     "the block is in GPU memory: read it through the device pool");
  }
  return static_cast<const uint8_t*>(memory_.blockData(m));
}

}  // namespace kvtier
