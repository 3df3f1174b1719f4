// What the cold tier's tests share (cold_tier_test.cc, cold_tier_damage_test.cc,
// cold_tier_snapshots_test.cc): a tier's directory, records and their bytes, the raw database.
#pragma once

#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <memory>
#include <string>
#include <vector>

#include "daemon/cold_tier.h"
#include "tests/temp_dir.h"

namespace kvtier::cold_test {

// The cold tier's directory inside a test's temporary directory.
class TempDir {
 public:
  std::string path() const { return dir_.file("cold"); }

 private:
  test::TempDir dir_;
};

inline ColdKey keyOf(uint8_t n) {
  ColdKey k;
  k.fingerprint = 0x1234;
  k.salt.fill(7);
  k.key.bytes.fill(n);
  return k;
}

inline std::vector<uint8_t> payload(uint8_t n, size_t size = 16384) {
  std::vector<uint8_t> out(size);
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(i * 31 + n);
  return out;
}

inline Status put(ColdTier& tier, uint8_t n, size_t size = 16384) {
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

// The size entries: the blocks family's 49-byte keys, nine bytes of ones before a record key.
inline const std::string kSizePrefix(9, '\xff');

inline bool isSizeEntry(const rocksdb::Slice& key) {
  return key.size() == kSizePrefix.size() + 40 && key.starts_with(kSizePrefix);
}

// Every block record has its size entry, holding its payload size, and there is no other entry:
// what a reopen relies on to know the records without reading them.
inline void expectSizesMatchRecords(rocksdb::DB& db, rocksdb::ColumnFamilyHandle* blocks) {
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
inline void expectSizesMatchRecords(ColdTier& tier) {
  expectSizesMatchRecords(*tier.rawDb(), tier.blocksFamily());
}

}  // namespace kvtier::cold_test
