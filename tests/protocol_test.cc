// Bad input on every call, sent over raw Cap'n Proto (no SDK-side checks in the way): each gets
// a typed error and leaves the daemon's state unchanged.
#include <capnp/rpc-twoparty.h>
#include <gtest/gtest.h>
#include <kj/async-io.h>

#include "schemas/kvtier.capnp.h"
#include "store/limits.h"
#include "tests/raw_connection.h"
#include "tests/test_support.h"
#include "transport/rpc_codec.h"

namespace kvtier {
namespace {

class RawClient {
 public:
  explicit RawClient(const std::string& socket) : conn_(socket) {}

  kj::WaitScope& ws() { return conn_.ws(); }
  rpc::Daemon::Client& daemon() { return conn_.daemon(); }

  rpc::Session::Client hello() {
    auto req = daemon().helloRequest();
    req.setProtocolVersion(rpc::PROTOCOL_VERSION);
    req.setClientName("raw");
    return req.send().wait(ws()).getSession();
  }

  rpc::Space::Client open(rpc::Session::Client& session) {
    auto req = session.openRequest();
    layoutToRpc(test::testLayout(), req.initLayout());
    return req.send().wait(ws()).getSpace();
  }

  // The kvtier error code a request fails with (kOk if it succeeds).
  template <typename Request>
  ErrorCode errorOf(Request&& req) {
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] { req.send().wait(ws()); })) {
      return fromKjException(*e).code();
    }
    return ErrorCode::kOk;
  }

  struct Counts {
    uint64_t blocksUsed, sequences, readLeases, writeLeases, pinned;
    bool operator==(const Counts&) const = default;
  };
  Counts counts(rpc::Session::Client& session) {
    // The reader borrows from the response: keep the response alive while it is read.
    auto response = session.statsRequest().send().wait(ws());
    auto s = response.getStats();
    return {s.getBlocksUsed(), s.getSequences(), s.getReadLeases(), s.getWriteLeases(),
            s.getBlocksPinned()};
  }

 private:
  test::RawConnection conn_;
};

void setTokens(capnp::List<uint32_t>::Builder out, uint32_t seed) {
  for (uint32_t i = 0; i < out.size(); ++i) out.set(i, seed * 7919 + i);
}

// A daemon with a committed 40-token sequence "s" to aim bad calls at.
struct ProtocolFixture {
  ProtocolFixture() : raw(daemon.socket()), session(raw.hello()), space(raw.open(session)) {
    auto req = space.putRequest();
    req.setSeq("s");
    setTokens(req.initTokens(40), 1);
    auto lease = req.send().wait(raw.ws()).getLease();
    lease.commitRequest().send().wait(raw.ws());
    before = raw.counts(session);
  }
  test::DaemonProcess daemon;
  RawClient raw;
  rpc::Session::Client session;
  rpc::Space::Client space;
  RawClient::Counts before{};
};

class ProtocolTest : public ::testing::Test {
 protected:
  void expectUnchanged() { EXPECT_EQ(raw.counts(session), f->before); }

  // Held by pointer: capnp objects have throwing destructors, gtest fixtures may not.
  std::unique_ptr<ProtocolFixture> f = std::make_unique<ProtocolFixture>();
  RawClient& raw = f->raw;
  rpc::Session::Client& session = f->session;
  rpc::Space::Client& space = f->space;
};

TEST_F(ProtocolTest, HelloWithAnotherProtocolVersionIsRefused) {
  auto req = raw.daemon().helloRequest();
  req.setProtocolVersion(rpc::PROTOCOL_VERSION + 1);
  EXPECT_EQ(raw.errorOf(req), ErrorCode::kProtocolMismatch);
}

TEST_F(ProtocolTest, OpenWithBadLayoutIsInvalid) {
  auto badDtype = session.openRequest();
  layoutToRpc(test::testLayout(), badDtype.initLayout());
  badDtype.getLayout().setDtype(static_cast<rpc::DType>(99));
  EXPECT_EQ(raw.errorOf(badDtype), ErrorCode::kInvalidArgument);
  auto badBlock = session.openRequest();
  layoutToRpc(test::testLayout(), badBlock.initLayout());
  badBlock.getLayout().setBlockTokens(8);
  EXPECT_EQ(raw.errorOf(badBlock), ErrorCode::kInvalidArgument);
  auto noLayers = session.openRequest();
  layoutToRpc(test::testLayout(), noLayers.initLayout());
  noLayers.getLayout().setNumLayers(0);
  EXPECT_EQ(raw.errorOf(noLayers), ErrorCode::kInvalidArgument);
  auto huge = session.openRequest();  // a 1 GiB+ block fits no extent
  layoutToRpc(test::testLayout(), huge.initLayout());
  huge.getLayout().setNumLayers(1024);
  huge.getLayout().setNumKvHeads(64);
  EXPECT_EQ(raw.errorOf(huge), ErrorCode::kInvalidArgument);
  expectUnchanged();
}

TEST_F(ProtocolTest, PutWithBadArgumentsIsInvalidAndChangesNothing) {
  auto pastEnd = space.putRequest();
  pastEnd.setSeq("s");
  pastEnd.setBegin(41);
  setTokens(pastEnd.initTokens(4), 2);
  EXPECT_EQ(raw.errorOf(pastEnd), ErrorCode::kInvalidArgument);

  auto tooMany = space.putRequest();
  tooMany.setSeq("big");
  setTokens(tooMany.initTokens(kMaxTokensPerCall + 1), 3);
  EXPECT_EQ(raw.errorOf(tooMany), ErrorCode::kInvalidArgument);

  auto longName = space.putRequest();
  longName.setSeq(std::string(kMaxSeqNameBytes + 1, 'n'));
  setTokens(longName.initTokens(4), 4);
  EXPECT_EQ(raw.errorOf(longName), ErrorCode::kInvalidArgument);

  auto noName = space.putRequest();
  setTokens(noName.initTokens(4), 4);
  EXPECT_EQ(raw.errorOf(noName), ErrorCode::kInvalidArgument);

  auto noTokens = space.putRequest();
  noTokens.setSeq("t");
  EXPECT_EQ(raw.errorOf(noTokens), ErrorCode::kInvalidArgument);

  auto shortKey = space.putRequest();
  shortKey.setSeq("k");
  setTokens(shortKey.initTokens(16), 5);
  shortKey.initKeys(1).set(
      0, capnp::Data::Reader(reinterpret_cast<const uint8_t*>("fifteen bytes!!"), 15));
  EXPECT_EQ(raw.errorOf(shortKey), ErrorCode::kInvalidArgument);

  auto keyCount = space.putRequest();  // 32 tokens complete 2 blocks: 1 key is wrong
  keyCount.setSeq("k");
  setTokens(keyCount.initTokens(32), 5);
  keyCount.initKeys(1).set(
      0, capnp::Data::Reader(reinterpret_cast<const uint8_t*>("sixteen bytes!!!"), 16));
  EXPECT_EQ(raw.errorOf(keyCount), ErrorCode::kInvalidArgument);
  expectUnchanged();
}

TEST_F(ProtocolTest, SecondWriterOnASequenceConflicts) {
  auto first = space.putRequest();
  first.setSeq("w");
  setTokens(first.initTokens(8), 6);
  auto lease = first.send().wait(raw.ws()).getLease();
  auto second = space.putRequest();
  second.setSeq("w");
  setTokens(second.initTokens(8), 6);
  EXPECT_EQ(raw.errorOf(second), ErrorCode::kConflict);
  lease.abortRequest().send().wait(raw.ws());
  expectUnchanged();
}

TEST_F(ProtocolTest, WriteOutsideTheLeaseOrWithWrongSizeIsInvalid) {
  const Layout layout = test::testLayout();
  auto put = space.putRequest();
  put.setSeq("s");
  put.setBegin(40);  // block 2 holds positions 32..39 already: slots 0..7 are not ours to write
  setTokens(put.initTokens(8), 7);
  auto granted = put.send().wait(raw.ws());
  auto lease = granted.getLease();
  ASSERT_EQ(granted.getFirstPosition(), 32u);
  auto write = [&](uint32_t block, uint32_t firstSlot, uint32_t slots, size_t bytes) {
    auto req = lease.writeRequest();
    req.setBlock(block);
    req.setFirstSlot(firstSlot);
    req.setSlots(slots);
    req.initData(bytes);
    return raw.errorOf(req);
  };
  const size_t tb = layout.tokenKvBytes();
  EXPECT_EQ(write(0, 8, 8, 8 * tb), ErrorCode::kOk);
  EXPECT_EQ(write(0, 0, 8, 8 * tb), ErrorCode::kInvalidArgument);  // the sequence's existing slots
  EXPECT_EQ(write(1, 0, 1, tb), ErrorCode::kInvalidArgument);      // no such block
  EXPECT_EQ(write(0, 8, 9, 9 * tb), ErrorCode::kInvalidArgument);  // past the block and the grant
  EXPECT_EQ(write(0, 8, 8, 8 * tb - 1), ErrorCode::kInvalidArgument);  // wrong size
  EXPECT_EQ(write(0, 8, 0, 0), ErrorCode::kInvalidArgument);

  auto badCommit = lease.commitRequest();
  badCommit.setUpTo(49);
  EXPECT_EQ(raw.errorOf(badCommit), ErrorCode::kInvalidArgument);
  EXPECT_EQ(raw.counts(session).writeLeases, 1u);  // still open: a bad commit changes nothing
  auto commit = lease.commitRequest();
  commit.setUpTo(48);
  EXPECT_EQ(raw.errorOf(commit), ErrorCode::kOk);
  auto again = lease.commitRequest();
  again.setUpTo(48);
  EXPECT_EQ(raw.errorOf(again), ErrorCode::kReleased);
  EXPECT_EQ(raw.errorOf(lease.abortRequest()), ErrorCode::kReleased);
  auto w = lease.writeRequest();
  w.setSlots(1);
  w.initData(tb);
  EXPECT_EQ(raw.errorOf(w), ErrorCode::kReleased);
}

TEST_F(ProtocolTest, ReadsOfUnknownSequencesOrBadRangesAreTyped) {
  auto unknown = space.getRequest();
  unknown.setSeq("nope");
  unknown.setEnd(UINT64_MAX);
  EXPECT_EQ(raw.errorOf(unknown), ErrorCode::kNotFound);
  auto past = space.getRequest();
  past.setSeq("s");
  past.setEnd(41);
  EXPECT_EQ(raw.errorOf(past), ErrorCode::kInvalidArgument);
  auto inverted = space.getRequest();
  inverted.setSeq("s");
  inverted.setBegin(20);
  inverted.setEnd(10);
  EXPECT_EQ(raw.errorOf(inverted), ErrorCode::kInvalidArgument);
  auto both = space.lookupRequest();
  setTokens(both.initTokens(16), 1);
  both.initKeys(1).set(
      0, capnp::Data::Reader(reinterpret_cast<const uint8_t*>("sixteen bytes!!!"), 16));
  EXPECT_EQ(raw.errorOf(both), ErrorCode::kInvalidArgument);
  auto tooManyRefs = space.readRequest();
  tooManyRefs.initRefs(kMaxRefsPerRead + 1);
  EXPECT_EQ(raw.errorOf(tooManyRefs), ErrorCode::kInvalidArgument);
  auto badName = space.canResumeRequest();
  badName.setSeq(std::string(kMaxSeqNameBytes + 1, 'x'));
  EXPECT_EQ(raw.errorOf(badName), ErrorCode::kInvalidArgument);
  auto badRemove = space.removeRequest();
  badRemove.setSeq("s");
  badRemove.setBegin(10);
  badRemove.setEnd(5);
  EXPECT_EQ(raw.errorOf(badRemove), ErrorCode::kInvalidArgument);
  auto middle = space.removeRequest();
  middle.setSeq("s");
  middle.setBegin(10);
  middle.setEnd(20);
  EXPECT_EQ(raw.errorOf(middle), ErrorCode::kNotSupported);
  expectUnchanged();
}

TEST_F(ProtocolTest, ReleasedReadLeaseCannotBeReleasedAgain) {
  auto get = space.getRequest();
  get.setSeq("s");
  get.setEnd(UINT64_MAX);
  auto lease = get.send().wait(raw.ws()).getLease();
  EXPECT_EQ(raw.counts(session).pinned, 3u);
  EXPECT_EQ(raw.errorOf(lease.releaseRequest()), ErrorCode::kOk);
  EXPECT_EQ(raw.errorOf(lease.releaseRequest()), ErrorCode::kReleased);
  expectUnchanged();
}

TEST_F(ProtocolTest, ALookupWithAnUnknownRemoteModeIsInvalid) {
  auto lookup = space.lookupRequest();
  setTokens(lookup.initTokens(32), 1);
  lookup.setRemote(static_cast<rpc::RemoteMode>(7));
  EXPECT_EQ(raw.errorOf(lookup), ErrorCode::kInvalidArgument);
  expectUnchanged();
}

// A reference reads one KV block of the namespace. An entry's block is not one (its block may be
// smaller than the namespace's, and the read would return what lies after it), whichever size the
// reference gives.
TEST_F(ProtocolTest, AReferenceToAnEntryReadsNothing) {
  const uint8_t key[16] = {7};
  auto putEntry = space.putEntryRequest();
  putEntry.setKey(capnp::Data::Reader(key, 16));
  putEntry.setBytes(100);
  auto granted = putEntry.send().wait(raw.ws());
  const BlockLocation entry = blockFromRpc(granted.getBlock());
  ASSERT_LT(entry.bytes, test::testLayout().blockBytes()) << "an entry's block is smaller";
  granted.getLease().commitRequest().send().wait(raw.ws());
  for (const uint64_t bytes : {uint64_t{entry.bytes}, test::testLayout().blockBytes()}) {
    auto read = space.readRequest();
    BlockLocation asked = entry;
    asked.bytes = static_cast<uint32_t>(bytes);
    blockToRpc(asked, read.initRefs(1)[0]);
    EXPECT_EQ(raw.errorOf(read), ErrorCode::kInvalidArgument) << bytes << "-byte reference";
  }
  // A KV block's reference reads its block.
  auto get = space.getRequest();
  get.setSeq("s");
  get.setEnd(UINT64_MAX);
  auto got = get.send().wait(raw.ws());
  auto read = space.readRequest();
  read.initRefs(1).setWithCaveats(0, got.getBlocks()[0]);
  auto response = read.send().wait(raw.ws());  // the reader borrows from it
  ASSERT_EQ(response.getData().size(), 1u);
  EXPECT_EQ(response.getData()[0].size(), test::testLayout().blockBytes());
}

// The sequences a session creates go when the session and everything it handed out are gone: a
// client that drops its Session and goes on through a Space (or a write lease) leaves nothing.
TEST_F(ProtocolTest, ASessionsSequencesGoWithTheLastOfItsSpacesAndWriteLeases) {
  const uint64_t before = raw.counts(session).sequences;
  auto other = raw.hello();
  auto otherSpace = raw.open(other);
  other = nullptr;  // released: the Space goes on
  EXPECT_EQ(raw.counts(session).sequences, before);
  auto put = otherSpace.putRequest();
  put.setSeq("orphan");
  setTokens(put.initTokens(20), 5);
  put.send().wait(raw.ws()).getLease().commitRequest().send().wait(raw.ws());
  auto held = otherSpace.putRequest();
  held.setSeq("committed-later");
  setTokens(held.initTokens(20), 6);
  auto lease = held.send().wait(raw.ws()).getLease();
  otherSpace = nullptr;  // the write lease is all that is left of the session
  EXPECT_EQ(raw.counts(session).sequences, before + 1);
  lease.commitRequest().send().wait(raw.ws());
  EXPECT_EQ(raw.counts(session).sequences, before + 2);
  lease = nullptr;
  EXPECT_EQ(raw.counts(session).sequences, before) << "the session's sequences outlived it";
  EXPECT_EQ(raw.counts(session).writeLeases, 0u);
}

}  // namespace
}  // namespace kvtier
