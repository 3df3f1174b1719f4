#include "store/key_memo.h"

#include <bit>
#include <cstring>
#include <random>

// Inlined, as in store/checksum.cc: the store's objects also go into the SDK.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvtier {

namespace {

uint64_t randomSeed() {
  std::random_device device;
  return (uint64_t{device()} << 32) ^ device();
}

}  // namespace

KeyMemo::KeyMemo(size_t slots, uint64_t seed)
    : mask_(std::bit_ceil(std::max<size_t>(slots, 1)) - 1),
      seed_(seed != 0 ? seed : randomSeed()) {}

uint64_t KeyMemo::slotOf(uint32_t space, size_t index, std::span<const uint32_t> tokens) const {
  const uint64_t salt =
      seed_ ^ (uint64_t{space} * 0x9e3779b97f4a7c15ull) ^ (uint64_t{index} * 0xc2b2ae3d27d4eb4full);
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), salt) & mask_;
}

const Key128* KeyMemo::find(uint64_t slot, uint32_t space, const Key128* previous,
                            std::span<const uint32_t> tokens) const {
  if (!slots_ || tokens.empty() || tokens.size() > kMaxTokens) return nullptr;
  const Slot& s = slots_[slot];
  const bool same = s.tokenCount == tokens.size() && s.space == space &&
                    s.root == (previous == nullptr) &&
                    (previous == nullptr || s.previous == *previous) &&
                    std::memcmp(s.tokens, tokens.data(), tokens.size_bytes()) == 0;
  if (!same) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  return &s.key;
}

void KeyMemo::remember(uint64_t slot, uint32_t space, const Key128* previous,
                       std::span<const uint32_t> tokens, const Key128& key) {
  if (tokens.empty() || tokens.size() > kMaxTokens) return;
  if (!slots_) slots_ = std::make_unique<Slot[]>(mask_ + 1);
  Slot& s = slots_[slot];
  s.previous = previous ? *previous : Key128{};
  s.key = key;
  s.space = space;
  s.root = previous == nullptr;
  s.tokenCount = static_cast<uint16_t>(tokens.size());
  std::memcpy(s.tokens, tokens.data(), tokens.size_bytes());
}

Key128 MemoHasher::next(size_t index, const Key128* previous, std::span<const uint32_t> tokens,
                        uint64_t slot) {
  if (memo_ == nullptr || tokens.size() > KeyMemo::kMaxTokens) {
    return hasher_.next(previous, tokens);
  }
  if (slot == kNoSlot) slot = memo_->slotOf(space_, index, tokens);
  if (const Key128* known = memo_->find(slot, space_, previous, tokens)) return *known;
  const Key128 key = hasher_.next(previous, tokens);
  memo_->remember(slot, space_, previous, tokens, key);
  return key;
}

uint64_t MemoHasher::prefetch(size_t index, std::span<const uint32_t> tokens) const {
  if (memo_ == nullptr || tokens.size() > KeyMemo::kMaxTokens) return kNoSlot;
  const uint64_t slot = memo_->slotOf(space_, index, tokens);
  memo_->prefetch(slot);
  return slot;
}

}  // namespace kvtier
