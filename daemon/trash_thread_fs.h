// TrashThreadFileSystem: a RocksDB FileSystem that moves the thread RocksDB deletes obsolete files
// on to background priority (niceness 19 and the long slice, like the flush and compaction pools)
// and names it "rocksdb:trash".
//
// Why: with an SstFileManager, RocksDB deletes obsolete table, blob and log files on a thread of
// its own (its DeleteScheduler: files renamed to *.trash, truncated away a piece at a time,
// fsynced, unlinked). RocksDB lowers its flush and compaction pools when asked
// (Env::LowerThreadPoolCPUPriority) but has no such knob for this thread, so it ran at the event
// loop's priority: traced holding a core inside truncate, fsync and unlink while a hot lookup
// waited for it. Only that thread touches files in the trash from a thread other than the process's
// main one that nothing has lowered yet, so that is how it is recognised; the bytes and every
// result are exactly those of the file system below.
#pragma once

#include <rocksdb/file_system.h>

#include <memory>
#include <string>

namespace kvtier {

class TrashThreadFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  static constexpr const char* kThreadName = "rocksdb:trash";
  static constexpr int kNiceness = 19;

  explicit TrashThreadFileSystem(std::shared_ptr<rocksdb::FileSystem> base)
      : FileSystemWrapper(std::move(base)) {}
  const char* Name() const override { return "TrashThreadFileSystem"; }

  // What the delete scheduler does with each file in the trash.
  rocksdb::IOStatus GetFileSize(const std::string& name, const rocksdb::IOOptions& options,
                                uint64_t* size, rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus ReopenWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                       std::unique_ptr<rocksdb::FSWritableFile>* result,
                                       rocksdb::IODebugContext* dbg) override;
  rocksdb::IOStatus DeleteFile(const std::string& name, const rocksdb::IOOptions& options,
                               rocksdb::IODebugContext* dbg) override;

  // Whether `name` is a file in RocksDB's trash.
  static bool inTrash(const std::string& name);
};

}  // namespace kvtier
