#include "transport/lane_codec.h"

#include <cstring>

namespace kvtier::lane {

namespace {

template <typename T>
void put(std::vector<uint8_t>& out, const T& v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void putBytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  if (n == 0) return;
  const size_t at = out.size();
  out.resize(at + n);
  std::memcpy(out.data() + at, p, n);
}

// Reserves a header whose body size is filled in by finish().
size_t begin(std::vector<uint8_t>& out, uint16_t op, uint64_t id) {
  const size_t at = out.size();
  put(out, Header{0, op, 0, id});
  return at;
}

void finish(std::vector<uint8_t>& out, size_t at) {
  const uint32_t body = static_cast<uint32_t>(out.size() - at - sizeof(Header));
  std::memcpy(out.data() + at, &body, sizeof body);
}

// Reads a body front to back; every read checks the bytes are there.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> body) : rest_(body) {}
  template <typename T>
  bool get(T& v) {
    if (rest_.size() < sizeof(T)) return false;
    std::memcpy(&v, rest_.data(), sizeof(T));
    rest_ = rest_.subspan(sizeof(T));
    return true;
  }
  bool getBytes(void* p, size_t n) {
    if (rest_.size() < n) return false;
    if (n > 0) std::memcpy(p, rest_.data(), n);
    rest_ = rest_.subspan(n);
    return true;
  }
  size_t left() const { return rest_.size(); }

 private:
  std::span<const uint8_t> rest_;
};

Error malformed(const char* what) {
  return makeError(ErrorCode::kInvalidArgument, "malformed lane frame: ", what);
}

constexpr uint32_t kPutDetached = 1;

void appendLeases(std::vector<uint8_t>& out, uint16_t op, std::span<const uint64_t> leases) {
  const size_t at = begin(out, op, 0);
  put(out, static_cast<uint32_t>(leases.size()));
  put(out, uint32_t{0});
  putBytes(out, leases.data(), leases.size() * sizeof(uint64_t));
  finish(out, at);
}

// A lookup's or a put's grant: a position, the lease and the blocks.
// A grant's body: position, lease, the blocks, then (a lookup's) their checksums, one each.
void appendGrant(std::vector<uint8_t>& out, uint16_t op, uint64_t id, uint64_t position,
                 uint64_t lease, std::span<const BlockLocation> blocks,
                 std::span<const uint64_t> sums = {}) {
  const size_t at = begin(out, static_cast<uint16_t>(op | kReply), id);
  put(out, uint32_t{0});
  put(out, static_cast<uint32_t>(blocks.size()));
  put(out, position);
  put(out, lease);
  // One resize for all the blocks (a put or lookup names up to 65,536).
  const size_t first = out.size();
  out.resize(first + blocks.size() * kBlockBytes + sums.size() * 8);
  uint8_t* p = out.data() + first;
  for (const BlockLocation& b : blocks) {
    std::memcpy(p, &b.extent, 4);
    std::memcpy(p + 4, &b.bytes, 4);
    std::memcpy(p + 8, &b.offset, 8);
    std::memcpy(p + 16, &b.generation, 8);
    p += kBlockBytes;
  }
  if (!sums.empty()) std::memcpy(p, sums.data(), sums.size() * 8);
  finish(out, at);
}

Status readGrant(Reader& r, uint32_t n, uint64_t& position, uint64_t& lease,
                 std::vector<BlockLocation>& blocks, std::vector<uint64_t>* sums = nullptr) {
  if (!r.get(position) || !r.get(lease)) return malformed("short reply");
  const size_t each = kBlockBytes + (sums ? 8 : 0);
  if (n > kMaxBlocksPerLease || r.left() != size_t{n} * each) {
    return malformed("reply size does not match its count");
  }
  blocks.resize(n);
  for (BlockLocation& b : blocks) {
    r.get(b.extent);
    r.get(b.bytes);
    r.get(b.offset);
    r.get(b.generation);
  }
  if (sums) {
    sums->resize(n);
    for (uint64_t& sum : *sums) r.get(sum);
  }
  return {};
}

// An answer's body: a code and a count, then the daemon's error message (code != 0) or what
// `parse` reads of a successful answer.
template <typename T, typename Parse>
Result<Result<T>> decodeAnswer(std::span<const uint8_t> body, Parse parse) {
  Reader r(body);
  uint32_t code = 0, n = 0;
  if (!r.get(code) || !r.get(n)) return malformed("short reply");
  if (code != 0) {
    // The count is checked before anything is allocated for it: it is the sender's number.
    if (n > 4096 || r.left() != n) return malformed("error reply");
    std::string message(n, '\0');
    if (!r.getBytes(message.data(), n)) return malformed("error reply");
    if (code > static_cast<uint32_t>(ErrorCode::kReleased)) code = uint32_t(ErrorCode::kInternal);
    return Result<T>(Error(static_cast<ErrorCode>(code), std::move(message)));
  }
  auto reply = parse(r, n);
  if (!reply) return reply.error();
  return Result<T>(std::move(reply).value());
}

}  // namespace

void appendLookup(std::vector<uint8_t>& out, uint64_t id, uint32_t space, uint32_t remote,
                  std::span<const uint32_t> tokens, std::span<const Key128> keys) {
  const size_t at = begin(out, kLookup, id);
  put(out, space);
  put(out, remote);
  put(out, static_cast<uint32_t>(tokens.size()));
  put(out, static_cast<uint32_t>(keys.size()));
  putBytes(out, tokens.data(), tokens.size() * sizeof(uint32_t));
  for (const Key128& k : keys) putBytes(out, k.bytes.data(), k.bytes.size());
  finish(out, at);
}

void appendPut(std::vector<uint8_t>& out, uint64_t id, const PutArgs& args) {
  const size_t at = begin(out, kPut, id);
  put(out, args.space);
  put(out, args.detached ? kPutDetached : uint32_t{0});
  put(out, args.begin);
  put(out, args.window);
  put(out, args.chunk);
  put(out, static_cast<uint32_t>(args.seq.size()));
  put(out, static_cast<uint32_t>(args.tokens.size()));
  put(out, static_cast<uint32_t>(args.keys.size()));
  put(out, uint32_t{0});
  putBytes(out, args.seq.data(), args.seq.size());
  putBytes(out, args.tokens.data(), args.tokens.size() * sizeof(uint32_t));
  for (const Key128& k : args.keys) putBytes(out, k.bytes.data(), k.bytes.size());
  finish(out, at);
}

void appendCommit(std::vector<uint8_t>& out, uint64_t id, const CommitRequest& commit) {
  const size_t at = begin(out, kCommit, id);
  put(out, commit.lease);
  put(out, commit.upTo);
  put(out, static_cast<uint32_t>(commit.sums.size()));
  put(out, uint32_t{0});
  putBytes(out, commit.sums.data(), commit.sums.size() * sizeof(uint64_t));
  finish(out, at);
}

void appendRelease(std::vector<uint8_t>& out, std::span<const uint64_t> leases) {
  appendLeases(out, kRelease, leases);
}

void appendAbort(std::vector<uint8_t>& out, std::span<const uint64_t> leases) {
  appendLeases(out, kAbort, leases);
}

void appendSync(std::vector<uint8_t>& out, uint64_t id) { finish(out, begin(out, kSync, id)); }

void appendSyncReply(std::vector<uint8_t>& out, uint64_t id) {
  finish(out, begin(out, kSync | kReply, id));
}

void appendLookupReply(std::vector<uint8_t>& out, uint64_t id, const LookupReply& reply) {
  // Every block has its entry (0: no checksum).
  std::vector<uint64_t> sums = reply.sums;
  sums.resize(reply.blocks.size(), 0);
  appendGrant(out, kLookup, id, reply.matchedTokens, reply.lease, reply.blocks, sums);
}

void appendPutReply(std::vector<uint8_t>& out, uint64_t id, const PutReply& reply) {
  appendGrant(out, kPut, id, reply.firstPosition, reply.lease, reply.blocks);
}

void appendCommitReply(std::vector<uint8_t>& out, uint64_t id, const CommitReply& reply) {
  const size_t at = begin(out, kCommit | kReply, id);
  put(out, uint32_t{0});
  put(out, uint32_t{0});
  put(out, reply.length);
  put(out, uint64_t{reply.sealedBlocks});
  finish(out, at);
}

void appendErrorReply(std::vector<uint8_t>& out, uint16_t op, uint64_t id, const Error& error) {
  const size_t at = begin(out, static_cast<uint16_t>(op | kReply), id);
  put(out, static_cast<uint32_t>(error.code()));
  const std::string& message = error.message();
  const uint32_t n = static_cast<uint32_t>(std::min<size_t>(message.size(), 4096));
  put(out, n);
  putBytes(out, message.data(), n);
  finish(out, at);
}

Status checkHeader(const Header& h) {
  const uint16_t op = h.op & ~uint16_t{kReply};
  if (op < kLookup || op > kAbort) return malformed("unknown op");
  if (h.flags != 0) return malformed("flags set");
  if (h.bodyBytes > kMaxBodyBytes) return malformed("body too large");
  return {};
}

Result<LookupRequest> decodeLookup(std::span<const uint8_t> body) {
  Reader r(body);
  LookupRequest req;
  uint32_t tokens = 0, keys = 0;
  if (!r.get(req.space) || !r.get(req.remote) || !r.get(tokens) || !r.get(keys)) {
    return malformed("short lookup");
  }
  if (tokens > kMaxTokensPerCall) {
    return makeError(ErrorCode::kInvalidArgument, tokens, " tokens exceed ", kMaxTokensPerCall);
  }
  if (keys > kMaxBlocksPerLease) {
    return makeError(ErrorCode::kInvalidArgument, keys, " keys exceed ", kMaxBlocksPerLease);
  }
  if (r.left() != size_t{tokens} * sizeof(uint32_t) + size_t{keys} * sizeof(Key128)) {
    return malformed("lookup size does not match its counts");
  }
  req.tokens.resize(tokens);
  r.getBytes(req.tokens.data(), req.tokens.size() * sizeof(uint32_t));
  req.keys.resize(keys);
  for (Key128& k : req.keys) r.getBytes(k.bytes.data(), k.bytes.size());
  return req;
}

Result<PutRequest> decodePut(std::span<const uint8_t> body) {
  Reader r(body);
  PutRequest req;
  uint32_t flags = 0, seqBytes = 0, tokens = 0, keys = 0, pad = 0;
  if (!r.get(req.space) || !r.get(flags) || !r.get(req.begin) || !r.get(req.window) ||
      !r.get(req.chunk) || !r.get(seqBytes) || !r.get(tokens) || !r.get(keys) || !r.get(pad)) {
    return malformed("short put");
  }
  if ((flags & ~kPutDetached) != 0 || pad != 0) return malformed("put flags");
  if (seqBytes > kMaxSeqNameBytes) {
    return makeError(ErrorCode::kInvalidArgument, "sequence name of ", seqBytes, " bytes exceeds ",
                     kMaxSeqNameBytes);
  }
  if (tokens > kMaxTokensPerCall) {
    return makeError(ErrorCode::kInvalidArgument, tokens, " tokens exceed ", kMaxTokensPerCall);
  }
  if (keys > kMaxBlocksPerLease) {
    return makeError(ErrorCode::kInvalidArgument, keys, " keys exceed ", kMaxBlocksPerLease);
  }
  if (r.left() !=
      size_t{seqBytes} + size_t{tokens} * sizeof(uint32_t) + size_t{keys} * sizeof(Key128)) {
    return malformed("put size does not match its counts");
  }
  req.detached = (flags & kPutDetached) != 0;
  req.seq.resize(seqBytes);
  r.getBytes(req.seq.data(), seqBytes);
  req.tokens.resize(tokens);
  r.getBytes(req.tokens.data(), req.tokens.size() * sizeof(uint32_t));
  req.keys.resize(keys);
  for (Key128& k : req.keys) r.getBytes(k.bytes.data(), k.bytes.size());
  return req;
}

Result<CommitRequest> decodeCommit(std::span<const uint8_t> body) {
  Reader r(body);
  CommitRequest req;
  uint32_t count = 0, pad = 0;
  if (!r.get(req.lease) || !r.get(req.upTo) || !r.get(count) || !r.get(pad) || pad != 0) {
    return malformed("commit size");
  }
  if (count > kMaxBlocksPerLease || r.left() != size_t{count} * sizeof(uint64_t)) {
    return malformed("commit checksum count does not match its size");
  }
  req.sums.resize(count);
  r.getBytes(req.sums.data(), req.sums.size() * sizeof(uint64_t));
  return req;
}

Result<std::vector<uint64_t>> decodeLeases(std::span<const uint8_t> body) {
  Reader r(body);
  uint32_t count = 0, pad = 0;
  if (!r.get(count) || !r.get(pad) || pad != 0) return malformed("short lease list");
  if (r.left() != size_t{count} * sizeof(uint64_t)) {
    return malformed("lease list size does not match its count");
  }
  std::vector<uint64_t> leases(count);
  r.getBytes(leases.data(), leases.size() * sizeof(uint64_t));
  return leases;
}

Result<Result<LookupReply>> decodeLookupReply(std::span<const uint8_t> body) {
  return decodeAnswer<LookupReply>(body, [](Reader& r, uint32_t n) -> Result<LookupReply> {
    LookupReply reply;
    if (auto s = readGrant(r, n, reply.matchedTokens, reply.lease, reply.blocks, &reply.sums); !s) {
      return s.error();
    }
    return reply;
  });
}

Result<Result<PutReply>> decodePutReply(std::span<const uint8_t> body) {
  return decodeAnswer<PutReply>(body, [](Reader& r, uint32_t n) -> Result<PutReply> {
    PutReply reply;
    if (auto s = readGrant(r, n, reply.firstPosition, reply.lease, reply.blocks); !s) {
      return s.error();
    }
    return reply;
  });
}

Result<Result<CommitReply>> decodeCommitReply(std::span<const uint8_t> body) {
  return decodeAnswer<CommitReply>(body, [](Reader& r, uint32_t n) -> Result<CommitReply> {
    CommitReply reply;
    uint64_t sealed = 0;
    if (n != 0 || !r.get(reply.length) || !r.get(sealed) || r.left() != 0 ||
        sealed > kMaxBlocksPerLease) {
      return malformed("commit reply");
    }
    reply.sealedBlocks = static_cast<uint32_t>(sealed);
    return reply;
  });
}

}  // namespace kvtier::lane
