#include "transport/ucx.h"

#include <kj/debug.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstdlib>

namespace kvtier {
namespace {

// While gets are in flight, or a peer holds pins on our memory for its gets, the worker is also
// progressed on this tick, in case a wake-up through the event fd is late (measured: a replay
// paced at 20x the trace's timestamps saw ~400 gets of 2 s each time out without it). Idle, it
// only waits on the fd.
constexpr kj::Duration kInFlightTick = 1 * kj::MILLISECONDS;
// Progress calls in one turn of the event loop before it lets other events run.
constexpr int kProgressPerTurn = 256;
// A worker address from a peer larger than this is refused (UCX's are a few hundred bytes).
constexpr size_t kMaxWorkerAddressBytes = 64 << 10;

Error ucxError(const char* what, ucs_status_t status) {
  return makeError(ErrorCode::kUnavailable, what, ": ", ucs_status_string(status));
}

}  // namespace

struct UcxEndpoint::Batch {
  struct Slot {
    Batch* batch;
    size_t index;
  };
  std::vector<bool> ok;
  std::vector<Slot> slots;  // sized before any get is posted: stable addresses for user_data
  size_t pending = 0;
  bool done = false;
  kj::Own<kj::PromiseFulfiller<std::vector<bool>>> fulfiller;
  kj::Promise<void> deadline = nullptr;
  std::function<void(size_t)> each;

  void complete(size_t index, bool success) {
    ok[index] = success;
    if (success && each) each(index);
    if (--pending == 0) finish();
  }
  void finish() {
    done = true;
    fulfiller->fulfill(std::vector<bool>(ok));
  }
};

// UCX's callbacks, with UCX's own signatures.
struct UcxCallbacks {
  static void getDone(void* request, ucs_status_t status, void* user) {
    auto* slot = static_cast<UcxEndpoint::Batch::Slot*>(user);
    slot->batch->complete(slot->index, status == UCS_OK);
    ucp_request_free(request);
  }
  static void peerFailed(void* arg, ucp_ep_h, ucs_status_t) {
    auto* ep = static_cast<UcxEndpoint*>(arg);
    ep->failed_ = true;
    ep->worker_.anyFailed_ = true;
  }
};

// --- UcxRegion

UcxRegion::~UcxRegion() { ucp_mem_unmap(context_, memh_); }

// --- UcxEndpoint

UcxEndpoint::UcxEndpoint(UcxWorker& worker) : worker_(worker) {}

UcxEndpoint::~UcxEndpoint() {
  close();
  // Force-closing completes every get in flight; their buffers are free of UCX from here on.
  sweep();
  auto& eps = worker_.endpoints_;
  eps.erase(std::remove(eps.begin(), eps.end(), this), eps.end());
}

Result<uint32_t> UcxEndpoint::addRemoteRegion(uint64_t address, uint64_t bytes,
                                              std::span<const uint8_t> rkey) {
  if (ep_ == nullptr) return makeError(ErrorCode::kUnavailable, "UCX endpoint is closed");
  ucp_rkey_h handle = nullptr;
  const ucs_status_t st = ucp_ep_rkey_unpack(ep_, rkey.data(), &handle);
  if (st != UCS_OK) return ucxError("ucp_ep_rkey_unpack", st);
  regions_.push_back({address, bytes, handle});
  return static_cast<uint32_t>(regions_.size() - 1);
}

kj::Promise<std::vector<bool>> UcxEndpoint::get(std::vector<UcxGet> gets, kj::TimePoint deadline,
                                                std::function<void(size_t)> onEachDone) {
  sweep();
  if (gets.empty()) return std::vector<bool>();
  if (ep_ == nullptr || failed_) return std::vector<bool>(gets.size(), false);
  auto paf = kj::newPromiseAndFulfiller<std::vector<bool>>();
  auto owned = std::make_unique<Batch>();
  Batch& batch = *owned;
  batch.fulfiller = kj::mv(paf.fulfiller);
  batch.each = std::move(onEachDone);
  batch.ok.assign(gets.size(), false);
  batch.slots.reserve(gets.size());
  for (size_t i = 0; i < gets.size(); ++i) batch.slots.push_back({&batch, i});
  batch.pending = gets.size() + 1;  // +1 until every get is posted
  batches_.push_back(std::move(owned));
  for (size_t i = 0; i < gets.size(); ++i) {
    const UcxGet& g = gets[i];
    if (g.region >= regions_.size() || g.remoteAddress < regions_[g.region].address ||
        g.bytes > regions_[g.region].bytes ||
        g.remoteAddress - regions_[g.region].address > regions_[g.region].bytes - g.bytes) {
      batch.complete(i, false);
      continue;
    }
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &UcxCallbacks::getDone;
    param.user_data = &batch.slots[i];
    if (g.localRegion) {
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      param.memh = g.localRegion->handle();
    }
    ucs_status_ptr_t req = ucp_get_nbx(ep_, g.local, g.bytes, g.remoteAddress,
                                       regions_[g.region].rkey, &param);
    if (req == nullptr) {
      batch.complete(i, true);
    } else if (UCS_PTR_IS_ERR(req)) {
      batch.complete(i, false);
    } else {
      // completes through getDone
    }
  }
  if (--batch.pending == 0) batch.finish();  // the +1 above
  if (!batch.done) {
    batch.deadline = worker_.timer_.atTime(deadline)
                         .then([this] { close(); })
                         .eagerlyEvaluate([](kj::Exception&&) {});
    worker_.kick();
  }
  return kj::mv(paf.promise);
}

void UcxEndpoint::close() {
  failed_ = true;
  if (ep_ == nullptr) return;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep_, &param);
  ep_ = nullptr;
  if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
    // A forced close does not wait for the peer: it finishes within a few progress calls.
    while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(worker_.worker_);
    ucp_request_free(req);
  }
  // Requests purged by the close have completed (as canceled) by now; make sure of it.
  for (int i = 0; i < 1000 && std::any_of(batches_.begin(), batches_.end(),
                                          [](const auto& b) { return !b->done; });
       ++i) {
    ucp_worker_progress(worker_.worker_);
  }
  for (auto& r : regions_) {
    if (r.rkey) ucp_rkey_destroy(r.rkey);
    r.rkey = nullptr;
  }
}

void UcxEndpoint::sweep() {
  for (auto it = batches_.begin(); it != batches_.end();) {
    if ((*it)->done) {
      it = batches_.erase(it);
    } else {
      ++it;
    }
  }
}

// --- UcxWorker

Result<std::unique_ptr<UcxWorker>> UcxWorker::create(kj::UnixEventPort& port, kj::Timer& timer) {
  std::unique_ptr<UcxWorker> w(new UcxWorker(port, timer));
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return ucxError("ucp_config_read", st);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &w->context_);
  ucp_config_release(config);
  if (st != UCS_OK) return ucxError("ucp_init", st);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(w->context_, &wp, &w->worker_);
  if (st != UCS_OK) return ucxError("ucp_worker_create", st);
  ucp_address_t* address = nullptr;
  size_t length = 0;
  st = ucp_worker_get_address(w->worker_, &address, &length);
  if (st != UCS_OK) return ucxError("ucp_worker_get_address", st);
  const auto* bytes = reinterpret_cast<const uint8_t*>(address);
  w->address_.assign(bytes, bytes + length);
  ucp_worker_release_address(w->worker_, address);
  st = ucp_worker_get_efd(w->worker_, &w->efd_);
  if (st != UCS_OK) return ucxError("ucp_worker_get_efd", st);
  const char* tls = std::getenv("UCX_TLS");
  w->transports_ = tls ? tls : "all";
  w->observer_ = kj::heap<kj::UnixEventPort::FdObserver>(port, w->efd_,
                                                         kj::UnixEventPort::FdObserver::OBSERVE_READ);
  w->loop_ = w->progressLoop().eagerlyEvaluate([](kj::Exception&& e) {
    KJ_LOG(ERROR, "UCX progress loop failed", e);
  });
  return w;
}

UcxWorker::~UcxWorker() {
  loop_ = nullptr;
  observer_ = nullptr;
  if (worker_) ucp_worker_destroy(worker_);
  if (context_) ucp_cleanup(context_);
}

Result<std::unique_ptr<UcxRegion>> UcxWorker::map(uint8_t* base, uint64_t bytes) {
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  p.address = base;
  p.length = bytes;
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(context_, &p, &memh);
  if (st != UCS_OK) return ucxError("ucp_mem_map", st);
  void* rkey = nullptr;
  size_t size = 0;
  st = ucp_rkey_pack(context_, memh, &rkey, &size);
  if (st != UCS_OK) {
    ucp_mem_unmap(context_, memh);
    return ucxError("ucp_rkey_pack", st);
  }
  const auto* b = static_cast<const uint8_t*>(rkey);
  std::vector<uint8_t> packed(b, b + size);
  ucp_rkey_buffer_release(rkey);
  return std::unique_ptr<UcxRegion>(new UcxRegion(context_, memh, base, bytes, std::move(packed)));
}

Result<std::unique_ptr<UcxEndpoint>> UcxWorker::connect(std::span<const uint8_t> address) {
  if (address.empty() || address.size() > kMaxWorkerAddressBytes) {
    return makeError(ErrorCode::kInvalidArgument, "a UCX worker address of ", address.size(),
                     " bytes");
  }
  std::unique_ptr<UcxEndpoint> ep(new UcxEndpoint(*this));
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = reinterpret_cast<const ucp_address_t*>(address.data());
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = &UcxCallbacks::peerFailed;
  p.err_handler.arg = ep.get();
  const ucs_status_t st = ucp_ep_create(worker_, &p, &ep->ep_);
  if (st != UCS_OK) return ucxError("ucp_ep_create", st);
  endpoints_.push_back(ep.get());
  return ep;
}

void UcxWorker::kick() {
  if (wake_) {
    wake_->fulfill();
    wake_ = nullptr;
  }
}

void UcxWorker::closeFailed() {
  if (!anyFailed_) return;
  anyFailed_ = false;
  const std::vector<UcxEndpoint*> eps = endpoints_;
  for (UcxEndpoint* ep : eps) {
    if (ep->failed_ && ep->ep_ != nullptr) ep->close();
  }
}

bool UcxWorker::getsInFlight() const {
  for (const UcxEndpoint* ep : endpoints_) {
    for (const auto& b : ep->batches_) {
      if (!b->done) return true;
    }
  }
  return false;
}

kj::Promise<void> UcxWorker::progressLoop() {
  for (int i = 0; i < kProgressPerTurn && ucp_worker_progress(worker_) != 0; ++i) {
  }
  closeFailed();
  const ucs_status_t st = ucp_worker_arm(worker_);
  if (st == UCS_ERR_BUSY) return kj::evalLater([this] { return progressLoop(); });
  auto paf = kj::newPromiseAndFulfiller<void>();
  wake_ = kj::mv(paf.fulfiller);
  kj::Promise<void> next = observer_->whenBecomesReadable().exclusiveJoin(kj::mv(paf.promise));
  if (getsInFlight() || holds_ > 0) next = next.exclusiveJoin(timer_.afterDelay(kInFlightTick));
  return next.then([this] { return progressLoop(); });
}

}  // namespace kvtier
