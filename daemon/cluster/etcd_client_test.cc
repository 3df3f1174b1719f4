// EtcdClient and EtcdMembership against a real etcd (tests/etcd_process.h starts one per test on
// free loopback ports); the tests skip where /usr/bin/etcd is not installed. Waits are on events
// (the event loop runs until a condition holds) with a bounded deadline, never fixed sleeps.
#include "daemon/cluster/etcd_client.h"

#include <gtest/gtest.h>
#include <kj/async-io.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/cluster/etcd_membership.h"
#include "tests/etcd_process.h"
#include "transport/rpc_codec.h"

namespace kvtier::cluster {
namespace {

using test::EtcdProcess;

// Generous bound on any single wait: a healthy etcd on loopback answers in milliseconds.
constexpr kj::Duration kWaitLimit = 10 * kj::SECONDS;

// The event loop and helpers every test uses; holds KJ objects, so each test makes its own.
class Loop {
 public:
  kj::Timer& timer() { return io_.provider->getTimer(); }
  kj::Network& network() { return io_.provider->getNetwork(); }
  kj::WaitScope& waitScope() { return io_.waitScope; }

  template <typename T>
  T wait(kj::Promise<T> promise) {
    return timer().timeoutAfter(kWaitLimit, kj::mv(promise)).wait(io_.waitScope);
  }

  // The error a promise fails with (kOk if it succeeds).
  template <typename T>
  Error failureOf(kj::Promise<T> promise) {
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() { wait(kj::mv(promise)); })) {
      return fromKjException(*e);
    }
    return Error(ErrorCode::kOk, "succeeded");
  }

  // Runs the event loop until done() holds or limit passes; true if it held.
  template <typename F>
  bool runUntil(F done, kj::Duration limit = kWaitLimit) {
    const kj::TimePoint deadline = timer().now() + limit;
    while (!done()) {
      if (timer().now() >= deadline) return false;
      timer().afterDelay(5 * kj::MILLISECONDS).wait(io_.waitScope);
    }
    return true;
  }

 private:
  kj::AsyncIoContext io_ = kj::setupAsyncIo();
};

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdProcess::available()) {
      GTEST_SKIP() << test::kEtcdBinary << " is not installed (Debian package etcd-server)";
    }
    etcd_ = std::make_unique<EtcdProcess>();
    // Starting etcd blocked this thread for a while; let the loop read the clock, or the first
    // request's deadline would be counted from before the start.
    loop_.waitScope().poll();
  }

  std::unique_ptr<EtcdClient> client(kj::Duration timeout = 2 * kj::SECONDS) {
    return std::make_unique<EtcdClient>(loop_.network(), loop_.timer(),
                                        EtcdClientOptions{etcd_->endpoint(), timeout});
  }

  // KJ objects have throwing destructors, which a gtest fixture may not: the loop lives on the
  // heap. Declared before etcd_: etcd is stopped first, the loop destroyed last.
  std::unique_ptr<Loop> ownLoop_ = std::make_unique<Loop>();
  Loop& loop_ = *ownLoop_;
  std::unique_ptr<EtcdProcess> etcd_;
};

// ---------------------------------------------------------------------------------------------
// EtcdClient

TEST_F(EtcdTest, PutRangeAndLeaseRevoke) {
  auto c = client();
  const std::string binary("v\0\xff\n", 4);
  const int64_t first = loop_.wait(c->put("/t/a", "1"));
  loop_.wait(c->put("/t/b", binary));
  loop_.wait(c->put("/u/outside", "3"));

  EtcdRange range = loop_.wait(c->range("/t/"));
  ASSERT_EQ(range.kvs.size(), 2u);
  EXPECT_EQ(range.kvs[0].key, "/t/a");
  EXPECT_EQ(range.kvs[0].value, "1");
  EXPECT_EQ(range.kvs[1].key, "/t/b");
  EXPECT_EQ(range.kvs[1].value, binary);
  EXPECT_GT(range.revision, first);

  const int64_t lease = loop_.wait(c->grantLease(2));
  EXPECT_NE(lease, 0);
  loop_.wait(c->put("/t/leased", "x", lease));
  range = loop_.wait(c->range("/t/"));
  ASSERT_EQ(range.kvs.size(), 3u);
  EXPECT_EQ(range.kvs[2].lease, lease);
  EXPECT_GT(loop_.wait(c->keepAlive(lease)), 0);

  // Revoking shows what expiry does, without waiting for it: the key goes with the lease.
  loop_.wait(c->revoke(lease));
  range = loop_.wait(c->range("/t/"));
  ASSERT_EQ(range.kvs.size(), 2u);
  EXPECT_EQ(range.kvs[1].key, "/t/b");
  EXPECT_EQ(loop_.wait(c->keepAlive(lease)), 0);
  EXPECT_EQ(loop_.failureOf(c->revoke(lease)).code(), ErrorCode::kNotFound);

  EXPECT_EQ(loop_.wait(c->remove("/t/a")), 1);
  EXPECT_EQ(loop_.wait(c->remove("/t/a")), 0);
  EXPECT_EQ(loop_.wait(c->range("/t/")).kvs.size(), 1u);
  EXPECT_EQ(loop_.failureOf(c->grantLease(0)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(loop_.failureOf(c->put("", "x")).code(), ErrorCode::kInvalidArgument);
}

TEST_F(EtcdTest, WatchSeesPutAndDeleteAndFailsWhenEtcdStops) {
  auto c = client();
  const int64_t start = loop_.wait(c->range("/w/")).revision + 1;
  std::vector<EtcdEvent> seen;
  std::optional<Error> failed;
  auto watch = c->watch("/w/", start, [&](const std::vector<EtcdEvent>& events) {
                  seen.insert(seen.end(), events.begin(), events.end());
                }).eagerlyEvaluate([&](kj::Exception&& e) { failed = fromKjException(e); });
  loop_.wait(c->put("/w/k", "v"));
  loop_.wait(c->put("/elsewhere", "x"));
  loop_.wait(c->remove("/w/k"));

  ASSERT_TRUE(loop_.runUntil([&]() { return seen.size() >= 2 || failed; }));
  ASSERT_FALSE(failed) << failed->toString();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].type, EtcdEvent::Type::kPut);
  EXPECT_EQ(seen[0].key, "/w/k");
  EXPECT_EQ(seen[0].value, "v");
  EXPECT_EQ(seen[1].type, EtcdEvent::Type::kDelete);
  EXPECT_EQ(seen[1].key, "/w/k");
  EXPECT_GT(seen[1].modRevision, seen[0].modRevision);

  // The stream ends with etcd: the watch fails UNAVAILABLE instead of hanging.
  etcd_->stop();
  ASSERT_TRUE(loop_.runUntil([&]() { return failed.has_value(); }));
  EXPECT_EQ(failed->code(), ErrorCode::kUnavailable) << failed->toString();
}

// A server that accepts connections and answers each with `answer` (or never, when empty).
class FakeServer {
 public:
  FakeServer(Loop& loop, std::string answer) : answer_(std::move(answer)) {
    auto address = loop.network().parseAddress("127.0.0.1", 0).wait(loop.waitScope());
    listener_ = address->listen();
    port_ = listener_->getPort();
    task_ = acceptLoop().eagerlyEvaluate(nullptr);
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  kj::Promise<void> acceptLoop() {
    return listener_->accept().then([this](kj::Own<kj::AsyncIoStream> stream) {
      auto& s = *stream;
      if (answer_.empty()) {
        held_.push_back(kj::mv(stream));
      } else {
        held_.push_back(kj::mv(stream));
        writes_.push_back(s.write(answer_.data(), answer_.size()).eagerlyEvaluate(nullptr));
      }
      return acceptLoop();
    });
  }

  std::string answer_;
  kj::Own<kj::ConnectionReceiver> listener_;
  unsigned port_ = 0;
  std::vector<kj::Own<kj::AsyncIoStream>> held_;
  std::vector<kj::Promise<void>> writes_;
  kj::Promise<void> task_ = nullptr;
};

TEST(EtcdClientErrors, TypedErrorsForBadEndpointsAndAnswers) {
  Loop loop;
  auto call = [&](const std::string& endpoint) {
    EtcdClient c(loop.network(), loop.timer(), {endpoint, 300 * kj::MILLISECONDS});
    return loop.failureOf(c.range("/x/"));
  };
  EXPECT_EQ(call("https://127.0.0.1:2379").code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(call("http://127.0.0.1").code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(call("http://127.0.0.1:2379/v3").code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(EtcdClient::validateEndpoint("http://127.0.0.1:2379/").ok());

  // Nothing listens on a port the kernel handed out to a listener that is gone.
  auto deadAddress = loop.network().parseAddress("127.0.0.1", 0).wait(loop.waitScope());
  unsigned deadPort = 0;
  {
    auto listener = deadAddress->listen();
    deadPort = listener->getPort();
  }
  EXPECT_EQ(call("http://127.0.0.1:" + std::to_string(deadPort)).code(), ErrorCode::kUnavailable);

  FakeServer silent(loop, "");
  const Error timeout = call(silent.endpoint());
  EXPECT_EQ(timeout.code(), ErrorCode::kUnavailable) << timeout.toString();

  FakeServer garbage(loop, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
  const Error notJson = call(garbage.endpoint());
  EXPECT_EQ(notJson.code(), ErrorCode::kInternal) << notJson.toString();

  const size_t huge = kEtcdMaxResponseBytes + 1;
  FakeServer tooBig(loop, "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(huge) +
                              "\r\n\r\n" + std::string(huge, ' '));
  const Error bounded = call(tooBig.endpoint());
  EXPECT_EQ(bounded.code(), ErrorCode::kInternal) << bounded.toString();

  FakeServer unavailable(loop, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(call(unavailable.endpoint()).code(), ErrorCode::kUnavailable);
}

TEST(EtcdPrefix, RangeEndCoversThePrefix) {
  EXPECT_EQ(etcdPrefixEnd("/a/"), "/a0");
  EXPECT_EQ(etcdPrefixEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(etcdPrefixEnd(std::string("\xff", 1)), std::string(1, '\0'));
}

// ---------------------------------------------------------------------------------------------
// EtcdMembership

std::vector<std::string> idsOf(const std::vector<MemberRecord>& members) {
  std::vector<std::string> ids;
  for (const auto& m : members) ids.push_back(m.nodeId);
  return ids;
}

using Ids = std::vector<std::string>;

// One node: its membership, what onChange told it, and its running run().
struct Node {
  std::vector<std::vector<MemberRecord>> history;
  std::unique_ptr<EtcdMembership> membership;
  kj::Promise<void> running = nullptr;  // destroyed before membership

  Ids ids() const { return history.empty() ? Ids{} : idsOf(history.back()); }
  EtcdMembership::Stats stats() const { return membership->stats(); }
  void stop() { running = nullptr; }
};

EtcdMembershipOptions optionsFor(const std::string& endpoint, const std::string& id,
                                 int64_t ttl = 2) {
  EtcdMembershipOptions options;
  options.endpoint = endpoint;
  options.cluster = "c1";
  options.self = MemberRecord{id, "127.0.0.1:" + std::to_string(7000 + id[0]), "gpu"};
  options.leaseTtlSeconds = ttl;
  options.requestTimeout = 500 * kj::MILLISECONDS;
  options.retryDelay = 50 * kj::MILLISECONDS;
  return options;
}

class EtcdMembershipTest : public EtcdTest {
 protected:
  std::unique_ptr<Node> start(const std::string& id, int64_t ttl = 2) {
    return start(optionsFor(etcd_->endpoint(), id, ttl));
  }
  std::unique_ptr<Node> start(const EtcdMembershipOptions& options) {
    const std::string id = options.self.nodeId;
    auto node = std::make_unique<Node>();
    Node* raw = node.get();
    node->membership = std::make_unique<EtcdMembership>(
        loop_.network(), loop_.timer(), options,
        [raw](const std::vector<MemberRecord>& members) { raw->history.push_back(members); });
    node->running = node->membership->run().eagerlyEvaluate([id](kj::Exception&& e) {
      ADD_FAILURE() << "run() of " << id << " ended: " << e.getDescription().cStr();
    });
    return node;
  }
};

TEST_F(EtcdMembershipTest, MembersSeeEachOtherJoinAndLeave) {
  auto a = start("a");
  ASSERT_TRUE(loop_.runUntil([&]() { return a->ids() == Ids{"a"}; }));
  auto b = start("b");
  ASSERT_TRUE(loop_.runUntil([&]() {
    return a->ids() == Ids{"a", "b"} && b->ids() == Ids{"a", "b"};
  }));
  EXPECT_EQ(b->history.back()[0], optionsFor("", "a").self);  // a's address and capabilities
  EXPECT_TRUE(a->stats().connected);
  EXPECT_EQ(a->stats().registrations, 1u);

  // leave() revokes the lease: b sees a go at once, and a's run() does not register again.
  loop_.wait(a->membership->leave());
  ASSERT_TRUE(loop_.runUntil([&]() { return b->ids() == Ids{"b"}; }));
  const uint64_t keepAlives = b->stats().keepAlives;
  ASSERT_TRUE(loop_.runUntil([&]() { return b->stats().keepAlives >= keepAlives + 2; }));
  EXPECT_EQ(b->ids(), Ids{"b"});
  EXPECT_EQ(a->stats().registrations, 1u);
}

TEST_F(EtcdMembershipTest, CancelledRunLeavesWhenItsLeaseExpires) {
  auto a = start("a");
  auto b = start("b");
  ASSERT_TRUE(loop_.runUntil([&]() {
    return a->ids() == Ids{"a", "b"} && b->ids() == Ids{"a", "b"};
  }));

  a->stop();  // no more keepalives, no revoke: the 2 s lease has to expire
  const kj::TimePoint stopped = loop_.timer().now();
  // etcd checks for expired leases every half second and revokes them from its own loop, which a
  // loaded 2-core machine delays: a deadline of four TTLs (two ran out once, the machine busy).
  ASSERT_TRUE(loop_.runUntil([&]() { return b->ids() == Ids{"b"}; }, 8 * kj::SECONDS));
  EXPECT_GE(loop_.timer().now() - stopped, 1 * kj::SECONDS);  // it did wait for the TTL
}

TEST_F(EtcdMembershipTest, KeepsMembersWhileEtcdIsDownAndReRegistersAfter) {
  auto a = start("a");
  auto b = start("b");
  ASSERT_TRUE(loop_.runUntil([&]() {
    return a->ids() == Ids{"a", "b"} && b->ids() == Ids{"a", "b"};
  }));
  const size_t aChanges = a->history.size();
  const size_t bChanges = b->history.size();
  const uint64_t aErrors = a->stats().errors;
  const uint64_t bErrors = b->stats().errors;

  etcd_->stop();
  // Both notice, and each retries (and fails) at least once more while etcd is down.
  ASSERT_TRUE(loop_.runUntil([&]() {
    return !a->stats().connected && !b->stats().connected && a->stats().errors >= aErrors + 2 &&
           b->stats().errors >= bErrors + 2;
  }));
  EXPECT_EQ(a->history.size(), aChanges);  // no onChange at all, let alone a shrunken list
  EXPECT_EQ(b->history.size(), bChanges);
  EXPECT_EQ(idsOf(a->membership->members()), (Ids{"a", "b"}));

  etcd_->restart();
  ASSERT_TRUE(loop_.runUntil([&]() {
    return a->stats().connected && b->stats().connected && a->stats().registrations >= 2 &&
           b->stats().registrations >= 2;
  }));
  EXPECT_EQ(a->ids(), (Ids{"a", "b"}));
  EXPECT_EQ(b->ids(), (Ids{"a", "b"}));
  // etcd has both records again, under the new leases.
  auto c = client();
  EtcdRange range = loop_.wait(c->range("/kvtier/c1/nodes/"));
  ASSERT_EQ(range.kvs.size(), 2u);
  EXPECT_EQ(range.kvs[0].lease, a->membership->lease());
  EXPECT_EQ(range.kvs[1].lease, b->membership->lease());
  for (const auto* node : {a.get(), b.get()}) {
    for (size_t i = 1; i < node->history.size(); ++i) {
      EXPECT_GE(node->history[i].size(), node->history[i - 1].size()) << "list shrank";
    }
  }
}

TEST_F(EtcdMembershipTest, LostLeaseIsReplaced) {
  auto a = start("a");
  auto b = start("b");
  ASSERT_TRUE(loop_.runUntil([&]() {
    return a->ids() == Ids{"a", "b"} && b->ids() == Ids{"a", "b"};
  }));
  const int64_t oldLease = a->membership->lease();

  // As if a had been cut off past its TTL: the lease is gone, a's keepalive says so.
  auto c = client();
  loop_.wait(c->revoke(oldLease));
  ASSERT_TRUE(loop_.runUntil([&]() { return a->stats().registrations == 2; }));
  EXPECT_NE(a->membership->lease(), oldLease);
  ASSERT_TRUE(loop_.runUntil([&]() { return b->ids() == Ids{"a", "b"}; }));
  EXPECT_EQ(a->ids(), (Ids{"a", "b"}));
  EtcdRange range = loop_.wait(c->range(a->membership->selfKey()));
  ASSERT_EQ(range.kvs.size(), 1u);
  EXPECT_EQ(range.kvs[0].lease, a->membership->lease());
}

// A TCP proxy to etcd. freeze() stops moving bytes on the connections open at that moment without
// closing them, as a NAT or firewall that dropped them leaves them (half-open); connections made
// after it work.
class FreezingProxy {
 public:
  FreezingProxy(kj::Network& network, kj::WaitScope& ws, const std::string& etcdEndpoint)
      : network_(network), target_(etcdEndpoint.substr(etcdEndpoint.find("//") + 2)) {
    listener_ = network.parseAddress("127.0.0.1", 0).wait(ws)->listen();
    acceptNext();
  }
  std::string endpoint() {
    return "http://127.0.0.1:" + std::to_string(listener_->getPort());
  }
  void freeze() { ++epoch_; }

 private:
  struct Ignore : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&&) override {}
  };
  void acceptNext() {
    tasks_.add(listener_->accept().then([this](kj::Own<kj::AsyncIoStream> client) {
      acceptNext();
      const uint64_t born = epoch_;
      return network_.parseAddress(target_)
          .then([](kj::Own<kj::NetworkAddress> address) { return address->connect(); })
          .then([this, born, client = kj::mv(client)](kj::Own<kj::AsyncIoStream> server) mutable {
            auto both = kj::heapArrayBuilder<kj::Promise<void>>(2);
            both.add(pump(*client, *server, born));
            both.add(pump(*server, *client, born));
            return kj::joinPromises(both.finish()).attach(kj::mv(client), kj::mv(server));
          });
    }));
  }
  kj::Promise<void> pump(kj::AsyncIoStream& from, kj::AsyncIoStream& to, uint64_t born) {
    auto buffer = kj::heapArray<kj::byte>(16384);
    auto read = from.tryRead(buffer.begin(), 1, buffer.size());
    return read.then(
        [this, &from, &to, born, buffer = kj::mv(buffer)](size_t n) mutable -> kj::Promise<void> {
          if (epoch_ != born)
            return kj::NEVER_DONE;  // frozen: the bytes go nowhere, nothing closes
          if (n == 0) {
            to.shutdownWrite();
            return kj::READY_NOW;
          }
          auto write = to.write(buffer.begin(), n);
          return write.attach(kj::mv(buffer)).then([this, &from, &to, born] {
            return pump(from, to, born);
          });
        });
  }

  kj::Network& network_;
  std::string target_;
  kj::Own<kj::ConnectionReceiver> listener_;
  uint64_t epoch_ = 0;
  Ignore ignore_;
  kj::TaskSet tasks_{ignore_};
};

// The connection a member's watch runs on goes silent without closing, while its keepalives (each
// on a connection of its own) still succeed: the member still learns of a node that joins, when
// its watch is renewed.
TEST_F(EtcdMembershipTest, AWatchWhoseConnectionWentSilentIsRenewed) {
  FreezingProxy proxy(loop_.network(), loop_.waitScope(), etcd_->endpoint());
  auto options = optionsFor(proxy.endpoint(), "a");
  options.watchRenewal = 2 * kj::SECONDS;
  auto a = start(options);
  auto b = start("b");
  ASSERT_TRUE(loop_.runUntil([&]() {
    return a->ids() == Ids{"a", "b"} && b->ids() == Ids{"a", "b"};
  }));
  // a's watch is up (it has delivered an event: its connection exists) before the freeze; the
  // first read of the members comes before the watch, and does not show it.
  auto direct = client();
  const uint64_t events = a->stats().watchEvents;
  loop_.wait(direct->put("/kvtier/c1/nodes/x", encodeMemberValue({"x", "10.0.0.9:1", ""})));
  ASSERT_TRUE(loop_.runUntil([&]() { return a->stats().watchEvents > events; }));
  const uint64_t renewals = a->stats().watchRenewals;
  proxy.freeze();
  auto c = start("c");
  ASSERT_TRUE(loop_.runUntil([&]() { return b->ids() == Ids{"a", "b", "c", "x"}; }));
  ASSERT_TRUE(loop_.runUntil([&]() {
    return a->ids() == Ids{"a", "b", "c", "x"};
  })) << "a's silent watch was never renewed";
  EXPECT_GT(a->stats().watchRenewals, renewals);
  EXPECT_EQ(a->stats().errors, 0u) << "a's keepalives and reads went on";
  EXPECT_TRUE(a->stats().connected);
}

TEST_F(EtcdMembershipTest, MalformedRecordsAreSkipped) {
  auto c = client();
  const std::string prefix = "/kvtier/c1/nodes/";
  loop_.wait(c->put(prefix + "bad", "not json"));
  loop_.wait(c->put(prefix + "noaddress", R"({"capabilities":"x"})"));
  loop_.wait(c->put(prefix + "wrongtype", R"({"address":5})"));
  loop_.wait(c->put(prefix + "x/y", encodeMemberValue({"x/y", "10.0.0.9:1", ""})));
  loop_.wait(c->put(prefix + "good", encodeMemberValue({"good", "10.0.0.1:1", "c"})));

  auto a = start("a");
  ASSERT_TRUE(loop_.runUntil([&]() { return a->ids() == Ids{"a", "good"}; }));

  // The same through the watch: garbage over a good record removes it, garbage alone is ignored.
  const uint64_t events = a->stats().watchEvents;
  loop_.wait(c->put(prefix + "evil", "[1,2"));
  loop_.wait(c->put(prefix + "good", "garbage"));
  ASSERT_TRUE(loop_.runUntil([&]() { return a->stats().watchEvents >= events + 2; }));
  EXPECT_EQ(a->ids(), Ids{"a"});
  loop_.wait(c->put(prefix + "late", encodeMemberValue({"late", "10.0.0.2:1", ""})));
  ASSERT_TRUE(loop_.runUntil([&]() { return a->ids() == Ids{"a", "late"}; }));
  EXPECT_TRUE(a->stats().connected);
}

TEST(EtcdMembershipOptionsTest, InvalidOptionsAreRejected) {
  auto bad = [](auto change) {
    auto options = optionsFor("http://127.0.0.1:2379", "a");
    change(options);
    return EtcdMembership::validate(options).code();
  };
  EXPECT_EQ(bad([](auto&) {}), ErrorCode::kOk);
  EXPECT_EQ(bad([](auto& o) { o.cluster = ""; }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad([](auto& o) { o.cluster = "a/b"; }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad([](auto& o) { o.self.nodeId = std::string(kMaxEtcdNameBytes + 1, 'n'); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad([](auto& o) { o.self.nodeId = "x/y"; }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad([](auto& o) { o.self.address = ""; }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad([](auto& o) { o.leaseTtlSeconds = 0; }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad([](auto& o) { o.watchRenewal = 0 * kj::SECONDS; }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad([](auto& o) { o.endpoint = "127.0.0.1:2379"; }), ErrorCode::kInvalidArgument);

  Loop loop;
  auto options = optionsFor("http://127.0.0.1:2379", "a/b");
  EtcdMembership membership(loop.network(), loop.timer(), options, nullptr);
  EXPECT_EQ(loop.failureOf(membership.run()).code(), ErrorCode::kInvalidArgument);
}

TEST(EtcdMemberValueTest, RoundTripsAndRejectsGarbage) {
  const MemberRecord record{"n1", "10.1.2.3:7000", "gpu,\"quoted\""};
  auto decoded = decodeMemberValue("n1", encodeMemberValue(record));
  ASSERT_TRUE(decoded.ok()) << decoded.error();
  EXPECT_EQ(*decoded, record);
  EXPECT_FALSE(decodeMemberValue("n1", "").ok());
  EXPECT_FALSE(decodeMemberValue("n1", "{").ok());
  EXPECT_FALSE(decodeMemberValue("n1", R"({"address":""})").ok());
  EXPECT_FALSE(decodeMemberValue("n/1", R"({"address":"h:1"})").ok());
  EXPECT_TRUE(decodeMemberValue("n1", R"({"address":"h:1","future":1})").ok());
}

}  // namespace
}  // namespace kvtier::cluster
