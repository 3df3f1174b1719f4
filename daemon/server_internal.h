// What the daemon's RPC objects share (server.cc, server_space.cc): reading requests and
// filling answers, the read and write leases, and the owner of a session's sequences. Internal to
// the server (daemon/server.h is its interface).
#pragma once

#include <capnp/rpc-twoparty.h>
#include <kj/debug.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cstdio>
#include <memory>
#include "daemon/lane.h"
#include "daemon/log.h"
#include "daemon/lookup.h"
#include "daemon/metrics.h"
#include "daemon/server.h"
#include "kernels/block_copy.h"
#include "schemas/kvtier.capnp.h"
#include "transport/buffered_stream.h"
#include "transport/pool_fds.h"
#include "transport/rpc_codec.h"
#include "transport/socket_stream.h"

namespace kvtier::server_internal {

// A client's name is a label for logs (hello), not a payload.
inline constexpr size_t kMaxClientNameBytes = 256;

// `text` for a log line: quoted, with quotes, backslashes and bytes outside printable ASCII
// escaped, so that a client's name can neither forge a log line nor a field.
inline std::string logQuoted(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + '"';
}

// Messages carry at most kMaxInlineBytesPerCall of KV plus a 1M-token list: allow twice that.
inline capnp::ReaderOptions readerOptions() {
  capnp::ReaderOptions options;
  options.traversalLimitInWords =
      2 * (kMaxInlineBytesPerCall + (uint64_t{8} << 20)) / sizeof(capnp::word);
  options.nestingLimit = 16;
  return options;
}

inline std::string_view text(capnp::Text::Reader t) { return std::string_view(t.cStr(), t.size()); }

inline std::vector<uint32_t> tokensFrom(capnp::List<uint32_t>::Reader list) {
  if (list.size() > kMaxTokensPerCall) {
    throwRpcError(
        makeError(ErrorCode::kInvalidArgument, list.size(), " tokens exceed ", kMaxTokensPerCall));
  }
  std::vector<uint32_t> out(list.size());
  for (uint32_t i = 0; i < list.size(); ++i) out[i] = list[i];
  return out;
}

inline std::vector<Key128> keysFrom(capnp::List<capnp::Data>::Reader list) {
  if (list.size() > kMaxBlocksPerLease) {
    throwRpcError(
        makeError(ErrorCode::kInvalidArgument, list.size(), " keys exceed ", kMaxBlocksPerLease));
  }
  std::vector<Key128> out(list.size());
  for (uint32_t i = 0; i < list.size(); ++i) {
    auto k = list[i];
    if (k.size() != out[i].bytes.size()) {
      throwRpcError(
          makeError(ErrorCode::kInvalidArgument, "key ", i, " has ", k.size(), " bytes, not 16"));
    }
    std::memcpy(out[i].bytes.data(), k.begin(), k.size());
  }
  return out;
}

// Blocks may have become evictable: let the write-behind spiller take them.
inline void kickSpill(ColdService* cold) {
  if (cold) cold->kick();
}

inline SeqOptions optionsFrom(rpc::SeqOptions::Reader in) {
  return SeqOptions{in.getDetached(), in.getWindow(), in.getChunk()};
}

inline Key128 keyFrom(capnp::Data::Reader in) {
  Key128 key;
  if (in.size() != key.bytes.size()) {
    throwRpcError(makeError(ErrorCode::kInvalidArgument, "key has ", in.size(), " bytes, not 16"));
  }
  std::memcpy(key.bytes.data(), in.begin(), in.size());
  return key;
}

inline void setSnapshot(rpc::SnapshotInfo::Builder out, const SnapshotInfo& info,
                        const RemoteTier* remote) {
  if (remote) out.setNode(remote->nodeId());
  out.setId(info.id);
  out.setFrom(info.from);
  out.setTo(info.to);
  auto positions = out.initCheckpoints(info.checkpoints.size());
  for (uint32_t i = 0; i < info.checkpoints.size(); ++i) positions.set(i, info.checkpoints[i]);
}

template <typename Builder>
inline void setBlocks(Builder&& out, const std::vector<BlockLocation>& blocks) {
  for (uint32_t i = 0; i < blocks.size(); ++i) blockToRpc(blocks[i], out[i]);
}

inline void setSums(capnp::List<uint64_t>::Builder out, const std::vector<uint64_t>& sums) {
  for (uint32_t i = 0; i < sums.size(); ++i) out.set(i, sums[i]);
}

// Copies whole blocks into the result for clients that cannot map the pool. Blocks in GPU memory
// never travel inline: the read lease that holds them is released and the call fails, typed.
inline void setInlineData(capnp::List<capnp::Data>::Builder out, Engine& engine,
                          const std::vector<BlockLocation>& blocks, LeaseId lease) {
  for (uint32_t i = 0; i < blocks.size(); ++i) {
    if (!engine.memory().hostAddressable(blocks[i].extent)) {
      (void)engine.releaseRead(lease);
      throwRpcError(makeError(ErrorCode::kNotSupported,
                              "blocks in GPU memory do not travel inline: map the GPU pool"));
    }
    const uint8_t* base = engine.memory().extentBase(blocks[i].extent) + blocks[i].offset;
    out.set(i, capnp::Data::Reader(base, blocks[i].bytes));
  }
}

inline void checkInlineBytes(size_t blocks, uint32_t blockBytes) {
  if (uint64_t{blocks} * blockBytes > kMaxInlineBytesPerCall) {
    throwRpcError(makeError(ErrorCode::kInvalidArgument, "inline transfer of ", blocks,
                            " blocks exceeds ", kMaxInlineBytesPerCall,
                            " bytes per call; map the pool or ask for less"));
  }
}

class ReadLeaseImpl final : public rpc::ReadLease::Server {
 public:
  ReadLeaseImpl(Engine& engine, LeaseId id, ColdService* cold)
      : engine_(engine), id_(id), cold_(cold) {}
  ~ReadLeaseImpl() noexcept(false) {
    if (id_ != 0) (void)engine_.releaseRead(id_);
    kickSpill(cold_);
  }
  kj::Promise<void> release(ReleaseContext) override {
    const LeaseId id = id_;
    id_ = 0;
    orThrow(engine_.releaseRead(id));
    kickSpill(cold_);
    return kj::READY_NOW;
  }

 private:
  Engine& engine_;
  LeaseId id_;
  ColdService* cold_;
};

// A session's ownership of the sequences it creates (not detached): they are removed once the
// session and everything it handed out that can still create one — its spaces and their open
// write leases — are gone. A client may drop its Session and go on with a Space it holds.
class OwnerScope {
 public:
  OwnerScope(Engine& engine, ColdService* cold, OwnerId owner)
      : engine_(engine), cold_(cold), owner_(owner) {}
  ~OwnerScope() {
    engine_.endOwner(owner_);
    kickSpill(cold_);
  }
  OwnerScope(const OwnerScope&) = delete;
  OwnerScope& operator=(const OwnerScope&) = delete;
  OwnerId id() const { return owner_; }

 private:
  Engine& engine_;
  ColdService* cold_;
  OwnerId owner_;
};

inline rpc::ReadLease::Client readLease(Engine& engine, LeaseId id, ColdService* cold) {
  // An empty grant still returns a lease capability, so clients treat every result alike.
  return kj::heap<ReadLeaseImpl>(engine, id, cold);
}

class WriteLeaseImpl final : public rpc::WriteLease::Server {
 public:
  WriteLeaseImpl(Engine& engine, std::shared_ptr<OwnerScope> owner, SpaceId space, LeaseId id,
                 uint64_t begin, uint64_t end, uint64_t firstPosition, uint32_t blocks,
                 ColdService* cold, uint64_t blobBytes = 0, uint64_t chunkBytes = 0)
      : engine_(engine),
        owner_(std::move(owner)),
        cold_(cold),
        space_(space),
        id_(id),
        begin_(begin),
        end_(end),
        first_(firstPosition),
        blocks_(blocks),
        blobBytes_(blobBytes),
        chunkBytes_(chunkBytes) {}

  kj::Promise<void> writeBlob(WriteBlobContext context) override {
    if (id_ == 0) {
      throwRpcError(makeError(ErrorCode::kReleased, "write lease was committed or aborted"));
    }
    auto p = context.getParams();
    const uint64_t offset = p.getOffset(), size = p.getData().size();
    if (blobBytes_ == 0 || offset > blobBytes_ || size > blobBytes_ - offset) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument, "blob write of [", offset, ", +", size,
                              ") is outside the lease's ", blobBytes_, "-byte blob"));
    }
    // A blob is one block; a state's payload runs over its chunks, chunkBytes_ each.
    const uint8_t* src = p.getData().begin();
    for (uint64_t at = offset, end = offset + size; at < end;) {
      const uint64_t chunk = chunkBytes_ == 0 ? 0 : at / chunkBytes_;
      const uint64_t within = at - chunk * chunkBytes_;
      const uint64_t n = chunkBytes_ == 0 ? end - at : std::min(end - at, chunkBytes_ - within);
      uint8_t* dst = orThrow(engine_.leaseBlockData(id_, static_cast<uint32_t>(chunk)));
      std::memcpy(dst + within, src + (at - offset), n);
      at += n;
    }
    return kj::READY_NOW;
  }
  ~WriteLeaseImpl() noexcept(false) {
    if (id_ != 0) (void)engine_.abortWrite(id_);
  }

  kj::Promise<void> write(WriteContext context) override {
    if (id_ == 0)
      throwRpcError(makeError(ErrorCode::kReleased, "write lease was committed or aborted"));
    if (blobBytes_ != 0) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument, "a blob lease takes writeBlob"));
    }
    auto p = context.getParams();
    const Layout& layout = engine_.space(space_).layout;
    const uint32_t bt = layout.blockTokens;
    const uint32_t block = p.getBlock(), firstSlot = p.getFirstSlot(), slots = p.getSlots();
    if (block >= blocks_ || firstSlot >= bt || slots == 0 || slots > bt - firstSlot) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument, "write of block ", block, " slots [",
                              firstSlot, ", +", slots, ") is outside the lease's ", blocks_,
                              " blocks of ", bt, " slots"));
    }
    const uint64_t pos = first_ + uint64_t{block} * bt + firstSlot;
    if (pos < begin_ || pos + slots > end_) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument, "write of positions [", pos, ", ",
                              pos + slots, ") is outside the granted [", begin_, ", ", end_, ")"));
    }
    auto data = p.getData();
    if (data.size() != slots * layout.tokenKvBytes()) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument, "write carries ", data.size(),
                              " bytes, expected ", slots * layout.tokenKvBytes()));
    }
    uint8_t* dst = orThrow(engine_.leaseBlockData(id_, block));
    kernels::unpackSlots({layout.numLayers, bt, layout.tokenBytes()}, dst, firstSlot, slots,
                         data.begin(), slots, 0);
    return kj::READY_NOW;
  }

  kj::Promise<void> commit(CommitContext context) override {
    auto p = context.getParams();
    std::vector<uint64_t> sums;  // the engine checks their count against the grant
    for (uint64_t sum : p.getSums()) sums.push_back(sum);
    auto r = engine_.commit(id_, p.getUpTo(), sums);
    if (!r && r.code() != ErrorCode::kInvalidArgument) id_ = 0;  // the lease ended
    const CommitResult result = orThrow(std::move(r));
    id_ = 0;
    kickSpill(cold_);
    auto out = context.getResults();
    out.setLength(result.length);
    out.setSealedBlocks(result.sealedBlocks);
    return kj::READY_NOW;
  }

  kj::Promise<void> abort(AbortContext) override {
    const LeaseId id = id_;
    id_ = 0;
    orThrow(engine_.abortWrite(id));
    return kj::READY_NOW;
  }

 private:
  Engine& engine_;
  std::shared_ptr<OwnerScope> owner_;  // a commit may create a sequence of the session's
  ColdService* cold_;
  SpaceId space_;
  LeaseId id_;
  uint64_t begin_, end_, first_;
  uint32_t blocks_;
  uint64_t blobBytes_;   // checkpoint and entry leases: the blob's size; 0 for token leases
  uint64_t chunkBytes_;  // state leases: the bytes of each chunk the blob runs over; 0 otherwise
};

// A space's RPC object (server_space.cc), for Session.open.
kj::Own<rpc::Space::Server> makeSpace(Engine& engine, std::shared_ptr<OwnerScope> scope,
                                      SpaceId space, ColdService* cold, TierService* tiers,
                                      uint8_t tier, RemoteTier* remote);

}  // namespace kvtier::server_internal
