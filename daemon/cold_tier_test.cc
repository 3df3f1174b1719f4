#include "daemon/cold_tier.h"
#include "tests/full_disk_fs.h"

#include <gtest/gtest.h>
#include <rocksdb/file_system.h>

#include <atomic>
#include <filesystem>

namespace kvtier {
namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kvtier-cold-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_ + "/cold"; }

 private:
  std::string path_;
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

}  // namespace
}  // namespace kvtier
