// The kvtierd RPC server: Cap'n Proto over a Unix socket, on top of the engine.
//
// One KJ event loop owns everything here (single writer, no locks). Each accepted connection gets
// its own RpcSystem whose bootstrap is a Daemon capability bound to the peer's credentials. When a
// connection ends — orderly, or because the client died — its RpcSystem drops every capability the
// client held: each lease's destructor releases its pins or frees its uncommitted blocks, and the
// session's destructor removes the sequences it owned that are not detached.
#pragma once

#include <kj/async-io.h>
#include <kj/async-unix.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "daemon/access.h"
#include "daemon/cold_service.h"
#include "daemon/lane.h"
#include "daemon/remote_tier.h"
#include "daemon/tier_service.h"
#include "schemas/kvtier.capnp.h"
#include "store/engine.h"
#include "transport/busy_poll.h"
#include "transport/host_pool.h"

namespace kvtier {

// After a failed accept (the process is out of descriptors), the pause before the next try.
inline constexpr kj::Duration kAcceptRetryDelay = 250 * kj::MILLISECONDS;

// A GPU pool as clients see it: its device, its engine tier and its exported extents.
struct GpuPoolExport {
  struct Extent {
    uint32_t id = 0;
    uint64_t bytes = 0;
    std::vector<uint8_t> ipcHandle;
  };
  int device = 0;
  std::string pciBusId;
  uint8_t tier = 0;
  std::vector<Extent> extents;
};

class Server final : private kj::TaskSet::ErrorHandler {
 public:
  // `engine`, `pool`, `cold` (optional: no cold tier), `tiers` (optional: no GPU pools) and
  // `poller` (optional: no busy polling) are borrowed and must outlive the server. Client
  // connections tell `poller` of every message they read, so the loop polls for the next message
  // of a hot conversation.
  // `remote` (optional: not in a cluster) is borrowed too: lookups ask it for what this node
  // lacks.
  Server(Engine& engine, HostPool& pool, ColdService* cold = nullptr, TierService* tiers = nullptr,
         std::vector<GpuPoolExport> gpus = {}, BusyPoller* poller = nullptr,
         RemoteTier* remote = nullptr);
  ~Server();

  // Accepts connections until the returned promise is cancelled. Each is read through a
  // SocketStream on `port` (the loop's own event port), which watches it for reading only.
  // Accepts clients until cancelled. A failed accept (out of descriptors: EMFILE) is logged and
  // tried again after a pause; it never ends the loop, nor the daemon.
  kj::Promise<void> acceptLoop(kj::ConnectionReceiver& listener, kj::UnixEventPort& port,
                               kj::Timer& timer);

  // Serves one client connection, as acceptLoop serves each it accepts: a socket connected some
  // other way, e.g. one end of a socket pair (the in-process fuzz harness). The peer's
  // credentials are read from the socket.
  void serve(kj::Own<kj::AsyncIoStream> stream) { accept(kj::mv(stream)); }
  // The daemon's bootstrap capability for a client in this process, called without a connection
  // (Cap'n Proto's local calls: no message is encoded or read back): what the in-process fuzz
  // harness drives the RPC objects through. Admitted as this process's own user.
  rpc::Daemon::Client localClient();

  // Who is admitted and who maps the pools (daemon/access.h). Default: the daemon's effective uid
  // and gid.
  void setAccess(const AccessPolicy& policy) { access_ = policy; }
  const AccessPolicy& access() const { return access_; }

  uint64_t sessions() const { return sessions_; }
  // Every counter, in Prometheus text format.
  std::string metricsText();

  // Used by the RPC objects (server.cc); not for callers of the server.
  Engine& engine() { return engine_; }
  HostPool& hostPool() { return pool_; }
  ColdService* cold() { return cold_; }
  TierService* tiers() { return tiers_; }
  RemoteTier* remote() { return remote_; }
  const std::vector<GpuPoolExport>& gpus() const { return gpus_; }
  OwnerId newOwner() { return nextOwner_++; }
  void sessionOpened() { ++sessions_; }
  void sessionClosed() { --sessions_; }
  // Names a tenant for metrics ("uid:1000"), as hello assigned its salt.
  void nameTenant(const Salt& salt, std::string name);
  // Each session's fast lane, while the session lives, for its client to attach to by token.
  void addLane(Lane& lane) { lanes_[lane.token()] = &lane; }
  void removeLane(const Lane& lane) { lanes_.erase(lane.token()); }
  LaneStats& laneStats() { return laneStats_; }

 private:
  void taskFailed(kj::Exception&& exception) override;
  void accept(kj::Own<kj::AsyncIoStream> stream);
  void serveRpc(kj::Own<kj::AsyncIoStream> stream, const PeerCredentials& peer, bool allowed);
  kj::Promise<void> attachLane(kj::Own<kj::AsyncIoStream> stream, const PeerCredentials& peer);
  // A pool_fds connection (transport/pool_fds.h): the descriptors of the pool's anonymous segments
  // for a peer that may map the pool, then the connection ends.
  kj::Promise<void> servePoolFds(kj::Own<kj::AsyncIoStream> stream, const PeerCredentials& peer);
  void answerPoolFds(const kj::AsyncIoStream& stream, uint32_t version,
                     const PeerCredentials& peer);

  Engine& engine_;
  HostPool& pool_;
  BusyPoller* poller_;
  ColdService* cold_;
  TierService* tiers_;
  RemoteTier* remote_;
  std::vector<GpuPoolExport> gpus_;
  AccessPolicy access_;
  std::vector<std::pair<Salt, std::string>> tenantNames_;  // one per tenant that said hello
  std::map<Lane::Token, Lane*> lanes_;
  LaneStats laneStats_;
  uint64_t sessions_ = 0;
  OwnerId nextOwner_ = 1;
  kj::TaskSet tasks_;
};

}  // namespace kvtier
