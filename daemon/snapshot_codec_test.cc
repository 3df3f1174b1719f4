// The on-disk form of snapshot manifests: a round trip keeps every field, and a manifest that
// fails any check (a flipped byte anywhere, a truncation, another snapshot's name, an unknown
// format, contents a restore could not use) is refused, never half-decoded.
#include "daemon/snapshot_codec.h"

#include <gtest/gtest.h>

#include "schemas/cold_record.capnp.h"

namespace kvtier {

inline void PrintTo(ErrorCode code, std::ostream* os) { *os << errorName(code); }

namespace {

Key128 key(uint8_t n) {
  Key128 k;
  k.bytes.fill(n);
  return k;
}

SnapshotManifest sample() {
  SnapshotManifest m;
  m.id = 0x0102030405060708ull;
  m.fingerprint = 0xfeedface12345678ull;
  m.salt = saltFor("tenant-a");
  m.blockTokens = 16;
  m.blockBytes = 16384;
  m.from = 20;
  m.to = 56;
  for (uint32_t i = 0; i < 56; ++i) m.tokens.push_back(1000 + i * 7);
  m.keys = {key(1), key(2), key(3)};
  m.detached = true;
  m.window = 4096;
  m.clientKeyed = false;
  m.unindexed = true;
  // Blocks 1..3 cover [16, 64): released, sealed, own.
  m.blocks = {ManifestBlock{ManifestBlock::Kind::kReleased, {}},
              ManifestBlock{ManifestBlock::Kind::kSealed, key(3)},
              ManifestBlock{ManifestBlock::Kind::kOwn, {}}};
  m.checkpoints = {{20, 3000}, {56, 128}};
  return m;
}

Result<SnapshotManifest> decode(const std::string& value, const SnapshotManifest& m) {
  return decodeManifest(value, m.fingerprint, m.salt, m.id);
}

TEST(SnapshotCodec, RoundTripKeepsEveryField) {
  const SnapshotManifest m = sample();
  ASSERT_TRUE(checkManifest(m).ok()) << checkManifest(m).error();
  const std::string value = encodeManifest(m);
  auto back = decode(value, m);
  ASSERT_TRUE(back.ok()) << back.error();
  EXPECT_EQ(*back, m);
  // And an empty snapshot.
  SnapshotManifest e;
  e.id = 3;
  e.blockTokens = 16;
  e.blockBytes = 512;
  e.from = e.to = 99;
  auto empty = decode(encodeManifest(e), e);
  ASSERT_TRUE(empty.ok()) << empty.error();
  EXPECT_EQ(*empty, e);
}

TEST(SnapshotCodec, EveryFlippedByteAndEveryTruncationIsRefused) {
  const SnapshotManifest m = sample();
  const std::string value = encodeManifest(m);
  for (size_t i = 0; i < value.size(); ++i) {
    std::string bad = value;
    bad[i] ^= 0x20;
    EXPECT_EQ(decode(bad, m).code(), ErrorCode::kChecksumMismatch) << "byte " << i;
  }
  for (size_t n :
       {size_t{0}, size_t{7}, size_t{8}, size_t{16}, value.size() - 8, value.size() - 1}) {
    EXPECT_EQ(decode(value.substr(0, n), m).code(), ErrorCode::kChecksumMismatch) << n;
  }
  EXPECT_EQ(decode(value + std::string(8, '\0'), m).code(), ErrorCode::kChecksumMismatch);
}

TEST(SnapshotCodec, AManifestReadUnderAnotherNameIsRefused) {
  const SnapshotManifest m = sample();
  const std::string value = encodeManifest(m);
  EXPECT_EQ(decodeManifest(value, m.fingerprint, m.salt, m.id + 1).code(),
            ErrorCode::kChecksumMismatch);
  EXPECT_EQ(decodeManifest(value, m.fingerprint + 1, m.salt, m.id).code(),
            ErrorCode::kChecksumMismatch);
  EXPECT_EQ(decodeManifest(value, m.fingerprint, saltFor("tenant-b"), m.id).code(),
            ErrorCode::kChecksumMismatch)
      << "another tenant never reads it";
}

TEST(SnapshotCodec, AnUnknownFormatVersionIsRefused) {
  const SnapshotManifest m = sample();
  EXPECT_EQ(decode(encodeManifest(m, disk::MANIFEST_FORMAT_VERSION + 1), m).code(),
            ErrorCode::kChecksumMismatch);
  EXPECT_EQ(decode(encodeManifest(m, 0), m).code(), ErrorCode::kChecksumMismatch);
}

TEST(SnapshotCodec, ContentsARestoreCouldNotUseAreRefusedDespiteAGoodChecksum) {
  SnapshotManifest m = sample();
  m.blocks.pop_back();  // two blocks for a range that needs three
  auto r = decode(encodeManifest(m), m);
  EXPECT_EQ(r.code(), ErrorCode::kChecksumMismatch);
  m = sample();
  m.checkpoints = {{57, 10}};  // past the end
  EXPECT_EQ(decode(encodeManifest(m), m).code(), ErrorCode::kChecksumMismatch);
}

}  // namespace
}  // namespace kvtier
