#include "daemon/access.h"

#include <grp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string>

// Linux >= 4.13; older C libraries' headers may lack the name.
#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59
#endif

namespace kvtier {
namespace {

// Supplementary groups read per peer, at most: Linux's NGROUPS_MAX.
constexpr size_t kMaxPeerGroups = 65536;

}  // namespace

bool peerAllowed(const PeerCredentials& peer, const AccessPolicy& policy) {
  if (peer.uid < 0) return false;
  if (peer.uid == 0 || peer.uid == policy.daemonUid) return true;
  if (policy.allowedGid < 0) return false;
  if (peer.gid == policy.allowedGid) return true;
  return std::find(peer.groups.begin(), peer.groups.end(), policy.allowedGid) != peer.groups.end();
}

bool peerMapsPool(const PeerCredentials& peer, const AccessPolicy& policy) {
  return peer.uid == 0 || (peer.uid >= 0 && peer.uid == policy.daemonUid);
}

Result<int64_t> resolveGroup(std::string_view value) {
  if (value.empty()) return makeError(ErrorCode::kInvalidArgument, "--allow-group is empty");
  int64_t gid = -1;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), gid);
  if (ec == std::errc() && end == value.data() + value.size()) {
    if (gid < 0 || gid >= int64_t{UINT32_MAX}) {
      return makeError(ErrorCode::kInvalidArgument, "--allow-group: ", value, " is not a gid");
    }
    return gid;
  }
  const std::string name(value);
  std::vector<char> buf(16384);
  for (;;) {
    struct group g {};
    struct group* found = nullptr;
    const int rc = ::getgrnam_r(name.c_str(), &g, buf.data(), buf.size(), &found);
    if (rc == ERANGE && buf.size() < (size_t{1} << 24)) {
      buf.resize(buf.size() * 2);
      continue;
    }
    if (rc != 0 || found == nullptr) {
      return makeError(ErrorCode::kInvalidArgument, "--allow-group: no group named '", value,
                       "' on this host (give a group name from /etc/group or a numeric gid)");
    }
    return static_cast<int64_t>(found->gr_gid);
  }
}

Result<PeerCredentials> readPeerCredentials(int fd, bool withGroups) {
  struct ucred cred {};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return makeError(ErrorCode::kUnavailable, "SO_PEERCRED: ", std::strerror(errno));
  }
  PeerCredentials peer{cred.pid, cred.uid, cred.gid, {}, false};
  if (!withGroups) return peer;
  // The kernel answers ERANGE with the length it needs when the buffer is short.
  std::vector<gid_t> groups(64);
  for (;;) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      peer.groups.assign(groups.begin(), groups.end());
      peer.groupsKnown = true;
      return peer;
    }
    const size_t wanted = bytes / sizeof(gid_t);
    if (errno != ERANGE || wanted <= groups.size() || wanted > kMaxPeerGroups) return peer;
    groups.resize(wanted);
  }
}

std::string describePeer(const PeerCredentials& peer) {
  std::string out = "pid=" + std::to_string(peer.pid) + " uid=" + std::to_string(peer.uid) +
                    " gid=" + std::to_string(peer.gid) + " groups=";
  if (!peer.groupsKnown) return out + "unknown";
  for (size_t i = 0; i < peer.groups.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(peer.groups[i]);
  }
  return out;
}

}  // namespace kvtier
