// Engine: the cache shapes beyond plain sequences — snapshots, rewinds, recurrent state
// checkpoints, position-independent entries and middle removal with K re-rotation.
#include <algorithm>
#include <cassert>
#include <cstring>

#include "store/engine.h"
#include "store/engine_util.h"

namespace kvtier {
namespace {

using engine_util::blobClassBytes;
using engine_util::ceilDiv;
using engine_util::checkName;
using engine_util::invalid;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Snapshots

SnapshotInfo Engine::infoOf(SnapshotId id, const Snapshot& snap) const {
  SnapshotInfo info{id, snap.from, snap.to, !snap.checkpoints.empty(), {}};
  for (const auto& [pos, block] : snap.checkpoints) info.checkpoints.push_back(pos);
  return info;
}

Result<SnapshotInfo> Engine::addSnapshot(Snapshot snap) {
  assert(nextSnapshot_ < snapshotIdLimit_);  // checkSnapshotIds came first
  const SnapshotId id = nextSnapshot_++;
  // Write-behind: with a cold tier, the daemon writes its manifest (engine_snapshot_disk.cc).
  snap.disk = cold_ ? Snapshot::Disk::kWaiting : Snapshot::Disk::kNone;
  if (cold_) unwrittenSnapshots_.push_back(id);
  auto& stored = snapshots_.emplace(id, std::move(snap)).first->second;
  return infoOf(id, stored);
}

Result<SnapshotInfo> Engine::snapshot(SpaceId space, std::string_view name, uint64_t from) {
  if (auto s = checkSpace(space); !s) return s.error();
  if (auto s = checkSnapshotIds(1); !s) return s.error();
  Sequence* seq = findSeq(space, name);
  if (!seq) return makeError(ErrorCode::kNotFound, "no sequence '", name, "'");
  const uint64_t length = seq->tokens.size();
  Snapshot snap;
  snap.space = space;
  snap.options = seq->options;
  snap.clientKeyed = seq->clientKeyed;
  snap.unindexed = seq->unindexed;
  if (from >= length) {  // empty: [from, from)
    snap.from = snap.to = from;
    return addSnapshot(std::move(snap));
  }
  if (from < seq->firstRetained) {
    return invalid("positions before ", seq->firstRetained, " were released by the window");
  }
  const uint32_t bt = blockTokens(space);
  snap.from = from;
  snap.to = length;
  snap.blocks.assign(seq->blocks.begin() + from / bt, seq->blocks.end());
  // A partial last block that an open put appends to in place goes on changing: the snapshot
  // takes a copy of its slots instead (its bytes, and the checksum the cold tier takes of them,
  // must stay as they are).
  if (auto writer = spaces_[space].writers.find(std::string(name));
      writer != spaces_[space].writers.end()) {
    const WriteLease& lease = writeLeases_.at(writer->second);
    const BlockId last = snap.blocks.back();
    if (lease.firstInPlace && lease.blocks[0] == last) {
      const BlockId copy = allocate(space);
      if (copy == kNoBlock) {
        return makeError(ErrorCode::kFull, "pool has no block for the snapshot's last block");
      }
      const uint64_t lastStart = (from / bt + snap.blocks.size() - 1) * bt;
      copySlots(space, last, copy, static_cast<uint32_t>(length - lastStart));
      pool_[copy].state = BlockState::kPartial;
      snap.blocks.back() = copy;
    }
  }
  for (BlockId b : snap.blocks) ref(b);
  snap.tokens = seq->tokens;
  snap.keys = seq->keys;
  for (auto it = seq->checkpoints.lower_bound(from); it != seq->checkpoints.end(); ++it) {
    ref(it->second);
    snap.checkpoints.emplace(it->first, it->second);
  }
  return addSnapshot(std::move(snap));
}

Result<SnapshotInfo> Engine::snapshotInfo(SpaceId space, SnapshotId id) {
  auto it = snapshots_.find(id);
  if (it == snapshots_.end() || it->second.space != space) {
    return makeError(ErrorCode::kNotFound, "no snapshot ", id);
  }
  return infoOf(id, it->second);
}

Status Engine::dropSnapshot(SpaceId space, SnapshotId id) {
  auto it = snapshots_.find(id);
  if (it == snapshots_.end() || it->second.space != space) {
    return makeError(ErrorCode::kNotFound, "no snapshot ", id);
  }
  unrefTailFirst(it->second.blocks);
  for (const auto& [pos, b] : it->second.checkpoints) unref(b);
  snapshots_.erase(it);
  return {};
}

Status Engine::restore(OwnerId owner, SpaceId space, std::string_view name,
                       std::optional<SnapshotId> snapId, uint64_t target,
                       const SeqOptions& options) {
  if (auto s = checkSpace(space); !s) return s;
  if (auto s = checkName(name, "sequence"); !s) return s;
  Sequence* seq = findSeq(space, name);
  const uint64_t length = seq ? seq->tokens.size() : 0;
  const uint32_t bt = blockTokens(space);

  if (!snapId) {  // rewind
    if (target > length) return invalid("cannot rewind to ", target, " past the length ", length);
    if (!seq || target == length) return {};
    if (neededFrom(seq->options, target) < seq->firstRetained) {
      return invalid("the window at ", target, " starts before ", seq->firstRetained,
                     ", which was released");
    }
    if (!seq->checkpoints.empty() && target != 0 && !seq->checkpoints.count(target)) {
      return invalid("recurrent sequence has no state checkpoint at ", target);
    }
    return truncate(space, name, target);
  }

  auto sit = snapshots_.find(*snapId);
  if (sit == snapshots_.end() || sit->second.space != space) {
    return makeError(ErrorCode::kNotFound, "no snapshot ", *snapId);
  }
  const Snapshot& snap = sit->second;
  if (target < snap.from || target > snap.to) {
    return invalid("target ", target, " is outside the snapshot's [", snap.from, ", ", snap.to,
                   "]");
  }
  if (length < snap.from) {
    return invalid("sequence holds ", length, " tokens, the snapshot needs its first ", snap.from);
  }
  if (!snap.checkpoints.empty() && target != 0 && !snap.checkpoints.count(target)) {
    return invalid("snapshot holds recurrent state but none at ", target);
  }
  if (target == snap.from) {
    // Nothing is taken from the snapshot: the sequence keeps its own [0, from).
    if (!seq) return {};
    return restore(owner, space, name, std::nullopt, target, options);
  }
  const SeqOptions newOptions =
      seq ? seq->options : SeqOptions{options.detached, snap.options.window, snap.options.chunk};
  const uint64_t retained = seq && snap.from > 0 ? seq->firstRetained : 0;
  if (neededFrom(newOptions, target) < retained) {
    return invalid("the window at ", target, " needs positions the sequence released");
  }
  // Is the sequence's prefix the one the snapshot was taken after? Then its KV continues it
  // exactly, and full blocks may be keyed and indexed; otherwise the result is never indexed.
  const size_t prefixFull = snap.from / bt;
  const bool consistent =
      seq ? (!seq->unindexed && !snap.unindexed && seq->clientKeyed == snap.clientKeyed &&
             snap.tokens.size() >= snap.from &&
             std::equal(seq->tokens.begin(), seq->tokens.begin() + snap.from,
                        snap.tokens.begin()) &&
             seq->keys.size() >= prefixFull && snap.keys.size() >= prefixFull &&
             std::equal(seq->keys.begin(), seq->keys.begin() + prefixFull, snap.keys.begin()))
          : snap.from == 0 && !snap.unindexed;

  std::vector<BlockId> blocks;
  if (seq) blocks.assign(seq->blocks.begin(), seq->blocks.begin() + prefixFull);
  const uint32_t slot0 = static_cast<uint32_t>(snap.from % bt);
  const size_t snapCount = target > snap.from ? ceilDiv(target - prefixFull * bt, bt) : 0;
  BlockId mixed = kNoBlock;
  if (slot0 != 0) {
    const BlockId own = seq->blocks[prefixFull];
    if (snapCount == 0 || snap.blocks[0] == own) {
      blocks.push_back(own);
    } else if (own == kNoBlock) {
      blocks.push_back(snap.blocks[0]);  // the window released the slots before snap.from anyway
    } else {
      // The block holding snap.from: the sequence's slots before it, the snapshot's from it on.
      mixed = allocate(space);
      if (mixed == kNoBlock)
        return makeError(ErrorCode::kFull, "pool has no block for the restore");
      copySlotRange(space, own, mixed, 0, slot0);
      const uint32_t end = static_cast<uint32_t>(std::min<uint64_t>(bt, target - prefixFull * bt));
      copySlotRange(space, snap.blocks[0], mixed, slot0, end);
      pool_[mixed].state = BlockState::kPartial;
      blocks.push_back(mixed);
    }
  }
  for (size_t i = (slot0 != 0 ? 1 : 0); i < snapCount; ++i) blocks.push_back(snap.blocks[i]);

  std::vector<uint32_t> tokens(seq ? seq->tokens.begin() : snap.tokens.begin(),
                               seq ? seq->tokens.begin() + snap.from : snap.tokens.begin());
  tokens.insert(tokens.end(), snap.tokens.begin() + snap.from, snap.tokens.begin() + target);
  std::map<uint64_t, BlockId> checkpoints;
  if (seq) {
    for (auto it = seq->checkpoints.begin(); it != seq->checkpoints.end() && it->first <= snap.from;
         ++it) {
      checkpoints.emplace(*it);
    }
  }
  for (auto it = snap.checkpoints.begin(); it != snap.checkpoints.end() && it->first <= target;
       ++it) {
    checkpoints[it->first] = it->second;
  }
  std::vector<Key128> keys = seq ? seq->keys : std::vector<Key128>{};
  keys.resize(std::min(keys.size(), prefixFull));

  Sequence& out = seq ? *seq : createSeq(space, name, owner, newOptions);
  replaceBlocks(out, std::move(blocks));  // the mixed block's one reference is the sequence's
  for (const auto& [pos, b] : checkpoints) ref(b);
  for (const auto& [pos, b] : out.checkpoints) unref(b);
  out.checkpoints = std::move(checkpoints);
  out.tokens = std::move(tokens);
  out.options = newOptions;
  out.firstRetained = retained;
  out.clientKeyed = snap.clientKeyed;
  out.unindexed = !consistent;
  out.keys = std::move(keys);
  if (consistent) {
    // The snapshot's own keys cover its full blocks; a mixed block is keyed from the tokens.
    for (size_t i = prefixFull; i < target / bt && i < snap.keys.size(); ++i) {
      out.keys.push_back(snap.keys[i]);
    }
    if (out.clientKeyed) {
      // No client key exists for a block the restore completes: nothing after it is indexed.
      if (out.keys.size() < target / bt) out.unindexed = true;
    } else {
      (void)sealFrom(space, out, out.keys.size(), {});
    }
  }
  applyRetention(out, bt);
  out.version = nextVersion_++;
  return {};
}

Result<SnapshotInfo> Engine::mergeSnapshots(SpaceId space, SnapshotId aId, SnapshotId bId) {
  auto ai = snapshots_.find(aId), bi = snapshots_.find(bId);
  if (ai == snapshots_.end() || ai->second.space != space) {
    return makeError(ErrorCode::kNotFound, "no snapshot ", aId);
  }
  if (bi == snapshots_.end() || bi->second.space != space) {
    return makeError(ErrorCode::kNotFound, "no snapshot ", bId);
  }
  const Snapshot& a = ai->second;
  const Snapshot& b = bi->second;
  if (auto s = checkSnapshotIds(1); !s) return s.error();
  if (a.to != b.from) {
    return invalid("snapshots [", a.from, ", ", a.to, ") and [", b.from, ", ", b.to,
                   ") are not adjacent");
  }
  const uint32_t bt = blockTokens(space);
  Snapshot m;
  if (a.from == a.to || b.from == b.to) {
    m = a.from == a.to ? b : a;  // merging with an empty snapshot
    m.from = a.from;
  } else {
    m.space = space;
    m.from = a.from;
    m.to = b.to;
    m.options = a.options;
    m.clientKeyed = a.clientKeyed;
    // b continues a exactly when it was taken after the same tokens (and keys).
    const size_t full = a.to / bt;
    m.unindexed = a.unindexed || b.unindexed || a.clientKeyed != b.clientKeyed ||
                  !std::equal(b.tokens.begin(), b.tokens.begin() + b.from, a.tokens.begin()) ||
                  a.keys.size() < full || b.keys.size() < full ||
                  !std::equal(a.keys.begin(), a.keys.begin() + full, b.keys.begin());
    m.blocks = a.blocks;
    size_t skip = 0;
    if (a.to % bt != 0) {
      // a's last block and b's first cover the same block: join them unless they are one.
      skip = 1;
      if (a.blocks.back() != b.blocks[0]) {
        const BlockId mixed = allocate(space);
        if (mixed == kNoBlock)
          return makeError(ErrorCode::kFull, "pool has no block for the merge");
        const uint32_t slot = static_cast<uint32_t>(a.to % bt);
        const uint32_t end = static_cast<uint32_t>(std::min<uint64_t>(bt, b.to - full * bt));
        copySlotRange(space, a.blocks.back(), mixed, 0, slot);
        copySlotRange(space, b.blocks[0], mixed, slot, end);
        pool_[mixed].state = BlockState::kPartial;
        m.blocks.back() = mixed;
      }
    }
    m.blocks.insert(m.blocks.end(), b.blocks.begin() + skip, b.blocks.end());
    m.tokens.assign(a.tokens.begin(), a.tokens.begin() + a.to);
    m.tokens.insert(m.tokens.end(), b.tokens.begin() + b.from, b.tokens.begin() + b.to);
    m.keys = m.unindexed ? std::vector<Key128>(a.keys.begin(),
                                               a.keys.begin() + std::min(a.keys.size(), full))
                         : b.keys;
    m.checkpoints = a.checkpoints;
    m.checkpoints.insert(b.checkpoints.begin(), b.checkpoints.end());
  }
  for (BlockId x : m.blocks) ref(x);
  for (const auto& [pos, x] : m.checkpoints) ref(x);
  return addSnapshot(std::move(m));
}

Result<std::pair<SnapshotInfo, SnapshotInfo>> Engine::splitSnapshot(SpaceId space, SnapshotId id,
                                                                    uint64_t at) {
  auto it = snapshots_.find(id);
  if (it == snapshots_.end() || it->second.space != space) {
    return makeError(ErrorCode::kNotFound, "no snapshot ", id);
  }
  const Snapshot& s = it->second;
  if (auto ids = checkSnapshotIds(2); !ids) return ids.error();
  if (!s.checkpoints.empty()) {
    return makeError(ErrorCode::kNotSupported,
                     "a snapshot holding recurrent state cannot be split (no state at the cut)");
  }
  const uint32_t bt = blockTokens(space);
  const uint64_t cut = std::clamp(at, s.from, s.to);
  auto half = [&](uint64_t from, uint64_t to) {
    Snapshot h;
    h.space = space;
    h.from = from;
    h.to = to;
    h.options = s.options;
    h.clientKeyed = s.clientKeyed;
    h.unindexed = s.unindexed;
    if (from < to) {
      const size_t first = from / bt - s.from / bt, last = ceilDiv(to, bt) - s.from / bt;
      h.blocks.assign(s.blocks.begin() + first, s.blocks.begin() + last);
      for (BlockId b : h.blocks) ref(b);
    }
    h.tokens.assign(s.tokens.begin(), s.tokens.begin() + std::min<uint64_t>(to, s.tokens.size()));
    h.keys.assign(s.keys.begin(), s.keys.begin() + std::min(s.keys.size(), size_t(to / bt)));
    return h;
  };
  Snapshot left = half(s.from, cut), right = half(cut, s.to);
  auto l = addSnapshot(std::move(left));
  auto r = addSnapshot(std::move(right));
  return std::make_pair(l.value(), r.value());
}

// ---------------------------------------------------------------------------------------------
// Blobs: recurrent state checkpoints and position-independent entries

Result<BlobGrant> Engine::grantBlob(LeaseKind kind, SpaceId space, std::string seq, uint64_t pos,
                                    uint64_t bytes, const Key128& key) {
  const uint64_t largestExtent = pool_.largestExtentBytes();
  if (bytes == 0 || bytes > kMaxBlockBytes || blobClassBytes(bytes) > largestExtent) {
    return invalid("a blob of ", bytes, " bytes is outside 1..",
                   std::min(kMaxBlockBytes, largestExtent));
  }
  const BlockId b =
      allocateClass(pool_.sizeClass(blobClassBytes(bytes)), spaces_[space].info.tenant);
  if (b == kNoBlock)
    return makeError(ErrorCode::kFull, "pool has no block for a ", bytes, "-byte blob");
  clearForInlineWriters(space, b);
  pin(b);
  pool_[b].blobBytes = static_cast<uint32_t>(bytes);
  WriteLease lease;
  lease.kind = kind;
  lease.space = space;
  lease.seq = std::move(seq);
  lease.begin = pos;
  lease.blobBytes = bytes;
  lease.entryKey = key;
  lease.blocks.push_back(b);
  if (kind == LeaseKind::kCheckpoint) {
    Sequence* s = findSeq(space, lease.seq);
    lease.seqVersion = s ? s->version : 0;
  }
  BlobGrant grant{nextLease_++, pool_.location(b), bytes};
  if (kind == LeaseKind::kCheckpoint) spaces_[space].writers.emplace(lease.seq, grant.lease);
  writeLeases_.emplace(grant.lease, std::move(lease));
  return grant;
}

Result<BlobGrant> Engine::putCheckpoint(SpaceId space, std::string_view name, uint64_t pos,
                                        uint64_t bytes) {
  if (auto s = checkSpace(space); !s) return s.error();
  if (auto s = checkName(name, "sequence"); !s) return s.error();
  Sequence* seq = findSeq(space, name);
  if (!seq) return makeError(ErrorCode::kNotFound, "no sequence '", name, "'");
  if (pos > seq->tokens.size()) {
    return invalid("checkpoint position ", pos, " is past the length ", seq->tokens.size());
  }
  if (spaces_[space].writers.count(std::string(name))) {
    return makeError(ErrorCode::kConflict, "sequence '", name, "' already has an open write lease");
  }
  return grantBlob(LeaseKind::kCheckpoint, space, std::string(name), pos, bytes, {});
}

Result<BlobGrant> Engine::putEntry(SpaceId space, const Key128& key, uint64_t bytes) {
  if (auto s = checkSpace(space); !s) return s.error();
  return grantBlob(LeaseKind::kEntry, space, "", 0, bytes, key);
}

Result<CommitResult> Engine::commitBlob(LeaseId id, WriteLease& lease) {
  const BlockId b = lease.blocks[0];
  // A blob's checksum is taken at its commit, over its own bytes (it moves with a snapshot).
  ensureChecksum(b, lease.blobBytes);
  if (lease.kind == LeaseKind::kEntry) {
    auto [it, inserted] =
        entries_.try_emplace(IndexKey{lease.space, lease.entryKey}, Entry{b, lease.blobBytes});
    if (inserted) {
      BlockMeta& m = pool_[b];
      m.state = BlockState::kSealed;
      m.entry = true;
      m.space = lease.space;
      m.key = lease.entryKey;
    }
    // A twin that exists already: ours is freed when the lease lets go of it.
    finishWrite(id, lease);
    return CommitResult{0, 0};
  }
  Sequence* seq = findSeq(lease.space, lease.seq);
  if (!seq || seq->version != lease.seqVersion) {
    finishWrite(id, lease);
    return makeError(ErrorCode::kConflict,
                     "sequence changed while the checkpoint lease was open; nothing committed");
  }
  ref(b);
  pool_[b].state = BlockState::kPartial;
  auto [it, inserted] = seq->checkpoints.try_emplace(lease.begin, b);
  if (!inserted) {
    unref(it->second);
    it->second = b;
  }
  seq->version = nextVersion_++;
  const uint64_t length = seq->tokens.size();
  finishWrite(id, lease);
  return CommitResult{length, 0};
}

Result<BlobGrant> Engine::getCheckpoint(SpaceId space, std::string_view name, uint64_t pos) {
  if (auto s = checkSpace(space); !s) return s.error();
  Sequence* seq = findSeq(space, name);
  if (!seq) return makeError(ErrorCode::kNotFound, "no sequence '", name, "'");
  auto it = seq->checkpoints.find(pos);
  if (it == seq->checkpoints.end()) {
    return makeError(ErrorCode::kNotFound, "no checkpoint at ", pos, " in '", name, "'");
  }
  return BlobGrant{newReadLease({it->second}), pool_.location(it->second),
                   pool_[it->second].blobBytes};
}

Result<std::vector<uint64_t>> Engine::checkpointPositions(SpaceId space, std::string_view name) {
  if (auto s = checkSpace(space); !s) return s.error();
  Sequence* seq = findSeq(space, name);
  if (!seq) return makeError(ErrorCode::kNotFound, "no sequence '", name, "'");
  std::vector<uint64_t> out;
  for (const auto& [pos, b] : seq->checkpoints) out.push_back(pos);
  return out;
}

Result<BlobGrant> Engine::getEntry(SpaceId space, const Key128& key) {
  if (auto s = checkSpace(space); !s) return s.error();
  auto it = entries_.find(IndexKey{space, key});
  if (it == entries_.end()) return makeError(ErrorCode::kNotFound, "no entry ", key.hex());
  ++hits_;
  return BlobGrant{newReadLease({it->second.block}), pool_.location(it->second.block),
                   it->second.bytes};
}

// ---------------------------------------------------------------------------------------------
// Middle removal

Status Engine::middleRemove(SpaceId space, Sequence& seq, uint64_t begin, uint64_t end) {
  const Layout& layout = spaces_[space].info.layout;
  if (layout.rope.style == RopeStyle::kNone) {
    return makeError(ErrorCode::kNotSupported,
                     "removing a middle range needs a declared rotary position scheme for this "
                     "namespace");
  }
  if (!rotator_ || !rotator_->supports(layout)) {
    return makeError(ErrorCode::kNotSupported, "K of this layout's dtype cannot be re-rotated");
  }
  if (!seq.checkpoints.empty()) {
    return makeError(ErrorCode::kNotSupported,
                     "a recurrent sequence's state cannot be moved: no middle removal");
  }
  if (begin < seq.firstRetained) {
    return invalid("positions before ", seq.firstRetained, " were released by the window");
  }
  const uint32_t bt = layout.blockTokens;
  const uint64_t length = seq.tokens.size(), shift = end - begin, newLength = length - shift;
  const size_t first = begin / bt;
  const size_t count = ceilDiv(newLength, bt) - first;
  std::vector<BlockId> fresh;
  if (!allocateMany(space, count, fresh)) {
    return makeError(ErrorCode::kFull, "pool has no room for the ", count, " re-rotated blocks");
  }
  // Gather the tokens that move, packed [layer][K|V][token]..., rotate each layer's K.
  const uint64_t moved = length - end, tb = layout.tokenBytes();
  std::vector<uint8_t> packed(moved * layout.tokenKvBytes());
  // Blocks in GPU memory are read through one host copy each (the fresh blocks are host blocks).
  std::map<BlockId, std::vector<uint8_t>> staged;
  auto hostView = [&](BlockId b) -> const uint8_t* {
    const BlockMeta& m = pool_[b];
    if (memory_.hostAddressable(m.extent)) return memory_.blockData(m);
    auto [it, fresh] = staged.try_emplace(b);
    if (fresh) {
      it->second.resize(pool_.classBytes(m.sizeClass));
      memory_.copy(it->second.data(), memory_.blockData(m), it->second.size());
    }
    return it->second.data();
  };
  for (uint64_t t = 0; t < moved; ++t) {
    const uint64_t pos = end + t;
    const uint8_t* src = hostView(seq.blocks[pos / bt]);
    for (uint32_t layer = 0; layer < layout.numLayers; ++layer) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        std::memcpy(packed.data() + ((layer * 2 + kv) * moved + t) * tb,
                    src + layout.slotOffset(layer, kv, pos % bt), tb);
      }
    }
  }
  for (uint32_t layer = 0; layer < layout.numLayers; ++layer) {
    rotator_->rotate(layout, packed.data() + (layer * 2) * moved * tb, moved,
                     -static_cast<int64_t>(shift));
  }
  if (begin % bt != 0) copySlots(space, seq.blocks[first], fresh[0], begin % bt);
  for (uint64_t t = 0; t < moved; ++t) {
    const uint64_t pos = begin + t;
    uint8_t* dst = memory_.blockData(pool_[fresh[pos / bt - first]]);
    for (uint32_t layer = 0; layer < layout.numLayers; ++layer) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        std::memcpy(dst + layout.slotOffset(layer, kv, pos % bt),
                    packed.data() + ((layer * 2 + kv) * moved + t) * tb, tb);
      }
    }
  }
  unrefTailFirst(std::span<const BlockId>(seq.blocks).subspan(first));
  seq.blocks.resize(first);
  for (BlockId b : fresh) {
    pool_[b].state = BlockState::kPartial;
    ref(b);
    seq.blocks.push_back(b);
  }
  seq.tokens.erase(seq.tokens.begin() + begin, seq.tokens.begin() + end);
  seq.keys.resize(std::min(seq.keys.size(), first));
  // The moved KV is not what a prefill of the shortened tokens gives: never index it.
  seq.unindexed = true;
  seq.version = nextVersion_++;
  return {};
}

}  // namespace kvtier
