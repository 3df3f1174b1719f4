// The SDK's own declarations shared by its files (not installed): the client's event-loop state,
// a namespace's capability, a lease, and the helpers that build requests and read answers.
#pragma once

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/debug.h>

#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>

#include "client/lane.h"
#include "kernels/block_copy.h"
#include "kvtier/client.h"
#include "schemas/kvtier.capnp.h"
#include "store/limits.h"
#include "transport/buffered_stream.h"
#include "transport/busy_poll.h"
#include "transport/cross_thread.h"
#include "transport/pool_fds.h"
#include "transport/rpc_codec.h"
#include "transport/shm_segment.h"
#include "transport/socket_stream.h"
#ifdef KVTIER_HAVE_CUDA
#include <mutex>

#include "kernels/gpu.h"
#include "transport/cuda_pool.h"
#endif

namespace kvtier {

// How long a client waits for the daemon's answer with the pool's descriptors (at its first open).
inline constexpr std::chrono::milliseconds kPoolFdsTimeout{5000};

// ---------------------------------------------------------------------------------------------
// The client's event-loop thread. Every capnp object lives there. In own-thread mode other threads
// reach it through an inbox: a caller queues its call under a mutex, rings the loop thread's
// doorbell (a KJ cross-thread fulfiller) and waits on a condition variable for the loop thread to
// say its call has settled. (Not kj::Executor: its hand-offs go through KJ's futex-based mutex,
// which ThreadSanitizer cannot see; these go through std::mutex, which it can.)

// One call from another thread. Shared by the caller and the loop thread, so that the loop thread
// can wake the caller after it has let go of the call's mutex (a caller woken under the mutex
// would only block on it again) without the caller freeing the call under it.
struct PendingCall {
  // On the loop thread: starts the call; the promise settles once its result is stored.
  kj::Function<kj::Promise<void>()> start;
  std::mutex mutex;
  std::condition_variable settled;
  bool done = false;  // guarded by mutex
};

// One connection to kvtierd: the Cap'n Proto session, the fast lane and the pool as that daemon
// offered it. A client connects again when its daemon went away and came back (a new daemon: a
// new session, a new pool), and the connection it had lives on while anything opened on it —
// a Space not reopened yet, a lease, views into its mapped pool — still holds it: their
// capabilities and memory stay valid (the calls on them fail: the daemon is gone). Shared by the
// client (the current one), its spaces and leases; destroyed on the client's loop thread.
struct Connection {
  uint64_t epoch = 0;  // 1 for the first connection, +1 for each reconnection
  kj::Own<kj::AsyncIoStream> stream;
  kj::Own<capnp::TwoPartyVatNetwork> network;
  kj::Own<capnp::RpcSystem<capnp::rpc::twoparty::VatId>> rpcSystem;
  kj::Maybe<rpc::Session::Client> session;
  // The session's fast lane for lookups and puts (client/lane.h); null without one
  // (ClientOptions::lane off, or a daemon that offered none or refused the attach).
  std::shared_ptr<ClientLane> lane;
  std::vector<uint8_t> laneToken;  // from hello
  // The daemon is gone: the Cap'n Proto connection ended (watched below), or a lane call found
  // its socket closed.
  std::atomic<bool> lost{false};
  kj::Promise<void> watch = nullptr;  // sets `lost` when the network disconnects

  // Written during opens under the loop, read by handles: the loop serialises both.
  std::map<uint32_t, std::unique_ptr<ShmSegment>> mappings;
  bool mapped = false;
  // GPU extents this connection was told of: their blocks have no host view.
  std::set<uint32_t> gpuExtents;
#ifdef KVTIER_HAVE_CUDA
  // Opened once per extent (guarded by the client's gpuMutex).
  std::map<uint32_t, std::unique_ptr<DeviceMapping>> deviceMappings;
  std::map<uint32_t, std::unique_ptr<HostRegistration>> hostRegistrations;
#endif

  rpc::Session::Client& sessionCap() { return KJ_ASSERT_NONNULL(session); }
  const uint8_t* view(const BlockRef& ref) const;
  // The host view of a granted block: its bytes in the mapped pool, or an empty span for a block
  // in GPU memory (reached with kernels). INTERNAL for a block outside every mapping.
  Result<std::span<uint8_t>> grantedView(const BlockRef& ref) const;
  // Capabilities first, then the connection under them.
  ~Connection() {
    watch = nullptr;
    session = nullptr;
    rpcSystem = nullptr;
    network = nullptr;
    stream = nullptr;
  }
};

struct Client::Impl {
  ClientOptions options;
  std::thread thread;
  bool callerThread = false;
  std::thread::id callerThreadId;
  std::optional<kj::AsyncIoContext> ownedIo;  // caller-thread mode: the caller's event loop
  // Caller-thread mode: when the daemon's answers came, to poll for the next one while hot.
  std::optional<Conversation> answers;

  // Own-thread mode: the inbox, guarded by inboxMutex. Calls from other threads; lease
  // capabilities dropped by callers (a caller that drops a handle queues its lease and rings
  // instead of waiting for a round trip: the release goes out as soon as the loop thread runs, and
  // always before any later call of this client, as run() drops what is queued first); and the
  // request to stop. The doorbell is the loop thread's while it waits; whoever queues something
  // takes it and rings it; the loop thread arms a new one once it has taken what is queued, and
  // rings it at once if more came meanwhile.
  std::mutex inboxMutex;
  std::deque<std::shared_ptr<PendingCall>> calls;
  std::vector<capnp::Capability::Client> dropped;
  // Connections whose last holder let go off the loop thread: destroyed there.
  std::vector<std::shared_ptr<Connection>> droppedConnections;
  bool stopRequested = false;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> doorbell;
  // Queues `cap` for the loop thread to drop (own-thread mode; any thread).
  void dropLater(capnp::Capability::Client&& cap);
  void dropLater(std::shared_ptr<Connection>&& connection);
  // On the loop thread: drops what callers queued.
  void dropQueued();
  // Queues `call` and waits until the loop thread has settled it (own-thread mode; any thread but
  // the loop's).
  void callOnLoop(const std::shared_ptr<PendingCall>& call);
  // Asks the loop thread to stop (own-thread mode; any thread).
  void requestStop();
  // On the loop thread: serves the inbox each time the doorbell rings, until cancelled.
  kj::Promise<void> serveInbox();
  // The doorbell, if the loop thread waits on it, for the caller to ring once it has let go of
  // inboxMutex (rung under it, the woken loop thread would block on the mutex). Requires
  // inboxMutex.
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> takeDoorbell();
  // On the loop thread: the calls started from the inbox, until they settle.
  kj::Own<kj::TaskSet> callTasks;

  // Loop-thread state (touched only inside run()).
  kj::AsyncIoContext* io = nullptr;
  kj::Own<kj::PromiseFulfiller<void>> stop;

  // The current connection. Replaced (on the loop thread, under connectionMutex) when the client
  // connects again; read from any thread through connection().
  std::shared_ptr<Connection> current;
  mutable std::mutex connectionMutex;
  std::shared_ptr<Connection> connection() const {
    std::lock_guard lock(connectionMutex);
    return current;
  }
  // Reconnection (ClientOptions::reconnect): the last attempt, whether one is under way (one
  // thread at a time tries; the others fail fast meanwhile), and how many succeeded.
  std::mutex reconnectMutex;
  std::chrono::steady_clock::time_point lastAttempt{};
  std::atomic<bool> reconnecting{false};
  std::atomic<uint64_t> reconnects{0};
  // When the current connection was lost and an attempt is due, connects again (blocking, on
  // the calling thread for its parts that block: the lane's attach; the rest on the loop).
  // Returns at once otherwise. Any thread but the loop's.
  void reconnectIfDue();

  // The lane of `c`, when this call may take it: the client maps the pool (the lane carries no
  // bytes), and a caller-thread client is called from its own thread. Null otherwise.
  ClientLane* laneHere(const Connection& c) const {
    if (!c.lane || !c.mapped) return nullptr;
    if (callerThread && std::this_thread::get_id() != callerThreadId) return nullptr;
    return c.lane.get();
  }

  // From the first connection's hello (a daemon that restarts keeps its devices).
  std::string daemonVersion;
  std::vector<int> devices;  // with a GPU pool on the daemon (the daemon's ordinals)
  std::vector<std::string> devicePciBusIds;  // of those devices, in the same order
#ifdef KVTIER_HAVE_CUDA
  // Guards the connections' GPU mappings and the copiers (a client may be called from several
  // threads; kernels launch from the caller's thread).
  std::mutex gpuMutex;
  std::map<int, std::unique_ptr<kernels::gpu::PagedCopier>> copiers;
  // The address a kernel on `device` uses for a block of connection `c`: the IPC mapping of a
  // GPU extent, or the registered host mapping of a host extent. Requires gpuMutex.
  Result<uint8_t*> devicePointer(Connection& c, const BlockRef& ref);
#endif

  // Runs `f` on the loop thread and waits for its result; kj::Exceptions become kvtier Errors.
  // In caller-thread mode it runs `f` right here, and refuses calls from other threads.
  template <typename F>
  auto run(F&& f) -> Result<kj::_::UnwrapPromise<kj::PromiseForResult<F, void>>> {
    using T = kj::_::UnwrapPromise<kj::PromiseForResult<F, void>>;
    if (callerThread && std::this_thread::get_id() != callerThreadId) {
      return makeError(ErrorCode::kInvalidArgument,
                       "a caller-thread kvtier::Client was used from another thread");
    }
    // A client whose daemon went away connects again first when an attempt is due.
    if (options.reconnect && !tInReconnect) reconnectIfDue();
    // Handles dropped on other threads are released before this call (caller-thread mode).
    if (callerThread) dropQueued();
    // Releases sent over the lane are served before this call (another connection).
    if (auto c = connection(); c && c->lane) c->lane->sync();
    try {
      if (callerThread) {
        using R = decltype(f());
        auto& ws = ownedIo->waitScope;
        if constexpr (std::is_void_v<R>) {
          f();
          ws.poll();  // flush the messages the call queued (releases, finishes)
          return {};
        } else if constexpr (std::is_void_v<T>) {
          waitForAnswer(f(), ws, *answers);
          ws.poll();
          return {};
        } else if constexpr (kj::isSameType<R, T>()) {
          T value = f();
          ws.poll();
          return value;
        } else {
          T value = waitForAnswer(f(), ws, *answers);
          ws.poll();
          return value;
        }
      }
      // Leases dropped before this call are released before it. The result, or the exception,
      // comes back through `out` and `failed`, written on the loop thread before it says the call
      // is done (under the call's mutex, which orders them before this thread reads them).
      using Out = std::conditional_t<std::is_void_v<T>, kj::_::Void, T>;
      std::optional<Out> out;
      kj::Maybe<kj::Exception> failed;
      auto afterDrops = [&]() {
        dropQueued();
        return f();
      };
      auto call = std::make_shared<PendingCall>();
      call->start = [&]() -> kj::Promise<void> {
        if constexpr (std::is_void_v<T>) {
          return callNow(afterDrops)
              .then([&out]() { out.emplace(); },
                    [&failed](kj::Exception&& e) { failed = kj::mv(e); });
        } else {
          return callNow(afterDrops)
              .then([&out](T&& v) { out.emplace(kj::mv(v)); },
                    [&failed](kj::Exception&& e) { failed = kj::mv(e); });
        }
      };
      callOnLoop(call);
      KJ_IF_MAYBE (e, failed) {
        return fromKjException(*e);
      }
      if (!out) return makeError(ErrorCode::kUnavailable, "the client's event loop has stopped");
      if constexpr (std::is_void_v<T>) {
        return {};
      } else {
        return std::move(*out);
      }
    } catch (const kj::Exception& e) {
      return fromKjException(e);
    }
  }
  // Set on the thread that reconnects while it does (its own calls do not try again), and around
  // the calls that only let go of something (a lease's release, a space's close).
  static thread_local bool tInReconnect;
  struct NoReconnect {
    bool was = tInReconnect;
    NoReconnect() { tInReconnect = true; }
    ~NoReconnect() { tInReconnect = was; }
  };

  Status connect();
  // A new connection: connects and says hello on the loop (`context`); the lane is attached by
  // the caller (blocking). UNAVAILABLE when the daemon cannot be reached.
  kj::Promise<std::shared_ptr<Connection>> dial(kj::AsyncIoContext& context);
  // Connects on the current thread's event loop (the first connection).
  Status setup(kj::AsyncIoContext& context);
  // Attaches the fast lane to `c` (before anyone else sees it; blocking).
  void attachLane(Connection& c);
  void teardown();
  void loop(std::promise<Status>& ready);
  rpc::Session::Client& sessionCap() { return current->sessionCap(); }
  // A host extent as Session.open offers it: a name to open, or a descriptor to ask for over the
  // daemon's socket (transport/pool_fds.h), or neither (not offered: bytes move inline).
  struct HostExtent {
    uint32_t id = 0;
    std::string shmName;
    uint64_t bytes = 0;
    bool byDescriptor = false;
  };
  // Maps the extents of `c` not mapped yet (on the loop thread: writes its `mappings`). Any that
  // cannot be mapped leaves the connection unmapped (inline bytes) and says why. Blocks while it
  // asks the daemon for descriptors (one connection, at most kPoolFdsTimeout).
  Status mapExtents(Connection& c, const std::vector<HostExtent>& extents);

  // A namespace opened on the current connection (Session.open), its extents mapped.
  struct OpenedSpace {
    kj::Maybe<rpc::Space::Client> cap;
    uint32_t lane = 0;
    uint64_t fingerprint = 0;
    std::shared_ptr<Connection> connection;
  };
  Result<OpenedSpace> openSpace(const Layout& layout, int device);
};

// A namespace's capability (lives on the loop thread), on the connection it was opened on; opened
// again on the client's new connection at its first call after a reconnection (Space::refresh).
struct Space::Impl {
  kj::Maybe<rpc::Space::Client> cap;  // on the loop thread only
  // The connection and the lane's number for the space there (0: none); read on any thread.
  struct On {
    std::shared_ptr<Connection> connection;
    uint32_t lane = 0;
  };
  On on() const {
    std::lock_guard lock(mu);
    return {connection, lane};
  }
  mutable std::mutex mu;
  std::shared_ptr<Connection> connection;  // guarded by mu
  uint32_t lane = 0;                       // guarded by mu
  std::mutex refreshMutex;                 // one reopen at a time
  rpc::Space::Client& space() { return KJ_ASSERT_NONNULL(cap); }
};

// ---------------------------------------------------------------------------------------------
// Leases

// The checksums a write took of granted blocks as it copied them (kernels/block_sum.h), by block.
struct BlockSums {
  std::vector<uint64_t> sum;
  std::vector<uint8_t> fused;  // sum[i] holds block i's bytes as the last write left them
  // Blocks whose bytes were handed out (WriteHandle::block): the caller may write them at any
  // time before the commit, after a write() too, so the commit sums their bytes as they are then.
  std::vector<uint8_t> handedOut;
  void forget(size_t first, size_t end) {  // blocks written some other way since
    for (size_t i = first; i < end && i < fused.size(); ++i) fused[i] = 0;
  }
  void handOut(size_t i) {
    if (handedOut.size() <= i) handedOut.resize(i + 1, 0);
    handedOut[i] = 1;
  }
  bool fusedSum(size_t i) const {
    return i < fused.size() && fused[i] && !(i < handedOut.size() && handedOut[i]);
  }
};

struct LeaseState {
  Client::Impl* client = nullptr;
  // The connection the lease was granted on: its capability and views belong to it.
  std::shared_ptr<Connection> connection;
  kj::Maybe<capnp::Capability::Client> cap;
  // A lease granted over the fast lane instead: released (a read lease) or aborted (a write
  // lease) over it, unless committed.
  std::shared_ptr<ClientLane> lane;
  uint64_t laneLease = 0;
  bool laneWrite = false;
  BlockSums sums;  // a write lease's: what its writes fused
  ~LeaseState() {
    if (lane && laneLease != 0) {
      if (laneWrite) {
        lane->abort(laneLease);
      } else {
        lane->release(laneLease);
      }
    }
    // Dropping the capability sends the daemon a release without waiting for it. A caller-thread
    // client drops it here (on another thread, which has no event loop of the client's, it is
    // queued: the client's thread drops it at its next call); an own-thread one hands it to its
    // loop thread without waiting.
    const bool here = client->callerThread && std::this_thread::get_id() == client->callerThreadId;
    KJ_IF_MAYBE (c, cap) {
      if (here) {
        Client::Impl::NoReconnect quiet;
        (void)client->run([this] { cap = nullptr; });
      } else {
        client->dropLater(kj::mv(*c));
        cap = nullptr;
      }
    }
    // The connection goes on the loop thread too (the last holder of an old one destroys it).
    if (connection && !here) client->dropLater(std::move(connection));
  }
};

// ---------------------------------------------------------------------------------------------
// Requests and answers

inline capnp::ReaderOptions clientReaderOptions() {
  capnp::ReaderOptions options;
  options.traversalLimitInWords =
      2 * (kMaxInlineBytesPerCall + (uint64_t{8} << 20)) / sizeof(capnp::word);
  return options;
}

inline BlockRef refFrom(rpc::BlockRef::Reader r) {
  return BlockRef{r.getExtent(), r.getOffset(), r.getBytes(), r.getGeneration()};
}

// A block a lane answer names.
inline BlockRef refFrom(const BlockLocation& b) {
  return BlockRef{b.extent, b.offset, b.bytes, b.generation};
}

// A put as the lane carries it: space `laneSpace`'s number on the lane.
inline lane::PutArgs lanePut(uint32_t laneSpace, std::string_view seq, uint64_t begin,
                             std::span<const uint32_t> tokens, const PutOptions& options) {
  return {laneSpace,      seq,          begin, tokens, options.keys, options.detached,
          options.window, options.chunk};
}

inline kernels::BlockGeometry geometry(const Layout& l) {
  return {l.numLayers, l.blockTokens, l.tokenBytes()};
}

inline void setTokens(capnp::List<uint32_t>::Builder out, std::span<const uint32_t> tokens) {
  for (uint32_t i = 0; i < tokens.size(); ++i) out.set(i, tokens[i]);
}

inline void setKeys(capnp::List<capnp::Data>::Builder out, std::span<const Key128> keys) {
  for (uint32_t i = 0; i < keys.size(); ++i)
    out.set(i, capnp::Data::Reader(keys[i].bytes.data(), keys[i].bytes.size()));
}

inline Error invalid(auto&&... args) { return makeError(ErrorCode::kInvalidArgument, args...); }

// The whole of `s` as capnp Text, for names sent to the daemon. capnp's Text made from a
// std::string takes its c_str() and so ends at the first NUL: a name holding one silently named
// another sequence ("a\0b" was "a"). Sent whole, the daemon refuses it (INVALID_ARGUMENT).
class WireText {
 public:
  explicit WireText(std::string_view s) : s_(s) {}
  operator capnp::Text::Reader() const { return capnp::Text::Reader(s_.data(), s_.size()); }

 private:
  std::string s_;  // NUL-terminated after its size, as capnp::Text::Reader requires
};

// Writes packed KV of positions [from, to) into granted pool blocks (views[0] starts at
// firstPosition). NOT_SUPPORTED for a block in GPU memory (no host view). A block the write
// covers whole is copied with its checksum fused in (kept in `sums`); a block written in part
// loses the checksum `sums` had for it.
Status writeIntoViews(const Layout& layout, std::span<const std::span<uint8_t>> views,
                      uint64_t firstPosition, uint64_t from, uint64_t to, const void* kv,
                      BlockSums& sums);
// The checksums a commit carries (Engine::commit): one per block a grant ending at `end` fills,
// the fused one where `sums` has it, else taken from the block's bytes in the pool (a block
// completed by an append, or written through WriteHandle::block or a paged copy). Empty when a
// block has no host view (GPU memory): the daemon takes them then.
std::vector<uint64_t> commitSums(const Layout& layout, std::span<const std::span<uint8_t>> views,
                                 uint64_t firstPosition, uint64_t end, const BlockSums& sums);

// INVALID_ARGUMENT unless positions [from, to) lie within a handle's [begin, end). `what` names
// the call, `holds` what the handle has ("held", "granted").
inline Status checkRange(const char* what, const char* holds, uint64_t from, uint64_t to,
                         uint64_t begin, uint64_t end) {
  if (from > to || from < begin || to > end) {
    return invalid(what, " range [", from, ", ", to, ") is outside the ", holds, " [", begin, ", ",
                   end, ")");
  }
  return {};
}

// PutOptions and LookupOptions both carry how a sequence they create is kept.
template <typename Options>
void setSeqOptions(rpc::SeqOptions::Builder out, const Options& options) {
  out.setDetached(options.detached);
  out.setWindow(options.window);
  out.setChunk(options.chunk);
}

// Fills a ReadHandle's views from refs, mapped or inline.
inline Status attachViews(Connection& client, std::vector<BlockRef>& refs,
                          std::vector<std::vector<uint8_t>>& inlineData,
                          std::vector<std::span<const uint8_t>>& views) {
  if (!inlineData.empty()) {
    for (auto& d : inlineData) views.emplace_back(d.data(), d.size());
    return {};
  }
  for (const auto& ref : refs) {
    auto v = client.grantedView(ref);  // empty for GPU memory: Space::gatherTo reads it
    if (!v) return v.error();
    views.emplace_back(v->data(), v->size());
  }
  return {};
}

template <typename Response>
void readBlocks(Response& r, std::vector<BlockRef>& refs, std::vector<std::vector<uint8_t>>& data) {
  for (auto b : r.getBlocks()) refs.push_back(refFrom(b));
  for (auto d : r.getData()) data.emplace_back(d.begin(), d.end());
}

inline SnapshotInfo snapshotFrom(rpc::SnapshotInfo::Reader r) {
  SnapshotInfo info{r.getId(), r.getFrom(), r.getTo(), {}, r.getNode()};
  for (uint64_t pos : r.getCheckpoints()) info.checkpoints.push_back(pos);
  return info;
}

}  // namespace kvtier
