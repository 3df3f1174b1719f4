// The cold tier's snapshots: manifests and their records, written in one batch, loaded,
// dropped; the records they name kept from the capacity bound; the snapshot id limit.
#include "daemon/cold_tier.h"

#include "daemon/cold_tier_internal.h"

namespace kvtier {

using namespace cold_internal;

// ---------------------------------------------------------------------------------------------
// Snapshots

Status ColdTier::putSnapshots(std::span<const SnapshotPut> puts) {
  struct Encoded {
    std::string key, header;
    const uint8_t* data;
    uint32_t bytes;
    bool block;  // a block record (blocks family); else a snapshot's own record
  };
  std::vector<Encoded> records;
  std::vector<std::pair<std::string, std::string>> manifests;
  std::vector<std::vector<std::string>> named;  // per manifest: the block records it names
  for (const auto& put : puts) {
    const SnapshotManifest& m = *put.manifest;
    const SnapshotKey key{m.fingerprint, m.salt, m.id};
    named.push_back(namedRecords(m));
    for (const auto& r : put.sealed) {
      if (contains(r.key)) continue;  // spilled already: the manifest names it
      records.push_back(Encoded{r.key.encode(), encodeHeader(r), r.data, r.bytes, true});
    }
    for (const auto& r : put.own) {
      const ColdRecord named{ColdKey{m.fingerprint, m.salt, recordName(m.id, r.slot)}, r.data,
                             r.bytes, r.checksum};
      records.push_back(
          Encoded{key.recordKey(r.slot), encodeHeader(named), r.data, r.bytes, false});
    }
    manifests.emplace_back(key.manifestKey(), encodeManifest(m));
  }
  rocksdb::Status s;
  {
    std::shared_lock<std::shared_mutex> dbLock;
    if (auto ready = lockForWrite(dbLock); !ready) return ready;
    rocksdb::WriteBatch batch;
    for (const auto& r : records) {
      if (r.block) {
        putBlockRecord(batch, r.key, r.header, r.data, r.bytes);
      } else {
        putRecord(batch, snapshots_, r.key, r.header, r.data, r.bytes);
      }
    }
    // In the same batch as the records it names: a manifest is never on disk without them.
    for (const auto& [key, value] : manifests) batch.Put(snapshots_, key, value);
    s = db_->Write(blockWriteOptions(), &batch);
    if (!s.ok()) noteWriteError(s);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok()) {
      ++stats_.writeErrors;
      return unavailable(s, "cold tier snapshot write failed");
    }
    for (const auto& r : records) {
      if (!r.block) continue;
      holdLocked(r.key, r.bytes);
      ++stats_.written;
    }
    stats_.records = held_.size();
    for (size_t i = 0; i < manifests.size(); ++i) nameLocked(manifests[i].first, named[i]);
    stats_.snapshots = manifests_.size();
  }
  enforceCapacity();
  return {};
}

Result<SnapshotManifest> ColdTier::getSnapshot(const SnapshotKey& key) {
  const std::string k = key.manifestKey();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!manifests_.count(k)) return makeError(ErrorCode::kNotFound, "no snapshot ", key.id);
  }
  std::string value;
  rocksdb::Status s;
  {
    std::shared_lock<std::shared_mutex> dbLock(dbMu_);
    if (!db_) return makeError(ErrorCode::kUnavailable, "cold tier is closed after a write error");
    s = db_->Get(rocksdb::ReadOptions(), snapshots_, k, &value);
  }
  if (s.IsNotFound()) {
    std::lock_guard<std::mutex> lock(mu_);
    unnameLocked(k);
    stats_.snapshots = manifests_.size();
    return makeError(ErrorCode::kNotFound, "no snapshot ", key.id);
  }
  if (!s.ok() && !s.IsCorruption()) return unavailable(s, "cold tier manifest read failed");
  Result<SnapshotManifest> m =
      s.ok() ? decodeManifest(value, key.fingerprint, key.salt, key.id)
             : Result<SnapshotManifest>(makeError(ErrorCode::kChecksumMismatch, "manifest of ",
                                                  key.id, " is unreadable: ", s.ToString()));
  if (!m) (void)eraseSnapshot(key, /*broken=*/true);  // never half-used: gone with its records
  return m;
}

Status ColdTier::getSnapshotRecordInto(const SnapshotKey& key, uint32_t slot, uint8_t* dest,
                                       uint32_t bytes) {
  std::shared_lock<std::shared_mutex> dbLock(dbMu_);
  if (!db_) return makeError(ErrorCode::kUnavailable, "cold tier is closed after a write error");
  rocksdb::PinnableSlice value;
  const rocksdb::Status s =
      db_->Get(rocksdb::ReadOptions(), snapshots_, key.recordKey(slot), &value);
  if (s.IsNotFound()) {
    return makeError(ErrorCode::kNotFound, "snapshot ", key.id, " has no record ", slot);
  }
  if (!s.ok() && !s.IsCorruption()) return unavailable(s, "cold tier snapshot record read failed");
  const ColdKey named{key.fingerprint, key.salt, recordName(key.id, slot)};
  auto payload = s.ok() ? verifyColdRecord(named, std::string_view(value.data(), value.size()))
                        : Result<std::string_view>(makeError(ErrorCode::kChecksumMismatch,
                                                             "record unreadable: ", s.ToString()));
  if (payload && payload->size() != bytes) {
    payload = makeError(ErrorCode::kChecksumMismatch, "record of ", payload->size(),
                        " bytes where its manifest says ", bytes);
  }
  if (!payload) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.corruptDropped;
    return makeError(ErrorCode::kChecksumMismatch, "snapshot ", key.id, " record ", slot, ": ",
                     payload.error().message());
  }
  std::memcpy(dest, payload->data(), bytes);
  return {};
}

Result<bool> ColdTier::eraseSnapshot(const SnapshotKey& key, bool broken) {
  const std::string manifest = key.manifestKey();
  const std::string prefix = key.recordPrefix();
  {
    // A delete is a write: after a failed write the database must be reopened first (it refuses
    // writes until then), and the snapshot counts as present until its delete is on disk.
    std::unique_lock<std::shared_mutex> dbLock(dbMu_);
    if (auto reopened = reopenForWriteLocked(); !reopened) return reopened.error();
    rocksdb::WriteBatch batch;
    batch.Delete(snapshots_, manifest);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), snapshots_));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      batch.Delete(snapshots_, it->key());
    }
    it.reset();
    const rocksdb::Status s = db_->Write(blockWriteOptions(), &batch);
    if (!s.ok()) {
      noteWriteError(s);
      return unavailable(s, "cold tier snapshot delete failed");
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  const bool had = manifests_.count(manifest) > 0;
  unnameLocked(manifest);
  stats_.snapshots = manifests_.size();
  if (had && broken) ++stats_.snapshotsDropped;
  return had;
}

void ColdTier::nameLocked(const std::string& manifest, std::vector<std::string> blocks) {
  unnameLocked(manifest);  // a rewrite replaces what it named
  for (const auto& b : blocks) ++namedBy_[b];
  manifests_.emplace(manifest, std::move(blocks));
}

void ColdTier::unnameLocked(const std::string& manifest) {
  auto it = manifests_.find(manifest);
  if (it == manifests_.end()) return;
  for (const auto& b : it->second) {
    auto n = namedBy_.find(b);
    if (n != namedBy_.end() && --n->second == 0) namedBy_.erase(n);
  }
  manifests_.erase(it);
}

bool ColdTier::hasSnapshot(const SnapshotKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return manifests_.count(key.manifestKey()) > 0;
}

Status ColdTier::storeSnapshotIdLimit(uint64_t limit) {
  std::unique_lock<std::shared_mutex> dbLock(dbMu_);
  if (auto reopened = reopenForWriteLocked(); !reopened) return reopened;
  rocksdb::WriteOptions synced;
  synced.sync = true;  // rare (once per many ids), and what keeps ids unique across crashes
  const rocksdb::Status s = db_->Put(synced, meta_, kSnapshotIdLimitKey, std::to_string(limit));
  if (!s.ok()) {
    noteWriteError(s);
    return unavailable(s, "cannot store the snapshot id limit");
  }
  storedSnapshotIds_ = std::max(storedSnapshotIds_, limit);
  return {};
}
}  // namespace kvtier
