#include "daemon/trash_thread_fs.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>

#include "daemon/scheduling.h"

namespace kvtier {
namespace {

// Lowers the calling thread once, unless it is the main thread (the event loop; it may empty the
// trash itself while the database opens) or already lowered (the spill worker, RocksDB's pools).
void lowerThisThreadIfUnlowered() {
  thread_local bool seen = false;
  if (seen) return;
  seen = true;
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  if (tid == static_cast<id_t>(::getpid())) return;
  errno = 0;
  const int nice = ::getpriority(PRIO_PROCESS, tid);
  if (nice == -1 && errno != 0) return;
  errno = 0;
  const int mainNice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::getpid()));
  if ((mainNice == -1 && errno != 0) || nice > mainNice) return;
  (void)::setpriority(PRIO_PROCESS, tid, TrashThreadFileSystem::kNiceness);
  (void)requestSlice(kBackgroundSlice);
  (void)::pthread_setname_np(::pthread_self(), TrashThreadFileSystem::kThreadName);
}

}  // namespace

bool TrashThreadFileSystem::inTrash(const std::string& name) {
  static constexpr std::string_view kSuffix = ".trash";
  return name.size() >= kSuffix.size() &&
         name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0;
}

rocksdb::IOStatus TrashThreadFileSystem::GetFileSize(const std::string& name,
                                                     const rocksdb::IOOptions& options,
                                                     uint64_t* size, rocksdb::IODebugContext* dbg) {
  if (inTrash(name)) lowerThisThreadIfUnlowered();
  return FileSystemWrapper::GetFileSize(name, options, size, dbg);
}

rocksdb::IOStatus TrashThreadFileSystem::ReopenWritableFile(
    const std::string& name, const rocksdb::FileOptions& options,
    std::unique_ptr<rocksdb::FSWritableFile>* result, rocksdb::IODebugContext* dbg) {
  if (inTrash(name)) lowerThisThreadIfUnlowered();
  return FileSystemWrapper::ReopenWritableFile(name, options, result, dbg);
}

rocksdb::IOStatus TrashThreadFileSystem::DeleteFile(const std::string& name,
                                                    const rocksdb::IOOptions& options,
                                                    rocksdb::IODebugContext* dbg) {
  if (inTrash(name)) lowerThisThreadIfUnlowered();
  return FileSystemWrapper::DeleteFile(name, options, dbg);
}

}  // namespace kvtier
