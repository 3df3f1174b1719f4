#include "daemon/cold_tier.h"
#include "tests/full_disk_fs.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>
#include <rocksdb/file_system.h>
#include <rocksdb/table_properties.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>

namespace kvtier {
namespace {

// The cold tier's directory inside a test's temporary directory.
class TempDir {
 public:
  std::string path() const { return dir_.file("cold"); }

 private:
  test::TempDir dir_;
};

ColdKey keyOf(uint8_t n) {
  ColdKey k;
  k.fingerprint = 0x1234;
  k.salt.fill(7);
  k.key.bytes.fill(n);
  return k;
}

std::vector<uint8_t> payload(uint8_t n, size_t size = 16384) {
  std::vector<uint8_t> out(size);
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(i * 31 + n);
  return out;
}

Status put(ColdTier& tier, uint8_t n, size_t size = 16384) {
  const auto bytes = payload(n, size);
  const ColdRecord r{keyOf(n), bytes.data(), static_cast<uint32_t>(bytes.size())};
  return tier.putBatch(std::span(&r, 1));
}

// The tier's database opened directly, with all its column families (in openDb's order), for
// tests that change it under the tier's feet while the tier is closed.
class RawDb {
 public:
  enum Family { kDefault, kBlocks, kSnapshots, kMeta };
  explicit RawDb(const std::string& path) {
    std::vector<rocksdb::ColumnFamilyDescriptor> families = {
        {rocksdb::kDefaultColumnFamilyName, {}}, {"blocks", {}}, {"snapshots", {}}, {"meta", {}}};
    rocksdb::DB* raw = nullptr;
    const rocksdb::Status s = rocksdb::DB::Open({}, path, families, &handles_, &raw);
    EXPECT_TRUE(s.ok()) << s.ToString();
    db_.reset(raw);
  }
  ~RawDb() {
    for (auto* h : handles_) (void)db_->DestroyColumnFamilyHandle(h);
  }
  rocksdb::DB& db() { return *db_; }
  rocksdb::ColumnFamilyHandle* family(Family f) { return handles_.at(f); }

 private:
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
};

// Counts the bytes read from blob files (where block records' bytes live), and fails those reads
// once `readsLeft` (when not negative) runs out.
class BlobReadCounter final : public rocksdb::FileSystemWrapper {
 public:
  BlobReadCounter() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "BlobReadCounter"; }
  std::atomic<uint64_t> bytes{0};
  std::atomic<int64_t> readsLeft{-1};

  rocksdb::IOStatus NewRandomAccessFile(const std::string& name,
                                        const rocksdb::FileOptions& options,
                                        std::unique_ptr<rocksdb::FSRandomAccessFile>* result,
                                        rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->NewRandomAccessFile(name, options, result, dbg);
    if (s.ok() && name.ends_with(".blob")) {
      *result = std::make_unique<File>(std::move(*result), bytes, readsLeft);
    }
    return s;
  }

 private:
  class File final : public rocksdb::FSRandomAccessFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSRandomAccessFile> f, std::atomic<uint64_t>& bytes,
         std::atomic<int64_t>& readsLeft)
        : FSRandomAccessFileOwnerWrapper(std::move(f)), bytes_(bytes), readsLeft_(readsLeft) {}
    rocksdb::IOStatus Read(uint64_t offset, size_t n, const rocksdb::IOOptions& options,
                           rocksdb::Slice* result, char* scratch,
                           rocksdb::IODebugContext* dbg) const override {
      if (readsLeft_.load() == 0) return rocksdb::IOStatus::IOError("injected: read failed");
      if (readsLeft_.load() > 0) --readsLeft_;
      bytes_ += n;
      return target()->Read(offset, n, options, result, scratch, dbg);
    }
    rocksdb::IOStatus MultiRead(rocksdb::FSReadRequest* reqs, size_t n,
                                const rocksdb::IOOptions& options,
                                rocksdb::IODebugContext* dbg) override {
      if (readsLeft_.load() >= 0) return rocksdb::IOStatus::NotSupported("test: no MultiRead");
      for (size_t i = 0; i < n; ++i) bytes_ += reqs[i].len;
      return target()->MultiRead(reqs, n, options, dbg);
    }

   private:
    std::atomic<uint64_t>& bytes_;
    std::atomic<int64_t>& readsLeft_;
  };
};

// The size entries: the blocks family's 49-byte keys, nine bytes of ones before a record key.
const std::string kSizePrefix(9, '\xff');
bool isSizeEntry(const rocksdb::Slice& key) {
  return key.size() == kSizePrefix.size() + 40 && key.starts_with(kSizePrefix);
}

// Every block record has its size entry, holding its payload size, and there is no other entry:
// what a reopen relies on to know the records without reading them.
void expectSizesMatchRecords(rocksdb::DB& db, rocksdb::ColumnFamilyHandle* blocks) {
  std::map<std::string, uint32_t> records, sizes;
  std::unique_ptr<rocksdb::Iterator> it(db.NewIterator({}, blocks));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    uint32_t n = 0;
    if (isSizeEntry(it->key())) {
      ASSERT_EQ(it->value().size(), 4u);
      std::memcpy(&n, it->value().data(), 4);
      sizes[it->key().ToString().substr(kSizePrefix.size())] = n;
    } else {
      ASSERT_EQ(it->key().size(), 40u);
      std::memcpy(&n, it->value().data(), 4);  // the header's size
      records[it->key().ToString()] = static_cast<uint32_t>(it->value().size() - 4 - n);
    }
  }
  ASSERT_TRUE(it->status().ok());
  EXPECT_EQ(records, sizes);
}
void expectSizesMatchRecords(ColdTier& tier) {
  expectSizesMatchRecords(*tier.rawDb(), tier.blocksFamily());
}

TEST(ColdTier, RecordsRoundTripAndSurviveReopen) {
  TempDir dir;
  std::string nodeId;
  {
    auto tier = ColdTier::open({.path = dir.path()}).value();
    nodeId = tier->nodeId();
    EXPECT_EQ(nodeId.size(), 16u);
    ASSERT_TRUE(put(*tier, 1).ok());
    ASSERT_TRUE(put(*tier, 2, 100000).ok());
    EXPECT_EQ(tier->get(keyOf(1)).value(), payload(1));
    EXPECT_EQ(tier->get(keyOf(3)).code(), ErrorCode::kNotFound);
  }
  auto tier = ColdTier::open({.path = dir.path()}).value();
  EXPECT_EQ(tier->nodeId(), nodeId);
  EXPECT_TRUE(tier->contains(keyOf(1)));
  EXPECT_EQ(tier->stats().records, 2u);
  EXPECT_EQ(tier->stats().bytes, 16384u + 100000u);
  EXPECT_EQ(tier->get(keyOf(2)).value(), payload(2, 100000));
}

// A process that dies right after putBatch returns (no close, no flush at exit: as under SIGKILL)
// leaves every record of the batch on disk: large blocks skip the write-ahead log, so this holds
// for them only because putBatch flushes them before it returns; small blocks (kept in the tables)
// go through the log instead, which is written before it returns. The dying process is a
// death-test child that re-runs this binary ("threadsafe"): a plain fork would inherit RocksDB's
// global thread pools without their threads.
void dieRightAfterPutBatch(uint32_t bytes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr const char* kDirVariable = "KVTIER_TEST_DYING_TIER";  // the child writes where we read
  std::optional<TempDir> dir;
  if (::getenv(kDirVariable) == nullptr) {
    dir.emplace();
    ASSERT_EQ(::setenv(kDirVariable, dir->path().c_str(), 1), 0);
  }
  const std::string path = ::getenv(kDirVariable);
  EXPECT_EXIT(
      {
        auto tier = ColdTier::open({.path = path});
        bool ok = tier.ok();
        for (uint8_t n = 1; ok && n <= 4; ++n) ok = put(**tier, n, bytes).ok();
        ::_exit(ok ? 0 : 1);  // no destructors: the database is never closed
      },
      ::testing::ExitedWithCode(0), "");
  ::unsetenv(kDirVariable);
  auto tier = ColdTier::open({.path = path}).value();
  EXPECT_EQ(tier->stats().records, 4u);
  EXPECT_EQ(tier->stats().bytes, 4u * bytes);  // their sizes were written with them
  for (uint8_t n = 1; n <= 4; ++n) EXPECT_EQ(tier->get(keyOf(n)).value(), payload(n, bytes));
}

TEST(ColdTierDeathTest, ABatchIsOnDiskWhenPutBatchReturnsEvenIfTheProcessDiesAtOnce) {
  dieRightAfterPutBatch(300000);
}

TEST(ColdTierDeathTest, ABatchOfSmallBlocksIsOnDiskWhenPutBatchReturnsEvenIfTheProcessDiesAtOnce) {
  dieRightAfterPutBatch(1000);
}

// RocksDB's own log goes to the daemon's log, never into a file of the data directory: on a full
// disk a failed write to that file made RocksDB's next message abort the daemon (an assertion in
// Debian's build), as it filled and again at every start (scripts/chaos.sh found it).
TEST(ColdTier, RocksDbKeepsNoLogFileInTheDataDirectory) {
  TempDir dir;
  {
    auto tier = ColdTier::open({.path = dir.path()}).value();
    for (uint8_t n = 1; n <= 4; ++n) ASSERT_TRUE(put(*tier, n, n % 2 ? 1000 : 300000).ok());
  }
  auto again = ColdTier::open({.path = dir.path()}).value();
  EXPECT_EQ(again->get(keyOf(1)).value(), payload(1, 1000));
  for (const auto& f : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_FALSE(f.path().filename().string().starts_with("LOG")) << f.path();
  }
}

// The stats count the tier's table and blob files beside the bytes held: exactly what is on disk,
// at least the records' bytes, and also after a reopen.
TEST(ColdTier, StatsCountTheFilesOnDisk) {
  TempDir dir;
  auto onDisk = [&] {
    uint64_t n = 0;
    for (const auto& f : std::filesystem::directory_iterator(dir.path())) {
      const auto ext = f.path().extension();
      if (ext == ".sst" || ext == ".blob") n += std::filesystem::file_size(f.path());
    }
    return n;
  };
  {
    auto tier = ColdTier::open({.path = dir.path()}).value();
    for (uint8_t n = 1; n <= 4; ++n) ASSERT_TRUE(put(*tier, n, 256 << 10).ok());
    EXPECT_EQ(tier->stats().bytes, 4u << 18);
    EXPECT_GE(tier->stats().diskBytes, tier->stats().bytes);
    EXPECT_EQ(tier->stats().diskBytes, onDisk());
  }
  auto tier = ColdTier::open({.path = dir.path()}).value();
  EXPECT_GE(tier->stats().diskBytes, tier->stats().bytes);
  EXPECT_EQ(tier->stats().diskBytes, onDisk());
}

// A reopen learns the records and their sizes from their size entries without reading a record (a
// 64 GiB tier would otherwise read 64 GiB to start); the records read back after it.
TEST(ColdTier, ReopeningReadsNoRecord) {
  TempDir dir;
  constexpr uint8_t kRecords = 16;
  constexpr size_t kBytes = 256 << 10;
  {
    // Four batches (four table and blob files): fewer than the level-0 files that start a
    // compaction, whose blob garbage collection would read records in the background.
    auto tier = ColdTier::open({.path = dir.path()}).value();
    std::vector<std::vector<uint8_t>> bytes;
    for (uint8_t n = 0; n < kRecords; ++n) bytes.push_back(payload(n, kBytes + n));
    for (uint8_t batch = 0; batch < 4; ++batch) {
      std::vector<ColdRecord> records;
      for (uint8_t n = 4 * batch; n < 4 * batch + 4; ++n) {
        records.push_back({keyOf(n), bytes[n].data(), static_cast<uint32_t>(bytes[n].size())});
      }
      ASSERT_TRUE(tier->putBatch(records).ok());
    }
  }
  auto counter = std::make_shared<BlobReadCounter>();
  auto tier = ColdTier::open({.path = dir.path(), .fileSystem = counter}).value();
  EXPECT_EQ(counter->bytes.load(), 0u);
  EXPECT_EQ(tier->stats().records, kRecords);
  EXPECT_EQ(tier->stats().bytes, kRecords * kBytes + (kRecords - 1) * kRecords / 2);
  EXPECT_EQ(tier->get(keyOf(3)).value(), payload(3, kBytes + 3));
  EXPECT_GE(counter->bytes.load(), kBytes);  // the counter does see record reads
}

// Makes the tier at `path` look as an older kvtierd left it: format 1, no size entries for the
// records keyOf(first..last).
void makeFormat1(const std::string& path, uint8_t first, uint8_t last) {
  RawDb raw(path);
  for (uint8_t n = first; n <= last; ++n) {
    ASSERT_TRUE(
        raw.db().Delete({}, raw.family(RawDb::kBlocks), kSizePrefix + keyOf(n).encode()).ok());
  }
  ASSERT_TRUE(raw.db().Put({}, raw.family(RawDb::kMeta), "format_version", "1").ok());
  ASSERT_TRUE(raw.db().Flush({}, {raw.family(RawDb::kBlocks), raw.family(RawDb::kMeta)}).ok());
}

// A tier written without size entries (format 1, an older kvtierd), or with damaged ones, is
// indexed from its records at open, once, and raised to format 2: the open after that reads no
// record again.
TEST(ColdTier, ATierWithoutAUsableSizeIndexIsIndexedAtOpen) {
  TempDir dir;
  {
    auto tier = ColdTier::open({.path = dir.path()}).value();
    for (uint8_t n = 1; n <= 3; ++n) ASSERT_TRUE(put(*tier, n, 8192 * n).ok());
  }
  auto breakIndex = [&](const std::function<void(RawDb&)>& change) {
    RawDb raw(dir.path());
    change(raw);
    ASSERT_TRUE(raw.db().Flush({}, {raw.family(RawDb::kBlocks), raw.family(RawDb::kMeta)}).ok());
  };
  auto format = [&] {
    RawDb raw(dir.path());
    std::string value;
    EXPECT_TRUE(raw.db().Get({}, raw.family(RawDb::kMeta), "format_version", &value).ok());
    return value;
  };
  auto expectIndexedFromTheRecords = [&] {
    auto counter = std::make_shared<BlobReadCounter>();
    {
      auto tier = ColdTier::open({.path = dir.path(), .fileSystem = counter}).value();
      EXPECT_GT(counter->bytes.load(), 0u);  // it read the records
      EXPECT_EQ(tier->stats().records, 3u);
      EXPECT_EQ(tier->stats().bytes, 8192u * 6);
      expectSizesMatchRecords(*tier);
    }
    EXPECT_EQ(format(), "2");
    counter->bytes = 0;
    auto tier = ColdTier::open({.path = dir.path(), .fileSystem = counter}).value();
    EXPECT_EQ(counter->bytes.load(), 0u);
    EXPECT_EQ(tier->stats().records, 3u);
    EXPECT_EQ(tier->stats().bytes, 8192u * 6);
    for (uint8_t n = 1; n <= 3; ++n) EXPECT_EQ(tier->get(keyOf(n)).value(), payload(n, 8192 * n));
  };
  EXPECT_EQ(format(), "2");
  // As an older kvtierd leaves it: format 1, no size entries.
  makeFormat1(dir.path(), 1, 3);
  expectIndexedFromTheRecords();
  // An entry that does not decode.
  breakIndex([](RawDb& raw) {
    ASSERT_TRUE(
        raw.db().Put({}, raw.family(RawDb::kBlocks), kSizePrefix + keyOf(2).encode(), "abc").ok());
  });
  expectIndexedFromTheRecords();
  // A format this kvtierd does not know: refused, nothing changed.
  breakIndex([](RawDb& raw) {
    ASSERT_TRUE(raw.db().Put({}, raw.family(RawDb::kMeta), "format_version", "3").ok());
  });
  EXPECT_EQ(ColdTier::open({.path = dir.path()}).code(), ErrorCode::kUnavailable);
  EXPECT_EQ(format(), "3");
}

// A record read fails while a format-1 tier is being indexed: the tier serves what it saw for
// this run and writes nothing, so the next open indexes every record (had it stored the entries
// it had, the records past the failure would be held by no one, never served nor evicted).
TEST(ColdTier, AnIndexingScanThatFailsStoresNothing) {
  TempDir dir;
  {
    auto tier = ColdTier::open({.path = dir.path()}).value();
    for (uint8_t n = 1; n <= 3; ++n) ASSERT_TRUE(put(*tier, n).ok());  // a blob file each
  }
  makeFormat1(dir.path(), 1, 3);
  auto failing = std::make_shared<BlobReadCounter>();
  failing->readsLeft = 1;
  {
    auto tier = ColdTier::open({.path = dir.path(), .fileSystem = failing}).value();
    EXPECT_LT(tier->stats().records, 3u);
  }
  auto tier = ColdTier::open({.path = dir.path()}).value();
  EXPECT_EQ(tier->stats().records, 3u);
  for (uint8_t n = 1; n <= 3; ++n) EXPECT_EQ(tier->get(keyOf(n)).value(), payload(n));
  expectSizesMatchRecords(*tier);
}

// A size entry whose record is gone (the files damaged under the tier) is held until a read finds
// nothing, and is deleted then: the next open no longer counts it.
TEST(ColdTier, ASizeEntryWithoutItsRecordGoesWhenAReadFindsNothing) {
  TempDir dir;
  {
    auto tier = ColdTier::open({.path = dir.path()}).value();
    ASSERT_TRUE(put(*tier, 1).ok());
  }
  {
    RawDb raw(dir.path());
    ASSERT_TRUE(raw.db()
                    .Put({}, raw.family(RawDb::kBlocks), kSizePrefix + keyOf(9).encode(),
                         std::string("\0\x40\0\0", 4))
                    .ok());
  }
  {
    auto tier = ColdTier::open({.path = dir.path()}).value();
    EXPECT_EQ(tier->stats().records, 2u);
    EXPECT_EQ(tier->stats().bytes, 2u * 16384);
    EXPECT_EQ(tier->get(keyOf(9)).code(), ErrorCode::kNotFound);
    EXPECT_EQ(tier->stats().records, 1u);
  }
  auto tier = ColdTier::open({.path = dir.path()}).value();
  EXPECT_EQ(tier->stats().records, 1u);
  EXPECT_EQ(tier->stats().bytes, 16384u);
  expectSizesMatchRecords(*tier);
}

// Whatever writes or deletes block records — spill batches, the capacity bound, an erase, a
// corrupt record dropped — keeps the size entries exactly in step (snapshots' sealed blocks: in
// SnapshotsRoundTripSurviveReopenAndGoWithTheirRecords).
TEST(ColdTier, TheSizesIndexFollowsEveryWriteAndDelete) {
  TempDir dir;
  auto tier = ColdTier::open({.path = dir.path(), .capacityBytes = 6 * 16384}).value();
  for (uint8_t n = 1; n <= 4; ++n) ASSERT_TRUE(put(*tier, n).ok());
  expectSizesMatchRecords(*tier);
  for (uint8_t n = 5; n <= 8; ++n) ASSERT_TRUE(put(*tier, n).ok());  // evicts 1 and 2
  EXPECT_EQ(tier->stats().capacityEvicted, 2u);
  expectSizesMatchRecords(*tier);
  ASSERT_TRUE(tier->erase(keyOf(5)).ok());
  expectSizesMatchRecords(*tier);
  std::string value;
  const std::string k6 = keyOf(6).encode();
  ASSERT_TRUE(tier->rawDb()->Get({}, tier->blocksFamily(), k6, &value).ok());
  value[value.size() - 1] ^= 0x10;
  ASSERT_TRUE(tier->rawDb()->Put({}, tier->blocksFamily(), k6, value).ok());
  EXPECT_EQ(tier->get(keyOf(6)).code(), ErrorCode::kChecksumMismatch);
  expectSizesMatchRecords(*tier);
  EXPECT_EQ(tier->stats().records, 4u);  // 3, 4, 7 and 8
}

// Spilling under a capacity bound (every batch evicts: deletes, which go through the write-ahead
// log) keeps only a couple of log files: each flush leaves the earlier logs obsolete, instead of
// one more log per batch for the next restart to replay.
TEST(ColdTier, SpillingKeepsOnlyACoupleOfLogFiles) {
  TempDir dir;
  auto tier = ColdTier::open({.path = dir.path(), .capacityBytes = 8 * 65536}).value();
  const std::vector<uint8_t> bytes(65536, 3);
  for (uint8_t batch = 0; batch < 24; ++batch) {
    std::vector<ColdRecord> records;
    for (uint8_t i = 0; i < 4; ++i) {
      ColdKey key;
      key.key.bytes[0] = batch;
      key.key.bytes[1] = i;
      records.push_back({key, bytes.data(), static_cast<uint32_t>(bytes.size())});
    }
    ASSERT_TRUE(tier->putBatch(records).ok());
  }
  EXPECT_EQ(tier->stats().records, 8u);
  EXPECT_GT(tier->stats().capacityEvicted, 0u);
  auto logs = [&] {
    int n = 0;
    for (const auto& f : std::filesystem::directory_iterator(dir.path())) {
      n += f.path().extension() == ".log";
    }
    return n;
  };
  for (int i = 0; i < 200 && logs() > 2; ++i) {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(10));  // obsolete files go in the background
  }
  EXPECT_LE(logs(), 2);
}

// The block family's tables carry a Bloom filter (a read skips the level-0 tables without its
// key).
TEST(ColdTier, BlockTablesCarryABloomFilter) {
  TempDir dir;
  auto tier = ColdTier::open({.path = dir.path()}).value();
  ASSERT_TRUE(put(*tier, 1).ok());  // flushed: one table
  rocksdb::TablePropertiesCollection tables;
  ASSERT_TRUE(tier->rawDb()->GetPropertiesOfAllTables(tier->blocksFamily(), &tables).ok());
  ASSERT_FALSE(tables.empty());
  for (const auto& [file, properties] : tables) {
    EXPECT_EQ(properties->filter_policy_name, "bloomfilter") << file;
  }
}

TEST(ColdTier, FlippedBytesAreAMissCountedAndDeleted) {
  TempDir dir;
  auto tier = ColdTier::open({.path = dir.path()}).value();
  ASSERT_TRUE(put(*tier, 1).ok());
  ASSERT_TRUE(put(*tier, 2).ok());
  std::string value;
  const std::string k1 = keyOf(1).encode();
  ASSERT_TRUE(tier->rawDb()->Get(rocksdb::ReadOptions(), tier->blocksFamily(), k1, &value).ok());
  value[value.size() - 100] ^= 0x01;  // one bit of the payload
  ASSERT_TRUE(tier->rawDb()->Put(rocksdb::WriteOptions(), tier->blocksFamily(), k1, value).ok());
  EXPECT_EQ(tier->get(keyOf(1)).code(), ErrorCode::kChecksumMismatch);
  EXPECT_EQ(tier->stats().corruptDropped, 1u);
  EXPECT_FALSE(tier->contains(keyOf(1)));
  EXPECT_EQ(tier->get(keyOf(1)).code(), ErrorCode::kNotFound);  // deleted, not retried
  EXPECT_EQ(tier->get(keyOf(2)).value(), payload(2));           // neighbours unharmed
}

// A batch of reads (a lookup's promotes, one MultiGet) answers each record as getInto would: the
// right bytes, NOT_FOUND when absent, INVALID_ARGUMENT for another size, CHECKSUM_MISMATCH (and
// deleted, counted) when corrupt — one bad record harms none of the others.
TEST(ColdTier, ABatchOfReadsAnswersEachRecordAsASingleReadWould) {
  TempDir dir;
  auto tier = ColdTier::open({.path = dir.path()}).value();
  for (uint8_t n = 1; n <= 5; ++n) ASSERT_TRUE(put(*tier, n, n == 5 ? 1000 : 16384).ok());
  std::string value;
  const std::string k3 = keyOf(3).encode();
  ASSERT_TRUE(tier->rawDb()->Get(rocksdb::ReadOptions(), tier->blocksFamily(), k3, &value).ok());
  value[value.size() - 100] ^= 0x01;
  ASSERT_TRUE(tier->rawDb()->Put(rocksdb::WriteOptions(), tier->blocksFamily(), k3, value).ok());
  std::vector<std::vector<uint8_t>> dest(7, std::vector<uint8_t>(16384, 0xee));
  // Out of key order, a missing key, a wrong size, a corrupt record and a small one.
  const std::vector<ColdTier::Read> reads = {
      {keyOf(4), dest[0].data(), 16384}, {keyOf(9), dest[1].data(), 16384},
      {keyOf(1), dest[2].data(), 16384}, {keyOf(2), dest[3].data(), 8192},
      {keyOf(3), dest[4].data(), 16384}, {keyOf(5), dest[5].data(), 1000}};
  const std::vector<Status> got = tier->getManyInto(reads);
  ASSERT_EQ(got.size(), reads.size());
  EXPECT_TRUE(got[0].ok());
  EXPECT_EQ(dest[0], payload(4));
  EXPECT_EQ(got[1].code(), ErrorCode::kNotFound);
  EXPECT_TRUE(got[2].ok());
  EXPECT_EQ(dest[2], payload(1));
  EXPECT_EQ(got[3].code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(got[4].code(), ErrorCode::kChecksumMismatch);
  EXPECT_TRUE(got[5].ok());
  EXPECT_TRUE(std::equal(dest[5].begin(), dest[5].begin() + 1000, payload(5, 1000).begin()));
  EXPECT_EQ(dest[1], std::vector<uint8_t>(16384, 0xee)) << "a miss writes nothing";
  EXPECT_EQ(tier->stats().corruptDropped, 1u);
  EXPECT_FALSE(tier->contains(keyOf(3)));
  EXPECT_TRUE(tier->contains(keyOf(2))) << "a read of the wrong size deletes nothing";
  EXPECT_TRUE(tier->getManyInto({}).empty());
}

// Bytes flipped in the files themselves (blob and table files, under RocksDB's feet): after a
// reopen every record reads back with exactly its bytes or is refused as corrupt or missing; none
// is ever served with other bytes, and nothing crashes. Many random trials, since block reads do
// not verify RocksDB's own checksums (the record header and xxh3 stand for them).
TEST(ColdTier, BytesFlippedInTheFilesAreMissesNeverWrongBytes) {
  TempDir dir;
  constexpr uint8_t kRecords = 24;
  {
    auto tier = ColdTier::open({.path = dir.path()}).value();
    for (uint8_t n = 0; n < kRecords; ++n) ASSERT_TRUE(put(*tier, n, 16384 + n * 512).ok());
  }
  std::mt19937 random(1234);
  uint64_t served = 0, refused = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const std::string copy = dir.path() + "-" + std::to_string(trial);
    std::filesystem::copy(dir.path(), copy);
    std::vector<std::filesystem::path> files;
    for (const auto& f : std::filesystem::directory_iterator(copy)) {
      const auto ext = f.path().extension();
      if (ext == ".blob" || ext == ".sst") files.push_back(f.path());
    }
    ASSERT_FALSE(files.empty());
    for (int flip = 0; flip < 1 + trial % 8; ++flip) {
      const auto& file = files[random() % files.size()];
      const auto size = std::filesystem::file_size(file);
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      const auto at = static_cast<std::streamoff>(random() % size);
      char byte = 0;
      f.seekg(at);
      f.read(&byte, 1);
      byte = static_cast<char>(byte ^ (1 << (random() % 8)));
      f.seekp(at);
      f.write(&byte, 1);
    }
    auto tier = ColdTier::open({.path = copy});
    if (!tier.ok()) {  // a table RocksDB cannot open: nothing served at all
      ++refused;
      continue;
    }
    for (uint8_t n = 0; n < kRecords; ++n) {
      auto got = (*tier)->get(keyOf(n));
      if (got.ok()) {
        ASSERT_EQ(*got, payload(n, 16384 + n * 512)) << "trial " << trial << " record " << n;
        ++served;
      } else {
        EXPECT_TRUE(got.code() == ErrorCode::kChecksumMismatch ||
                    got.code() == ErrorCode::kNotFound || got.code() == ErrorCode::kUnavailable)
            << got.error().message();
        ++refused;
      }
    }
  }
  EXPECT_GT(served, 0u);
  EXPECT_GT(refused, 0u);
}

void flipByte(const std::filesystem::path& file, uint64_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  char byte = 0;
  f.seekg(static_cast<std::streamoff>(at));
  f.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x10);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&byte, 1);
}

std::vector<std::filesystem::path> filesEndingWith(const std::string& dir, const std::string& end) {
  std::vector<std::filesystem::path> out;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().string().ends_with(end)) out.push_back(f.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A bit flipped in a live table file's blocks, in the tier's manifest or in its CURRENT file is
// found before RocksDB opens the tier for good (over a damaged block Debian's RocksDB, built
// with its assertions, can abort instead of failing): the tier is moved aside to <path>.damaged
// and a fresh one opens in its place, empty, counted, under the same node id and above every
// snapshot id handed out before. The undamaged tier opens and serves every record.
TEST(ColdTier, ADamagedTierIsMovedAsideAndAFreshOneOpensUnderTheSameNodeId) {
  TempDir dir;
  std::string nodeId;
  std::set<std::string> metadataTables;  // the node id and snapshot id limit are there
  {
    auto tier = ColdTier::open({.path = dir.path()}).value();
    for (uint8_t n = 0; n < 8; ++n) ASSERT_TRUE(put(*tier, n, 16384).ok());         // blob files
    for (uint8_t n = 100; n < 108; ++n) ASSERT_TRUE(put(*tier, n, 1000 + n).ok());  // in tables
    ASSERT_TRUE(tier->storeSnapshotIdLimit(5000).ok());
    nodeId = tier->nodeId();
  }
  {
    RawDb raw(dir.path());
    std::vector<rocksdb::LiveFileMetaData> files;
    raw.db().GetLiveFilesMetaData(&files);
    for (const auto& f : files) {
      if (f.column_family_name != "blocks") {
        metadataTables.insert(std::filesystem::path(f.name).filename().string());
      }
    }
  }
  struct Damage {
    std::filesystem::path file;
    uint64_t at;
  };
  std::vector<Damage> damages;
  for (const auto& table : filesEndingWith(dir.path(), ".sst")) {
    const auto size = std::filesystem::file_size(table);
    // A byte in the first half (data blocks) and one among the last blocks (index, properties).
    damages.push_back({table.filename(), size / 3});
    damages.push_back({table.filename(), size - 100});
  }
  ASSERT_GE(damages.size(), 2u);
  const auto manifests = filesEndingWith(dir.path(), "");  // MANIFEST-NNNNNN
  for (const auto& f : manifests) {
    if (f.filename().string().starts_with("MANIFEST-")) damages.push_back({f.filename(), 40});
  }
  damages.push_back({"CURRENT", 3});   // "MA^IFEST-...": not a manifest's name
  damages.push_back({"CURRENT", 13});  // another manifest's number: a file that is not there
  for (size_t d = 0; d < damages.size(); ++d) {
    const std::string copy = dir.path() + "-" + std::to_string(d);
    std::filesystem::copy(dir.path(), copy);
    flipByte(std::filesystem::path(copy) / damages[d].file, damages[d].at);
    const std::string what = damages[d].file.string() + " at " + std::to_string(damages[d].at);
    auto tier = ColdTier::open({.path = copy});
    ASSERT_TRUE(tier.ok()) << what << ": " << tier.error().message();
    const ColdStats stats = (*tier)->stats();
    EXPECT_EQ(stats.quarantined, 1u) << what;
    EXPECT_EQ(stats.records, 0u) << what;
    EXPECT_TRUE(std::filesystem::exists(copy + ".damaged")) << what;
    EXPECT_EQ((*tier)->get(keyOf(1)).code(), ErrorCode::kNotFound) << what;
    if (damages[d].file.extension() == ".sst" && !metadataTables.count(damages[d].file)) {
      EXPECT_EQ((*tier)->nodeId(), nodeId) << what;  // read from the undamaged metadata
    }
    EXPECT_GE((*tier)->snapshotIdFloor(), 5000u) << what << ": no snapshot id handed out again";
    ASSERT_TRUE(put(**tier, 9).ok()) << what;
    EXPECT_EQ((*tier)->get(keyOf(9)).value(), payload(9)) << what;
    tier->reset();
    // The fresh tier opens as it is the next time: nothing moved aside again.
    auto again = ColdTier::open({.path = copy}).value();
    EXPECT_EQ(again->stats().quarantined, 0u) << what;
    EXPECT_EQ(again->get(keyOf(9)).value(), payload(9)) << what;
    again.reset();
    std::filesystem::remove_all(copy);
    std::filesystem::remove_all(copy + ".damaged");
  }
  auto tier = ColdTier::open({.path = dir.path()}).value();
  EXPECT_EQ(tier->stats().quarantined, 0u);
  for (uint8_t n = 0; n < 8; ++n) EXPECT_EQ(tier->get(keyOf(n)).value(), payload(n, 16384));
  for (uint8_t n = 100; n < 108; ++n) EXPECT_EQ(tier->get(keyOf(n)).value(), payload(n, 1000 + n));
}

// A table damaged on disk while the tier is open: reads through it are typed errors (a miss),
// never an abort; the compaction that meets it fails, RocksDB refuses writes after that, and the
// next write moves the tier aside and goes on in a fresh one, under the same node id.
TEST(ColdTier, ATableDamagedWhileOpenIsAMissAndTheTierMovesAsideAtTheNextWrite) {
  TempDir dir;
  auto tier = ColdTier::open({.path = dir.path()}).value();
  const std::string nodeId = tier->nodeId();
  // Small records, each batch flushed into a table of its own by a large one beside it.
  for (uint8_t n = 0; n < 6; ++n) {
    const auto small = payload(100 + n, 1000);
    const auto large = payload(n, 16384);
    const ColdRecord records[] = {{keyOf(100 + n), small.data(), 1000},
                                  {keyOf(n), large.data(), 16384}};
    ASSERT_TRUE(tier->putBatch(records).ok());
  }
  ASSERT_TRUE(tier->storeSnapshotIdLimit(7000).ok());
  const auto tables = filesEndingWith(dir.path(), ".sst");
  ASSERT_GE(tables.size(), 2u);
  for (const auto& table : tables) {
    // Bytes all over the data blocks (the index, filter and properties near the end are held in
    // memory since the open).
    for (uint64_t at = 0; at < std::filesystem::file_size(table) / 2; at += 64) flipByte(table, at);
  }
  uint64_t served = 0, missed = 0;
  for (uint8_t n = 100; n < 106; ++n) {
    auto got = tier->get(keyOf(n));
    if (got.ok()) {
      EXPECT_EQ(*got, payload(n, 1000));  // from a block RocksDB had cached
      ++served;
    } else {
      EXPECT_TRUE(got.code() == ErrorCode::kChecksumMismatch || got.code() == ErrorCode::kNotFound)
          << got.error().message();
      ++missed;
    }
  }
  EXPECT_GT(missed, 0u);
  rocksdb::CompactRangeOptions all;
  const rocksdb::Status compacted =
      tier->rawDb()->CompactRange(all, tier->blocksFamily(), nullptr, nullptr);
  EXPECT_TRUE(compacted.IsCorruption()) << compacted.ToString();
  // Writes go on: the first may fail with RocksDB's error, the next opens a fresh tier.
  Status written = put(*tier, 50);
  if (!written) written = put(*tier, 50);
  ASSERT_TRUE(written.ok()) << written.error().message();
  EXPECT_EQ(tier->stats().quarantined, 1u);
  EXPECT_TRUE(std::filesystem::exists(dir.path() + ".damaged"));
  EXPECT_EQ(tier->nodeId(), nodeId);
  EXPECT_GE(tier->snapshotIdFloor(), 7000u);
  EXPECT_EQ(tier->get(keyOf(50)).value(), payload(50));
  EXPECT_EQ(tier->get(keyOf(1)).code(), ErrorCode::kNotFound);
  EXPECT_EQ(tier->stats().records, 1u);
}

TEST(ColdTier, RecordStoredUnderAnotherKeyOrTruncatedIsRefused) {
  TempDir dir;
  auto tier = ColdTier::open({.path = dir.path()}).value();
  ASSERT_TRUE(put(*tier, 1).ok());
  ASSERT_TRUE(put(*tier, 2).ok());
  std::string value;
  auto* db = tier->rawDb();
  ASSERT_TRUE(
      db->Get(rocksdb::ReadOptions(), tier->blocksFamily(), keyOf(1).encode(), &value).ok());
  // Block 1's record under block 2's key: the header names block 1, so block 2 must miss.
  ASSERT_TRUE(
      db->Put(rocksdb::WriteOptions(), tier->blocksFamily(), keyOf(2).encode(), value).ok());
  EXPECT_EQ(tier->get(keyOf(2)).code(), ErrorCode::kChecksumMismatch);
  // A truncated record, and garbage where the header should be.
  ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), tier->blocksFamily(), keyOf(1).encode(),
                      value.substr(0, value.size() - 1))
                  .ok());
  EXPECT_EQ(tier->get(keyOf(1)).code(), ErrorCode::kChecksumMismatch);
  ASSERT_TRUE(put(*tier, 3).ok());
  ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), tier->blocksFamily(), keyOf(3).encode(),
                      std::string("\x10\x00\x00\x00garbage-garbage-and-more", 28))
                  .ok());
  EXPECT_EQ(tier->get(keyOf(3)).code(), ErrorCode::kChecksumMismatch);
  EXPECT_EQ(tier->stats().corruptDropped, 3u);
}

TEST(ColdTier, CapacityEvictsOldestAccessFirst) {
  TempDir dir;
  auto tier = ColdTier::open({.path = dir.path(), .capacityBytes = 3 * 16384}).value();
  for (uint8_t n = 1; n <= 3; ++n) ASSERT_TRUE(put(*tier, n).ok());
  ASSERT_TRUE(tier->get(keyOf(1)).ok());  // 1 is now the most recently used
  ASSERT_TRUE(put(*tier, 4).ok());        // over capacity: 2 (oldest access) goes
  EXPECT_TRUE(tier->contains(keyOf(1)));
  EXPECT_FALSE(tier->contains(keyOf(2)));
  EXPECT_TRUE(tier->contains(keyOf(3)));
  EXPECT_TRUE(tier->contains(keyOf(4)));
  EXPECT_EQ(tier->stats().capacityEvicted, 1u);
  EXPECT_LE(tier->stats().bytes, 3u * 16384);
}

// Over the bound, records of blocks held only here go first, those that left memory first first,
// before records of blocks still in memory (written by a spill, or read back) — though those were
// accessed longer ago: a resident record becomes the only copy, and the most recently used, when
// its block is evicted.
TEST(ColdTier, CapacityDropsRecordsHeldOnlyHereBeforeThoseOfBlocksInMemory) {
  TempDir dir;
  const ColdTier::Options options{.path = dir.path(), .capacityBytes = 4 * 16384};
  auto tier = ColdTier::open(options).value();
  for (uint8_t n = 1; n <= 4; ++n) ASSERT_TRUE(put(*tier, n).ok());  // all in memory too
  tier->leftMemory(std::vector<ColdKey>{keyOf(3), keyOf(1)});
  ASSERT_TRUE(put(*tier, 5).ok());  // over the bound: 3 goes (it left memory first), not 2
  EXPECT_FALSE(tier->contains(keyOf(3)));
  for (uint8_t n : {1, 2, 4, 5}) EXPECT_TRUE(tier->contains(keyOf(n))) << int(n);
  tier->leftMemory(std::vector<ColdKey>{keyOf(2), keyOf(4)});
  ASSERT_TRUE(put(*tier, 6).ok());  // 1 goes: the first of 1, 2, 4 to leave memory
  EXPECT_FALSE(tier->contains(keyOf(1)));
  for (uint8_t n : {2, 4, 5, 6}) EXPECT_TRUE(tier->contains(keyOf(n))) << int(n);
  ASSERT_TRUE(tier->get(keyOf(4)).ok());  // read back into memory: resident again
  tier->leftMemory(std::vector<ColdKey>{keyOf(5), keyOf(6)});
  ASSERT_TRUE(put(*tier, 7).ok());  // 2, 5, 6 held only here: 2 goes, not 4 (read since)
  EXPECT_FALSE(tier->contains(keyOf(2)));
  for (uint8_t n : {4, 5, 6, 7}) EXPECT_TRUE(tier->contains(keyOf(n))) << int(n);
  EXPECT_EQ(tier->stats().capacityEvicted, 3u);
  EXPECT_LE(tier->stats().bytes, 4u * 16384);
  // After a restart memory is empty: no record is resident (key order, as access order is not
  // kept).
  tier.reset();
  tier = ColdTier::open(options).value();
  ASSERT_TRUE(put(*tier, 8).ok());
  EXPECT_FALSE(tier->contains(keyOf(4)));
  for (uint8_t n : {5, 6, 7, 8}) EXPECT_TRUE(tier->contains(keyOf(n))) << int(n);
}

TEST(ColdTier, FullDiskFailsWritesCountsThemAndRecovers) {
  TempDir dir;
  auto fs = std::make_shared<test::FullDiskFileSystem>(rocksdb::FileSystem::Default());
  auto tier = ColdTier::open({.path = dir.path(), .fileSystem = fs}).value();
  ASSERT_TRUE(put(*tier, 1).ok());
  fs->full = true;
  auto failed = put(*tier, 2);
  EXPECT_EQ(failed.code(), ErrorCode::kUnavailable);
  EXPECT_EQ(tier->stats().writeErrors, 1u);
  EXPECT_FALSE(tier->contains(keyOf(2)));
  EXPECT_EQ(tier->get(keyOf(1)).value(), payload(1));  // reads keep working
  fs->full = false;
  auto resumed = put(*tier, 3);
  EXPECT_TRUE(resumed.ok()) << "writes resume when space returns: "
                            << (resumed.ok() ? "" : resumed.error().toString());
  EXPECT_EQ(tier->get(keyOf(3)).value(), payload(3));
}

// ---------------------------------------------------------------------------------------------
// Snapshots

SnapshotManifest manifestOf(uint64_t id, const Salt& salt = keyOf(0).salt) {
  SnapshotManifest m;
  m.id = id;
  m.fingerprint = keyOf(0).fingerprint;
  m.salt = salt;
  m.blockTokens = 16;
  m.blockBytes = 16384;
  m.from = 0;
  m.to = 20;  // a sealed block and a partial one
  for (uint32_t i = 0; i < 20; ++i) m.tokens.push_back(i);
  m.keys = {keyOf(1).key};
  m.blocks = {ManifestBlock{ManifestBlock::Kind::kSealed, keyOf(1).key},
              ManifestBlock{ManifestBlock::Kind::kOwn, {}}};
  m.checkpoints = {{20, 1000}};
  return m;
}

SnapshotKey snapshotKeyOf(const SnapshotManifest& m) {
  return SnapshotKey{m.fingerprint, m.salt, m.id};
}

// Writes snapshot m: its sealed block (payload 1), own block (payload 50) and checkpoint (51).
Status putSnapshot(ColdTier& tier, const SnapshotManifest& m) {
  static const auto sealed = payload(1), own = payload(50), state = payload(51, 1000);
  SnapshotPut p{&m,
                {ColdRecord{keyOf(1), sealed.data(), static_cast<uint32_t>(sealed.size())}},
                {SnapshotRecord{1, own.data(), static_cast<uint32_t>(own.size())},
                 SnapshotRecord{checkpointSlot(0), state.data(), 1000}}};
  return tier.putSnapshots(std::span(&p, 1));
}

TEST(ColdTier, SnapshotsRoundTripSurviveReopenAndGoWithTheirRecords) {
  TempDir dir;
  const SnapshotManifest m = manifestOf(7);
  const SnapshotKey key = snapshotKeyOf(m);
  {
    auto tier = ColdTier::open({.path = dir.path()}).value();
    EXPECT_FALSE(tier->hasSnapshot(key));
    ASSERT_TRUE(putSnapshot(*tier, m).ok());
    EXPECT_TRUE(tier->hasSnapshot(key));
    EXPECT_TRUE(tier->contains(keyOf(1))) << "the sealed block is an ordinary block record";
    EXPECT_EQ(tier->stats().snapshots, 1u);
    EXPECT_EQ(tier->stats().records, 1u) << "own records are not block records";
    expectSizesMatchRecords(*tier);  // the sealed block has its size entry
  }
  auto tier = ColdTier::open({.path = dir.path()}).value();
  EXPECT_EQ(tier->stats().bytes, 16384u);
  EXPECT_TRUE(tier->hasSnapshot(key));
  EXPECT_EQ(tier->stats().snapshots, 1u);
  EXPECT_EQ(tier->getSnapshot(key).value(), m);
  std::vector<uint8_t> got(16384);
  ASSERT_TRUE(tier->getSnapshotRecordInto(key, 1, got.data(), 16384).ok());
  EXPECT_EQ(got, payload(50));
  got.resize(1000);
  ASSERT_TRUE(tier->getSnapshotRecordInto(key, checkpointSlot(0), got.data(), 1000).ok());
  EXPECT_EQ(got, payload(51, 1000));
  EXPECT_EQ(tier->getSnapshotRecordInto(key, checkpointSlot(0), got.data(), 999).code(),
            ErrorCode::kChecksumMismatch)
      << "a record of another size than its manifest says";
  EXPECT_EQ(tier->getSnapshotRecordInto(key, 0, got.data(), 16384).code(), ErrorCode::kNotFound);

  // Another tenant (salt) or another id: nothing.
  SnapshotKey other = key;
  other.salt = saltFor("tenant-b");
  EXPECT_FALSE(tier->hasSnapshot(other));
  EXPECT_EQ(tier->getSnapshot(other).code(), ErrorCode::kNotFound);
  EXPECT_EQ(tier->getSnapshot(SnapshotKey{key.fingerprint, key.salt, 8}).code(),
            ErrorCode::kNotFound);
  EXPECT_EQ(tier->eraseSnapshot(other, false).value(), false);

  EXPECT_EQ(tier->eraseSnapshot(key, false).value(), true);
  EXPECT_FALSE(tier->hasSnapshot(key));
  EXPECT_EQ(tier->getSnapshotRecordInto(key, 1, got.data(), 16384).code(), ErrorCode::kNotFound)
      << "its own records went with it";
  EXPECT_TRUE(tier->contains(keyOf(1))) << "the block record is anyone's to keep";
  EXPECT_EQ(tier->stats().snapshots, 0u);
  EXPECT_EQ(tier->stats().snapshotsDropped, 0u) << "a drop, not a failure";
  EXPECT_EQ(tier->eraseSnapshot(key, false).value(), false);
}

TEST(ColdTier, SealedBlocksAlreadyHeldAreNotWrittenAgain) {
  TempDir dir;
  auto tier = ColdTier::open({.path = dir.path()}).value();
  ASSERT_TRUE(put(*tier, 1).ok());
  const uint64_t written = tier->stats().written;
  ASSERT_TRUE(putSnapshot(*tier, manifestOf(7)).ok());
  EXPECT_EQ(tier->stats().written, written);
  ASSERT_TRUE(putSnapshot(*tier, manifestOf(8)).ok());
  EXPECT_EQ(tier->stats().snapshots, 2u);
}

TEST(ColdTier, ACorruptManifestIsDroppedWithItsRecordsAndCounted) {
  TempDir dir;
  auto tier = ColdTier::open({.path = dir.path()}).value();
  const SnapshotManifest m = manifestOf(7), n = manifestOf(8);
  ASSERT_TRUE(putSnapshot(*tier, m).ok());
  ASSERT_TRUE(putSnapshot(*tier, n).ok());
  const SnapshotKey key = snapshotKeyOf(m);
  std::string value;
  auto* db = tier->rawDb();
  ASSERT_TRUE(
      db->Get(rocksdb::ReadOptions(), tier->snapshotsFamily(), key.manifestKey(), &value).ok());
  value[value.size() / 2] ^= 0x04;
  ASSERT_TRUE(
      db->Put(rocksdb::WriteOptions(), tier->snapshotsFamily(), key.manifestKey(), value).ok());
  EXPECT_EQ(tier->getSnapshot(key).code(), ErrorCode::kChecksumMismatch);
  EXPECT_EQ(tier->stats().snapshotsDropped, 1u);
  EXPECT_FALSE(tier->hasSnapshot(key));
  EXPECT_EQ(tier->getSnapshot(key).code(), ErrorCode::kNotFound) << "dropped, not retried";
  std::vector<uint8_t> got(16384);
  EXPECT_EQ(tier->getSnapshotRecordInto(key, 1, got.data(), 16384).code(), ErrorCode::kNotFound);
  EXPECT_EQ(tier->getSnapshot(snapshotKeyOf(n)).value(), n) << "neighbours unharmed";
}

TEST(ColdTier, ACorruptOwnRecordIsAChecksumMismatchAndCounted) {
  TempDir dir;
  auto tier = ColdTier::open({.path = dir.path()}).value();
  const SnapshotManifest m = manifestOf(7);
  ASSERT_TRUE(putSnapshot(*tier, m).ok());
  const SnapshotKey key = snapshotKeyOf(m);
  auto* db = tier->rawDb();
  std::string value;
  ASSERT_TRUE(
      db->Get(rocksdb::ReadOptions(), tier->snapshotsFamily(), key.recordKey(1), &value).ok());
  value[value.size() - 10] ^= 0x01;
  ASSERT_TRUE(
      db->Put(rocksdb::WriteOptions(), tier->snapshotsFamily(), key.recordKey(1), value).ok());
  std::vector<uint8_t> got(16384);
  EXPECT_EQ(tier->getSnapshotRecordInto(key, 1, got.data(), 16384).code(),
            ErrorCode::kChecksumMismatch);
  EXPECT_EQ(tier->stats().corruptDropped, 1u);
  // One slot's record stored under another slot: its header names the other one.
  std::string state;
  ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), tier->snapshotsFamily(),
                      key.recordKey(checkpointSlot(0)), &state)
                  .ok());
  ASSERT_TRUE(
      db->Put(rocksdb::WriteOptions(), tier->snapshotsFamily(), key.recordKey(2), state).ok());
  got.resize(1000);
  EXPECT_EQ(tier->getSnapshotRecordInto(key, 2, got.data(), 1000).code(),
            ErrorCode::kChecksumMismatch);
}

TEST(ColdTier, SnapshotIdFloorIsAboveTheStoredLimitAndEveryManifest) {
  TempDir dir;
  {
    auto tier = ColdTier::open({.path = dir.path()}).value();
    EXPECT_EQ(tier->snapshotIdFloor(), 1u);
    ASSERT_TRUE(tier->storeSnapshotIdLimit(100).ok());
  }
  {
    auto tier = ColdTier::open({.path = dir.path()}).value();
    EXPECT_EQ(tier->snapshotIdFloor(), 100u);
    ASSERT_TRUE(putSnapshot(*tier, manifestOf(500)).ok());  // one that outran the limit
    ASSERT_TRUE(putSnapshot(*tier, manifestOf(30, saltFor("tenant-b"))).ok());
  }
  {
    auto tier = ColdTier::open({.path = dir.path()}).value();
    EXPECT_EQ(tier->snapshotIdFloor(), 501u);
    EXPECT_EQ(tier->stats().snapshots, 2u);
  }
  {
    // An unreadable limit: ids handed out before can no longer be told apart; refuse to open.
    RawDb raw(dir.path());
    ASSERT_TRUE(raw.db().Put({}, raw.family(RawDb::kMeta), "snapshot_id_limit", "12x").ok());
  }
  EXPECT_EQ(ColdTier::open({.path = dir.path()}).code(), ErrorCode::kUnavailable);
}

// The capacity bound evicts oldest access first, but never a block record a snapshot's manifest
// names (the snapshot could not be restored after a crash): here the oldest record is named.
TEST(ColdTierSnapshots, TheCapacityBoundKeepsRecordsAManifestNames) {
  TempDir dir;
  auto tier = ColdTier::open({.path = dir.path(), .capacityBytes = 3 * 16384}).value();
  ASSERT_TRUE(put(*tier, 1).ok());  // the snapshot's sealed block, spilled long ago
  ASSERT_TRUE(put(*tier, 2).ok());
  ASSERT_TRUE(putSnapshot(*tier, manifestOf(7)).ok());  // names keyOf(1), already on disk
  ASSERT_TRUE(put(*tier, 3).ok());
  ASSERT_TRUE(put(*tier, 4).ok());  // over capacity
  EXPECT_TRUE(tier->hasSnapshot(snapshotKeyOf(manifestOf(7))));
  EXPECT_TRUE(tier->contains(keyOf(1))) << "a record manifest 7 names was evicted";
  EXPECT_FALSE(tier->contains(keyOf(2))) << "the oldest record no manifest names goes first";
  // Dropped: its records are ordinary again, and the bound may take them.
  ASSERT_TRUE(tier->eraseSnapshot(snapshotKeyOf(manifestOf(7)), false).ok());
  ASSERT_TRUE(put(*tier, 5).ok());
  EXPECT_FALSE(tier->contains(keyOf(1)));
}

// A delete after a failed write (the database refuses writes until reopened) reopens first; the
// snapshot is forgotten only once its delete is on disk, so a restart cannot bring it back.
TEST(ColdTierSnapshots, AnEraseAfterAFailedWriteSticks) {
  TempDir dir;
  auto fs = std::make_shared<test::FullDiskFileSystem>(rocksdb::FileSystem::Default());
  const SnapshotKey key = snapshotKeyOf(manifestOf(7));
  {
    auto tier = ColdTier::open({.path = dir.path(), .fileSystem = fs}).value();
    ASSERT_TRUE(putSnapshot(*tier, manifestOf(7)).ok());
    fs->full = true;
    EXPECT_FALSE(put(*tier, 2).ok());
    auto failed = tier->eraseSnapshot(key, false);
    EXPECT_FALSE(failed.ok()) << "the disk is still full";
    EXPECT_TRUE(tier->hasSnapshot(key)) << "not forgotten before its delete is on disk";
    fs->full = false;
    auto erased = tier->eraseSnapshot(key, false);
    ASSERT_TRUE(erased.ok()) << erased.error();
    EXPECT_TRUE(*erased);
    EXPECT_FALSE(tier->hasSnapshot(key));
  }
  auto tier = ColdTier::open({.path = dir.path(), .fileSystem = fs}).value();
  EXPECT_FALSE(tier->hasSnapshot(key)) << "a dropped snapshot came back after a restart";
}

}  // namespace
}  // namespace kvtier
