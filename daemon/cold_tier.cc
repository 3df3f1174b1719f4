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

namespace kvtier {
namespace {

constexpr size_t kKeyBytes = 8 + 16 + 16;
// A header is a few words; anything larger is corruption.
constexpr uint32_t kMaxHeaderBytes = 1024;
constexpr const char* kFormatVersionKey = "format_version";
// The tier's layout, in "meta" under kFormatVersionKey (records carry their own format in their
// header). 1: block records only. 2: and a size entry beside each block record (see sizeKey). A
// tier of format 1 is indexed and raised to 2 at open; a kvtierd that reads only 1 refuses 2, so
// it cannot write records without their size entries into a tier that relies on them.
constexpr uint32_t kTierFormat = 2;
constexpr uint32_t kTierFormatWithoutSizes = 1;
// Every snapshot id handed out is below the stored limit (decimal); see storeSnapshotIdLimit.
constexpr const char* kSnapshotIdLimitKey = "snapshot_id_limit";
constexpr char kManifestTag = 'M';
constexpr char kRecordTag = 'R';
constexpr size_t kSnapshotPrefixBytes = 1 + 8 + 16 + 8;
// Obsolete files (old blob and table files) are deleted in the background, truncated this much at
// a time (see openDb), at up to this rate. The manager would delete at once, unpaced, whenever
// the trash passed a ratio of the files it tracks; the ratio is set out of reach, so that the rate
// alone paces deletions (the trash, on disk beyond --disk-bytes meanwhile: docs/performance.md).
constexpr uint64_t kDeleteChunkBytes = 4 << 20;
constexpr int64_t kDeleteBytesPerSecond = int64_t{1} << 30;
constexpr double kMaxTrashRatio = 1e6;

// Gives RocksDB's flush and compaction threads a long scheduler slice as they start a job (RocksDB
// has no hook for a pool thread's start; these run on the job's thread), so that any thread that
// wakes, the event loop or a client, takes their core at once (daemon/scheduling.h).
class BackgroundSliceListener final : public rocksdb::EventListener {
 public:
  const char* Name() const override { return "kvtier.BackgroundSlice"; }
  void OnFlushBegin(rocksdb::DB*, const rocksdb::FlushJobInfo&) override {
    (void)requestSlice(kBackgroundSlice);
  }
  void OnCompactionBegin(rocksdb::DB*, const rocksdb::CompactionJobInfo&) override {
    (void)requestSlice(kBackgroundSlice);
  }
  void OnSubcompactionBegin(const rocksdb::SubcompactionJobInfo&) override {
    (void)requestSlice(kBackgroundSlice);
  }
};

void appendBigEndian(std::string& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<char>(v >> (8 * i)));
}

// The name a snapshot's own record carries in its header (where a block record has its key), so
// that a record is never accepted under another snapshot's or slot's name.
Key128 recordName(uint64_t id, uint32_t slot) {
  Key128 k;
  for (int i = 0; i < 8; ++i) k.bytes[i] = static_cast<uint8_t>(id >> (8 * i));
  for (int i = 0; i < 4; ++i) k.bytes[8 + i] = static_cast<uint8_t>(slot >> (8 * i));
  std::memcpy(k.bytes.data() + 12, "snap", 4);
  return k;
}

// The block records a manifest names (encoded keys): the capacity bound keeps them.
std::vector<std::string> namedRecords(const SnapshotManifest& m) {
  std::vector<std::string> named;
  for (const auto& b : m.blocks) {
    if (b.kind == ManifestBlock::Kind::kSealed) {
      named.push_back(ColdKey{m.fingerprint, m.salt, b.key}.encode());
    }
  }
  return named;
}

// A record's value in a write batch: its header, then its payload read in place (no copy).
void putRecord(rocksdb::WriteBatch& batch, rocksdb::ColumnFamilyHandle* family,
               const std::string& key, const std::string& header, const uint8_t* data,
               uint32_t bytes) {
  const rocksdb::Slice k(key);
  const rocksdb::Slice value[2] = {rocksdb::Slice(header),
                                   rocksdb::Slice(reinterpret_cast<const char*>(data), bytes)};
  batch.Put(family, rocksdb::SliceParts(&k, 1), rocksdb::SliceParts(value, 2));
}

// A write batch entry's bytes besides its key and value: a tag, a column family id and two
// varint lengths (at most 1 + 5 + 5 + 5), with the batch's own 12-byte header counted once per
// entry to keep it simple.
constexpr size_t kBatchEntryOverhead = 32;

// Writes other than spill batches (snapshots, deletes) go through the write-ahead log.
rocksdb::WriteOptions blockWriteOptions() { return rocksdb::WriteOptions(); }

// A block record's size entry lives in the blocks family beside it, under the record's key behind
// this prefix: 49 bytes where a record key has 40, in a range of its own (a record key would need
// a fingerprint of all ones and a salt starting with 0xff to fall in it, and it would still be
// told apart by its length). Same family, same batch, same flush: the two are on disk together
// or not at all, without the log. Its value: the payload size, 4 bytes little-endian (below
// min_blob_size, so it stays in the table and a scan of the entries reads no blob).
const std::string kSizePrefix(9, '\xff');
constexpr size_t kSizeKeyBytes = 9 + kKeyBytes;

std::string sizeKey(const std::string& recordKey) { return kSizePrefix + recordKey; }

bool isSizeKey(const rocksdb::Slice& key) {
  return key.size() == kSizeKeyBytes && key.starts_with(kSizePrefix);
}

std::string encodeSize(uint32_t bytes) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(bytes >> (8 * i));
  return out;
}

bool decodeSize(const rocksdb::Slice& in, uint32_t* bytes) {
  if (in.size() != 4) return false;
  *bytes = 0;
  for (int i = 0; i < 4; ++i) *bytes |= uint32_t{static_cast<uint8_t>(in[i])} << (8 * i);
  return true;
}

// RocksDB's own log, into the daemon's (warnings and errors; the rest is dropped) rather than into
// a LOG file in the data directory: when the disk filled up, a failed write to that file left
// its writer in an error state, and the next message — RocksDB logs the error itself — hit an
// assertion in that writer (Debian builds RocksDB with assertions on): kvtierd aborted as its
// disk filled, and could not start on a full disk at all (scripts/chaos.sh found it).
class DaemonLogForRocksDb final : public rocksdb::Logger {
 public:
  DaemonLogForRocksDb() : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel() || level == rocksdb::InfoLogLevel::HEADER_LEVEL) return;
    char text[1024];
    std::vsnprintf(text, sizeof text, format, ap);
    std::string fields = "message=\"";
    for (const char* c = text; *c != '\0'; ++c) {
      if (*c == '"' || *c == '\\') fields += '\\';
      fields += (*c == '\n' || *c == '\r') ? ' ' : *c;
    }
    fields += '"';
    logWarn("rocksdb", fields);
  }
};

// Values from this size on go to blob files (integrated BlobDB); smaller ones stay in the tables.
constexpr uint64_t kMinBlobBytes = 4096;

// A spill batch of large blocks skips the write-ahead log and is flushed at once instead
// (ColdTier::putBatch): each block is written once, to a synced blob file, rather than twice (log,
// then blob file) — and the log's checksum, computed in software by Debian's portable RocksDB
// build, cost the spill worker about as much CPU as everything else it does
// (docs/performance.md). A batch of small blocks (below kMinBlobBytes, kept in the tables) goes
// through the log instead: a flush per batch made a level-0 table per batch — hundreds of tables of
// a few KiB under a replay of small blocks, writes stalled at 48 of them, and the puts waiting for
// room with them (docs/cache-policy.md, "The cold tier's speed").
rocksdb::WriteOptions spillWriteOptions(bool logged) {
  rocksdb::WriteOptions options;
  options.disableWAL = !logged;
  return options;
}
constexpr const char* kNodeIdKey = "node_id";

Error unavailable(const rocksdb::Status& s, const char* what) {
  return makeError(ErrorCode::kUnavailable, what, ": ", s.ToString());
}

// The value's first part: a 4-byte header size and the header. The payload follows as a second
// slice of the write batch, read straight from the pool block (no intermediate copy).
std::string encodeHeader(const ColdRecord& r) {
  capnp::MallocMessageBuilder message;
  auto h = message.initRoot<disk::ColdRecordHeader>();
  h.setFormatVersion(disk::FORMAT_VERSION);
  h.setFingerprint(r.key.fingerprint);
  h.setSalt(capnp::Data::Reader(r.key.salt.data(), r.key.salt.size()));
  h.setKey(capnp::Data::Reader(r.key.key.bytes.data(), r.key.key.bytes.size()));
  h.setBytes(r.bytes);
  h.setChecksum(r.checksum ? *r.checksum : XXH3_64bits(r.data, r.bytes));
  auto words = capnp::messageToFlatArray(message);
  auto header = words.asBytes();
  std::string out(4 + header.size(), '\0');
  const uint32_t size = static_cast<uint32_t>(header.size());
  std::memcpy(out.data(), &size, 4);
  std::memcpy(out.data() + 4, header.begin(), header.size());
  return out;
}

}  // namespace

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

Result<std::unique_ptr<ColdTier>> ColdTier::open(const Options& options) {
  auto tier = std::unique_ptr<ColdTier>(new ColdTier());
  tier->options_ = options;
  // Every file write goes down in short pieces (daemon/chunked_write_fs.h): a long write(2) would
  // hold a core that a lookup is waiting for.
  std::shared_ptr<rocksdb::RateLimiter> limiter;
  if (options.writeBytesPerSecond > 0) {
    // Every write, not only flushes and compactions (RocksDB's own use of a limiter): the tier's
    // writes are mostly flushes of spill batches, and the log of small ones.
    limiter.reset(rocksdb::NewGenericRateLimiter(static_cast<int64_t>(options.writeBytesPerSecond),
                                                 100 * 1000 /* refill every 100 ms */, 10,
                                                 rocksdb::RateLimiter::Mode::kAllIo));
  }
  tier->fileSystem_ = std::make_shared<ChunkedWriteFileSystem>(
      options.fileSystem ? options.fileSystem : rocksdb::FileSystem::Default(),
      ChunkedWriteFileSystem::kDefaultChunkBytes, std::move(limiter));
  tier->env_ = rocksdb::NewCompositeEnv(tier->fileSystem_);
  if (auto s = tier->openDb(); !s) return s.error();
  tier->enforceCapacity();
  return tier;
}

Status ColdTier::openDb(bool reopening) {
  bool movedAside = false;
  if (!reopening) {
    auto checked = verifyTables();
    if (!checked && checked.code() != ErrorCode::kChecksumMismatch) return checked;
    if (!checked) {
      if (auto aside = moveAside(checked.error().message()); !aside) return aside;
      movedAside = true;
    }
  }
  auto opened = openDbFiles(reopening);
  if (!opened && opened.code() == ErrorCode::kChecksumMismatch && !reopening && !movedAside) {
    // Damage the check cannot see (the tier's manifest, its CURRENT file, a log): the same.
    if (auto aside = moveAside(opened.error().message()); !aside) return aside;
    opened = openDbFiles(reopening);
  }
  return opened;
}

Status ColdTier::moveAside(const std::string& reason) {
  // A damaged tier never keeps the daemon down: it is moved aside whole (kvtier never reads it
  // again; an operator may look at it, or remove it) and a fresh one takes its place, under the
  // same node id and above every snapshot id handed out before. What memory holds is served as
  // before; what only the damaged tier held is a miss.
  const std::string aside = options_.path + ".damaged";
  std::error_code ec;
  std::filesystem::remove_all(aside, ec);  // an earlier one
  std::filesystem::rename(options_.path, aside, ec);
  if (ec) {
    return makeError(ErrorCode::kUnavailable, reason, "; moving the tier aside to ", aside,
                     " failed: ", ec.message());
  }
  if (inheritedSnapshotIds_ == 0) {
    // The old tier's limit could not be read: ids start above the clock in microseconds, which
    // ids counted up from 1 do not reach.
    inheritedSnapshotIds_ =
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count());
  }
  logWarn("cold_tier_quarantined",
          "path=" + options_.path + " moved_to=" + aside + " reason=\"" + reason + "\"");
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.quarantined;
  return {};
}

Status ColdTier::openDbFiles(bool reopening) {
  rocksdb::DBOptions dbOptions;
  dbOptions.create_if_missing = true;
  dbOptions.create_missing_column_families = true;
  dbOptions.env = env_.get();
  dbOptions.info_log = std::make_shared<DaemonLogForRocksDb>();
  // RocksDB's flush and compaction threads yield to the event loop serving hot lookups.
  dbOptions.env->LowerThreadPoolCPUPriority(rocksdb::Env::Priority::HIGH);
  dbOptions.env->LowerThreadPoolCPUPriority(rocksdb::Env::Priority::LOW);
  // No system call that runs for milliseconds: on a kernel that does not preempt system calls
  // (preempt=none) it holds a core a lookup may be waiting for. So writeback is started every
  // 512 KiB rather than all at once in the fdatasync that ends a file, and obsolete files are
  // truncated away 4 MiB at a time in the background (one unlink dropping a large file's cached
  // pages took up to 40 ms). (Recycling log files would avoid deleting them at all, but RocksDB
  // 7.8 turns recycle_log_file_num off under the point-in-time recovery kept here.) After a
  // failed write (a full disk) the reopen deletes at once: trash must not hold the space the
  // reopen needs.
  dbOptions.listeners.push_back(std::make_shared<BackgroundSliceListener>());
  dbOptions.bytes_per_sync = 512 << 10;
  dbOptions.wal_bytes_per_sync = 512 << 10;
  // Spill batches of small blocks go through the log (putBatch): a log file stays until every
  // family with entries in it is flushed, so the rarely written families (the tier's metadata)
  // are flushed once the logs hold this much, rather than keeping every log until a restart.
  dbOptions.max_total_wal_size = uint64_t{256} << 20;
  // The manager empties its trash (truncate, fsync, unlink) on a thread it starts as it is made,
  // and RocksDB has no priority setting for that thread: it ran at the event loop's priority,
  // traced holding a core while hot lookups waited. So the manager is made on a short-lived
  // thread that has lowered itself first; the trash thread inherits its niceness, slice and name.
  std::thread([&] {
    lowerCallingThread(kTrashThreadName);
    dbOptions.sst_file_manager.reset(rocksdb::NewSstFileManager(
        dbOptions.env, fileSystem_, nullptr, "", reopening ? 0 : kDeleteBytesPerSecond, true,
        nullptr, kMaxTrashRatio, kDeleteChunkBytes));
  }).join();
  rocksdb::ColumnFamilyOptions blocks;
  blocks.enable_blob_files = true;  // integrated BlobDB: KV blocks are large values
  blocks.min_blob_size = kMinBlobBytes;
  blocks.enable_blob_garbage_collection = true;
  // Every spill batch is flushed (putBatch), so level 0 gets a file per batch (16 MiB of blocks)
  // rather than per 64 MiB memtable: compact (and collect blob garbage) after as many bytes as
  // with the defaults (16 x 16 MiB against 4 x 64 MiB); writers slow down at 48 files (768 MiB)
  // and stop at 64.
  blocks.level0_file_num_compaction_trigger = 16;
  blocks.level0_slowdown_writes_trigger = 48;
  blocks.level0_stop_writes_trigger = 64;
  // A read looks in every level-0 table whose key range holds its key, and block keys are hashes,
  // so every such table's range holds every key: with a table per batch (up to 16 in level 0
  // before a compaction) a Bloom filter lets a read skip the tables without its key (10 bits per
  // key, ~1% false positives; promote 6304 -> 7412 blocks/s in back-to-back 5-repetition runs).
  rocksdb::BlockBasedTableOptions table;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  // Table blocks are verified on every read (readVerified): XXH3 costs a fraction of the CRC32C
  // Debian's portable RocksDB computes in software. (Each table names its own kind: tables
  // written before are read as they are.)
  table.checksum = rocksdb::kXXH3;
  blocks.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  // Snapshots hold their own records (blocks, checkpoints) and manifests: large values too.
  const rocksdb::ColumnFamilyOptions& snapshots = blocks;
  std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
      {"blocks", blocks},
      {"snapshots", snapshots},
      {"meta", rocksdb::ColumnFamilyOptions()}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  const bool existed = std::filesystem::exists(options_.path + "/CURRENT");
  rocksdb::Status s = rocksdb::DB::Open(dbOptions, options_.path, families, &handles, &db);
  // A file the tier's own records name and that is not there (a CURRENT file naming a manifest
  // that does not exist) is damage too.
  if (s.IsCorruption() || (existed && s.IsPathNotFound())) {
    return makeError(ErrorCode::kChecksumMismatch, "cold tier at ", options_.path, " is damaged (",
                     s.ToString(), ")");
  }
  if (!s.ok()) return unavailable(s, "cannot open the cold tier");
  db_.reset(db);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fileManager_ = dbOptions.sst_file_manager;
  }
  default_ = handles[0];
  blocks_ = handles[1];
  snapshots_ = handles[2];
  meta_ = handles[3];

  std::string version;
  s = db->Get(rocksdb::ReadOptions(), meta_, kFormatVersionKey, &version);
  if (s.IsNotFound()) {
    std::random_device random;
    char id[17];
    std::snprintf(id, sizeof id, "%08x%08x", random(), random());
    rocksdb::WriteBatch batch;
    batch.Put(meta_, kFormatVersionKey, std::to_string(kTierFormat));
    batch.Put(meta_, kNodeIdKey, inheritedNodeId_.empty() ? std::string(id) : inheritedNodeId_);
    if (inheritedSnapshotIds_ != 0) {
      batch.Put(meta_, kSnapshotIdLimitKey, std::to_string(inheritedSnapshotIds_));
    }
    s = db->Write(rocksdb::WriteOptions(), &batch);
    if (!s.ok()) return unavailable(s, "cannot initialise the cold tier");
  } else if (!s.ok()) {
    return unavailable(s, "cannot read the cold tier's format version");
  } else if (version != std::to_string(kTierFormat) &&
             version != std::to_string(kTierFormatWithoutSizes)) {
    return makeError(ErrorCode::kUnavailable, "cold tier at ", options_.path, " has format ",
                     version, ", this kvtierd reads ", kTierFormatWithoutSizes, " and ",
                     kTierFormat);
  }
  (void)db->Get(rocksdb::ReadOptions(), meta_, kNodeIdKey, &nodeId_);

  // Snapshot ids: above the stored limit and above every manifest's id.
  uint64_t floor = 1;
  std::string limit;
  s = db->Get(rocksdb::ReadOptions(), meta_, kSnapshotIdLimitKey, &limit);
  if (s.ok()) {
    char* end = nullptr;
    const unsigned long long stored = std::strtoull(limit.c_str(), &end, 10);
    if (limit.empty() || *end != '\0') {
      // Ids handed out before could not be told apart from new ones: refuse rather than guess.
      return makeError(ErrorCode::kUnavailable, "cold tier at ", options_.path,
                       " has an unreadable snapshot id limit '", limit, "'");
    }
    floor = std::max<uint64_t>(floor, stored);
  } else if (!s.IsNotFound()) {
    return unavailable(s, "cannot read the cold tier's snapshot id limit");
  }
  std::unordered_map<std::string, std::vector<std::string>> manifests;
  {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), snapshots_));
    for (it->Seek(std::string(1, kManifestTag));
         it->Valid() && it->key().size() > 0 && it->key()[0] == kManifestTag; it->Next()) {
      if (it->key().size() != kSnapshotPrefixBytes) continue;
      uint64_t id = 0;
      for (size_t i = kSnapshotPrefixBytes - 8; i < kSnapshotPrefixBytes; ++i) {
        id = id << 8 | static_cast<uint8_t>(it->key()[i]);
      }
      if (id != std::numeric_limits<uint64_t>::max()) floor = std::max(floor, id + 1);
      // The block records it names, kept from the capacity bound. A manifest that does not
      // decode names none: it is dropped when a call loads it.
      SnapshotKey key{0, {}, id};
      for (int i = 0; i < 8; ++i) {
        key.fingerprint |= uint64_t{static_cast<uint8_t>(it->key()[1 + i])} << (8 * i);
      }
      std::memcpy(key.salt.data(), it->key().data() + 9, key.salt.size());
      std::vector<std::string> named;
      const auto v = it->value();
      if (auto m =
              decodeManifest(std::string_view(v.data(), v.size()), key.fingerprint, key.salt, id)) {
        named = namedRecords(*m);
      }
      manifests.emplace(it->key().ToString(), std::move(named));
    }
  }

  // The key set and sizes, in key order (access order is not kept across restarts).
  std::vector<std::pair<std::string, uint32_t>> records;
  if (auto indexed = version == std::to_string(kTierFormatWithoutSizes)
                         ? Status(makeError(ErrorCode::kNotFound, "tier format ", version,
                                            " has no size entries"))
                         : readSizes(records);
      !indexed) {
    // Expected once after an upgrade (no index yet); anything else is damage, worth a warning.
    (indexed.error().code() == ErrorCode::kNotFound ? logInfo : logWarn)(
        "cold_sizes_rebuilt", "reason=\"" + indexed.error().message() + "\"");
    if (auto rebuilt = rebuildSizes(records); !rebuilt) return rebuilt;
  }
  std::lock_guard<std::mutex> lock(mu_);
  order_.clear();
  residentOrder_.clear();
  held_.clear();
  stats_.bytes = 0;
  // Memory is empty after a start: no record is resident.
  for (const auto& [key, bytes] : records) holdLocked(key, bytes, /*resident=*/false);
  stats_.records = held_.size();
  manifests_.clear();
  namedBy_.clear();
  for (auto& [key, named] : manifests) nameLocked(key, std::move(named));
  stats_.snapshots = manifests_.size();
  snapshotIdFloor_ = std::max(snapshotIdFloor_, floor);
  return {};
}

int checkColdTables(const std::string& path, int out) {
  const rlimit noCore{0, 0};
  ::setrlimit(RLIMIT_CORE, &noCore);  // an abort over a damaged block leaves no core file
  const auto say = [out](const std::string& line) {
    const std::string text = line + "\n";
    (void)!::write(out, text.data(), text.size());
  };
  rocksdb::DBOptions dbOptions;
  std::vector<std::string> names;
  rocksdb::Status s = rocksdb::DB::ListColumnFamilies(dbOptions, path, &names);
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* opened = nullptr;
  const auto openReadOnly = [&](const std::vector<std::string>& wanted) {
    std::vector<rocksdb::ColumnFamilyDescriptor> families;
    for (const std::string& name : wanted)
      families.emplace_back(name, rocksdb::ColumnFamilyOptions());
    return rocksdb::DB::OpenForReadOnly(dbOptions, path, families, &handles, &opened);
  };
  // First the tier's identity, for a fresh tier to keep should this one be moved aside: its node
  // id and snapshot id limit, from the metadata family alone (a read-only open of a subset opens
  // only those families' tables), read with checksums.
  if (s.ok() && std::find(names.begin(), names.end(), "meta") != names.end() &&
      openReadOnly({rocksdb::kDefaultColumnFamilyName, "meta"}).ok()) {
    std::unique_ptr<rocksdb::DB> db(opened);
    rocksdb::ReadOptions checked;
    checked.verify_checksums = true;
    std::string id, limit;
    if (db->Get(checked, handles[1], kNodeIdKey, &id).ok() && !id.empty() && id.size() <= 64 &&
        id.find_first_of(" \n") == std::string::npos) {
      say("node " + id);
    }
    if (db->Get(checked, handles[1], kSnapshotIdLimitKey, &limit).ok() && !limit.empty() &&
        limit.size() < 20 && limit.find_first_not_of("0123456789") == std::string::npos) {
      say("snapshot_ids " + limit);
    }
    for (auto* handle : handles) (void)db->DestroyColumnFamilyHandle(handle);
    handles.clear();
  }
  if (s.ok()) s = openReadOnly(names);
  if (!s.ok()) {
    // Anything but damage (a directory it cannot read, an option it does not know) is for the
    // real open to report.
    if (!s.IsCorruption()) return 0;
    say("bad " + s.ToString());
    return 1;
  }
  std::unique_ptr<rocksdb::DB> db(opened);
  std::vector<rocksdb::LiveFileMetaData> files;
  db->GetLiveFilesMetaData(&files);
  for (auto* handle : handles) (void)db->DestroyColumnFamilyHandle(handle);
  db.reset();
  for (const rocksdb::LiveFileMetaData& f : files) {
    const std::string table = f.db_path + (f.name.starts_with('/') ? "" : "/") + f.name;
    say("table " + table);
    rocksdb::SstFileReader reader{rocksdb::Options()};
    s = reader.Open(table);
    if (s.ok()) s = reader.VerifyChecksum();
    if (!s.ok()) {
      say("bad " + s.ToString());
      return 1;
    }
  }
  return 0;
}

namespace {

// The program verifyTables runs: the option's, $KVTIER_COLD_CHECKER's, or this build's kvtierd.
std::string checkerProgram(const std::string& configured) {
  if (!configured.empty()) return configured;
  if (const char* env = std::getenv("KVTIER_COLD_CHECKER"); env && *env) return env;
  return KVTIER_BUILT_KVTIERD;
}

}  // namespace

Status ColdTier::verifyTables() {
  std::error_code error;
  if (!std::filesystem::exists(options_.path + "/CURRENT", error)) return {};  // a new tier
  int pipe[2];
  if (::pipe2(pipe, O_CLOEXEC) != 0) {
    return makeError(ErrorCode::kUnavailable,
                     "cannot check the cold tier's tables: pipe: ", std::strerror(errno));
  }
  // In a process of its own: over a damaged block RocksDB may call abort() (cold_tier.h), which
  // must end the check, not the daemon. A fresh one (spawned, not a fork of this one): a fork
  // would inherit whatever lock another thread of this process held at that moment (an
  // allocator's, RocksDB's), and the check could wait on it for ever.
  std::string program = checkerProgram(options_.checker);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attributes, &none);  // kvtierd blocks SIGTERM in every thread
  posix_spawnattr_setsigdefault(&attributes, &all);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::string flag = "--check-cold-tier", dir = options_.path;
  char* argv[] = {program.data(), flag.data(), dir.data(), nullptr};
  pid_t child = -1;
  const int spawned = ::posix_spawn(&child, program.c_str(), &actions, &attributes, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (spawned != 0) {
    ::close(pipe[0]);
    ::close(pipe[1]);
    return makeError(ErrorCode::kUnavailable, "cannot check the cold tier's tables: cannot run ",
                     program, ": ", std::strerror(spawned));
  }
  ::close(pipe[1]);
  // A deadline: a minute, and a second for every 50 MB of tables (the check reads ~0.5 GB/s here).
  uint64_t tableBytes = 0;
  for (const auto& f : std::filesystem::directory_iterator(options_.path, error)) {
    if (f.path().extension() == ".sst") tableBytes += f.file_size(error);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60) +
                        std::chrono::seconds(tableBytes / (50u << 20));
  std::string said;
  char buffer[4096];
  bool late = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd ready{pipe[0], POLLIN, 0};
    const int polled = ::poll(&ready, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (polled == 0) {
      late = true;
      ::kill(child, SIGKILL);
      break;
    }
    if (polled < 0) {
      if (errno == EINTR) continue;
      ::kill(child, SIGKILL);
      break;
    }
    const ssize_t n = ::read(pipe[0], buffer, sizeof buffer);
    if (n > 0) {
      said.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(pipe[0]);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) {
      return makeError(ErrorCode::kUnavailable,
                       "cannot check the cold tier's tables: waitpid: ", std::strerror(errno));
    }
  }
  if (late) {
    return makeError(ErrorCode::kUnavailable, "the check of the cold tier's tables at ",
                     options_.path, " did not finish in time");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  // The check's last lines: the table it was reading, and why it stopped if it could say.
  std::string table, why;
  for (size_t at = 0; at < said.size();) {
    const size_t end = std::min(said.find('\n', at), said.size());
    const std::string_view line(said.data() + at, end - at);
    if (line.starts_with("table ")) table = line.substr(6);
    if (line.starts_with("node ")) inheritedNodeId_ = line.substr(5);
    if (line.starts_with("snapshot_ids ")) {
      inheritedSnapshotIds_ = std::strtoull(std::string(line.substr(13)).c_str(), nullptr, 10);
    }
    if (line.starts_with("bad ")) why = line.substr(4);
    at = end + 1;
  }
  if (why.empty() && !WIFSIGNALED(status)) {
    // Not an answer about the tables (a program that does not know the check, say).
    return makeError(ErrorCode::kUnavailable, "cannot check the cold tier's tables: ", program,
                     " --check-cold-tier ended with status ",
                     WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  if (why.empty()) {
    why = "RocksDB ended the check with signal " + std::to_string(WTERMSIG(status));
  }
  return makeError(ErrorCode::kChecksumMismatch, "cold tier at ", options_.path, " is damaged",
                   table.empty() ? std::string() : ": table " + table, " (", why, ")");
}

Status ColdTier::readSizes(std::vector<std::pair<std::string, uint32_t>>& records) {
  records.clear();
  // Checksums on (the entries are a few bytes each): a damaged table means a rebuild, never wrong
  // sizes or keys.
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), blocks_));
  for (it->Seek(kSizePrefix); it->Valid() && it->key().starts_with(kSizePrefix); it->Next()) {
    if (!isSizeKey(it->key())) continue;  // a record key that sorts here
    ColdKey key;
    uint32_t bytes = 0;
    const std::string_view recordKey(it->key().data() + kSizePrefix.size(), kKeyBytes);
    if (!ColdKey::decode(recordKey, &key) || !decodeSize(it->value(), &bytes)) {
      return makeError(ErrorCode::kChecksumMismatch, "a size entry is invalid");
    }
    records.emplace_back(recordKey, bytes);
  }
  if (!it->status().ok()) return unavailable(it->status(), "cannot read the size entries");
  return {};
}

Status ColdTier::rebuildSizes(std::vector<std::pair<std::string, uint32_t>>& records) {
  records.clear();
  // RocksDB 7.8's iterator reads every blob to give its value (only the size is wanted here), so
  // without filling the block cache. With checksums, although they cost a CRC32C of every blob:
  // this scan runs when the size entries are missing or damaged, and an iterator over table
  // blocks it has not checked can meet keys out of order, which Debian's RocksDB (built with
  // assertions) answers with abort() instead of an error.
  rocksdb::ReadOptions scanOptions;
  scanOptions.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(scanOptions, blocks_));
  std::vector<std::string> sizeKeys;  // the size entries there are now, valid or not
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    ColdKey key;
    if (isSizeKey(it->key())) {
      sizeKeys.push_back(it->key().ToString());
      continue;
    }
    if (!ColdKey::decode(std::string_view(it->key().data(), it->key().size()), &key)) continue;
    uint32_t headerBytes = 0;
    const auto v = it->value();
    if (v.size() >= 4) std::memcpy(&headerBytes, v.data(), 4);
    const uint32_t payload = v.size() >= 4 + uint64_t{headerBytes}
                                 ? static_cast<uint32_t>(v.size() - 4 - headerBytes)
                                 : 0;
    records.emplace_back(it->key().ToString(), payload);
  }
  if (!it->status().ok()) {
    // Records past the failed read would have no entry and be held by no one for good: serve
    // what was seen for this run, write nothing, and scan again at the next open.
    logWarn("cold_sizes_unsaved", "reason=\"" + it->status().ToString() + "\"");
    return {};
  }
  it.reset();
  // The entries replaced whole, with the tier's format, in one logged batch.
  rocksdb::WriteBatch batch;
  for (const auto& k : sizeKeys) batch.Delete(blocks_, k);
  for (const auto& [key, bytes] : records) batch.Put(blocks_, sizeKey(key), encodeSize(bytes));
  batch.Put(meta_, kFormatVersionKey, std::to_string(kTierFormat));
  rocksdb::WriteOptions synced;
  synced.sync = true;
  if (const rocksdb::Status s = db_->Write(synced, &batch); !s.ok()) {
    // Not fatal: the records are known for this run; the next open scans again. (A database
    // that now refuses writes fails the next one, which reopens it as after any failed write.)
    logWarn("cold_sizes_unsaved", "reason=\"" + s.ToString() + "\"");
  }
  return {};
}

void ColdTier::closeDb() {
  if (!db_) return;
  (void)db_->Flush(rocksdb::FlushOptions(), {default_, blocks_, snapshots_, meta_});
  for (auto* h : {blocks_, snapshots_, meta_, default_}) {
    if (h) (void)db_->DestroyColumnFamilyHandle(h);
  }
  blocks_ = snapshots_ = meta_ = default_ = nullptr;
  (void)db_->Close();
  db_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  fileManager_.reset();  // the last reference: it goes with its database, as before
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
  // header (its key, size and xxh3) below. The cost is measured (docs/performance.md, "Cold
  // tier").
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
