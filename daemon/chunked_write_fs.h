// ChunkedWriteFileSystem: a RocksDB FileSystem that hands every append to the file below in
// pieces of at most `chunkBytes`, so no single write(2) runs long.
//
// Why: RocksDB writes a write batch's log record, and a flush its blob files, with one write(2) per
// buffer (1 MiB and more). Copying a MiB into the page cache takes milliseconds of kernel time on a
// small VM, and a kernel built with preempt=none (Debian's cloud kernels, Firecracker guests) does
// not switch threads inside a system call: a client's lookup that needs that core waits for the
// whole write. In pieces, the scheduler gets its chance between two of them. The bytes, their
// order and every error are exactly those of the file below; only the number of calls changes.
//
// With a rate limiter, each piece waits for its bytes first (rocksdb::RateLimiter, all writes:
// logs, tables and blob files alike), so the cold tier takes no more of the disk's write
// bandwidth than it was given (kvtierd --disk-write-rate).
#pragma once

#include <rocksdb/file_system.h>
#include <rocksdb/rate_limiter.h>

#include <algorithm>
#include <memory>

namespace kvtier {

class ChunkedWriteFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  // 64 KiB: ~0.1-0.3 ms of page-cache copying on the development VM, and still few system calls
  // per MiB.
  static constexpr size_t kDefaultChunkBytes = 64 << 10;
  static constexpr size_t kPage = 4096;

  // `chunkBytes` is rounded up to a whole number of 4 KiB pages (direct I/O needs aligned pieces).
  explicit ChunkedWriteFileSystem(std::shared_ptr<rocksdb::FileSystem> base,
                                  size_t chunkBytes = kDefaultChunkBytes,
                                  std::shared_ptr<rocksdb::RateLimiter> limiter = nullptr)
      : FileSystemWrapper(std::move(base)),
        chunkBytes_(std::max<size_t>(kPage, (chunkBytes + kPage - 1) / kPage * kPage)),
        limiter_(std::move(limiter)) {}
  const char* Name() const override { return "ChunkedWriteFileSystem"; }

  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReopenWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReuseWritableFile(const std::string& name, const std::string& oldName,
                                      const rocksdb::FileOptions& options,
                                      std::unique_ptr<rocksdb::FSWritableFile>* result,
                                      rocksdb::IODebugContext* dbg) override;

 private:
  rocksdb::IOStatus wrap(rocksdb::IOStatus opened, std::unique_ptr<rocksdb::FSWritableFile>* file);

  const size_t chunkBytes_;
  std::shared_ptr<rocksdb::RateLimiter> limiter_;  // null: unlimited
};

}  // namespace kvtier
