// A temporary directory for one test, removed with everything in it when the test ends.
//
// Test artifacts live under testTempRoot(): $KVTIER_TEST_TMPDIR, which ctest sets to a directory
// of its own for the run (tests/clean_run/: the run's last test checks it is empty and removes
// it), else /tmp.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace kvtier::test {

inline std::string testTempRoot() {
  const char* root = std::getenv("KVTIER_TEST_TMPDIR");
  return root && *root ? root : "/tmp";
}

// A fresh directory testTempRoot()/<prefix>XXXXXX; std::runtime_error if it cannot be made.
inline std::string makeTestDir(const std::string& prefix = "kvtier-test-") {
  std::string tmpl = testTempRoot() + "/" + prefix + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp " + tmpl + " failed");
  return tmpl;
}

class TempDir {
 public:
  TempDir() : path_(makeTestDir()) {}
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace kvtier::test
