#include "store/eviction.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "store/eviction_adaptive.h"
#include "store/eviction_fifo.h"

namespace kvtier {
namespace {

bool skipped(std::span<const BlockId> skip, BlockId id) {
  return !skip.empty() && std::binary_search(skip.begin(), skip.end(), id);
}

}  // namespace

const char* evictionName(EvictionKind kind) {
  switch (kind) {
    case EvictionKind::kLru:
      return "lru";
    case EvictionKind::kArc:
      return "arc";
    case EvictionKind::kTwoQ:
      return "2q";
    case EvictionKind::kS3Fifo:
      return "s3fifo";
    case EvictionKind::kSieve:
      return "sieve";
    case EvictionKind::kAdaptive:
      return "adaptive";
  }
  return "?";
}

Result<EvictionKind> parseEvictionKind(std::string_view name) {
  if (name == "lru") return EvictionKind::kLru;
  if (name == "arc") return EvictionKind::kArc;
  if (name == "2q") return EvictionKind::kTwoQ;
  if (name == "s3fifo") return EvictionKind::kS3Fifo;
  if (name == "sieve") return EvictionKind::kSieve;
  if (name == "adaptive") return EvictionKind::kAdaptive;
  return makeError(ErrorCode::kInvalidArgument,
                   "eviction policy is lru, arc, 2q, s3fifo, sieve or adaptive, not '", name, "'");
}

std::unique_ptr<EvictionPolicy> makeEvictionPolicy(EvictionKind kind) {
  if (kind == EvictionKind::kLru) return std::make_unique<LruEvictionPolicy>();
  if (kind == EvictionKind::kTwoQ) return std::make_unique<TwoQEvictionPolicy>();
  if (kind == EvictionKind::kS3Fifo) return std::make_unique<S3FifoEvictionPolicy>();
  if (kind == EvictionKind::kSieve) return std::make_unique<SieveEvictionPolicy>();
  if (kind == EvictionKind::kAdaptive) return std::make_unique<AdaptiveEvictionPolicy>();
  return std::make_unique<ArcEvictionPolicy>();
}

// ---------------------------------------------------------------------------------------------
// BlockLists

void BlockLists::link(List& l, BlockId id, bool atHead) {
  Node& n = nodes_[id];
  if (atHead) {
    n = Node{kNoBlock, l.head};
    if (l.head != kNoBlock) nodes_[l.head].prev = id;
    l.head = id;
    if (l.tail == kNoBlock) l.tail = id;
  } else {
    n = Node{l.tail, kNoBlock};
    if (l.tail != kNoBlock) nodes_[l.tail].next = id;
    l.tail = id;
    if (l.head == kNoBlock) l.head = id;
  }
  ++l.size;
}

void BlockLists::unlink(List& l, BlockId id) {
  Node& n = nodes_[id];
  if (n.prev != kNoBlock)
    nodes_[n.prev].next = n.next;
  else
    l.head = n.next;
  if (n.next != kNoBlock)
    nodes_[n.next].prev = n.prev;
  else
    l.tail = n.prev;
  n = Node{};
  --l.size;
}

// ---------------------------------------------------------------------------------------------
// LRU

void LruEvictionPolicy::insert(BlockId id, uint32_t sizeClass, bool first, uint64_t /*tag*/) {
  links_.reserve(id);
  if (id >= state_.size()) state_.resize(size_t{id} + 1);
  if (sizeClass >= lists_.size()) lists_.resize(size_t{sizeClass} + 1);
  if (state_[id].linked) erase(id);
  links_.link(lists_[sizeClass], id, first);
  state_[id] = State{sizeClass, true};
  ++size_;
}

void LruEvictionPolicy::erase(BlockId id) {
  if (id >= state_.size() || !state_[id].linked) return;
  links_.unlink(lists_[state_[id].sizeClass], id);
  state_[id].linked = false;
  --size_;
}

BlockId LruEvictionPolicy::victim(uint32_t sizeClass) const {
  return sizeClass < lists_.size() ? lists_[sizeClass].head : kNoBlock;
}

void LruEvictionPolicy::oldest(uint32_t sizeClass, size_t max, std::vector<BlockId>& out,
                               std::span<const BlockId> skip) const {
  for (BlockId id = victim(sizeClass); id != kNoBlock && max > 0; id = links_.next(id)) {
    if (skipped(skip, id)) continue;
    out.push_back(id);
    --max;
  }
}

// ---------------------------------------------------------------------------------------------
// GhostLists

uint32_t GhostLists::fingerprint(uint64_t tag) {
  // Tags may be small numbers (tests) or slices of a cryptographic key: mix, then keep 32 bits.
  uint64_t x = tag * 0x9e3779b97f4a7c15ULL;
  x ^= x >> 29;
  const uint32_t fp = static_cast<uint32_t>(x >> 32);
  return fp == 0 ? 1 : fp;
}

size_t GhostLists::find(uint32_t fp) const {
  if (table_.empty()) return 0;
  const size_t mask = table_.size() - 1;
  for (size_t i = fp & mask;; i = (i + 1) & mask) {
    if (table_[i].fp == fp) return i;
    if (table_[i].fp == 0) return table_.size();
  }
}

void GhostLists::erase(size_t slot) {
  // Linear probing: shift later entries of the run back so that no lookup stops short.
  const size_t mask = table_.size() - 1;
  size_t hole = slot;
  for (size_t j = (hole + 1) & mask; table_[j].fp != 0; j = (j + 1) & mask) {
    const size_t home = table_[j].fp & mask;
    const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (stays) continue;
    table_[hole] = table_[j];
    hole = j;
  }
  table_[hole] = Slot{};
}

void GhostLists::grow() {
  std::vector<Slot> old = std::move(table_);
  table_.assign(std::max<size_t>(64, old.size() * 2), Slot{});
  const size_t mask = table_.size() - 1;
  for (const Slot& s : old) {
    if (s.fp == 0) continue;
    size_t i = s.fp & mask;
    while (table_[i].fp != 0) i = (i + 1) & mask;
    table_[i] = s;
  }
}

void GhostLists::compact(int list) {
  // Entries that a hit or a re-add left behind are stale: keep the live ones, in order.
  std::vector<Queued>& q = queue_[list];
  size_t kept = 0;
  for (size_t i = front_[list]; i < q.size(); ++i) {
    const size_t slot = find(q[i].fp);
    if (slot < table_.size() && table_[slot].seq == q[i].seq) q[kept++] = q[i];
  }
  q.resize(kept);
  front_[list] = 0;
}

void GhostLists::add(uint64_t tag, int list) {
  const uint32_t fp = fingerprint(tag);
  if (const size_t slot = find(fp); slot < table_.size()) {
    --count_[table_[slot].seq & 1];
    erase(slot);
  }
  if ((size() + 1) * 4 > table_.size() * 3) grow();  // at most 3/4 full: short probes
  const uint32_t seq = nextSeq_ | static_cast<uint32_t>(list);
  nextSeq_ += 2;
  const size_t mask = table_.size() - 1;
  size_t i = fp & mask;
  while (table_[i].fp != 0) i = (i + 1) & mask;
  table_[i] = Slot{fp, seq};
  queue_[list].push_back(Queued{fp, seq});
  ++count_[list];
  if (queue_[list].size() - front_[list] > 2 * count_[list] + 64) compact(list);
}

int GhostLists::take(uint64_t tag) {
  const size_t slot = find(fingerprint(tag));
  if (slot >= table_.size()) return -1;
  const int list = static_cast<int>(table_[slot].seq & 1);
  --count_[list];
  erase(slot);
  return list;
}

bool GhostLists::dropOldest(int list) {
  std::vector<Queued>& q = queue_[list];
  while (front_[list] < q.size()) {
    const Queued e = q[front_[list]++];
    const size_t slot = find(e.fp);
    if (slot < table_.size() && table_[slot].seq == e.seq) {
      erase(slot);
      --count_[list];
      if (front_[list] >= 64 && front_[list] * 2 >= q.size()) compact(list);
      return true;
    }
  }
  q.clear();
  front_[list] = 0;
  return false;
}

size_t GhostLists::memoryBytes() const {
  return table_.capacity() * sizeof(Slot) +
         (queue_[0].capacity() + queue_[1].capacity()) * sizeof(Queued);
}

// ---------------------------------------------------------------------------------------------
// ARC

ArcEvictionPolicy::Class& ArcEvictionPolicy::cls(uint32_t c) {
  if (c >= classes_.size()) classes_.resize(size_t{c} + 1);
  return classes_[c];
}

BlockLists::List& ArcEvictionPolicy::listOf(Class& c, uint8_t list) {
  return list == kFrequent ? c.frequent : list == kReplica ? c.replicas : c.recent;
}

namespace {
// Index into Class::resident: T1 history, T2 history, replicas.
int residentIndex(uint8_t list) { return list == 2 ? 1 : list == 3 ? 2 : 0; }
}  // namespace

bool ArcEvictionPolicy::fromRecent(const Class& c, uint64_t recent, bool recentEmpty,
                                   bool frequentEmpty) {
  if (recentEmpty) return false;
  if (frequentEmpty) return true;
  return static_cast<double>(recent) > c.target;
}

void ArcEvictionPolicy::insert(BlockId id, uint32_t sizeClass, bool first, uint64_t tag) {
  links_.reserve(id);
  if (id >= state_.size()) state_.resize(size_t{id} + 1);
  State& s = state_[id];
  if (s.linked) erase(id);
  Class& k = cls(sizeClass);
  if (s.list != kUnknown && s.sizeClass != sizeClass) {
    // Its content came from another class (moved between tiers): its history comes along.
    --classes_[s.sizeClass].resident[residentIndex(s.list)];
    ++k.resident[residentIndex(s.list)];
    s.sizeClass = sizeClass;
  }
  uint8_t list = kRecent;
  if (first) {
    list = kReplica;
  } else if (s.list != kUnknown) {
    list = kFrequent;  // used again while in memory
  } else if (tag == 0) {
    if (s.continues) list = kFrequent;
  } else {
    // New in memory: content evicted lately says which list was too short.
    const double b1 = static_cast<double>(k.ghosts.size(0));
    const double b2 = static_cast<double>(k.ghosts.size(1));
    const int ghost = k.ghosts.take(tag);
    const double c = static_cast<double>(k.capacity);
    if (ghost == 0) {
      k.target = std::min(c, k.target + std::max(1.0, b2 / b1));
      list = kFrequent;
    } else if (ghost == 1) {
      k.target = std::max(0.0, k.target - std::max(1.0, b1 / b2));
      list = kFrequent;
    } else if (s.continues) {
      list = kFrequent;
    }
  }
  if (s.list == kUnknown) {
    ++k.resident[residentIndex(list)];
  } else if (residentIndex(s.list) != residentIndex(list)) {
    --k.resident[residentIndex(s.list)];
    ++k.resident[residentIndex(list)];
  }
  k.capacity = std::max(k.capacity, k.resident[0] + k.resident[1] + k.resident[2]);
  // Replicas: the last one in goes first, as LRU's `first` gives.
  links_.link(listOf(k, list), id, /*atHead=*/list == kReplica);
  s = State{list, true, false, sizeClass};
  ++size_;
}

void ArcEvictionPolicy::erase(BlockId id) {
  if (id >= state_.size() || !state_[id].linked) return;
  State& s = state_[id];
  links_.unlink(listOf(classes_[s.sizeClass], s.list), id);
  s.linked = false;
  --size_;
}

void ArcEvictionPolicy::forget(BlockId id) {
  erase(id);
  State& s = state_[id];
  if (s.list != kUnknown) --classes_[s.sizeClass].resident[residentIndex(s.list)];
  s = State{};
}

void ArcEvictionPolicy::trimGhosts(Class& k) {
  // ARC's bounds: |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c; and never more ghosts
  // than c, whatever memory holds now.
  const uint64_t c = k.capacity;
  const uint64_t resident = k.resident[0] + k.resident[1];
  while (k.resident[0] + k.ghosts.size(0) > c && k.ghosts.dropOldest(0)) {
  }
  while (k.ghosts.size() > 0 &&
         (resident + k.ghosts.size() > 2 * c || k.ghosts.size() > c)) {
    if (!k.ghosts.dropOldest(1) && !k.ghosts.dropOldest(0)) break;
  }
}

void ArcEvictionPolicy::evicted(BlockId id, uint64_t tag) {
  if (id >= state_.size() || state_[id].list == kUnknown) return;
  const State s = state_[id];
  Class& k = classes_[s.sizeClass];
  forget(id);
  // A replica's content lives on its holder: its eviction says nothing about this node's lists.
  if (tag != 0 && s.list != kReplica) k.ghosts.add(tag, s.list == kFrequent ? 1 : 0);
  trimGhosts(k);
}

void ArcEvictionPolicy::moved(BlockId from, BlockId to) {
  if (from >= state_.size() || state_[from].list == kUnknown) return;
  links_.reserve(to);
  if (to >= state_.size()) state_.resize(size_t{to} + 1);
  const State s = state_[from];
  erase(from);
  // `to`'s insert moves the resident count to its class.
  state_[from] = State{};
  state_[to] = State{s.list, false, false, s.sizeClass};
}

void ArcEvictionPolicy::sealed(std::span<const BlockId> fresh, BlockId parent, uint64_t position) {
  // The parent is known when it was in memory before this request (the policy has seen it
  // evictable); a block this request wrote itself and still holds is not, so a long prompt put in
  // chunks does not count its own first chunks as reused.
  const bool reusedParent =
      parent != kNoBlock && parent < state_.size() && state_[parent].list != kUnknown;
  if (!reusedParent || fresh.empty() || fresh.size() > kContinuationRatio * position) return;
  for (BlockId id : fresh) {
    links_.reserve(id);
    if (id >= state_.size()) state_.resize(size_t{id} + 1);
    if (state_[id].list == kUnknown) state_[id].continues = true;
  }
}

BlockId ArcEvictionPolicy::victim(uint32_t sizeClass) const {
  const Class* k = findClass(sizeClass);
  if (!k) return kNoBlock;
  if (k->replicas.head != kNoBlock) return k->replicas.head;
  const bool recentEmpty = k->recent.head == kNoBlock;
  const bool frequentEmpty = k->frequent.head == kNoBlock;
  if (recentEmpty && frequentEmpty) return kNoBlock;
  return fromRecent(*k, k->resident[0], recentEmpty, frequentEmpty) ? k->recent.head
                                                                      : k->frequent.head;
}

void ArcEvictionPolicy::oldest(uint32_t sizeClass, size_t max, std::vector<BlockId>& out,
                               std::span<const BlockId> skip) const {
  const Class* k = findClass(sizeClass);
  if (!k) return;
  for (BlockId id = k->replicas.head; id != kNoBlock && max > 0; id = links_.next(id)) {
    if (skipped(skip, id)) continue;
    out.push_back(id);
    --max;
  }
  // Successive evictions: each from T1 shrinks T1's resident count, which steers the next. A
  // skipped block is pinned, not evicted: still resident.
  uint64_t recent = k->resident[0];
  BlockId r = k->recent.head, f = k->frequent.head;
  while (max > 0) {
    while (r != kNoBlock && skipped(skip, r)) r = links_.next(r);
    while (f != kNoBlock && skipped(skip, f)) f = links_.next(f);
    if (r == kNoBlock && f == kNoBlock) break;
    if (fromRecent(*k, recent, r == kNoBlock, f == kNoBlock)) {
      out.push_back(r);
      r = links_.next(r);
      --recent;
    } else {
      out.push_back(f);
      f = links_.next(f);
    }
    --max;
  }
}

uint64_t ArcEvictionPolicy::ghostCount(uint32_t sizeClass) const {
  const Class* k = findClass(sizeClass);
  return k ? k->ghosts.size() : 0;
}

size_t ArcEvictionPolicy::ghostBytes() const {
  size_t bytes = 0;
  for (const Class& k : classes_) bytes += k.ghosts.memoryBytes();
  return bytes;
}

double ArcEvictionPolicy::recencyTarget(uint32_t sizeClass) const {
  const Class* k = findClass(sizeClass);
  return k ? k->target : 0;
}

uint64_t ArcEvictionPolicy::recentBlocks(uint32_t sizeClass) const {
  const Class* k = findClass(sizeClass);
  return k ? k->resident[0] + k->resident[2] : 0;
}

uint64_t ArcEvictionPolicy::frequentBlocks(uint32_t sizeClass) const {
  const Class* k = findClass(sizeClass);
  return k ? k->resident[1] : 0;
}

uint64_t ArcEvictionPolicy::capacity(uint32_t sizeClass) const {
  const Class* k = findClass(sizeClass);
  return k ? k->capacity : 0;
}

// ---------------------------------------------------------------------------------------------
// EvictionHistory

uint64_t EvictionHistory::mix(uint64_t tag) {
  // Tags may be small numbers (tests) or slices of a cryptographic key: a full 64-bit mix
  // (murmur3's finalizer).
  tag ^= tag >> 33;
  tag *= 0xff51afd7ed558ccdULL;
  tag ^= tag >> 33;
  tag *= 0xc4ceb9fe1a85ec53ULL;
  tag ^= tag >> 33;
  return tag;
}

uint64_t EvictionHistory::Generation::bit(uint64_t h, int probe) const {
  // Probe i: the hash mixed again i times, mapped onto the bits by a multiply (Lemire's
  // fastrange): any number of bits, no power of two needed.
  for (int i = 0; i < probe; ++i) h = mix(h + 0x9e3779b97f4a7c15ULL);
  return static_cast<uint64_t>((static_cast<unsigned __int128>(h) * bitCount) >> 64);
}

bool EvictionHistory::Generation::has(uint64_t h) const {
  if (bitCount == 0) return false;
  for (int i = 0; i < kProbes; ++i) {
    const uint64_t b = bit(h, i);
    if (((bits[b >> 6] >> (b & 63)) & 1) == 0) return false;
  }
  return true;
}

void EvictionHistory::add(uint64_t tag, uint64_t span) {
  if (gens_[newer_].bitCount == 0 || gens_[newer_].count >= gens_[newer_].span) {
    // The older generation goes; the new one is sized for the span asked now (c grows).
    newer_ ^= 1;
    Generation& g = gens_[newer_];
    g.span = std::max<uint64_t>(span, 64);
    decltype(g.bits)().swap(g.bits);  // the old words go back first
    g.bits.resize((g.span * kBitsPerEntry + 63) / 64);
    if (g.bits.size() * sizeof(uint64_t) < kHugePageBytes) {
      std::memset(g.bits.data(), 0, g.bits.size() * sizeof(uint64_t));
    }
    g.bitCount = g.bits.size() * 64;
    g.count = 0;
  }
  Generation& g = gens_[newer_];
  const uint64_t h = mix(tag);
  for (int i = 0; i < kProbes; ++i) {
    const uint64_t b = g.bit(h, i);
    g.bits[b >> 6] |= uint64_t{1} << (b & 63);
  }
  ++g.count;
}

bool EvictionHistory::contains(uint64_t tag) const {
  const uint64_t h = mix(tag);
  return gens_[0].has(h) || gens_[1].has(h);
}

size_t EvictionHistory::memoryBytes() const {
  return (gens_[0].bits.capacity() + gens_[1].bits.capacity()) * sizeof(uint64_t);
}

// ---------------------------------------------------------------------------------------------
// 2Q

TwoQEvictionPolicy::Class& TwoQEvictionPolicy::cls(uint32_t c) {
  if (c >= classes_.size()) classes_.resize(size_t{c} + 1);
  return classes_[c];
}

TwoQEvictionPolicy::State& TwoQEvictionPolicy::stateOf(BlockId id) {
  links_.reserve(id);
  if (id >= state_.size()) state_.resize(size_t{id} + 1);
  return state_[id];
}

void TwoQEvictionPolicy::settleProvisional(Class& k, bool keep) {
  // The run is contiguous at the protected tail: its blocks were inserted one after the other,
  // deepest first. Amortized O(1): each block is settled once.
  runScratch_.clear();
  for (BlockId b = k.lists[kProtected].tail; b != kNoBlock && state_[b].provisional;
       b = links_.prev(b)) {
    state_[b].provisional = false;
    runScratch_.push_back(b);
  }
  if (keep) return;
  for (BlockId b : runScratch_) links_.unlink(k.lists[kProtected], b);
  // Deepest first, as they were released.
  for (size_t i = runScratch_.size(); i-- > 0;) {
    links_.link(k.lists[kProbation], runScratch_[i]);
    state_[runScratch_[i]].list = kProbation;
  }
}

void TwoQEvictionPolicy::insert(BlockId id, uint32_t sizeClass, bool first, uint64_t tag) {
  State& s = stateOf(id);
  if (s.linked) erase(id);
  Class& k = cls(sizeClass);
  uint8_t list = kProbation;
  bool provisional = false;
  if (first) {
    list = kReplica;
  } else if (s.list != kUnknown || s.continues) {
    list = kProtected;  // used again while in memory, or the next turn of a reused prefix
  } else if (tag != 0 && k.history.contains(tag)) {
    list = kProtected;  // evicted lately and wanted again
    provisional = s.freshParent;
  } else if (s.deadEnd) {
    list = kDeadEnd;
  }
  // Blocks protected provisionally just before this one are its descendants (released tail
  // first): they keep their protection only with it.
  const BlockId tail = k.lists[kProtected].tail;
  if (!provisional && tail != kNoBlock && state_[tail].provisional) {
    settleProvisional(k, list == kProtected);
  }
  if (s.list == kUnknown) {
    ++k.resident;
    k.capacity = std::max(k.capacity, k.resident);
  } else if (s.sizeClass != sizeClass) {
    // Its content came from another class (moved between tiers): its count comes along.
    --classes_[s.sizeClass].resident;
    ++k.resident;
    k.capacity = std::max(k.capacity, k.resident);
  }
  // Replicas: the last one in goes first, as LRU's `first` gives.
  links_.link(k.lists[list], id, /*atHead=*/list == kReplica);
  s = State{};
  s.list = list;
  s.linked = true;
  s.provisional = provisional;
  s.sizeClass = sizeClass;
  ++size_;
}

void TwoQEvictionPolicy::erase(BlockId id) {
  if (id >= state_.size() || !state_[id].linked) return;
  State& s = state_[id];
  links_.unlink(classes_[s.sizeClass].lists[s.list], id);
  s.linked = false;
  s.provisional = false;  // held now: when it comes back it is reused
  --size_;
}

void TwoQEvictionPolicy::evicted(BlockId id, uint64_t tag) {
  if (id >= state_.size() || state_[id].list == kUnknown) return;
  erase(id);
  const State s = state_[id];
  Class& k = classes_[s.sizeClass];
  --k.resident;
  // A replica's content lives on its holder: its eviction says nothing about this node's reuse.
  if (tag != 0 && s.list != kReplica) k.history.add(tag, kHistorySpan * k.capacity);
  state_[id] = State{};
}

void TwoQEvictionPolicy::moved(BlockId from, BlockId to) {
  if (from >= state_.size() || state_[from].list == kUnknown) return;
  const State s = state_[from];
  erase(from);
  // `to` takes the content's list (its insert finds it known) and its resident count.
  State& t = stateOf(to);
  t = State{};
  t.list = s.list;
  t.sizeClass = s.sizeClass;
  state_[from] = State{};
}

void TwoQEvictionPolicy::sealed(std::span<const BlockId> fresh, BlockId parent, uint64_t position) {
  if (fresh.empty()) return;
  // A parent the policy has not seen is this request's own block, still held: extended now, it
  // ends nothing.
  if (parent != kNoBlock && parent < state_.size() && state_[parent].list == kUnknown) {
    state_[parent].deadEnd = false;
  }
  const bool reusedParent =
      parent != kNoBlock && parent < state_.size() && state_[parent].list != kUnknown;
  if (reusedParent && fresh.size() <= kContinuationRatio * position) {
    for (BlockId id : fresh) {
      State& s = stateOf(id);
      if (s.list == kUnknown) s.continues = true;
    }
    return;
  }
  // Each new block's parent is released right after it (tail first): new too, or this
  // request's own block of an earlier commit (a parent it reused is known, and protected).
  for (size_t i = parent != kNoBlock && !reusedParent ? 0 : 1; i < fresh.size(); ++i) {
    State& s = stateOf(fresh[i]);
    if (s.list == kUnknown) s.freshParent = true;
  }
  State& end = stateOf(fresh.back());
  if (end.list == kUnknown) end.deadEnd = true;
}

BlockId TwoQEvictionPolicy::victim(uint32_t sizeClass) const {
  const Class* k = findClass(sizeClass);
  if (!k) return kNoBlock;
  for (const BlockLists::List& l : k->lists) {
    if (l.head != kNoBlock) return l.head;
  }
  return kNoBlock;
}

void TwoQEvictionPolicy::oldest(uint32_t sizeClass, size_t max, std::vector<BlockId>& out,
                                std::span<const BlockId> skip) const {
  const Class* k = findClass(sizeClass);
  if (!k) return;
  for (const BlockLists::List& l : k->lists) {
    for (BlockId id = l.head; id != kNoBlock && max > 0; id = links_.next(id)) {
      if (skipped(skip, id)) continue;
      out.push_back(id);
      --max;
    }
  }
}

uint64_t TwoQEvictionPolicy::probationBlocks(uint32_t sizeClass) const {
  const Class* k = findClass(sizeClass);
  return k ? k->lists[kDeadEnd].size + k->lists[kProbation].size : 0;
}

uint64_t TwoQEvictionPolicy::protectedBlocks(uint32_t sizeClass) const {
  const Class* k = findClass(sizeClass);
  return k ? k->lists[kProtected].size : 0;
}

size_t TwoQEvictionPolicy::historyBytes() const {
  size_t bytes = 0;
  for (const Class& k : classes_) bytes += k.history.memoryBytes();
  return bytes;
}

uint64_t TwoQEvictionPolicy::capacity(uint32_t sizeClass) const {
  const Class* k = findClass(sizeClass);
  return k ? k->capacity : 0;
}

}  // namespace kvtier
