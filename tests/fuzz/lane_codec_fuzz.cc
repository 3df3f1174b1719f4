// Fuzz harness: the fast lane's codec (transport/lane_codec.h), in process: the bodies a daemon
// decodes from its clients (lookup, put, commit, release/abort) and the replies a client decodes
// from its daemon, and the frame header both sides check.
//
// Input: its first byte picks the decoder, the rest is the body (or a 16-byte header, then a
// body). A body that decodes must encode back (append*) to one that decodes to the same values:
// what the decoders accept is what the encoders write. A difference aborts (a finding).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "transport/lane_codec.h"

namespace kvtier::lane {
namespace {

[[noreturn]] void differs(const char* what) {
  std::fprintf(stderr, "kvtier fuzz: a decoded %s does not round-trip\n", what);
  std::abort();
}

// The body of the one frame append* wrote into `frame`.
std::span<const uint8_t> bodyOf(const std::vector<uint8_t>& frame) {
  Header h;
  if (frame.size() < sizeof h) differs("frame (too short)");
  std::memcpy(&h, frame.data(), sizeof h);
  if (frame.size() != sizeof h + h.bodyBytes || !checkHeader(h)) differs("frame (bad header)");
  return std::span(frame).subspan(sizeof h);
}

bool same(const LookupReply& a, const LookupReply& b) {
  return a.matchedTokens == b.matchedTokens && a.lease == b.lease && a.blocks == b.blocks &&
         a.sums == b.sums;
}

bool same(const PutReply& a, const PutReply& b) {
  return a.firstPosition == b.firstPosition && a.lease == b.lease && a.blocks == b.blocks;
}

void lookupRequest(std::span<const uint8_t> body) {
  auto r = decodeLookup(body);
  if (!r) return;
  std::vector<uint8_t> frame;
  appendLookup(frame, 1, r->space, r->remote, r->tokens, r->keys);
  auto again = decodeLookup(bodyOf(frame));
  if (!again || again->space != r->space || again->remote != r->remote ||
      again->tokens != r->tokens || again->keys != r->keys) {
    differs("lookup");
  }
}

void putRequest(std::span<const uint8_t> body) {
  auto r = decodePut(body);
  if (!r) return;
  std::vector<uint8_t> frame;
  const PutArgs args{r->space, r->seq,      r->begin,  r->tokens,
                     r->keys,  r->detached, r->window, r->chunk};
  appendPut(frame, 1, args);
  auto again = decodePut(bodyOf(frame));
  if (!again || again->space != r->space || again->seq != r->seq || again->begin != r->begin ||
      again->tokens != r->tokens || again->keys != r->keys || again->detached != r->detached ||
      again->window != r->window || again->chunk != r->chunk) {
    differs("put");
  }
}

void commitRequest(std::span<const uint8_t> body) {
  auto r = decodeCommit(body);
  if (!r) return;
  std::vector<uint8_t> frame;
  appendCommit(frame, 1, *r);
  auto again = decodeCommit(bodyOf(frame));
  if (!again || again->lease != r->lease || again->upTo != r->upTo || again->sums != r->sums) {
    differs("commit");
  }
}

void leases(std::span<const uint8_t> body) {
  auto r = decodeLeases(body);
  if (!r) return;
  std::vector<uint8_t> frame;
  appendRelease(frame, *r);
  auto again = decodeLeases(bodyOf(frame));
  if (!again || *again != *r) differs("release");
}

// A reply decodes, encodes back (the answer, or the daemon's error) and decodes to the same.
template <typename T, typename Decode, typename Append, typename Same>
void replyRoundTrip(std::span<const uint8_t> body, uint16_t op, const char* what, Decode decode,
                    Append append, Same same) {
  auto r = decode(body);
  if (!r) return;
  std::vector<uint8_t> frame;
  if (r->ok()) {
    append(frame, r->value());
  } else {
    appendErrorReply(frame, op, 1, r->error());
  }
  auto again = decode(bodyOf(frame));
  if (!again || again->ok() != r->ok()) differs(what);
  if (r->ok() ? !same(again->value(), r->value())
              : again->error().code() != r->error().code() ||
                    again->error().message() != r->error().message()) {
    differs(what);
  }
}

void lookupReply(std::span<const uint8_t> body) {
  replyRoundTrip<LookupReply>(
      body, kLookup | kReply, "lookup reply", decodeLookupReply,
      [](std::vector<uint8_t>& f, const LookupReply& v) { appendLookupReply(f, 1, v); },
      [](const LookupReply& a, const LookupReply& b) { return same(a, b); });
}

void putReply(std::span<const uint8_t> body) {
  replyRoundTrip<PutReply>(
      body, kPut | kReply, "put reply", decodePutReply,
      [](std::vector<uint8_t>& f, const PutReply& v) { appendPutReply(f, 1, v); },
      [](const PutReply& a, const PutReply& b) { return same(a, b); });
}

void commitReply(std::span<const uint8_t> body) {
  replyRoundTrip<CommitReply>(
      body, kCommit | kReply, "commit reply", decodeCommitReply,
      [](std::vector<uint8_t>& f, const CommitReply& v) { appendCommitReply(f, 1, v); },
      [](const CommitReply& a, const CommitReply& b) {
        return a.length == b.length && a.sealedBlocks == b.sealedBlocks;
      });
}

}  // namespace
}  // namespace kvtier::lane

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier::lane;
  if (size == 0) return 0;
  const std::span<const uint8_t> rest(data + 1, size - 1);
  switch (data[0] % 8) {
    case 0:
      lookupRequest(rest);
      break;
    case 1:
      putRequest(rest);
      break;
    case 2:
      commitRequest(rest);
      break;
    case 3:
      leases(rest);
      break;
    case 4:
      lookupReply(rest);
      break;
    case 5:
      putReply(rest);
      break;
    case 6:
      commitReply(rest);
      break;
    default: {
      // A header as read off the socket, then what follows it as that op's body.
      Header h;
      if (rest.size() < sizeof h) return 0;
      std::memcpy(&h, rest.data(), sizeof h);
      if (!checkHeader(h)) return 0;
      if (h.bodyBytes > kMaxBodyBytes) std::abort();  // checkHeader lets no larger body through
      const auto body = rest.subspan(sizeof h);
      switch (h.op) {
        case kLookup:
          lookupRequest(body);
          break;
        case kPut:
          putRequest(body);
          break;
        case kCommit:
          commitRequest(body);
          break;
        case kRelease:
        case kAbort:
          leases(body);
          break;
        case kLookup | kReply:
          lookupReply(body);
          break;
        case kPut | kReply:
          putReply(body);
          break;
        case kCommit | kReply:
          commitReply(body);
          break;
        default:
          break;
      }
    }
  }
  return 0;
}
