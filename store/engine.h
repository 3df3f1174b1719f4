// Engine: the node's KV-cache state machine — namespaces, sequences, the prefix index, leases and
// eviction over one BlockPool. No I/O of its own: memory comes through BlockMemory.
//
// Semantics are those of docs/semantics.md (DESIGN.md "Semantics"). Every mutation is atomic: a
// call that returns an error changed nothing.
//
// Thread-safety: none. The daemon's event loop owns the engine; other threads hand it work.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/error.h"
#include "kvtier/layout.h"
#include "store/block_pool.h"
#include "store/eviction.h"
#include "store/limits.h"

namespace kvtier {

using SpaceId = uint32_t;
using OwnerId = uint64_t;  // a client session
using LeaseId = uint64_t;

inline constexpr uint64_t kEnd = std::numeric_limits<uint64_t>::max();

struct PutGrant {
  LeaseId lease = 0;
  // blocks[0] starts at firstPosition = begin rounded down to a block. Slots of blocks[0] before
  // `begin` already hold the sequence's bytes; the client writes positions [begin, begin + n).
  uint64_t firstPosition = 0;
  std::vector<BlockLocation> blocks;
};

struct CommitResult {
  uint64_t length = 0;        // the sequence's length after the commit
  uint32_t sealedBlocks = 0;  // blocks this commit sealed and keyed
};

struct ReadGrant {
  LeaseId lease = 0;  // 0 when no block is covered
  uint64_t firstPosition = 0;
  uint64_t end = 0;
  std::vector<BlockLocation> blocks;
};

struct LookupResult {
  uint64_t matchedTokens = 0;
  LeaseId lease = 0;  // 0 when nothing matched
  std::vector<BlockLocation> blocks;
};

struct SpaceInfo {
  Layout layout;
  uint64_t fingerprint = 0;
  Salt salt{};
  uint32_t sizeClass = 0;
  uint32_t blockBytes = 0;
};

struct EngineStats {
  uint64_t blocksTotal = 0, blocksUsed = 0, blocksPinned = 0, blocksCached = 0;
  uint64_t bytesTotal = 0, bytesUsed = 0;
  uint64_t hits = 0, misses = 0, evictions = 0;
  uint64_t sequences = 0, readLeases = 0, writeLeases = 0;
  uint64_t bytesPut = 0, bytesGot = 0;
  struct Space {
    uint64_t fingerprint = 0;
    uint32_t blockBytes = 0;
    uint64_t blocksTotal = 0, blocksUsed = 0, sequences = 0;
  };
  std::vector<Space> spaces;
};

class Engine {
 public:
  // `pool` and `memory` are borrowed and must outlive the engine.
  Engine(BlockPool& pool, BlockMemory& memory, std::unique_ptr<EvictionPolicy> policy = nullptr);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The namespace for (salt, layout): the same id for the same pair. INVALID_ARGUMENT for a bad
  // layout or one whose blocks are larger than an extent.
  Result<SpaceId> openSpace(const Layout& layout, const Salt& salt);
  const SpaceInfo& space(SpaceId id) const { return spaces_[id].info; }

  // Write lease for positions [begin, begin + tokens.size()) of `seq` (created at commit if absent;
  // owned by `owner` unless `detached`). `keys`, if not empty, are the client's own keys for the
  // blocks this put completes, in order. Errors: INVALID_ARGUMENT (begin > length, sizes, names,
  // key count), CONFLICT (another write lease holds seq), FULL.
  Result<PutGrant> put(OwnerId owner, SpaceId space, std::string_view seq, uint64_t begin,
                       std::span<const uint32_t> tokens, std::span<const Key128> keys,
                       bool detached);
  // Makes positions [begin, upTo) visible (kEnd: all granted) and ends the lease. Errors: RELEASED
  // (unknown lease), INVALID_ARGUMENT (upTo outside the grant; the lease stays open), CONFLICT (the
  // sequence changed since the put: the lease ends, the sequence is untouched).
  Result<CommitResult> commit(LeaseId lease, uint64_t upTo);
  // Ends a write lease without a trace. RELEASED if unknown.
  Status abortWrite(LeaseId lease);
  // Writable bytes of granted block `index` of a write lease (for inline writes).
  Result<uint8_t*> leaseBlockData(LeaseId lease, uint32_t index);

  // Read lease on the blocks covering [begin, end) of seq (end = kEnd: the length).
  // Errors: NOT_FOUND (unknown seq), INVALID_ARGUMENT (begin > end or end > length).
  Result<ReadGrant> get(SpaceId space, std::string_view seq, uint64_t begin, uint64_t end);
  // Longest prefix of `tokens` (or of the client `keys`, one per block) made of sealed blocks,
  // under a read lease. With `bindSeq`, that prefix also becomes the whole of sequence bindSeq.
  Result<LookupResult> lookup(OwnerId owner, SpaceId space, std::span<const uint32_t> tokens,
                              std::span<const Key128> keys, std::string_view bindSeq,
                              bool detached);
  // Unpins the blocks of a read lease. RELEASED if unknown.
  Status releaseRead(LeaseId lease);

  Status copyPrefix(OwnerId owner, SpaceId space, std::string_view src, std::string_view dst,
                    uint64_t len, bool detached);
  Status remove(SpaceId space, std::string_view seq, uint64_t begin, uint64_t end);
  Status truncate(SpaceId space, std::string_view seq, uint64_t len);
  Result<bool> canResume(SpaceId space, std::string_view seq, uint64_t pos);
  // Length of seq, or nullopt when it does not exist.
  Result<std::optional<uint64_t>> length(SpaceId space, std::string_view seq);

  // Bytes of a sealed block of `space` named by a client reference. STALE_REFERENCE when the
  // generation no longer matches (the block was reused) or the block is no longer sealed;
  // INVALID_ARGUMENT for a reference that names no block.
  Result<const uint8_t*> resolveSealed(SpaceId space, const BlockLocation& ref);

  // Removes the sequences `owner` created that are not detached (its session ended).
  void endOwner(OwnerId owner);

  EngineStats stats() const;
  BlockPool& pool() { return pool_; }
  BlockMemory& memory() { return memory_; }

 private:
  struct Sequence {
    std::vector<BlockId> blocks;
    std::vector<uint32_t> tokens;  // one per position; its size is the length
    OwnerId owner = 0;
    bool detached = false;
    bool clientKeyed = false;  // keys came from the client: tokens cannot rebuild them
    uint64_t version = 0;      // engine-wide unique, changes on every mutation
  };
  struct Space {
    SpaceInfo info;
    std::unordered_map<std::string, Sequence> seqs;
    std::unordered_map<std::string, LeaseId> writers;  // seq name -> open write lease
  };
  struct WriteLease {
    SpaceId space = 0;
    std::string seq;
    OwnerId owner = 0;
    bool detached = false;
    uint64_t begin = 0;
    uint64_t firstPosition = 0;
    std::vector<uint32_t> tokens;
    std::vector<Key128> keys;
    std::vector<BlockId> blocks;
    bool firstInPlace = false;  // blocks[0] is the sequence's own partial block, appended in place
    uint64_t seqVersion = 0;    // 0: the sequence did not exist
  };
  struct ReadLease {
    std::vector<BlockId> blocks;
  };
  struct IndexKey {
    SpaceId space;
    Key128 key;
    bool operator==(const IndexKey&) const = default;
  };
  struct IndexKeyHash {
    size_t operator()(const IndexKey& k) const noexcept {
      return std::hash<Key128>()(k.key) ^ (size_t{k.space} * 0x9e3779b97f4a7c15ull);
    }
  };

  Status checkSpace(SpaceId space) const;
  Sequence* findSeq(SpaceId space, std::string_view name);
  uint32_t blockTokens(SpaceId space) const { return spaces_[space].info.layout.blockTokens; }

  // Allocation with eviction: a fresh block of the space's class, or kNoBlock when the class is
  // full and nothing is evictable.
  BlockId allocate(SpaceId space);
  // Allocates n blocks or none.
  bool allocateMany(SpaceId space, size_t n, std::vector<BlockId>& out);
  void ref(BlockId id);
  void unref(BlockId id);
  void pin(BlockId id);
  void unpin(BlockId id);
  // Frees a block that nothing holds any more, or hands a sealed one to the eviction policy.
  void settle(BlockId id);
  // Copies token slots [0, slots) of every layer's K and V from `from` to `to`.
  void copySlots(SpaceId space, BlockId from, BlockId to, uint32_t slots);
  // Seals block `index` of seq (full), keys it after block index-1, and dedups against the index.
  // Returns the block the sequence holds afterwards (the indexed twin if one existed).
  BlockId seal(SpaceId space, Sequence& seq, size_t index, const Key128& key);
  void replaceBlocks(Sequence& seq, std::vector<BlockId> blocks);
  void eraseSeq(SpaceId space, std::string_view name);
  LeaseId newReadLease(std::vector<BlockId> blocks);
  void finishWrite(LeaseId id, WriteLease& lease);

  BlockPool& pool_;
  BlockMemory& memory_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::vector<Space> spaces_;
  std::unordered_map<IndexKey, BlockId, IndexKeyHash> index_;
  std::unordered_map<LeaseId, WriteLease> writeLeases_;
  std::unordered_map<LeaseId, ReadLease> readLeases_;
  LeaseId nextLease_ = 1;
  uint64_t nextVersion_ = 1;
  uint64_t pinnedBlocks_ = 0;
  uint64_t hits_ = 0, misses_ = 0, evictions_ = 0, bytesPut_ = 0, bytesGot_ = 0;
};

}  // namespace kvtier
