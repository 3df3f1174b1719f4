#include "tests/huge_page_reservation.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "transport/hugetlb.h"

namespace kvtier::test {

namespace {

Result<uint64_t> readNrHugePages() {
  std::ifstream in(HugePageReservation::kNrHugePages);
  uint64_t value = 0;
  if (!(in >> value)) {
    return makeError(ErrorCode::kUnavailable, "cannot read ", HugePageReservation::kNrHugePages);
  }
  return value;
}

Status writeNrHugePages(uint64_t value) {
  std::ofstream out(HugePageReservation::kNrHugePages);
  out << value << "\n";
  out.flush();
  if (!out) {
    return makeError(ErrorCode::kUnavailable, "cannot write ", HugePageReservation::kNrHugePages,
                     " (root only)");
  }
  return {};
}

}  // namespace

uint64_t HugePageReservation::available() {
  auto counts = readHugePageCounts();
  return counts ? counts->available() : 0;
}

Result<std::unique_ptr<HugePageReservation>> HugePageReservation::reserve(uint64_t pages) {
  // The lock is the sysctl file itself, opened read-only (flock needs no more, and every user
  // may read it).
  const int raw = ::open(kNrHugePages, O_RDONLY | O_CLOEXEC);
  if (raw < 0) {
    return makeError(ErrorCode::kUnavailable, "cannot open ", kNrHugePages, ": ",
                     std::strerror(errno));
  }
  kj::AutoCloseFd lock(raw);
  int rc;
  while ((rc = ::flock(lock.get(), LOCK_EX)) != 0 && errno == EINTR) {
  }
  if (rc != 0) {
    return makeError(ErrorCode::kUnavailable, "cannot lock ", kNrHugePages, ": ",
                     std::strerror(errno));
  }
  std::unique_ptr<HugePageReservation> r(new HugePageReservation(kj::mv(lock)));
  if (pages == 0) return r;
  auto counts = readHugePageCounts();
  if (!counts) return counts.error();
  if (counts->available() >= pages) return r;
  auto found = readNrHugePages();
  if (!found) return found.error();
  r->found_ = *found;
  r->changed_ = true;  // from here on the destructor restores it, whatever happens next
  if (auto s = writeNrHugePages(*found + (pages - counts->available())); !s) return s.error();
  const uint64_t now = available();
  if (now < pages) {
    return makeError(ErrorCode::kUnavailable, "the kernel gave ", now, " free 2 MiB pages of the ",
                     pages, " asked for (memory too fragmented?)");
  }
  return r;
}

HugePageReservation::~HugePageReservation() {
  if (changed_) (void)writeNrHugePages(found_);
}

}  // namespace kvtier::test
