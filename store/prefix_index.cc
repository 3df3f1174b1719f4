#include "store/prefix_index.h"

#include <algorithm>
#include <cstring>
#include <random>

namespace kvtier {
namespace {

uint64_t randomSeed() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

// A 64x64 -> 128 multiply folded to 64 bits (the mixing step of wyhash and friends).
inline uint64_t mix(uint64_t a, uint64_t b) {
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
}

constexpr size_t kMinSlots = 1024;

}  // namespace

PrefixIndex::PrefixIndex(const BlockPool& pool, uint64_t seed)
    : pool_(pool), seed_(seed != 0 ? seed : randomSeed()) {}

uint32_t PrefixIndex::hash(uint32_t space, const Key128& key) const {
  uint64_t lo, hi;
  std::memcpy(&lo, key.bytes.data(), sizeof lo);
  std::memcpy(&hi, key.bytes.data() + 8, sizeof hi);
  const uint64_t h =
      mix(lo ^ seed_ ^ 0xa0761d6478bd642full, hi ^ (uint64_t{space} << 32) ^ 0xe7037ed1a0b428dbull);
  return static_cast<uint32_t>(mix(h, seed_ ^ 0x8ebc6af09c88c6e3ull));
}

bool PrefixIndex::matches(const Slot& s, uint32_t space, const Key128& key, uint32_t h) const {
  if (s.hash != h) return false;
  const BlockMeta& m = pool_[s.block];
  return m.space == space && m.key == key;
}

size_t PrefixIndex::slotOf(uint32_t space, const Key128& key, uint32_t h) const {
  if (slots_.empty()) return 0;
  for (size_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.block == kNoBlock) return slots_.size();
    if (matches(s, space, key, h)) return i;
  }
}

BlockId PrefixIndex::find(uint32_t space, const Key128& key, uint32_t h) const {
  const size_t i = slotOf(space, key, h);
  return i < slots_.size() ? slots_[i].block : kNoBlock;
}

size_t PrefixIndex::findRun(uint32_t space, std::span<const Key128> keys,
                            std::vector<BlockId>& out) const {
  if (slots_.empty()) return 0;
  // Slots are prefetched kSlotAhead keys ahead; kMetaAhead keys ahead the (by then cached) home
  // slot of a key names its likely block, whose metadata is prefetched for the probe's compare.
  constexpr size_t kSlotAhead = 16, kMetaAhead = 8;
  const size_t n = keys.size();
  hashScratch_.resize(n);
  for (size_t i = 0; i < n; ++i) hashScratch_[i] = hash(space, keys[i]);
  for (size_t i = 0; i < std::min(n, kSlotAhead); ++i) prefetch(hashScratch_[i]);
  for (size_t i = 0; i < n; ++i) {
    if (i + kSlotAhead < n) prefetch(hashScratch_[i + kSlotAhead]);
    if (i + kMetaAhead < n) {
      const uint32_t h = hashScratch_[i + kMetaAhead];
      const Slot& s = slots_[h & mask_];
      if (s.block != kNoBlock && s.hash == h) __builtin_prefetch(&pool_[s.block]);
    }
    const BlockId b = find(space, keys[i], hashScratch_[i]);
    if (b == kNoBlock) return i;
    out.push_back(b);
  }
  return n;
}

BlockId PrefixIndex::insert(uint32_t space, const Key128& key, BlockId block) {
  const uint32_t h = hash(space, key);
  // One probe: it ends at the entry for (space, key), or at the empty slot a new entry goes in
  // (unless the table has to grow first).
  size_t i = h & mask_;
  if (!slots_.empty()) {
    for (; slots_[i].block != kNoBlock; i = (i + 1) & mask_) {
      if (matches(slots_[i], space, key, h)) return slots_[i].block;
    }
  }
  if ((size_ + 1) * 4 > slots_.size() * 3) {
    grow();
    for (i = h & mask_; slots_[i].block != kNoBlock; i = (i + 1) & mask_) {
    }
  }
  slots_[i] = Slot{h, block};
  ++size_;
  return kNoBlock;
}

bool PrefixIndex::erase(uint32_t space, const Key128& key) {
  size_t hole = slotOf(space, key, hash(space, key));
  if (hole >= slots_.size()) return false;
  // Backward shift: every entry after the hole, up to the next empty slot, that may move into
  // the hole (its home is not in (hole, its slot]) moves there, leaving a hole where it was.
  for (size_t j = (hole + 1) & mask_;; j = (j + 1) & mask_) {
    const Slot& s = slots_[j];
    if (s.block == kNoBlock) break;
    const size_t home = s.hash & mask_;
    if (((j - home) & mask_) >= ((j - hole) & mask_)) {
      slots_[hole] = s;
      hole = j;
    }
  }
  slots_[hole] = Slot{};
  --size_;
  return true;
}

bool PrefixIndex::replace(uint32_t space, const Key128& key, BlockId block) {
  const size_t i = slotOf(space, key, hash(space, key));
  if (i >= slots_.size()) return false;
  slots_[i].block = block;
  return true;
}

void PrefixIndex::grow() {
  auto old = std::move(slots_);
  const size_t n = old.empty() ? kMinSlots : old.size() * 2;
  slots_.assign(n, Slot{});
  mask_ = n - 1;
  for (const Slot& s : old) {
    if (s.block == kNoBlock) continue;
    size_t i = s.hash & mask_;
    while (slots_[i].block != kNoBlock) i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

}  // namespace kvtier
