// Engine: snapshot persistence — the manifest a snapshot is written as, the blocks a write reads
// (pinned meanwhile), snapshot ids that stay unique across restarts, and how a snapshot is
// rebuilt from its manifest after a restart. The bytes move in the daemon (daemon/cold_service).
#include <algorithm>
#include <cassert>

#include "store/engine.h"
#include "store/engine_util.h"

namespace kvtier {

using engine_util::blobClassBytes;
using engine_util::invalid;

Status Engine::checkSnapshotIds(uint64_t n) const {
  if (snapshotIdLimit_ - nextSnapshot_ < n) {
    return makeError(ErrorCode::kUnavailable,
                     "no snapshot id may be handed out until more are reserved on disk; retry");
  }
  return {};
}

void Engine::setSnapshotIds(SnapshotId next, SnapshotId limit) {
  nextSnapshot_ = std::max(nextSnapshot_, next);
  snapshotIdLimit_ = std::max(limit, nextSnapshot_);
}

const Engine::Snapshot* Engine::findSnapshot(SpaceId space, SnapshotId id) const {
  auto it = snapshots_.find(id);
  return it == snapshots_.end() || it->second.space != space ? nullptr : &it->second;
}

std::vector<std::pair<SpaceId, SnapshotId>> Engine::snapshotList() const {
  std::vector<std::pair<SpaceId, SnapshotId>> out;
  for (const auto& [id, snap] : snapshots_) out.emplace_back(snap.space, id);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::pair<SpaceId, Key128>> Engine::indexedBlocks() const {
  std::vector<std::pair<SpaceId, Key128>> out;
  out.reserve(index_.size());
  index_.forEach([&](BlockId block) {
    const BlockMeta& m = pool_[block];
    out.emplace_back(m.space, m.key);
  });
  return out;
}

bool Engine::hasSnapshot(SpaceId space, SnapshotId id) const {
  return findSnapshot(space, id) != nullptr;
}

bool Engine::snapshotOnDisk(SpaceId space, SnapshotId id) const {
  const Snapshot* snap = findSnapshot(space, id);
  return snap && (snap->disk == Snapshot::Disk::kWriting || snap->disk == Snapshot::Disk::kWritten);
}

SnapshotWrite Engine::describeSnapshot(SnapshotId id, const Snapshot& snap) {
  const SpaceInfo& sp = spaces_[snap.space].info;
  SnapshotWrite w;
  SnapshotManifest& m = w.manifest;
  m.id = id;
  m.fingerprint = sp.fingerprint;
  m.salt = sp.salt;
  m.blockTokens = sp.layout.blockTokens;
  m.blockBytes = sp.blockBytes;
  m.from = snap.from;
  m.to = snap.to;
  m.tokens = snap.tokens;
  m.keys = snap.keys;
  m.detached = snap.options.detached;
  m.window = snap.options.window;
  m.chunk = snap.options.chunk;
  m.clientKeyed = snap.clientKeyed;
  m.unindexed = snap.unindexed;
  for (size_t i = 0; i < snap.blocks.size(); ++i) {
    const BlockId b = snap.blocks[i];
    if (b == kNoBlock) {
      m.blocks.push_back(ManifestBlock{});
      continue;
    }
    const BlockMeta& meta = pool_[b];
    // A sealed block's checksum is its writer's; a partial block's is taken from its bytes when
    // they are written (a checksum it carries may be of bytes an append has since replaced).
    SnapshotBytes bytes{pool_.location(b),
                        sp.blockBytes,
                        {},
                        0,
                        meta.state == BlockState::kSealed ? pool_.checksum(b) : std::nullopt};
    if (meta.state == BlockState::kSealed && !meta.entry) {
      // Named by its content key: its bytes are (or will be) an ordinary block record.
      m.blocks.push_back(ManifestBlock{ManifestBlock::Kind::kSealed, meta.key});
      bytes.key = meta.key;
      w.sealed.push_back(bytes);
    } else {
      m.blocks.push_back(ManifestBlock{ManifestBlock::Kind::kOwn, {}});
      bytes.slot = static_cast<uint32_t>(i);
      w.own.push_back(bytes);
    }
    pin(b);
    w.pinned.push_back(b);
  }
  size_t j = 0;
  for (const auto& [pos, b] : snap.checkpoints) {
    m.checkpoints.push_back(ManifestCheckpoint{pos, pool_[b].blobBytes});
    w.own.push_back(SnapshotBytes{
        pool_.location(b), pool_[b].blobBytes, {}, checkpointSlot(j++), pool_.checksum(b)});
    pin(b);
    w.pinned.push_back(b);
  }
  return w;
}

Result<SnapshotPin> Engine::pinSnapshot(SpaceId space, SnapshotId id) {
  if (auto s = checkSpace(space); !s) return s.error();
  const Snapshot* snap = findSnapshot(space, id);
  if (!snap) return makeError(ErrorCode::kNotFound, "no snapshot ", id);
  SnapshotWrite w = describeSnapshot(id, *snap);
  SnapshotPin out;
  out.manifest = std::move(w.manifest);
  const uint32_t blockBytes = spaces_[space].info.blockBytes;
  for (BlockId b : snap->blocks) {
    // A partial block has no checksum of its own (its writer may still append): the move takes
    // one from its bytes.
    out.parts.push_back(b == kNoBlock ? SnapshotBytes{}
                                      : SnapshotBytes{pool_.location(b),
                                                      blockBytes,
                                                      {},
                                                      0,
                                                      pool_[b].state == BlockState::kSealed
                                                          ? pool_.checksum(b)
                                                          : std::nullopt});
  }
  for (const auto& [pos, b] : snap->checkpoints) {
    out.parts.push_back(
        SnapshotBytes{pool_.location(b), pool_[b].blobBytes, {}, 0, pool_.checksum(b)});
  }
  out.lease = newReadLease(w.pinned);  // pins them once more: the lease holds them from here
  unpinTailFirst(w.pinned);
  return out;
}

Result<SnapshotId> Engine::reserveSnapshotId() {
  if (auto s = checkSnapshotIds(1); !s) return s.error();
  return nextSnapshot_++;
}

void Engine::queueSnapshotWrite(SpaceId space, SnapshotId id) {
  auto it = snapshots_.find(id);
  if (!cold_ || it == snapshots_.end() || it->second.space != space ||
      it->second.disk != Snapshot::Disk::kNone) {
    return;
  }
  it->second.disk = Snapshot::Disk::kWaiting;
  unwrittenSnapshots_.push_back(id);
}

std::vector<SnapshotWrite> Engine::takeSnapshotWrites(size_t maxBlocks) {
  std::vector<SnapshotWrite> out;
  size_t blocks = 0;
  while (!unwrittenSnapshots_.empty() && (out.empty() || blocks < maxBlocks)) {
    const SnapshotId id = unwrittenSnapshots_.front();
    unwrittenSnapshots_.pop_front();
    auto it = snapshots_.find(id);
    // The queue holds hints: skip snapshots dropped since.
    if (it == snapshots_.end() || it->second.disk != Snapshot::Disk::kWaiting) continue;
    Snapshot& snap = it->second;
    SnapshotWrite w = describeSnapshot(id, snap);
    blocks += w.pinned.size();
    snap.disk = Snapshot::Disk::kWriting;
    out.push_back(std::move(w));
  }
  return out;
}

void Engine::finishSnapshotWrites(std::span<const SnapshotWrite> writes, bool written) {
  for (const auto& w : writes) {
    if (written) {
      // Their records are on disk now: eviction may drop them at no cost once nothing holds them.
      for (const auto& s : w.sealed) {
        const BlockId b = pool_.find(s.location.extent, s.location.offset);
        if (b != kNoBlock && pool_[b].state == BlockState::kSealed && pool_[b].key == s.key) {
          pool_[b].onDisk = true;
        }
      }
    }
    auto it = snapshots_.find(w.manifest.id);
    if (it != snapshots_.end() && it->second.disk == Snapshot::Disk::kWriting) {
      if (written) {
        it->second.disk = Snapshot::Disk::kWritten;
      } else {
        it->second.disk = Snapshot::Disk::kWaiting;  // first in line for the next try
        unwrittenSnapshots_.push_front(w.manifest.id);
      }
    }
    unpinTailFirst(w.pinned);
  }
}

size_t Engine::rewriteSnapshotsMissing(const std::function<bool(SpaceId, const Key128&)>& held) {
  size_t count = 0;
  for (auto& [id, snap] : snapshots_) {
    if (snap.disk != Snapshot::Disk::kWritten) continue;
    bool missing = false;
    for (BlockId b : snap.blocks) {
      if (b == kNoBlock) continue;
      BlockMeta& m = pool_[b];
      if (m.state != BlockState::kSealed || m.entry || held(snap.space, m.key)) continue;
      m.onDisk = false;  // its record is gone: written again with the snapshot
      missing = true;
    }
    if (!missing) continue;
    snap.disk = Snapshot::Disk::kWaiting;
    unwrittenSnapshots_.push_back(id);
    ++count;
  }
  return count;
}

Result<SnapshotLoad> Engine::beginSnapshotLoad(SpaceId space, SnapshotManifest manifest) {
  if (auto s = checkSpace(space); !s) return s.error();
  if (auto s = checkManifest(manifest); !s) return s.error();
  const SpaceInfo& sp = spaces_[space].info;
  const SnapshotId id = manifest.id;
  if (manifest.fingerprint != sp.fingerprint || manifest.salt != sp.salt) {
    return invalid("the manifest of snapshot ", id, " names another namespace");
  }
  // Every block of a snapshot holds positions at or past its start, which a restore reads: one
  // the manifest calls released (this engine writes none) would be a hole in the sequence.
  for (size_t i = 0; i < manifest.blocks.size(); ++i) {
    if (manifest.blocks[i].kind == ManifestBlock::Kind::kReleased) {
      return invalid("block ", i, " of snapshot ", id, " names no bytes");
    }
  }
  if (manifest.blockTokens != sp.layout.blockTokens || manifest.blockBytes != sp.blockBytes) {
    return invalid("the manifest of snapshot ", id, " has blocks of ", manifest.blockTokens,
                   " tokens and ", manifest.blockBytes, " bytes, the namespace ",
                   sp.layout.blockTokens, " and ", sp.blockBytes);
  }
  if (id >= nextSnapshot_) {
    // Ids at or past the next one may still be handed out: rebuilding it would make two.
    return invalid("snapshot id ", id, " was never handed out (next is ", nextSnapshot_, ")");
  }
  if (snapshots_.count(id))
    return makeError(ErrorCode::kConflict, "snapshot ", id, " is in memory");
  const uint64_t largestExtent = pool_.largestExtentBytes();
  for (const auto& c : manifest.checkpoints) {
    if (blobClassBytes(c.bytes) > largestExtent) {
      // This pool's extents are too small, not the manifest: it is kept (another run may fit it).
      return makeError(ErrorCode::kNotSupported, "a checkpoint of ", c.bytes,
                       " bytes does not fit in a pool extent of ", largestExtent);
    }
  }

  SnapshotLoad load;
  load.space = space;
  load.blocks.assign(manifest.blocks.size(), kNoBlock);
  load.checkpoints.assign(manifest.checkpoints.size(), kNoBlock);
  auto full = [&](const char* what) {
    unpinTailFirst(load.pinned);  // fresh blocks are freed, nothing changed
    return makeError(ErrorCode::kFull, "pool has no block for snapshot ", id, "'s ", what);
  };
  // First pin the sealed blocks still (or again) in memory: no read for them, and no allocation
  // below may evict one of them (its record may be gone from disk).
  for (size_t i = 0; i < manifest.blocks.size(); ++i) {
    const ManifestBlock& mb = manifest.blocks[i];
    if (mb.kind != ManifestBlock::Kind::kSealed) continue;
    const BlockId hit = index_.find(space, mb.key);
    if (hit == kNoBlock) continue;
    pin(hit);
    load.pinned.push_back(hit);
    load.blocks[i] = hit;
  }
  for (size_t i = 0; i < manifest.blocks.size(); ++i) {
    const ManifestBlock& mb = manifest.blocks[i];
    if (mb.kind == ManifestBlock::Kind::kReleased || load.blocks[i] != kNoBlock) continue;
    const BlockId b = allocate(space);
    if (b == kNoBlock) return full("blocks");
    pin(b);
    load.pinned.push_back(b);
    load.blocks[i] = b;
    const bool sealed = mb.kind == ManifestBlock::Kind::kSealed;
    load.reads.push_back(SnapshotRead{pool_.location(b), sp.blockBytes, sealed,
                                      sealed ? mb.key : Key128{},
                                      sealed ? 0 : static_cast<uint32_t>(i), b, i, false});
  }
  for (size_t j = 0; j < manifest.checkpoints.size(); ++j) {
    const uint32_t bytes = manifest.checkpoints[j].bytes;
    const BlockId b =
        allocateClass(pool_.sizeClass(blobClassBytes(bytes)), spaces_[space].info.tenant);
    if (b == kNoBlock) return full("checkpoints");
    pin(b);
    pool_[b].blobBytes = bytes;
    load.pinned.push_back(b);
    load.checkpoints[j] = b;
    load.reads.push_back(
        SnapshotRead{pool_.location(b), bytes, false, {}, checkpointSlot(j), b, j, true});
  }
  load.manifest = std::move(manifest);
  return load;
}

Result<SnapshotInfo> Engine::finishSnapshotLoad(SnapshotLoad& load, std::span<const uint8_t> readOk,
                                                bool remote) {
  assert(readOk.size() == load.reads.size());
  bool all = true;
  for (size_t r = 0; r < load.reads.size(); ++r) {
    const SnapshotRead& read = load.reads[r];
    const bool ok = r < readOk.size() && readOk[r] != 0;
    all = all && ok;
    if (!ok || !read.sealed) continue;
    // A block read back is a cold hit like any promote, whether the snapshot comes back or not.
    if (!indexPromoted(load.space, read.key, read.block, read.checksum, remote)) {
      // A twin came back meanwhile (a lookup's promote): share it; ours is freed when unpinned.
      const BlockId twin = index_.find(load.space, read.key);
      pin(twin);
      load.pinned.push_back(twin);
      load.blocks[read.index] = twin;
    }
  }
  const SnapshotManifest& m = load.manifest;
  Result<SnapshotInfo> result =
      makeError(ErrorCode::kNotFound, "snapshot ", m.id, " could not be read from ",
                remote ? "its node" : "the cold tier");
  if (const Snapshot* existing = findSnapshot(load.space, m.id)) {
    result = infoOf(m.id, *existing);
  } else if (all && !snapshots_.count(m.id)) {
    Snapshot snap;
    snap.space = load.space;
    snap.from = m.from;
    snap.to = m.to;
    snap.tokens = m.tokens;
    snap.keys = m.keys;
    snap.options = SeqOptions{m.detached, m.window, m.chunk};
    snap.clientKeyed = m.clientKeyed;
    snap.unindexed = m.unindexed;
    // From this node's disk it is written already; from another node it is not (and is
    // written behind only if the caller keeps it: queueSnapshotWrite).
    snap.disk = remote ? Snapshot::Disk::kNone : Snapshot::Disk::kWritten;
    for (const auto& read : load.reads) {
      if (!read.sealed) pool_[read.block].state = BlockState::kPartial;
    }
    snap.blocks = load.blocks;
    for (BlockId b : snap.blocks) ref(b);
    for (size_t j = 0; j < m.checkpoints.size(); ++j) {
      ref(load.checkpoints[j]);
      snap.checkpoints.emplace(m.checkpoints[j].position, load.checkpoints[j]);
    }
    auto& stored = snapshots_.emplace(m.id, std::move(snap)).first->second;
    result = infoOf(m.id, stored);
  }
  unpinTailFirst(load.pinned);  // blocks nobody took are freed (or cached, if sealed)
  load.pinned.clear();
  return result;
}

}  // namespace kvtier
