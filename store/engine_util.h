// Small helpers shared by the engine's implementation files (engine*.cc); not part of its API.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "kvtier/block_key.h"
#include "kvtier/error.h"
#include "store/block_pool.h"
#include "store/engine.h"
#include "store/key_memo.h"
#include "store/limits.h"

namespace kvtier::engine_util {

inline Error invalid(auto&&... args) { return makeError(ErrorCode::kInvalidArgument, args...); }

inline Status checkName(std::string_view name, const char* what) {
  if (name.empty()) return invalid(what, " name is empty");
  if (name.size() > kMaxSeqNameBytes) {
    return invalid(what, " name of ", name.size(), " bytes exceeds ", kMaxSeqNameBytes);
  }
  // Names travel as Cap'n Proto Text, which ends at its NUL: one inside is an ill-formed name
  // (and the SDK's strings would cut it there), never a different one.
  if (name.find('\0') != std::string_view::npos) return invalid(what, " name holds a NUL byte");
  return {};
}

// The eviction policy's name for a sealed block's content (EvictionPolicy::insert): 64 bits of
// its key, which is a cryptographic hash already, mixed with the namespace; never 0.
inline uint64_t contentTag(const BlockMeta& m) {
  uint64_t h;
  std::memcpy(&h, m.key.bytes.data() + 8, sizeof h);
  h ^= (uint64_t{m.space} + 1) * 0x9e3779b97f4a7c15ull;
  return h == 0 ? 1 : h;
}

inline uint64_t ceilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Blobs (checkpoints, entries) come in power-of-two size classes from 4 KiB, so that a handful of
// classes serve every size (at most 2x slack).
inline uint32_t blobClassBytes(uint64_t bytes) {
  uint64_t c = 4096;
  while (c < bytes) c <<= 1;
  return static_cast<uint32_t>(c);
}

// The candidate keys of a lookup, in chain order: the client's own, or the chain hashed from its
// tokens, the first `known.size()` taken from `known` (keys the SDK hashed already).
class ChainKeys {
 public:
  // `memo`: the engine's remembered keys (null: every key hashed).
  ChainKeys(const SpaceInfo& info, uint32_t space, KeyMemo* memo, std::span<const uint32_t> tokens,
            std::span<const Key128> keys, std::span<const Key128> known)
      : tokens_(tokens),
        keys_(keys),
        known_(known),
        bt_(info.layout.blockTokens),
        size_(keys.empty() ? std::min(tokens.size() / bt_, kMaxBlocksPerLease) : keys.size()),
        hasher_(info.fingerprint, info.salt, space, memo) {
    for (size_t i = known_.size(); keys_.empty() && i < std::min(size_, known_.size() + kAhead);
         ++i) {
      prefetch(i);
    }
  }

  size_t size() const { return size_; }
  size_t taken() const { return next_; }
  // The next key (taken() < size()).
  const Key128& next() {
    const size_t i = next_++;
    if (!keys_.empty()) {
      last_ = keys_[i];
    } else if (i < known_.size()) {
      last_ = known_[i];
    } else {
      // This block's slot was fetched a few blocks ago; the slot of the block as far ahead is
      // fetched now, meanwhile.
      const Ahead& mine = ahead_[i % kAhead];
      const uint64_t slot = mine.index == i ? mine.slot : MemoHasher::kNoSlot;
      if (i + kAhead < size_) prefetch(i + kAhead);
      last_ = hasher_.next(i, i == 0 ? nullptr : &last_, blockTokens(i), slot);
    }
    return last_;
  }

 private:
  static constexpr size_t kAhead = 4;
  std::span<const uint32_t> blockTokens(size_t i) const { return tokens_.subspan(i * bt_, bt_); }
  void prefetch(size_t i) { ahead_[i % kAhead] = {i, hasher_.prefetch(i, blockTokens(i))}; }

  // The memo slot fetched for block `index`, kept for its next().
  struct Ahead {
    size_t index = SIZE_MAX;
    uint64_t slot = MemoHasher::kNoSlot;
  };

  std::span<const uint32_t> tokens_;
  std::span<const Key128> keys_, known_;
  uint32_t bt_;
  size_t size_;
  MemoHasher hasher_;
  size_t next_ = 0;
  Key128 last_;
  Ahead ahead_[kAhead];
};

}  // namespace kvtier::engine_util
