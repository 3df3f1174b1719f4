// ColdTier: the node's cold tier, sealed blocks kept in RocksDB on local disk.
//
// One RocksDB under <data-dir>/cold with column families "blocks" (record key -> header + bytes,
// with integrated BlobDB for the large values), "snapshots" (snapshot manifests and the snapshots'
// own records) and "meta" (format version, node id, snapshot id limit). Beside each block record
// the blocks family holds a size entry (payload size), written and deleted with it, so that
// opening learns the records and their sizes without reading one. Records
// are keyed by (layout fingerprint, tenant salt, block key), so they survive restarts, which
// renumber namespaces. Every record carries an xxh3 checksum that is checked on read: a bad record
// is a miss, counted and deleted — never returned.
//
// Thread-safety: all methods may be called from any thread (the daemon calls them from its worker
// threads). RocksDB is thread-safe; the in-memory key set and access order are guarded by mu_.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/sst_file_manager.h>
#include <rocksdb/write_batch.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/error.h"
#include "store/snapshot_manifest.h"

namespace kvtier {

struct ColdKey {
  uint64_t fingerprint = 0;
  Salt salt{};
  Key128 key;
  std::string encode() const;  // 40 bytes: fingerprint (LE), salt, key
  static bool decode(std::string_view in, ColdKey* out);
  bool operator==(const ColdKey&) const = default;
};

// Checks a stored record's value (its header's size in 4 bytes, a ColdRecordHeader message, then
// the payload) against the name it was read under (a block's key, or a snapshot record's name):
// format version, name, size and xxh3. Returns the payload, a view into `value`, or
// CHECKSUM_MISMATCH saying which check failed. `value` comes from disk: any bytes are answered,
// none trusted. Thread-safe (pure).
// On success `checksum`, when given, gets the record's checksum (the payload's, as checked).
Result<std::string_view> verifyColdRecord(const ColdKey& key, std::string_view value,
                                          uint64_t* checksum = nullptr);

struct ColdRecord {
  ColdKey key;
  const uint8_t* data = nullptr;  // borrowed: must stay valid (pinned) until the write returns
  uint32_t bytes = 0;
  // The checksum its writer took, stored in the record as it is (never taken again from bytes
  // that may have changed since); unset: taken from `data` as the record is written.
  std::optional<uint64_t> checksum = {};
};

// A snapshot on disk: (layout fingerprint, tenant salt, snapshot id), so that it outlives the
// process's namespace numbering and is visible to its own tenant only.
struct SnapshotKey {
  uint64_t fingerprint = 0;
  Salt salt{};
  uint64_t id = 0;
  // Keys in the "snapshots" family: the manifest is 'M', fingerprint (LE), salt, id (BE); own
  // record `slot` is 'R', fingerprint, salt, id, slot (BE). Block records live in another family
  // and are 40 bytes long, so neither can ever be taken for the other.
  std::string manifestKey() const;
  std::string recordKey(uint32_t slot) const;
  std::string recordPrefix() const;
  bool operator==(const SnapshotKey&) const = default;
};

// A snapshot's own record to write (a partial or unindexed block, a checkpoint).
struct SnapshotRecord {
  uint32_t slot = 0;
  const uint8_t* data = nullptr;  // borrowed: must stay valid (pinned) until the write returns
  uint32_t bytes = 0;
  std::optional<uint64_t> checksum = {};  // as ColdRecord's
};

// One snapshot to write: its manifest, the sealed blocks it names and its own records.
struct SnapshotPut {
  const SnapshotManifest* manifest = nullptr;  // borrowed until the write returns
  std::vector<ColdRecord> sealed = {};         // written unless the tier holds them already
  std::vector<SnapshotRecord> own = {};
};

struct ColdStats {
  uint64_t records = 0;
  uint64_t bytes = 0;  // payload bytes held (what --disk-bytes bounds)
  // Bytes of the tier's table and blob files on disk, obsolete ones not yet deleted included:
  // above `bytes` by records dropped but not yet compacted away, and by snapshots' own records and
  // manifests (not counted in `bytes`); write-ahead logs and RocksDB's small metadata files are
  // not counted (docs/cold-tier.md).
  uint64_t diskBytes = 0;
  uint64_t written = 0;          // records written
  uint64_t reads = 0;            // records read back (hits)
  uint64_t corruptDropped = 0;   // records that failed their checks, deleted
  uint64_t writeErrors = 0;      // failed batch writes (disk full, I/O errors)
  uint64_t capacityEvicted = 0;  // records dropped for the capacity bound
  uint64_t snapshots = 0;        // snapshot manifests held
  // Snapshots dropped because their manifest, or a record they need, failed its checks or was
  // gone (a capacity eviction): they are never half-restored.
  uint64_t snapshotsDropped = 0;
  // Damaged tiers moved aside (to <path>.damaged, at open or after RocksDB met damage while
  // running) and replaced by an empty one.
  uint64_t quarantined = 0;
};

// `kvtierd --check-cold-tier DIR`: opens the tier at DIR read-only, writes "node ID" and
// "snapshot_ids LIMIT" (read with checksums, when it can), and reads every live table back against
// its checksums, writing "table PATH" to `out` before each and "bad REASON" on the first failure.
// Returns the exit status (0: every table is whole). Run in a process of its own, started
// fresh (ColdTier::verifyTables): over a damaged block RocksDB may abort() the process.
int checkColdTables(const std::string& path, int out);

class ColdTier {
 public:
  struct Options {
    std::string path{};  // the RocksDB directory
    // Payload bytes kept (0: unbounded). Over it, records of blocks held only here go first, those
    // that left memory first first; then records of blocks also in the node's memory (resident:
    // written by a spill or a snapshot, or read back since, and not evicted after), oldest access
    // first. A resident record is a copy now, but the only one once its block leaves memory —
    // and then the most recent to have been used.
    uint64_t capacityBytes = 0;
    // File system to run on; nullptr: the default. Tests pass a fault-injecting wrapper.
    std::shared_ptr<rocksdb::FileSystem> fileSystem = nullptr;
    // The program that checks the tables before the open (`PROGRAM --check-cold-tier DIR`, see
    // checkColdTables): kvtierd passes itself. Empty: $KVTIER_COLD_CHECKER, else the kvtierd of
    // this build tree.
    std::string checker{};
    // Write bandwidth, bytes per second, of everything the tier writes (0: unlimited).
    uint64_t writeBytesPerSecond = 0;
  };

  // Opens or creates the database, checks its format version, and loads the key set.
  static Result<std::unique_ptr<ColdTier>> open(const Options& options);
  // The name of the thread RocksDB deletes obsolete files on (lowered like its flush and
  // compaction threads).
  static constexpr const char* kTrashThreadName = "rocksdb:trash";
  ~ColdTier();
  ColdTier(const ColdTier&) = delete;
  ColdTier& operator=(const ColdTier&) = delete;

  // The write bandwidth the tier was given (Options::writeBytesPerSecond; 0: unlimited).
  uint64_t writeBytesPerSecond() const { return options_.writeBytesPerSecond; }

  // Writes the records in one batch and flushes it to disk (blocking). UNAVAILABLE on an I/O error
  // or a full disk: the batch counts as not written (the caller keeps the blocks in memory). Its
  // records may still reach disk later (RocksDB's own recovery, or the flush when the database is
  // reopened) and then be found by a restart, with their own bytes.
  Status putBatch(std::span<const ColdRecord> records);
  // The bytes of `key` (blocking). NOT_FOUND if absent; CHECKSUM_MISMATCH if the record fails its
  // checks (it is deleted and counted).
  Result<std::vector<uint8_t>> get(const ColdKey& key);
  // Like get, but checks the record in RocksDB's buffer and copies the payload once, into `dest`
  // (`bytes` long; INVALID_ARGUMENT if the record's size differs).
  // `checksum`, when given, gets the record's checksum: the one the bytes were verified against.
  Status getInto(const ColdKey& key, uint8_t* dest, uint32_t bytes, uint64_t* checksum = nullptr);
  // getInto for each of `reads` (a lookup's promotes), in one RocksDB MultiGet: out[i] is
  // reads[i]'s status, each as getInto's would be.
  struct Read {
    ColdKey key;
    uint8_t* dest;
    uint32_t bytes;
    uint64_t* checksum = nullptr;  // as getInto's
  };
  std::vector<Status> getManyInto(std::span<const Read> reads);
  // These blocks left the node's memory (evicted): their records are no longer resident, and are
  // the most recent to go there (the bound is applied at the next write). Unknown keys are
  // ignored. Cheap: no disk access.
  void leftMemory(std::span<const ColdKey> keys);
  bool contains(const ColdKey& key) const;  // an in-memory set: cheap
  // Every block record's key (a copy of the in-memory set: for publishing at start).
  std::vector<ColdKey> blockKeys() const;
  Status erase(const ColdKey& key);

  // --- Snapshots. Records of the snapshots' own are not counted in the capacity bound (they live
  // as long as their snapshot); the sealed blocks a manifest names are ordinary block records.
  // Writes each snapshot's sealed blocks the tier does not hold, own records and manifest in one
  // batch (blocking): all or nothing. UNAVAILABLE on an I/O error or a full disk.
  Status putSnapshots(std::span<const SnapshotPut> puts);
  // The manifest of `key` (blocking). NOT_FOUND if absent; CHECKSUM_MISMATCH if it fails its
  // checks (daemon/snapshot_codec.h): it is then dropped with its records, and counted.
  Result<SnapshotManifest> getSnapshot(const SnapshotKey& key);
  // Reads own record `slot` of snapshot `key`, which must be `bytes` long, into `dest`
  // (blocking). NOT_FOUND if absent; CHECKSUM_MISMATCH if it fails its checks (counted in
  // corruptDropped) or has another size.
  Status getSnapshotRecordInto(const SnapshotKey& key, uint32_t slot, uint8_t* dest,
                               uint32_t bytes);
  // Deletes the manifest and own records of `key` (blocking). False if it had no manifest.
  // `broken`: dropped because it, or a record it needs, failed its checks or was gone (counted).
  Result<bool> eraseSnapshot(const SnapshotKey& key, bool broken);
  bool hasSnapshot(const SnapshotKey& key) const;  // an in-memory set: cheap
  // Above every snapshot id an earlier run may have handed out: the stored id limit, and every
  // manifest's id. Read at open.
  uint64_t snapshotIdFloor() const { return snapshotIdFloor_; }
  // Persists `limit`, a bound on every snapshot id handed out so far (blocking, synced).
  Status storeSnapshotIdLimit(uint64_t limit);

  ColdStats stats() const;
  const std::string& nodeId() const { return nodeId_; }

  // Test hook: the raw database and the blocks column family.
  rocksdb::DB* rawDb() { return db_.get(); }
  rocksdb::ColumnFamilyHandle* blocksFamily() { return blocks_; }
  rocksdb::ColumnFamilyHandle* snapshotsFamily() { return snapshots_; }

 private:
  ColdTier() = default;
  // Requires dbMu_ held exclusively (or no other user yet). `reopening`: after a failed write.
  // At start, a tier found damaged (by verifyTables, or by RocksDB's open) is moved aside.
  Status openDb(bool reopening = false);
  // openDb's RocksDB part: CHECKSUM_MISMATCH when RocksDB finds the tier damaged.
  Status openDbFiles(bool reopening);
  // Renames the tier to <path>.damaged (an earlier one removed), logs and counts it; the next
  // open creates a fresh tier with the inherited node id and snapshot id limit.
  Status moveAside(const std::string& reason);
  // Before a write: reopens the database if a write failed before, moving it aside first if the
  // failure was damage. Requires dbMu_ exclusively.
  Status reopenForWriteLocked();
  // After a failed write (or flush, or compaction, whose error RocksDB returns to later writes).
  void noteWriteError(const rocksdb::Status& s);
  // Reads and checks `key`'s record; hands its payload to `consume` while the read is pinned.
  // `consume` gets the verified payload and its checksum.
  using Consume = std::function<Status(std::string_view payload, uint64_t checksum)>;
  Status readVerified(const ColdKey& key, const Consume& consume);
  // What readVerified does with RocksDB's answer `s` (`value`) for record `k`. Requires dbMu_
  // (shared).
  Status checkRead(const ColdKey& key, const std::string& k, const rocksdb::Status& s,
                   std::string_view value, const Consume& consume);
  void closeDb();
  // Before RocksDB opens the tier: every table file read back whole against its checksums, in a
  // child process (no blob: the tables hold keys, blob references, size entries and small
  // records). RocksDB 7.8 parses a table's properties block before it checks it, reads of records
  // run without its checksums (readVerified), and over a damaged block Debian's RocksDB, built
  // with its assertions, aborts the process instead of failing; damage found here fails the open
  // with a typed error instead.
  Status verifyTables();
  // At open: the block records' keys and payload sizes from their size entries, reading no record;
  // an error if an entry is damaged.
  Status readSizes(std::vector<std::pair<std::string, uint32_t>>& records);
  // At open, for a tier of format 1 or when readSizes fails: the keys and sizes from the records
  // themselves (reads every one), written back as size entries (and the tier raised to format 2).
  Status rebuildSizes(std::vector<std::pair<std::string, uint32_t>>& records);
  // A block record and its size entry, written and deleted together (same batch).
  void putBlockRecord(rocksdb::WriteBatch& batch, const std::string& key, const std::string& header,
                      const uint8_t* data, uint32_t bytes);
  void deleteBlockRecord(rocksdb::WriteBatch& batch, const std::string& key);
  rocksdb::Status deleteBlockRecord(const std::string& key);  // through the log
  void touchLocked(const std::string& key);
  void enforceCapacity();
  void forgetLocked(const std::string& key);
  // Records `key` (payload `bytes`) as held, most recently accessed; `resident`: its block is in
  // memory too. Requires mu_.
  void holdLocked(const std::string& key, uint32_t bytes, bool resident = true);

  Options options_;
  std::shared_ptr<rocksdb::FileSystem> fileSystem_;  // the options' (or the default), chunked
  std::unique_ptr<rocksdb::Env> env_;
  // Held shared by every database call, exclusively to close or reopen the database.
  mutable std::shared_mutex dbMu_;
  std::unique_ptr<rocksdb::DB> db_;  // null only if a reopen failed
  // The open database's: it tracks the table and blob files' sizes (and deletes obsolete ones).
  // GUARDED_BY(mu_): stats() copies it under mu_ alone and asks it outside every tier lock.
  std::shared_ptr<rocksdb::SstFileManager> fileManager_;
  // A write failed: reopen before the next one. Set by writers holding dbMu_ shared, cleared
  // under it exclusively.
  std::atomic<bool> needsReopen_ = false;
  // Takes dbMu_ shared with the database open for writes (reopening it first, exclusively, after
  // a failed write).
  Status lockForWrite(std::shared_lock<std::shared_mutex>& lock);
  rocksdb::ColumnFamilyHandle* blocks_ = nullptr;
  rocksdb::ColumnFamilyHandle* snapshots_ = nullptr;
  rocksdb::ColumnFamilyHandle* meta_ = nullptr;
  rocksdb::ColumnFamilyHandle* default_ = nullptr;
  std::string nodeId_;
  // What a damaged tier had, for the fresh one that replaces it (moveAside): its node id and its
  // snapshot id limit (0: unknown), read by the check at open or kept from this run.
  std::string inheritedNodeId_;
  uint64_t inheritedSnapshotIds_ = 0;
  uint64_t storedSnapshotIds_ = 0;  // the last limit storeSnapshotIdLimit wrote
  // Set by a write, flush or compaction that found the tier damaged (noteWriteError): the next
  // reopen moves it aside. damageSeen_ (under mu_) is what RocksDB said.
  std::atomic<bool> damaged_ = false;
  std::string damageSeen_;

  mutable std::mutex mu_;
  // Keys of records held only here, in the order their blocks left memory (or, after a restart,
  // key order), front first to go; and of resident records, in access order. GUARDED_BY(mu_)
  std::list<std::string> order_, residentOrder_;
  std::list<std::string>& orderOf(bool resident) { return resident ? residentOrder_ : order_; }
  struct Held {
    std::list<std::string>::iterator pos;
    uint32_t bytes;
    bool resident;
  };
  std::unordered_map<std::string, Held> held_;  // GUARDED_BY(mu_)
  // Manifest key -> the block records it names. GUARDED_BY(mu_)
  std::unordered_map<std::string, std::vector<std::string>> manifests_;
  // Block record -> how many manifests name it: such records are kept out of the capacity bound's
  // reach until their snapshots are dropped. GUARDED_BY(mu_)
  std::unordered_map<std::string, uint32_t> namedBy_;
  void nameLocked(const std::string& manifest, std::vector<std::string> blocks);
  void unnameLocked(const std::string& manifest);
  ColdStats stats_;               // GUARDED_BY(mu_)
  uint64_t snapshotIdFloor_ = 1;  // set by openDb
};

}  // namespace kvtier
