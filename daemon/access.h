// Who may talk to kvtierd, and what a peer is handed (docs/security.md).
//
// A Unix-socket peer is admitted when it is root, the daemon's user, or in the allowed group
// (`kvtierd --allow-group`; default: the daemon's group) as its primary group or one of its
// supplementary groups. Its credentials come from the kernel (SO_PEERCRED, SO_PEERGROUPS), as
// they were when it connected: nothing the peer sends is trusted for them.
//
// Pure functions over plain values, thread-safe; readPeerCredentials makes two getsockopt calls.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/error.h"

namespace kvtier {

struct PeerCredentials {
  int pid = -1;
  int64_t uid = -1;
  int64_t gid = -1;  // primary group
  // Supplementary groups (SO_PEERGROUPS), read only when the uid and primary group do not admit
  // the peer already; `groupsKnown` false when they were not read or the kernel could not say.
  std::vector<int64_t> groups;
  bool groupsKnown = false;
};

struct AccessPolicy {
  int64_t daemonUid = -1;   // the daemon's effective uid: its own clients
  int64_t allowedGid = -1;  // --allow-group, or the daemon's effective gid
};

// Whether `peer` may use the daemon: uid 0, the daemon's uid, or `allowedGid` among its primary
// and supplementary groups. A peer whose credentials could not be read (uid -1) is refused.
bool peerAllowed(const PeerCredentials& peer, const AccessPolicy& policy);

// Whether the peer may be handed the pools' handles (shared-memory names, CUDA IPC handles),
// which map the whole pool — every tenant's blocks: root and the daemon's own user only. The
// pools are created 0600 (the daemon's user), so a handle would not open for anyone else anyway;
// other tenants read and write their blocks through the socket (inline bytes).
bool peerMapsPool(const PeerCredentials& peer, const AccessPolicy& policy);

// `--allow-group NAME|GID`: a group of the host's group database by name, or a numeric gid.
// INVALID_ARGUMENT for an empty value or a name the database does not know.
Result<int64_t> resolveGroup(std::string_view nameOrGid);

// The kernel's credentials of the peer of connected Unix socket `fd` (SO_PEERCRED), and its
// supplementary groups (SO_PEERGROUPS, Linux >= 4.13) when `withGroups`. UNAVAILABLE when
// SO_PEERCRED fails; a failure of SO_PEERGROUPS only leaves groupsKnown false.
Result<PeerCredentials> readPeerCredentials(int fd, bool withGroups);

// The peer as a log line's fields: "pid=.. uid=.. gid=.. groups=a,b".
std::string describePeer(const PeerCredentials& peer);

}  // namespace kvtier
