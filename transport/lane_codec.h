// The fast lane: kvtier's hand-framed protocol for the hottest calls, beside Cap'n Proto.
//
// Why: a one-block lookup over Cap'n Proto is three or four messages (Call, Return, Finish, the
// lease's Release) through KJ's promise machinery, ~20 µs of daemon CPU per call on a small VM
// against ~1 µs for the lookup itself (docs/performance.md); a put's begin and commit cost the
// same twice over. The lane carries a lookup, a put's grant and its commit as one frame each way
// and a lease's release or abort as a few bytes appended to the client's next frame, read and
// written with plain syscalls: each costs what a socket round trip costs.
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
#include <string_view>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/error.h"
#include "store/block_pool.h"
#include "store/limits.h"

namespace kvtier::lane {

static_assert(std::endian::native == std::endian::little, "the lane's frames are little-endian");

inline constexpr uint32_t kMagic = 0x4C46564B;  // the bytes "KVFL"
inline constexpr uint32_t kVersion = 2;         // 2: lookup replies carry the blocks' checksums
inline constexpr size_t kTokenBytes = 16;

struct Attach {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  uint8_t token[kTokenBytes] = {};
};
static_assert(sizeof(Attach) == 24);

enum class AttachStatus : uint32_t { kAccepted = 0 };

enum Op : uint16_t {
  kLookup = 1,   // -> kLookup | kReply: a read lease on the prompt's matched prefix
  kRelease = 2,  // one-way: the read leases of earlier lookups
  kSync = 3,     // -> kSync | kReply, empty: everything sent before it has been served
  kPut = 4,      // -> kPut | kReply: a write lease on the blocks a sequence's tokens go into
  kCommit = 5,   // -> kCommit | kReply: the written tokens made visible; the write lease ends
  kAbort = 6,    // one-way: write leases ended without a trace
  kReply = 0x80,
};

struct Header {
  uint32_t bodyBytes = 0;
  uint16_t op = 0;
  uint16_t flags = 0;  // 0
  uint64_t id = 0;
};
static_assert(sizeof(Header) == 16);

// The largest body either side accepts: a put (or lookup) of kMaxTokensPerCall tokens and
// kMaxBlocksPerLease keys, or an answer naming kMaxBlocksPerLease blocks.
inline constexpr size_t kLookupFixedBytes = 16;
inline constexpr size_t kPutFixedBytes = 48;
inline constexpr size_t kBlockBytes = 24;  // one block in a grant
inline constexpr size_t kMaxBodyBytes =
    kPutFixedBytes + kMaxSeqNameBytes + kMaxTokensPerCall * 4 + kMaxBlocksPerLease * sizeof(Key128);

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
  // Each block's checksum from its writer (0: none); on the wire after the blocks, 8 bytes each.
  std::vector<uint64_t> sums;
};

// A put as the client names it (views of its own data).
struct PutArgs {
  uint32_t space = 0;
  std::string_view seq;
  uint64_t begin = 0;
  std::span<const uint32_t> tokens;
  std::span<const Key128> keys;  // the client's own keys, or none
  bool detached = false;
  uint64_t window = 0, chunk = 0;
};

// A put as the daemon receives it.
struct PutRequest {
  uint32_t space = 0;
  std::string seq;
  uint64_t begin = 0;
  std::vector<uint32_t> tokens;
  std::vector<Key128> keys;
  bool detached = false;
  uint64_t window = 0, chunk = 0;
};

struct PutReply {
  uint64_t firstPosition = 0;  // of blocks[0]
  uint64_t lease = 0;
  std::vector<BlockLocation> blocks;
};

struct CommitRequest {
  uint64_t lease = 0;
  uint64_t upTo = 0;
  // The writer's checksums of the blocks the put fills (Engine::commit); at most
  // kMaxBlocksPerLease. On the wire: count (u32), 0 (u32), then the u64s.
  std::vector<uint64_t> sums;
};

struct CommitReply {
  uint64_t length = 0;
  uint32_t sealedBlocks = 0;
};

// Frames (header and body) ready to write. `remote` is checked by the daemon.
void appendLookup(std::vector<uint8_t>& out, uint64_t id, uint32_t space, uint32_t remote,
                  std::span<const uint32_t> tokens, std::span<const Key128> keys);
void appendPut(std::vector<uint8_t>& out, uint64_t id, const PutArgs& put);
void appendCommit(std::vector<uint8_t>& out, uint64_t id, const CommitRequest& commit);
void appendRelease(std::vector<uint8_t>& out, std::span<const uint64_t> leases);
void appendAbort(std::vector<uint8_t>& out, std::span<const uint64_t> leases);
void appendSync(std::vector<uint8_t>& out, uint64_t id);
void appendLookupReply(std::vector<uint8_t>& out, uint64_t id, const LookupReply& reply);
void appendPutReply(std::vector<uint8_t>& out, uint64_t id, const PutReply& reply);
void appendCommitReply(std::vector<uint8_t>& out, uint64_t id, const CommitReply& reply);
void appendErrorReply(std::vector<uint8_t>& out, uint16_t op, uint64_t id, const Error& error);
void appendSyncReply(std::vector<uint8_t>& out, uint64_t id);

// Header checks both sides make: a known op, flags 0, a body within kMaxBodyBytes.
Status checkHeader(const Header& h);
// Bodies as received; INVALID_ARGUMENT when a body does not parse exactly (sizes, counts, limits).
Result<LookupRequest> decodeLookup(std::span<const uint8_t> body);
Result<PutRequest> decodePut(std::span<const uint8_t> body);
Result<CommitRequest> decodeCommit(std::span<const uint8_t> body);
// A release's or an abort's lease ids.
Result<std::vector<uint64_t>> decodeLeases(std::span<const uint8_t> body);
// Answers: the reply or the daemon's typed error (its code and message); the outer error only
// when the body does not parse.
Result<Result<LookupReply>> decodeLookupReply(std::span<const uint8_t> body);
Result<Result<PutReply>> decodePutReply(std::span<const uint8_t> body);
Result<Result<CommitReply>> decodeCommitReply(std::span<const uint8_t> body);

}  // namespace kvtier::lane
