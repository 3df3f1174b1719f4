// HugePageReservation: 2 MiB huge pages for a test or a benchmark, given back afterwards.
//
// Raises vm.nr_hugepages (/proc/sys/vm/nr_hugepages, root only) so that at least the asked number
// of 2 MiB pages are free, and writes the value it found back when destroyed — on a failed
// assertion too, as the destructor runs. Pages a process still holds then stay its own (the
// kernel counts them as surplus) and go back to ordinary memory when it lets them go.
//
// A reservation holds an exclusive flock on kNrHugePages itself for its life (the file it changes,
// which always exists: no lock file to create or leave behind), taken by reserve() (waiting for
// the holder to let go): reservations of concurrent tests and benchmarks take turns,
// so each restores the value it found and none sees another's pages. A kvtierd under
// `--huge-pages auto` that another test starts meanwhile takes free pages whenever enough for its
// whole pool are, so the daemons of the test helpers run on 4 KiB pages unless a test asks
// (test_support.h, kvtier.testing.Daemon, with_daemon.sh, the soak); the rest must do the same or
// have pools larger than any reservation (the cluster demo's 256 MiB: 128 pages).
#pragma once

#include <kj/io.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kvtier/error.h"

namespace kvtier::test {

class HugePageReservation {
 public:
  static constexpr const char* kNrHugePages = "/proc/sys/vm/nr_hugepages";

  // Takes the lock, then makes `pages` 2 MiB pages available (0: only the lock, nothing changed).
  // UNAVAILABLE, saying why, when the lock, the counts or the pages cannot be had (not root, no
  // hugetlb, memory too fragmented); nothing is left changed then.
  static Result<std::unique_ptr<HugePageReservation>> reserve(uint64_t pages);

  // Restores vm.nr_hugepages if it was changed, then lets go of the lock.
  ~HugePageReservation();
  HugePageReservation(const HugePageReservation&) = delete;
  HugePageReservation& operator=(const HugePageReservation&) = delete;

  // 2 MiB pages a new mapping can have now (HugePageCounts::available; 0 when unreadable).
  static uint64_t available();

 private:
  explicit HugePageReservation(kj::AutoCloseFd lock) : lock_(kj::mv(lock)) {}

  kj::AutoCloseFd lock_;
  bool changed_ = false;
  uint64_t found_ = 0;  // vm.nr_hugepages before
};

}  // namespace kvtier::test
