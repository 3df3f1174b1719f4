// Verified reads through a real kvtierd: a block's bytes in the shared pool can change after its
// writer sealed it (a stray write by another process of the same user, a memory fault). Every
// read that copies a block out — copyTo, a host gather into an engine's paged cache, a check of a
// block read in place — checks it against its writer's checksum; a mismatch is a typed error,
// nothing of it is to be used, and the daemon, told, checks the block itself and drops it, so
// that the next lookup stops before it. Over the fast lane and over Cap'n Proto alike.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/block_sum.h"
#include "tests/test_support.h"
#include "tools/synthetic_kv.h"

namespace kvtier {
namespace {

using test::DaemonProcess;

std::vector<uint32_t> tokens(size_t n, uint32_t first) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

class VerifiedReads : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    auto c =
        Client::connect({.socketPath = daemon_.socket(), .clientName = "test", .lane = GetParam()});
    ASSERT_TRUE(c.ok()) << c.error();
    client_ = std::move(c).value();
    space_ = client_->open(test::testLayout()).value();
  }
  // Flips a byte in the middle of block i of the handle, in the pool.
  static void damage(const ReadHandle& hit, size_t i) {
    const auto view = hit.block(i);
    const_cast<uint8_t*>(view.data())[view.size() / 2] ^= 0x20;
  }
  uint64_t corrupt() { return client_->stats().value().blocksCorrupt; }

  DaemonProcess daemon_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Space> space_;
};

TEST_P(VerifiedReads, AChangedBlockFailsEveryReadOfItAndTheNextLookupStopsBeforeIt) {
  const Layout& l = space_->layout();
  const auto t = tokens(64, 1000);
  const auto kv = synthetic::packedKv(l, t, 0, 64);
  ASSERT_TRUE(space_->put("w", 0, t, kv.data(), kv.size()).ok());
  ASSERT_TRUE(space_->remove("w", 0).ok());
  std::vector<uint8_t> out(kv.size());
  {
    auto hit = space_->lookup(t).value();
    ASSERT_EQ(hit.blockCount(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_NE(hit.sum(i), 0u) << i;
    damage(hit, 2);
    EXPECT_TRUE(hit.verify(1).ok());
    EXPECT_EQ(hit.verify(2).code(), ErrorCode::kChecksumMismatch);
    // A copy that does not touch the block is good; one that does fails, naming where.
    ASSERT_TRUE(hit.copyTo(0, 32, out.data(), 32 * l.tokenKvBytes()).ok());
    EXPECT_EQ(
        0, std::memcmp(out.data(), synthetic::packedKv(l, t, 0, 32).data(), 32 * l.tokenKvBytes()));
    const Status bad = hit.copyTo(0, 64, out.data(), out.size());
    EXPECT_EQ(bad.code(), ErrorCode::kChecksumMismatch);
    EXPECT_NE(bad.error().message().find("positions from 32"), std::string::npos) << bad.error();
  }
  // Reported twice, counted once.
  EXPECT_EQ(corrupt(), 1u);
  {
    auto hit = space_->lookup(t).value();
    EXPECT_EQ(hit.matchedTokens(), 32u);
    std::vector<uint8_t> head(32 * l.tokenKvBytes());
    ASSERT_TRUE(hit.copyTo(0, 32, head.data(), head.size()).ok());
  }
  // Written again by anyone, the prefix is whole again, with the writer's bytes.
  ASSERT_TRUE(space_->put("w2", 0, t, kv.data(), kv.size()).ok());
  auto hit = space_->lookup(t).value();
  EXPECT_EQ(hit.matchedTokens(), 64u);
  ASSERT_TRUE(hit.copyTo(0, 64, out.data(), out.size()).ok());
  EXPECT_EQ(out, kv);
}

TEST_P(VerifiedReads, ASequencesOwnBlocksAndAHostGatherAreCheckedToo) {
  const Layout& l = space_->layout();
  const auto t = tokens(48, 5000);
  const auto kv = synthetic::packedKv(l, t, 0, 48);
  ASSERT_TRUE(space_->put("s", 0, t, kv.data(), kv.size()).ok());
  auto got = space_->get("s").value();
  damage(got, 0);
  std::vector<uint8_t> out(kv.size());
  EXPECT_EQ(got.copyTo(0, 48, out.data(), out.size()).code(), ErrorCode::kChecksumMismatch);
  // An engine's paged cache in host memory (blocks of 16 tokens, its blocks 3, 0, 1).
  const uint64_t tensorBytes = 4ull * 16 * l.tokenBytes();
  std::vector<std::vector<uint8_t>> tensors(2 * l.numLayers, std::vector<uint8_t>(tensorBytes));
  PagedKvCache cache;
  for (uint32_t i = 0; i < l.numLayers; ++i) {
    cache.keys.push_back(tensors[2 * i].data());
    cache.values.push_back(tensors[2 * i + 1].data());
  }
  const std::vector<int32_t> table = {3, 0, 1};
  EXPECT_EQ(space_->gatherTo(got, 0, 48, cache, table).code(), ErrorCode::kChecksumMismatch);
  EXPECT_TRUE(space_->gatherTo(got, 16, 48, cache, table).ok());
  got.release();
  EXPECT_EQ(corrupt(), 1u);
}

TEST_P(VerifiedReads, AReportOfIntactBytesDropsNothing) {
  // The daemon does not take a reader's word: a buggy or hostile client cannot evict others'
  // blocks by calling them corrupt.
  const auto t = tokens(32, 9000);
  const auto kv = synthetic::packedKv(space_->layout(), t, 0, 32);
  ASSERT_TRUE(space_->put("w", 0, t, kv.data(), kv.size()).ok());
  auto hit = space_->lookup(t).value();
  EXPECT_EQ(space_->reportCorrupt(hit.refs()), 0u);
  hit.release();
  EXPECT_EQ(corrupt(), 0u);
  EXPECT_EQ(space_->lookup(t).value().matchedTokens(), 32u);
}

// A writer that fills its blocks through their views may give each block's checksum, taken in its
// own copy (WriteHandle::blockWritten), instead of having the commit read the block back. The
// checksum is what readers check the bytes against: the right one serves them; a wrong one gets
// the block refused and dropped at its first read, never served.
TEST_P(VerifiedReads, AChecksumGivenForABlockWrittenThroughItsViewIsTheOneReadersCheck) {
  const Layout& l = space_->layout();
  const uint32_t bt = l.blockTokens;
  auto putThroughViews = [&](const std::vector<uint32_t>& t, bool wrongSecond) {
    auto h = space_->beginPut("v", 0, t);
    ASSERT_TRUE(h.ok()) << h.error();
    for (size_t b = 0; b < h->blockCount(); ++b) {
      const std::span<uint8_t> view = h->block(b);
      ASSERT_EQ(view.size(), l.blockBytes());
      // A block's bytes: layer by layer, K then V, slot by slot (Layout::slotOffset).
      const auto packed = synthetic::packedKv(l, t, b * bt, (b + 1) * bt);
      for (uint32_t lkv = 0; lkv < 2 * l.numLayers; ++lkv) {
        for (uint32_t slot = 0; slot < bt; ++slot) {
          std::memcpy(view.data() + l.slotOffset(lkv / 2, lkv % 2, slot),
                      packed.data() + (uint64_t{lkv} * bt + slot) * l.tokenBytes(), l.tokenBytes());
        }
      }
      uint64_t sum = kernels::blockChecksum(view.data(), view.size());
      if (wrongSecond && b == 1) sum ^= 1;
      ASSERT_TRUE(h->blockWritten(b, sum).ok());
    }
    EXPECT_EQ(h->blockWritten(h->blockCount(), 1).code(), ErrorCode::kInvalidArgument);
    ASSERT_TRUE(h->commit().ok());
  };
  const auto good = tokens(64, 20000), bad = tokens(64, 30000);
  putThroughViews(good, false);
  putThroughViews(bad, true);
  const auto kv = synthetic::packedKv(l, good, 0, 64);
  std::vector<uint8_t> out(kv.size());
  {
    auto hit = space_->lookup(good).value();
    EXPECT_EQ(hit.sum(2), kernels::blockChecksum(hit.block(2).data(), hit.block(2).size()));
    ASSERT_TRUE(hit.copyTo(0, 64, out.data(), out.size()).ok());
    EXPECT_EQ(out, kv);
  }
  {
    auto hit = space_->lookup(bad).value();
    ASSERT_EQ(hit.matchedTokens(), 64u);
    EXPECT_EQ(hit.copyTo(0, 64, out.data(), out.size()).code(), ErrorCode::kChecksumMismatch);
  }
  EXPECT_EQ(corrupt(), 1u);
  EXPECT_EQ(space_->lookup(bad).value().matchedTokens(), uint64_t{bt});
}

INSTANTIATE_TEST_SUITE_P(Lanes, VerifiedReads, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Lane" : "CapnProto"; });

}  // namespace
}  // namespace kvtier
