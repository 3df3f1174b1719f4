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

#include "daemon/cold_tier_test_support.h"

namespace kvtier {
namespace {

using namespace cold_test;

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

}  // namespace
}  // namespace kvtier
