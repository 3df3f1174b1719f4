// The cold tier's snapshots: manifests and records round trips, reopen, capacity, corruption,
// the snapshot id floor.
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
