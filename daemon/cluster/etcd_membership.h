// Cluster membership kept in etcd: each node registers /kvtier/<cluster>/nodes/<nodeId> under a
// lease it keeps alive, reads the prefix and watches it for joins and leaves.
//
// While etcd is unreachable the last list seen stays in force (onChange is never called with a
// list shrunk only because etcd is down); on reconnect the node re-registers under a new lease,
// re-reads the prefix and watches again.
//
// Threading: an EtcdMembership belongs to the thread whose KJ event loop created it; its methods,
// its promises and onChange all run on that loop.
#pragma once

#include <kj/async-io.h>
#include <kj/timer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/cluster/etcd_client.h"
#include "kvtier/error.h"

namespace kvtier::cluster {

// Longest node id and cluster name (they are path segments of etcd keys).
constexpr size_t kMaxEtcdNameBytes = 128;
// Longest address and capabilities string of a member record, ours or a peer's.
constexpr size_t kMaxMemberAddressBytes = 256;
constexpr size_t kMaxMemberCapabilitiesBytes = 4096;

struct MemberRecord {
  std::string nodeId;
  std::string address;  // HOST:PORT of the peer RPC
  std::string capabilities;
  bool operator==(const MemberRecord&) const = default;
};

struct EtcdMembershipOptions {
  std::string endpoint;  // "http://127.0.0.1:2379"
  std::string cluster;
  MemberRecord self;
  int64_t leaseTtlSeconds = 5;  // keepalive every TTL / 3
  kj::Duration requestTimeout = 2 * kj::SECONDS;
  // First delay before retrying after a failure; it doubles per failure in a row up to
  // max(retryDelay, kMaxEtcdRetryDelay), and starts over after a successful registration.
  kj::Duration retryDelay = 500 * kj::MILLISECONDS;
  // The watch is begun again (after a fresh read of the members) this often: a watch whose
  // connection went silent without closing (a half-open connection: a NAT or firewall dropped it)
  // delivers nothing, while the keepalives, each on a connection of its own, still succeed. So the
  // member list is never staler than this.
  kj::Duration watchRenewal = 2 * kj::MINUTES;
};

constexpr kj::Duration kMaxEtcdRetryDelay = 4 * kj::SECONDS;

// The value stored under a member key: {"address":"...","capabilities":"..."}.
std::string encodeMemberValue(const MemberRecord& record);
// Parses a value written by encodeMemberValue for nodeId; INVALID_ARGUMENT if it is not one, or
// breaks a bound above.
Result<MemberRecord> decodeMemberValue(std::string_view nodeId, std::string_view value);

class EtcdMembership {
 public:
  // Borrows network and timer, which must outlive this object; this object must outlive the
  // promises run() and leave() return. onChange is called on the event
  // loop with the full current member list (self included, sorted by nodeId) after the first
  // read of etcd and whenever the list changes; it must not throw, and must not destroy this
  // object.
  EtcdMembership(kj::Network& network, kj::Timer& timer, EtcdMembershipOptions options,
                 std::function<void(const std::vector<MemberRecord>&)> onChange);
  EtcdMembership(const EtcdMembership&) = delete;
  EtcdMembership& operator=(const EtcdMembership&) = delete;

  // INVALID_ARGUMENT for an empty, over-long or '/'-holding cluster or node id, a bad endpoint,
  // an empty or over-long address, a TTL outside 1 .. 3600 s, or a non-positive duration.
  static Status validate(const EtcdMembershipOptions& options);

  // Registers, reads, watches and keeps the lease alive, reconnecting with backoff whenever etcd
  // fails. Never resolves by itself; fails at once (INVALID_ARGUMENT) only if validate() fails.
  // Drop the promise to stop (the lease then expires after its TTL unless leave() revokes it).
  // At most one run() at a time (a second one while the first lives throws).
  kj::Promise<void> run();

  // Revokes our lease, so peers see us leave now rather than after the TTL, and stops a running
  // run() from registering again (it keeps watching). Fails with UNAVAILABLE when etcd does not
  // answer within the request timeout; an already gone lease is success.
  kj::Promise<void> leave();

  struct Stats {
    bool connected;          // etcd answers: registered (unless left), read and watching
    uint64_t registrations;  // successful puts of our record
    uint64_t keepAlives;     // successful lease refreshes
    uint64_t watchEvents;    // events received on the watch
    uint64_t errors;         // failed attempts (each is followed by a retry)
    uint64_t watchRenewals;  // watches begun again after options.watchRenewal
  };
  Stats stats() const { return stats_; }

  // The last list passed to onChange (empty before the first read of etcd).
  const std::vector<MemberRecord>& members() const { return published_; }
  // Our key: /kvtier/<cluster>/nodes/<nodeId>.
  const std::string& selfKey() const { return selfKey_; }
  // The lease our record is attached to (0 when none).
  int64_t lease() const { return lease_; }

 private:
  kj::Promise<void> loop(kj::Duration delay);
  kj::Promise<void> session();
  // Reads the members, then watches them until options_.watchRenewal has passed, and again.
  kj::Promise<void> watchMembers(bool first);
  kj::Promise<void> registerSelf();
  kj::Promise<void> keepAliveLoop();
  // The record a key/value under our prefix stands for; nullopt (logged) for anything else.
  std::optional<MemberRecord> parseRecord(std::string_view key, std::string_view value) const;
  void applyRange(const EtcdRange& range);
  void applyEvents(const std::vector<EtcdEvent>& events);
  void publish();

  kj::Timer& timer_;
  EtcdMembershipOptions options_;
  std::function<void(const std::vector<MemberRecord>&)> onChange_;
  Status valid_;
  EtcdClient client_;
  std::string prefix_;  // /kvtier/<cluster>/nodes/
  std::string selfKey_;
  std::string selfValue_;
  std::map<std::string, MemberRecord> records_;  // valid records in etcd, by node id
  std::vector<MemberRecord> published_;
  bool havePublished_ = false;
  int64_t lease_ = 0;
  bool left_ = false;
  bool running_ = false;       // a run() promise exists
  bool reportedDown_ = false;  // logged the current outage already
  Stats stats_{false, 0, 0, 0, 0, 0};
};

}  // namespace kvtier::cluster
