// Bytes flipped in the cold tier's files while a real kvtierd serves from them: every trial
// damages a file of the tier (a table, a blob file, the manifest, a log, CURRENT...), reads
// prompts that live only on disk, and checks that the daemon is still there and that every byte
// it served is the writer's. Now and then the damage is left in place, and the daemon is stopped
// (SIGTERM or SIGKILL) and started again on it: a damaged tier is moved aside, never a reason not
// to start. scripts/cold-damage.sh runs the long version (10,000 trials); ctest a short one.
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "tests/temp_dir.h"
#include "tests/test_support.h"
#include "tools/synthetic_kv.h"

namespace kvtier {
namespace {

using test::DaemonProcess;
using test::testLayout;

constexpr uint64_t kBlockBytes = 16 << 10;  // testLayout()'s block
constexpr uint64_t kPromptTokens = 64;      // 4 blocks
constexpr uint64_t kPrompts = 48;           // 192 blocks, 12x the pool

std::vector<uint32_t> prompt(uint64_t i) { return synthetic::tokens(7000 + i, kPromptTokens); }

uint64_t envNumber(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

// One changed byte in a file of the tier; undone by flipping it again.
struct Flip {
  std::filesystem::path file;
  uint64_t at = 0;
  uint8_t mask = 0;
};

bool applyFlip(const Flip& f) {
  std::fstream s(f.file, std::ios::in | std::ios::out | std::ios::binary);
  if (!s) return false;  // deleted since (a compaction, a log rolled over)
  char byte = 0;
  s.seekg(static_cast<std::streamoff>(f.at));
  if (!s.read(&byte, 1)) return false;
  byte = static_cast<char>(byte ^ f.mask);
  s.seekp(static_cast<std::streamoff>(f.at));
  return static_cast<bool>(s.write(&byte, 1));
}

struct Totals {
  uint64_t trials = 0, flips = 0, lookups = 0, hits = 0, misses = 0, bytesChecked = 0;
  uint64_t wrongBytes = 0, aborts = 0, failedStarts = 0, restarts = 0, quarantined = 0;
  uint64_t corruptDropped = 0, errors = 0;
};

class DamageRun {
 public:
  explicit DamageRun(uint64_t seed) : random_(seed) {}
  // A daemon killed last (or that ended by itself) leaves its pool's segments for the next start
  // to remove: with no next start, they go here, also when the test fails.
  ~DamageRun() {
    daemon_.reset();
    if (leftPrefix_.empty()) return;
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator("/dev/shm", ec)) {
      if (f.path().filename().string().starts_with(leftPrefix_)) std::filesystem::remove(f, ec);
    }
  }

  void start() {
    daemon_.reset();
    try {
      daemon_ = std::make_unique<DaemonProcess>(16 * kBlockBytes, dir_.path(),
                                                std::vector<std::string>{"--cold-tier", "on"});
    } catch (const std::exception& e) {
      ++totals.failedStarts;
      ADD_FAILURE() << "kvtierd did not start on a damaged tier: " << e.what();
      return;
    }
    leftPrefix_.clear();  // the new daemon removed what the one before left
    client_ = daemon_->connect();
    space_ = client_->open(testLayout()).value();
  }

  // The daemon's counters, read after every trial; added to the totals when it goes (damage that
  // its last flush meets as it stops is not counted).
  void collect() {
    if (!client_) return;
    if (auto s = client_->stats()) last_ = *s;
  }

  void stop(int signal) {
    collect();
    totals.quarantined += last_.coldQuarantined;
    totals.corruptDropped += last_.corruptDropped;
    last_ = {};
    space_.reset();
    client_.reset();
    if (daemon_ && alive()) {
      if (signal == SIGKILL) leftPrefix_ = daemon_->segmentPrefix();
      const int status = daemon_->stop(signal);
      if (signal == SIGTERM && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        ++totals.aborts;
        ADD_FAILURE() << "kvtierd ended with status " << status << " on SIGTERM";
      }
    }
    daemon_.reset();
  }

  bool running() const { return space_ != nullptr; }

  // False (and counted) if the daemon ended by itself: an abort, a crash.
  bool alive() {
    int status = 0;
    if (::waitpid(daemon_->pid(), &status, WNOHANG) != daemon_->pid()) return true;
    ++totals.aborts;
    ADD_FAILURE() << "kvtierd ended by itself, status " << status;
    leftPrefix_ = daemon_->segmentPrefix();
    // Nothing left to signal: DaemonProcess must not wait for it again.
    daemon_.release();  // NOLINT(bugprone-unused-return-value): the process is reaped
    space_.reset();
    client_.reset();
    return false;
  }

  void put(uint64_t i) {
    const auto t = prompt(i);
    const auto kv = synthetic::packedKv(testLayout(), t, 0, t.size());
    if (auto r = space_->put("p", 0, t, kv.data(), kv.size()); !r) {
      countError(r.error());
      return;
    }
    (void)space_->remove("p", 0);
  }

  // Looks prompt i up and checks every byte served; puts it again if it is not whole.
  void read(uint64_t i) {
    const auto t = prompt(i);
    ++totals.lookups;
    uint64_t n = 0;
    {
      auto hit = space_->lookup(t);  // its lease goes before the prompt is written again
      if (!hit) {
        countError(hit.error());
        return;
      }
      n = hit->matchedTokens();
      if (n > 0) {
        std::vector<uint8_t> got(n * testLayout().tokenKvBytes());
        auto copied = hit->copyTo(0, n, got.data(), got.size());
        if (copied) {
          const auto want = synthetic::packedKv(testLayout(), t, 0, n);
          totals.bytesChecked += got.size();
          for (size_t b = 0; b < got.size(); ++b) totals.wrongBytes += got[b] != want[b];
        } else if (copied.error().code() != ErrorCode::kChecksumMismatch) {
          countError(copied.error());
        }
      }
    }
    if (n == kPromptTokens) {
      ++totals.hits;
    } else {
      ++totals.misses;
      put(i);
    }
  }

  // A byte of a file of the tier, any file but the lock.
  std::optional<Flip> pickFlip() {
    std::vector<std::filesystem::path> files;
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(dir_.path() + "/cold", ec)) {
      if (f.path().filename() == "LOCK") continue;
      if (f.is_regular_file(ec) && f.file_size(ec) > 0) files.push_back(f.path());
    }
    if (files.empty()) return std::nullopt;
    // Tables and blob files hold what reads meet: half the flips go there.
    std::vector<std::filesystem::path> data;
    for (const auto& f : files) {
      if (f.extension() == ".sst" || f.extension() == ".blob") data.push_back(f);
    }
    const auto& pool = !data.empty() && coin(0.5) ? data : files;
    Flip flip;
    flip.file = pool[random_() % pool.size()];
    const uint64_t size = std::filesystem::file_size(flip.file, ec);
    if (ec || size == 0) return std::nullopt;
    flip.at = random_() % size;
    flip.mask = static_cast<uint8_t>(1u << (random_() % 8));
    return flip;
  }

  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(random_) < p; }
  uint64_t below(uint64_t n) { return random_() % n; }

  Totals totals;

 private:
  void countError(const Error& e) {
    // A typed miss or refusal is what damage may cause; a lost daemon is counted by alive().
    if (e.code() == ErrorCode::kUnavailable && daemon_ && !alive()) return;
    ++totals.errors;
    ADD_FAILURE() << "untyped or unexpected error: " << e;
  }

  test::TempDir dir_;
  std::mt19937_64 random_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Space> space_;
  Stats last_;
  std::string leftPrefix_;  // the segments of a daemon killed last, for the next start to remove
};

TEST(ColdDamage, BytesFlippedInTheTiersFilesWhileItServesAreAMissNeverAnAbortOrAWrongByte) {
  const uint64_t trials = envNumber("KVTIER_COLD_DAMAGE_TRIALS", 300);
  // ctest runs one fixed seed (the same flips every run); scripts/cold-damage.sh a new one each
  // time unless told (--seed).
  const uint64_t seed = envNumber("KVTIER_COLD_DAMAGE_SEED", 20261129);
  const auto began = std::chrono::steady_clock::now();
  DamageRun run(seed);
  run.start();
  ASSERT_TRUE(run.running());
  for (uint64_t i = 0; i < kPrompts; ++i) run.put(i);
  for (uint64_t trial = 0; trial < trials; ++trial) {
    if (!run.running()) run.start();
    if (!run.running()) break;
    ++run.totals.trials;
    // 1-4 bytes, in as many files.
    std::vector<Flip> flips;
    for (uint64_t k = 1 + run.below(4); k > 0; --k) {
      if (auto f = run.pickFlip(); f && applyFlip(*f)) flips.push_back(*f);
    }
    run.totals.flips += flips.size();
    for (int r = 0; r < 3 && run.running() && run.alive(); ++r) run.read(run.below(kPrompts));
    // Most damage is undone (the tier keeps some of what it held); some stays.
    if (run.coin(0.9)) {
      for (const Flip& f : flips) (void)applyFlip(f);
    }
    if (run.running()) run.collect();
    if (trial % 50 == 49) {
      // A restart on whatever damage is left: a graceful stop, or a kill.
      run.stop(run.coin(0.7) ? SIGTERM : SIGKILL);
      ++run.totals.restarts;
    }
  }
  run.stop(SIGTERM);
  const Totals& t = run.totals;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  std::printf(
      "{\"trials\": %lu, \"flips\": %lu, \"lookups\": %lu, \"hits\": %lu, \"misses\": %lu, "
      "\"bytes_checked\": %lu, \"wrong_bytes\": %lu, \"aborts\": %lu, \"failed_starts\": %lu, "
      "\"restarts\": %lu, \"quarantined\": %lu, \"corrupt_dropped\": %lu, \"errors\": %lu, "
      "\"seed\": %lu, \"seconds\": %.1f}\n",
      t.trials, t.flips, t.lookups, t.hits, t.misses, t.bytesChecked, t.wrongBytes, t.aborts,
      t.failedStarts, t.restarts, t.quarantined, t.corruptDropped, t.errors, seed, seconds);
  EXPECT_EQ(t.trials, trials);
  EXPECT_EQ(t.wrongBytes, 0u);
  EXPECT_EQ(t.aborts, 0u);
  EXPECT_EQ(t.failedStarts, 0u);
  EXPECT_EQ(t.errors, 0u);
  EXPECT_GT(t.bytesChecked, 0u);
  EXPECT_GT(t.hits, 0u) << "the reads must reach the tier, not only miss";
}

}  // namespace
}  // namespace kvtier
