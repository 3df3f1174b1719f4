#include "store/eviction_fifo.h"

#include <algorithm>

namespace kvtier {
namespace {

bool skipped(std::span<const BlockId> skip, BlockId id) {
  return !skip.empty() && std::binary_search(skip.begin(), skip.end(), id);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// FifoFamilyPolicy

FifoFamilyPolicy::Class& FifoFamilyPolicy::cls(uint32_t c) {
  if (c >= classes_.size()) classes_.resize(size_t{c} + 1);
  return classes_[c];
}

FifoFamilyPolicy::State& FifoFamilyPolicy::stateOf(BlockId id) {
  links_.reserve(id);
  if (id >= state_.size()) state_.resize(size_t{id} + 1);
  return state_[id];
}

BlockLists::List& FifoFamilyPolicy::queueOf(Class& k, uint8_t queue) {
  if (queue == kSmall) return k.small;
  if (queue == kReplica) return k.replicas;
  return k.main;
}

uint64_t FifoFamilyPolicy::mainBlocks(uint32_t sizeClass) const {
  const Class* k = findClass(sizeClass);
  return k ? k->main.size : 0;
}

uint64_t FifoFamilyPolicy::smallBlocks(uint32_t sizeClass) const {
  const Class* k = findClass(sizeClass);
  return k ? k->small.size : 0;
}

bool FifoFamilyPolicy::evictable(BlockId id, std::span<const BlockId> skip) const {
  return !state_[id].held && !skipped(skip, id);
}

BlockId FifoFamilyPolicy::nextWrapping(const BlockLists::List& l, BlockId id) const {
  const BlockId next = links_.next(id);
  return next == kNoBlock ? l.head : next;
}

bool FifoFamilyPolicy::reinsert(BlockId id, bool first, uint8_t maxUses) {
  State& s = state_[id];
  if (!s.linked) return false;
  Class& k = classes_[s.sizeClass];
  if (s.queue == kReplica && !first) {
    // A replica read again: it joins the main queue, as newest.
    links_.unlink(k.replicas, id);
    links_.link(k.main, id);
    s.queue = kMain;
  }
  s.uses = static_cast<uint8_t>(std::min<int>(s.uses + 1, maxUses));
  if (s.held) {
    s.held = false;
    ++size_;
    ++k.evictable;
  }
  return true;
}

void FifoFamilyPolicy::link(BlockId id, uint32_t sizeClass, uint8_t queue, uint8_t uses) {
  Class& k = cls(sizeClass);
  links_.link(queueOf(k, queue), id, /*atHead=*/queue == kReplica);
  State& s = state_[id];
  s.queue = queue;
  s.linked = true;
  s.held = false;
  s.uses = uses;
  s.sizeClass = sizeClass;
  ++size_;
  ++k.evictable;
}

FifoFamilyPolicy::State FifoFamilyPolicy::unlinkAndForget(BlockId id) {
  const State s = state_[id];
  if (s.linked) {
    Class& k = classes_[s.sizeClass];
    if (k.hand == id) {
      const BlockId next = links_.next(id);
      k.hand = next;  // kNoBlock: the hand starts over at the oldest block
    }
    links_.unlink(queueOf(k, s.queue), id);
    if (!s.held) {
      --size_;
      --k.evictable;
    }
  }
  state_[id] = State{};
  return s;
}

void FifoFamilyPolicy::erase(BlockId id) {
  if (id >= state_.size()) return;
  State& s = state_[id];
  if (!s.linked || s.held) return;
  s.held = true;  // stays where it is in its queue
  --size_;
  --classes_[s.sizeClass].evictable;
}

void FifoFamilyPolicy::moved(BlockId from, BlockId to) {
  if (from >= state_.size() || state_[from].queue == kUnknown) return;
  stateOf(to);
  const State s = unlinkAndForget(from);
  // Its history comes along; its insert links it (a move may change its class).
  State& t = state_[to];
  t = State{};
  t.queue = s.queue;
  t.uses = s.uses;
  t.sizeClass = s.sizeClass;
}

size_t FifoFamilyPolicy::oldestReplicas(const Class& k, size_t max, std::vector<BlockId>& out,
                                        std::span<const BlockId> skip) const {
  size_t n = 0;
  for (BlockId id = k.replicas.head; id != kNoBlock && n < max; id = links_.next(id)) {
    if (!evictable(id, skip)) continue;
    out.push_back(id);
    ++n;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// SIEVE

void SieveEvictionPolicy::insert(BlockId id, uint32_t sizeClass, bool first, uint64_t /*tag*/) {
  State& s = stateOf(id);
  if (reinsert(id, first, 1)) return;
  if (first) {
    link(id, sizeClass, kReplica, 0);
  } else {
    // New content, or content moved here with its history (a use brought it back).
    link(id, sizeClass, kMain, s.queue == kUnknown ? 0 : 1);
  }
}

void SieveEvictionPolicy::evicted(BlockId id, uint64_t /*tag*/) {
  if (id < state_.size()) unlinkAndForget(id);
}

BlockId SieveEvictionPolicy::settle(Class& k) const {
  const uint64_t n = k.main.size;
  if (n == 0 || k.evictable == 0) return kNoBlock;
  BlockId h = k.hand == kNoBlock ? k.main.head : k.hand;
  // One pass clears every mark it meets; a second finds an unmarked block unless all are held.
  for (uint64_t step = 0; step < 2 * n; ++step) {
    State& s = state_[h];
    if (!s.held) {
      if (s.uses == 0) {
        k.hand = h;
        return h;
      }
      s.uses = 0;
    }
    h = nextWrapping(k.main, h);
  }
  k.hand = h;
  return kNoBlock;
}

BlockId SieveEvictionPolicy::victim(uint32_t sizeClass) const {
  Class* k = findClass(sizeClass);
  if (!k) return kNoBlock;
  for (BlockId id = k->replicas.head; id != kNoBlock; id = links_.next(id)) {
    if (!state_[id].held) return id;
  }
  return settle(*k);
}

void SieveEvictionPolicy::oldest(uint32_t sizeClass, size_t max, std::vector<BlockId>& out,
                                 std::span<const BlockId> skip) const {
  Class* k = findClass(sizeClass);
  if (!k) return;
  max -= oldestReplicas(*k, max, out, skip);
  if (max == 0) return;
  const BlockId start = settle(*k);
  if (start == kNoBlock) return;
  // From the hand round the queue: first the blocks not marked (the hand clears the others as it
  // passes), then, the hand back where it started, the ones it cleared — in the same order.
  const uint64_t n = k->main.size;
  for (int pass = 0; pass < 2; ++pass) {
    BlockId h = start;
    for (uint64_t step = 0; step < n && max > 0; ++step, h = nextWrapping(k->main, h)) {
      if (!evictable(h, skip) || (state_[h].uses != 0) != (pass == 1)) continue;
      out.push_back(h);
      --max;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// S3-FIFO

void S3FifoEvictionPolicy::insert(BlockId id, uint32_t sizeClass, bool first, uint64_t tag) {
  State& s = stateOf(id);
  if (reinsert(id, first, kMaxUses)) return;
  if (first) {
    link(id, sizeClass, kReplica, 0);
  } else if (s.queue != kUnknown) {
    // Moved here with its history, and used: back into the queue it came from.
    link(id, sizeClass, s.queue == kReplica ? uint8_t{kMain} : s.queue,
         static_cast<uint8_t>(std::min<int>(s.uses + 1, kMaxUses)));
  } else {
    // New in memory: content S evicted lately (a ghost) was wanted again, and goes to M.
    const bool ghost = tag != 0 && cls(sizeClass).ghosts.take(tag) >= 0;
    link(id, sizeClass, ghost ? kMain : kSmall, 0);
  }
}

void S3FifoEvictionPolicy::evicted(BlockId id, uint64_t tag) {
  if (id >= state_.size()) return;
  const State s = unlinkAndForget(id);
  if (!s.linked || s.queue != kSmall || tag == 0) return;
  Class& k = classes_[s.sizeClass];
  k.ghosts.add(tag, 0);
  while (k.ghosts.size(0) > std::max<uint64_t>(k.main.size, 1)) k.ghosts.dropOldest(0);
}

uint64_t S3FifoEvictionPolicy::ghostCount(uint32_t sizeClass) const {
  const Class* k = findClass(sizeClass);
  return k ? k->ghosts.size(0) : 0;
}

bool S3FifoEvictionPolicy::fromSmall(uint64_t small, uint64_t main, bool smallLeft, bool mainLeft) {
  if (!smallLeft) return false;
  const uint64_t target = std::max<uint64_t>(1, (small + main) / kSmallShareDivisor);
  return small >= target || !mainLeft;
}

BlockId S3FifoEvictionPolicy::settle(Class& k) const {
  if (k.evictable == 0) return kNoBlock;
  // Held blocks of M passed in a row: a whole round of them means M has nothing to give until a
  // block comes from S (`mainDone`). Each block of M is passed at most kMaxUses + 1 times before
  // it goes, held ones aside.
  uint64_t idle = 0;
  bool mainDone = false;
  for (uint64_t budget = (k.small.size + k.main.size) * (kMaxUses + 2) + 2; budget > 0; --budget) {
    if (fromSmall(k.small.size, k.main.size, k.small.head != kNoBlock,
                  k.main.head != kNoBlock && !mainDone)) {
      const BlockId id = k.small.head;
      State& s = state_[id];
      if (!s.held && s.uses == 0) return id;
      // Used while in S (or in use now): into M, its uses counted afresh there.
      links_.unlink(k.small, id);
      links_.link(k.main, id);
      s.queue = kMain;
      s.uses = 0;
      if (!s.held) {
        mainDone = false;
        idle = 0;
      }
      continue;
    }
    if (k.main.head == kNoBlock || mainDone) return kNoBlock;
    const BlockId id = k.main.head;
    State& s = state_[id];
    if (!s.held && s.uses == 0) return id;
    // A second chance: to M's newest end, one use less.
    if (!s.held) {
      --s.uses;
      idle = 0;
    } else if (++idle > k.main.size) {
      mainDone = true;
    }
    links_.unlink(k.main, id);
    links_.link(k.main, id);
  }
  return kNoBlock;
}

BlockId S3FifoEvictionPolicy::victim(uint32_t sizeClass) const {
  Class* k = findClass(sizeClass);
  if (!k) return kNoBlock;
  for (BlockId id = k->replicas.head; id != kNoBlock; id = links_.next(id)) {
    if (!state_[id].held) return id;
  }
  return settle(*k);
}

void S3FifoEvictionPolicy::oldest(uint32_t sizeClass, size_t max, std::vector<BlockId>& out,
                                  std::span<const BlockId> skip) const {
  Class* k = findClass(sizeClass);
  if (!k) return;
  max -= oldestReplicas(*k, max, out, skip);
  if (max == 0 || settle(*k) == kNoBlock) return;
  // From the settled queues, the evictions after the first are simulated, not performed: what
  // they would move goes to the end of a copy of M (`moved_`, with its uses), a block listed is
  // as good as gone. The same steps as settle(), the blocks of `skip` held.
  moved_.clear();
  BlockId inSmall = k->small.head, inMain = k->main.head;
  size_t inMoved = 0;
  uint64_t small = k->small.size, main = k->main.size, idle = 0;
  bool mainDone = false;
  for (uint64_t budget = (small + main) * (kMaxUses + 2) + 2; max > 0 && budget > 0; --budget) {
    const bool mainLeft = inMain != kNoBlock || inMoved < moved_.size();
    if (fromSmall(small, main, inSmall != kNoBlock, mainLeft && !mainDone)) {
      const BlockId id = inSmall;
      inSmall = links_.next(id);
      --small;
      if (evictable(id, skip) && state_[id].uses == 0) {
        out.push_back(id);
        --max;
        continue;
      }
      ++main;
      moved_.push_back({id, 0});
      if (evictable(id, skip)) {
        mainDone = false;
        idle = 0;
      }
      continue;
    }
    if (!mainLeft || mainDone) break;
    Moved m;
    if (inMain != kNoBlock) {
      m = {inMain, state_[inMain].uses};
      inMain = links_.next(inMain);
    } else {
      m = moved_[inMoved++];
    }
    if (evictable(m.id, skip) && m.uses == 0) {
      out.push_back(m.id);
      --main;
      --max;
      idle = 0;
      continue;
    }
    if (evictable(m.id, skip)) {
      --m.uses;
      idle = 0;
    } else if (++idle > main) {
      mainDone = true;
    }
    moved_.push_back(m);
  }
}

}  // namespace kvtier
