// The client: its event-loop thread, the daemon connection, the mapped pool, and the calls on
// the whole daemon (open, stats, cluster, drain).

#include "client/client_internal.h"

#include <algorithm>
#include <sstream>

#include "tools/json_string.h"  // header-only: the stats JSON's strings
#ifdef KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <strings.h>
#endif

namespace kvtier {

thread_local bool Client::Impl::tInReconnect = false;

kj::Promise<std::shared_ptr<Connection>> Client::Impl::dial(kj::AsyncIoContext& context) {
  auto c = std::make_shared<Connection>();
  return context.provider->getNetwork()
      .parseAddress(kj::str("unix:", options.socketPath.c_str()))
      .then([](kj::Own<kj::NetworkAddress>&& address) {
        auto connecting = address->connect();
        return connecting.attach(kj::mv(address));
      })
      .then([this, c, &context](kj::Own<kj::AsyncIoStream>&& socket) {
        // No busy polling on an own-thread client's loop thread: the caller it wakes with each
        // answer is placed on its core, and a polling loop thread would hold that core
        // (measured: a one-block lookup took ~200 us instead of ~60).
        c->stream =
            kj::heap<BufferedIoStream>(readWatchedSocket(context.unixEventPort, kj::mv(socket)));
        c->network = kj::heap<capnp::TwoPartyVatNetwork>(
            *c->stream, capnp::rpc::twoparty::Side::CLIENT, clientReaderOptions());
        c->rpcSystem = kj::heap(capnp::makeRpcClient(*c->network));
        // The connection's end, whenever it comes, marks it lost (the client connects again).
        Connection* raw = c.get();
        c->watch = c->network->onDisconnect()
                       .then([raw] { raw->lost = true; })
                       .eagerlyEvaluate([raw](kj::Exception&&) { raw->lost = true; });
        capnp::word scratch[4];
        memset(scratch, 0, sizeof scratch);
        capnp::MallocMessageBuilder message(scratch);
        auto vatId = message.getRoot<capnp::rpc::twoparty::VatId>();
        vatId.setSide(capnp::rpc::twoparty::Side::SERVER);
        auto daemon = c->rpcSystem->bootstrap(vatId).castAs<rpc::Daemon>();
        auto req = daemon.helloRequest();
        req.setProtocolVersion(rpc::PROTOCOL_VERSION);
        req.setClientName(WireText(options.clientName));
        return req.send();
      })
      .then([this, c](capnp::Response<rpc::Daemon::HelloResults>&& resp) {
        if (devices.empty() && devicePciBusIds.empty() && daemonVersion.empty()) {
          daemonVersion = resp.getDaemonVersion().cStr();
          for (int d : resp.getDevices()) devices.push_back(d);
          for (auto pci : resp.getDevicePciBusIds()) devicePciBusIds.push_back(pci.cStr());
        }
        c->session = resp.getSession();
        auto token = resp.getLaneToken();
        c->laneToken.assign(token.begin(), token.end());
        return c;
      });
}

Status Client::Impl::setup(kj::AsyncIoContext& context) {
  io = &context;
  std::shared_ptr<Connection> made;
  KJ_IF_MAYBE (e,
               kj::runCatchingExceptions([&] { made = dial(context).wait(context.waitScope); })) {
    Error error = fromKjException(*e);
    if (error.code() == ErrorCode::kInternal || error.code() == ErrorCode::kUnavailable) {
      error = makeError(ErrorCode::kUnavailable, "cannot reach kvtierd at ", options.socketPath,
                        ": ", e->getDescription().cStr());
    }
    return error;
  }
  made->epoch = 1;
  std::lock_guard lock(connectionMutex);
  current = std::move(made);
  return {};
}

void Client::Impl::attachLane(Connection& c) {
  if (!options.lane || c.laneToken.empty()) return;
  // Without a lane every call goes over Cap'n Proto, as with a daemon that offers none.
  auto lane = ClientLane::attach(options.socketPath, c.laneToken, options.busyPoll,
                                 std::chrono::seconds(5));
  if (lane) c.lane = std::move(lane).value();
}

void Client::Impl::reconnectIfDue() {
  // A caller-thread client's loop runs only in its calls: the end of the connection is seen once
  // the loop has looked.
  if (callerThread && std::this_thread::get_id() == callerThreadId && ownedIo) {
    ownedIo->waitScope.poll();
  }
  auto c = connection();
  if (!c || !c->lost) return;
  {
    std::lock_guard lock(reconnectMutex);
    const auto now = std::chrono::steady_clock::now();
    // Attempts are spaced by the interval whatever the rate of calls: a failed call does not
    // move the next attempt (it did once, and a client calling without pause never came back).
    if (reconnecting || now - lastAttempt < options.reconnectInterval) return;
    lastAttempt = now;
    reconnecting = true;
  }
  tInReconnect = true;
  auto made = run([this] { return dial(*io); });
  if (made) {
    attachLane(**made);
    (*made)->epoch = c->epoch + 1;
    // Installed on the loop thread: the old connection is let go there (what still holds it —
    // spaces not reopened yet, leases — keeps it until they are done).
    (void)run([this, &made] {
      std::shared_ptr<Connection> old;
      {
        std::lock_guard lock(connectionMutex);
        old = std::exchange(current, std::move(*made));
      }
    });
    ++reconnects;
  }
  tInReconnect = false;
  reconnecting = false;
}

void Client::Impl::teardown() {
  // On the loop's thread; leases dropped on other threads first.
  dropQueued();
  {
    std::lock_guard lock(connectionMutex);
    current = nullptr;
  }
  io = nullptr;
}

namespace {

// The calls' tasks catch their own errors; anything else is a bug worth a log line.
struct LogTaskErrors final : kj::TaskSet::ErrorHandler {
  void taskFailed(kj::Exception&& e) override { KJ_LOG(ERROR, "client call task failed", e); }
};
LogTaskErrors logTaskErrors;

}  // namespace

kj::Own<kj::CrossThreadPromiseFulfiller<void>> Client::Impl::takeDoorbell() {
  // The loop thread arms a new one once it has taken what is queued.
  return kj::mv(doorbell);
}

namespace {

// Wakes the loop thread without waiting for it.
void ring(kj::Own<kj::CrossThreadPromiseFulfiller<void>> doorbell) {
  if (doorbell.get() != nullptr) doorbell->fulfill();
}

}  // namespace

void Client::Impl::dropLater(capnp::Capability::Client&& cap) {
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> bell;
  {
    std::lock_guard<std::mutex> lock(inboxMutex);
    dropped.push_back(kj::mv(cap));
    bell = takeDoorbell();
  }
  ring(kj::mv(bell));
}

void Client::Impl::dropLater(std::shared_ptr<Connection>&& connection) {
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> bell;
  {
    std::lock_guard<std::mutex> lock(inboxMutex);
    droppedConnections.push_back(std::move(connection));
    bell = takeDoorbell();
  }
  ring(kj::mv(bell));
}

void Client::Impl::dropQueued() {
  std::vector<capnp::Capability::Client> batch;
  std::vector<std::shared_ptr<Connection>> connections;
  {
    std::lock_guard<std::mutex> lock(inboxMutex);
    batch.swap(dropped);
    connections.swap(droppedConnections);
  }
  batch.clear();        // here, on the loop thread: each sends its release
  connections.clear();  // then the connections under them
}

void Client::Impl::callOnLoop(const std::shared_ptr<PendingCall>& call) {
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> bell;
  {
    std::lock_guard<std::mutex> lock(inboxMutex);
    if (stopRequested) return;  // the loop is ending: no result (run() says UNAVAILABLE)
    calls.push_back(call);
    bell = takeDoorbell();
  }
  ring(kj::mv(bell));
  std::unique_lock<std::mutex> lock(call->mutex);
  call->settled.wait(lock, [&call] { return call->done; });
}

void Client::Impl::requestStop() {
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> bell;
  {
    std::lock_guard<std::mutex> lock(inboxMutex);
    stopRequested = true;
    bell = takeDoorbell();
  }
  ring(kj::mv(bell));
}

namespace {

// Tells the thread waiting in callOnLoop that `call` has settled (its result stored before).
void settle(const std::shared_ptr<PendingCall>& call) {
  {
    std::lock_guard<std::mutex> lock(call->mutex);
    call->done = true;
  }
  call->settled.notify_one();  // `call` is ours too: the caller may be gone already
}

}  // namespace

kj::Promise<void> Client::Impl::serveInbox() {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  {
    std::lock_guard<std::mutex> lock(inboxMutex);
    // Queued while no doorbell was armed (a stop too: a client destroyed right after connect()
    // asks before the loop first arms one): rung at once.
    if (!calls.empty() || !dropped.empty() || !droppedConnections.empty() || stopRequested) {
      paf.fulfiller->fulfill();
    } else {
      doorbell = kj::mv(paf.fulfiller);
    }
  }
  return paf.promise.then([this]() {
    std::deque<std::shared_ptr<PendingCall>> taken;
    bool stopping = false;
    {
      std::lock_guard<std::mutex> lock(inboxMutex);
      taken.swap(calls);
      stopping = stopRequested;
    }
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([this] { dropQueued(); })) {
      KJ_LOG(ERROR, "dropping released leases failed", *e);
    }
    // Armed again after the inbox is taken (armed before, it would find it still full and ring
    // itself for nothing): what was queued meanwhile makes serveInbox() ring at once.
    auto next = serveInbox();
    for (auto& call : taken) {
      // The caller is told once the call's promise is gone, settled or cancelled (with the loop):
      // the attachment goes after everything the call's promise held.
      auto told = kj::defer([call]() { settle(call); });
      kj::Promise<void> started = nullptr;
      KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() { started = call->start(); })) {
        started = kj::mv(*e);
      }
      callTasks->add(started.attach(kj::mv(told)));
    }
    if (stopping && stop->isWaiting()) stop->fulfill();
    return next;
  });
}

void Client::Impl::loop(std::promise<Status>& ready) {
  auto context = kj::setupAsyncIo();
  const Status status = setup(context);
  auto paf = kj::newPromiseAndFulfiller<void>();
  stop = kj::mv(paf.fulfiller);
  callTasks = kj::heap<kj::TaskSet>(logTaskErrors);
  // The doorbell is armed before connect() returns, so the first call or stop finds it.
  kj::Promise<void> serving = status ? serveInbox().eagerlyEvaluate(nullptr) : kj::READY_NOW;
  ready.set_value(status);
  if (status) {
    paf.promise.wait(context.waitScope);
    std::deque<std::shared_ptr<PendingCall>> left;
    {
      std::lock_guard<std::mutex> lock(inboxMutex);
      stopRequested = true;  // nothing is queued after this
      doorbell = nullptr;
      left.swap(calls);
    }
    for (const auto& call : left) settle(call);  // never started: no result
    dropQueued();
  }
  callTasks = nullptr;  // cancels calls under way; each one's caller is told
  teardown();
}

Status Client::Impl::connect() {
  if (options.threading == ClientThreading::kCallerThread) {
    callerThread = true;
    callerThreadId = std::this_thread::get_id();
    ownedIo.emplace(kj::setupAsyncIo());
    answers.emplace(options.busyPoll);
    Status status = setup(*ownedIo);
    if (!status) {
      teardown();
      ownedIo.reset();
    }
    return status;
  }
  std::promise<Status> ready;
  auto future = ready.get_future();
  thread = std::thread([this, &ready] { loop(ready); });
  Status status = future.get();
  if (!status) thread.join();
  return status;
}

Status Client::Impl::mapExtents(Connection& c, const std::vector<HostExtent>& extents) {
  if (!options.mapPool) return {};
  // Streaming stores or memcpy into the pool, as this machine copies faster (measured once).
  kernels::chooseCopyMethodsOnce();
  // Anonymous (hugetlb) extents have no name: their descriptors come in one reply, asked for once.
  std::map<uint32_t, pool_fds::ReceivedExtent> received;
  bool asked = false;
  const auto unmapped = [&c](Error error) {
    // Another host, no permission or no memory: bytes go inline for this client.
    c.mapped = false;
    c.mappings.clear();
    return error;
  };
  for (const auto& e : extents) {
    if (c.mappings.count(e.id)) continue;
    Result<std::unique_ptr<ShmSegment>> seg = makeError(ErrorCode::kInternal, "unreachable");
    if (e.byDescriptor) {
      if (!asked) {
        asked = true;
        auto got = pool_fds::request(options.socketPath, kPoolFdsTimeout);
        if (!got) return unmapped(got.error());
        for (auto& r : *got) received.emplace(r.id, std::move(r));
      }
      auto it = received.find(e.id);
      if (it == received.end() || it->second.bytes != e.bytes) {
        return unmapped(makeError(ErrorCode::kProtocolMismatch, "kvtierd sent no descriptor for ",
                                  "extent ", e.id, " of ", e.bytes, " bytes"));
      }
      seg = ShmSegment::adopt(kj::mv(it->second.fd), e.bytes);
      // Huge pages: this process's page tables too, at one entry per 2 MiB, so that no write
      // here faults. (With 4 KiB pages that would cost ~0.2 s per GiB at every client's open: a
      // client takes one minor fault per page as it first touches it.)
      if (seg && (*seg)->pages() == PageKind::kHuge2M) (void)(*seg)->populate();
    } else if (!e.shmName.empty()) {
      seg = ShmSegment::open(e.shmName, e.bytes);
    } else {
      // The daemon hands the pool's names to its own user and root only (docs/security.md).
      return unmapped(
          makeError(ErrorCode::kPermissionDenied, "kvtierd offers this client no pool mapping"));
    }
    if (!seg) return unmapped(seg.error());
    c.mappings.emplace(e.id, std::move(seg).value());
  }
  c.mapped = true;
  return {};
}

const uint8_t* Connection::view(const BlockRef& ref) const {
  auto it = mappings.find(ref.extent);
  if (it == mappings.end() || ref.offset + ref.bytes > it->second->size() ||
      ref.offset + ref.bytes < ref.offset) {
    return nullptr;
  }
  return it->second->data() + ref.offset;
}

Result<std::span<uint8_t>> Connection::grantedView(const BlockRef& ref) const {
  if (gpuExtents.count(ref.extent)) return std::span<uint8_t>();
  const uint8_t* p = view(ref);
  if (!p) return makeError(ErrorCode::kInternal, "daemon granted a block outside the mapped pool");
  return std::span<uint8_t>(const_cast<uint8_t*>(p), ref.bytes);
}

// ---------------------------------------------------------------------------------------------

Result<std::unique_ptr<Client>> Client::connect(const ClientOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  // Polling longer than a scheduler slice only burns CPU; negative is off.
  impl->options.busyPoll = std::clamp(options.busyPoll, std::chrono::microseconds(0), kMaxBusyPoll);
  if (auto s = impl->connect(); !s) return s.error();
  // Before anyone else sees the connection (the loop thread only runs calls, none yet).
  impl->attachLane(*impl->current);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  if (impl_->callerThread) {
    impl_->teardown();
    impl_->ownedIo.reset();
    return;
  }
  // Joining the thread orders everything it did before what follows here.
  impl_->requestStop();
  impl_->thread.join();
}

const std::string& Client::daemonVersion() const { return impl_->daemonVersion; }
bool Client::mapped() const {
  auto c = impl_->connection();
  return c && c->mapped;
}
uint64_t Client::reconnects() const { return impl_->reconnects; }
Result<Client::Impl::OpenedSpace> Client::Impl::openSpace(const Layout& layout, int device) {
  struct GpuExtent {
    uint32_t id;
    uint64_t bytes;
    std::vector<uint8_t> handle;
  };
  struct Opened {
    OpenedSpace space;
    std::vector<HostExtent> extents;
    std::vector<GpuExtent> gpuExtents;
  };
  // The daemon numbers devices as it sees them; this process may see them under other ordinals
  // (CUDA_VISIBLE_DEVICES): name ours by PCI bus id, and map with our own ordinal.
  int daemonDevice = device;
#ifdef KVTIER_HAVE_CUDA
  if (device >= 0 && !devicePciBusIds.empty()) {
    const std::string pci = pciBusId(device);
    if (pci.empty()) {
      return makeError(ErrorCode::kInvalidArgument, "no CUDA device ", device, " in this process");
    }
    daemonDevice = -2;  // a device the daemon has no pool on: it refuses the open
    for (size_t i = 0; i < devicePciBusIds.size(); ++i) {
      if (strcasecmp(devicePciBusIds[i].c_str(), pci.c_str()) == 0) daemonDevice = devices[i];
    }
    if (daemonDevice == -2) {
      return makeError(ErrorCode::kInvalidArgument, "kvtierd has no GPU pool on CUDA device ",
                       device, " (PCI ", pci, ")");
    }
  }
#endif
  auto opened = run([&] {
    auto c = current;
    auto req = c->sessionCap().openRequest();
    layoutToRpc(layout, req.initLayout());
    req.setDevice(daemonDevice);
    return req.send().then([c](capnp::Response<rpc::Session::OpenResults>&& r) {
      Opened o;
      o.space.cap = r.getSpace();
      o.space.lane = r.getLane();
      o.space.fingerprint = r.getFingerprint();
      o.space.connection = c;
      for (auto e : r.getExtents()) {
        if (e.getDevice() >= 0) {
          auto h = e.getIpcHandle();
          o.gpuExtents.push_back({e.getId(), e.getBytes(), {h.begin(), h.end()}});
        } else {
          o.extents.push_back(
              {e.getId(), e.getShmName().cStr(), e.getBytes(), e.getByDescriptor()});
        }
      }
      return o;
    });
  });
  if (!opened) return opened.error();
  Connection& c = *opened->space.connection;
  // Mapping the pool is best effort: without it, bytes travel inline.
  (void)run([&] {
    (void)mapExtents(c, opened->extents);
    for (const auto& g : opened->gpuExtents) c.gpuExtents.insert(g.id);
  });
#ifdef KVTIER_HAVE_CUDA
  for (const auto& g : opened->gpuExtents) {
    std::lock_guard<std::mutex> lock(gpuMutex);
    if (c.deviceMappings.count(g.id)) continue;
    IpcHandleBytes handle{};
    Result<std::unique_ptr<DeviceMapping>> mapping =
        makeError(ErrorCode::kInternal, "GPU extent ", g.id, " came with a bad IPC handle");
    if (g.handle.size() == handle.size()) {
      std::copy(g.handle.begin(), g.handle.end(), handle.begin());
      mapping = DeviceMapping::open(device, handle, g.bytes);
    }
    if (!mapping) {
      // The space capability belongs to the loop thread: drop it there.
      (void)run([&] { opened->space.cap = nullptr; });
      return mapping.error();
    }
    c.deviceMappings.emplace(g.id, std::move(mapping).value());
  }
#endif
  OpenedSpace out;
  (void)run([&] { out = std::move(opened->space); });  // capabilities move on the loop thread
  return out;
}

Result<std::unique_ptr<Space>> Client::open(const Layout& layout, const OpenOptions& options) {
  if (auto s = layout.validate(); !s) return s.error();
#ifndef KVTIER_HAVE_CUDA
  if (options.device != -1) {
    return makeError(ErrorCode::kNotSupported, "this kvtier client was built without CUDA");
  }
#endif
  auto opened = impl_->openSpace(layout, options.device);
  if (!opened) return opened.error();
  auto spaceImpl = std::make_unique<Space::Impl>();
  (void)impl_->run([&] {
    spaceImpl->cap = kj::mv(opened->cap);
    spaceImpl->lane = opened->lane;
    spaceImpl->connection = std::move(opened->connection);
  });
  const uint64_t fingerprint = opened->fingerprint;
  return std::unique_ptr<Space>(
      new Space(*this, std::move(spaceImpl), layout, fingerprint, options.device));
}

const std::vector<int>& Client::devices() const { return impl_->devices; }

#ifdef KVTIER_HAVE_CUDA
Result<uint8_t*> Client::Impl::devicePointer(Connection& c, const BlockRef& ref) {
  auto& deviceMappings = c.deviceMappings;
  auto& mappings = c.mappings;
  auto& hostRegistrations = c.hostRegistrations;
  if (auto it = deviceMappings.find(ref.extent); it != deviceMappings.end()) {
    if (ref.offset + ref.bytes > it->second->size() || ref.offset + ref.bytes < ref.offset) {
      return makeError(ErrorCode::kInternal, "block outside its GPU extent");
    }
    return it->second->data() + ref.offset;
  }
  auto seg = mappings.find(ref.extent);
  if (seg == mappings.end() || ref.offset + ref.bytes > seg->second->size()) {
    return makeError(ErrorCode::kNotSupported, "block in extent ", ref.extent,
                     " is neither in a mapped GPU pool nor in the mapped host pool");
  }
  auto reg = hostRegistrations.find(ref.extent);
  if (reg == hostRegistrations.end()) {
    // Host-pool blocks are read and written by the kernels in place, over the bus.
    auto made = HostRegistration::create(seg->second->data(), seg->second->size());
    if (!made) return made.error();
    reg = hostRegistrations.emplace(ref.extent, std::move(made).value()).first;
  }
  return reg->second->devicePointer(seg->second->data() + ref.offset);
}
#endif

Result<Stats> Client::stats() {
  return impl_->run([&] {
    return impl_->sessionCap().statsRequest().send().then(
        [](capnp::Response<rpc::Session::StatsResults>&& r) {
          auto s = r.getStats();
          Stats out;
          out.blocksTotal = s.getBlocksTotal();
          out.blocksUsed = s.getBlocksUsed();
          out.blocksPinned = s.getBlocksPinned();
          out.blocksCached = s.getBlocksCached();
          out.bytesTotal = s.getBytesTotal();
          out.bytesUsed = s.getBytesUsed();
          out.hits = s.getHits();
          out.misses = s.getMisses();
          out.evictions = s.getEvictions();
          out.evictionPolicy = s.getEvictionPolicy().cStr();
          out.evictionFollowing = s.getEvictionFollowing().cStr();
          out.evictionSwitches = s.getEvictionSwitches();
          out.blocksCorrupt = s.getBlocksCorrupt();
          out.clients = s.getClients();
          out.sequences = s.getSequences();
          out.readLeases = s.getReadLeases();
          out.writeLeases = s.getWriteLeases();
          out.bytesPut = s.getBytesPut();
          out.bytesGot = s.getBytesGot();
          out.snapshots = s.getSnapshots();
          out.entries = s.getEntries();
          out.checkpoints = s.getCheckpoints();
          out.spilled = s.getSpilled();
          out.promoted = s.getPromoted();
          out.coldRecords = s.getColdRecords();
          out.coldBytes = s.getColdBytes();
          out.coldDiskBytes = s.getColdDiskBytes();
          out.corruptDropped = s.getCorruptDropped();
          out.coldQuarantined = s.getColdQuarantined();
          out.spillErrors = s.getSpillErrors();
          out.evictedUnspilled = s.getEvictedUnspilled();
          out.coldEvicted = s.getColdEvicted();
          out.coldSnapshots = s.getColdSnapshots();
          out.coldSnapshotsDropped = s.getColdSnapshotsDropped();
          out.gpuBlocksTotal = s.getGpuBlocksTotal();
          out.gpuBlocksUsed = s.getGpuBlocksUsed();
          out.gpuDemoted = s.getGpuDemoted();
          out.gpuPromoted = s.getGpuPromoted();
          out.clusterMembers = s.getClusterMembers();
          out.clusterMembersUp = s.getClusterMembersUp();
          out.directoryEntries = s.getDirectoryEntries();
          out.heldKeys = s.getHeldKeys();
          out.publishBacklog = s.getPublishBacklog();
          out.directoryRehomed = s.getDirectoryRehomed();
          out.remoteLookups = s.getRemoteLookups();
          out.remoteLookupsCut = s.getRemoteLookupsCut();
          out.lookupPeerMessages = s.getLookupPeerMessages();
          out.lookupPeerMessagesMax = s.getLookupPeerMessagesMax();
          out.directoryQueries = s.getDirectoryQueries();
          out.directoryKeys = s.getDirectoryKeys();
          out.remoteHitBlocks = s.getRemoteHitBlocks();
          out.remoteHitBytes = s.getRemoteHitBytes();
          out.servedBlocks = s.getServedBlocks();
          out.fetchTimeouts = s.getFetchTimeouts();
          out.fetchUnavailable = s.getFetchUnavailable();
          out.fetchTransfer = s.getFetchTransfer();
          out.fetchChecksum = s.getFetchChecksum();
          out.fetchFull = s.getFetchFull();
          out.peerAuthFailures = s.getPeerAuthFailures();
          out.peerRttMicros = s.getPeerRttMicros();
          out.tenantBytesUsed = s.getTenantBytesUsed();
          out.tenantQuotaBytes = s.getTenantQuotaBytes();
          out.poolPages = s.getPoolPages().cStr();
          out.poolPagesReason = s.getPoolPagesReason().cStr();
          out.laneLookups = s.getLaneLookups();
          out.lanesAttached = s.getLanesAttached();
          out.lanesRefused = s.getLanesRefused();
          out.lanePuts = s.getLanePuts();
          for (auto sp : s.getSpaces()) {
            out.spaces.push_back(SpaceStats{sp.getFingerprint(), sp.getBlockBytes(),
                                            sp.getBlocksTotal(), sp.getBlocksUsed(),
                                            sp.getSequences()});
          }
          return out;
        });
  });
}

Result<std::pair<std::string, std::vector<ClusterMember>>> Client::cluster() {
  return impl_->run([&] {
    return impl_->sessionCap().clusterRequest().send().then([](capnp::Response<
                                                                rpc::Session::ClusterResults>&& r) {
      std::pair<std::string, std::vector<ClusterMember>> out;
      out.first = r.getNodeId();
      for (auto m : r.getMembers()) {
        out.second.push_back(ClusterMember{m.getNodeId(), m.getAddress(), m.getUp(), m.getSelf()});
      }
      return out;
    });
  });
}

Result<DrainStep> Client::drain(uint32_t maxSnapshots, uint32_t maxBlocks) {
  return impl_->run([&] {
    auto req = impl_->sessionCap().drainRequest();
    req.setMaxSnapshots(maxSnapshots);
    req.setMaxBlocks(maxBlocks);
    return req.send().then([](capnp::Response<rpc::Session::DrainResults>&& r) {
      auto p = r.getProgress();
      return DrainStep{p.getSnapshotsMoved(), p.getBlocksCopied(), p.getSnapshotsLeft(),
                       p.getBlocksLeft(), p.getFailures()};
    });
  });
}

std::string Stats::toJson() const {
  std::ostringstream o;
  o << "{\"blocks\": {\"total\": " << blocksTotal << ", \"used\": " << blocksUsed
    << ", \"pinned\": " << blocksPinned << ", \"cached\": " << blocksCached
    << ", \"corrupt\": " << blocksCorrupt << "}, \"bytes\": {\"total\": " << bytesTotal
    << ", \"used\": " << bytesUsed << ", \"put\": " << bytesPut << ", \"got\": " << bytesGot
    << "}, \"hits\": " << hits << ", \"misses\": " << misses << ", \"evictions\": " << evictions
    << ", \"eviction\": {\"policy\": \"" << evictionPolicy << "\", \"following\": \""
    << evictionFollowing << "\", \"switches\": " << evictionSwitches << "}"
    << ", \"clients\": " << clients << ", \"sequences\": " << sequences
    << ", \"leases\": {\"read\": " << readLeases << ", \"write\": " << writeLeases
    << "}, \"snapshots\": " << snapshots << ", \"entries\": " << entries
    << ", \"checkpoints\": " << checkpoints << ", \"cold\": {\"spilled\": " << spilled
    << ", \"promoted\": " << promoted << ", \"records\": " << coldRecords
    << ", \"bytes\": " << coldBytes << ", \"disk_bytes\": " << coldDiskBytes
    << ", \"corrupt_dropped\": " << corruptDropped << ", \"quarantined\": " << coldQuarantined
    << ", \"spill_errors\": " << spillErrors << ", \"evicted_unspilled\": " << evictedUnspilled
    << ", \"capacity_evicted\": " << coldEvicted << ", \"snapshots\": " << coldSnapshots
    << ", \"snapshots_dropped\": " << coldSnapshotsDropped
    << "}, \"gpu\": {\"blocks_total\": " << gpuBlocksTotal << ", \"blocks_used\": " << gpuBlocksUsed
    << ", \"demoted\": " << gpuDemoted << ", \"promoted\": " << gpuPromoted
    << "}, \"cluster\": {\"members\": " << clusterMembers
    << ", \"members_up\": " << clusterMembersUp << ", \"directory_entries\": " << directoryEntries
    << ", \"held_keys\": " << heldKeys << ", \"publish_backlog\": " << publishBacklog
    << ", \"rehomed\": " << directoryRehomed << ", \"remote_lookups\": " << remoteLookups
    << ", \"remote_lookups_cut\": " << remoteLookupsCut
    << ", \"lookup_peer_messages\": " << lookupPeerMessages
    << ", \"lookup_peer_messages_max\": " << lookupPeerMessagesMax
    << ", \"directory_queries\": " << directoryQueries << ", \"directory_keys\": " << directoryKeys
    << ", \"remote_hit_blocks\": " << remoteHitBlocks
    << ", \"remote_hit_bytes\": " << remoteHitBytes << ", \"served_blocks\": " << servedBlocks
    << ", \"fetch_errors\": {\"timeout\": " << fetchTimeouts
    << ", \"unavailable\": " << fetchUnavailable << ", \"transfer\": " << fetchTransfer
    << ", \"checksum\": " << fetchChecksum << ", \"full\": " << fetchFull
    << "}, \"auth_failures\": " << peerAuthFailures << ", \"peer_rtt_us\": " << peerRttMicros
    << "}, \"tenant\": {\"bytes_used\": " << tenantBytesUsed
    << ", \"quota_bytes\": " << tenantQuotaBytes << "}, \"lanes\": {\"lookups\": " << laneLookups
    << ", \"puts\": " << lanePuts << ", \"attached\": " << lanesAttached
    << ", \"refused\": " << lanesRefused << "}, \"pool\": {\"pages\": " << jsonString(poolPages)
    << ", \"reason\": " << jsonString(poolPagesReason) << "}, \"spaces\": [";
  for (size_t i = 0; i < spaces.size(); ++i) {
    const auto& s = spaces[i];
    o << (i ? ", " : "") << "{\"fingerprint\": \"" << std::hex << s.fingerprint << std::dec
      << "\", \"block_bytes\": " << s.blockBytes << ", \"blocks_total\": " << s.blocksTotal
      << ", \"blocks_used\": " << s.blocksUsed << ", \"sequences\": " << s.sequences << "}";
  }
  o << "]}";
  return o.str();
}

}  // namespace kvtier
