#include "daemon/access.h"

#include <grp.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

namespace kvtier {
namespace {

constexpr AccessPolicy kPolicy{/*daemonUid=*/1000, /*allowedGid=*/2000};

PeerCredentials peer(int64_t uid, int64_t gid, std::vector<int64_t> groups = {}) {
  return PeerCredentials{42, uid, gid, std::move(groups), true};
}

TEST(PeerAccess, RootAndTheDaemonsUserAreAlwaysAdmitted) {
  EXPECT_TRUE(peerAllowed(peer(0, 0), kPolicy));
  EXPECT_TRUE(peerAllowed(peer(1000, 1000), kPolicy));
  EXPECT_TRUE(peerAllowed(peer(0, 0), AccessPolicy{1000, -1}));
}

TEST(PeerAccess, OtherUsersNeedTheAllowedGroupPrimaryOrSupplementary) {
  EXPECT_TRUE(peerAllowed(peer(1001, 2000), kPolicy)) << "primary group";
  EXPECT_TRUE(peerAllowed(peer(1001, 1001, {1001, 27, 2000}), kPolicy)) << "supplementary group";
  EXPECT_FALSE(peerAllowed(peer(1001, 1001, {1001, 27}), kPolicy));
  EXPECT_FALSE(peerAllowed(peer(65534, 65534), kPolicy));
  PeerCredentials unknownGroups = peer(1001, 1001);
  unknownGroups.groupsKnown = false;
  EXPECT_FALSE(peerAllowed(unknownGroups, kPolicy));
  EXPECT_FALSE(peerAllowed(peer(1001, 2000), AccessPolicy{1000, -1})) << "no group allowed";
}

TEST(PeerAccess, UnreadableCredentialsAreRefused) {
  EXPECT_FALSE(peerAllowed(PeerCredentials{}, kPolicy));
  EXPECT_FALSE(peerAllowed(PeerCredentials{}, AccessPolicy{-1, -1}));
}

TEST(PeerAccess, OnlyRootAndTheDaemonsUserMapThePool) {
  EXPECT_TRUE(peerMapsPool(peer(0, 0), kPolicy));
  EXPECT_TRUE(peerMapsPool(peer(1000, 5), kPolicy));
  EXPECT_FALSE(peerMapsPool(peer(1001, 2000), kPolicy)) << "a group member is another tenant";
  EXPECT_FALSE(peerMapsPool(PeerCredentials{}, AccessPolicy{-1, -1}));
}

TEST(PeerAccess, ResolveGroupTakesNamesAndGids) {
  EXPECT_EQ(resolveGroup("0").value(), 0);
  EXPECT_EQ(resolveGroup("4242").value(), 4242);
  if (const struct group* root = ::getgrgid(0)) {
    EXPECT_EQ(resolveGroup(root->gr_name).value(), 0);
  }
  for (const char* bad : {"", "no-such-group-kvtier-test", "-1", "4294967295", "12ab"}) {
    auto g = resolveGroup(bad);
    ASSERT_FALSE(g.ok()) << bad;
    EXPECT_EQ(g.error().code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(g.error().message().find("--allow-group"), std::string::npos) << bad;
  }
}

TEST(PeerAccess, ReadsTheKernelsCredentialsOfASocketPeer) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  auto p = readPeerCredentials(fds[0], /*withGroups=*/true);
  ::close(fds[0]);
  ::close(fds[1]);
  ASSERT_TRUE(p.ok()) << p.error();
  EXPECT_EQ(p->pid, ::getpid());
  EXPECT_EQ(p->uid, static_cast<int64_t>(::geteuid()));
  EXPECT_EQ(p->gid, static_cast<int64_t>(::getegid()));
  ASSERT_TRUE(p->groupsKnown) << "SO_PEERGROUPS (Linux >= 4.13)";
  // The kernel reports this process's supplementary groups.
  std::vector<gid_t> own(static_cast<size_t>(std::max(::getgroups(0, nullptr), 0)));
  ASSERT_EQ(::getgroups(static_cast<int>(own.size()), own.data()), static_cast<int>(own.size()));
  EXPECT_EQ(p->groups.size(), own.size());
  EXPECT_NE(describePeer(*p).find("uid=" + std::to_string(::geteuid())), std::string::npos);

  auto bad = readPeerCredentials(-1, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kUnavailable);
}

}  // namespace
}  // namespace kvtier
