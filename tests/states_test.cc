// Prefix states through a real kvtierd (Layout::stateBytes; docs/cache-shapes.md): what a client
// of a recurrent or hybrid model relies on. A lookup answers a position with its state and every
// block before it, or nothing; the state read back is the writer's, checked; bad states are
// refused with a typed error and change nothing; a writer that goes away leaks nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "tests/test_support.h"
#include "tools/synthetic_kv.h"

namespace kvtier {
namespace {

using test::DaemonProcess;

// testLayout() (16-token blocks of 16 KiB) with a state of 40,000 bytes: three chunks.
Layout hybrid() {
  Layout l = test::testLayout();
  l.modelId = "test/hybrid";
  l.stateBytes = 40000;
  return l;
}

std::vector<uint32_t> tokens(size_t n, uint32_t first) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<uint8_t> stateOf(uint8_t seed, size_t bytes) {
  std::vector<uint8_t> s(bytes);
  for (size_t i = 0; i < bytes; ++i) s[i] = static_cast<uint8_t>(seed + i * 13);
  return s;
}

class States : public ::testing::Test {
 protected:
  void SetUp() override {
    client_ = daemon_.connect();
    space_ = client_->open(hybrid()).value();
  }
  // Puts tokens[0, n)'s whole blocks through a sequence that is removed again.
  void putBlocks(const std::vector<uint32_t>& t) {
    const Layout& l = space_->layout();
    const size_t whole = t.size() / l.blockTokens * l.blockTokens;
    std::vector<uint32_t> head(t.begin(), t.begin() + whole);
    auto kv = synthetic::packedKv(l, head, 0, whole);
    ASSERT_TRUE(space_->put("w", 0, head, kv.data(), kv.size()).ok());
    ASSERT_TRUE(space_->remove("w", 0).ok());
  }
  Stats stats() { return client_->stats().value(); }

  DaemonProcess daemon_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Space> space_;
};

TEST_F(States, ALookupAnswersThePositionOfAStateWithItsBlocksAndTheStateReadsBack) {
  const Layout& l = space_->layout();
  const auto t = tokens(70, 1000);
  putBlocks(t);
  // Blocks alone: nothing to restore from.
  EXPECT_EQ(space_->lookup(t).value().matchedTokens(), 0u);
  const auto s32 = stateOf(1, l.stateBytes);
  ASSERT_TRUE(space_->putState(std::span(t).first(32), s32.data(), s32.size()).ok());
  // A turn's end inside block 4, with the KV of its 5 positions past block 3.
  const std::vector<uint32_t> head(t.begin(), t.begin() + 53);
  auto partialKv = synthetic::packedKv(l, head, 48, 53);
  const auto s53 = stateOf(2, l.stateBytes);
  ASSERT_TRUE(
      space_->putState(head, s53.data(), s53.size(), partialKv.data(), partialKv.size()).ok());
  auto hit = space_->lookup(t).value();
  EXPECT_EQ(hit.matchedTokens(), 53u);
  ASSERT_TRUE(hit.hasState());
  EXPECT_EQ(hit.partialTokens(), 5u);
  EXPECT_EQ(hit.blockCount(), 4u);  // three whole blocks and the state's first chunk
  std::vector<uint8_t> got(l.stateBytes);
  ASSERT_TRUE(hit.copyState(got.data(), got.size()).ok());
  EXPECT_EQ(got, s53);
  // The positions of the partial block read back as any others.
  std::vector<uint8_t> kv(5 * l.tokenKvBytes());
  ASSERT_TRUE(hit.copyTo(48, 53, kv.data(), kv.size()).ok());
  EXPECT_EQ(kv, partialKv);
  // A prompt that leaves the turn inside the block falls back to the state at 32.
  auto other = t;
  other[50] = 7;
  auto back = space_->lookup(other).value();
  EXPECT_EQ(back.matchedTokens(), 32u);
  ASSERT_TRUE(back.copyState(got.data(), got.size()).ok());
  EXPECT_EQ(got, s32);
}

TEST_F(States, BadStatesAreRefusedWithTypedErrorsAndChangeNothing) {
  const Layout& l = space_->layout();
  const auto t = tokens(48, 1);
  putBlocks(t);
  const uint64_t used = stats().blocksUsed;
  const auto wrong = stateOf(1, l.stateBytes - 1);
  EXPECT_EQ(space_->putState(t, wrong.data(), wrong.size()).code(), ErrorCode::kInvalidArgument);
  const auto state = stateOf(1, l.stateBytes);
  EXPECT_EQ(space_->putState({}, state.data(), state.size()).code(), ErrorCode::kInvalidArgument);
  // A position inside a block without the KV of its partial positions, or with the wrong size.
  EXPECT_EQ(space_->putState(std::span(t).first(40), state.data(), state.size()).code(),
            ErrorCode::kInvalidArgument);
  std::vector<uint8_t> shortKv(3 * l.tokenKvBytes());
  EXPECT_EQ(space_
                ->putState(std::span(t).first(40), state.data(), state.size(), shortKv.data(),
                           shortKv.size())
                .code(),
            ErrorCode::kInvalidArgument);
  // A layout without a state takes none.
  auto plain = client_->open(test::testLayout()).value();
  EXPECT_EQ(plain->putState(t, state.data(), state.size()).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(stats().blocksUsed, used);
  EXPECT_EQ(space_->lookup(t).value().matchedTokens(), 0u);
  // A state of another layout (another size) is another namespace: never seen here.
  Layout otherLayout = hybrid();
  otherLayout.stateBytes = 30000;
  auto other = client_->open(otherLayout).value();
  const auto s2 = stateOf(3, otherLayout.stateBytes);
  auto kv = synthetic::packedKv(otherLayout, t, 0, 48);
  ASSERT_TRUE(other->put("w", 0, t, kv.data(), kv.size()).ok());
  ASSERT_TRUE(other->putState(t, s2.data(), s2.size()).ok());
  EXPECT_EQ(other->lookup(t).value().matchedTokens(), 48u);
  EXPECT_EQ(space_->lookup(t).value().matchedTokens(), 0u);
  // The daemon checks what reaches it too: a commit with a wrong count of chunk checksums.
  auto w = space_->beginPutState(t).value();
  EXPECT_EQ(w.blockCount(), 3u);
  EXPECT_EQ(w.writeState(3 * l.chunkBytes(), state.data(), 1).code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(w.abort().ok());
  EXPECT_EQ(space_->lookup(t).value().matchedTokens(), 0u);
}

TEST_F(States, AStateChangedInThePoolIsRefusedWhenReadNeverHandedOut) {
  const Layout& l = space_->layout();
  const auto t = tokens(32, 500);
  putBlocks(t);
  const auto state = stateOf(9, l.stateBytes);
  ASSERT_TRUE(space_->putState(t, state.data(), state.size()).ok());
  {
    // A stray write by another process of the same user: one byte in the state's last chunk.
    auto hit = space_->lookup(t).value();
    ASSERT_TRUE(hit.hasState());
    const auto chunk = hit.stateBlock(hit.stateBlockCount() - 1);
    const_cast<uint8_t*>(chunk.data())[100] ^= 1;
  }
  auto hit = space_->lookup(t).value();
  std::vector<uint8_t> got(l.stateBytes, 0);
  EXPECT_EQ(hit.copyState(got.data(), got.size()).code(), ErrorCode::kChecksumMismatch);
}

TEST_F(States, AClientThatCannotMapThePoolStoresAndReadsStatesInline) {
  const Layout& l = space_->layout();
  auto inlineClient = daemon_.connect(/*mapPool=*/false);
  ASSERT_FALSE(inlineClient->mapped());
  auto space = inlineClient->open(hybrid()).value();
  const auto t = tokens(40, 77);
  auto kv = synthetic::packedKv(l, t, 0, 40);
  ASSERT_TRUE(space->put("w", 0, t, kv.data(), kv.size()).ok());
  const auto state = stateOf(5, l.stateBytes);
  const auto partial = synthetic::packedKv(l, t, 32, 40);
  ASSERT_TRUE(space->putState(t, state.data(), state.size(), partial.data(), partial.size()).ok());
  auto hit = space->lookup(t).value();
  EXPECT_EQ(hit.matchedTokens(), 40u);
  std::vector<uint8_t> got(l.stateBytes);
  ASSERT_TRUE(hit.copyState(got.data(), got.size()).ok());
  EXPECT_EQ(got, state);
  std::vector<uint8_t> back(40 * l.tokenKvBytes());
  ASSERT_TRUE(hit.copyTo(0, 40, back.data(), back.size()).ok());
  EXPECT_EQ(back, kv);
  // A mapping client reads the same.
  auto mapped = space_->lookup(t).value();
  ASSERT_TRUE(mapped.copyState(got.data(), got.size()).ok());
  EXPECT_EQ(got, state);
}

TEST_F(States, AWriterThatGoesAwayMidStateLeaksNothing) {
  const auto t = tokens(32, 9);
  {
    auto gone = daemon_.connect();
    auto space = gone->open(hybrid()).value();
    auto w = space->beginPutState(t).value();
    EXPECT_EQ(stats().writeLeases, 1u);
    // The client closes with the lease open.
  }
  Stats s = test::waitForStats(*client_, [](const Stats& s) {
    return s.clients == 1 && s.writeLeases == 0 && s.blocksPinned == 0;
  });
  EXPECT_EQ(s.writeLeases, 0u);
  EXPECT_EQ(s.blocksPinned, 0u);
  EXPECT_EQ(s.blocksUsed, 0u);
}

TEST_F(States, ALayoutWithoutKvKeepsStatesAlone) {
  Layout none;
  none.modelId = "test/recurrent";
  none.blockTokens = 16;
  none.stateBytes = 100000;  // one chunk of 100 KiB
  auto space = client_->open(none).value();
  const auto t = tokens(50, 3);
  const auto a = stateOf(1, none.stateBytes), b = stateOf(2, none.stateBytes);
  ASSERT_TRUE(space->putState(std::span(t).first(32), a.data(), a.size()).ok());
  ASSERT_TRUE(space->putState(std::span(t).first(45), b.data(), b.size()).ok());
  // It holds no sequence of positions.
  std::vector<uint8_t> kv;
  EXPECT_EQ(space->put("s", 0, t, kv.data(), 0).code(), ErrorCode::kInvalidArgument);
  auto hit = space->lookup(t).value();
  EXPECT_EQ(hit.matchedTokens(), 45u);
  EXPECT_EQ(hit.blockCount(), 0u);
  EXPECT_EQ(hit.partialTokens(), 0u);
  EXPECT_TRUE(hit.copyTo(0, 45, nullptr, 0).ok());  // no KV: nothing to copy, nothing read
  std::vector<uint8_t> got(none.stateBytes);
  ASSERT_TRUE(hit.copyState(got.data(), got.size()).ok());
  EXPECT_EQ(got, b);
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

TEST(StatesColdTier, ABindingLookupMatchesTheBlocksAloneNeverAStatesChunk) {
  // With the cold tier on every lookup is planned first (blocks on disk come back): the plan of
  // a lookup that binds a sequence holds the blocks, not the state that follows them.
  test::DaemonProcess daemon(64 << 20, "", {"--cold-tier", "on"});
  auto client = daemon.connect();
  auto space = client->open(hybrid()).value();
  const auto t = tokens(64, 40);
  const Layout& l = space->layout();
  auto kv = synthetic::packedKv(l, std::span(t).first(32), 0, 32);
  ASSERT_TRUE(space->put("w", 0, std::span(t).first(32), kv.data(), kv.size()).ok());
  const auto state = stateOf(4, l.stateBytes);
  ASSERT_TRUE(space->putState(std::span(t).first(32), state.data(), state.size()).ok());
  LookupOptions bind;
  bind.bindSeq = "bound";
  auto held = space->lookup(t, bind).value();
  EXPECT_EQ(held.matchedTokens(), 32u);
  EXPECT_FALSE(held.hasState());
  EXPECT_EQ(space->length("bound").value(), std::optional<uint64_t>(32));
  // And a plain lookup answers the state there.
  auto hit = space->lookup(t).value();
  EXPECT_EQ(hit.matchedTokens(), 32u);
  EXPECT_TRUE(hit.hasState());
}

}  // namespace
}  // namespace kvtier
