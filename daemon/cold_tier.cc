#include "daemon/cold_tier.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fcntl.h>
#include <poll.h>
#include <rocksdb/env.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/listener.h>
#include <rocksdb/sst_file_manager.h>
#include <rocksdb/sst_file_reader.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/options_util.h>
#include <rocksdb/write_batch.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <shared_mutex>
#include <thread>

#include "daemon/chunked_write_fs.h"
#include "daemon/log.h"
#include "daemon/scheduling.h"
#include "daemon/snapshot_codec.h"
#include "schemas/cold_record.capnp.h"

#include "daemon/cold_tier_internal.h"

namespace kvtier {

using namespace cold_internal;

Result<std::string_view> verifyColdRecord(const ColdKey& key, std::string_view value,
                                          uint64_t* checksum) {
  auto corrupt = [](const char* why) { return makeError(ErrorCode::kChecksumMismatch, why); };
  uint32_t headerBytes = 0;
  if (value.size() < 4) return corrupt("record too short");
  std::memcpy(&headerBytes, value.data(), 4);
  if (headerBytes == 0 || headerBytes % 8 != 0 || headerBytes > kMaxHeaderBytes ||
      value.size() < 4 + headerBytes) {
    return corrupt("record header size is invalid");
  }
  // Copy into aligned words before parsing; bound what the parser may read.
  std::vector<capnp::word> words(headerBytes / 8);
  std::memcpy(words.data(), value.data() + 4, headerBytes);
  capnp::ReaderOptions limits;
  limits.traversalLimitInWords = 256;
  limits.nestingLimit = 4;
  try {
    capnp::FlatArrayMessageReader reader(
        kj::ArrayPtr<const capnp::word>(words.data(), words.size()), limits);
    auto h = reader.getRoot<disk::ColdRecordHeader>();
    const std::string_view payload = value.substr(4 + headerBytes);
    if (h.getFormatVersion() != disk::FORMAT_VERSION) return corrupt("unknown record format");
    if (h.getFingerprint() != key.fingerprint || h.getSalt().size() != key.salt.size() ||
        std::memcmp(h.getSalt().begin(), key.salt.data(), key.salt.size()) != 0 ||
        h.getKey().size() != key.key.bytes.size() ||
        std::memcmp(h.getKey().begin(), key.key.bytes.data(), key.key.bytes.size()) != 0) {
      return corrupt("record header names another block");
    }
    if (h.getBytes() != payload.size()) return corrupt("record size does not match its header");
    if (XXH3_64bits(payload.data(), payload.size()) != h.getChecksum()) {
      return corrupt("record bytes fail their checksum");
    }
    if (checksum) *checksum = h.getChecksum();
    return payload;
  } catch (const kj::Exception&) {
    return corrupt("record header does not parse");
  }
}

std::string SnapshotKey::recordPrefix() const {
  std::string out;
  out.reserve(kSnapshotPrefixBytes + 4);
  out.push_back(kRecordTag);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(fingerprint >> (8 * i)));
  out.append(reinterpret_cast<const char*>(salt.data()), salt.size());
  appendBigEndian(out, id, 8);  // big-endian: one snapshot's records are one key range
  return out;
}

std::string SnapshotKey::manifestKey() const {
  std::string out = recordPrefix();
  out[0] = kManifestTag;
  return out;
}

std::string SnapshotKey::recordKey(uint32_t slot) const {
  std::string out = recordPrefix();
  appendBigEndian(out, slot, 4);
  return out;
}

std::string ColdKey::encode() const {
  std::string out(kKeyBytes, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(fingerprint >> (8 * i));
  std::memcpy(out.data() + 8, salt.data(), 16);
  std::memcpy(out.data() + 24, key.bytes.data(), 16);
  return out;
}

bool ColdKey::decode(std::string_view in, ColdKey* out) {
  if (in.size() != kKeyBytes) return false;
  out->fingerprint = 0;
  for (int i = 0; i < 8; ++i) out->fingerprint |= uint64_t{static_cast<uint8_t>(in[i])} << (8 * i);
  std::memcpy(out->salt.data(), in.data() + 8, 16);
  std::memcpy(out->key.bytes.data(), in.data() + 24, 16);
  return true;
}

ColdTier::~ColdTier() { closeDb(); }

void ColdTier::touchLocked(const std::string& key) {
  // Read back into memory: resident again, most recently accessed.
  auto it = held_.find(key);
  if (it == held_.end()) return;
  Held& h = it->second;
  residentOrder_.splice(residentOrder_.end(), orderOf(h.resident), h.pos);
  h.resident = true;
}

void ColdTier::holdLocked(const std::string& key, uint32_t bytes, bool resident) {
  forgetLocked(key);
  auto& list = orderOf(resident);
  list.push_back(key);
  held_[key] = Held{std::prev(list.end()), bytes, resident};
  stats_.bytes += bytes;
}

void ColdTier::forgetLocked(const std::string& key) {
  auto it = held_.find(key);
  if (it == held_.end()) return;
  const Held& h = it->second;
  stats_.bytes -= h.bytes;
  orderOf(h.resident).erase(h.pos);
  held_.erase(it);
  stats_.records = held_.size();
}

void ColdTier::leftMemory(std::span<const ColdKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const ColdKey& k : keys) {
    auto it = held_.find(k.encode());
    if (it == held_.end()) continue;
    Held& h = it->second;
    order_.splice(order_.end(), orderOf(h.resident), h.pos);
    h.resident = false;
  }
}

Status ColdTier::putBatch(std::span<const ColdRecord> records) {
  std::vector<std::string> keys;
  std::vector<std::string> headers;
  for (const auto& r : records) {
    keys.push_back(r.key.encode());
    headers.push_back(encodeHeader(r));
  }
  rocksdb::Status s;
  {
    // Shared: reads (promotes, snapshot loads on another thread) go on during the write.
    std::shared_lock<std::shared_mutex> dbLock;
    if (auto ready = lockForWrite(dbLock); !ready) return ready;
    // Room for the whole batch up front: no copying as it grows (it is 16 MiB of blocks; growing
    // it once copied them into fresh pages, and spilling ran 25% slower).
    size_t bytes = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      bytes += keys[i].size() + headers[i].size() + records[i].bytes + kBatchEntryOverhead;
      bytes += kSizeKeyBytes + 4 + kBatchEntryOverhead;  // its size entry
    }
    rocksdb::WriteBatch batch(bytes);
    // In key order, the records and then their size entries: each insert into the memtable's
    // skip list then starts from where the last one ended (batch order, the keys being hashes,
    // jumped across the whole list for each, and the inserts were most of the spill's CPU).
    std::vector<uint32_t> order(keys.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](uint32_t a, uint32_t b) { return keys[a] < keys[b]; });
    for (uint32_t i : order) {
      putRecord(batch, blocks_, keys[i], headers[i], records[i].data, records[i].bytes);
    }
    for (uint32_t i : order) batch.Put(blocks_, sizeKey(keys[i]), encodeSize(records[i].bytes));
    // Small blocks only: through the log, no flush (the memtable is flushed when full). The log
    // is written before Write returns, so a SIGKILL from here on finds them (a power loss may
    // not: a miss then, never wrong bytes — every record is checked as it is read).
    const bool logged = std::all_of(records.begin(), records.end(),
                                    [](const ColdRecord& r) { return r.bytes < kMinBlobBytes; });
    s = db_->Write(spillWriteOptions(logged), &batch);
    if (s.ok() && !logged) {
      // Written means on disk: the caller frees the blocks' memory next, and a SIGKILL from here
      // on must find them. (Never held back by a write stall: nothing else writes this much.)
      rocksdb::FlushOptions flush;
      flush.allow_write_stall = true;
      // The other families too (a no-op when empty): a log file stays until every family with
      // entries in it is flushed, and the tier's metadata, written once at open, would otherwise
      // keep every log since then (one per flush) until the next restart replayed them all.
      s = db_->Flush(flush, {blocks_, snapshots_, meta_, default_});
    }
    if (!s.ok()) noteWriteError(s);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok()) {
      ++stats_.writeErrors;
      return unavailable(s, "cold tier write failed");
    }
    for (size_t i = 0; i < records.size(); ++i) holdLocked(keys[i], records[i].bytes);
    stats_.records = held_.size();
    stats_.written += records.size();
  }
  enforceCapacity();
  return {};
}

Status ColdTier::lockForWrite(std::shared_lock<std::shared_mutex>& lock) {
  for (;;) {
    lock = std::shared_lock<std::shared_mutex>(dbMu_);
    if (db_ && !needsReopen_.load()) return {};
    lock.unlock();
    std::unique_lock<std::shared_mutex> exclusive(dbMu_);
    if (auto reopened = reopenForWriteLocked(); !reopened) return reopened;
  }
}

void ColdTier::noteWriteError(const rocksdb::Status& s) {
  // RocksDB reports damage it met in a write, a flush or a compaction (its background error
  // fails every write after it) as Corruption: the tier is moved aside at the reopen.
  if (s.IsCorruption() && !damaged_.exchange(true)) {
    std::lock_guard<std::mutex> lock(mu_);
    damageSeen_ = s.ToString();
  }
  needsReopen_ = true;
}

Status ColdTier::reopenForWriteLocked() {
  if (!needsReopen_.load() && db_) return {};
  // A write failed before (a full disk): RocksDB keeps refusing writes after such an error until
  // it is reopened; reopen it now that a write is wanted again. Reads went on meanwhile. A tier
  // RocksDB found damaged (a table or blob file changed on disk under the daemon, met by a
  // compaction) would fail again at the next compaction: it is moved aside and a fresh one
  // opened, as at start.
  closeDb();
  if (damaged_.exchange(false)) {
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reason = "cold tier at " + options_.path + " is damaged (" + damageSeen_ + ")";
    }
    inheritedNodeId_ = nodeId_;
    inheritedSnapshotIds_ = std::max(storedSnapshotIds_, snapshotIdFloor_);
    if (auto aside = moveAside(reason); !aside) {
      damaged_ = true;
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.writeErrors;
      return aside;
    }
  }
  if (auto reopened = openDb(/*reopening=*/true); !reopened) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.writeErrors;
    return reopened.error();
  }
  needsReopen_ = false;
  return {};
}

void ColdTier::enforceCapacity() {
  if (options_.capacityBytes == 0) return;
  std::vector<std::string> doomed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Records held only here first, oldest to leave memory first; then resident ones, oldest
    // access first. Never a record a snapshot names: it stays until the snapshot is dropped.
    auto drop = [&](std::list<std::string>& list) {
      for (auto it = list.begin(); stats_.bytes > options_.capacityBytes && it != list.end();) {
        const std::string key = *it++;
        if (namedBy_.count(key)) continue;
        doomed.push_back(key);
        forgetLocked(key);
        ++stats_.capacityEvicted;
      }
    };
    drop(order_);
    drop(residentOrder_);
  }
  if (doomed.empty()) return;
  std::shared_lock<std::shared_mutex> dbLock(dbMu_);
  if (!db_) return;
  rocksdb::WriteBatch batch;
  for (const auto& k : doomed) deleteBlockRecord(batch, k);
  (void)db_->Write(blockWriteOptions(), &batch);
}

void ColdTier::putBlockRecord(rocksdb::WriteBatch& batch, const std::string& key,
                              const std::string& header, const uint8_t* data, uint32_t bytes) {
  putRecord(batch, blocks_, key, header, data, bytes);
  batch.Put(blocks_, sizeKey(key), encodeSize(bytes));
}

void ColdTier::deleteBlockRecord(rocksdb::WriteBatch& batch, const std::string& key) {
  batch.Delete(blocks_, key);
  batch.Delete(blocks_, sizeKey(key));
}

rocksdb::Status ColdTier::deleteBlockRecord(const std::string& key) {
  rocksdb::WriteBatch batch;
  deleteBlockRecord(batch, key);
  return db_->Write(blockWriteOptions(), &batch);
}

Status ColdTier::readVerified(const ColdKey& key, const Consume& consume) {
  const std::string k = key.encode();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!held_.count(k)) return makeError(ErrorCode::kNotFound, "no cold record ", key.key.hex());
  }
  std::shared_lock<std::shared_mutex> dbLock(dbMu_);
  if (!db_) return makeError(ErrorCode::kUnavailable, "cold tier is closed after a write error");
  rocksdb::PinnableSlice value;
  // RocksDB's checksums are verified on this read: a table block damaged on disk while the daemon
  // runs is an error (a miss) rather than bytes RocksDB's parser meets unchecked, which Debian's
  // build (its assertions on) answers with abort(). That includes the blob's CRC32C, computed in
  // software by Debian's portable build; every byte served is also checked against the record's
  // header (its key, size and xxh3) below. The cost is measured (docs/cold-tier.md).
  rocksdb::ReadOptions options;
  options.verify_checksums = true;
  const rocksdb::Status s = db_->Get(options, blocks_, k, &value);
  return checkRead(key, k, s, std::string_view(value.data(), value.size()), consume);
}

Status ColdTier::checkRead(const ColdKey& key, const std::string& k, const rocksdb::Status& s,
                           std::string_view value, const Consume& consume) {
  if (s.IsNotFound()) {
    std::lock_guard<std::mutex> lock(mu_);
    forgetLocked(k);
    (void)deleteBlockRecord(k);  // its size entry, or the next open would hold it again
    return makeError(ErrorCode::kNotFound, "no cold record ", key.key.hex());
  }
  // A passing read error (I/O, busy) is UNAVAILABLE and deletes nothing; corruption RocksDB
  // detected itself, or a failed check, is a miss: the record is dropped.
  if (!s.ok() && !s.IsCorruption()) return unavailable(s, "cold record read failed");
  uint64_t checksum = 0;
  auto payload = s.ok()
                     ? verifyColdRecord(key, value, &checksum)
                     : Result<std::string_view>(makeError(
                           ErrorCode::kChecksumMismatch, "cold record unreadable: ", s.ToString()));
  Status consumed = payload ? consume(*payload, checksum) : Status(payload.error());
  if (!payload) {
    // Logged once per block: the record is deleted below, so it is never read again.
    logWarn("cold_record_corrupt",
            "key=" + key.key.hex() + " reason=\"" + payload.error().message() + "\"");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!payload) {
    forgetLocked(k);
    ++stats_.corruptDropped;
    (void)deleteBlockRecord(k);
    return payload.error();
  }
  touchLocked(k);
  ++stats_.reads;
  return consumed;
}

Result<std::vector<uint8_t>> ColdTier::get(const ColdKey& key) {
  std::vector<uint8_t> out;
  auto status = readVerified(key, [&](std::string_view payload, uint64_t) -> Status {
    out.assign(payload.begin(), payload.end());
    return {};
  });
  if (!status) return status.error();
  return out;
}

Status ColdTier::getInto(const ColdKey& key, uint8_t* dest, uint32_t bytes, uint64_t* checksum) {
  return readVerified(key, [&](std::string_view payload, uint64_t sum) -> Status {
    if (payload.size() != bytes) {
      return makeError(ErrorCode::kInvalidArgument, "cold record has ", payload.size(),
                       " bytes, the block ", bytes);
    }
    std::memcpy(dest, payload.data(), bytes);
    if (checksum) *checksum = sum;
    return {};
  });
}

std::vector<Status> ColdTier::getManyInto(std::span<const Read> reads) {
  std::vector<Status> out(reads.size());
  std::vector<std::string> keys(reads.size());
  std::vector<uint32_t> wanted;  // the held ones, in key order (MultiGet's sorted input)
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t i = 0; i < reads.size(); ++i) {
      keys[i] = reads[i].key.encode();
      if (held_.count(keys[i])) {
        wanted.push_back(i);
      } else {
        out[i] = makeError(ErrorCode::kNotFound, "no cold record ", reads[i].key.key.hex());
      }
    }
  }
  if (wanted.empty()) return out;
  std::sort(wanted.begin(), wanted.end(),
            [&](uint32_t a, uint32_t b) { return keys[a] < keys[b]; });
  std::shared_lock<std::shared_mutex> dbLock(dbMu_);
  if (!db_) {
    for (uint32_t i : wanted) {
      out[i] = makeError(ErrorCode::kUnavailable, "cold tier is closed after a write error");
    }
    return out;
  }
  std::vector<rocksdb::Slice> slices;
  for (uint32_t i : wanted) slices.emplace_back(keys[i]);
  std::vector<rocksdb::PinnableSlice> values(wanted.size());
  std::vector<rocksdb::Status> statuses(wanted.size());
  rocksdb::ReadOptions options;
  options.verify_checksums = true;  // as readVerified: no table block is parsed unchecked
  db_->MultiGet(options, blocks_, wanted.size(), slices.data(), values.data(), statuses.data(),
                /*sorted_input=*/true);
  for (size_t j = 0; j < wanted.size(); ++j) {
    const Read& r = reads[wanted[j]];
    out[wanted[j]] = checkRead(r.key, keys[wanted[j]], statuses[j],
                               std::string_view(values[j].data(), values[j].size()),
                               [&](std::string_view payload, uint64_t sum) -> Status {
                                 if (payload.size() != r.bytes) {
                                   return makeError(ErrorCode::kInvalidArgument, "cold record has ",
                                                    payload.size(), " bytes, the block ", r.bytes);
                                 }
                                 std::memcpy(r.dest, payload.data(), r.bytes);
                                 if (r.checksum) *r.checksum = sum;
                                 return {};
                               });
  }
  return out;
}

std::vector<ColdKey> ColdTier::blockKeys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ColdKey> out;
  out.reserve(held_.size());
  for (const auto& [name, held] : held_) {
    ColdKey key;
    if (ColdKey::decode(name, &key)) out.push_back(key);
  }
  return out;
}

bool ColdTier::contains(const ColdKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_.count(key.encode()) > 0;
}

Status ColdTier::erase(const ColdKey& key) {
  const std::string k = key.encode();
  {
    std::lock_guard<std::mutex> lock(mu_);
    forgetLocked(k);
  }
  std::shared_lock<std::shared_mutex> dbLock(dbMu_);
  if (!db_) return makeError(ErrorCode::kUnavailable, "cold tier is closed after a write error");
  const rocksdb::Status s = deleteBlockRecord(k);
  if (!s.ok()) return unavailable(s, "cold tier delete failed");
  return {};
}

ColdStats ColdTier::stats() const {
  ColdStats out;
  std::shared_ptr<rocksdb::SstFileManager> manager;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = stats_;
    manager = fileManager_;
  }
  // Outside the tier's locks: stats are read on the event loop, and dbMu_ can be held for a whole
  // reopen. The manager has its own lock.
  if (manager) out.diskBytes = static_cast<uint64_t>(manager->GetTotalSize());
  return out;
}

}  // namespace kvtier
