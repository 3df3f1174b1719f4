// The fast lane's frames: what one side encodes the other decodes exactly, and every body that
// does not parse exactly (short, long, counts that do not match, past the limits) is refused.
#include "transport/lane_codec.h"

#include <gtest/gtest.h>

#include <cstring>

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
  LookupReply reply{48, 9, {{1, 4096, 65536, 7}, {0, 0, 65536, 1}}};
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
  auto decoded = decodeRelease(bodyOf(frames, h));
  EXPECT_EQ(h.op, kRelease);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, leases);
  frames.clear();
  appendSync(frames, 11);
  EXPECT_TRUE(bodyOf(frames, h).empty());
  EXPECT_EQ(h.op, kSync);
  EXPECT_EQ(h.id, 11u);
}

TEST(LaneCodec, EveryTruncationOrExtensionIsRefused) {
  std::vector<uint8_t> lookup, reply, release;
  appendLookup(lookup, 1, 1, 0, std::vector<uint32_t>{1, 2, 3}, std::vector<Key128>{key(3)});
  appendLookupReply(reply, 1, {16, 1, {{0, 0, 4096, 1}}});
  appendRelease(release, std::vector<uint64_t>{5, 6});
  const auto body = [](const std::vector<uint8_t>& f) {
    return std::vector<uint8_t>(f.begin() + sizeof(Header), f.end());
  };
  for (const auto& [name, full] :
       {std::pair{"lookup", body(lookup)}, {"reply", body(reply)}, {"release", body(release)}}) {
    for (size_t n = 0; n <= full.size() + 8; ++n) {
      if (n == full.size()) continue;
      std::vector<uint8_t> b(full.begin(), full.begin() + std::min(n, full.size()));
      b.resize(n, 0);
      const std::string what = std::string(name) + " of " + std::to_string(n) + " bytes";
      const std::string kind = name;
      const bool parsed = kind == "lookup"  ? decodeLookup(b).ok()
                          : kind == "reply" ? decodeLookupReply(b).ok()
                                            : decodeRelease(b).ok();
      EXPECT_FALSE(parsed) << what;
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

  EXPECT_TRUE(checkHeader(Header{0, kSync, 0, 1}).ok());
  EXPECT_FALSE(checkHeader(Header{0, 9, 0, 1}).ok());      // unknown op
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
