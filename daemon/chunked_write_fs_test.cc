#include "daemon/chunked_write_fs.h"

#include <gtest/gtest.h>
#include <rocksdb/file_system.h>

#include <fstream>
#include <iterator>
#include <mutex>
#include <vector>

#include "daemon/cold_tier.h"
#include "tests/temp_dir.h"

namespace kvtier {
namespace {

// Records the size of every append that reaches the real file system below, and fails the
// append number `failAt` (counting from 1) when set.
class RecordingFileSystem : public rocksdb::FileSystemWrapper {
 public:
  RecordingFileSystem() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "RecordingFileSystem"; }

  std::vector<size_t> appends() {
    std::lock_guard lock(mu_);
    return appends_;
  }
  void failAppend(size_t n) { failAt_ = n; }

  class File : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile> f, RecordingFileSystem& fs)
        : FSWritableFileOwnerWrapper(std::move(f)), fs_(fs) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                             rocksdb::IODebugContext* d) override {
      if (!fs_.record(data.size())) return rocksdb::IOStatus::IOError("injected");
      return FSWritableFileOwnerWrapper::Append(data, o, d);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                             const rocksdb::DataVerificationInfo& v,
                             rocksdb::IODebugContext* d) override {
      if (!fs_.record(data.size())) return rocksdb::IOStatus::IOError("injected");
      return FSWritableFileOwnerWrapper::Append(data, o, v, d);
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                       const rocksdb::IOOptions& o,
                                       rocksdb::IODebugContext* d) override {
      if (!fs_.record(data.size())) return rocksdb::IOStatus::IOError("injected");
      return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, o, d);
    }

   private:
    RecordingFileSystem& fs_;
  };

  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override {
    std::unique_ptr<rocksdb::FSWritableFile> file;
    auto s = target()->NewWritableFile(name, options, &file, dbg);
    if (s.ok()) *result = std::make_unique<File>(std::move(file), *this);
    return s;
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string& name, const std::string& old,
                                      const rocksdb::FileOptions& options,
                                      std::unique_ptr<rocksdb::FSWritableFile>* result,
                                      rocksdb::IODebugContext* dbg) override {
    std::unique_ptr<rocksdb::FSWritableFile> file;
    auto s = target()->ReuseWritableFile(name, old, options, &file, dbg);
    if (s.ok()) *result = std::make_unique<File>(std::move(file), *this);
    return s;
  }

 private:
  bool record(size_t bytes) {
    std::lock_guard lock(mu_);
    appends_.push_back(bytes);
    return appends_.size() != failAt_;
  }

  std::mutex mu_;
  std::vector<size_t> appends_;  // GUARDED_BY(mu_)
  size_t failAt_ = 0;
};

using test::TempDir;

std::string bytesOf(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7);
  return s;
}

std::string contentsOf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A file "f" opened through a ChunkedWriteFileSystem of `chunkBytes` pieces over a recorder.
struct ChunkedFile {
  explicit ChunkedFile(size_t chunkBytes) : fs(recording, chunkBytes) {
    EXPECT_TRUE(fs.NewWritableFile(dir.file("f"), {}, &file, nullptr).ok());
  }
  TempDir dir;
  std::shared_ptr<RecordingFileSystem> recording = std::make_shared<RecordingFileSystem>();
  ChunkedWriteFileSystem fs;
  std::unique_ptr<rocksdb::FSWritableFile> file;
};

TEST(ChunkedWriteFileSystem, SplitsLargeAppendsAndKeepsEveryByteInOrder) {
  ChunkedFile f(4096);
  ASSERT_NE(f.file, nullptr);
  auto& file = f.file;
  const std::string a = bytesOf(10000, 1), b = bytesOf(1, 2), c = bytesOf(4096, 3);
  for (const std::string* s : {&a, &b, &c}) ASSERT_TRUE(file->Append(*s, {}, nullptr).ok());
  // An append with a checksum: pieces when large, passed whole when it fits one piece.
  const std::string d = bytesOf(9000, 4), e = bytesOf(100, 5);
  for (const std::string* s : {&d, &e}) {
    ASSERT_TRUE(file->Append(*s, {}, rocksdb::DataVerificationInfo(), nullptr).ok());
  }
  ASSERT_TRUE(file->Close({}, nullptr).ok());
  EXPECT_EQ(f.recording->appends(),
            (std::vector<size_t>{4096, 4096, 1808, 1, 4096, 4096, 4096, 808, 100}));
  EXPECT_EQ(contentsOf(f.dir.file("f")), a + b + c + d + e);
}

TEST(ChunkedWriteFileSystem, PiecesAreWholePagesEvenWhenAskedForLess) {
  ChunkedFile f(0);  // never a zero-byte piece (which would never end)
  ASSERT_NE(f.file, nullptr);
  ASSERT_TRUE(f.file->Append(bytesOf(5000, 1), {}, nullptr).ok());
  EXPECT_EQ(f.recording->appends(), (std::vector<size_t>{4096, 904}));
}

TEST(ChunkedWriteFileSystem, AFailingPieceFailsTheAppendAndStopsThere) {
  ChunkedFile f(4096);
  ASSERT_NE(f.file, nullptr);
  f.recording->failAppend(2);
  const rocksdb::IOStatus s = f.file->Append(bytesOf(12000, 1), {}, nullptr);
  EXPECT_TRUE(s.IsIOError()) << s.ToString();
  EXPECT_EQ(f.recording->appends().size(), 2u);  // the third piece is never tried
}

// What the daemon relies on: RocksDB under the cold tier never hands the disk a write larger
// than a piece — not for a spill batch of 256 KiB blocks (blob files), nor for a snapshot's batch
// (its log record, then blob files).
TEST(ChunkedWriteFileSystem, TheColdTierWritesNothingLargerThanAPiece) {
  TempDir dir;
  auto recording = std::make_shared<RecordingFileSystem>();
  std::vector<std::string> values;
  std::vector<ColdRecord> records;
  for (uint8_t n = 0; n < 8; ++n) values.push_back(bytesOf(256 << 10, static_cast<char>(n)));
  for (uint8_t n = 0; n < 8; ++n) {
    ColdKey key;
    key.fingerprint = 1;
    key.key.bytes.fill(n);
    records.push_back({key, reinterpret_cast<const uint8_t*>(values[n].data()),
                       static_cast<uint32_t>(values[n].size())});
  }
  auto appended = [&] {
    size_t total = 0;
    for (size_t n : recording->appends()) {
      EXPECT_LE(n, ChunkedWriteFileSystem::kDefaultChunkBytes);
      total += n;
    }
    return total;
  };
  auto tier = ColdTier::open({.path = dir.file("cold"), .fileSystem = recording}).value();
  const size_t atOpen = appended();
  // The batch goes straight to blob files (flushed before putBatch returns, no write-ahead log):
  // its blocks go down in pieces, and once.
  ASSERT_TRUE(tier->putBatch(records).ok());
  const size_t afterBatch = appended();
  EXPECT_GE(afterBatch - atOpen, 8u * (256 << 10));
  EXPECT_LT(afterBatch - atOpen, 2u * 8 * (256 << 10));
  // A snapshot's batch goes through the log: one 256 KiB own block, in pieces as well.
  SnapshotManifest m;
  m.id = 1;
  m.fingerprint = 1;
  m.blockTokens = 16;
  m.blockBytes = 256 << 10;
  m.to = 8;  // one partial block, the snapshot's own record
  for (uint32_t i = 0; i < 8; ++i) m.tokens.push_back(i);
  m.blocks = {ManifestBlock{ManifestBlock::Kind::kOwn, {}}};
  const std::string own = bytesOf(256 << 10, 'o');
  SnapshotPut put{&m,
                  {},
                  {SnapshotRecord{0, reinterpret_cast<const uint8_t*>(own.data()),
                                  static_cast<uint32_t>(own.size())}}};
  ASSERT_TRUE(tier->putSnapshots(std::span(&put, 1)).ok());
  EXPECT_GE(appended() - afterBatch, size_t{256} << 10);
  for (uint8_t n = 0; n < 8; ++n) {
    auto got = tier->get(records[n].key);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(std::string(got->begin(), got->end()), values[n]);
  }
}

}  // namespace
}  // namespace kvtier
