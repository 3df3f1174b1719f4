// Integrity from the writer: a block's checksum is taken once, when it is sealed — by its writer,
// or by the engine from the bytes when no writer sent one — and then travels with the block: to
// the cold tier (SpillItem), to peers (a peer's lookup), into snapshots, through tier moves and
// back from disk or another node. Nothing recomputes it from bytes that may have changed since.
#include <gtest/gtest.h>

#include "store/checksum.h"
#include "store/engine_test_util.h"

namespace kvtier {
namespace {

using namespace test_util;

class EngineChecksumTest : public ::testing::Test, protected EngineHarness {
 protected:
  void SetUp() override { makeEngine(16); }

  // Puts `tokens` as `seq` from 0 with tag = token and commits with `sums`.
  Result<CommitResult> putWith(std::string_view seq, const std::vector<uint32_t>& tokens,
                               std::vector<uint64_t> sums, uint64_t begin = 0) {
    auto g = engine_->put(kOwner, space_, seq, begin, tokens, {}, SeqOptions{});
    if (!g.ok()) return g.error();
    fill(*g, begin, tokens);
    return engine_->commit(g->lease, kEnd, sums);
  }

  // What a peer's pin of `tokens` is served with: each block's checksum (its lease released).
  std::vector<std::optional<uint64_t>> servedSums(const std::vector<uint32_t>& tokens) {
    auto r = engine_->lookup(kOwner, space_, tokens, {}, "", SeqOptions{}, {}, 0, LookupFor::kPeer);
    EXPECT_TRUE(r.ok());
    if (!r.ok()) return {};
    EXPECT_EQ(r->checksums.size(), r->blocks.size());
    if (r->lease != 0) {
      EXPECT_TRUE(engine_->releaseRead(r->lease).ok());
    }
    return r->checksums;
  }

  // The checksum of the bytes a client lookup of `tokens` finds in block `i`, now.
  uint64_t bytesSum(const std::vector<uint32_t>& tokens, size_t i) {
    auto r = engine_->lookup(kOwner, space_, tokens, {}, "", SeqOptions{});
    EXPECT_TRUE(r.ok() && r->blocks.size() > i);
    if (!r.ok() || r->blocks.size() <= i) return 0;
    const uint64_t sum = blockChecksum(at(r->blocks[i]), layout_.blockBytes());
    EXPECT_TRUE(engine_->releaseRead(r->lease).ok());
    return sum;
  }
};

TEST_F(EngineChecksumTest, TheWritersChecksumsAreKeptAndServedToPeersAndTheColdTier) {
  const auto t = toks(40, 100);  // two whole blocks and a partial one
  // Values no bytes would give: what is served is what the writer sent, not taken again.
  ASSERT_TRUE(putWith("s", t, {0x1111, 0x2222}).ok());
  EXPECT_EQ(servedSums(t), (std::vector<std::optional<uint64_t>>{0x1111, 0x2222}));
  // A client's lookup is not served with them (its reads are not moves).
  auto client = engine_->lookup(kOwner, space_, t, {}, "", SeqOptions{});
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE(client->checksums.empty());
  ASSERT_TRUE(engine_->releaseRead(client->lease).ok());
  // The cold tier writes the same checksums into the records.
  const auto spill = engine_->takeAllUnspilled();
  ASSERT_EQ(spill.size(), 2u);
  std::vector<uint64_t> spilled;
  for (const SpillItem& item : spill) spilled.push_back(item.checksum.value_or(0));
  std::sort(spilled.begin(), spilled.end());
  EXPECT_EQ(spilled, (std::vector<uint64_t>{0x1111, 0x2222}));
  engine_->finishSpill(spill, true);
}

TEST_F(EngineChecksumTest, ACommitWithTheWrongNumberOfChecksumsChangesNothing) {
  const auto t = toks(40, 100);
  auto g = engine_->put(kOwner, space_, "s", 0, t, {}, SeqOptions{});
  ASSERT_TRUE(g.ok());
  fill(*g, 0, t);
  for (const std::vector<uint64_t>& wrong :
       {std::vector<uint64_t>{1}, std::vector<uint64_t>{1, 2, 3}}) {
    auto c = engine_->commit(g->lease, kEnd, wrong);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(len("s"), std::nullopt);  // no sequence yet, and the lease is still open
  }
  ASSERT_TRUE(engine_->commit(g->lease, kEnd, std::vector<uint64_t>{7, 8}).ok());
  EXPECT_EQ(servedSums(t), (std::vector<std::optional<uint64_t>>{7, 8}));
}

TEST_F(EngineChecksumTest, ACommitEndingEarlyTakesTheFirstChecksums) {
  const auto t = toks(48, 100);  // the grant fills three blocks; the commit makes two visible
  auto g = engine_->put(kOwner, space_, "s", 0, t, {}, SeqOptions{});
  ASSERT_TRUE(g.ok());
  fill(*g, 0, t);
  ASSERT_TRUE(engine_->commit(g->lease, 32, std::vector<uint64_t>{7, 8, 9}).ok());
  EXPECT_EQ(servedSums(t), (std::vector<std::optional<uint64_t>>{7, 8}));
}

TEST_F(EngineChecksumTest, WithoutTheWritersChecksumsTheEngineTakesThemFromTheBytes) {
  const auto t = toks(32, 100);
  ASSERT_TRUE(putWith("s", t, {}).ok());
  EXPECT_EQ(servedSums(t), (std::vector<std::optional<uint64_t>>{bytesSum(t, 0), bytesSum(t, 1)}));
}

TEST_F(EngineChecksumTest, BytesChangedAfterTheSealDoNotChangeTheChecksumServed) {
  const auto t = toks(32, 100);
  ASSERT_TRUE(putWith("s", t, {}).ok());
  const uint64_t sealed = bytesSum(t, 1);
  // A stray write into the sealed block, before anyone has served it.
  auto r = engine_->lookup(kOwner, space_, t, {}, "", SeqOptions{});
  ASSERT_TRUE(r.ok());
  at(r->blocks[1])[3] ^= 0x40;
  ASSERT_TRUE(engine_->releaseRead(r->lease).ok());
  ASSERT_NE(bytesSum(t, 1), sealed);
  EXPECT_EQ(servedSums(t)[1], sealed);  // a fetcher's check of the changed bytes fails
}

TEST_F(EngineChecksumTest, ABlockCompletedByAnAppendCarriesTheChecksumOfItsWholeBytes) {
  const auto t = toks(16, 100);
  // The first 10 positions, then the last 6 appended in place: the append's commit seals it.
  ASSERT_TRUE(putWith("s", head(t, 10), {}).ok());
  EXPECT_TRUE(servedSums(t).empty());  // partial: not sealed, nothing to serve
  ASSERT_TRUE(putWith("s", {t.begin() + 10, t.end()}, {}, 10).ok());
  EXPECT_EQ(servedSums(t), (std::vector<std::optional<uint64_t>>{bytesSum(t, 0)}));
}

TEST_F(EngineChecksumTest, ADuplicateOfASealedBlockKeepsTheFirstWritersChecksum) {
  const auto t = toks(16, 100);
  ASSERT_TRUE(putWith("a", t, {0xaaaa}).ok());
  ASSERT_TRUE(putWith("b", t, {0xbbbb}).ok());  // the same prefix: shares the cached block
  EXPECT_EQ(servedSums(t), (std::vector<std::optional<uint64_t>>{0xaaaa}));
}

TEST_F(EngineChecksumTest, APromotedBlockKeepsTheChecksumItWasVerifiedAgainst) {
  const auto t = toks(16, 100);
  const Key128 key = engine_->chainKeys(space_, t, {}).value()[0];
  auto ticket = engine_->beginPromote(space_, key);
  ASSERT_TRUE(ticket.ok());
  writeTag(layout_, at(ticket->location), 0, 1);
  ticket->checksum = 0x5eed;  // the record's, which the reader checked the bytes against
  engine_->finishPromote(*ticket, true, /*remote=*/true);
  EXPECT_EQ(servedSums(t), (std::vector<std::optional<uint64_t>>{0x5eed}));
}

TEST_F(EngineChecksumTest, ASnapshotCarriesTheChecksumsOfItsSealedBlocksAndCheckpoints) {
  makeEngine(16, 4096);
  const auto t = toks(40, 100);
  ASSERT_TRUE(putWith("s", t, {0x1111, 0x2222}).ok());
  auto cp = engine_->putCheckpoint(space_, "s", 40, 100);
  ASSERT_TRUE(cp.ok()) << cp.error();
  std::memset(at(cp->block), 0x5a, 100);
  ASSERT_TRUE(engine_->commit(cp->lease, kEnd).ok());
  auto snap = engine_->snapshot(space_, "s", 0);
  ASSERT_TRUE(snap.ok());
  auto pin = engine_->pinSnapshot(space_, snap->id);
  ASSERT_TRUE(pin.ok());
  ASSERT_EQ(pin->parts.size(), 4u);  // three blocks, one checkpoint
  EXPECT_EQ(pin->parts[0].checksum, 0x1111u);
  EXPECT_EQ(pin->parts[1].checksum, 0x2222u);
  EXPECT_FALSE(pin->parts[2].checksum.has_value());  // partial: the move takes its own
  const std::vector<uint8_t> blob(100, 0x5a);
  EXPECT_EQ(pin->parts[3].checksum, blockChecksum(blob.data(), blob.size()));
  ASSERT_TRUE(engine_->releaseRead(pin->lease).ok());
}

TEST_F(EngineChecksumTest, ABlockReportedCorruptIsDroppedOnlyWhenItsBytesDisagree) {
  const auto t = toks(48, 300);  // three whole blocks, checksums taken by the engine
  ASSERT_TRUE(putWith("s", t, {}).ok());
  ASSERT_TRUE(engine_->remove(space_, "s", 0, kEnd).ok());
  const uint64_t used = engine_->stats().blocksUsed;
  auto r = engine_->lookup(kOwner, space_, t, {}, "", SeqOptions{});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->blocks.size(), 3u);
  // A client lookup carries each block's checksum, for the reader to check its copy with.
  ASSERT_EQ(r->sums.size(), 3u);
  EXPECT_EQ(r->sums[1], blockChecksum(at(r->blocks[1]), layout_.blockBytes()));
  // A reader's report is not taken on its word: intact bytes stay.
  const BlockLocation one[] = {r->blocks[1]};
  EXPECT_EQ(engine_->dropCorrupt(space_, one), 0u);
  EXPECT_EQ(engine_->stats().corruptBlocks, 0u);
  // A byte changes in the pool: the block leaves the index at once, and the pool when the
  // reader lets it go.
  at(r->blocks[1])[100] ^= 1;
  EXPECT_EQ(engine_->dropCorrupt(space_, one), 1u);
  EXPECT_EQ(engine_->dropCorrupt(space_, one), 0u);  // counted once
  EXPECT_EQ(engine_->stats().corruptBlocks, 1u);
  // References to nothing, of another generation or another space drop nothing.
  BlockLocation stale = r->blocks[0];
  ++stale.generation;
  const BlockLocation others[] = {stale,
                                  {0, 1u << 30, static_cast<uint32_t>(layout_.blockBytes()), 1}};
  EXPECT_EQ(engine_->dropCorrupt(space_, others), 0u);
  EXPECT_EQ(engine_->dropCorrupt(space_ + 1, std::span<const BlockLocation>(&r->blocks[0], 1)), 0u);
  ASSERT_TRUE(engine_->releaseRead(r->lease).ok());
  EXPECT_EQ(engine_->stats().blocksUsed, used - 1);
  // The next lookup stops before it; the prefix is whole again once someone writes it.
  auto after = engine_->lookup(kOwner, space_, t, {}, "", SeqOptions{});
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->blocks.size(), 1u);
  ASSERT_TRUE(engine_->releaseRead(after->lease).ok());
  ASSERT_TRUE(putWith("s", t, {}).ok());
  ASSERT_TRUE(engine_->remove(space_, "s", 0, kEnd).ok());
  auto again = engine_->lookup(kOwner, space_, t, {}, "", SeqOptions{});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->blocks.size(), 3u);
  EXPECT_EQ(readTag(layout_, at(again->blocks[1]), 0), std::optional<uint32_t>{316});
  ASSERT_TRUE(engine_->releaseRead(again->lease).ok());
}

TEST_F(EngineChecksumTest, ACorruptBlockASequenceHoldsLeavesTheIndexAndThePoolWhenItIsRemoved) {
  const auto t = toks(32, 700);
  ASSERT_TRUE(putWith("s", t, {}).ok());
  const uint64_t used = engine_->stats().blocksUsed;
  auto r = engine_->lookup(kOwner, space_, t, {}, "", SeqOptions{});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->blocks.size(), 2u);
  at(r->blocks[0])[7] ^= 0x80;
  EXPECT_EQ(engine_->dropCorrupt(space_, std::span<const BlockLocation>(&r->blocks[0], 1)), 1u);
  ASSERT_TRUE(engine_->releaseRead(r->lease).ok());
  EXPECT_EQ(engine_->stats().blocksUsed, used);  // the sequence still holds it
  auto miss = engine_->lookup(kOwner, space_, t, {}, "", SeqOptions{});
  ASSERT_TRUE(miss.ok());
  EXPECT_TRUE(miss->blocks.empty());
  // Removed, the damaged block is freed, never cached; its intact successor is cached.
  ASSERT_TRUE(engine_->remove(space_, "s", 0, kEnd).ok());
  EXPECT_EQ(engine_->stats().blocksUsed, used - 1);
  EXPECT_EQ(engine_->stats().blocksCached, 1u);
}

}  // namespace
}  // namespace kvtier
