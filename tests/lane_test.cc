// The fast lane on the wire (transport/lane_codec.h), without the SDK: a lookup over it answers
// what the Cap'n Proto lookup answers, a put and its commit store what they store over Cap'n
// Proto; bad frames get a typed error or end the lane, never the session, and change nothing; an
// attach without the session's token, from another process or a second time is refused; the
// lane's leases, read and write, go when the lane does.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <capnp/rpc-twoparty.h>
#include <gtest/gtest.h>
#include <kj/async-io.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <type_traits>

#include "client/lane.h"
#include "schemas/kvtier.capnp.h"
#include "tests/raw_connection.h"
#include "tests/test_support.h"
#include "transport/lane_codec.h"
#include "transport/rpc_codec.h"

namespace kvtier {
namespace {

using lane::Header;

// One process's sessions over raw Cap'n Proto: each hello is a session of its own, with its own
// lane token; each opens the test layout's space.
class RawSession {
 public:
  explicit RawSession(const std::string& socket) : conn_(socket) { hello(); }

  // Starts another session on the same connection; the calls below are then the new session's
  // (the earlier ones stay open, with their sequences).
  void hello() {
    if (!token_.empty()) kept_.emplace_back(kj::mv(session_), kj::mv(space_));
    auto hello = conn_.daemon().helloRequest();
    hello.setProtocolVersion(rpc::PROTOCOL_VERSION);
    hello.setClientName("raw-lane");
    auto said = hello.send().wait(ws());
    session_ = said.getSession();
    auto token = said.getLaneToken();
    token_.assign(token.begin(), token.end());
    auto open = session_.openRequest();
    layoutToRpc(test::testLayout(), open.initLayout());
    auto opened = open.send().wait(ws());
    space_ = opened.getSpace();
    laneSpace_ = opened.getLane();
  }

  kj::WaitScope& ws() { return conn_.ws(); }
  const std::vector<uint8_t>& token() const { return token_; }
  uint32_t laneSpace() const { return laneSpace_; }

  struct Counts {
    uint64_t blocksUsed, readLeases, writeLeases, pinned, hits;
    bool operator==(const Counts&) const = default;
  };
  Counts counts() {
    auto response = session_.statsRequest().send().wait(ws());
    auto s = response.getStats();
    return {s.getBlocksUsed(), s.getReadLeases(), s.getWriteLeases(), s.getBlocksPinned(),
            s.getHits()};
  }
  uint64_t lanePuts() { return session_.statsRequest().send().wait(ws()).getStats().getLanePuts(); }
  // The sequence's length, or nothing when it does not exist.
  std::optional<uint64_t> length(const std::string& seq) {
    auto req = space_.lengthRequest();
    req.setSeq(seq);
    auto r = req.send().wait(ws());
    if (!r.getExists()) return std::nullopt;
    return r.getLength();
  }
  uint64_t lanesRefused() {
    return session_.statsRequest().send().wait(ws()).getStats().getLanesRefused();
  }

  // The Cap'n Proto lookup's answer, its lease released.
  std::pair<uint64_t, std::vector<BlockLocation>> lookup(const std::vector<uint32_t>& tokens) {
    auto req = space_.lookupRequest();
    auto list = req.initTokens(tokens.size());
    for (uint32_t i = 0; i < tokens.size(); ++i) list.set(i, tokens[i]);
    auto r = req.send().wait(ws());
    std::vector<BlockLocation> blocks;
    for (auto b : r.getBlocks()) blocks.push_back(blockFromRpc(b));
    r.getLease().releaseRequest().send().wait(ws());
    return {r.getMatchedTokens(), blocks};
  }

  // Puts and commits `tokens` as sequence `seq`.
  void put(const std::string& seq, const std::vector<uint32_t>& tokens) {
    auto req = space_.putRequest();
    req.setSeq(seq);
    auto list = req.initTokens(tokens.size());
    for (uint32_t i = 0; i < tokens.size(); ++i) list.set(i, tokens[i]);
    auto lease = req.send().wait(ws()).getLease();
    lease.commitRequest().send().wait(ws());
  }

 private:
  test::RawConnection conn_;
  rpc::Session::Client session_ = nullptr;
  rpc::Space::Client space_ = nullptr;
  std::vector<std::pair<rpc::Session::Client, rpc::Space::Client>> kept_;
  std::vector<uint8_t> token_;
  uint32_t laneSpace_ = 0;
};

// A lane connection driven by hand. Every wait has a deadline.
class RawLane {
 public:
  explicit RawLane(const std::string& socket) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket.c_str(), sizeof addr.sun_path - 1);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawLane() { ::close(fd_); }

  void send(const void* p, size_t n) {
    ASSERT_TRUE(connected_);
    ASSERT_EQ(::send(fd_, p, n, MSG_NOSIGNAL), static_cast<ssize_t>(n));
  }
  void send(const std::vector<uint8_t>& bytes) { send(bytes.data(), bytes.size()); }

  // Sends an Attach; true when the daemon accepts it, false when it closes the connection.
  bool attach(const std::vector<uint8_t>& token, uint32_t version = lane::kVersion) {
    lane::Attach a;
    a.version = version;
    std::memcpy(a.token, token.data(), std::min(token.size(), sizeof a.token));
    send(&a, sizeof a);
    uint32_t status = 1;
    return readExactly(&status, sizeof status) && status == 0;
  }

  // The next frame, or nothing once the daemon has closed the lane.
  std::optional<std::pair<Header, std::vector<uint8_t>>> frame() {
    Header h;
    if (!readExactly(&h, sizeof h)) return std::nullopt;
    std::vector<uint8_t> body(h.bodyBytes);
    if (!readExactly(body.data(), body.size())) return std::nullopt;
    return std::make_pair(h, std::move(body));
  }

  // Releases `leases` and waits until the daemon has served it (a sync with id `syncId`).
  bool release(std::vector<uint64_t> leases, uint64_t syncId) {
    std::vector<uint8_t> f;
    lane::appendRelease(f, leases);
    send(f);
    return sync(syncId);
  }

  // Sends a sync and waits for its answer: everything sent before has been served.
  bool sync(uint64_t id) {
    std::vector<uint8_t> f;
    lane::appendSync(f, id);
    send(f);
    auto answer = frame();
    return answer && answer->first.op == (lane::kSync | lane::kReply) && answer->first.id == id;
  }

  Result<lane::LookupReply> lookup(uint64_t id, uint32_t space, const std::vector<uint32_t>& tokens,
                                   uint32_t remote = 1) {
    std::vector<uint8_t> f;
    lane::appendLookup(f, id, space, remote, tokens, {});
    send(f);
    return answer(id);
  }
  Result<lane::LookupReply> answer(uint64_t id) {
    return answerOf(lane::kLookup, id, lane::decodeLookupReply);
  }

  Result<lane::PutReply> put(uint64_t id, const lane::PutArgs& args) {
    std::vector<uint8_t> f;
    lane::appendPut(f, id, args);
    send(f);
    return answerOf(lane::kPut, id, lane::decodePutReply);
  }
  Result<lane::CommitReply> commit(uint64_t id, uint64_t lease, uint64_t upTo = ~uint64_t{0}) {
    std::vector<uint8_t> f;
    lane::appendCommit(f, id, {lease, upTo, {}});
    send(f);
    return answerOf(lane::kCommit, id, lane::decodeCommitReply);
  }
  // Aborts `leases` and waits until the daemon has served it.
  bool abort(std::vector<uint64_t> leases, uint64_t syncId) {
    std::vector<uint8_t> f;
    lane::appendAbort(f, leases);
    send(f);
    return sync(syncId);
  }

  // The answer to request `id` of `op`: the daemon's reply or its typed error.
  template <typename Decode>
  auto answerOf(uint16_t op, uint64_t id, Decode decode)
      -> std::remove_cvref_t<decltype(decode(std::span<const uint8_t>{}).value())> {
    auto got = frame();
    if (!got) return makeError(ErrorCode::kUnavailable, "lane closed");
    EXPECT_EQ(got->first.op, op | lane::kReply);
    EXPECT_EQ(got->first.id, id);
    auto decoded = decode(got->second);
    if (!decoded) return decoded.error();
    return std::move(decoded).value();
  }

  int fd() const { return fd_; }

  // True once the daemon has closed the lane (within the deadline).
  bool closedByDaemon() {
    uint8_t byte;
    return !readExactly(&byte, 1);
  }

 private:
  bool readExactly(void* p, size_t n) {
    auto* out = static_cast<uint8_t*>(p);
    size_t got = 0;
    while (got < n) {
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, 10000) <= 0) {
        ADD_FAILURE() << "the daemon said nothing for 10 s";
        return false;
      }
      const ssize_t r = ::recv(fd_, out + got, n - got, 0);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
};

std::vector<uint32_t> promptTokens(uint32_t seed, uint32_t n) {
  std::vector<uint32_t> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = seed * 7919 + i;
  return t;
}

class LaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    raw = std::make_unique<RawSession>(daemon.socket());
    raw->put("s", prompt);
    before = raw->counts();
  }
  test::DaemonProcess daemon;
  // Held by pointer: capnp objects have throwing destructors, gtest fixtures may not.
  std::unique_ptr<RawSession> raw;
  const std::vector<uint32_t> prompt = promptTokens(1, 40);  // 2 full blocks, 8 tokens more
  RawSession::Counts before{};

  // The counts as they were, but for the lookups' hits.
  void expectUnchanged() {
    auto now = raw->counts();
    now.hits = before.hits;
    EXPECT_EQ(now, before);
  }
};

TEST_F(LaneTest, ALookupOverTheLaneAnswersWhatCapnProtoAnswers) {
  const auto [matched, blocks] = raw->lookup(prompt);
  ASSERT_EQ(matched, 32u);
  RawLane l(daemon.socket());
  ASSERT_TRUE(l.attach(raw->token()));
  auto reply = l.lookup(1, raw->laneSpace(), prompt);
  ASSERT_TRUE(reply.ok()) << reply.error();
  EXPECT_EQ(reply->matchedTokens, 32u);
  EXPECT_EQ(reply->blocks, blocks);
  EXPECT_NE(reply->lease, 0u);
  // The lane's lease pins the two blocks until released.
  ASSERT_TRUE(l.sync(2));
  EXPECT_EQ(raw->counts().readLeases, before.readLeases + 1);
  EXPECT_EQ(raw->counts().pinned, before.pinned + 2);
  // A miss grants no lease.
  auto miss = l.lookup(3, raw->laneSpace(), promptTokens(2, 40));
  ASSERT_TRUE(miss.ok());
  EXPECT_EQ(miss->matchedTokens, 0u);
  EXPECT_EQ(miss->lease, 0u);
  ASSERT_TRUE(l.release({reply->lease}, 4));
  // An empty release is served and changes nothing.
  ASSERT_TRUE(l.release({}, 5));
  expectUnchanged();
}

TEST_F(LaneTest, BadRequestsGetTypedErrorsAndChangeNothing) {
  RawLane l(daemon.socket());
  ASSERT_TRUE(l.attach(raw->token()));
  auto codeOf = [](const Result<lane::LookupReply>& r) {
    return r.ok() ? ErrorCode::kOk : r.error().code();
  };
  EXPECT_EQ(codeOf(l.lookup(1, 0, prompt)), ErrorCode::kInvalidArgument);   // no space 0
  EXPECT_EQ(codeOf(l.lookup(2, 99, prompt)), ErrorCode::kInvalidArgument);  // nor 99
  EXPECT_EQ(codeOf(l.lookup(3, raw->laneSpace(), prompt, 7)), ErrorCode::kInvalidArgument);
  // Counts that do not match the body's size, and counts past the limits.
  std::vector<uint8_t> f;
  lane::appendLookup(f, 4, raw->laneSpace(), 1, prompt, {});
  uint32_t tokens = 41;
  std::memcpy(f.data() + sizeof(Header) + 8, &tokens, 4);
  l.send(f);
  EXPECT_EQ(codeOf(l.answer(4)), ErrorCode::kInvalidArgument);
  tokens = static_cast<uint32_t>(kMaxTokensPerCall + 1);
  std::memcpy(f.data() + sizeof(Header) + 8, &tokens, 4);
  reinterpret_cast<Header*>(f.data())->id = 5;
  l.send(f);
  EXPECT_EQ(codeOf(l.answer(5)), ErrorCode::kInvalidArgument);
  // A release of a lease the lane does not hold (another's, or made up) releases nothing.
  const auto [matched, blocks] = raw->lookup(prompt);
  ASSERT_EQ(matched, 32u);
  std::vector<uint8_t> release;
  lane::appendRelease(release, std::vector<uint64_t>{1, 2, 3, 12345});
  l.send(release);
  // The lane goes on: a good lookup still works, and its release is served.
  auto good = l.lookup(6, raw->laneSpace(), prompt);
  ASSERT_TRUE(good.ok()) << good.error();
  EXPECT_EQ(good->matchedTokens, 32u);
  ASSERT_TRUE(l.release({good->lease}, 7));
  expectUnchanged();
}

TEST_F(LaneTest, BadFramingEndsTheLaneAndItsLeasesButNotTheSession) {
  auto badFrames = std::vector<Header>{
      {0, 9, 0, 1},                                              // unknown op
      {0, lane::kSync, 1, 1},                                    // flags
      {0, lane::kLookup | lane::kReply, 0, 1},                   // a reply, sent to the daemon
      {uint32_t(lane::kMaxBodyBytes) + 1, lane::kLookup, 0, 1},  // too large to read
  };
  for (const Header& bad : badFrames) {
    RawLane l(daemon.socket());
    // A fresh session for each lane: a session attaches one lane in its life. (The counts are
    // the daemon's, whichever session asks.)
    raw->hello();
    ASSERT_TRUE(l.attach(raw->token()));
    auto held = l.lookup(1, raw->laneSpace(), prompt);
    ASSERT_TRUE(held.ok()) << held.error();
    ASSERT_EQ(held->matchedTokens, 32u);
    EXPECT_EQ(raw->counts().readLeases, before.readLeases + 1);
    l.send(&bad, sizeof bad);
    EXPECT_TRUE(l.closedByDaemon()) << "op " << bad.op;
    // The lane's lease went with it; the session still answers over Cap'n Proto.
    EXPECT_EQ(raw->counts().readLeases, before.readLeases) << "op " << bad.op;
    EXPECT_EQ(raw->lookup(prompt).first, 32u);
  }
  expectUnchanged();
}

TEST_F(LaneTest, AttachIsRefusedWithoutTheTokenInAnotherVersionOrTwice) {
  const uint64_t refused = raw->lanesRefused();
  std::vector<uint8_t> wrong = raw->token();
  wrong[0] ^= 1;
  EXPECT_FALSE(RawLane(daemon.socket()).attach(wrong));
  EXPECT_FALSE(RawLane(daemon.socket()).attach(raw->token(), lane::kVersion + 1));
  RawLane first(daemon.socket());
  ASSERT_TRUE(first.attach(raw->token()));
  EXPECT_FALSE(RawLane(daemon.socket()).attach(raw->token()));
  EXPECT_EQ(raw->lanesRefused(), refused + 3);
  // The attached lane is untouched by the refusals.
  auto reply = first.lookup(1, raw->laneSpace(), prompt);
  ASSERT_TRUE(reply.ok()) << reply.error();
  EXPECT_EQ(reply->matchedTokens, 32u);
  ASSERT_TRUE(first.release({reply->lease}, 2));
  expectUnchanged();
}

TEST_F(LaneTest, AttachFromAnotherProcessIsRefused) {
  // A child that learned the token (fork) is not the session's process.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    RawLane l(daemon.socket());
    _exit(l.attach(raw->token()) ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the daemon accepted another process's attach";
  // The session's own process still can.
  RawLane l(daemon.socket());
  EXPECT_TRUE(l.attach(raw->token()));
}

TEST_F(LaneTest, APutOverTheLaneStoresWhatCapnProtoStores) {
  RawLane l(daemon.socket());
  ASSERT_TRUE(l.attach(raw->token()));
  const uint64_t lanePuts = raw->lanePuts();
  const auto tokens = promptTokens(3, 40);
  auto grant = l.put(1, {raw->laneSpace(), "lane-seq", 0, tokens, {}});
  ASSERT_TRUE(grant.ok()) << grant.error();
  EXPECT_NE(grant->lease, 0u);
  EXPECT_EQ(grant->firstPosition, 0u);
  ASSERT_EQ(grant->blocks.size(), 3u);  // 40 tokens: two full blocks and a partial one
  // Granted and not yet visible: the blocks are the lease's, the sequence does not exist.
  auto held = raw->counts();
  EXPECT_EQ(held.writeLeases, before.writeLeases + 1);
  EXPECT_EQ(held.blocksUsed, before.blocksUsed + 3);
  EXPECT_FALSE(raw->length("lane-seq").has_value());
  EXPECT_EQ(raw->lanePuts(), lanePuts + 1);

  auto done = l.commit(2, grant->lease);
  ASSERT_TRUE(done.ok()) << done.error();
  EXPECT_EQ(done->length, 40u);
  EXPECT_EQ(done->sealedBlocks, 2u);
  EXPECT_EQ(raw->length("lane-seq"), 40u);
  EXPECT_EQ(raw->counts().writeLeases, before.writeLeases);
  // Its full blocks are keyed like a Cap'n Proto put's: a lookup of the prompt finds them.
  EXPECT_EQ(raw->lookup(tokens).first, 32u);
  // The lease ended with its commit: a second commit is refused and changes nothing.
  auto again = l.commit(3, grant->lease);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), ErrorCode::kReleased);
  EXPECT_EQ(raw->length("lane-seq"), 40u);

  // An aborted put leaves no trace: no sequence, no blocks, no lease.
  const auto counts = raw->counts();
  auto aborted = l.put(4, {raw->laneSpace(), "lane-aborted", 0, promptTokens(4, 20), {}});
  ASSERT_TRUE(aborted.ok()) << aborted.error();
  EXPECT_EQ(raw->counts().writeLeases, counts.writeLeases + 1);
  ASSERT_TRUE(l.abort({aborted->lease}, 5));
  EXPECT_EQ(raw->counts(), counts);
  EXPECT_FALSE(raw->length("lane-aborted").has_value());
}

TEST_F(LaneTest, BadPutsAndCommitsGetTypedErrorsAndChangeNothing) {
  RawLane l(daemon.socket());
  ASSERT_TRUE(l.attach(raw->token()));
  const auto codeOf = [](const auto& r) { return r.ok() ? ErrorCode::kOk : r.error().code(); };
  const auto tokens = promptTokens(5, 40);
  EXPECT_EQ(codeOf(l.put(1, {0, "x", 0, tokens, {}})), ErrorCode::kInvalidArgument);
  EXPECT_EQ(codeOf(l.put(2, {99, "x", 0, tokens, {}})), ErrorCode::kInvalidArgument);
  // A put past the sequence's end, with window and chunk both set, or naming fewer keys than
  // the blocks it completes: the engine's own checks, answered over the lane.
  EXPECT_EQ(codeOf(l.put(3, {raw->laneSpace(), "s", 41, tokens, {}})), ErrorCode::kInvalidArgument);
  EXPECT_EQ(codeOf(l.put(4, {raw->laneSpace(), "x", 0, tokens, {}, false, 64, 64})),
            ErrorCode::kInvalidArgument);
  const std::vector<Key128> oneKey(1);
  EXPECT_EQ(codeOf(l.put(5, {raw->laneSpace(), "x", 0, tokens, oneKey})),
            ErrorCode::kInvalidArgument);
  // A name past the limit is refused before it is read.
  const std::string longName(kMaxSeqNameBytes + 1, 'n');
  std::vector<uint8_t> f;
  lane::appendPut(f, 6, {raw->laneSpace(), longName, 0, tokens, {}});
  l.send(f);
  EXPECT_EQ(codeOf(l.answerOf(lane::kPut, 6, lane::decodePutReply)), ErrorCode::kInvalidArgument);
  // Commits of leases the lane does not hold: made up, or another connection's.
  EXPECT_EQ(codeOf(l.commit(7, 12345)), ErrorCode::kReleased);
  EXPECT_EQ(codeOf(l.commit(8, 0)), ErrorCode::kReleased);
  // A commit past the grant leaves the lease open for another try.
  auto grant = l.put(9, {raw->laneSpace(), "x", 0, tokens, {}});
  ASSERT_TRUE(grant.ok()) << grant.error();
  EXPECT_EQ(codeOf(l.commit(10, grant->lease, 41)), ErrorCode::kInvalidArgument);
  EXPECT_EQ(raw->counts().writeLeases, before.writeLeases + 1);
  // Aborts of leases the lane does not hold end nothing; the real one then goes.
  std::vector<uint8_t> abort;
  lane::appendAbort(abort, std::vector<uint64_t>{grant->lease + 1, 12345});
  l.send(abort);
  ASSERT_TRUE(l.sync(11));
  EXPECT_EQ(raw->counts().writeLeases, before.writeLeases + 1);
  ASSERT_TRUE(l.abort({grant->lease}, 12));
  EXPECT_FALSE(raw->length("x").has_value());
  EXPECT_EQ(raw->length("s"), 40u);
  expectUnchanged();
}

TEST_F(LaneTest, WriteLeasesEndWithTheLane) {
  // However the lane ends — bad framing, or the client closing it — its open puts end too, and
  // their blocks go back to the pool. The session still answers.
  for (bool badFrame : {true, false}) {
    raw->hello();
    {
      RawLane l(daemon.socket());
      ASSERT_TRUE(l.attach(raw->token()));
      auto grant = l.put(1, {raw->laneSpace(), "open", 0, promptTokens(6, 40), {}});
      ASSERT_TRUE(grant.ok()) << grant.error();
      EXPECT_EQ(raw->counts().writeLeases, before.writeLeases + 1);
      if (badFrame) {
        const Header bad{0, 9, 0, 1};
        l.send(&bad, sizeof bad);
        EXPECT_TRUE(l.closedByDaemon());
      }
    }
    // The client's close reaches the daemon in its own time: wait for it, with a deadline.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (raw->counts().writeLeases != before.writeLeases &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    expectUnchanged();
    EXPECT_FALSE(raw->length("open").has_value());
  }
}

// A client that sends requests and never reads the answers: once the answers it has not taken
// reach the lane's bound, the daemon reads no more of its requests (its memory does not grow with
// them). When the client reads, every request is answered, in order, and the lane goes on.
TEST_F(LaneTest, AClientThatDoesNotReadStopsBeingRead) {
  RawLane l(daemon.socket());
  ASSERT_TRUE(l.attach(raw->token()));
  std::vector<uint8_t> chunk;  // 4,096 syncs: each a 16-byte frame answered by a 16-byte frame
  uint64_t next = 1;
  const auto refill = [&] {
    chunk.clear();
    for (int i = 0; i < 4096; ++i) lane::appendSync(chunk, next++);
  };
  refill();
  size_t offset = 0, sent = 0;
  constexpr size_t kGiveUp = 64 << 20;  // far past the bound and any socket buffer
  bool stalled = false;
  while (sent < kGiveUp) {
    const ssize_t n =
        ::send(l.fd(), chunk.data() + offset, chunk.size() - offset, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      offset += static_cast<size_t>(n);
      if (offset == chunk.size()) {
        refill();
        offset = 0;
      }
      continue;
    }
    ASSERT_TRUE(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) << std::strerror(errno);
    pollfd writable{l.fd(), POLLOUT, 0};
    if (::poll(&writable, 1, 2000) == 0) {
      stalled = true;  // nothing taken for 2 s: the daemon has stopped reading
      break;
    }
  }
  ASSERT_TRUE(stalled) << "the daemon read " << sent << " bytes of requests whose answers were "
                       << "never taken";
  // Bound + the sockets' buffers: requests and answers are the same size here.
  EXPECT_LT(sent, size_t{32} << 20);
  // Now the client reads: everything it sent is answered, in order (the rest of a frame it was
  // sending goes out as the daemon reads again).
  const uint64_t requests = (sent + 15) / 16;  // a frame begun counts: it is finished below
  uint64_t answered = 0;
  std::vector<uint8_t> in;
  while (answered < requests) {
    pollfd fds{l.fd(), static_cast<short>(POLLIN | (offset % 16 != 0 ? POLLOUT : 0)), 0};
    ASSERT_GT(::poll(&fds, 1, 10000), 0) << "answered " << answered << " of " << requests;
    if (fds.revents & POLLOUT) {
      const size_t rest = 16 - offset % 16;
      const ssize_t n = ::send(l.fd(), chunk.data() + offset, rest, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) offset += static_cast<size_t>(n);
    }
    if (fds.revents & POLLIN) {
      uint8_t buffer[1 << 16];
      const ssize_t n = ::recv(l.fd(), buffer, sizeof buffer, MSG_DONTWAIT);
      ASSERT_GT(n, 0) << "the daemon closed the lane";
      in.insert(in.end(), buffer, buffer + n);
      size_t at = 0;
      for (; at + sizeof(Header) <= in.size(); at += sizeof(Header)) {
        Header h;
        std::memcpy(&h, in.data() + at, sizeof h);
        ASSERT_EQ(h.op, lane::kSync | lane::kReply);
        ASSERT_EQ(h.id, answered + 1) << "answers out of order";
        ++answered;
      }
      in.erase(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(at));
    }
  }
  EXPECT_TRUE(l.sync(requests + 1000));
}

// The SDK's batch of puts (ClientLane::putMany) on a session of its own: an item whose bytes cannot
// be written is aborted, an item the engine refuses fails alone, the rest are committed; after
// sync() — what the SDK does before any Cap'n Proto call — the daemon has served the abort,
// although the last answer the batch read was to a request sent before it.
TEST_F(LaneTest, ABatchsAbortIsServedBeforeTheNextCapnProtoCall) {
  auto lane = ClientLane::attach(daemon.socket(), raw->token(), std::chrono::microseconds(50),
                                 std::chrono::seconds(5));
  ASSERT_TRUE(lane.ok()) << lane.error();
  const auto a = promptTokens(7, 40), b = promptTokens(8, 40), c = promptTokens(9, 40);
  const std::vector<lane::PutArgs> items = {
      {raw->laneSpace(), "written", 0, a, {}},
      {raw->laneSpace(), "unwritable", 0, b, {}},
      {raw->laneSpace(), "refused", 5, c, {}},  // past the end of a new sequence
  };
  std::vector<size_t> writes;
  auto results = (*lane)->putMany(
      items, [&](size_t i, const lane::PutReply& grant, std::vector<uint64_t>&) -> Status {
        writes.push_back(i);
        EXPECT_EQ(grant.blocks.size(), 3u);
        if (i == 1) return makeError(ErrorCode::kNotSupported, "cannot write item 1");
        return {};  // the test's blocks keep whatever bytes they had: only the leases matter here
      });
  ASSERT_TRUE(results.has_value());
  ASSERT_EQ(results->size(), 3u);
  ASSERT_TRUE((*results)[0].ok()) << (*results)[0].error();
  EXPECT_EQ((*results)[0]->length, 40u);
  EXPECT_EQ((*results)[1].code(), ErrorCode::kNotSupported);
  EXPECT_EQ((*results)[2].code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(writes, (std::vector<size_t>{0, 1}));
  (*lane)->sync();
  EXPECT_EQ(raw->counts().writeLeases, before.writeLeases);
  EXPECT_EQ(raw->length("written"), 40u);
  EXPECT_FALSE(raw->length("unwritable").has_value());
  EXPECT_FALSE(raw->length("refused").has_value());
}

}  // namespace
}  // namespace kvtier
