// The cold tier's damaged records and files: flipped bytes are misses, never other bytes; a
// damaged tier is moved aside at open, and after a compaction met its damage while running.
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

}  // namespace
}  // namespace kvtier
