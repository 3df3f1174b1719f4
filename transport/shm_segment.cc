#include "transport/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>
#include <vector>

#include "transport/hugetlb.h"

// Older libc headers lack the newer flags; the kernel's numbers are stable.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif
#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21U << 26)  // MFD_HUGE_SHIFT = 26
#endif

namespace kvtier {

namespace bip = boost::interprocess;

namespace {

// Allocates every page of the file behind `fd` (tmpfs or hugetlbfs): a shortage is an error here
// (ENOSPC, ENOMEM) instead of a SIGBUS at a later write. A file system without fallocate leaves it
// to the pre-fault.
Status allocate(int fd, uint64_t bytes, const std::string& name) {
  int rc;
  while ((rc = ::fallocate(fd, 0, 0, static_cast<off_t>(bytes))) != 0 && errno == EINTR) {
  }
  if (rc == 0 || errno == EOPNOTSUPP) return {};
  return makeError(ErrorCode::kUnavailable, "cannot allocate ", bytes, " bytes for '", name,
                   "': ", std::strerror(errno));
}

}  // namespace

const char* pageKindName(PageKind kind) { return kind == PageKind::kHuge2M ? "hugetlb-2M" : "4k"; }

Status ShmSegment::map(int fd, uint64_t bytes) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return makeError(ErrorCode::kUnavailable, "cannot stat '", name_, "': ", std::strerror(errno));
  }
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return makeError(ErrorCode::kUnavailable, "shared memory '", name_, "' has ",
                     static_cast<uint64_t>(st.st_size), " bytes, expected ", bytes);
  }
  // A hugetlb file (hugetlbfs, which memfd_create(MFD_HUGETLB) files live on) is mapped in whole
  // huge pages, whose size is its block size. (tmpfs may report 2 MiB blocks too, where shmem
  // transparent huge pages are on: only the file system's type tells.)
  struct statfs fs {};
  if (::fstatfs(fd, &fs) != 0) {
    return makeError(ErrorCode::kUnavailable, "cannot statfs '", name_,
                     "': ", std::strerror(errno));
  }
  const bool hugetlb = static_cast<unsigned long>(fs.f_type) == HUGETLBFS_MAGIC;
  pageBytes_ =
      hugetlb ? static_cast<uint64_t>(fs.f_bsize) : static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  pages_ = hugetlb && pageBytes_ == kHugePageBytes ? PageKind::kHuge2M : PageKind::k4K;
  if (bytes == 0 || (hugetlb && bytes % pageBytes_ != 0)) {
    return makeError(ErrorCode::kUnavailable, "shared memory '", name_, "': ", bytes,
                     " bytes is not a whole number of its ", pageBytes_, "-byte pages");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return makeError(ErrorCode::kUnavailable, "cannot map ", bytes, " bytes of '", name_,
                     "': ", std::strerror(errno));
  }
  data_ = static_cast<uint8_t*>(p);
  size_ = bytes;
  return {};
}

Status ShmSegment::populate() {
  int rc;
  while ((rc = ::madvise(data_, size_, MADV_POPULATE_WRITE)) != 0 && errno == EINTR) {
  }
  if (rc == 0) return {};
  if (errno != EINVAL) {
    // ENOMEM, EFAULT: the pages cannot be had (a write would have taken SIGBUS).
    return makeError(ErrorCode::kUnavailable, "cannot fault in the ", size_, " bytes of '", name_,
                     "': ", std::strerror(errno));
  }
  // A kernel before 5.14: one write per page. Safe from SIGBUS where allocate() has run (the
  // creators); a client's pages exist already. An atomic add of zero, not a read and a write
  // back: a client populates a pool that other processes are writing, and a plain write back
  // could put an old byte over a new one.
  for (uint64_t off = 0; off < size_; off += pageBytes_)
    __atomic_fetch_add(data_ + off, uint8_t{0}, __ATOMIC_RELAXED);
  return {};
}

Result<std::unique_ptr<ShmSegment>> ShmSegment::create(const std::string& name, uint64_t bytes,
                                                       unsigned mode) {
  std::unique_ptr<ShmSegment> seg(new ShmSegment(name, /*anonymous=*/false, /*owner=*/false));
  try {
    bip::permissions perms(mode);
    bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write, perms);
    seg->owner_ = true;  // the name is ours from here on: the destructor removes it
    shm.truncate(static_cast<bip::offset_t>(bytes));
    const int fd = shm.get_mapping_handle().handle;
    if (auto s = allocate(fd, bytes, name); !s) return s.error();
    if (auto s = seg->map(fd, bytes); !s) return s.error();
  } catch (const bip::interprocess_exception& e) {
    return makeError(ErrorCode::kUnavailable, "cannot create shared memory '", name, "' of ", bytes,
                     " bytes: ", e.what());
  }
  if (auto s = seg->populate(); !s) return s.error();
  return seg;
}

Result<std::unique_ptr<ShmSegment>> ShmSegment::createHuge(const std::string& label,
                                                           uint64_t bytes) {
  if (bytes == 0 || bytes % kHugePageBytes != 0) {
    return makeError(ErrorCode::kInvalidArgument, "a huge-page segment of ", bytes,
                     " bytes is not a multiple of 2 MiB");
  }
  const unsigned flags = MFD_CLOEXEC | MFD_HUGETLB | MFD_HUGE_2MB;
  int raw = ::memfd_create(label.c_str(), flags | MFD_ALLOW_SEALING);
  if (raw < 0 && errno == EINVAL) raw = ::memfd_create(label.c_str(), flags);  // sealing: 4.16
  if (raw < 0) {
    return makeError(ErrorCode::kUnavailable, "memfd_create(MFD_HUGETLB) for '", label,
                     "': ", std::strerror(errno));
  }
  kj::AutoCloseFd fd(raw);
  std::unique_ptr<ShmSegment> seg(new ShmSegment(label, /*anonymous=*/true, /*owner=*/true));
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return makeError(ErrorCode::kUnavailable, "cannot size huge-page segment '", label, "' to ",
                     bytes, " bytes: ", std::strerror(errno));
  }
  if (auto s = allocate(fd.get(), bytes, label); !s) {
    return makeError(ErrorCode::kUnavailable, "cannot have ", bytes / kHugePageBytes,
                     " huge pages of 2 MiB for '", label, "': ", std::strerror(errno));
  }
  // The size is fixed from now on — where the kernel could make the memfd sealable (4.16 and
  // later); a memfd made without MFD_ALLOW_SEALING refuses, and only that is allowed to fail.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 &&
      errno != EPERM) {
    return makeError(ErrorCode::kUnavailable, "cannot seal huge-page segment '", label,
                     "': ", std::strerror(errno));
  }
  if (auto s = seg->map(fd.get(), bytes); !s) return s.error();
  if (seg->pages_ != PageKind::kHuge2M) {
    return makeError(ErrorCode::kInternal, "memfd_create(MFD_HUGETLB) for '", label,
                     "' gave pages of ", seg->pageBytes_, " bytes");
  }
  if (auto s = seg->populate(); !s) return s.error();
  seg->fd_ = kj::mv(fd);
  return seg;
}

Result<std::unique_ptr<ShmSegment>> ShmSegment::open(const std::string& name, uint64_t minBytes) {
  std::unique_ptr<ShmSegment> seg(new ShmSegment(name, /*anonymous=*/false, /*owner=*/false));
  try {
    bip::shared_memory_object shm(bip::open_only, name.c_str(), bip::read_write);
    if (auto s = seg->map(shm.get_mapping_handle().handle, minBytes); !s) return s.error();
  } catch (const bip::interprocess_exception& e) {
    return makeError(ErrorCode::kUnavailable, "cannot map shared memory '", name, "': ", e.what());
  }
  return seg;
}

Result<std::unique_ptr<ShmSegment>> ShmSegment::adopt(kj::AutoCloseFd fd, uint64_t bytes) {
  std::unique_ptr<ShmSegment> seg(
      new ShmSegment("fd " + std::to_string(fd.get()), /*anonymous=*/true, /*owner=*/false));
  if (auto s = seg->map(fd.get(), bytes); !s) return s.error();
  return seg;  // the mapping keeps the memory: the descriptor closes here
}

ShmSegment::~ShmSegment() {
  if (data_) ::munmap(data_, size_);
  if (owner_ && !anonymous_) bip::shared_memory_object::remove(name_.c_str());
}

size_t removeStaleSegments(std::string_view prefix) {
  // POSIX shared memory objects appear under /dev/shm on Linux.
  std::vector<std::string> names;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir)) {
      std::string_view n(entry->d_name);
      if (n.substr(0, prefix.size()) == prefix) names.emplace_back(n);
    }
    closedir(dir);
  }
  size_t removed = 0;
  for (const auto& n : names) removed += bip::shared_memory_object::remove(n.c_str()) ? 1 : 0;
  return removed;
}

}  // namespace kvtier
