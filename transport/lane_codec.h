// The fast lane: kvtier's hand-framed protocol for the hottest calls, beside Cap'n Proto.
//
// Why: a one-block lookup over Cap'n Proto is three or four messages (Call, Return, Finish, the
// lease's Release) through KJ's promise machinery, ~20 µs of daemon CPU per call on a small VM
// against ~1 µs for the lookup itself (docs/performance.md). The lane carries a lookup as one
// frame each way and a lease's release as a few bytes appended to the client's next frame, read
// and written with plain syscalls: a lookup costs what a socket round trip costs.
//
// A session's lane is a second connection to kvtierd's socket. Its first bytes are an Attach
// naming the session by the random token hello handed out (and the daemon checks the peer's
// credentials match the session's); a Cap'n Proto connection can never start with kMagic (it
// would declare over a billion segments). The daemon answers the Attach with a 4-byte status,
// then the client sends frames: a Header, then `bodyBytes` of body. Requests are answered in
// order of completion with the request's id; releases and syncs carry no lookup. Integers are
// little-endian, the only byte order kvtier runs on. A malformed frame ends the lane (the SDK
// goes on over Cap'n Proto); the session and its calls are untouched.
#pragma once

#include <bit>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/error.h"
#include "store/block_pool.h"
#include "store/limits.h"

namespace kvtier::lane {

static_assert(std::endian::native == std::endian::little, "the lane's frames are little-endian");

inline constexpr uint32_t kMagic = 0x4C46564B;  // the bytes "KVFL"
inline constexpr uint32_t kVersion = 1;
inline constexpr size_t kTokenBytes = 16;

struct Attach {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  uint8_t token[kTokenBytes] = {};
};
static_assert(sizeof(Attach) == 24);

enum class AttachStatus : uint32_t { kAccepted = 0 };

enum Op : uint16_t {
  kLookup = 1,   // -> kLookup | kReply
  kRelease = 2,  // one-way: the read leases of earlier lookups
  kSync = 3,     // -> kSync | kReply, empty: everything sent before it has been served
  kReply = 0x80,
};

struct Header {
  uint32_t bodyBytes = 0;
  uint16_t op = 0;
  uint16_t flags = 0;  // 0
  uint64_t id = 0;
};
static_assert(sizeof(Header) == 16);

// The largest body either side accepts: a lookup of kMaxTokensPerCall tokens or kMaxBlocksPerLease
// keys, or the answer naming kMaxBlocksPerLease blocks.
inline constexpr size_t kLookupFixedBytes = 16;
inline constexpr size_t kBlockBytes = 24;  // one block in a lookup answer
inline constexpr size_t kMaxBodyBytes =
    kLookupFixedBytes + kMaxTokensPerCall * 4 + kMaxBlocksPerLease * sizeof(Key128);

struct LookupRequest {
  uint32_t space = 0;   // the lane's number for the space, from open
  uint32_t remote = 0;  // rpc::RemoteMode
  std::vector<uint32_t> tokens;
  std::vector<Key128> keys;
};

struct LookupReply {
  uint64_t matchedTokens = 0;
  uint64_t lease = 0;  // 0 when nothing matched
  std::vector<BlockLocation> blocks;
};

// Frames (header and body) ready to write. `remote` is checked by the daemon.
void appendLookup(std::vector<uint8_t>& out, uint64_t id, uint32_t space, uint32_t remote,
                  std::span<const uint32_t> tokens, std::span<const Key128> keys);
void appendRelease(std::vector<uint8_t>& out, std::span<const uint64_t> leases);
void appendSync(std::vector<uint8_t>& out, uint64_t id);
void appendLookupReply(std::vector<uint8_t>& out, uint64_t id, const LookupReply& reply);
void appendErrorReply(std::vector<uint8_t>& out, uint16_t op, uint64_t id, const Error& error);
void appendSyncReply(std::vector<uint8_t>& out, uint64_t id);

// Header checks both sides make: a known op, flags 0, a body within kMaxBodyBytes.
Status checkHeader(const Header& h);
// Bodies as received; INVALID_ARGUMENT when a body does not parse exactly (sizes, counts, limits).
Result<LookupRequest> decodeLookup(std::span<const uint8_t> body);
Result<std::vector<uint64_t>> decodeRelease(std::span<const uint8_t> body);
// A lookup's answer: the reply or the daemon's typed error (its code and message); the outer
// error only when the body does not parse.
Result<Result<LookupReply>> decodeLookupReply(std::span<const uint8_t> body);

}  // namespace kvtier::lane
