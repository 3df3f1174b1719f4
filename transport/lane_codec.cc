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

void appendRelease(std::vector<uint8_t>& out, std::span<const uint64_t> leases) {
  const size_t at = begin(out, kRelease, 0);
  put(out, static_cast<uint32_t>(leases.size()));
  put(out, uint32_t{0});
  putBytes(out, leases.data(), leases.size() * sizeof(uint64_t));
  finish(out, at);
}

void appendSync(std::vector<uint8_t>& out, uint64_t id) { finish(out, begin(out, kSync, id)); }

void appendSyncReply(std::vector<uint8_t>& out, uint64_t id) {
  finish(out, begin(out, kSync | kReply, id));
}

void appendLookupReply(std::vector<uint8_t>& out, uint64_t id, const LookupReply& reply) {
  const size_t at = begin(out, kLookup | kReply, id);
  put(out, uint32_t{0});
  put(out, static_cast<uint32_t>(reply.blocks.size()));
  put(out, reply.matchedTokens);
  put(out, reply.lease);
  for (const BlockLocation& b : reply.blocks) {
    put(out, b.extent);
    put(out, b.bytes);
    put(out, b.offset);
    put(out, b.generation);
  }
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
  if (op != kLookup && op != kRelease && op != kSync) return malformed("unknown op");
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

Result<std::vector<uint64_t>> decodeRelease(std::span<const uint8_t> body) {
  Reader r(body);
  uint32_t count = 0, pad = 0;
  if (!r.get(count) || !r.get(pad) || pad != 0) return malformed("short release");
  if (r.left() != size_t{count} * sizeof(uint64_t)) {
    return malformed("release size does not match its count");
  }
  std::vector<uint64_t> leases(count);
  r.getBytes(leases.data(), leases.size() * sizeof(uint64_t));
  return leases;
}

Result<Result<LookupReply>> decodeLookupReply(std::span<const uint8_t> body) {
  Reader r(body);
  uint32_t code = 0, n = 0;
  if (!r.get(code) || !r.get(n)) return malformed("short reply");
  if (code != 0) {
    std::string message(n, '\0');
    if (n > 4096 || r.left() != n || !r.getBytes(message.data(), n)) {
      return malformed("error reply");
    }
    if (code > static_cast<uint32_t>(ErrorCode::kReleased)) code = uint32_t(ErrorCode::kInternal);
    return Result<LookupReply>(Error(static_cast<ErrorCode>(code), std::move(message)));
  }
  LookupReply reply;
  if (!r.get(reply.matchedTokens) || !r.get(reply.lease)) return malformed("short reply");
  if (n > kMaxBlocksPerLease || r.left() != size_t{n} * kBlockBytes) {
    return malformed("reply size does not match its count");
  }
  reply.blocks.resize(n);
  for (BlockLocation& b : reply.blocks) {
    r.get(b.extent);
    r.get(b.bytes);
    r.get(b.offset);
    r.get(b.generation);
  }
  return Result<LookupReply>(std::move(reply));
}

}  // namespace kvtier::lane
