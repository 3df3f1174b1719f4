// UCX (ucp) for moving blocks between daemons: one context and worker per daemon, progressed from
// the daemon's KJ event loop through the worker's event fd (it never spins while idle), pool
// extents registered once with ucp_mem_map, and gets of a peer's registered bytes into local
// pool blocks.
//
// A get is a pair of active messages, not a UCX RMA get: the fetcher asks (a small request naming
// the peer's address and length), the holder answers with the bytes as an eager active message,
// and the fetcher copies them into the block the get names — only while that get is still
// pending, so bytes that arrive after a deadline are dropped, never written into a block that was
// freed meanwhile. Over tcp, UCX 1.13 implements RMA gets in software, and its answering side
// aborts the process (ucp_get_req_handler: "unexpected error: Endpoint timeout") when the asker
// has died; its active-message sends complete a request with the error instead.
//
// Connections go through a listener (UCX's client/server establishment over its sockaddr
// connection manager, as UCX's ucp_client_server example): a daemon that fetches connects to the
// holder's listener, and the holder accepts each connection with an endpoint of its own, kept until
// that peer goes or fails. Each direction between two daemons is its own connection, owned by the
// side that fetches; no endpoint is ever made from a worker address, whose wireup UCX 1.13 asserts
// on when the peer dies in the middle of it (ucp_request.c:684, "got REP message").
//
// UCX picks the transports (UCX_TLS is honoured): on one host shared memory and cma, between
// hosts tcp, and RDMA where the hardware has it. Debian's UCX is built without CUDA, so GPU pool
// blocks are never registered: they travel through host blocks.
//
// Thread-safety: none. Everything here belongs to the event loop that created the worker
// (UCS_THREAD_MODE_SINGLE).
#pragma once

#include <kj/async-unix.h>
#include <kj/timer.h>

#include <array>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvtier/error.h"

// UCX's handles, kept out of this header.
struct ucp_context;
struct ucp_worker;
struct ucp_ep;
struct ucp_mem;
struct ucp_rkey;
struct ucp_listener;
struct ucp_conn_request;

namespace kvtier {

class UcxWorker;

// A local memory region registered with ucp_mem_map. Unmapped by the destructor.
class UcxRegion {
 public:
  ~UcxRegion();
  UcxRegion(const UcxRegion&) = delete;
  UcxRegion& operator=(const UcxRegion&) = delete;

  uint8_t* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  ucp_mem* handle() const { return memh_; }

 private:
  friend class UcxWorker;
  UcxRegion(UcxWorker& worker, ucp_mem* memh, uint8_t* base, uint64_t bytes)
      : worker_(worker), memh_(memh), base_(base), bytes_(bytes) {}
  UcxWorker& worker_;
  ucp_mem* memh_;
  uint8_t* base_;
  uint64_t bytes_;
};

// What a holder hands a peer (over its authenticated peer RPC) with the bytes it pinned for it:
// the holder answers a get only for bytes inside a live grant, named by this unguessable token.
using UcxGrant = std::array<uint64_t, 2>;

// One get: `bytes` from `remoteAddress` inside remote region `region` (an index returned by
// UcxEndpoint::addRemoteRegion) into `local`, under the holder's `grant`.
struct UcxGet {
  uint8_t* local = nullptr;
  uint32_t region = 0;
  uint64_t remoteAddress = 0;
  uint64_t bytes = 0;
  UcxGrant grant = {};
};

// An endpoint to a peer's worker, with the bounds of the peer's regions. A peer that fails (its
// process died, its connection broke) fails every get in flight and every later one. Destroying
// the endpoint force-closes it; the gets in flight fail first, and their local memory is never
// written afterwards.
class UcxEndpoint {
 public:
  ~UcxEndpoint();
  UcxEndpoint(const UcxEndpoint&) = delete;
  UcxEndpoint& operator=(const UcxEndpoint&) = delete;

  // A peer region's bounds; returns its index for UcxGet::region.
  Result<uint32_t> addRemoteRegion(uint64_t address, uint64_t bytes);
  size_t remoteRegions() const { return regions_.size(); }

  // Starts every get at once. Resolves when all have completed (never rejects), with one flag per
  // get: whether it read its bytes. At `deadline` the endpoint is force-closed: the gets still in
  // flight fail (bytes that come for them later are dropped). A get outside its remote region
  // fails without being started.
  kj::Promise<std::vector<bool>> get(std::vector<UcxGet> gets, kj::TimePoint deadline,
                                     std::function<void(size_t)> onEachDone = nullptr);
  // `onEachDone`, when given, is called (on this loop, inside UCX's progress: it must not call
  // UCX) with the index of each get as soon as it has read its bytes, so that work on them can
  // overlap the gets still in flight.

  // Whether the peer failed (or the deadline force-closed the endpoint): get() fails at once.
  bool failed() const { return failed_; }
  // Resolves once the connection is established (a flush of the fresh endpoint completes then),
  // or rejects when it fails or `deadline` passes (the endpoint is then closed). Regions may be
  // added only after it resolved.
  kj::Promise<void> connected(kj::TimePoint deadline);

 private:
  friend class UcxWorker;
  friend struct UcxCallbacks;
  struct Batch;
  explicit UcxEndpoint(UcxWorker& worker);
  // Force-closes the endpoint (idempotent); in-flight gets complete as failed.
  void close();
  // The flush connected() waits on has completed.
  void flushDone(int status);
  // Frees the batches that have completed.
  void sweep();

  struct RemoteRegion {
    uint64_t address = 0, bytes = 0;
  };
  UcxWorker& worker_;
  ucp_ep* ep_ = nullptr;
  bool failed_ = false;
  std::vector<RemoteRegion> regions_;
  std::list<std::unique_ptr<Batch>> batches_;       // in flight
  kj::Own<kj::PromiseFulfiller<void>> connecting_;  // connected()'s, while it waits
};

class UcxWorker {
 public:
  // Creates the context (features: RMA and wakeup) and worker, and starts progressing them on
  // `port`'s loop. `port` and `timer` are borrowed and must outlive the worker.
  static Result<std::unique_ptr<UcxWorker>> create(kj::UnixEventPort& port, kj::Timer& timer);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // Starts the listener other daemons connect to, on `host` (a numeric address or a name) and
  // any free port; returns the port. Idempotent: a second call returns the port it has.
  Result<uint16_t> listen(const std::string& host);
  // Connections accepted from peers that are open now.
  size_t acceptedConnections() const { return accepted_.size(); }
  // Lets peers read `ranges` (inside mapped regions) under a fresh random token, until revoked.
  UcxGrant grant(std::vector<std::pair<const uint8_t*, uint64_t>> ranges);
  void revoke(const UcxGrant& grant);
  // The transports UCX chose for this worker (for logs and stats).
  const std::string& transports() const { return transports_; }

  // Registers [base, base + bytes) for remote access.
  Result<std::unique_ptr<UcxRegion>> map(uint8_t* base, uint64_t bytes);
  // An endpoint to the listener of the daemon at host:port (with peer failure detection). The
  // connection is made in the background: see UcxEndpoint::connected.
  Result<std::unique_ptr<UcxEndpoint>> connect(const std::string& host, uint16_t port);

  // Progresses the worker now and until it has nothing left to do (after posting operations).
  void kick();
  // While a peer may be reading this node's memory (blocks pinned for its gets), the worker is
  // also progressed on a short tick, as while gets of its own are in flight: over tcp a peer's
  // gets need this side's progress, and a wake-up through the event fd can come late.
  void holdBegin() {
    ++holds_;
    kick();
  }
  void holdEnd() { --holds_; }

  ucp_worker* handle() const { return worker_; }
  kj::Timer& timer() { return timer_; }

 private:
  UcxWorker(kj::UnixEventPort& port, kj::Timer& timer) : port_(port), timer_(timer) {}
  kj::Promise<void> progressLoop();
  // Whether any endpoint has gets posted and not completed (the worker then also progresses on
  // a short tick).
  bool getsInFlight() const;
  // Closes the endpoints whose peer failed (UCX reports it inside progress, where closing is not
  // allowed), accepted ones included.
  void closeFailed();
  // Accepts the connection requests the listener queued during progress (or rejects them past
  // kMaxAccepted): endpoints are not made inside UCX's callback.
  void acceptPending();
  // A get a peer asked for: answered after progress (not inside UCX's callback).
  struct Ask {
    ucp_ep* reply = nullptr;
    uint64_t id = 0, address = 0, bytes = 0;
    UcxGrant grant = {};
  };
  // Answers the gets peers asked for: each with the bytes when they lie in a mapped region and
  // the asking endpoint is still open, else with a refusal.
  void answerAsked();
  // A get's answer has come: its bytes (or a refusal) for the pending get `id`, if it still is.
  void answered(uint64_t id, bool ok, const void* data, size_t length);
  // An endpoint accepted from a peer: it asks for gets through it and the answers go back on it.
  struct Accepted {
    UcxWorker* worker = nullptr;
    ucp_ep* ep = nullptr;
    bool failed = false;
  };
  static void forceClose(ucp_worker* worker, ucp_ep* ep);
  friend class UcxEndpoint;
  friend class UcxRegion;
  friend struct UcxCallbacks;

  kj::UnixEventPort& port_;
  kj::Timer& timer_;
  ucp_context* context_ = nullptr;
  ucp_worker* worker_ = nullptr;
  ucp_listener* listener_ = nullptr;
  uint16_t listenPort_ = 0;
  std::vector<ucp_conn_request*> requests_;            // queued by the listener's callback
  std::list<std::unique_ptr<Accepted>> accepted_;      // open, from peers
  std::vector<Ask> asked_;                             // queued by the get request handler
  std::vector<std::pair<uint8_t*, uint64_t>> mapped_;  // regions peers may read (map())
  struct GrantHash {
    size_t operator()(const UcxGrant& g) const { return g[0] ^ (g[1] * 0x9e3779b97f4a7c15ull); }
  };
  // Live grants: what each lets a peer read.
  std::unordered_map<UcxGrant, std::vector<std::pair<const uint8_t*, uint64_t>>, GrantHash> grants_;
  // Gets of this worker's endpoints waiting for their answer, by id.
  struct Pending {
    UcxEndpoint* endpoint;
    void* batch;
    size_t index;
    uint8_t* local;
    uint64_t bytes;
  };
  std::unordered_map<uint64_t, Pending> pending_;
  // A new get's id: random, never 0 nor pending (newGetId).
  uint64_t newGetId();
  std::array<uint64_t, 64> ids_{};  // drawn from getrandom, used from the back
  size_t idsLeft_ = 0;
  std::string transports_;
  int efd_ = -1;
  size_t holds_ = 0;  // peers' pins on our memory: progress also on the short tick
  kj::Own<kj::UnixEventPort::FdObserver> observer_;
  kj::Own<kj::PromiseFulfiller<void>> wake_;
  std::vector<UcxEndpoint*> endpoints_;  // open ones, for closeFailed
  bool anyFailed_ = false;
  kj::Promise<void> loop_ = nullptr;
};

}  // namespace kvtier
