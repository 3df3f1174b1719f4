// UCX workers in one process (two workers on one event loop, the way two daemons meet: the fetcher
// connects to the holder's listener, which accepts the connection with an endpoint of its own):
// gets read the peer's registered bytes; a get outside a region fails without being started; a
// closed endpoint fails at once; a deadline ends every get in flight.
#include "transport/ucx.h"

#include <gtest/gtest.h>
#include <kj/async-io.h>

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

}  // namespace
}  // namespace kvtier
