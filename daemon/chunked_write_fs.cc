#include "daemon/chunked_write_fs.h"

#include <algorithm>

namespace kvtier {
namespace {

class ChunkedWritableFile final : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  ChunkedWritableFile(std::unique_ptr<rocksdb::FSWritableFile> file, size_t chunkBytes,
                      rocksdb::RateLimiter* limiter)
      : FSWritableFileOwnerWrapper(std::move(file)), chunkBytes_(chunkBytes), limiter_(limiter) {}

  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
    return inPieces(data, [&](const rocksdb::Slice& piece, size_t) {
      return target()->Append(piece, options, dbg);
    });
  }
  // The checksum handed down covers the whole append, not a piece: pieces go without it (the
  // POSIX file ignores it anyway). An append that fits one piece keeps it.
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           const rocksdb::DataVerificationInfo& verification,
                           rocksdb::IODebugContext* dbg) override {
    if (data.size() <= chunkBytes_ && !limiter_) {
      return target()->Append(data, options, verification, dbg);
    }
    return Append(data, options, dbg);
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     rocksdb::IODebugContext* dbg) override {
    return inPieces(data, [&](const rocksdb::Slice& piece, size_t at) {
      return target()->PositionedAppend(piece, offset + at, options, dbg);
    });
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     const rocksdb::DataVerificationInfo& verification,
                                     rocksdb::IODebugContext* dbg) override {
    if (data.size() <= chunkBytes_ && !limiter_) {
      return target()->PositionedAppend(data, offset, options, verification, dbg);
    }
    return PositionedAppend(data, offset, options, dbg);
  }

 private:
  // Calls `write(piece, offsetInData)` for consecutive pieces of `data`; stops at the first error.
  template <typename Write>
  rocksdb::IOStatus inPieces(const rocksdb::Slice& data, Write&& write) {
    size_t at = 0;
    do {
      size_t n = std::min(chunkBytes_, data.size() - at);
      if (limiter_) {
        // A request may not exceed one refill's burst: the piece is cut to it.
        n = std::min<size_t>(n, static_cast<size_t>(limiter_->GetSingleBurstBytes()));
        limiter_->Request(static_cast<int64_t>(n), rocksdb::Env::IO_HIGH, nullptr,
                          rocksdb::RateLimiter::OpType::kWrite);
      }
      rocksdb::IOStatus s = write(rocksdb::Slice(data.data() + at, n), at);
      if (!s.ok()) return s;
      at += n;
    } while (at < data.size());
    return rocksdb::IOStatus::OK();
  }

  const size_t chunkBytes_;
  rocksdb::RateLimiter* limiter_;  // the file system's; null: unlimited
};

}  // namespace

rocksdb::IOStatus ChunkedWriteFileSystem::wrap(rocksdb::IOStatus opened,
                                               std::unique_ptr<rocksdb::FSWritableFile>* file) {
  if (opened.ok()) {
    *file = std::make_unique<ChunkedWritableFile>(std::move(*file), chunkBytes_, limiter_.get());
  }
  return opened;
}

rocksdb::IOStatus ChunkedWriteFileSystem::NewWritableFile(
    const std::string& name, const rocksdb::FileOptions& options,
    std::unique_ptr<rocksdb::FSWritableFile>* result, rocksdb::IODebugContext* dbg) {
  return wrap(target()->NewWritableFile(name, options, result, dbg), result);
}

rocksdb::IOStatus ChunkedWriteFileSystem::ReopenWritableFile(
    const std::string& name, const rocksdb::FileOptions& options,
    std::unique_ptr<rocksdb::FSWritableFile>* result, rocksdb::IODebugContext* dbg) {
  return wrap(target()->ReopenWritableFile(name, options, result, dbg), result);
}

rocksdb::IOStatus ChunkedWriteFileSystem::ReuseWritableFile(
    const std::string& name, const std::string& oldName, const rocksdb::FileOptions& options,
    std::unique_ptr<rocksdb::FSWritableFile>* result, rocksdb::IODebugContext* dbg) {
  return wrap(target()->ReuseWritableFile(name, oldName, options, result, dbg), result);
}

}  // namespace kvtier
