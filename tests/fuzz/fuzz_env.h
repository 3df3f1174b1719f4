// What the fuzz harnesses share with their environment: a scratch directory that is gone when the
// process exits (libFuzzer ends a run with exit(), so a destructor of a static may never run).
//
// The directory lives under $KVTIER_TEST_TMPDIR (set by ctest: see tests/clean_run/), else
// $TMPDIR, else /tmp. scripts/fuzz.sh removes what a crashed harness leaves.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

namespace kvtier::fuzz {

inline std::string scratchRoot() {
  for (const char* var : {"KVTIER_TEST_TMPDIR", "TMPDIR"}) {
    const char* v = std::getenv(var);
    if (v && *v) return v;
  }
  return "/tmp";
}

// Paths removed at exit (std::atexit), with every file in them.
inline void removeAtExit(const std::string& path) {
  static std::vector<std::string>* paths = [] {
    auto* p = new std::vector<std::string>();
    std::atexit([] {
      for (const auto& path : *paths) {
        std::error_code ignored;
        std::filesystem::remove_all(path, ignored);
      }
    });
    return p;
  }();
  paths->push_back(path);
}

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name) {
    std::string tmpl = scratchRoot() + "/kvtier-fuzz-" + name + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    path_ = tmpl;
    removeAtExit(path_);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace kvtier::fuzz
