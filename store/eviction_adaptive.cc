#include "store/eviction_adaptive.h"

#include <algorithm>
#include <cmath>

namespace kvtier {
namespace {

// Tags may be small numbers (tests) or slices of a key: mixed before sampling.
uint64_t mixTag(uint64_t tag) {
  uint64_t x = tag ^ 0x5bd1e9955bd1e995ULL;
  x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdULL;
  x = (x ^ (x >> 33)) * 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

}  // namespace

AdaptiveEvictionPolicy::AdaptiveEvictionPolicy(Options options)
    : options_(options), leader_(makeEvictionPolicy(EvictionKind::kTwoQ)) {}

AdaptiveEvictionPolicy::Class& AdaptiveEvictionPolicy::cls(uint32_t c) {
  if (c >= classes_.size()) classes_.resize(size_t{c} + 1);
  return classes_[c];
}

AdaptiveEvictionPolicy::Block& AdaptiveEvictionPolicy::block(BlockId id) {
  if (id >= blocks_.size()) blocks_.resize(size_t{id} + 1, unplaced());
  return blocks_[id];
}

std::array<double, AdaptiveEvictionPolicy::kExperts.size()> AdaptiveEvictionPolicy::scores() const {
  std::array<double, kExperts.size()> sum{};
  for (const Class& k : classes_) {
    for (size_t e = 0; e < kExperts.size(); ++e) sum[e] += k.score[e];
  }
  return sum;
}

// ---------------------------------------------------------------------------------------------
// The leader's calls, with the blocks in memory kept track of

void AdaptiveEvictionPolicy::insert(BlockId id, uint32_t sizeClass, bool first, uint64_t tag) {
  Block& b = block(id);
  Class& k = cls(sizeClass);
  if (!b.known) {
    ++k.resident;
    k.capacity = std::max(k.capacity, k.resident);
  } else if (b.sizeClass != sizeClass) {
    --classes_[b.sizeClass].resident;
    ++k.resident;
    k.capacity = std::max(k.capacity, k.resident);
  }
  b.known = true;
  b.held = false;
  b.replica = first;
  b.sizeClass = sizeClass;
  if (tag != 0) b.tag = tag;
  if (b.epoch != epoch_) {
    // In the order of a policy that led before (or new): a use moves it into the leader's.
    if (EvictionPolicy* d = donor(b.epoch)) {
      d->erase(id);
      dropDrained();
    }
    b.epoch = epoch_;
  }
  leader_->insert(id, sizeClass, first, tag);
  // Every insert is a use of the block's content (new or reused): an access for the shadows.
  const Hint hint = b.continues ? Hint::kContinues : b.deadEnd ? Hint::kDeadEnd : Hint::kNone;
  b.continues = b.deadEnd = false;
  if (!first && b.tag != 0 && k.rateShift != 0) sample(k, b.tag, hint);
}

void AdaptiveEvictionPolicy::sealed(std::span<const BlockId> fresh, BlockId parent,
                                    uint64_t position) {
  // New blocks join the leader's order: it alone takes the hint.
  leader_->sealed(fresh, parent, position);
  // The shadows get the same hints for the blocks they sample: new blocks that continue a prefix
  // the request reused from memory (ARC's and 2Q's rule), else the end of the commit (2Q's dead
  // end, until a later commit of the same request extends it).
  if (fresh.empty()) return;
  const bool reused = parent != kNoBlock && parent < blocks_.size() && blocks_[parent].known;
  if (parent != kNoBlock && !reused) block(parent).deadEnd = false;
  if (reused && fresh.size() <= ArcEvictionPolicy::kContinuationRatio * position) {
    for (BlockId id : fresh) {
      Block& b = block(id);
      if (!b.known) b.continues = true;
    }
    return;
  }
  Block& end = block(fresh.back());
  if (!end.known) end.deadEnd = true;
}

EvictionPolicy* AdaptiveEvictionPolicy::orderOf(BlockId id) const {
  if (id >= blocks_.size() || blocks_[id].epoch == epoch_) return leader_.get();
  return donor(blocks_[id].epoch);
}

void AdaptiveEvictionPolicy::erase(BlockId id) {
  if (id < blocks_.size() && blocks_[id].known) blocks_[id].held = true;
  if (EvictionPolicy* p = orderOf(id)) {
    p->erase(id);
    if (p != leader_.get()) dropDrained();
  }
}

void AdaptiveEvictionPolicy::evicted(BlockId id, uint64_t tag) {
  if (EvictionPolicy* p = orderOf(id)) {
    p->evicted(id, tag);
    if (p != leader_.get()) dropDrained();
  }
  if (id >= blocks_.size() || !blocks_[id].known) return;
  Class& k = classes_[blocks_[id].sizeClass];
  --k.resident;
  blocks_[id] = unplaced();
  // The class is full (it evicts): the shadows start, sized for its capacity.
  if (k.rateShift == 0) startShadows(k);
}

void AdaptiveEvictionPolicy::moved(BlockId from, BlockId to) {
  if (EvictionPolicy* p = orderOf(from)) p->moved(from, to);
  if (from >= blocks_.size()) return;
  const Block b = blocks_[from];
  Block& t = block(to);
  if (b.known) {
    --classes_[b.sizeClass].resident;
    blocks_[from] = unplaced();
    // `to`'s insert counts it where it lands; its content's tag comes along.
    t = Block{};
    t.tag = b.tag;
  }
  t.epoch = b.epoch;  // `to` takes `from`'s history in the policy that holds it
}

// ---------------------------------------------------------------------------------------------
// The order: the leader's, after what the policies that led before still hold

EvictionPolicy* AdaptiveEvictionPolicy::donor(uint16_t epoch) const {
  for (const Donor& d : donors_) {
    if (d.epoch == epoch) return d.policy.get();
  }
  return nullptr;
}

void AdaptiveEvictionPolicy::dropDrained() {
  std::erase_if(donors_, [](const Donor& d) { return d.policy->size() == 0; });
}

BlockId AdaptiveEvictionPolicy::victim(uint32_t sizeClass) const {
  const BlockId v = leader_->victim(sizeClass);
  if (donors_.empty()) return v;
  // Replicas go first (the leader orders its own first), then the blocks not used since the
  // switch, oldest donor first, in their order.
  if (v != kNoBlock && blocks_[v].replica) return v;
  for (const Donor& d : donors_) {
    if (const BlockId dv = d.policy->victim(sizeClass); dv != kNoBlock) return dv;
  }
  return v;
}

void AdaptiveEvictionPolicy::oldest(uint32_t sizeClass, size_t max, std::vector<BlockId>& out,
                                    std::span<const BlockId> skip) const {
  if (donors_.empty()) return leader_->oldest(sizeClass, max, out, skip);
  // victim()'s order: the leader's replicas, each donor's blocks, the leader's others.
  std::vector<BlockId> led;
  leader_->oldest(sizeClass, max, led, skip);
  size_t replicas = 0;
  while (replicas < led.size() && blocks_[led[replicas]].replica) ++replicas;
  const size_t start = out.size();
  out.insert(out.end(), led.begin(), led.begin() + static_cast<std::ptrdiff_t>(replicas));
  for (const Donor& d : donors_) {
    if (out.size() - start >= max) break;
    d.policy->oldest(sizeClass, max - (out.size() - start), out, skip);
  }
  for (size_t i = replicas; i < led.size() && out.size() - start < max; ++i) {
    out.push_back(led[i]);
  }
}

size_t AdaptiveEvictionPolicy::size() const {
  size_t n = leader_->size();
  for (const Donor& d : donors_) n += d.policy->size();
  return n;
}

// ---------------------------------------------------------------------------------------------
// Shadows

bool AdaptiveEvictionPolicy::Shadow::access(uint64_t tag, uint64_t capacity, Hint hint) {
  if (auto it = ids_.find(tag); it != ids_.end()) {
    policy_->erase(it->second);
    policy_->insert(it->second, 0, false, tag);
    return true;
  }
  while (ids_.size() >= capacity) {
    const BlockId v = policy_->victim(0);
    if (v == kNoBlock) break;
    policy_->evicted(v, tags_[v]);
    ids_.erase(tags_[v]);
    free_.push_back(v);
  }
  BlockId id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<BlockId>(tags_.size());
    tags_.push_back(0);
  }
  tags_[id] = tag;
  ids_.emplace(tag, id);
  // The hints, as the engine gives them: one new block after a block the shadow holds (it
  // continues), or one new block after none (it ends its commit).
  const BlockId fresh[] = {id};
  if (hint == Hint::kContinues && last_ != kNoBlock && ids_.contains(tags_[last_]) &&
      tags_[last_] != tag) {
    policy_->sealed(fresh, last_, 1);
  } else if (hint == Hint::kDeadEnd) {
    policy_->sealed(fresh, kNoBlock, 0);
  }
  policy_->insert(id, 0, false, tag);
  last_ = id;
  return false;
}

void AdaptiveEvictionPolicy::startShadows(Class& k) {
  // The rate: the lowest of 1/2^minRateShift .. 1/2^maxRateShift that leaves a shadow at least
  // shadowBlocks blocks.
  uint32_t shift = options_.minRateShift;
  while (shift < options_.maxRateShift && (k.capacity >> (shift + 1)) >= options_.shadowBlocks) {
    ++shift;
  }
  k.rateShift = shift + 1;  // stored + 1: 0 means no shadows yet
  setShadowCapacity(k, std::max<uint64_t>(1, k.capacity >> shift));
  k.shadows.clear();
  for (EvictionKind e : kExperts) k.shadows.emplace_back(e);
  switchAfter_ = std::max(switchAfter_, k.shadowCapacity);
}

void AdaptiveEvictionPolicy::setShadowCapacity(Class& k, uint64_t blocks) const {
  k.shadowCapacity = blocks;
  // The counts halve every halfLife shadow capacities of accesses, a step at a time.
  k.decay = std::exp2(-1.0 / (options_.halfLife * double(blocks)));
}

void AdaptiveEvictionPolicy::sample(Class& k, uint64_t tag, Hint hint) {
  const uint64_t h = mixTag(tag);
  if ((h & ((uint64_t{1} << (k.rateShift - 1)) - 1)) != 0) return;
  // The class grew since (a pool extended): the shadows follow.
  if (const uint64_t grown = k.capacity >> (k.rateShift - 1); grown > k.shadowCapacity) {
    setShadowCapacity(k, grown);
  }
  std::array<bool, kExperts.size()> hit{};
  for (size_t e = 0; e < kExperts.size(); ++e) {
    hit[e] = k.shadows[e].access(tag, k.shadowCapacity, hint);
    if (hit[e]) k.score[e] += 1;
  }
  for (size_t i = 0; i < kExperts.size(); ++i) {
    for (size_t j = 0; j < kExperts.size(); ++j) {
      if (hit[i] && !hit[j]) k.wins[i][j] += 1;
    }
  }
  for (double& s : k.score) s *= k.decay;
  for (auto& row : k.wins) {
    for (double& w : row) w *= k.decay;
  }
  ++sinceSwitch_;
  maybeSwitch();
}

void AdaptiveEvictionPolicy::maybeSwitch() {
  if (sinceSwitch_ < switchAfter_) return;
  // The shadows saw the same accesses: what tells two apart is the accesses one hit and the other
  // missed. A shadow leads when it won clearly more of those against the leader's than it lost
  // (McNemar's test: the difference over the square root of their sum).
  size_t leader = 0;
  for (size_t e = 0; e < kExperts.size(); ++e) {
    if (kExperts[e] == leaderKind_) leader = e;
  }
  size_t best = leader;
  double bestZ = options_.switchZ;
  for (size_t e = 0; e < kExperts.size(); ++e) {
    if (e == leader) continue;
    double won = 0, lost = 0;
    for (const Class& k : classes_) {
      won += k.wins[e][leader];
      lost += k.wins[leader][e];
    }
    const double z = (won - lost) / std::sqrt(won + lost + 1);
    if (z > bestZ) {
      bestZ = z;
      best = e;
    }
  }
  if (best == leader) return;
  rebuild(kExperts[best]);
}

void AdaptiveEvictionPolicy::rebuild(EvictionKind kind) {
  auto next = makeEvictionPolicy(kind);
  if (size() > options_.rebuildBlocks) {
    // Too many blocks to order again at once (the engine's loop would stall): the new leader
    // starts empty, and the old order drains into it as its blocks are used, or goes first.
    donors_.push_back(Donor{epoch_, std::move(leader_)});
    ++epoch_;
  } else {
    // The evictable blocks in the order so far, first to go first (each class), then the held
    // ones, known to the new leader and held again.
    std::vector<BlockId> order;
    for (uint32_t c = 0; c < classes_.size(); ++c) {
      order.clear();
      oldest(c, size(), order);
      for (BlockId id : order) {
        const Block& b = blocks_[id];
        next->insert(id, c, b.replica, b.tag);
      }
    }
    ++epoch_;
    for (BlockId id = 0; id < blocks_.size(); ++id) {
      Block& b = blocks_[id];
      b.epoch = epoch_;
      if (!b.known || !b.held) continue;
      next->insert(id, b.sizeClass, b.replica, b.tag);
      next->erase(id);
    }
    donors_.clear();
  }
  leader_ = std::move(next);
  leaderKind_ = kind;
  ++switches_;
  sinceSwitch_ = 0;
  dropDrained();
}

}  // namespace kvtier
