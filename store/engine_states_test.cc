// Prefix states (Layout::stateBytes): a lookup in a namespace with states answers the deepest
// position whose state is cached together with the blocks before it, all under one read lease,
// never blocks without their state; states are found by content, deduplicated, evicted, spilled
// and promoted as blocks are.
#include <gtest/gtest.h>

#include <unordered_map>

#include "store/checksum.h"
#include "store/engine_test_util.h"

namespace kvtier {
namespace {

using namespace test_util;

constexpr uint32_t kBt = kTestBlockTokens;

class FakeColdTier final : public ColdDirectory {
 public:
  bool contains(uint64_t, const Salt&, const Key128& key) const override {
    return records.count(key) != 0;
  }
  std::unordered_map<Key128, std::vector<uint8_t>> records;
};

// A layout of attention layers and a recurrent state of 700 bytes (two chunks of the 512-byte
// blocks); or of recurrent layers only.
Layout hybridLayout() {
  Layout l = smallLayout("hybrid");
  l.stateBytes = 700;
  return l;
}
Layout recurrentLayout() {
  Layout l;
  l.modelId = "recurrent";
  l.blockTokens = kBt;
  l.stateBytes = 5000;
  return l;
}

// A state whose every byte says where it is from: `seed` and the byte's index.
std::vector<uint8_t> stateOf(uint32_t seed, size_t bytes) {
  std::vector<uint8_t> s(bytes);
  for (size_t i = 0; i < bytes; ++i) s[i] = static_cast<uint8_t>(seed * 131 + i * 7);
  return s;
}

class EngineStates : protected EngineHarness, public ::testing::Test {
 protected:
  void use(const Layout& layout, uint64_t blocks = 64) {
    layout_ = layout;
    makeEngine(blocks);
  }
  // Caches tokens' whole blocks (tag = token) through a sequence that is removed again.
  void cache(const std::vector<uint32_t>& tokens) {
    cacheTagged(*engine_, *mem_, space_, "writer", tokens, 0);
  }
  // Puts the state after tokens[0, n): the partial block's tags, then stateOf(seed).
  Result<CommitResult> putState(const std::vector<uint32_t>& tokens, size_t n, uint32_t seed,
                                bool withSums = true) {
    auto g = engine_->putState(space_, std::span(tokens).first(n), {});
    if (!g.ok()) return g.error();
    const uint32_t partial = layout_.hasKv() ? static_cast<uint32_t>(n % kBt) : 0;
    EXPECT_EQ(g->firstPosition, n);
    EXPECT_EQ(g->blocks.size(), layout_.stateChunks(partial));
    std::vector<uint8_t> payload(g->blocks.size() * layout_.chunkBytes(), 0);
    if (partial > 0) {
      for (uint32_t i = 0; i < partial; ++i) {
        writeTag(layout_, payload.data(), i, tokens[n - partial + i]);
      }
    }
    const auto state = stateOf(seed, layout_.stateBytes);
    std::copy(state.begin(), state.end(),
              payload.begin() + layout_.statePayloadBytes(partial) - layout_.stateBytes);
    std::vector<uint64_t> sums;
    for (size_t j = 0; j < g->blocks.size(); ++j) {
      const uint8_t* chunk = payload.data() + j * layout_.chunkBytes();
      std::memcpy(at(g->blocks[j]), chunk, layout_.chunkBytes());
      sums.push_back(blockChecksum(chunk, layout_.chunkBytes()));
    }
    return engine_->commit(g->lease, kEnd, withSums ? sums : std::vector<uint64_t>{});
  }
  // The chain key of block `block` of `tokens`.
  Key128 chainKey(const std::vector<uint32_t>& tokens, size_t block) {
    const SpaceInfo& info = engine_->space(space_);
    BlockKeyHasher hasher(info.fingerprint, info.salt);
    Key128 key;
    for (size_t i = 0; i <= block; ++i) {
      key = hasher.next(i == 0 ? nullptr : &key, std::span(tokens).subspan(i * kBt, kBt));
    }
    return key;
  }
  // What a client's lookup of `tokens` answers: the position, and whether the blocks and the
  // state it holds are exactly those written for it (`seed`); its lease released again.
  struct Answer {
    uint64_t position = 0;
    uint32_t seed = 0;
    bool whole = false;
  };
  Answer lookup(const std::vector<uint32_t>& tokens, std::optional<uint32_t> seed = {}) {
    auto r = engine_->lookup(kOwner, space_, tokens, {}, "", SeqOptions{});
    EXPECT_TRUE(r.ok()) << r.error();
    Answer a;
    if (!r.ok()) return a;
    a.position = r->matchedTokens;
    EXPECT_EQ(r->lease == 0, r->matchedTokens == 0);
    if (r->matchedTokens == 0) {
      EXPECT_EQ(r->stateBlocks, 0u);
      EXPECT_TRUE(r->blocks.empty());
      return a;
    }
    const uint32_t partial = layout_.hasKv() ? static_cast<uint32_t>(a.position % kBt) : 0;
    const size_t whole = layout_.hasKv() ? a.position / kBt : 0;
    a.whole = r->stateBlocks == layout_.stateChunks(partial) &&
              r->blocks.size() == whole + r->stateBlocks && r->sums.size() == r->blocks.size();
    // The blocks hold the tokens' tags; the partial block's first slots too.
    for (size_t b = 0; a.whole && b < whole; ++b) {
      for (uint32_t s = 0; s < kBt; ++s) {
        a.whole = a.whole && readTag(layout_, at(r->blocks[b]), s) == tokens[b * kBt + s];
      }
    }
    std::vector<uint8_t> payload;
    for (uint32_t j = 0; a.whole && j < r->stateBlocks; ++j) {
      const uint8_t* chunk = at(r->blocks[whole + j]);
      a.whole = blockChecksum(chunk, layout_.chunkBytes()) == r->sums[whole + j];
      payload.insert(payload.end(), chunk, chunk + layout_.chunkBytes());
    }
    for (uint32_t s = 0; a.whole && s < partial; ++s) {
      a.whole = readTag(layout_, payload.data(), s) == tokens[whole * kBt + s];
    }
    if (a.whole && seed) {
      const auto want = stateOf(*seed, layout_.stateBytes);
      a.whole =
          std::equal(want.begin(), want.end(),
                     payload.begin() + layout_.statePayloadBytes(partial) - layout_.stateBytes);
      a.seed = *seed;
    }
    EXPECT_TRUE(engine_->releaseRead(r->lease).ok());
    return a;
  }
};

TEST(StateLayout, AStateLayoutMayHaveNoKvAndIsNamedByItsState) {
  Layout none = recurrentLayout();
  EXPECT_TRUE(none.validate().ok());
  EXPECT_FALSE(none.hasKv());
  EXPECT_EQ(none.blockBytes(), 0u);
  EXPECT_EQ(none.chunkBytes(), 8192u);  // 5000 rounded up to 4 KiB
  EXPECT_EQ(none.stateChunks(0), 1u);
  Layout noState = none;
  noState.stateBytes = 0;
  EXPECT_EQ(noState.validate().code(), ErrorCode::kInvalidArgument);  // no KV and no state
  Layout hybrid = hybridLayout();
  EXPECT_EQ(hybrid.chunkBytes(), hybrid.blockBytes());
  EXPECT_EQ(hybrid.stateChunks(0), 2u);  // 700 bytes in 512-byte chunks
  EXPECT_EQ(hybrid.stateChunks(3), 3u);  // a block of partial KV first
  Layout plain = smallLayout("hybrid");
  EXPECT_NE(plain.fingerprint(), hybrid.fingerprint());
  Layout other = hybrid;
  other.stateBytes = 701;
  EXPECT_NE(other.fingerprint(), hybrid.fingerprint());
  Layout huge = hybrid;
  huge.stateBytes = kMaxStateBytes + 1;
  EXPECT_EQ(huge.validate().code(), ErrorCode::kInvalidArgument);
  huge.stateBytes = uint64_t{kMaxStateChunks + 1} * hybrid.blockBytes();  // too many chunks
  EXPECT_EQ(huge.validate().code(), ErrorCode::kInvalidArgument);
  Layout rope = none;
  rope.rope = RopeScheme{RopeStyle::kNeox, 4, 10000.0};
  EXPECT_EQ(rope.validate().code(), ErrorCode::kInvalidArgument);
}

TEST_F(EngineStates, BlocksWithoutTheirStateAreNeverAHit) {
  use(hybridLayout());
  const auto t = toks(4 * kBt, 100);
  cache(t);
  EXPECT_EQ(lookup(t).position, 0u);
  ASSERT_TRUE(putState(t, 2 * kBt, 7).ok());
  const Answer a = lookup(t, 7);
  EXPECT_EQ(a.position, 2 * kBt);
  EXPECT_TRUE(a.whole);
  // A binding lookup and a peer's pin are about blocks alone: all four.
  auto bound = engine_->lookup(kOwner, space_, t, {}, "bound", SeqOptions{});
  ASSERT_TRUE(bound.ok());
  EXPECT_EQ(bound->matchedTokens, 4 * kBt);
  EXPECT_EQ(bound->stateBlocks, 0u);
  ASSERT_TRUE(engine_->releaseRead(bound->lease).ok());
  auto peer = engine_->lookup(kOwner, space_, t, {}, "", {}, {}, 0, LookupFor::kPeer);
  ASSERT_TRUE(peer.ok());
  EXPECT_EQ(peer->blocks.size(), 4u);
  ASSERT_TRUE(engine_->releaseRead(peer->lease).ok());
}

TEST_F(EngineStates, TheDeepestStateWinsAndAStateInsideABlockBringsItsPartialKv) {
  use(hybridLayout());
  const auto t = toks(4 * kBt + 5, 100);
  cache(t);
  ASSERT_TRUE(putState(t, kBt, 1).ok());
  ASSERT_TRUE(putState(t, 3 * kBt, 3).ok());
  EXPECT_EQ(lookup(t, 3).position, 3 * kBt);
  EXPECT_TRUE(lookup(t, 3).whole);
  // The end of a turn inside block 3: deeper than the boundary before it.
  ASSERT_TRUE(putState(t, 3 * kBt + 9, 4).ok());
  Answer a = lookup(t, 4);
  EXPECT_EQ(a.position, 3 * kBt + 9);
  EXPECT_TRUE(a.whole);
  // A prompt that leaves that turn before its end (another token at 3B + 4) falls back.
  auto other = t;
  other[3 * kBt + 4] = 9999;
  EXPECT_EQ(lookup(other, 3).position, 3 * kBt);
  // A prompt shorter than the state's position cannot use it.
  EXPECT_EQ(lookup(head(t, 3 * kBt + 8), 3).position, 3 * kBt);
  // Another prompt sharing only the first block finds the state there.
  auto early = t;
  early[kBt + 1] = 12345;
  EXPECT_EQ(lookup(early, 1).position, kBt);
  EXPECT_TRUE(lookup(early, 1).whole);
}

TEST_F(EngineStates, AStateWhosePrefixLostABlockIsNotServed) {
  use(hybridLayout());
  const auto t = toks(4 * kBt, 100);
  cache(t);
  ASSERT_TRUE(putState(t, kBt, 1).ok());
  ASSERT_TRUE(putState(t, 4 * kBt, 4).ok());
  EXPECT_EQ(lookup(t).position, 4 * kBt);
  // Block 2 goes (dropped as a move to another node drops it).
  ASSERT_EQ(engine_->dropCached(space_, std::vector<Key128>{chainKey(t, 2)}), 1u);
  EXPECT_EQ(lookup(t, 1).position, kBt);
  EXPECT_TRUE(lookup(t, 1).whole);
}

TEST_F(EngineStates, AStateLosingAChunkIsNotServedAndTheRestFallsBack) {
  use(hybridLayout(), 12);
  const auto t = toks(2 * kBt, 100);
  cache(t);
  ASSERT_TRUE(putState(t, kBt, 1).ok());
  ASSERT_TRUE(putState(t, 2 * kBt, 2).ok());
  EXPECT_EQ(lookup(t).position, 2 * kBt);
  // Fill the pool with other prompts until something of t's goes: whatever remains is served
  // whole or not at all.
  for (uint32_t i = 0; i < 10; ++i) cache(toks(kBt, 10000 + 100 * i));
  const Answer a = lookup(t);
  EXPECT_TRUE(a.position == 0 || a.whole);
}

TEST_F(EngineStates, AStateIsStoredOnceAndCheckedAgainstItsWritersSums) {
  use(hybridLayout());
  const auto t = toks(2 * kBt, 100);
  cache(t);
  ASSERT_TRUE(putState(t, 2 * kBt, 5).ok());
  const uint64_t before = used();
  auto again = putState(t, 2 * kBt, 5);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->sealedBlocks, 0u);  // both chunks were cached: kept, nothing sealed
  EXPECT_EQ(used(), before);
  // Without sums the engine takes them from the bytes.
  ASSERT_TRUE(putState(t, kBt, 6, /*withSums=*/false).ok());
  auto shorter = head(t, kBt + 3);
  EXPECT_TRUE(lookup(shorter, 6).whole);
}

TEST_F(EngineStates, BadStatePutsChangeNothing) {
  use(hybridLayout());
  const auto t = toks(2 * kBt, 100);
  const uint64_t before = used();
  EXPECT_EQ(engine_->putState(space_, {}, {}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->putState(space_, t, std::vector<Key128>{keyOf(1)}).code(),
            ErrorCode::kInvalidArgument);  // tokens and keys
  // A commit with the wrong number of checksums is refused; the lease stays open to abort.
  auto g = engine_->putState(space_, t, {});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(engine_->commit(g->lease, kEnd, std::vector<uint64_t>{1}).code(),
            ErrorCode::kInvalidArgument);
  ASSERT_TRUE(engine_->abortWrite(g->lease).ok());
  EXPECT_EQ(used(), before);
  EXPECT_EQ(lookup(t).position, 0u);
  // A layout without a state takes none.
  use(smallLayout());
  EXPECT_EQ(engine_->putState(space_, t, {}).code(), ErrorCode::kInvalidArgument);
}

TEST_F(EngineStates, ALayoutWithoutKvKeepsStatesOnlyAndFindsThemByContent) {
  use(recurrentLayout());
  const auto t = toks(3 * kBt + 7, 100);
  // It holds no token positions.
  EXPECT_EQ(engine_->put(kOwner, space_, "s", 0, t, {}, {}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->lookup(kOwner, space_, t, {}, "bound", {}).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(lookup(t).position, 0u);
  ASSERT_TRUE(putState(t, 2 * kBt, 2).ok());
  ASSERT_TRUE(putState(t, 3 * kBt + 5, 3).ok());
  Answer a = lookup(t, 3);
  EXPECT_EQ(a.position, 3 * kBt + 5);
  EXPECT_TRUE(a.whole);
  auto other = t;
  other[2 * kBt + 1] = 777;  // leaves the second state's prefix
  a = lookup(other, 2);
  EXPECT_EQ(a.position, 2 * kBt);
  EXPECT_TRUE(a.whole);
  // Client keys name whole blocks: a state after them.
  const std::vector<Key128> keys{keyOf(1), keyOf(2)};
  auto g = engine_->putState(space_, {}, keys);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(engine_->commit(g->lease, kEnd).ok());
  auto r = engine_->lookup(kOwner, space_, {}, std::vector<Key128>{keyOf(1), keyOf(2), keyOf(3)},
                           "", {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->matchedTokens, 2 * kBt);
  EXPECT_EQ(r->stateBlocks, 1u);
  ASSERT_TRUE(engine_->releaseRead(r->lease).ok());
}

TEST_F(EngineStates, TheClusterFindsAStatesChunksByTheKeysItCanName) {
  // What a node that lacks a state asks the cluster about (its candidates, deepest first), and
  // what a holder pins for it: the chunks, named as a chain's continuation.
  use(hybridLayout());
  const auto t = toks(3 * kBt + 5, 100);
  cache(head(t, 2 * kBt));
  ASSERT_TRUE(putState(t, kBt, 1).ok());
  std::vector<Key128> chain;
  for (size_t b = 0; b < 3; ++b) chain.push_back(chainKey(t, b));
  // Held here: blocks 0 and 1, the state at 16. Candidates: inside block 2 (positions 47..33),
  // then the boundary at 32; nothing at or below the state held.
  auto candidates = engine_->stateCandidates(space_, t, {}, chain);
  ASSERT_EQ(candidates.size(), 16u);
  EXPECT_EQ(candidates.front().position, 2 * kBt + kBt - 1);
  EXPECT_EQ(candidates.back().position, 2 * kBt);
  // The state at 37 put here: its first chunk is the candidate the cluster would ask about.
  auto longer = head(t, 2 * kBt + 5);
  ASSERT_TRUE(putState(longer, longer.size(), 2).ok());
  const auto chunks = engine_->stateChunkKeys(space_, longer, {}, longer.size());
  ASSERT_EQ(chunks.size(), layout_.stateChunks(5));
  bool named = false;
  for (const auto& c : candidates) named = named || (c.position == 37 && c.firstChunk == chunks[0]);
  EXPECT_TRUE(named);
  // A peer's pin of those chunks (as a chain's continuation after the blocks) holds them.
  std::vector<Key128> pin(chain.begin(), chain.begin() + 2);
  pin.insert(pin.end(), chunks.begin(), chunks.end());
  auto peer = engine_->lookup(kOwner, space_, {}, pin, "", {}, {}, 0, LookupFor::kPeer);
  ASSERT_TRUE(peer.ok());
  EXPECT_EQ(peer->blocks.size(), pin.size());
  ASSERT_TRUE(engine_->releaseRead(peer->lease).ok());
  // In a layout without KV too (a peer's pin names the chunks alone).
  use(recurrentLayout());
  ASSERT_TRUE(putState(t, 2 * kBt, 3).ok());
  const auto only = engine_->stateChunkKeys(space_, t, {}, 2 * kBt);
  auto recurrentPin = engine_->lookup(kOwner, space_, {}, only, "", {}, {}, 0, LookupFor::kPeer);
  ASSERT_TRUE(recurrentPin.ok());
  EXPECT_EQ(recurrentPin->blocks.size(), only.size());
  ASSERT_TRUE(engine_->releaseRead(recurrentPin->lease).ok());
}

TEST_F(EngineStates, ATenantsStatesAreItsOwn) {
  use(hybridLayout());
  const auto t = toks(2 * kBt, 100);
  cache(t);
  ASSERT_TRUE(putState(t, 2 * kBt, 5).ok());
  auto other = engine_->openSpace(layout_, saltFor("tenant-b"));
  ASSERT_TRUE(other.ok());
  cacheTagged(*engine_, *mem_, *other, "w", t, 0);
  auto r = engine_->lookup(kOwner, *other, t, {}, "", {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->matchedTokens, 0u);
}

TEST_F(EngineStates, StatesSpillAndComeBackFromTheColdTierWithTheirBlocks) {
  use(hybridLayout(), 8);
  FakeColdTier cold;
  engine_->setColdDirectory(&cold);
  auto spillAll = [&] {
    auto items = engine_->takeSpillBatch(1000);
    for (const SpillItem& item : items) {
      const uint8_t* bytes = at(item.location);
      cold.records[item.key].assign(bytes, bytes + item.location.bytes);
    }
    engine_->finishSpill(items, true);
  };
  const auto t = toks(2 * kBt + 3, 100);
  cache(t);
  ASSERT_TRUE(putState(t, 2 * kBt + 3, 9).ok());  // two blocks + three chunks: 5 of 8
  spillAll();
  // Other prompts take the pool: everything of t is on disk only.
  for (uint32_t i = 0; i < 8; ++i) {
    cache(toks(kBt, 10000 + 100 * i));
    spillAll();
  }
  EXPECT_EQ(lookup(t).position, 0u);  // not in memory
  // The plan names the blocks and the state's chunks; promoting them brings the state back.
  // A binding lookup's plan (or a peer's) is about blocks alone: the two blocks.
  auto blocksOnly = engine_->lookupPlan(space_, t, {});
  ASSERT_TRUE(blocksOnly.ok());
  EXPECT_EQ(blocksOnly->size(), 2u);
  for (const auto& step : *blocksOnly) EXPECT_FALSE(step.state);
  auto plan = engine_->lookupPlan(space_, t, {}, /*withState=*/true);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->size(), 5u);
  size_t states = 0;
  for (const auto& step : *plan) states += step.state ? 1 : 0;
  EXPECT_EQ(states, 3u);
  std::vector<Key128> keys;
  for (const auto& step : *plan) keys.push_back(step.key);
  auto tickets = engine_->beginPromotes(space_, keys);
  ASSERT_TRUE(tickets.ok()) << tickets.error();
  for (const PromoteTicket& ticket : *tickets) {
    if (ticket.block == kNoBlock) continue;
    const auto& record = cold.records.at(ticket.key);
    std::memcpy(at(ticket.location), record.data(), record.size());
    engine_->finishPromote(ticket, true);
  }
  const Answer a = lookup(t, 9);
  EXPECT_EQ(a.position, 2 * kBt + 3);
  EXPECT_TRUE(a.whole);
}

}  // namespace
}  // namespace kvtier
