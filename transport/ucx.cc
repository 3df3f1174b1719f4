#include "transport/ucx.h"

#include <kj/debug.h>
#include <ucp/api/ucp.h>

#include <netdb.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace kvtier {
namespace {

// While gets are in flight, or a peer holds pins on our memory for its gets, the worker is also
// progressed on this tick, in case a wake-up through the event fd is late (measured: a replay
// paced at 20x the trace's timestamps saw ~400 gets of 2 s each time out without it). Idle, it
// only waits on the fd.
constexpr kj::Duration kInFlightTick = 1 * kj::MILLISECONDS;
// Progress calls in one turn of the event loop before it lets other events run.
constexpr int kProgressPerTurn = 256;
// Connections accepted from peers at once; more are rejected (a cluster has far fewer members).
constexpr size_t kMaxAccepted = 4096;
// The longest a forced close of an endpoint may progress the worker on the event loop.
constexpr auto kForceCloseWait = std::chrono::milliseconds(200);

Error ucxError(const char* what, ucs_status_t status) {
  return makeError(ErrorCode::kUnavailable, what, ": ", ucs_status_string(status));
}

// host:port as a socket address (numeric or a name; the first address it resolves to).
Result<sockaddr_storage> resolve(const std::string& host, uint16_t port, socklen_t* length) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (host.empty() ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc =
      ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return makeError(ErrorCode::kUnavailable, "cannot resolve ", host, ": ", ::gai_strerror(rc));
  }
  sockaddr_storage out{};
  std::memcpy(&out, found->ai_addr, found->ai_addrlen);
  *length = found->ai_addrlen;
  ::freeaddrinfo(found);
  return out;
}

// The active messages a get is made of: the fetcher's request, the holder's answer.
constexpr unsigned kAmAsk = 1, kAmAnswer = 2;
struct AskHeader {
  uint64_t id, address, bytes;
  UcxGrant grant;
};
struct AnswerHeader {
  uint64_t id;
  uint64_t ok;  // 1: the bytes follow; 0: refused (outside the holder's mapped memory)
};

}  // namespace

struct UcxEndpoint::Batch {
  // A get's request message, kept until UCX has sent it.
  struct Ask {
    Batch* batch;
    size_t index;
    AskHeader header;
  };
  UcxEndpoint* endpoint = nullptr;
  std::vector<bool> ok, finished;
  std::vector<Ask> asks;  // sized before any get is posted: stable addresses for user_data
  size_t pending = 0;     // gets not finished
  size_t sending = 0;     // requests UCX still holds
  bool done = false;
  kj::Own<kj::PromiseFulfiller<std::vector<bool>>> fulfiller;
  kj::Promise<void> deadline = nullptr;
  std::function<void(size_t)> each;

  void complete(size_t index, bool success) {
    if (finished[index]) return;
    finished[index] = true;
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
  // A get's request has left (or failed: then so did the get).
  static void asked(void* request, ucs_status_t status, void* user) {
    auto* ask = static_cast<UcxEndpoint::Batch::Ask*>(user);
    UcxEndpoint::Batch& batch = *ask->batch;
    --batch.sending;
    if (status != UCS_OK) {
      batch.endpoint->worker_.pending_.erase(ask->header.id);
      batch.complete(ask->index, false);
    }
    ucp_request_free(request);
  }
  // Holder: a peer asks for bytes. Answered after progress, from answerAsked.
  static ucs_status_t onAsk(void* arg, const void* header, size_t headerLength, void*, size_t,
                            const ucp_am_recv_param_t* param) {
    auto* worker = static_cast<UcxWorker*>(arg);
    if (headerLength != sizeof(AskHeader) ||
        !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
      return UCS_OK;  // not ours: dropped
    }
    AskHeader ask;
    std::memcpy(&ask, header, sizeof ask);
    worker->asked_.push_back({param->reply_ep, ask.id, ask.address, ask.bytes, ask.grant});
    return UCS_OK;
  }
  // Fetcher: the holder's answer. The bytes are copied into the get's block only while the get
  // is pending; after a deadline it is not, and they are dropped.
  static ucs_status_t onAnswer(void* arg, const void* header, size_t headerLength, void* data,
                               size_t length, const ucp_am_recv_param_t* param) {
    if (headerLength != sizeof(AnswerHeader)) return UCS_OK;
    AnswerHeader answer;
    std::memcpy(&answer, header, sizeof answer);
    // Eager only (the holder sends with UCP_AM_SEND_FLAG_EAGER): a rendezvous answer is refused.
    const bool whole = !(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV);
    static_cast<UcxWorker*>(arg)->answered(answer.id, answer.ok == 1 && whole, data, length);
    return UCS_OK;
  }
  // Holder: an answer has left (or failed: the peer is gone; nothing to do but let go of it).
  static void answerSent(void* request, ucs_status_t, void* user) {
    delete static_cast<AnswerHeader*>(user);
    ucp_request_free(request);
  }
  static void peerFailed(void* arg, ucp_ep_h, ucs_status_t) {
    auto* ep = static_cast<UcxEndpoint*>(arg);
    ep->failed_ = true;
    ep->worker_.anyFailed_ = true;
  }
  static void acceptedFailed(void* arg, ucp_ep_h, ucs_status_t) {
    auto* accepted = static_cast<UcxWorker::Accepted*>(arg);
    accepted->failed = true;
    accepted->worker->anyFailed_ = true;
  }
  // Inside progress: queued, accepted (or rejected) by acceptPending after it.
  static void connectionRequest(ucp_conn_request_h request, void* arg) {
    static_cast<UcxWorker*>(arg)->requests_.push_back(request);
  }
  static void flushed(void* request, ucs_status_t status, void* user) {
    static_cast<UcxEndpoint*>(user)->flushDone(status);
    ucp_request_free(request);
  }
};

// --- UcxRegion

UcxRegion::~UcxRegion() {
  auto& mapped = worker_.mapped_;
  mapped.erase(std::remove(mapped.begin(), mapped.end(), std::pair{base_, bytes_}), mapped.end());
  ucp_mem_unmap(worker_.context_, memh_);
}

// --- UcxEndpoint

UcxEndpoint::UcxEndpoint(UcxWorker& worker) : worker_(worker) {}

UcxEndpoint::~UcxEndpoint() {
  close();
  // Force-closing completes every get in flight; their buffers are free of UCX from here on.
  sweep();
  auto& eps = worker_.endpoints_;
  eps.erase(std::remove(eps.begin(), eps.end(), this), eps.end());
}

Result<uint32_t> UcxEndpoint::addRemoteRegion(uint64_t address, uint64_t bytes) {
  if (ep_ == nullptr) return makeError(ErrorCode::kUnavailable, "UCX endpoint is closed");
  regions_.push_back({address, bytes});
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
  batch.endpoint = this;
  batch.fulfiller = kj::mv(paf.fulfiller);
  batch.each = std::move(onEachDone);
  batch.ok.assign(gets.size(), false);
  batch.finished.assign(gets.size(), false);
  batch.asks.reserve(gets.size());
  batch.pending = gets.size() + 1;  // +1 until every get is asked for
  batches_.push_back(std::move(owned));
  for (size_t i = 0; i < gets.size(); ++i) {
    const UcxGet& g = gets[i];
    batch.asks.push_back({&batch, i, {0, g.remoteAddress, g.bytes, g.grant}});
    if (g.region >= regions_.size() || g.remoteAddress < regions_[g.region].address ||
        g.bytes > regions_[g.region].bytes ||
        g.remoteAddress - regions_[g.region].address > regions_[g.region].bytes - g.bytes) {
      batch.complete(i, false);
      continue;
    }
    Batch::Ask& ask = batch.asks.back();
    ask.header.id = worker_.newGetId();
    worker_.pending_[ask.header.id] = {this, &batch, i, g.local, g.bytes};
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    param.cb.send = &UcxCallbacks::asked;
    param.user_data = &ask;
    ucs_status_ptr_t req =
        ucp_am_send_nbx(ep_, kAmAsk, &ask.header, sizeof ask.header, nullptr, 0, &param);
    if (UCS_PTR_IS_ERR(req)) {
      worker_.pending_.erase(ask.header.id);
      batch.complete(i, false);
    } else if (req != nullptr) {
      ++batch.sending;  // completes through asked
    }
  }
  if (--batch.pending == 0) batch.finish();  // the +1 above
  if (!batch.done) {
    // Past the deadline with gets still in flight, the endpoint is closed; a batch that finished
    // by then closes nothing (another batch may be using the endpoint within its own deadline).
    batch.deadline = worker_.timer_.atTime(deadline)
                         .then([this, &batch] {
                           if (!batch.done) close();
                         })
                         .eagerlyEvaluate([](kj::Exception&&) {});
    worker_.kick();
  }
  return kj::mv(paf.promise);
}

kj::Promise<void> UcxEndpoint::connected(kj::TimePoint deadline) {
  if (ep_ == nullptr || failed_) {
    return KJ_EXCEPTION(DISCONNECTED, "UCX endpoint failed before it connected");
  }
  // A flush of a fresh client endpoint completes once its connection is up.
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxCallbacks::flushed;
  param.user_data = this;
  ucs_status_ptr_t req = ucp_ep_flush_nbx(ep_, &param);
  if (req == nullptr) return kj::READY_NOW;
  if (UCS_PTR_IS_ERR(req)) {
    close();
    return KJ_EXCEPTION(DISCONNECTED, "UCX connection failed",
                        ucs_status_string(UCS_PTR_STATUS(req)));
  }
  auto paf = kj::newPromiseAndFulfiller<void>();
  connecting_ = kj::mv(paf.fulfiller);
  worker_.kick();
  return paf.promise.exclusiveJoin(worker_.timer_.atTime(deadline).then([this]() -> void {
    close();
    kj::throwRecoverableException(
        KJ_EXCEPTION(DISCONNECTED, "UCX connection not established by its deadline"));
  }));
}

void UcxEndpoint::flushDone(int code) {
  const auto status = static_cast<ucs_status_t>(code);
  if (!connecting_) return;
  if (status == UCS_OK) {
    connecting_->fulfill();
  } else {
    failed_ = true;
    worker_.anyFailed_ = true;
    connecting_->reject(
        KJ_EXCEPTION(DISCONNECTED, "UCX connection failed", ucs_status_string(status)));
  }
  connecting_ = nullptr;
}

void UcxWorker::forceClose(ucp_worker* worker, ucp_ep* ep) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &param);
  if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
    // A forced close does not wait for the peer: it finishes within a few progress calls. Bounded
    // all the same (this runs on the event loop); a request freed unfinished completes inside UCX.
    const auto until = std::chrono::steady_clock::now() + kForceCloseWait;
    while (ucp_request_check_status(req) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < until) {
      ucp_worker_progress(worker);
    }
    ucp_request_free(req);
  }
}

void UcxEndpoint::close() {
  failed_ = true;
  if (ep_ == nullptr) return;
  ucp_ep* ep = ep_;
  ep_ = nullptr;
  UcxWorker::forceClose(worker_.worker_, ep);
  // A flush still waiting completed (failed) in the close's progress; if not, it never will.
  if (connecting_) {
    connecting_->reject(KJ_EXCEPTION(DISCONNECTED, "UCX endpoint closed before it connected"));
    connecting_ = nullptr;
  }
  // Requests purged by the close have completed (as canceled) by now; make sure of it.
  for (int i = 0; i < 1000 && std::any_of(batches_.begin(), batches_.end(),
                                          [](const auto& b) { return b->sending > 0; });
       ++i) {
    ucp_worker_progress(worker_.worker_);
  }
  // Gets still waiting for their answer fail now: an answer that comes later finds none.
  std::vector<UcxWorker::Pending> waiting;
  for (auto it = worker_.pending_.begin(); it != worker_.pending_.end();) {
    if (it->second.endpoint == this) {
      waiting.push_back(it->second);
      it = worker_.pending_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& w : waiting) static_cast<Batch*>(w.batch)->complete(w.index, false);
}

void UcxEndpoint::sweep() {
  for (auto it = batches_.begin(); it != batches_.end();) {
    if ((*it)->done && (*it)->sending == 0) {
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
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &w->context_);
  ucp_config_release(config);
  if (st != UCS_OK) return ucxError("ucp_init", st);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(w->context_, &wp, &w->worker_);
  if (st != UCS_OK) return ucxError("ucp_worker_create", st);
  for (const auto& [id, handler] :
       {std::pair{kAmAsk, &UcxCallbacks::onAsk}, std::pair{kAmAnswer, &UcxCallbacks::onAnswer}}) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = id;
    hp.cb = handler;
    hp.arg = w.get();
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    st = ucp_worker_set_am_recv_handler(w->worker_, &hp);
    if (st != UCS_OK) return ucxError("ucp_worker_set_am_recv_handler", st);
  }
  st = ucp_worker_get_efd(w->worker_, &w->efd_);
  if (st != UCS_OK) return ucxError("ucp_worker_get_efd", st);
  const char* tls = std::getenv("UCX_TLS");
  w->transports_ = tls ? tls : "all";
  w->observer_ = kj::heap<kj::UnixEventPort::FdObserver>(
      port, w->efd_, kj::UnixEventPort::FdObserver::OBSERVE_READ);
  w->loop_ = w->progressLoop().eagerlyEvaluate(
      [](kj::Exception&& e) { KJ_LOG(ERROR, "UCX progress loop failed", e); });
  return w;
}

UcxWorker::~UcxWorker() {
  loop_ = nullptr;
  observer_ = nullptr;
  // Connection requests are rejected while their listener exists; none comes after it is gone.
  for (ucp_conn_request* request : requests_) ucp_listener_reject(listener_, request);
  requests_.clear();
  if (listener_) ucp_listener_destroy(listener_);
  listener_ = nullptr;
  for (auto& a : accepted_) forceClose(worker_, a->ep);
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
  mapped_.emplace_back(base, bytes);  // peers may read it from here on
  return std::unique_ptr<UcxRegion>(new UcxRegion(*this, memh, base, bytes));
}

Result<uint16_t> UcxWorker::listen(const std::string& host) {
  if (listener_) return listenPort_;
  socklen_t length = 0;
  auto address = resolve(host, 0, &length);
  if (!address) return address.error();
  ucp_listener_params_t p{};
  p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*address);
  p.sockaddr.addrlen = length;
  p.conn_handler.cb = &UcxCallbacks::connectionRequest;
  p.conn_handler.arg = this;
  ucs_status_t st = ucp_listener_create(worker_, &p, &listener_);
  if (st != UCS_OK) return ucxError("ucp_listener_create", st);
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  st = ucp_listener_query(listener_, &attr);
  if (st != UCS_OK) return ucxError("ucp_listener_query", st);
  const auto* sa = reinterpret_cast<const sockaddr*>(&attr.sockaddr);
  listenPort_ =
      ntohs(sa->sa_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port
                                      : reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  return listenPort_;
}

void UcxWorker::answerAsked() {
  std::vector<Ask> asks;
  asks.swap(asked_);
  for (const Ask& ask : asks) {
    // Only on an open connection from a peer (an endpoint failed meanwhile is closed below).
    const bool open = std::any_of(accepted_.begin(), accepted_.end(),
                                  [&](const auto& a) { return a->ep == ask.reply && !a->failed; });
    if (!open) continue;
    // Inside one of the ranges the named grant gives (each inside mapped memory).
    const auto within = [&](const auto& range) {
      const auto base = reinterpret_cast<uint64_t>(range.first);
      return ask.address >= base && ask.bytes <= range.second &&
             ask.address - base <= range.second - ask.bytes;
    };
    const auto granted = grants_.find(ask.grant);
    const bool inside = granted != grants_.end() &&
                        std::any_of(granted->second.begin(), granted->second.end(), within) &&
                        std::any_of(mapped_.begin(), mapped_.end(), within);
    auto* header = new AnswerHeader{ask.id, inside ? 1u : 0u};
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    // Eager: a rendezvous would have the peer answer back, which UCX 1.13 cannot survive either.
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    param.cb.send = &UcxCallbacks::answerSent;
    param.user_data = header;
    ucs_status_ptr_t req =
        ucp_am_send_nbx(ask.reply, kAmAnswer, header, sizeof *header,
                        inside ? reinterpret_cast<const void*>(ask.address) : nullptr,
                        inside ? ask.bytes : 0, &param);
    if (req == nullptr || UCS_PTR_IS_ERR(req)) delete header;  // sent already, or failed
  }
}

UcxGrant UcxWorker::grant(std::vector<std::pair<const uint8_t*, uint64_t>> ranges) {
  UcxGrant token{};
  // Unguessable: it is all that stands between a stranger on the UCX port and the pool's bytes.
  while (token == UcxGrant{} || grants_.count(token)) {
    if (::getrandom(token.data(), sizeof token, 0) != static_cast<ssize_t>(sizeof token)) {
      throw std::runtime_error("getrandom failed");
    }
  }
  grants_.emplace(token, std::move(ranges));
  return token;
}

void UcxWorker::revoke(const UcxGrant& grant) { grants_.erase(grant); }

uint64_t UcxWorker::newGetId() {
  // Unguessable, as grants are: an answer names its get by id, and anyone who reaches the UCX
  // port can send one, so a sequential id would let a stranger fail (or answer) this node's gets.
  for (;;) {
    if (idsLeft_ == 0) {
      if (::getrandom(ids_.data(), sizeof ids_, 0) != static_cast<ssize_t>(sizeof ids_)) {
        throw std::runtime_error("getrandom failed");
      }
      idsLeft_ = ids_.size();
    }
    const uint64_t id = ids_[--idsLeft_];
    if (id != 0 && !pending_.count(id)) return id;
  }
}

void UcxWorker::answered(uint64_t id, bool ok, const void* data, size_t length) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;  // not pending any more (a deadline): dropped
  const Pending get = it->second;
  pending_.erase(it);
  const bool whole = ok && length == get.bytes;
  if (whole) std::memcpy(get.local, data, length);
  static_cast<UcxEndpoint::Batch*>(get.batch)->complete(get.index, whole);
}

void UcxWorker::acceptPending() {
  std::vector<ucp_conn_request*> requests;
  requests.swap(requests_);
  for (ucp_conn_request* request : requests) {
    if (accepted_.size() >= kMaxAccepted) {
      ucp_listener_reject(listener_, request);
      continue;
    }
    auto accepted = std::make_unique<Accepted>();
    accepted->worker = this;
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.conn_request = request;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = &UcxCallbacks::acceptedFailed;
    p.err_handler.arg = accepted.get();
    // A request whose peer is gone already fails here, or later through acceptedFailed.
    if (ucp_ep_create(worker_, &p, &accepted->ep) == UCS_OK) {
      accepted_.push_back(std::move(accepted));
    }
  }
}

Result<std::unique_ptr<UcxEndpoint>> UcxWorker::connect(const std::string& host, uint16_t port) {
  socklen_t length = 0;
  auto address = resolve(host, port, &length);
  if (!address) return address.error();
  std::unique_ptr<UcxEndpoint> ep(new UcxEndpoint(*this));
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                 UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*address);
  p.sockaddr.addrlen = length;
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
  for (auto it = accepted_.begin(); it != accepted_.end();) {
    if ((*it)->failed) {
      forceClose(worker_, (*it)->ep);
      it = accepted_.erase(it);
    } else {
      ++it;
    }
  }
}

bool UcxWorker::getsInFlight() const {
  if (!pending_.empty()) return true;
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
  acceptPending();
  answerAsked();
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
