// The fast lane's frames: what one side encodes the other decodes exactly, and every body that
// does not parse exactly (short, long, counts that do not match, past the limits) is refused.
#include "transport/lane_codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <tuple>

namespace kvtier::lane {
namespace {

// The body of the one frame in `frames` (after checking its header).
std::span<const uint8_t> bodyOf(const std::vector<uint8_t>& frames, Header& header) {
  EXPECT_GE(frames.size(), sizeof(Header));
  std::memcpy(&header, frames.data(), sizeof header);
  EXPECT_TRUE(checkHeader(header).ok());
  EXPECT_EQ(frames.size(), sizeof header + header.bodyBytes);
  return std::span(frames).subspan(sizeof header);
}

Key128 key(uint8_t seed) {
  Key128 k;
  for (size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<uint8_t>(seed * 31 + i);
  return k;
}

TEST(LaneCodec, LookupRoundTrips) {
  const std::vector<uint32_t> tokens = {1, 2, 3, 0xffffffff, 7};
  const std::vector<Key128> keys = {key(1), key(2)};
  std::vector<uint8_t> frames;
  appendLookup(frames, 42, 3, 2, tokens, keys);
  Header h;
  auto body = bodyOf(frames, h);
  EXPECT_EQ(h.op, kLookup);
  EXPECT_EQ(h.id, 42u);
  auto req = decodeLookup(body);
  ASSERT_TRUE(req.ok()) << req.error();
  EXPECT_EQ(req->space, 3u);
  EXPECT_EQ(req->remote, 2u);
  EXPECT_EQ(req->tokens, tokens);
  EXPECT_EQ(req->keys, keys);
}

TEST(LaneCodec, ReplyRoundTripsAndCarriesTypedErrors) {
  LookupReply reply{48, 9, {{1, 4096, 65536, 7}, {0, 0, 65536, 1}}, {0x1234, 0}};
  std::vector<uint8_t> frames;
  appendLookupReply(frames, 5, reply);
  Header h;
  auto decoded = decodeLookupReply(bodyOf(frames, h));
  EXPECT_EQ(h.op, kLookup | kReply);
  ASSERT_TRUE(decoded.ok());
  ASSERT_TRUE(decoded->ok());
  EXPECT_EQ((*decoded)->matchedTokens, 48u);
  EXPECT_EQ((*decoded)->lease, 9u);
  EXPECT_EQ((*decoded)->blocks, reply.blocks);
  EXPECT_EQ((*decoded)->sums, reply.sums);  // each block's writer's checksum (0: none)

  frames.clear();
  appendErrorReply(frames, kLookup, 6, makeError(ErrorCode::kNotFound, "no such thing"));
  auto error = decodeLookupReply(bodyOf(frames, h));
  ASSERT_TRUE(error.ok());
  ASSERT_FALSE(error->ok());
  EXPECT_EQ(error->error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(error->error().message(), "no such thing");
}

TEST(LaneCodec, ReleaseAndSyncRoundTrip) {
  const std::vector<uint64_t> leases = {1, 99, uint64_t{1} << 60};
  std::vector<uint8_t> frames;
  appendRelease(frames, leases);
  Header h;
  auto decoded = decodeLeases(bodyOf(frames, h));
  EXPECT_EQ(h.op, kRelease);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, leases);
  frames.clear();
  appendAbort(frames, leases);
  decoded = decodeLeases(bodyOf(frames, h));
  EXPECT_EQ(h.op, kAbort);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, leases);
  frames.clear();
  appendSync(frames, 11);
  EXPECT_TRUE(bodyOf(frames, h).empty());
  EXPECT_EQ(h.op, kSync);
  EXPECT_EQ(h.id, 11u);
}

TEST(LaneCodec, PutAndCommitRoundTrip) {
  const std::vector<uint32_t> tokens = {5, 6, 7, 8};
  const std::vector<Key128> keys = {key(9)};
  std::vector<uint8_t> frames;
  appendPut(frames, 77, {2, "seq-a", 64, tokens, keys, true, 4096, 0});
  Header h;
  auto put = decodePut(bodyOf(frames, h));
  EXPECT_EQ(h.op, kPut);
  EXPECT_EQ(h.id, 77u);
  ASSERT_TRUE(put.ok()) << put.error();
  EXPECT_EQ(put->space, 2u);
  EXPECT_EQ(put->seq, "seq-a");
  EXPECT_EQ(put->begin, 64u);
  EXPECT_EQ(put->tokens, tokens);
  EXPECT_EQ(put->keys, keys);
  EXPECT_TRUE(put->detached);
  EXPECT_EQ(put->window, 4096u);
  EXPECT_EQ(put->chunk, 0u);

  frames.clear();
  PutReply grant{48, 12, {{3, 8192, 65536, 2}}};
  appendPutReply(frames, 77, grant);
  auto granted = decodePutReply(bodyOf(frames, h));
  EXPECT_EQ(h.op, kPut | kReply);
  ASSERT_TRUE(granted.ok() && granted->ok());
  EXPECT_EQ((*granted)->firstPosition, 48u);
  EXPECT_EQ((*granted)->lease, 12u);
  EXPECT_EQ((*granted)->blocks, grant.blocks);

  frames.clear();
  appendCommit(frames, 78, {12, 100, {0x0123456789abcdefull, 7, 0}});
  auto commit = decodeCommit(bodyOf(frames, h));
  EXPECT_EQ(h.op, kCommit);
  ASSERT_TRUE(commit.ok());
  EXPECT_EQ(commit->lease, 12u);
  EXPECT_EQ(commit->upTo, 100u);
  EXPECT_EQ(commit->sums, (std::vector<uint64_t>{0x0123456789abcdefull, 7, 0}));

  frames.clear();
  appendCommit(frames, 80, {12, 100, {}});  // no checksums: the daemon takes them
  commit = decodeCommit(bodyOf(frames, h));
  ASSERT_TRUE(commit.ok());
  EXPECT_TRUE(commit->sums.empty());

  frames.clear();
  appendCommitReply(frames, 78, {68, 3});
  auto committed = decodeCommitReply(bodyOf(frames, h));
  EXPECT_EQ(h.op, kCommit | kReply);
  ASSERT_TRUE(committed.ok() && committed->ok());
  EXPECT_EQ((*committed)->length, 68u);
  EXPECT_EQ((*committed)->sealedBlocks, 3u);

  frames.clear();
  appendErrorReply(frames, kCommit, 79, makeError(ErrorCode::kConflict, "changed"));
  auto conflict = decodeCommitReply(bodyOf(frames, h));
  ASSERT_TRUE(conflict.ok());
  ASSERT_FALSE(conflict->ok());
  EXPECT_EQ(conflict->error().code(), ErrorCode::kConflict);
}

TEST(LaneCodec, EveryTruncationOrExtensionIsRefused) {
  std::vector<uint8_t> lookup, reply, release, put, putReply, commit, commitReply;
  appendLookup(lookup, 1, 1, 0, std::vector<uint32_t>{1, 2, 3}, std::vector<Key128>{key(3)});
  appendLookupReply(reply, 1, {16, 1, {{0, 0, 4096, 1}}, {0x1234}});
  appendRelease(release, std::vector<uint64_t>{5, 6});
  appendPut(put, 2, {1, "s", 0, std::vector<uint32_t>{1, 2}, std::vector<Key128>{key(4)}});
  appendPutReply(putReply, 2, {0, 3, {{0, 0, 4096, 1}}});
  appendCommit(commit, 3, {3, 2, {9, 10}});
  appendCommitReply(commitReply, 3, {2, 0});
  using Decode = std::function<bool(std::span<const uint8_t>)>;
  const std::vector<std::tuple<const char*, const std::vector<uint8_t>*, Decode>> cases = {
      {"lookup", &lookup, [](auto b) { return decodeLookup(b).ok(); }},
      {"reply", &reply, [](auto b) { return decodeLookupReply(b).ok(); }},
      {"release", &release, [](auto b) { return decodeLeases(b).ok(); }},
      {"put", &put, [](auto b) { return decodePut(b).ok(); }},
      {"put reply", &putReply, [](auto b) { return decodePutReply(b).ok(); }},
      {"commit", &commit, [](auto b) { return decodeCommit(b).ok(); }},
      {"commit reply", &commitReply, [](auto b) { return decodeCommitReply(b).ok(); }},
  };
  for (const auto& [name, frame, decode] : cases) {
    const std::vector<uint8_t> full(frame->begin() + sizeof(Header), frame->end());
    EXPECT_TRUE(decode(full)) << name << " as encoded";
    for (size_t n = 0; n <= full.size() + 8; ++n) {
      if (n == full.size()) continue;
      std::vector<uint8_t> b(full.begin(), full.begin() + std::min(n, full.size()));
      b.resize(n, 0);
      EXPECT_FALSE(decode(b)) << name << " of " << n << " bytes";
    }
  }
}

TEST(LaneCodec, LimitsAndHeadersAreChecked) {
  // Counts past the limits are refused before anything is allocated for them.
  std::vector<uint8_t> body(kLookupFixedBytes, 0);
  const uint32_t tooMany = static_cast<uint32_t>(kMaxTokensPerCall + 1);
  std::memcpy(body.data() + 8, &tooMany, 4);
  auto tokens = decodeLookup(body);
  ASSERT_FALSE(tokens.ok());
  EXPECT_EQ(tokens.error().code(), ErrorCode::kInvalidArgument);
  std::memset(body.data() + 8, 0, 4);
  const uint32_t tooManyKeys = static_cast<uint32_t>(kMaxBlocksPerLease + 1);
  std::memcpy(body.data() + 12, &tooManyKeys, 4);
  EXPECT_FALSE(decodeLookup(body).ok());

  // A put's name, tokens and keys likewise; unknown put flags are refused.
  std::vector<uint8_t> put;
  appendPut(put, 1, {1, "s", 0, {}, {}});
  std::vector<uint8_t> putBody(put.begin() + sizeof(Header), put.end());
  ASSERT_EQ(putBody.size(), kPutFixedBytes + 1);
  const auto putWith = [&](size_t at, uint32_t value) {
    std::vector<uint8_t> b = putBody;
    std::memcpy(b.data() + at, &value, 4);
    return decodePut(b);
  };
  EXPECT_TRUE(putWith(4, 1).ok());  // detached
  EXPECT_FALSE(putWith(4, 2).ok());
  EXPECT_FALSE(putWith(44, 1).ok());  // padding
  for (auto [at, value] : {std::pair<size_t, uint32_t>{32, uint32_t(kMaxSeqNameBytes + 1)},
                           {36, uint32_t(kMaxTokensPerCall + 1)},
                           {40, uint32_t(kMaxBlocksPerLease + 1)}}) {
    auto r = putWith(at, value);
    ASSERT_FALSE(r.ok()) << at;
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(r.error().message().find("malformed"), std::string::npos) << r.error().message();
  }

  EXPECT_TRUE(checkHeader(Header{0, kSync, 0, 1}).ok());
  EXPECT_TRUE(checkHeader(Header{0, kAbort, 0, 1}).ok());
  EXPECT_FALSE(checkHeader(Header{0, 7, 0, 1}).ok());  // unknown op
  EXPECT_FALSE(checkHeader(Header{0, 0, 0, 1}).ok());
  EXPECT_FALSE(checkHeader(Header{0, kSync, 1, 1}).ok());  // flags
  EXPECT_FALSE(checkHeader(Header{uint32_t(kMaxBodyBytes) + 1, kLookup, 0, 1}).ok());
  // A reply's error code this build does not know reads as INTERNAL, not as a stray value.
  std::vector<uint8_t> frames;
  appendErrorReply(frames, kLookup, 1, makeError(ErrorCode::kFull, "x"));
  uint32_t unknown = 999;
  std::memcpy(frames.data() + sizeof(Header), &unknown, 4);
  auto decoded = decodeLookupReply(std::span(frames).subspan(sizeof(Header)));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->error().code(), ErrorCode::kInternal);
}

}  // namespace
}  // namespace kvtier::lane
