// The cold tier's open: the check of its tables in a process of its own, a damaged tier moved
// aside, RocksDB's options, the index rebuilt from the size entries; and its close.
#include "daemon/cold_tier.h"

#include "daemon/cold_tier_internal.h"

namespace kvtier {

using namespace cold_internal;

namespace {

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

}  // namespace

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

}  // namespace kvtier
