// Access control with real processes (docs/security.md): a client of another Unix user (nobody)
// is refused unless it is in the allowed group; admitted, it is a tenant of its own that cannot
// read, probe or evict root's blocks (with a quota); and no name a client sends reaches the file
// system.
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tests/huge_page_reservation.h"
#include "tests/temp_dir.h"
#include "tests/test_support.h"
#include "tools/synthetic_kv.h"

namespace kvtier {
namespace {

using test::DaemonProcess;
using test::PeerProcess;
using test::runPeer;
using test::testLayout;

struct OtherUser {
  uid_t uid;
  gid_t gid;
  std::string group;  // the name of its primary group
};

// The user `nobody` and its primary group, as the host's databases name them.
std::optional<OtherUser> nobody() {
  const struct passwd* pw = ::getpwnam("nobody");
  if (!pw) return std::nullopt;
  OtherUser u{pw->pw_uid, pw->pw_gid, {}};
  const struct group* gr = ::getgrgid(pw->pw_gid);
  u.group = gr ? gr->gr_name : std::to_string(pw->pw_gid);
  return u;
}

// The test peer's command run as `user` (its uid and group, no supplementary groups).
std::vector<std::string> as(const OtherUser& user, std::vector<std::string> command) {
  command.insert(command.begin(), {"as-user", std::to_string(user.uid), std::to_string(user.gid)});
  return command;
}

// The data directory (mkdtemp: 0700) is the socket's: others may pass through it, nothing more.
// The socket's own mode and group then decide who may connect.
void letOthersReachTheSocket(const DaemonProcess& daemon) {
  ASSERT_EQ(::chmod(daemon.dataDir().c_str(), 0711), 0);
  // The directories above (the ctest scratch root, /tmp) are traversable by everyone.
}

#define REQUIRE_ROOT_AND_NOBODY(user)                                                \
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as user nobody"; \
  const auto user##_found = nobody();                                                \
  if (!user##_found) GTEST_SKIP() << "this host has no user nobody";                 \
  const OtherUser& user = *user##_found

// Puts `tokens` with their synthetic KV as `seq`; `keep`: the sequence stays (detached) rather
// than only its blocks in the cache.
void putTokens(Space& space, const std::string& seq, const std::vector<uint32_t>& tokens,
               bool keep) {
  const auto kv = synthetic::packedKv(testLayout(), tokens, 0, tokens.size());
  PutOptions options;
  options.detached = keep;
  auto r = space.put(seq, 0, tokens, kv.data(), kv.size(), options);
  ASSERT_TRUE(r.ok()) << r.error();
  if (!keep) {
    ASSERT_TRUE(space.remove(seq, 0).ok());
  }
}

// Tokens of `tokens` a lookup matches with exactly the bytes once put.
uint64_t matchedIdentical(Space& space, const std::vector<uint32_t>& tokens) {
  auto hit = space.lookup(tokens);
  EXPECT_TRUE(hit.ok()) << hit.error();
  if (!hit.ok()) return 0;
  const uint64_t matched = hit->matchedTokens();
  std::vector<uint8_t> got(matched * testLayout().tokenKvBytes());
  EXPECT_TRUE(hit->copyTo(0, matched, got.data(), got.size()).ok());
  EXPECT_EQ(got, synthetic::packedKv(testLayout(), tokens, 0, matched)) << "bytes differ";
  return matched;
}

// On huge pages the pool has no name to withhold: its descriptors map it, and they go to root and
// the daemon's user only. Another user's process, admitted by its group, is refused them and moves
// its bytes inline; root's own process gets them.
TEST(AccessControl, AnotherUserGetsNoPoolDescriptors) {
  REQUIRE_ROOT_AND_NOBODY(user);
  auto reservation = test::HugePageReservation::reserve(8);
  if (!reservation) GTEST_SKIP() << "cannot reserve 8 huge pages: " << reservation.error();
  DaemonProcess daemon(16 << 20, "", {"--allow-group", user.group, "--huge-pages", "on"});
  letOthersReachTheSocket(daemon);
  std::string out;
  ASSERT_EQ(runPeer(as(user, {"pool-fds", daemon.socket()}), &out), 0) << out;
  EXPECT_NE(out.find("POOL_FDS PERMISSION_DENIED"), std::string::npos) << out;
  ASSERT_EQ(runPeer(as(user, {"put", daemon.socket(), "p", "7", "100"}), &out), 0) << out;
  EXPECT_NE(out.find("sealed=6"), std::string::npos) << out;
  EXPECT_NE(out.find("mapped=0"), std::string::npos) << out;
  ASSERT_EQ(runPeer({"pool-fds", daemon.socket()}, &out), 0) << out;
  EXPECT_NE(out.find("POOL_FDS OK 1"), std::string::npos) << out;
}

TEST(AccessControl, AnotherUserIsRefusedUnlessInTheAllowedGroup) {
  REQUIRE_ROOT_AND_NOBODY(user);
  {
    DaemonProcess daemon;
    letOthersReachTheSocket(daemon);
    std::string out;
    // The socket is 0660, root's group: nobody cannot even connect.
    ASSERT_EQ(runPeer(as(user, {"connect", daemon.socket()}), &out), 0) << out;
    EXPECT_EQ(out.find("CONNECT OK"), std::string::npos) << out;
    // Past the socket's mode (opened to everyone here), the daemon's own check refuses it.
    ASSERT_EQ(::chmod(daemon.socket().c_str(), 0666), 0);
    ASSERT_EQ(runPeer(as(user, {"connect", daemon.socket()}), &out), 0) << out;
    EXPECT_NE(out.find("CONNECT PERMISSION_DENIED"), std::string::npos) << out;
  }
  {
    DaemonProcess daemon(64 << 20, "", {"--allow-group", user.group});
    letOthersReachTheSocket(daemon);
    struct stat st {};
    ASSERT_EQ(::stat(daemon.socket().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0660u);
    EXPECT_EQ(st.st_gid, user.gid) << "the socket belongs to the allowed group";
    std::string out;
    ASSERT_EQ(runPeer(as(user, {"connect", daemon.socket()}), &out), 0) << out;
    EXPECT_NE(out.find("CONNECT OK"), std::string::npos) << out;
    // Another user outside the group (its own group only) is still refused by the daemon.
    ASSERT_EQ(::chmod(daemon.socket().c_str(), 0666), 0);
    const OtherUser stranger{user.uid, static_cast<gid_t>(user.gid == 12345 ? 12346 : 12345), ""};
    ASSERT_EQ(runPeer(as(stranger, {"connect", daemon.socket()}), &out), 0) << out;
    EXPECT_NE(out.find("CONNECT PERMISSION_DENIED"), std::string::npos) << out;
  }
}

TEST(AccessControl, AnUnknownAllowedGroupFailsTheStart) {
  test::TempDir dir;
  PeerProcess daemon({"--data-dir", dir.file("data"), "--allow-group", "no-such-group-kvtier",
                      "--cold-tier", "off", "--gpus", "none"},
                     KVTIER_DAEMON_PATH);
  EXPECT_EQ(daemon.wait(), 1);
  EXPECT_FALSE(std::filesystem::exists(dir.file("data"))) << "it failed before making anything";
}

TEST(AccessControl, AnotherTenantCannotReadOrProbeRootsBlocks) {
  REQUIRE_ROOT_AND_NOBODY(user);
  DaemonProcess daemon(64 << 20, "", {"--allow-group", user.group});
  letOthersReachTheSocket(daemon);
  auto root = daemon.connect();
  auto space = root->open(testLayout()).value();
  ASSERT_TRUE(root->mapped()) << "root maps the pool";
  const auto prompt = synthetic::tokens(77, 512);
  putTokens(*space, "root-seq", prompt, /*keep=*/true);
  auto snap = space->snapshot("root-seq", 0);
  ASSERT_TRUE(snap.ok()) << snap.error();
  std::string out;
  ASSERT_EQ(runPeer({"put-entry", daemon.socket(), "5"}), 0);  // root's entry under keyOf(5)

  // The same tokens hash to other keys under nobody's salt: its lookup misses (no probe).
  ASSERT_EQ(runPeer(as(user, {"verify", daemon.socket(), "77", "512", "512", "0"}), &out), 0)
      << out;
  EXPECT_NE(out.find("MATCHED 0 identical"), std::string::npos) << out;
  // Root's sequence, snapshot and entry, by name or id, and the pool by guessed reference.
  ASSERT_EQ(runPeer(as(user, {"probe", daemon.socket(), "root-seq", std::to_string(snap->id), "5"}),
                    &out),
            0)
      << out;
  for (const char* line : {"MAPPED 0", "LENGTH absent", "GET NOT_FOUND", "SNAPSHOT NOT_FOUND",
                           "RESTORE NOT_FOUND", "ENTRY NOT_FOUND", "REFS readable=0"}) {
    EXPECT_NE(out.find(std::string(line) + "\n"), std::string::npos) << line << " in\n" << out;
  }
  // Nothing of root's changed.
  EXPECT_EQ(space->length("root-seq").value(), std::optional<uint64_t>(prompt.size()));
  EXPECT_TRUE(space->snapshotInfo(snap->id).ok()) << "nobody dropped root's snapshot";
  EXPECT_EQ(matchedIdentical(*space, prompt), prompt.size());

  // Nobody is a working tenant of its own, moving its bytes inline.
  ASSERT_EQ(runPeer(as(user, {"put", daemon.socket(), "mine", "90", "64"}), &out), 0) << out;
  ASSERT_EQ(runPeer(as(user, {"verify", daemon.socket(), "90", "64", "64", "64"}), &out), 0) << out;
  EXPECT_NE(out.find("MATCHED 64 identical"), std::string::npos) << out;
  // And root does not see nobody's prompt either.
  EXPECT_EQ(matchedIdentical(*space, synthetic::tokens(90, 64)), 0u);
}

// Nobody moves its bytes inline and reads whole blocks: a block it wrote in part, or committed
// without writing, and an entry it never wrote read back as zeros — never as the bytes root's
// prompts left in the pool's blocks before them.
TEST(AccessControl, AnotherTenantsBlocksNeverHoldRootsOldBytes) {
  REQUIRE_ROOT_AND_NOBODY(user);
  DaemonProcess daemon(16 << 20, "", {"--allow-group", user.group});
  letOthersReachTheSocket(daemon);
  std::string out;
  // Root's prompts (synthetic KV, not zeros) pass through every block of the pool.
  ASSERT_EQ(runPeer({"flood", daemon.socket(), "31", "80", "256"}, &out), 0) << out;
  ASSERT_NE(out.find("FLOODED ok=80 "), std::string::npos) << out;
  ASSERT_EQ(runPeer(as(user, {"inline-fresh", daemon.socket()}), &out), 0) << out;
  for (const char* line : {"PARTIAL nonzero=0", "UNWRITTEN nonzero=0", "ENTRY nonzero=0"}) {
    EXPECT_NE(out.find(std::string(line) + "\n"), std::string::npos) << line << " in\n" << out;
  }
}

// Root caches a prompt; nobody then puts far more than the pool holds. Without a quota the flood
// evicts root's prompt (the control); with one, nobody replaces only its own blocks.
TEST(AccessControl, TenantQuotaKeepsAnotherTenantsFloodFromEvictingRootsPrompt) {
  REQUIRE_ROOT_AND_NOBODY(user);
  const auto prompt = synthetic::tokens(4242, 512);  // 32 blocks of the 256 the pool holds
  for (const bool quota : {false, true}) {
    SCOPED_TRACE(quota ? "--tenant-quota 50%" : "no quota");
    std::vector<std::string> args = {"--allow-group", user.group};
    if (quota) args.insert(args.end(), {"--tenant-quota", "50%"});
    DaemonProcess daemon(4 << 20, "", args);
    letOthersReachTheSocket(daemon);
    auto root = daemon.connect();
    auto space = root->open(testLayout()).value();
    putTokens(*space, "prompt", prompt, /*keep=*/false);  // cached, used once

    std::string out;
    // 10 requests of 64 blocks: 640 blocks through a pool of 256.
    ASSERT_EQ(runPeer(as(user, {"flood", daemon.socket(), "1000", "10", "1024"}), &out), 0) << out;
    const uint64_t matched = matchedIdentical(*space, prompt);
    if (!quota) {
      EXPECT_LT(matched, prompt.size()) << "the flood should evict root's prompt without a quota";
      continue;
    }
    EXPECT_NE(out.find("FLOODED ok=10 full=0"), std::string::npos)
        << "within its quota nobody replaces its own blocks\n"
        << out;
    EXPECT_NE(out.find("TENANT 2097152 2097152"), std::string::npos) << out;
    EXPECT_EQ(matched, prompt.size()) << "nobody's flood evicted root's prompt";
    auto stats = root->stats();
    ASSERT_TRUE(stats.ok()) << stats.error();
    EXPECT_EQ(stats->tenantQuotaBytes, uint64_t{2} << 20);
    EXPECT_EQ(stats->tenantBytesUsed, 32u * testLayout().blockBytes());
  }
}

// Every name a client sends is an opaque key of the engine's maps (or refused when too long):
// none becomes a path, a segment or a socket name. With the cold tier on, so that blocks and
// snapshots reach the disk too.
TEST(AccessControl, HostileNamesAreOpaqueKeysOrRefusedAndNothingEscapesTheDataDir) {
  DaemonProcess daemon(64 << 20, "", {"--cold-tier", "on"});
  const std::filesystem::path data = std::filesystem::canonical(daemon.dataDir());
  struct stat passwdBefore {};
  const bool havePasswd = ::stat("/etc/passwd", &passwdBefore) == 0;
  auto client = daemon.connect();
  auto space = client->open(testLayout()).value();
  const std::vector<std::string> names = {
      "../../x",        "/etc/passwd",    "..",          ".",
      "a/b/../../../x", "a b\tc\x7f\xff", "line\nbreak", "%s%n%x",
      "kvtierd.sock",   "kvtierd.lock",   "cold",        std::string(256, '/')};
  uint32_t seed = 500;
  for (const std::string& name : names) {
    SCOPED_TRACE("name '" + name + "'");
    const auto tokens = synthetic::tokens(++seed, 40);
    putTokens(*space, name, tokens, /*keep=*/true);
    EXPECT_EQ(space->length(name).value(), std::optional<uint64_t>(tokens.size()));
    auto got = space->get(name);
    ASSERT_TRUE(got.ok()) << got.error();
    std::vector<uint8_t> bytes(tokens.size() * testLayout().tokenKvBytes());
    ASSERT_TRUE(got->copyTo(0, tokens.size(), bytes.data(), bytes.size()).ok());
    EXPECT_EQ(bytes, synthetic::packedKv(testLayout(), tokens, 0, tokens.size()));
    auto snap = space->snapshot(name, 0);
    ASSERT_TRUE(snap.ok()) << snap.error();
    const std::vector<uint8_t> state(100, 7);
    EXPECT_TRUE(space->putCheckpoint(name, tokens.size(), state.data(), state.size()).ok());
  }
  // Over the bound: refused, nothing made.
  const std::string huge(64 << 10, 'n');
  const auto tokens = synthetic::tokens(1, 16);
  const auto kv = synthetic::packedKv(testLayout(), tokens, 0, tokens.size());
  auto hugePut = space->put(huge, 0, tokens, kv.data(), kv.size());
  ASSERT_FALSE(hugePut.ok());
  EXPECT_EQ(hugePut.error().code(), ErrorCode::kInvalidArgument);
  auto hugeLength = space->length(huge);
  ASSERT_FALSE(hugeLength.ok());
  EXPECT_EQ(hugeLength.error().code(), ErrorCode::kInvalidArgument);
  auto hugeCopy = space->copyPrefix(names[0], huge, 16);
  ASSERT_FALSE(hugeCopy.ok());
  EXPECT_EQ(hugeCopy.error().code(), ErrorCode::kInvalidArgument);
  // Model ids are hashed into the layout's fingerprint, and bounded.
  Layout model = testLayout();
  model.modelId = "../../../etc/passwd";
  EXPECT_TRUE(client->open(model).ok());
  model.modelId = huge;
  auto bad = client->open(model);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kInvalidArgument);
  // Client names are labels for the log: bounded, and escaped there.
  auto longName = Client::connect({.socketPath = daemon.socket(), .clientName = huge});
  ASSERT_FALSE(longName.ok());
  EXPECT_EQ(longName.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(Client::connect({.socketPath = daemon.socket(),
                               .clientName = "x\nts=0 level=warn event=forged ../../y"})
                  .ok());

  space.reset();
  client.reset();
  ASSERT_EQ(daemon.stop(SIGTERM), 0);  // spills and writes the snapshots: all on disk now
  // Nothing outside the data directory, and inside it only the daemon's own files.
  for (const char* escaped : {"x", "y"}) {
    EXPECT_FALSE(std::filesystem::exists(data.parent_path() / escaped)) << escaped;
    EXPECT_FALSE(std::filesystem::exists(data.parent_path().parent_path() / escaped)) << escaped;
  }
  for (const auto& entry : std::filesystem::recursive_directory_iterator(data)) {
    const std::string relative = std::filesystem::relative(entry.path(), data).string();
    EXPECT_TRUE(relative == "kvtierd.lock" || relative.rfind("cold", 0) == 0) << relative;
    EXPECT_FALSE(entry.is_symlink()) << relative;
    const std::string file = entry.path().filename().string();
    for (const std::string& name : names) {
      if (name.size() > 2 && name != "cold" && name != "kvtierd.lock") {
        EXPECT_EQ(file.find(name), std::string::npos) << relative;
      }
    }
  }
  if (havePasswd) {
    struct stat after {};
    ASSERT_EQ(::stat("/etc/passwd", &after), 0);
    EXPECT_EQ(after.st_mtim.tv_sec, passwdBefore.st_mtim.tv_sec);
    EXPECT_EQ(after.st_size, passwdBefore.st_size);
  }
}

}  // namespace
}  // namespace kvtier
