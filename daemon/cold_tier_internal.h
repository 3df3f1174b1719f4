// Internals shared by the cold tier's files (cold_tier.cc, cold_tier_open.cc,
// cold_tier_snapshots.cc): the tier's keys and encodings, RocksDB options, and how RocksDB's
// answers become kvtier errors. Not for other users of the tier (daemon/cold_tier.h).
#pragma once

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

#include "daemon/cold_tier.h"

namespace kvtier::cold_internal {

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
// alone paces deletions (the trash, on disk beyond --disk-bytes meanwhile: docs/cold-tier.md).
constexpr uint64_t kDeleteChunkBytes = 4 << 20;
constexpr int64_t kDeleteBytesPerSecond = int64_t{1} << 30;
constexpr double kMaxTrashRatio = 1e6;

inline void appendBigEndian(std::string& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<char>(v >> (8 * i)));
}

// The name a snapshot's own record carries in its header (where a block record has its key), so
// that a record is never accepted under another snapshot's or slot's name.
inline Key128 recordName(uint64_t id, uint32_t slot) {
  Key128 k;
  for (int i = 0; i < 8; ++i) k.bytes[i] = static_cast<uint8_t>(id >> (8 * i));
  for (int i = 0; i < 4; ++i) k.bytes[8 + i] = static_cast<uint8_t>(slot >> (8 * i));
  std::memcpy(k.bytes.data() + 12, "snap", 4);
  return k;
}

// The block records a manifest names (encoded keys): the capacity bound keeps them.
inline std::vector<std::string> namedRecords(const SnapshotManifest& m) {
  std::vector<std::string> named;
  for (const auto& b : m.blocks) {
    if (b.kind == ManifestBlock::Kind::kSealed) {
      named.push_back(ColdKey{m.fingerprint, m.salt, b.key}.encode());
    }
  }
  return named;
}

// A record's value in a write batch: its header, then its payload read in place (no copy).
inline void putRecord(rocksdb::WriteBatch& batch, rocksdb::ColumnFamilyHandle* family,
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
inline rocksdb::WriteOptions blockWriteOptions() { return rocksdb::WriteOptions(); }

// A block record's size entry lives in the blocks family beside it, under the record's key behind
// this prefix: 49 bytes where a record key has 40, in a range of its own (a record key would need
// a fingerprint of all ones and a salt starting with 0xff to fall in it, and it would still be
// told apart by its length). Same family, same batch, same flush: the two are on disk together
// or not at all, without the log. Its value: the payload size, 4 bytes little-endian (below
// min_blob_size, so it stays in the table and a scan of the entries reads no blob).
inline const std::string kSizePrefix(9, '\xff');
constexpr size_t kSizeKeyBytes = 9 + kKeyBytes;

inline std::string sizeKey(const std::string& recordKey) { return kSizePrefix + recordKey; }

inline bool isSizeKey(const rocksdb::Slice& key) {
  return key.size() == kSizeKeyBytes && key.starts_with(kSizePrefix);
}

inline std::string encodeSize(uint32_t bytes) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(bytes >> (8 * i));
  return out;
}

inline bool decodeSize(const rocksdb::Slice& in, uint32_t* bytes) {
  if (in.size() != 4) return false;
  *bytes = 0;
  for (int i = 0; i < 4; ++i) *bytes |= uint32_t{static_cast<uint8_t>(in[i])} << (8 * i);
  return true;
}

// Values from this size on go to blob files (integrated BlobDB); smaller ones stay in the tables.
constexpr uint64_t kMinBlobBytes = 4096;

// A spill batch of large blocks skips the write-ahead log and is flushed at once instead
// (ColdTier::putBatch): each block is written once, to a synced blob file, rather than twice (log,
// then blob file) — and the log's checksum, computed in software by Debian's portable RocksDB
// build, cost the spill worker about as much CPU as everything else it does
// (docs/cold-tier.md). A batch of small blocks (below kMinBlobBytes, kept in the tables) goes
// through the log instead: a flush per batch made a level-0 table per batch — hundreds of tables of
// a few KiB under a replay of small blocks, writes stalled at 48 of them, and the puts waiting for
// room with them (docs/cold-tier.md, "Speed").
inline rocksdb::WriteOptions spillWriteOptions(bool logged) {
  rocksdb::WriteOptions options;
  options.disableWAL = !logged;
  return options;
}
constexpr const char* kNodeIdKey = "node_id";

inline Error unavailable(const rocksdb::Status& s, const char* what) {
  return makeError(ErrorCode::kUnavailable, what, ": ", s.ToString());
}

// The value's first part: a 4-byte header size and the header. The payload follows as a second
// slice of the write batch, read straight from the pool block (no intermediate copy).
inline std::string encodeHeader(const ColdRecord& r) {
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

}  // namespace kvtier::cold_internal
