#include "kvtier/client.h"

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/debug.h>

#include <algorithm>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "kernels/block_copy.h"
#include "schemas/kvtier.capnp.h"
#include "store/limits.h"
#include "transport/buffered_stream.h"
#include "transport/busy_poll.h"
#include "transport/rpc_codec.h"
#include "transport/shm_segment.h"
#include "transport/socket_stream.h"
#ifdef KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <strings.h>

#include <mutex>

#include "kernels/gpu.h"
#include "transport/cuda_pool.h"
#endif

namespace kvtier {

// ---------------------------------------------------------------------------------------------
// The client's event-loop thread. Every capnp object lives there; other threads reach it through
// the loop's kj::Executor, which runs a function on the loop and blocks until its promise resolves.

struct Client::Impl {
  ClientOptions options;
  std::thread thread;
  const kj::Executor* executor = nullptr;
  bool callerThread = false;
  std::thread::id callerThreadId;
  std::optional<kj::AsyncIoContext> ownedIo;  // caller-thread mode: the caller's event loop
  // Caller-thread mode: when the daemon's answers came, to poll for the next one while hot.
  std::optional<Conversation> answers;

  // Own-thread mode: lease capabilities dropped by callers, for the loop thread to drop. A caller
  // that drops a handle queues its lease and wakes the loop thread (at most one wake per batch)
  // instead of waiting for a round trip through the executor: the release goes out as soon as the
  // loop thread runs, and always before any later call of this client (run() drops what is queued
  // first). Guarded by dropMutex.
  std::mutex dropMutex;
  std::vector<capnp::Capability::Client> dropped;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> dropWake;  // the loop thread's, while it runs
  // Queues `cap` for the loop thread to drop (own-thread mode; any thread).
  void dropLater(capnp::Capability::Client&& cap);
  // On the loop thread: drops what callers queued.
  void dropQueued();
  // On the loop thread: drops what is queued each time a caller wakes it, until cancelled.
  kj::Promise<void> dropWhenWoken();

  // Loop-thread state (touched only inside run()).
  kj::AsyncIoContext* io = nullptr;
  kj::Own<kj::PromiseFulfiller<void>> stop;
  kj::Own<kj::AsyncIoStream> stream;
  kj::Own<capnp::TwoPartyVatNetwork> network;
  kj::Own<capnp::RpcSystem<capnp::rpc::twoparty::VatId>> rpcSystem;
  kj::Maybe<rpc::Session::Client> session;

  // Written once during open() under the loop, read by handles: the loop serialises both.
  std::map<uint32_t, std::unique_ptr<ShmSegment>> mappings;
  bool mapped = false;
  bool mappingTried = false;
  std::string daemonVersion;
  std::vector<int> devices;  // with a GPU pool on the daemon (the daemon's ordinals)
  std::vector<std::string> devicePciBusIds;  // of those devices, in the same order
  // GPU extents this client was told of: their blocks have no host view.
  std::set<uint32_t> gpuExtents;
#ifdef KVTIER_HAVE_CUDA
  // Opened once per extent, closed with the client. Guarded by gpuMutex, like the copiers (a
  // client may be called from several threads; kernels launch from the caller's thread).
  std::mutex gpuMutex;
  std::map<uint32_t, std::unique_ptr<DeviceMapping>> deviceMappings;
  std::map<uint32_t, std::unique_ptr<HostRegistration>> hostRegistrations;
  std::map<int, std::unique_ptr<kernels::gpu::PagedCopier>> copiers;
  // The address a kernel on `device` uses for a block: the IPC mapping of a GPU extent, or the
  // registered host mapping of a host extent. Requires gpuMutex.
  Result<uint8_t*> devicePointer(const BlockRef& ref);
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
      // Leases dropped before this call are released before it.
      auto afterDrops = [&]() {
        dropQueued();
        return f();
      };
      if constexpr (std::is_void_v<T>) {
        executor->executeSync(afterDrops);
        return {};
      } else {
        return executor->executeSync(afterDrops);
      }
    } catch (const kj::Exception& e) {
      return fromKjException(e);
    }
  }

  Status connect();
  // Connects and says hello on the current thread's event loop.
  Status setup(kj::AsyncIoContext& context);
  void teardown();
  void loop(std::promise<Status>& ready);
  rpc::Session::Client& sessionCap() { return KJ_ASSERT_NONNULL(session); }
  Status mapExtents(
      const std::vector<std::pair<uint32_t, std::pair<std::string, uint64_t>>>& extents);
  const uint8_t* view(const BlockRef& ref) const;
  // The host view of a granted block: its bytes in the mapped pool, or an empty span for a block
  // in GPU memory (reached with kernels). INTERNAL for a block outside every mapping.
  Result<std::span<uint8_t>> grantedView(const BlockRef& ref) const;
};

namespace {

capnp::ReaderOptions clientReaderOptions() {
  capnp::ReaderOptions options;
  options.traversalLimitInWords =
      2 * (kMaxInlineBytesPerCall + (uint64_t{8} << 20)) / sizeof(capnp::word);
  return options;
}

BlockRef refFrom(rpc::BlockRef::Reader r) {
  return BlockRef{r.getExtent(), r.getOffset(), r.getBytes(), r.getGeneration()};
}

kernels::BlockGeometry geometry(const Layout& l) {
  return {l.numLayers, l.blockTokens, l.tokenBytes()};
}

void setTokens(capnp::List<uint32_t>::Builder out, std::span<const uint32_t> tokens) {
  for (uint32_t i = 0; i < tokens.size(); ++i) out.set(i, tokens[i]);
}

void setKeys(capnp::List<capnp::Data>::Builder out, std::span<const Key128> keys) {
  for (uint32_t i = 0; i < keys.size(); ++i)
    out.set(i, capnp::Data::Reader(keys[i].bytes.data(), keys[i].bytes.size()));
}

Error invalid(auto&&... args) { return makeError(ErrorCode::kInvalidArgument, args...); }

// INVALID_ARGUMENT unless positions [from, to) lie within a handle's [begin, end). `what` names
// the call, `holds` what the handle has ("held", "granted").
Status checkRange(const char* what, const char* holds, uint64_t from, uint64_t to, uint64_t begin,
                  uint64_t end) {
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

}  // namespace

Status Client::Impl::setup(kj::AsyncIoContext& context) {
  io = &context;
  KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] {
                 auto address = context.provider->getNetwork()
                                    .parseAddress(kj::str("unix:", options.socketPath.c_str()))
                                    .wait(context.waitScope);
                 // No busy polling on an own-thread client's loop thread: the caller it wakes
                 // with each answer is placed on its core, and a polling loop thread would hold
                 // that core (measured: a one-block lookup took ~200 us instead of ~60).
                 stream = kj::heap<BufferedIoStream>(readWatchedSocket(
                     context.unixEventPort, address->connect().wait(context.waitScope)));
                 network = kj::heap<capnp::TwoPartyVatNetwork>(
                     *stream, capnp::rpc::twoparty::Side::CLIENT, clientReaderOptions());
                 rpcSystem = kj::heap(capnp::makeRpcClient(*network));
                 capnp::word scratch[4];
                 memset(scratch, 0, sizeof scratch);
                 capnp::MallocMessageBuilder message(scratch);
                 auto vatId = message.getRoot<capnp::rpc::twoparty::VatId>();
                 vatId.setSide(capnp::rpc::twoparty::Side::SERVER);
                 auto daemon = rpcSystem->bootstrap(vatId).castAs<rpc::Daemon>();
                 auto req = daemon.helloRequest();
                 req.setProtocolVersion(rpc::PROTOCOL_VERSION);
                 req.setClientName(options.clientName);
                 auto resp = req.send().wait(context.waitScope);
                 daemonVersion = resp.getDaemonVersion().cStr();
                 for (int d : resp.getDevices()) devices.push_back(d);
                 for (auto pci : resp.getDevicePciBusIds()) devicePciBusIds.push_back(pci.cStr());
                 session = resp.getSession();
               })) {
    Error error = fromKjException(*e);
    if (error.code() == ErrorCode::kInternal || error.code() == ErrorCode::kUnavailable) {
      error = makeError(ErrorCode::kUnavailable, "cannot reach kvtierd at ", options.socketPath,
                        ": ", e->getDescription().cStr());
    }
    return error;
  }
  return {};
}

void Client::Impl::teardown() {
  // In reverse order, on the loop's thread.
  session = nullptr;
  rpcSystem = nullptr;
  network = nullptr;
  stream = nullptr;
  io = nullptr;
}

void Client::Impl::dropLater(capnp::Capability::Client&& cap) {
  std::lock_guard<std::mutex> lock(dropMutex);
  dropped.push_back(kj::mv(cap));
  if (dropWake.get() != nullptr) {
    dropWake->fulfill();  // wakes the loop thread without waiting for it
    dropWake = nullptr;   // the loop thread arms a new one when it drains the queue
  }
}

void Client::Impl::dropQueued() {
  std::vector<capnp::Capability::Client> batch;
  {
    std::lock_guard<std::mutex> lock(dropMutex);
    batch.swap(dropped);
  }
  batch.clear();  // here, on the loop thread: each sends its release
}

kj::Promise<void> Client::Impl::dropWhenWoken() {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  {
    std::lock_guard<std::mutex> lock(dropMutex);
    dropWake = kj::mv(paf.fulfiller);
  }
  return paf.promise.then([this]() {
    // Armed again before the queue is taken: a handle dropped meanwhile either is in what is
    // taken or fulfils the new wake.
    auto next = dropWhenWoken();
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([this] { dropQueued(); })) {
      KJ_LOG(ERROR, "dropping released leases failed", *e);
    }
    return next;
  });
}

void Client::Impl::loop(std::promise<Status>& ready) {
  auto context = kj::setupAsyncIo();
  executor = &kj::getCurrentThreadExecutor();
  const Status status = setup(context);
  auto paf = kj::newPromiseAndFulfiller<void>();
  stop = kj::mv(paf.fulfiller);
  ready.set_value(status);
  if (status) {
    auto dropping = dropWhenWoken().eagerlyEvaluate(nullptr);
    paf.promise.wait(context.waitScope);
    {
      std::lock_guard<std::mutex> lock(dropMutex);
      dropWake = nullptr;  // handles do not outlive their client: nothing is queued after this
    }
    dropQueued();
  }
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

Status Client::Impl::mapExtents(
    const std::vector<std::pair<uint32_t, std::pair<std::string, uint64_t>>>& extents) {
  if (!options.mapPool) return {};
  for (const auto& [id, e] : extents) {
    if (mappings.count(id)) continue;
    auto seg = ShmSegment::open(e.first, e.second);
    if (!seg) {
      // Another host or no permission: fall back to inline bytes for this client.
      mapped = false;
      mappings.clear();
      return seg.error();
    }
    mappings.emplace(id, std::move(seg).value());
  }
  mapped = true;
  return {};
}

const uint8_t* Client::Impl::view(const BlockRef& ref) const {
  auto it = mappings.find(ref.extent);
  if (it == mappings.end() || ref.offset + ref.bytes > it->second->size() ||
      ref.offset + ref.bytes < ref.offset) {
    return nullptr;
  }
  return it->second->data() + ref.offset;
}

Result<std::span<uint8_t>> Client::Impl::grantedView(const BlockRef& ref) const {
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
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  if (impl_->callerThread) {
    impl_->teardown();
    impl_->ownedIo.reset();
    return;
  }
  (void)impl_->run([this] { impl_->stop->fulfill(); });
  impl_->thread.join();
}

const std::string& Client::daemonVersion() const { return impl_->daemonVersion; }
bool Client::mapped() const { return impl_->mapped; }

struct Space::Impl {
  kj::Maybe<rpc::Space::Client> cap;
  rpc::Space::Client& space() { return KJ_ASSERT_NONNULL(cap); }
};

Result<std::unique_ptr<Space>> Client::open(const Layout& layout, const OpenOptions& options) {
  if (auto s = layout.validate(); !s) return s.error();
#ifndef KVTIER_HAVE_CUDA
  if (options.device != -1) {
    return makeError(ErrorCode::kNotSupported, "this kvtier client was built without CUDA");
  }
#endif
  struct GpuExtent {
    uint32_t id;
    uint64_t bytes;
    std::vector<uint8_t> handle;
  };
  struct Opened {
    kj::Own<Space::Impl> impl;
    uint64_t fingerprint;
    std::vector<std::pair<uint32_t, std::pair<std::string, uint64_t>>> extents;
    std::vector<GpuExtent> gpuExtents;
  };
  // The daemon numbers devices as it sees them; this process may see them under other ordinals
  // (CUDA_VISIBLE_DEVICES): name ours by PCI bus id, and map with our own ordinal.
  int daemonDevice = options.device;
#ifdef KVTIER_HAVE_CUDA
  if (options.device >= 0 && !impl_->devicePciBusIds.empty()) {
    const std::string pci = pciBusId(options.device);
    if (pci.empty()) {
      return makeError(ErrorCode::kInvalidArgument, "no CUDA device ", options.device,
                       " in this process");
    }
    daemonDevice = -2;  // a device the daemon has no pool on: it refuses the open
    for (size_t i = 0; i < impl_->devicePciBusIds.size(); ++i) {
      if (strcasecmp(impl_->devicePciBusIds[i].c_str(), pci.c_str()) == 0) {
        daemonDevice = impl_->devices[i];
      }
    }
    if (daemonDevice == -2) {
      return makeError(ErrorCode::kInvalidArgument, "kvtierd has no GPU pool on CUDA device ",
                       options.device, " (PCI ", pci, ")");
    }
  }
#endif
  auto opened = impl_->run([&] {
    auto req = impl_->sessionCap().openRequest();
    layoutToRpc(layout, req.initLayout());
    req.setDevice(daemonDevice);
    return req.send().then([](capnp::Response<rpc::Session::OpenResults>&& r) {
      Opened o{kj::heap<Space::Impl>(), r.getFingerprint(), {}, {}};
      o.impl->cap = r.getSpace();
      for (auto e : r.getExtents()) {
        if (e.getDevice() >= 0) {
          auto h = e.getIpcHandle();
          o.gpuExtents.push_back({e.getId(), e.getBytes(), {h.begin(), h.end()}});
        } else {
          o.extents.push_back({e.getId(), {e.getShmName().cStr(), e.getBytes()}});
        }
      }
      return o;
    });
  });
  if (!opened) return opened.error();
  // Mapping the pool is best effort: without it, bytes travel inline.
  (void)impl_->run([&] {
    (void)impl_->mapExtents(opened->extents);
    for (const auto& g : opened->gpuExtents) impl_->gpuExtents.insert(g.id);
  });
#ifdef KVTIER_HAVE_CUDA
  for (const auto& g : opened->gpuExtents) {
    std::lock_guard<std::mutex> lock(impl_->gpuMutex);
    if (impl_->deviceMappings.count(g.id)) continue;
    IpcHandleBytes handle{};
    Result<std::unique_ptr<DeviceMapping>> mapping =
        makeError(ErrorCode::kInternal, "GPU extent ", g.id, " came with a bad IPC handle");
    if (g.handle.size() == handle.size()) {
      std::copy(g.handle.begin(), g.handle.end(), handle.begin());
      mapping = DeviceMapping::open(options.device, handle, g.bytes);
    }
    if (!mapping) {
      // The space capability belongs to the loop thread: drop it there.
      (void)impl_->run([&] { opened->impl = nullptr; });
      return mapping.error();
    }
    impl_->deviceMappings.emplace(g.id, std::move(mapping).value());
  }
#endif
  auto spaceImpl = std::make_unique<Space::Impl>();
  (void)impl_->run([&] {
    spaceImpl->cap = kj::mv(opened->impl->cap);
    opened->impl = nullptr;
  });
  return std::unique_ptr<Space>(
      new Space(*this, std::move(spaceImpl), layout, opened->fingerprint, options.device));
}

const std::vector<int>& Client::devices() const { return impl_->devices; }

#ifdef KVTIER_HAVE_CUDA
Result<uint8_t*> Client::Impl::devicePointer(const BlockRef& ref) {
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
    return impl_->sessionCap().clusterRequest().send().then(
        [](capnp::Response<rpc::Session::ClusterResults>&& r) {
          std::pair<std::string, std::vector<ClusterMember>> out;
          out.first = r.getNodeId();
          for (auto m : r.getMembers()) {
            out.second.push_back(
                ClusterMember{m.getNodeId(), m.getAddress(), m.getUp(), m.getSelf()});
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
    << "}, \"bytes\": {\"total\": " << bytesTotal << ", \"used\": " << bytesUsed
    << ", \"put\": " << bytesPut << ", \"got\": " << bytesGot << "}, \"hits\": " << hits
    << ", \"misses\": " << misses << ", \"evictions\": " << evictions
    << ", \"clients\": " << clients << ", \"sequences\": " << sequences
    << ", \"leases\": {\"read\": " << readLeases << ", \"write\": " << writeLeases
    << "}, \"snapshots\": " << snapshots << ", \"entries\": " << entries
    << ", \"checkpoints\": " << checkpoints << ", \"cold\": {\"spilled\": " << spilled
    << ", \"promoted\": " << promoted << ", \"records\": " << coldRecords
    << ", \"bytes\": " << coldBytes << ", \"disk_bytes\": " << coldDiskBytes
    << ", \"corrupt_dropped\": " << corruptDropped << ", \"spill_errors\": " << spillErrors
    << ", \"evicted_unspilled\": " << evictedUnspilled << ", \"capacity_evicted\": " << coldEvicted
    << ", \"snapshots\": " << coldSnapshots << ", \"snapshots_dropped\": " << coldSnapshotsDropped
    << "}, \"gpu\": {\"blocks_total\": " << gpuBlocksTotal << ", \"blocks_used\": " << gpuBlocksUsed
    << ", \"demoted\": " << gpuDemoted << ", \"promoted\": " << gpuPromoted
    << "}, \"cluster\": {\"members\": " << clusterMembers << ", \"members_up\": " << clusterMembersUp
    << ", \"directory_entries\": " << directoryEntries << ", \"held_keys\": " << heldKeys
    << ", \"publish_backlog\": " << publishBacklog << ", \"rehomed\": " << directoryRehomed << ", \"remote_lookups\": " << remoteLookups
    << ", \"remote_hit_blocks\": " << remoteHitBlocks << ", \"remote_hit_bytes\": " << remoteHitBytes
    << ", \"served_blocks\": " << servedBlocks << ", \"fetch_errors\": {\"timeout\": " << fetchTimeouts
    << ", \"unavailable\": " << fetchUnavailable << ", \"transfer\": " << fetchTransfer
    << ", \"checksum\": " << fetchChecksum << ", \"full\": " << fetchFull
    << "}, \"auth_failures\": " << peerAuthFailures << ", \"peer_rtt_us\": " << peerRttMicros << "}, \"spaces\": [";
  for (size_t i = 0; i < spaces.size(); ++i) {
    const auto& s = spaces[i];
    o << (i ? ", " : "") << "{\"fingerprint\": \"" << std::hex << s.fingerprint << std::dec
      << "\", \"block_bytes\": " << s.blockBytes << ", \"blocks_total\": " << s.blocksTotal
      << ", \"blocks_used\": " << s.blocksUsed << ", \"sequences\": " << s.sequences << "}";
  }
  o << "]}";
  return o.str();
}

// ---------------------------------------------------------------------------------------------
// Leases

struct LeaseState {
  Client::Impl* client = nullptr;
  kj::Maybe<capnp::Capability::Client> cap;
  ~LeaseState() {
    // Dropping the capability sends the daemon a release without waiting for it. A caller-thread
    // client drops it here; an own-thread one hands it to its loop thread without waiting.
    KJ_IF_MAYBE (c, cap) {
      if (client->callerThread) {
        (void)client->run([this] { cap = nullptr; });
      } else {
        client->dropLater(kj::mv(*c));
        cap = nullptr;
      }
    }
  }
};

ReadHandle::ReadHandle(Space* space, std::unique_ptr<LeaseState> lease) noexcept
    : space_(space), lease_(std::move(lease)) {}
ReadHandle::ReadHandle(ReadHandle&&) noexcept = default;
ReadHandle& ReadHandle::operator=(ReadHandle&&) noexcept = default;
ReadHandle::~ReadHandle() = default;

void ReadHandle::release() {
  // Dropping the lease capability sends the daemon a release message without waiting for an
  // answer: it is ordered before anything else this client sends.
  lease_.reset();
  views_.clear();
  inline_.clear();
}

Status ReadHandle::copyTo(uint64_t from, uint64_t to, void* out, size_t bytes) const {
  const Layout& layout = space_->layout();
  if (auto s = checkRange("copy", "held", from, to, begin_, end_); !s) return s;
  if (bytes != (to - from) * layout.tokenKvBytes()) {
    return invalid("copy buffer of ", bytes, " bytes, expected ",
                   (to - from) * layout.tokenKvBytes());
  }
  if (views_.empty() && from < to)
    return makeError(ErrorCode::kReleased, "read handle was released");
  const uint32_t bt = layout.blockTokens;
  const auto g = geometry(layout);
  for (uint64_t pos = from; pos < to;) {
    const uint64_t block = (pos - firstPosition_) / bt;
    const uint32_t slot = static_cast<uint32_t>((pos - firstPosition_) % bt);
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(bt - slot, to - pos));
    if (!views_[block].data()) {
      return makeError(ErrorCode::kNotSupported,
                       "block is in GPU memory: gather it with Space::gatherTo");
    }
    kernels::packSlots(g, views_[block].data(), slot, n, static_cast<uint8_t*>(out), to - from,
                       pos - from);
    pos += n;
  }
  return {};
}

WriteHandle::WriteHandle(Space* space, std::unique_ptr<LeaseState> lease) noexcept
    : space_(space), lease_(std::move(lease)) {}
WriteHandle::WriteHandle(WriteHandle&&) noexcept = default;
WriteHandle& WriteHandle::operator=(WriteHandle&&) noexcept = default;
WriteHandle::~WriteHandle() = default;

Status WriteHandle::write(uint64_t from, uint64_t to, const void* kv, size_t bytes) {
  if (!lease_) return makeError(ErrorCode::kReleased, "write handle was committed or aborted");
  const Layout& layout = space_->layout();
  if (auto s = checkRange("write", "granted", from, to, begin_, end_); !s) return s;
  if (bytes != (to - from) * layout.tokenKvBytes()) {
    return invalid("write buffer of ", bytes, " bytes, expected ",
                   (to - from) * layout.tokenKvBytes());
  }
  const uint32_t bt = layout.blockTokens;
  const auto g = geometry(layout);
  const auto* packed = static_cast<const uint8_t*>(kv);
  if (!views_.empty()) {
    for (uint64_t pos = from; pos < to;) {
      const uint64_t block = (pos - firstPosition_) / bt;
      const uint32_t slot = static_cast<uint32_t>((pos - firstPosition_) % bt);
      const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(bt - slot, to - pos));
      if (!views_[block].data()) {
        return makeError(ErrorCode::kNotSupported,
                         "block is in GPU memory: write it with Space::putPaged");
      }
      kernels::unpackSlots(g, views_[block].data(), slot, n, packed, to - from, pos - from);
      pos += n;
    }
    return {};
  }
  // Inline: one write message per block, all in flight at once.
  return lease_->client->run([&] {
    auto lease = KJ_ASSERT_NONNULL(lease_->cap).castAs<rpc::WriteLease>();
    kj::Vector<kj::Promise<void>> sends;
    for (uint64_t pos = from; pos < to;) {
      const uint64_t block = (pos - firstPosition_) / bt;
      const uint32_t slot = static_cast<uint32_t>((pos - firstPosition_) % bt);
      const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(bt - slot, to - pos));
      auto req = lease.writeRequest();
      req.setBlock(static_cast<uint32_t>(block));
      req.setFirstSlot(slot);
      req.setSlots(n);
      auto data = req.initData(n * layout.tokenKvBytes());
      // Gather this block's slots out of the caller's packed run into a packed run of n tokens.
      for (uint64_t lkv = 0; lkv < 2ull * layout.numLayers; ++lkv) {
        std::memcpy(data.begin() + lkv * n * g.tokenBytes,
                    packed + (lkv * (to - from) + (pos - from)) * g.tokenBytes, n * g.tokenBytes);
      }
      sends.add(req.send().ignoreResult());
      pos += n;
    }
    return kj::joinPromises(sends.releaseAsArray());
  });
}

Result<CommitInfo> WriteHandle::commit(uint64_t upTo) {
  if (!lease_) return makeError(ErrorCode::kReleased, "write handle was committed or aborted");
  auto result = lease_->client->run([&] {
    auto req = KJ_ASSERT_NONNULL(lease_->cap).castAs<rpc::WriteLease>().commitRequest();
    req.setUpTo(upTo);
    return req.send().then([](capnp::Response<rpc::WriteLease::CommitResults>&& r) {
      return CommitInfo{r.getLength(), r.getSealedBlocks()};
    });
  });
  // A bad upTo leaves the lease open for another try; anything else ends it.
  if (result || result.code() != ErrorCode::kInvalidArgument) {
    lease_.reset();
    views_.clear();
  }
  return result;
}

Status WriteHandle::abort() {
  if (!lease_) return makeError(ErrorCode::kReleased, "write handle was committed or aborted");
  auto status = lease_->client->run([&] {
    return KJ_ASSERT_NONNULL(lease_->cap)
        .castAs<rpc::WriteLease>()
        .abortRequest()
        .send()
        .ignoreResult();
  });
  lease_.reset();
  views_.clear();
  return status;
}

// ---------------------------------------------------------------------------------------------
// Space

Space::Space(Client& client, std::unique_ptr<Impl> impl, Layout layout, uint64_t fingerprint,
             int device)
    : client_(client),
      impl_(std::move(impl)),
      layout_(std::move(layout)),
      fingerprint_(fingerprint),
      device_(device) {}

Space::~Space() {
  (void)client_.impl_->run([this] { impl_->cap = nullptr; });
}

Result<WriteHandle> Space::beginPut(std::string_view seq, uint64_t begin,
                                    std::span<const uint32_t> tokens, const PutOptions& options) {
  if (tokens.size() > kMaxTokensPerCall)
    return invalid("put of ", tokens.size(), " tokens exceeds ", kMaxTokensPerCall);
  auto* client = client_.impl_.get();
  auto lease = std::make_unique<LeaseState>();
  lease->client = client;
  struct Granted {
    uint64_t firstPosition;
    std::vector<BlockRef> refs;
  };
  auto granted = client->run([&] {
    auto req = impl_->space().putRequest();
    req.setSeq(std::string(seq));
    req.setBegin(begin);
    setTokens(req.initTokens(tokens.size()), tokens);
    setKeys(req.initKeys(options.keys.size()), options.keys);
    setSeqOptions(req.initOptions(), options);
    return req.send().then([&lease](capnp::Response<rpc::Space::PutResults>&& r) {
      lease->cap = r.getLease();
      Granted g{r.getFirstPosition(), {}};
      for (auto b : r.getBlocks()) g.refs.push_back(refFrom(b));
      return g;
    });
  });
  if (!granted) return granted.error();
  WriteHandle handle(this, std::move(lease));
  handle.begin_ = begin;
  handle.end_ = begin + tokens.size();
  handle.firstPosition_ = granted->firstPosition;
  handle.refs_ = std::move(granted->refs);
  if (client->mapped) {
    for (const auto& ref : handle.refs_) {
      auto v = client->grantedView(ref);  // empty for GPU memory: written by Space::putPaged
      if (!v) return v.error();
      handle.views_.push_back(*v);
    }
  }
  return handle;
}

Result<CommitInfo> Space::put(std::string_view seq, uint64_t begin,
                              std::span<const uint32_t> tokens, const void* kv, size_t bytes,
                              const PutOptions& options) {
  if (bytes != tokens.size() * layout_.tokenKvBytes()) {
    return invalid("put of ", tokens.size(), " tokens needs ",
                   tokens.size() * layout_.tokenKvBytes(), " bytes of KV, got ", bytes);
  }
  auto handle = beginPut(seq, begin, tokens, options);
  if (!handle) return handle.error();
  if (auto s = handle->write(begin, begin + tokens.size(), kv, bytes); !s) return s.error();
  return handle->commit();
}

namespace {

// Fills a ReadHandle's views from refs, mapped or inline.
Status attachViews(Client::Impl& client, std::vector<BlockRef>& refs,
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

}  // namespace

Result<ReadHandle> Space::get(std::string_view seq, uint64_t begin, uint64_t end) {
  auto* client = client_.impl_.get();
  auto lease = std::make_unique<LeaseState>();
  lease->client = client;
  ReadHandle handle(this, nullptr);
  auto status = client->run([&] {
    auto req = impl_->space().getRequest();
    req.setSeq(std::string(seq));
    req.setBegin(begin);
    req.setEnd(end);
    req.setInline(!client->mapped);
    return req.send().then([&](capnp::Response<rpc::Space::GetResults>&& r) {
      lease->cap = r.getLease();
      handle.begin_ = begin;
      handle.end_ = r.getEnd();
      handle.firstPosition_ = r.getFirstPosition();
      readBlocks(r, handle.refs_, handle.inline_);
    });
  });
  if (!status) return status.error();
  handle.lease_ = std::move(lease);
  if (auto s = attachViews(*client, handle.refs_, handle.inline_, handle.views_); !s)
    return s.error();
  return handle;
}

Result<ReadHandle> Space::lookupImpl(std::span<const uint32_t> tokens, std::span<const Key128> keys,
                                     const LookupOptions& options) {
  if (tokens.size() > kMaxTokensPerCall) {
    return invalid("lookup of ", tokens.size(), " tokens exceeds ", kMaxTokensPerCall);
  }
  auto* client = client_.impl_.get();
  auto lease = std::make_unique<LeaseState>();
  lease->client = client;
  ReadHandle handle(this, nullptr);
  auto status = client->run([&] {
    auto req = impl_->space().lookupRequest();
    setTokens(req.initTokens(tokens.size()), tokens);
    setKeys(req.initKeys(keys.size()), keys);
    req.setBindSeq(options.bindSeq);
    setSeqOptions(req.initOptions(), options);
    req.setInline(!client->mapped);
    req.setRemote(options.remote == RemoteMode::kLocal      ? rpc::RemoteMode::LOCAL_ONLY
                  : options.remote == RemoteMode::kPrefetch ? rpc::RemoteMode::PREFETCH
                                                            : rpc::RemoteMode::FETCH);
    return req.send().then([&](capnp::Response<rpc::Space::LookupResults>&& r) {
      lease->cap = r.getLease();
      handle.begin_ = 0;
      handle.end_ = r.getMatchedTokens();
      handle.firstPosition_ = 0;
      readBlocks(r, handle.refs_, handle.inline_);
    });
  });
  if (!status) return status.error();
  handle.lease_ = std::move(lease);
  if (auto s = attachViews(*client, handle.refs_, handle.inline_, handle.views_); !s)
    return s.error();
  return handle;
}

Result<ReadHandle> Space::lookup(std::span<const uint32_t> tokens, const LookupOptions& options) {
  return lookupImpl(tokens, {}, options);
}

Result<ReadHandle> Space::lookupKeys(std::span<const Key128> keys, const LookupOptions& options) {
  return lookupImpl({}, keys, options);
}

Status Space::copyPrefix(std::string_view src, std::string_view dst, uint64_t len, bool detached) {
  return client_.impl_->run([&] {
    auto req = impl_->space().copyPrefixRequest();
    req.setSrc(std::string(src));
    req.setDst(std::string(dst));
    req.setLen(len);
    req.initOptions().setDetached(detached);
    return req.send().ignoreResult();
  });
}

Status Space::remove(std::string_view seq, uint64_t begin, uint64_t end) {
  return client_.impl_->run([&] {
    auto req = impl_->space().removeRequest();
    req.setSeq(std::string(seq));
    req.setBegin(begin);
    req.setEnd(end);
    return req.send().ignoreResult();
  });
}

Status Space::truncate(std::string_view seq, uint64_t len) {
  return client_.impl_->run([&] {
    auto req = impl_->space().truncateRequest();
    req.setSeq(std::string(seq));
    req.setLen(len);
    return req.send().ignoreResult();
  });
}

Result<bool> Space::canResume(std::string_view seq, uint64_t pos) {
  return client_.impl_->run([&] {
    auto req = impl_->space().canResumeRequest();
    req.setSeq(std::string(seq));
    req.setPos(pos);
    return req.send().then(
        [](capnp::Response<rpc::Space::CanResumeResults>&& r) { return r.getOk(); });
  });
}

Result<std::optional<uint64_t>> Space::length(std::string_view seq) {
  return client_.impl_->run([&] {
    auto req = impl_->space().lengthRequest();
    req.setSeq(std::string(seq));
    return req.send().then([](capnp::Response<rpc::Space::LengthResults>&& r) {
      return r.getExists() ? std::optional<uint64_t>(r.getLength()) : std::nullopt;
    });
  });
}

Result<std::vector<std::vector<uint8_t>>> Space::readRefs(std::span<const BlockRef> refs) {
  return client_.impl_->run([&] {
    auto req = impl_->space().readRequest();
    auto out = req.initRefs(refs.size());
    for (uint32_t i = 0; i < refs.size(); ++i) {
      out[i].setExtent(refs[i].extent);
      out[i].setOffset(refs[i].offset);
      out[i].setBytes(refs[i].bytes);
      out[i].setGeneration(refs[i].generation);
    }
    return req.send().then([](capnp::Response<rpc::Space::ReadResults>&& r) {
      std::vector<std::vector<uint8_t>> data;
      for (auto d : r.getData()) data.emplace_back(d.begin(), d.end());
      return data;
    });
  });
}

// ---------------------------------------------------------------------------------------------
// Snapshots, checkpoints, entries

Key128 contentKey(const void* bytes, size_t size) {
  Sha256 sha;
  sha.begin();
  sha.update(bytes, size);
  const auto digest = sha.finish();
  Key128 key;
  std::memcpy(key.bytes.data(), digest.data(), key.bytes.size());
  return key;
}

BlobHandle::BlobHandle(BlobHandle&&) noexcept = default;
BlobHandle& BlobHandle::operator=(BlobHandle&&) noexcept = default;
BlobHandle::~BlobHandle() = default;

void BlobHandle::release() {
  lease_.reset();
  data_ = {};
  inline_.clear();
}

namespace {

SnapshotInfo snapshotFrom(rpc::SnapshotInfo::Reader r) {
  SnapshotInfo info{r.getId(), r.getFrom(), r.getTo(), {}, r.getNode()};
  for (uint64_t pos : r.getCheckpoints()) info.checkpoints.push_back(pos);
  return info;
}

}  // namespace

Result<SnapshotInfo> Space::snapshot(std::string_view seq, uint64_t from) {
  return client_.impl_->run([&] {
    auto req = impl_->space().snapshotRequest();
    req.setSeq(std::string(seq));
    req.setFrom(from);
    return req.send().then([](capnp::Response<rpc::Space::SnapshotResults>&& r) {
      return snapshotFrom(r.getSnapshot());
    });
  });
}

Status Space::restore(std::string_view seq, uint64_t snapshotId, uint64_t target,
                      const PutOptions& options, std::string_view node) {
  if (snapshotId == 0) return invalid("snapshot id 0 names no snapshot (use rewind)");
  return client_.impl_->run([&] {
    auto req = impl_->space().restoreRequest();
    req.setSeq(std::string(seq));
    req.setSnapshot(snapshotId);
    req.setTarget(target);
    setSeqOptions(req.initOptions(), options);
    req.setNode(std::string(node));
    return req.send().ignoreResult();
  });
}

Result<SnapshotInfo> Space::copySnapshot(std::string_view node, uint64_t snapshotId, bool move) {
  if (snapshotId == 0) return invalid("snapshot id 0 names no snapshot");
  if (node.empty()) return invalid("copySnapshot needs the node that holds the snapshot");
  return client_.impl_->run([&] {
    auto req = impl_->space().copySnapshotRequest();
    req.setNode(std::string(node));
    req.setSnapshot(snapshotId);
    req.setMove(move);
    return req.send().then([](capnp::Response<rpc::Space::CopySnapshotResults>&& r) {
      return snapshotFrom(r.getSnapshot());
    });
  });
}

namespace {

BlockTransfer transferFrom(const capnp::Response<rpc::Space::PushBlocksResults>& r) {
  return BlockTransfer{r.getBlocks(), r.getHeld(), r.getDropped()};
}

}  // namespace

Result<BlockTransfer> Space::copyRange(std::string_view node, std::string_view seq,
                                       uint64_t begin, uint64_t end, bool move) {
  if (node.empty()) return invalid("copyRange needs the node to copy to");
  if (seq.empty()) return invalid("copyRange needs a sequence");
  return client_.impl_->run([&] {
    auto req = impl_->space().pushBlocksRequest();
    req.setNode(std::string(node));
    req.setSeq(std::string(seq));
    req.setBegin(begin);
    req.setEnd(end);
    req.setMove(move);
    return req.send().then([](auto&& r) { return transferFrom(r); });
  });
}

Result<BlockTransfer> Space::copyKeys(std::string_view node, std::span<const Key128> keys,
                                      bool move) {
  if (node.empty()) return invalid("copyKeys needs the node to copy to");
  if (keys.empty()) return BlockTransfer{};
  return client_.impl_->run([&] {
    auto req = impl_->space().pushBlocksRequest();
    req.setNode(std::string(node));
    setKeys(req.initKeys(keys.size()), keys);
    req.setMove(move);
    return req.send().then([](auto&& r) { return transferFrom(r); });
  });
}

Result<BlockTransfer> Space::copyPrompt(std::string_view node, std::span<const uint32_t> tokens,
                                        bool move) {
  if (node.empty()) return invalid("copyPrompt needs the node to copy to");
  return client_.impl_->run([&] {
    auto req = impl_->space().pushBlocksRequest();
    req.setNode(std::string(node));
    setTokens(req.initTokens(tokens.size()), tokens);
    req.setMove(move);
    return req.send().then([](auto&& r) { return transferFrom(r); });
  });
}

Status Space::rewind(std::string_view seq, uint64_t target) {
  return client_.impl_->run([&] {
    auto req = impl_->space().restoreRequest();
    req.setSeq(std::string(seq));
    req.setTarget(target);
    return req.send().ignoreResult();
  });
}

Result<SnapshotInfo> Space::mergeSnapshots(uint64_t a, uint64_t b) {
  return client_.impl_->run([&] {
    auto req = impl_->space().mergeSnapshotsRequest();
    req.setA(a);
    req.setB(b);
    return req.send().then([](capnp::Response<rpc::Space::MergeSnapshotsResults>&& r) {
      return snapshotFrom(r.getSnapshot());
    });
  });
}

Result<std::pair<SnapshotInfo, SnapshotInfo>> Space::splitSnapshot(uint64_t id, uint64_t at) {
  return client_.impl_->run([&] {
    auto req = impl_->space().splitSnapshotRequest();
    req.setSnapshot(id);
    req.setAt(at);
    return req.send().then([](capnp::Response<rpc::Space::SplitSnapshotResults>&& r) {
      return std::make_pair(snapshotFrom(r.getLeft()), snapshotFrom(r.getRight()));
    });
  });
}

Result<SnapshotInfo> Space::snapshotInfo(uint64_t id) {
  return client_.impl_->run([&] {
    auto req = impl_->space().snapshotInfoRequest();
    req.setSnapshot(id);
    return req.send().then([](capnp::Response<rpc::Space::SnapshotInfoResults>&& r) {
      return snapshotFrom(r.getSnapshot());
    });
  });
}

Status Space::dropSnapshot(uint64_t id) {
  return client_.impl_->run([&] {
    auto req = impl_->space().dropSnapshotRequest();
    req.setSnapshot(id);
    return req.send().ignoreResult();
  });
}

Status Space::writeBlob(const void* bytes, size_t size, std::unique_ptr<LeaseState> lease,
                        const BlockRef& block) {
  auto* client = client_.impl_.get();
  return client->run([&]() -> kj::Promise<void> {
    auto cap = KJ_ASSERT_NONNULL(lease->cap).castAs<rpc::WriteLease>();
    kj::Promise<void> written = kj::READY_NOW;
    if (const uint8_t* view = client->mapped ? client->view(block) : nullptr) {
      std::memcpy(const_cast<uint8_t*>(view), bytes, size);
    } else {
      auto req = cap.writeBlobRequest();
      req.setData(capnp::Data::Reader(static_cast<const uint8_t*>(bytes), size));
      written = req.send().ignoreResult();
    }
    return written.then([cap]() mutable { return cap.commitRequest().send().ignoreResult(); });
  });
}

template <typename MakeRequest>
Status Space::putBlob(MakeRequest&& makeRequest, const void* bytes, size_t size) {
  auto lease = std::make_unique<LeaseState>();
  lease->client = client_.impl_.get();
  auto block = client_.impl_->run([&] {
    return makeRequest().send().then([&lease](auto&& r) {
      lease->cap = r.getLease();
      return refFrom(r.getBlock());
    });
  });
  if (!block) return block.error();
  return writeBlob(bytes, size, std::move(lease), *block);
}

Status Space::putCheckpoint(std::string_view seq, uint64_t pos, const void* state, size_t bytes) {
  return putBlob(
      [&] {
        auto req = impl_->space().putCheckpointRequest();
        req.setSeq(std::string(seq));
        req.setPos(pos);
        req.setBytes(bytes);
        return req;
      },
      state, bytes);
}

Status Space::putEntry(const Key128& key, const void* bytes, size_t size) {
  return putBlob(
      [&] {
        auto req = impl_->space().putEntryRequest();
        req.setKey(capnp::Data::Reader(key.bytes.data(), key.bytes.size()));
        req.setBytes(size);
        return req;
      },
      bytes, size);
}

template <typename MakeRequest>
Result<BlobHandle> Space::readBlob(MakeRequest&& makeRequest) {
  auto* client = client_.impl_.get();
  BlobHandle handle;
  handle.lease_ = std::make_unique<LeaseState>();
  handle.lease_->client = client;
  BlockRef block;
  uint64_t bytes = 0;
  auto status = client->run([&] {
    auto req = makeRequest();
    req.setInline(!client->mapped);
    return req.send().then([&](auto&& r) {
      handle.lease_->cap = r.getLease();
      block = refFrom(r.getBlock());
      bytes = r.getBytes();
      handle.inline_.assign(r.getData().begin(), r.getData().end());
    });
  });
  if (!status) return status.error();
  if (!handle.inline_.empty() || bytes == 0) {
    handle.data_ = std::span<const uint8_t>(handle.inline_);
    return handle;
  }
  const uint8_t* p = client->view(block);
  if (!p || bytes > block.bytes) {
    return makeError(ErrorCode::kInternal, "daemon returned a blob outside the mapped pool");
  }
  handle.data_ = std::span<const uint8_t>(p, bytes);
  return handle;
}

Result<BlobHandle> Space::getCheckpoint(std::string_view seq, uint64_t pos) {
  return readBlob([&] {
    auto req = impl_->space().getCheckpointRequest();
    req.setSeq(std::string(seq));
    req.setPos(pos);
    return req;
  });
}

Result<BlobHandle> Space::getEntry(const Key128& key) {
  return readBlob([&] {
    auto req = impl_->space().getEntryRequest();
    req.setKey(capnp::Data::Reader(key.bytes.data(), key.bytes.size()));
    return req;
  });
}

Result<std::vector<uint64_t>> Space::checkpoints(std::string_view seq) {
  return client_.impl_->run([&] {
    auto req = impl_->space().checkpointsRequest();
    req.setSeq(std::string(seq));
    return req.send().then([](capnp::Response<rpc::Space::CheckpointsResults>&& r) {
      std::vector<uint64_t> out;
      for (uint64_t pos : r.getPositions()) out.push_back(pos);
      return out;
    });
  });
}

}  // namespace kvtier

// ---------------------------------------------------------------------------------------------
// GPU: paged KV <-> pool blocks with kernels/ on the engine's stream.

namespace kvtier {

Status Space::pagedCopy(bool scatter, const std::vector<BlockRef>& refs, uint64_t firstPosition,
                        uint64_t from, uint64_t to, const PagedKvCache& cache,
                        std::span<const int32_t> blockTable, void* stream) {
#ifndef KVTIER_HAVE_CUDA
  (void)scatter, (void)refs, (void)firstPosition, (void)from, (void)to, (void)cache,
      (void)blockTable, (void)stream;
  return makeError(ErrorCode::kNotSupported, "this kvtier client was built without CUDA");
#else
  if (device_ < 0) {
    return makeError(ErrorCode::kNotSupported, "the space was not opened on a GPU device");
  }
  if (cache.keys.size() != layout_.numLayers || cache.values.size() != layout_.numLayers) {
    return invalid("paged cache has ", cache.keys.size(), " K and ", cache.values.size(),
                   " V tensors; the layout has ", layout_.numLayers, " layers");
  }
  if (cache.blockTokens == 0) return invalid("paged cache block size is 0");
  if (from < to && blockTable.size() < (to - 1) / cache.blockTokens + 1) {
    return invalid("block table has ", blockTable.size(), " entries; positions up to ", to,
                   " need ", (to - 1) / cache.blockTokens + 1);
  }
  if (from == to) return {};
  auto* client = client_.impl_.get();
  std::lock_guard<std::mutex> lock(client->gpuMutex);
  std::vector<uint8_t*> tensors;
  for (uint32_t l = 0; l < layout_.numLayers; ++l) {
    tensors.push_back(static_cast<uint8_t*>(cache.keys[l]));
    tensors.push_back(static_cast<uint8_t*>(cache.values[l]));
  }
  std::vector<uint8_t*> pool;
  for (const auto& ref : refs) {
    auto p = client->devicePointer(ref);
    if (!p) return p.error();
    pool.push_back(*p);
  }
  const kernels::PagedKv kv{layout_.numLayers, cache.blockTokens, layout_.tokenBytes()};
  kernels::PagedCopy copy;
  copy.tensors = tensors.data();
  copy.blockTable = blockTable.data();
  copy.poolBlocks = pool.data();
  copy.poolTokens = layout_.blockTokens;
  copy.poolFirst = firstPosition / layout_.blockTokens;
  copy.begin = from;
  copy.end = to;
  if (auto why = kernels::checkPagedCopy(kv, copy); !why.empty()) return invalid(why);
  auto& copier = client->copiers[device_];
  if (!copier) copier = std::make_unique<kernels::gpu::PagedCopier>(device_);
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t e = scatter ? copier->scatter(kv, copy, s) : copier->gather(kv, copy, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return makeError(ErrorCode::kUnavailable, scatter ? "scatter" : "gather",
                     " kernel failed: ", cudaGetErrorString(e));
  }
  return {};
#endif
}

Result<CommitInfo> Space::putPaged(std::string_view seq, uint64_t begin,
                                   std::span<const uint32_t> tokens, const PagedKvCache& cache,
                                   std::span<const int32_t> blockTable, void* stream,
                                   const PutOptions& options) {
  if (device_ < 0) {
    return makeError(ErrorCode::kNotSupported, "the space was not opened on a GPU device");
  }
  auto handle = beginPut(seq, begin, tokens, options);
  if (!handle) return handle.error();
  if (auto s = scatterTo(*handle, begin, begin + tokens.size(), cache, blockTable, stream); !s) {
    (void)handle->abort();
    return s.error();
  }
  return handle->commit();
}

Status Space::scatterTo(const WriteHandle& handle, uint64_t from, uint64_t to,
                        const PagedKvCache& cache, std::span<const int32_t> blockTable,
                        void* stream) {
  if (!handle.lease_) {
    return makeError(ErrorCode::kReleased, "write handle was committed or aborted");
  }
  if (auto s = checkRange("scatter", "granted", from, to, handle.begin_, handle.end_); !s) {
    return s;
  }
  return pagedCopy(true, handle.refs_, handle.firstPosition_, from, to, cache, blockTable, stream);
}

Status Space::gatherTo(const ReadHandle& handle, uint64_t from, uint64_t to,
                       const PagedKvCache& cache, std::span<const int32_t> blockTable,
                       void* stream) {
  if (auto s = checkRange("gather", "held", from, to, handle.begin_, handle.end_); !s) return s;
  if (handle.views_.empty() && from < to) {
    return makeError(ErrorCode::kReleased, "read handle was released");
  }
  return pagedCopy(false, handle.refs_, handle.firstPosition_, from, to, cache, blockTable, stream);
}

}  // namespace kvtier
