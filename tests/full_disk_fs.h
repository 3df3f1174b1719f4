// A RocksDB FileSystem whose writes fail with "no space left" while `full` is set: a full disk
// on demand, for the cold tier's tests (a decorator over the real file system, not a mock).
#pragma once

#include <rocksdb/file_system.h>

#include <atomic>
#include <memory>
#include <string>

namespace kvtier::test {

class FullDiskFileSystem : public rocksdb::FileSystemWrapper {
 public:
  explicit FullDiskFileSystem(std::shared_ptr<rocksdb::FileSystem> base)
      : FileSystemWrapper(base) {}
  const char* Name() const override { return "FullDiskFileSystem"; }
  std::atomic<bool> full{false};

  class File : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile> f, const std::atomic<bool>& full)
        : FSWritableFileOwnerWrapper(std::move(f)), full_(full) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                             rocksdb::IODebugContext* d) override {
      if (full_) return rocksdb::IOStatus::NoSpace("injected: disk full");
      return FSWritableFileOwnerWrapper::Append(data, o, d);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                             const rocksdb::DataVerificationInfo& v,
                             rocksdb::IODebugContext* d) override {
      if (full_) return rocksdb::IOStatus::NoSpace("injected: disk full");
      return FSWritableFileOwnerWrapper::Append(data, o, v, d);
    }
    rocksdb::IOStatus Sync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* d) override {
      if (full_) return rocksdb::IOStatus::NoSpace("injected: disk full");
      return FSWritableFileOwnerWrapper::Sync(o, d);
    }

   private:
    const std::atomic<bool>& full_;
  };

  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override {
    if (full) return rocksdb::IOStatus::NoSpace("injected: disk full");
    std::unique_ptr<rocksdb::FSWritableFile> file;
    auto s = target()->NewWritableFile(name, options, &file, dbg);
    if (s.ok()) result->reset(new File(std::move(file), full));
    return s;
  }
};

}  // namespace kvtier::test
