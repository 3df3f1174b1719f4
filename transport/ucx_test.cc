// UCX workers in one process (two workers on one event loop, the way two daemons meet: the fetcher
// connects to the holder's listener, which accepts the connection with an endpoint of its own):
// gets read the peer's registered bytes; a get outside a region fails without being started; a
// closed endpoint fails at once; a deadline ends every get in flight.
#include "transport/ucx.h"

#include <gtest/gtest.h>
#include <kj/async-io.h>
#include <ucp/api/ucp.h>

#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <array>
#include <cstring>
#include <numeric>

namespace kvtier {
namespace {

struct Pair {
  kj::AsyncIoContext io = kj::setupAsyncIo();
  std::unique_ptr<UcxWorker> holder, fetcher;
  std::vector<uint8_t> remote, local;
  std::unique_ptr<UcxRegion> remoteRegion;
  std::unique_ptr<UcxEndpoint> ep;
  uint32_t region = 0;
  UcxGrant grant{};  // the holder's, for all of `remote` (as a pin of it would give)

  explicit Pair(size_t bytes) : remote(bytes), local(bytes, 0) {
    holder = UcxWorker::create(io.unixEventPort, io.provider->getTimer()).value();
    fetcher = UcxWorker::create(io.unixEventPort, io.provider->getTimer()).value();
    for (size_t i = 0; i < bytes; ++i) remote[i] = static_cast<uint8_t>(i * 131 + 7);
    remoteRegion = holder->map(remote.data(), remote.size()).value();
    const uint16_t port = holder->listen("127.0.0.1").value();
    ep = fetcher->connect("127.0.0.1", port).value();
    ep->connected(io.provider->getTimer().now() + 10 * kj::SECONDS).wait(io.waitScope);
    region = ep->addRemoteRegion(reinterpret_cast<uint64_t>(remote.data()), remote.size()).value();
    grant = holder->grant({{remote.data(), remote.size()}});
  }
  std::vector<bool> get(std::vector<UcxGet> gets, kj::Duration timeout = 10 * kj::SECONDS) {
    auto deadline = io.provider->getTimer().now() + timeout;
    return ep->get(std::move(gets), deadline).wait(io.waitScope);
  }
  UcxGet whole(uint64_t offset, uint64_t bytes) {
    return UcxGet{local.data() + offset, region, reinterpret_cast<uint64_t>(remote.data()) + offset,
                  bytes, grant};
  }
};

TEST(Ucx, GetsReadThePeersRegisteredBytes) {
  constexpr size_t kBlock = 256 << 10;
  Pair p(8 * kBlock);
  std::vector<UcxGet> gets;
  for (size_t b = 0; b < 8; ++b) gets.push_back(p.whole(b * kBlock, kBlock));
  const auto ok = p.get(gets);
  ASSERT_EQ(ok.size(), 8u);
  for (bool b : ok) EXPECT_TRUE(b);
  EXPECT_EQ(p.local, p.remote);
  EXPECT_FALSE(p.ep->failed());
}

TEST(Ucx, AGetOutsideItsRegionFailsAndTheOthersStillRead) {
  Pair p(64 << 10);
  std::vector<UcxGet> gets{p.whole(0, 4096), p.whole(60 << 10, 8 << 10), p.whole(4096, 4096)};
  gets.push_back(UcxGet{p.local.data(), 7, 0, 16});  // no such region
  const auto ok = p.get(gets);
  EXPECT_EQ(ok, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(0, std::memcmp(p.local.data(), p.remote.data(), 8192));
}

// The holder answers only for bytes inside its grant (and its mapped memory): a fetcher that names
// more (a region it was told wrongly) is refused, and nothing is written.
TEST(Ucx, TheHolderRefusesBytesOutsideItsGrant) {
  Pair p(64 << 10);
  const uint32_t wider =
      p.ep->addRemoteRegion(reinterpret_cast<uint64_t>(p.remote.data()), 2 * p.remote.size())
          .value();
  std::vector<uint8_t> out(8192, 0xEE);
  const auto ok =
      p.get({UcxGet{out.data(), wider, reinterpret_cast<uint64_t>(p.remote.data()) + (60 << 10),
                    8192, p.grant},
             p.whole(0, 4096)});
  EXPECT_EQ(ok, (std::vector<bool>{false, true}));
  EXPECT_EQ(out, std::vector<uint8_t>(8192, 0xEE));
}

// Bytes are answered only under a live grant: a guessed token, or one the holder revoked (the pin
// ended), gets a refusal — a stranger who reaches the UCX port reads nothing.
TEST(Ucx, TheHolderAnswersOnlyUnderALiveGrant) {
  Pair p(16 << 10);
  UcxGet guessed = p.whole(0, 4096);
  guessed.grant = {p.grant[0] ^ 1, p.grant[1]};
  EXPECT_EQ(p.get({guessed, p.whole(4096, 4096)}), (std::vector<bool>{false, true}));
  p.holder->revoke(p.grant);
  std::fill(p.local.begin(), p.local.end(), 0);
  EXPECT_EQ(p.get({p.whole(0, 4096)}), std::vector<bool>{false});
  EXPECT_EQ(p.local, std::vector<uint8_t>(p.local.size(), 0));
}

TEST(Ucx, AClosedEndpointFailsAtOnceAndNothingIsWritten) {
  Pair p(16 << 10);
  p.remoteRegion.reset();  // the peer's worker is gone, its regions first
  p.holder.reset();
  // Not knowing yet, the get either fails or — for transports that read the peer's memory
  // directly — times out; either way the promise resolves and reports failure or the bytes.
  const auto ok = p.get({p.whole(0, 16 << 10)}, 500 * kj::MILLISECONDS);
  ASSERT_EQ(ok.size(), 1u);
  if (!ok[0]) {
    EXPECT_TRUE(p.ep->failed());
    const auto again = p.get({p.whole(0, 16)});
    EXPECT_EQ(again, std::vector<bool>{false});
  }
}

TEST(Ucx, ADeadlineInThePastFailsTheBatchAndClosesTheEndpoint) {
  Pair p(4 << 20);
  const auto ok = p.get({p.whole(0, 4 << 20)}, 0 * kj::SECONDS);
  ASSERT_EQ(ok.size(), 1u);
  // The get may have completed in the same turn (shared memory); if not, the deadline ended it.
  if (!ok[0]) {
    EXPECT_TRUE(p.ep->failed());
  }
}

// A batch that finished before its deadline closes nothing when the deadline passes: the endpoint
// goes on serving gets (another batch may be using it within a deadline of its own).
TEST(Ucx, AFinishedBatchsDeadlineLeavesTheEndpointOpen) {
  Pair p(16 << 10);
  EXPECT_EQ(p.get({p.whole(0, 4096)}, 1 * kj::SECONDS), std::vector<bool>{true});
  p.io.provider->getTimer().afterDelay(1200 * kj::MILLISECONDS).wait(p.io.waitScope);
  EXPECT_FALSE(p.ep->failed()) << "the finished batch's deadline closed the endpoint";
  EXPECT_EQ(p.get({p.whole(4096, 4096)}), std::vector<bool>{true});
  EXPECT_EQ(0, std::memcmp(p.local.data(), p.remote.data(), 8192));
}

// A bare UCX worker the test progresses itself, speaking the get's wire format (active message 1
// asks, 2 answers: {id, ok} then the bytes): a holder that never answers, or a stranger who
// connects to a fetcher's listener and sends answers it was never asked for.
struct BareUcx {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_listener_h listener = nullptr;
  std::vector<ucp_ep_h> eps;

  BareUcx() {
    ucp_config_t* config = nullptr;
    EXPECT_EQ(ucp_config_read(nullptr, nullptr, &config), UCS_OK);
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM;
    EXPECT_EQ(ucp_init(&params, config, &context), UCS_OK);
    ucp_config_release(config);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    EXPECT_EQ(ucp_worker_create(context, &wp, &worker), UCS_OK);
  }
  ~BareUcx() {
    for (ucp_ep_h ep : eps) {
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      wait(ucp_ep_close_nbx(ep, &param));
    }
    if (listener) ucp_listener_destroy(listener);
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
  }
  void progress() {
    for (int i = 0; i < 64 && ucp_worker_progress(worker) != 0; ++i) {
    }
  }
  void wait(ucs_status_ptr_t request) {
    if (request == nullptr || UCS_PTR_IS_ERR(request)) return;
    for (int i = 0; i < 100000 && ucp_request_check_status(request) == UCS_INPROGRESS; ++i) {
      ucp_worker_progress(worker);
    }
    ucp_request_free(request);
  }
  static void accept(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<BareUcx*>(arg);
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.conn_request = request;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ucp_ep_h ep = nullptr;
    if (ucp_ep_create(self->worker, &p, &ep) == UCS_OK) self->eps.push_back(ep);
  }
  uint16_t listen() {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ucp_listener_params_t p{};
    p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    p.sockaddr.addrlen = sizeof addr;
    p.conn_handler.cb = &BareUcx::accept;
    p.conn_handler.arg = this;
    EXPECT_EQ(ucp_listener_create(worker, &p, &listener), UCS_OK);
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    EXPECT_EQ(ucp_listener_query(listener, &attr), UCS_OK);
    return ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  }
  ucp_ep_h connect(uint16_t port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                   UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    p.sockaddr.addrlen = sizeof addr;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ucp_ep_h ep = nullptr;
    EXPECT_EQ(ucp_ep_create(worker, &p, &ep), UCS_OK);
    eps.push_back(ep);
    return ep;
  }
  // Starts sending an answer ({id, ok}, no bytes); the request to drive, if any (`header` must
  // stay valid until it completes).
  ucs_status_ptr_t answer(ucp_ep_h ep, const uint64_t* header) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    return ucp_am_send_nbx(ep, 2, header, 2 * sizeof(uint64_t), nullptr, 0, &param);
  }
};

// Anyone who reaches a daemon's UCX port can send it answers. A get is ended only by the answer
// to it: a stranger who sprays answers under every small id neither fails nor fills it.
TEST(Ucx, AStrangersAnswersCannotEndAGet) {
  kj::AsyncIoContext io = kj::setupAsyncIo();
  auto& ws = io.waitScope;
  auto& timer = io.provider->getTimer();
  auto fetcher = UcxWorker::create(io.unixEventPort, timer).value();
  const uint16_t fetcherPort = fetcher->listen("127.0.0.1").value();
  BareUcx silent;  // the holder: it takes the connection, and never answers
  auto ep = fetcher->connect("127.0.0.1", silent.listen()).value();
  auto connected = ep->connected(timer.now() + 10 * kj::SECONDS);
  for (int i = 0; i < 10000 && !connected.poll(ws); ++i) {
    silent.progress();
    ::usleep(100);
  }
  connected.wait(ws);
  std::vector<uint8_t> local(4096, 0xEE);
  const uint64_t remote = 1 << 20;  // the holder's memory, as its pin would have said
  const uint32_t region = ep->addRemoteRegion(remote, 4096).value();
  auto got =
      ep->get({UcxGet{local.data(), region, remote, 4096, {}}}, timer.now() + 30 * kj::SECONDS);
  for (int i = 0; i < 100; ++i) (void)got.poll(ws);  // the ask leaves

  BareUcx stranger;
  ucp_ep_h sep = stranger.connect(fetcherPort);
  // Drives both sides until the stranger's request completes (the fetcher runs on this loop).
  const auto drive = [&](ucs_status_ptr_t request) {
    if (request == nullptr || UCS_PTR_IS_ERR(request)) return;
    for (int i = 0; i < 20000 && ucp_request_check_status(request) == UCS_INPROGRESS; ++i) {
      stranger.progress();
      (void)got.poll(ws);
      ::usleep(50);
    }
    ucp_request_free(request);
  };
  ucp_request_param_t flush{};
  drive(ucp_ep_flush_nbx(sep, &flush));  // connected
  for (uint64_t id = 0; id <= 4096; ++id) {
    const uint64_t header[2] = {id, 0};
    drive(stranger.answer(sep, header));
    ASSERT_FALSE(got.poll(ws)) << "a stranger's answer to id " << id << " ended the get";
  }
  drive(ucp_ep_flush_nbx(sep, &flush));  // everything sent has arrived
  for (int i = 0; i < 200; ++i) {
    stranger.progress();
    if (got.poll(ws)) break;
    ::usleep(500);
  }
  EXPECT_FALSE(got.poll(ws)) << "a stranger's answers ended the get";
  EXPECT_FALSE(ep->failed());
  EXPECT_EQ(local, std::vector<uint8_t>(4096, 0xEE));
  ep.reset();  // force-closed: the get fails, nothing is written
  EXPECT_EQ(got.wait(ws), std::vector<bool>{false});
  EXPECT_EQ(local, std::vector<uint8_t>(4096, 0xEE));
}

}  // namespace
}  // namespace kvtier
