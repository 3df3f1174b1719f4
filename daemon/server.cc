#include "daemon/server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <capnp/rpc-twoparty.h>
#include <kj/debug.h>

#include <cstdio>
#include <memory>

#include "daemon/lane.h"
#include "daemon/log.h"
#include "daemon/lookup.h"
#include "daemon/metrics.h"
#include "kernels/block_copy.h"
#include "schemas/kvtier.capnp.h"
#include "transport/buffered_stream.h"
#include "transport/pool_fds.h"
#include "transport/rpc_codec.h"
#include "transport/socket_stream.h"

namespace kvtier {
namespace {

constexpr const char* kDaemonVersion = "kvtierd 0.1.0";

// A client's name is a label for logs (hello), not a payload.
constexpr size_t kMaxClientNameBytes = 256;

// `text` for a log line: quoted, with quotes, backslashes and bytes outside printable ASCII
// escaped, so that a client's name can neither forge a log line nor a field.
std::string logQuoted(std::string_view text) {
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
capnp::ReaderOptions readerOptions() {
  capnp::ReaderOptions options;
  options.traversalLimitInWords =
      2 * (kMaxInlineBytesPerCall + (uint64_t{8} << 20)) / sizeof(capnp::word);
  options.nestingLimit = 16;
  return options;
}

std::string_view text(capnp::Text::Reader t) { return std::string_view(t.cStr(), t.size()); }

std::vector<uint32_t> tokensFrom(capnp::List<uint32_t>::Reader list) {
  if (list.size() > kMaxTokensPerCall) {
    throwRpcError(
        makeError(ErrorCode::kInvalidArgument, list.size(), " tokens exceed ", kMaxTokensPerCall));
  }
  std::vector<uint32_t> out(list.size());
  for (uint32_t i = 0; i < list.size(); ++i) out[i] = list[i];
  return out;
}

std::vector<Key128> keysFrom(capnp::List<capnp::Data>::Reader list) {
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
void kickSpill(ColdService* cold) {
  if (cold) cold->kick();
}

SeqOptions optionsFrom(rpc::SeqOptions::Reader in) {
  return SeqOptions{in.getDetached(), in.getWindow(), in.getChunk()};
}

Key128 keyFrom(capnp::Data::Reader in) {
  Key128 key;
  if (in.size() != key.bytes.size()) {
    throwRpcError(makeError(ErrorCode::kInvalidArgument, "key has ", in.size(), " bytes, not 16"));
  }
  std::memcpy(key.bytes.data(), in.begin(), in.size());
  return key;
}

void setSnapshot(rpc::SnapshotInfo::Builder out, const SnapshotInfo& info,
                 const RemoteTier* remote) {
  if (remote) out.setNode(remote->nodeId());
  out.setId(info.id);
  out.setFrom(info.from);
  out.setTo(info.to);
  auto positions = out.initCheckpoints(info.checkpoints.size());
  for (uint32_t i = 0; i < info.checkpoints.size(); ++i) positions.set(i, info.checkpoints[i]);
}

template <typename Builder>
void setBlocks(Builder&& out, const std::vector<BlockLocation>& blocks) {
  for (uint32_t i = 0; i < blocks.size(); ++i) blockToRpc(blocks[i], out[i]);
}

void setSums(capnp::List<uint64_t>::Builder out, const std::vector<uint64_t>& sums) {
  for (uint32_t i = 0; i < sums.size(); ++i) out.set(i, sums[i]);
}

// Copies whole blocks into the result for clients that cannot map the pool. Blocks in GPU memory
// never travel inline: the read lease that holds them is released and the call fails, typed.
void setInlineData(capnp::List<capnp::Data>::Builder out, Engine& engine,
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

void checkInlineBytes(size_t blocks, uint32_t blockBytes) {
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

rpc::ReadLease::Client readLease(Engine& engine, LeaseId id, ColdService* cold) {
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

class SpaceImpl final : public rpc::Space::Server {
 public:
  SpaceImpl(Engine& engine, std::shared_ptr<OwnerScope> scope, SpaceId space, ColdService* cold,
            TierService* tiers, uint8_t tier, RemoteTier* remote)
      : engine_(engine),
        scope_(std::move(scope)),
        owner_(scope_->id()),
        space_(space),
        cold_(cold),
        tiers_(tiers),
        remote_(remote),
        tier_(tier) {}

  kj::Promise<void> put(PutContext context) override {
    return whenRoom([this, context]() mutable {
      auto p = context.getParams();
      const auto tokens = tokensFrom(p.getTokens());
      const uint64_t begin = p.getBegin();
      const PutGrant g =
          orThrow(engine_.put(owner_, space_, text(p.getSeq()), begin, tokens,
                              keysFrom(p.getKeys()), optionsFrom(p.getOptions()), tier_));
      if (tier_ != 0 && tiers_) tiers_->kick();  // the GPU pool filled: demote behind it
      auto out = context.getResults();
      out.setFirstPosition(g.firstPosition);
      setBlocks(out.initBlocks(g.blocks.size()), g.blocks);
      out.setLease(kj::heap<WriteLeaseImpl>(engine_, scope_, space_, g.lease, begin,
                                            begin + tokens.size(), g.firstPosition,
                                            static_cast<uint32_t>(g.blocks.size()), cold_));
    });
  }

  kj::Promise<void> get(GetContext context) override {
    auto p = context.getParams();
    if (p.getInline()) {
      // Check the size before pinning anything.
      auto length = orThrow(engine_.length(space_, text(p.getSeq())));
      if (length) {
        const uint32_t bt = engine_.space(space_).layout.blockTokens;
        const uint64_t end = std::min(p.getEnd(), *length);
        if (p.getBegin() < end)
          checkInlineBytes((end + bt - 1) / bt - p.getBegin() / bt, blockBytes());
      }
    }
    ReadGrant grant =
        orThrow(engine_.get(space_, text(p.getSeq()), p.getBegin(), p.getEnd(), tier_));
    auto out = context.getResults();
    out.setFirstPosition(grant.firstPosition);
    out.setEnd(grant.end);
    setBlocks(out.initBlocks(grant.blocks.size()), grant.blocks);
    setSums(out.initSums(static_cast<uint32_t>(grant.sums.size())), grant.sums);
    if (p.getInline()) {
      setInlineData(out.initData(grant.blocks.size()), engine_, grant.blocks, grant.lease);
    }
    out.setLease(readLease(engine_, grant.lease, cold_));
    return kj::READY_NOW;
  }

  kj::Promise<void> lookup(LookupContext context) override {
    auto p = context.getParams();
    auto tokens = tokensFrom(p.getTokens());
    auto keys = keysFrom(p.getKeys());
    std::string bindSeq(text(p.getBindSeq()));
    const SeqOptions options = optionsFrom(p.getOptions());
    const bool inlineData = p.getInline();
    std::vector<Key128> chain;  // the prompt's keys the plan hashed: the lookup reuses them
    KJ_IF_MAYBE (ready,
                 prepareLookup(site(), tokens, keys, p.getRemote(), chain, !bindSeq.empty())) {
      return ready->then([this, context = kj::mv(context), tokens = std::move(tokens),
                          keys = std::move(keys), bindSeq = std::move(bindSeq), options, inlineData,
                          chain = std::move(chain)]() mutable {
        answerLookup(context, tokens, keys, bindSeq, options, inlineData, chain);
      });
    }
    answerLookup(context, tokens, keys, bindSeq, options, inlineData, chain);
    return kj::READY_NOW;
  }

  LookupSite site() const {
    return LookupSite{engine_, cold_, tiers_, remote_, owner_, space_, tier_};
  }

  void answerLookup(LookupContext& context, const std::vector<uint32_t>& tokens,
                    const std::vector<Key128>& keys, const std::string& bindSeq,
                    const SeqOptions& options, bool inlineData, const std::vector<Key128>& chain) {
    // An inline answer's bound is checked before the lookup binds anything.
    const size_t maxBlocks = inlineData ? kMaxInlineBytesPerCall / blockBytes() : SIZE_MAX;
    LookupResult result = orThrow(engine_.lookup(owner_, space_, tokens, keys, bindSeq, options,
                                                 chain, tier_, LookupFor::kClient, maxBlocks));
    auto out = context.getResults();
    out.setMatchedTokens(result.matchedTokens);
    setBlocks(out.initBlocks(result.blocks.size()), result.blocks);
    out.setStateBlocks(result.stateBlocks);
    setSums(out.initSums(static_cast<uint32_t>(result.sums.size())), result.sums);
    if (inlineData) {
      setInlineData(out.initData(result.blocks.size()), engine_, result.blocks, result.lease);
    }
    out.setLease(readLease(engine_, result.lease, cold_));
  }

  kj::Promise<void> copyPrefix(CopyPrefixContext context) override {
    return whenRoom([this, context]() mutable {
      auto p = context.getParams();
      orThrow(engine_.copyPrefix(owner_, space_, text(p.getSrc()), text(p.getDst()), p.getLen(),
                                 optionsFrom(p.getOptions())));
    });
  }

  kj::Promise<void> remove(RemoveContext context) override {
    auto p = context.getParams();
    orThrow(engine_.remove(space_, text(p.getSeq()), p.getBegin(), p.getEnd()));
    kickSpill(cold_);
    return kj::READY_NOW;
  }

  kj::Promise<void> truncate(TruncateContext context) override {
    auto p = context.getParams();
    orThrow(engine_.truncate(space_, text(p.getSeq()), p.getLen()));
    kickSpill(cold_);
    return kj::READY_NOW;
  }

  kj::Promise<void> canResume(CanResumeContext context) override {
    auto p = context.getParams();
    context.getResults().setOk(orThrow(engine_.canResume(space_, text(p.getSeq()), p.getPos())));
    return kj::READY_NOW;
  }

  kj::Promise<void> length(LengthContext context) override {
    auto length = orThrow(engine_.length(space_, text(context.getParams().getSeq())));
    auto out = context.getResults();
    out.setExists(length.has_value());
    out.setLength(length.value_or(0));
    return kj::READY_NOW;
  }

  kj::Promise<void> read(ReadContext context) override {
    auto refs = context.getParams().getRefs();
    if (refs.size() > kMaxRefsPerRead) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument, refs.size(), " references exceed ",
                              kMaxRefsPerRead));
    }
    checkInlineBytes(refs.size(), blockBytes());
    std::vector<const uint8_t*> data;
    for (auto ref : refs) data.push_back(orThrow(engine_.resolveSealed(space_, blockFromRpc(ref))));
    auto out = context.getResults().initData(refs.size());
    for (uint32_t i = 0; i < refs.size(); ++i)
      out.set(i, capnp::Data::Reader(data[i], blockBytes()));
    return kj::READY_NOW;
  }

  // Snapshot calls: a new snapshot is written to the cold tier behind the call (kickSpill); an
  // id unknown in memory may be a snapshot on disk (after a restart), brought back first.
  kj::Promise<void> snapshot(SnapshotContext context) override {
    return whenRoom([this, context]() mutable {
      auto p = context.getParams();
      setSnapshot(context.getResults().initSnapshot(),
                  orThrow(engine_.snapshot(space_, text(p.getSeq()), p.getFrom())), remote_);
      kickSpill(cold_);
    });
  }

  kj::Promise<void> restore(RestoreContext context) override {
    const SnapshotId id = context.getParams().getSnapshot();
    const std::string node(text(context.getParams().getNode()));
    if (!node.empty() && (!remote_ || node != remote_->nodeId())) {
      if (!remote_) {
        throwRpcError(makeError(ErrorCode::kInvalidArgument, "snapshot ", node, ":", id,
                                " is on another node, and this kvtierd is not in a cluster"));
      }
      if (id == 0) throwRpcError(makeError(ErrorCode::kInvalidArgument, "a rewind is local"));
      // Pulled here as a snapshot of this node's (its bytes checked), restored from, then
      // dropped: the sequence shares its blocks.
      return remote_->pullSnapshot(space_, node, id)
          .then([this, context](SnapshotId local) mutable {
            auto p = context.getParams();
            Status s = engine_.restore(owner_, space_, text(p.getSeq()), local, p.getTarget(),
                                       optionsFrom(p.getOptions()));
            (void)engine_.dropSnapshot(space_, local);
            kickSpill(cold_);
            orThrow(std::move(s));
          });
    }
    return whenRoomWithSnapshots({id}, [this, context]() mutable {
      auto p = context.getParams();
      std::optional<SnapshotId> snap;
      if (p.getSnapshot() != 0) snap = p.getSnapshot();
      orThrow(engine_.restore(owner_, space_, text(p.getSeq()), snap, p.getTarget(),
                              optionsFrom(p.getOptions())));
    });
  }

  kj::Promise<void> copySnapshot(CopySnapshotContext context) override {
    auto p = context.getParams();
    const std::string node(text(p.getNode()));
    const SnapshotId id = p.getSnapshot();
    if (!remote_) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument, "this kvtierd is not in a cluster"));
    }
    if (node == remote_->nodeId()) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument, "snapshot ", node, ":", id,
                              " is on this node already"));
    }
    const bool move = p.getMove();
    return remote_->pullSnapshot(space_, node, id)
        .then([this, context, node, id, move](SnapshotId local) mutable -> kj::Promise<void> {
          // Kept: written to this node's cold tier behind the call, like any new snapshot.
          engine_.queueSnapshotWrite(space_, local);
          kickSpill(cold_);
          setSnapshot(context.getResults().initSnapshot(),
                      orThrow(engine_.snapshotInfo(space_, local)), remote_);
          if (!move) return kj::READY_NOW;
          // The source drops its copy only now that this node holds the snapshot, sealed.
          return remote_->dropRemoteSnapshot(space_, node, id);
        });
  }

  kj::Promise<void> pushBlocks(PushBlocksContext context) override {
    auto p = context.getParams();
    const std::string node(text(p.getNode()));
    if (!remote_) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument, "this kvtierd is not in a cluster"));
    }
    if (node == remote_->nodeId()) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument, "node ", node, " is this node"));
    }
    const bool move = p.getMove();
    const std::string seq(text(p.getSeq()));
    uint64_t end = p.getEnd();
    std::vector<Key128> keys;
    if (!seq.empty()) {
      keys = orThrow(engine_.sequenceKeys(space_, seq, p.getBegin(), end, /*whole=*/move));
      // A range move removes what was asked when it was asked, not what was appended since.
      end = std::min<uint64_t>(end, orThrow(engine_.length(space_, seq)).value_or(0));
    } else if (p.hasKeys() && p.getKeys().size() > 0) {
      keys = keysFrom(p.getKeys());
    } else {
      keys = orThrow(engine_.chainKeys(space_, tokensFrom(p.getTokens()), {}, {}));
    }
    // The peer reads blocks from memory: those only on this node's disk come back first.
    std::vector<Key128> cold;
    for (const Key128& k : keys) {
      if (cold_ && !engine_.indexed(space_, k)) cold.push_back(k);
    }
    kj::Promise<void> ready = kj::READY_NOW;
    if (!cold.empty()) ready = cold_->promote(space_, std::move(cold));
    return ready
        .then([this, node, keys]() mutable { return remote_->pushBlocks(space_, node, keys); })
        .then([this, context, node, keys, seq, begin = p.getBegin(), end,
               move](size_t held) mutable -> kj::Promise<void> {
          auto out = context.getResults();
          out.setBlocks(static_cast<uint32_t>(keys.size()));
          out.setHeld(static_cast<uint32_t>(held));
          if (!move) return kj::READY_NOW;
          if (held < keys.size()) {
            throwRpcError(makeError(ErrorCode::kUnavailable, "node ", node, " holds ", held,
                                    " of the ", keys.size(),
                                    " blocks: this node keeps its copy (nothing moved)"));
          }
          // The destination holds every block, sealed: only now does the source let go.
          if (!seq.empty()) orThrow(engine_.remove(space_, seq, begin, end));
          out.setDropped(static_cast<uint32_t>(engine_.dropCached(space_, keys)));
          if (!cold_) return kj::READY_NOW;
          return cold_->eraseBlocks(space_, std::move(keys)).ignoreResult();
        });
  }

  kj::Promise<void> mergeSnapshots(MergeSnapshotsContext context) override {
    const auto p = context.getParams();
    return whenRoomWithSnapshots({p.getA(), p.getB()}, [this, context]() mutable {
      auto p = context.getParams();
      setSnapshot(context.getResults().initSnapshot(),
                  orThrow(engine_.mergeSnapshots(space_, p.getA(), p.getB())), remote_);
      kickSpill(cold_);
    });
  }

  kj::Promise<void> splitSnapshot(SplitSnapshotContext context) override {
    return whenRoomWithSnapshots({context.getParams().getSnapshot()}, [this, context]() mutable {
      auto p = context.getParams();
      auto [left, right] = orThrow(engine_.splitSnapshot(space_, p.getSnapshot(), p.getAt()));
      setSnapshot(context.getResults().initLeft(), left, remote_);
      setSnapshot(context.getResults().initRight(), right, remote_);
      kickSpill(cold_);
    });
  }

  kj::Promise<void> snapshotInfo(SnapshotInfoContext context) override {
    return withSnapshots({context.getParams().getSnapshot()}, [this, context]() mutable {
      setSnapshot(context.getResults().initSnapshot(),
                  orThrow(engine_.snapshotInfo(space_, context.getParams().getSnapshot())),
                  remote_);
      return kj::Promise<void>(kj::READY_NOW);
    });
  }

  kj::Promise<void> dropSnapshot(DropSnapshotContext context) override {
    const SnapshotId id = context.getParams().getSnapshot();
    if (cold_) return cold_->dropSnapshot(space_, id);  // in memory, on disk, or both
    orThrow(engine_.dropSnapshot(space_, id));
    return kj::READY_NOW;
  }

  kj::Promise<void> putCheckpoint(PutCheckpointContext context) override {
    return whenRoom([this, context]() mutable {
      auto p = context.getParams();
      const BlobGrant grant =
          orThrow(engine_.putCheckpoint(space_, text(p.getSeq()), p.getPos(), p.getBytes()));
      setBlobGrant(context.getResults(), grant);
    });
  }

  kj::Promise<void> getCheckpoint(GetCheckpointContext context) override {
    auto p = context.getParams();
    const BlobGrant grant = orThrow(engine_.getCheckpoint(space_, text(p.getSeq()), p.getPos()));
    setBlobRead(context.getResults(), grant, p.getInline());
    return kj::READY_NOW;
  }

  kj::Promise<void> checkpoints(CheckpointsContext context) override {
    const auto positions =
        orThrow(engine_.checkpointPositions(space_, text(context.getParams().getSeq())));
    auto out = context.getResults().initPositions(positions.size());
    for (uint32_t i = 0; i < positions.size(); ++i) out.set(i, positions[i]);
    return kj::READY_NOW;
  }

  kj::Promise<void> putState(PutStateContext context) override {
    return whenRoom([this, context]() mutable {
      auto p = context.getParams();
      const PutGrant g =
          orThrow(engine_.putState(space_, tokensFrom(p.getTokens()), keysFrom(p.getKeys())));
      auto out = context.getResults();
      out.setPosition(g.firstPosition);
      setBlocks(out.initBlocks(g.blocks.size()), g.blocks);
      const auto chunks = static_cast<uint32_t>(g.blocks.size());
      out.setLease(kj::heap<WriteLeaseImpl>(engine_, scope_, space_, g.lease, 0, 0, 0, chunks,
                                            cold_, uint64_t{chunks} * blockBytes(), blockBytes()));
    });
  }

  kj::Promise<void> reportCorrupt(ReportCorruptContext context) override {
    auto refs = context.getParams().getRefs();
    if (refs.size() > kMaxRefsPerRead) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument, "a report of ", refs.size(),
                              " blocks exceeds ", kMaxRefsPerRead));
    }
    std::vector<BlockLocation> locations;
    locations.reserve(refs.size());
    for (auto r : refs) locations.push_back(blockFromRpc(r));
    const size_t dropped = engine_.dropCorrupt(space_, locations);
    if (dropped > 0) logWarn("blocks_corrupt", "dropped=" + std::to_string(dropped));
    context.getResults().setDropped(static_cast<uint32_t>(dropped));
    return kj::READY_NOW;
  }

  kj::Promise<void> putEntry(PutEntryContext context) override {
    return whenRoom([this, context]() mutable {
      auto p = context.getParams();
      const BlobGrant grant = orThrow(engine_.putEntry(space_, keyFrom(p.getKey()), p.getBytes()));
      setBlobGrant(context.getResults(), grant);
    });
  }

  kj::Promise<void> getEntry(GetEntryContext context) override {
    auto p = context.getParams();
    const BlobGrant grant = orThrow(engine_.getEntry(space_, keyFrom(p.getKey())));
    setBlobRead(context.getResults(), grant, p.getInline());
    return kj::READY_NOW;
  }

 private:
  uint32_t blockBytes() const { return engine_.space(space_).blockBytes; }

  // Runs `attempt`, which fills the call's results or throws. When it fails with FULL while the
  // pool holds blocks that may go once they are on disk, waits for the spill batch in flight and
  // tries again (bounded), instead of failing a call that memory can serve in a moment; likewise
  // for UNAVAILABLE while snapshot ids are being reserved (ColdService::whenRetryable).
  template <typename Attempt>
  kj::Promise<void> whenRoom(Attempt attempt) {
    return kj::evalNow([&]() -> kj::Promise<void> {
      KJ_IF_MAYBE (retries, tryWithRoom(site(), kj::mv(attempt))) return kj::mv(*retries);
      return kj::READY_NOW;
    });
  }

  // Brings the snapshots among `ids` that memory does not hold back from the cold tier, if it
  // has them (after a restart), then runs `next` (which returns a promise). A snapshot that
  // cannot be brought back fails the call with its typed error and changes nothing.
  template <typename Next>
  kj::Promise<void> withSnapshots(std::initializer_list<SnapshotId> ids, Next next) {
    kj::Vector<kj::Promise<void>> loads;
    if (cold_) {
      for (SnapshotId id : ids) {
        if (id != 0 && !engine_.hasSnapshot(space_, id)) loads.add(cold_->loadSnapshot(space_, id));
      }
    }
    if (loads.empty()) return next();
    return kj::joinPromises(loads.releaseAsArray()).then(kj::mv(next));
  }

  // whenRoom(attempt) once the snapshots `ids` are in memory (brought back from disk if needed).
  template <typename Attempt>
  kj::Promise<void> whenRoomWithSnapshots(std::initializer_list<SnapshotId> ids, Attempt attempt) {
    return withSnapshots(
        ids, [this, attempt = kj::mv(attempt)]() mutable { return whenRoom(kj::mv(attempt)); });
  }

  template <typename Results>
  void setBlobGrant(Results out, const BlobGrant& grant) {
    blockToRpc(grant.block, out.initBlock());
    out.setLease(kj::heap<WriteLeaseImpl>(engine_, scope_, space_, grant.lease, 0, 0, 0, 1, cold_,
                                          grant.bytes));
  }

  template <typename Results>
  void setBlobRead(Results out, const BlobGrant& grant, bool inlineData) {
    blockToRpc(grant.block, out.initBlock());
    out.setBytes(grant.bytes);
    if (inlineData) {
      if (grant.bytes > kMaxInlineBytesPerCall) {
        (void)engine_.releaseRead(grant.lease);
        checkInlineBytes(1, static_cast<uint32_t>(grant.bytes));
      }
      const uint8_t* base = engine_.memory().extentBase(grant.block.extent) + grant.block.offset;
      out.setData(capnp::Data::Reader(base, grant.bytes));
    }
    out.setLease(readLease(engine_, grant.lease, cold_));
  }

  Engine& engine_;
  std::shared_ptr<OwnerScope> scope_;
  OwnerId owner_;
  SpaceId space_;
  ColdService* cold_;
  TierService* tiers_;
  RemoteTier* remote_;
  uint8_t tier_;  // where puts allocate and lookups bring blocks: 0 host, 1 + d GPU d
};

class SessionImpl final : public rpc::Session::Server {
 public:
  // `mapsPool`: the peer may be handed the pools' handles (peerMapsPool, daemon/access.h).
  SessionImpl(kvtier::Server& server, OwnerId owner, Salt salt, bool mapsPool,
              const PeerCredentials& peer)
      : server_(server),
        owner_(std::make_shared<OwnerScope>(server.engine(), server.cold(), owner)),
        salt_(salt),
        mapsPool_(mapsPool),
        lane_(LookupSite{server.engine(), server.cold(), server.tiers(), server.remote(), owner},
              peer, server.laneStats()) {
    server_.sessionOpened();
    server_.addLane(lane_);
  }
  ~SessionImpl() noexcept(false) {
    server_.removeLane(lane_);
    lane_.close();  // its leases go before the owner's sequences
    const OwnerId owner = owner_->id();
    owner_.reset();  // the sequences go now, or with the last of its spaces and write leases
    server_.sessionClosed();
    logInfo("session_closed", "owner=" + std::to_string(owner));
  }

  kj::Promise<void> open(OpenContext context) override {
    const Layout layout = layoutFromRpc(context.getParams().getLayout());
    const int device = context.getParams().getDevice();
    const GpuPoolExport* gpu = nullptr;
    for (const auto& g : server_.gpus()) {
      if (g.device == device) gpu = &g;
    }
    if (device != -1 && !gpu) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument,
                              "this kvtierd has no GPU pool on device ", device));
    }
    // A CUDA IPC handle maps the whole GPU pool, every tenant's blocks: only root and the
    // daemon's own user get one (GPU blocks never travel inline).
    if (gpu && !mapsPool_) {
      throwRpcError(makeError(
          ErrorCode::kPermissionDenied, "GPU pools are mapped only by root and ",
          "the daemon's user: open the space with device -1 (host pool, ", "bytes inline)"));
    }
    const SpaceId space = orThrow(server_.engine().openSpace(layout, salt_, !mapsPool_));
    auto out = context.getResults();
    out.setFingerprint(server_.engine().space(space).fingerprint);
    out.setBlockBytes(server_.engine().space(space).blockBytes);
    auto& pool = server_.hostPool();
    const size_t gpuExtents = gpu ? gpu->extents.size() : 0;
    auto extents = out.initExtents(pool.extentCount() + gpuExtents);
    for (uint32_t i = 0; i < pool.extentCount(); ++i) {
      extents[i].setId(i);
      // The segment's name (or descriptor) maps the whole pool: for root and the daemon's own
      // user only (the segment is theirs, 0600). Other tenants get neither and move bytes inline.
      const ShmSegment& segment = pool.segment(i);
      if (mapsPool_ && segment.anonymous()) {
        extents[i].setByDescriptor(true);  // fetched by a pool_fds connection (servePoolFds)
      } else if (mapsPool_) {
        extents[i].setShmName(segment.name());
      }
      extents[i].setBytes(segment.size());
    }
    for (uint32_t i = 0; i < gpuExtents; ++i) {
      auto x = extents[pool.extentCount() + i];
      x.setId(gpu->extents[i].id);
      x.setBytes(gpu->extents[i].bytes);
      x.setDevice(gpu->device);
      x.setIpcHandle(
          capnp::Data::Reader(gpu->extents[i].ipcHandle.data(), gpu->extents[i].ipcHandle.size()));
    }
    const uint8_t tier = gpu ? gpu->tier : uint8_t{0};
    out.setSpace(kj::heap<SpaceImpl>(server_.engine(), owner_, space, server_.cold(),
                                     server_.tiers(), tier, server_.remote()));
    out.setLane(lane_.addSpace(space, tier));
    return kj::READY_NOW;
  }

  kj::Promise<void> cluster(ClusterContext context) override {
    auto out = context.getResults();
    auto* remote = server_.remote();
    if (!remote) return kj::READY_NOW;
    const auto members = remote->members();
    out.setNodeId(remote->nodeId());
    auto list = out.initMembers(members.size());
    for (uint32_t i = 0; i < members.size(); ++i) {
      list[i].setNodeId(members[i].nodeId);
      list[i].setAddress(members[i].address);
      list[i].setUp(members[i].up);
      list[i].setSelf(members[i].self);
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> drain(DrainContext context) override {
    auto* remote = server_.remote();
    if (!remote) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument, "this kvtierd is not in a cluster"));
    }
    auto p = context.getParams();
    return remote->drainStep(p.getMaxSnapshots(), p.getMaxBlocks())
        .then([context](DrainProgress d) mutable {
          auto out = context.getResults().initProgress();
          out.setSnapshotsMoved(d.snapshotsMoved);
          out.setBlocksCopied(d.blocksCopied);
          out.setSnapshotsLeft(d.snapshotsLeft);
          out.setBlocksLeft(d.blocksLeft);
          out.setFailures(d.failures);
        });
  }

  const Lane::Token& laneToken() const { return lane_.token(); }

  kj::Promise<void> stats(StatsContext context) override {
    const EngineStats s = server_.engine().stats();
    auto out = context.getResults().initStats();
    out.setBlocksTotal(s.blocksTotal);
    out.setBlocksUsed(s.blocksUsed);
    out.setBlocksPinned(s.blocksPinned);
    out.setBlocksCached(s.blocksCached);
    out.setBytesTotal(s.bytesTotal);
    out.setBytesUsed(s.bytesUsed);
    out.setHits(s.hits);
    out.setMisses(s.misses);
    out.setEvictions(s.evictions);
    out.setBlocksCorrupt(s.corruptBlocks);
    out.setClients(server_.sessions());
    out.setSequences(s.sequences);
    out.setReadLeases(s.readLeases);
    out.setWriteLeases(s.writeLeases);
    out.setBytesPut(s.bytesPut);
    out.setBytesGot(s.bytesGot);
    out.setSnapshots(s.snapshots);
    out.setEntries(s.entries);
    out.setCheckpoints(s.checkpoints);
    out.setSpilled(s.spilled);
    out.setPromoted(s.promoted);
    out.setEvictedUnspilled(s.evictedUnspilled);
    out.setGpuBlocksTotal(s.gpuBlocksTotal);
    out.setGpuBlocksUsed(s.gpuBlocksUsed);
    out.setGpuDemoted(s.gpuDemoted);
    out.setGpuPromoted(s.gpuPromoted);
    // The asking tenant's own usage only: other tenants' are for the operator (metrics).
    out.setTenantBytesUsed(server_.engine().tenantBytesUsed(salt_));
    out.setTenantQuotaBytes(s.tenantQuotaBytes);
    const LaneStats& lanes = server_.laneStats();
    out.setLaneLookups(lanes.lookups);
    out.setLanesAttached(lanes.attached);
    out.setLanesRefused(lanes.refused);
    out.setLanePuts(lanes.puts);
    out.setPoolPages(pageKindName(server_.hostPool().pages()));
    out.setPoolPagesReason(server_.hostPool().pagesReason());
    if (auto* cold = server_.cold()) {
      const ColdServiceStats c = cold->stats();
      out.setColdRecords(c.tier.records);
      out.setColdBytes(c.tier.bytes);
      out.setColdDiskBytes(c.tier.diskBytes);
      out.setCorruptDropped(c.tier.corruptDropped);
      out.setColdQuarantined(c.tier.quarantined);
      out.setSpillErrors(c.spillErrors);
      out.setColdEvicted(c.tier.capacityEvicted);
      out.setColdSnapshots(c.tier.snapshots);
      out.setColdSnapshotsDropped(c.tier.snapshotsDropped);
    }
    if (auto* remote = server_.remote()) {
      const RemoteStats r = remote->stats();
      out.setClusterMembers(r.members);
      out.setClusterMembersUp(r.membersUp);
      out.setDirectoryEntries(r.directoryEntries);
      out.setHeldKeys(r.heldKeys);
      out.setPublishBacklog(r.publishBacklog);
      out.setDirectoryRehomed(r.rehomed);
      out.setRemoteLookups(r.remoteLookups);
      out.setRemoteLookupsCut(r.remoteLookupsCut);
      out.setLookupPeerMessages(r.lookupPeerMessages);
      out.setLookupPeerMessagesMax(r.lookupPeerMessagesMax);
      out.setDirectoryQueries(r.directoryQueries);
      out.setDirectoryKeys(r.directoryKeys);
      out.setRemoteHitBlocks(r.remoteHitBlocks);
      out.setRemoteHitBytes(r.remoteHitBytes);
      out.setServedBlocks(r.servedBlocks);
      out.setFetchTimeouts(r.fetchTimeouts);
      out.setFetchUnavailable(r.fetchUnavailable);
      out.setFetchTransfer(r.fetchTransfer);
      out.setFetchChecksum(r.fetchChecksum);
      out.setFetchFull(r.fetchFull);
      out.setPeerAuthFailures(r.authFailures);
      out.setPeerRttMicros(r.peerRttMicros);
    }
    auto spaces = out.initSpaces(s.spaces.size());
    for (uint32_t i = 0; i < s.spaces.size(); ++i) {
      spaces[i].setFingerprint(s.spaces[i].fingerprint);
      spaces[i].setBlockBytes(s.spaces[i].blockBytes);
      spaces[i].setBlocksTotal(s.spaces[i].blocksTotal);
      spaces[i].setBlocksUsed(s.spaces[i].blocksUsed);
      spaces[i].setSequences(s.spaces[i].sequences);
    }
    return kj::READY_NOW;
  }

 private:
  kvtier::Server& server_;
  std::shared_ptr<OwnerScope> owner_;
  Salt salt_;
  bool mapsPool_;
  Lane lane_;
};

class DaemonImpl final : public rpc::Daemon::Server {
 public:
  DaemonImpl(kvtier::Server& server, PeerCredentials peer, bool allowed)
      : server_(server), peer_(peer), allowed_(allowed) {}

  kj::Promise<void> hello(HelloContext context) override {
    if (!allowed_) {
      throwRpcError(makeError(ErrorCode::kPermissionDenied, "uid ", peer_.uid,
                              " may not use this kvtierd: only root, its user and members of ",
                              "group ", server_.access().allowedGid, " (--allow-group) may"));
    }
    auto p = context.getParams();
    if (p.getClientName().size() > kMaxClientNameBytes) {
      throwRpcError(makeError(ErrorCode::kInvalidArgument, "client name of ",
                              p.getClientName().size(), " bytes exceeds ", kMaxClientNameBytes));
    }
    if (p.getProtocolVersion() != rpc::PROTOCOL_VERSION) {
      throwRpcError(makeError(ErrorCode::kProtocolMismatch, "client speaks protocol ",
                              p.getProtocolVersion(), ", this daemon speaks ",
                              rpc::PROTOCOL_VERSION));
    }
    // Tenancy: by default each Unix user is its own tenant, so two users never share blocks.
    const std::string tenant = "uid:" + std::to_string(peer_.uid);
    const Salt salt = saltFor(tenant);
    server_.nameTenant(salt, tenant);
    const OwnerId owner = server_.newOwner();
    logInfo("session_opened", "owner=" + std::to_string(owner) + " pid=" +
                                  std::to_string(peer_.pid) + " uid=" + std::to_string(peer_.uid) +
                                  " client=" + logQuoted(text(p.getClientName())));
    auto out = context.getResults();
    out.setProtocolVersion(rpc::PROTOCOL_VERSION);
    out.setDaemonVersion(kDaemonVersion);
    auto session =
        kj::heap<SessionImpl>(server_, owner, salt, peerMapsPool(peer_, server_.access()), peer_);
    const Lane::Token& token = session->laneToken();
    out.setLaneToken(capnp::Data::Reader(token.data(), token.size()));
    out.setSession(kj::mv(session));
    auto devices = out.initDevices(server_.gpus().size());
    auto pci = out.initDevicePciBusIds(server_.gpus().size());
    for (uint32_t i = 0; i < server_.gpus().size(); ++i) {
      devices.set(i, server_.gpus()[i].device);
      pci.set(i, server_.gpus()[i].pciBusId);
    }
    return kj::READY_NOW;
  }

 private:
  kvtier::Server& server_;
  PeerCredentials peer_;
  bool allowed_;
};

// One client connection: its stream, its two-party network and its RPC system.
struct Connection {
  Connection(kj::Own<kj::AsyncIoStream> s, rpc::Daemon::Client bootstrap)
      : stream(kj::mv(s)),
        network(*stream, capnp::rpc::twoparty::Side::SERVER, readerOptions()),
        rpcSystem(capnp::makeRpcServer(network, kj::mv(bootstrap))) {}
  kj::Own<kj::AsyncIoStream> stream;
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpcSystem;
};

}  // namespace

Server::Server(Engine& engine, HostPool& pool, ColdService* cold, TierService* tiers,
               std::vector<GpuPoolExport> gpus, BusyPoller* poller, RemoteTier* remote)
    : engine_(engine),
      pool_(pool),
      poller_(poller),
      cold_(cold),
      tiers_(tiers),
      remote_(remote),
      gpus_(std::move(gpus)),
      access_{static_cast<int64_t>(geteuid()), static_cast<int64_t>(getegid())},
      tasks_(*this) {}

void Server::nameTenant(const Salt& salt, std::string name) {
  for (const auto& [s, n] : tenantNames_) {
    if (s == salt) return;
  }
  tenantNames_.emplace_back(salt, std::move(name));
}

Server::~Server() = default;

kj::Promise<void> Server::acceptLoop(kj::ConnectionReceiver& listener, kj::UnixEventPort& port,
                                     kj::Timer& timer) {
  // (kj's accept() throws at once when accept(2) fails: evalNow makes that a rejection too.)
  return kj::evalNow([&listener] { return listener.accept(); })
      .then(
          [this, &listener, &port, &timer](kj::Own<kj::AsyncIoStream> stream) {
            accept(readWatchedSocket(port, kj::mv(stream)));
            return acceptLoop(listener, port, timer);
          },
          [this, &listener, &port, &timer](kj::Exception&& e) {
            logWarn("accept_failed", "reason=" + logQuoted(e.getDescription().cStr()));
            return timer.afterDelay(kAcceptRetryDelay).then([this, &listener, &port, &timer] {
              return acceptLoop(listener, port, timer);
            });
          });
}

void Server::accept(kj::Own<kj::AsyncIoStream> stream) {
  // The kernel's credentials of the peer as it connected (docs/security.md). A refused peer still
  // gets a connection, whose bootstrap answers hello with PERMISSION_DENIED and offers nothing
  // else: it learns why instead of seeing a closed socket.
  PeerCredentials peer;
  KJ_IF_MAYBE (fd, stream->getFd()) {
    auto read = readPeerCredentials(*fd, /*withGroups=*/false);
    // Supplementary groups only when the uid and the primary group do not decide already.
    if (read && !peerAllowed(*read, access_)) read = readPeerCredentials(*fd, true);
    if (read) {
      peer = std::move(read).value();
    } else {
      logWarn("peer_credentials_unavailable", read.error().message());
    }
  } else {
    logWarn("peer_credentials_unavailable", "the connection has no socket descriptor");
  }
  const bool allowed = peerAllowed(peer, access_);
  if (!allowed) {
    logWarn("peer_refused",
            describePeer(peer) + " allowed_gid=" + std::to_string(access_.allowedGid));
  }
  // A session's fast lane starts with lane::kMagic, a request for the pool's descriptors with
  // pool_fds::kMagic, a Cap'n Proto connection with its first message's segment count (never
  // that large): the first four bytes tell which this is, and a Cap'n Proto connection gets them
  // back.
  auto buffered = kj::heap<BufferedIoStream>(kj::mv(stream), poller_);
  auto first = kj::heap<uint32_t>(0);
  auto read = buffered->tryRead(first.get(), sizeof(uint32_t), sizeof(uint32_t));
  tasks_.add(read.then([this, buffered = kj::mv(buffered), first = kj::mv(first), peer,
                        allowed](size_t n) mutable -> kj::Promise<void> {
    if (n == sizeof(uint32_t) && *first == lane::kMagic && allowed) {
      return attachLane(kj::mv(buffered), peer);
    }
    if (n == sizeof(uint32_t) && *first == pool_fds::kMagic && allowed) {
      return servePoolFds(kj::mv(buffered), peer);
    }
    buffered->unread(n);
    serveRpc(kj::mv(buffered), peer, allowed);
    return kj::READY_NOW;
  }));
}

void Server::serveRpc(kj::Own<kj::AsyncIoStream> stream, const PeerCredentials& peer,
                      bool allowed) {
  auto connection =
      kj::heap<Connection>(kj::mv(stream), kj::heap<DaemonImpl>(*this, peer, allowed));
  auto done = connection->network.onDisconnect();
  tasks_.add(done.attach(kj::mv(connection)));
}

kj::Promise<void> Server::attachLane(kj::Own<kj::AsyncIoStream> stream,
                                     const PeerCredentials& peer) {
  // The rest of the Attach: version and token.
  auto attach = kj::heap<lane::Attach>();
  auto* rest = reinterpret_cast<kj::byte*>(attach.get()) + sizeof(uint32_t);
  const size_t restBytes = sizeof(lane::Attach) - sizeof(uint32_t);
  auto read = stream->tryRead(rest, restBytes, restBytes);
  return read.then([this, stream = kj::mv(stream), attach = kj::mv(attach), peer,
                    restBytes](size_t n) mutable -> kj::Promise<void> {
    Lane::Token token;
    std::memcpy(token.data(), attach->token, token.size());
    auto found = lanes_.find(token);
    Lane* lane = found == lanes_.end() ? nullptr : found->second;
    const char* refused = nullptr;
    if (n < restBytes) {
      refused = "the connection ended inside the attach";
    } else if (attach->version != lane::kVersion) {
      refused = "unknown lane version";
    } else if (!lane) {
      refused = "no session has this token";
    } else if (lane->attached()) {
      refused = "the session's lane is attached already";
    } else if (lane->peer().pid != peer.pid || lane->peer().uid != peer.uid) {
      refused = "the peer is not the session's process";
    }
    if (refused) {
      ++laneStats_.refused;
      logWarn("lane_refused", describePeer(peer) + " why=\"" + refused + "\"");
      return kj::READY_NOW;  // closes the connection
    }
    static constexpr uint32_t kAccepted = static_cast<uint32_t>(lane::AttachStatus::kAccepted);
    auto* s = stream.get();
    return s->write(&kAccepted, sizeof kAccepted)
        .then([this, token, stream = kj::mv(stream)]() mutable {
          // The session may have ended, or attached another lane, while this one was answered.
          auto again = lanes_.find(token);
          if (again != lanes_.end() && !again->second->attached()) {
            again->second->attach(kj::mv(stream));
          }
        });
  });
}

kj::Promise<void> Server::servePoolFds(kj::Own<kj::AsyncIoStream> stream,
                                       const PeerCredentials& peer) {
  // The rest of the Request: its version.
  auto version = kj::heap<uint32_t>(0);
  auto read = stream->tryRead(version.get(), sizeof(uint32_t), sizeof(uint32_t));
  return read.then([this, stream = kj::mv(stream), version = kj::mv(version), peer](size_t n) {
    // The connection ends with the stream, once answered (or when the peer left).
    if (n == sizeof(uint32_t)) answerPoolFds(*stream, *version, peer);
  });
}

void Server::answerPoolFds(const kj::AsyncIoStream& stream, uint32_t version,
                           const PeerCredentials& peer) {
  int fd = -1;
  KJ_IF_MAYBE (f, stream.getFd()) {
    fd = *f;
  }
  if (fd < 0) {
    logWarn("pool_fds_refused", describePeer(peer) + " why=\"the connection has no socket\"");
    return;
  }
  // The same check as for the segments' names in Session.open: the descriptors map the whole
  // pool, every tenant's blocks.
  pool_fds::ReplyStatus status = pool_fds::ReplyStatus::kAccepted;
  if (version != pool_fds::kVersion) {
    status = pool_fds::ReplyStatus::kUnknownVersion;
  } else if (!peerMapsPool(peer, access_)) {
    status = pool_fds::ReplyStatus::kRefused;
    logWarn("pool_fds_refused",
            describePeer(peer) + " why=\"only root and the daemon's user map the pool\"");
  }
  std::vector<pool_fds::ExtentFd> extents;
  for (uint32_t i = 0; i < pool_.extentCount(); ++i) {
    const ShmSegment& segment = pool_.segment(i);
    if (segment.fd() >= 0) extents.push_back({i, segment.size(), segment.fd()});
  }
  if (auto s = pool_fds::sendReply(fd, status, extents); !s) {
    logWarn("pool_fds_failed", describePeer(peer) + " why=\"" + s.error().message() + "\"");
  }
}

std::string Server::metricsText() {
  const EngineStats s = engine_.stats();
  std::string out;
  auto gauge = [&](const char* name, const char* help, uint64_t v) {
    appendMetric(out, name, "gauge", help, v);
  };
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    appendMetric(out, name, "counter", help, v);
  };
  gauge("kvtier_blocks_total", "Blocks the pool holds or can still carve.", s.blocksTotal);
  gauge("kvtier_blocks_used", "Blocks held by sequences, leases or the prefix index.",
        s.blocksUsed);
  gauge("kvtier_blocks_pinned", "Blocks pinned by leases.", s.blocksPinned);
  gauge("kvtier_blocks_cached", "Sealed blocks held by nothing (evictable).", s.blocksCached);
  gauge("kvtier_pool_bytes", "Bytes of the host pool.", s.bytesTotal);
  gauge("kvtier_pool_bytes_used", "Bytes of the host pool in use.", s.bytesUsed);
  gauge("kvtier_pool_huge_pages",
        "1 when the host pool is on 2 MiB hugetlb pages, 0 on 4 KiB pages (kvtierd --huge-pages).",
        pool_.pages() == PageKind::kHuge2M ? 1 : 0);
  counter("kvtier_lookup_hit_blocks_total", "Blocks found by lookups.", s.hits);
  counter("kvtier_lookup_misses_total", "Lookups that stopped short.", s.misses);
  counter("kvtier_evictions_total", "Blocks evicted from memory.", s.evictions);
  counter("kvtier_blocks_corrupt_total",
          "Blocks a reader found differing from their writer's checksum: out of the index, freed.",
          s.corruptBlocks);
  gauge("kvtier_clients", "Connected sessions.", sessions_);
  gauge("kvtier_sequences", "Sequences.", s.sequences);
  gauge("kvtier_read_leases", "Open read leases.", s.readLeases);
  gauge("kvtier_write_leases", "Open write leases.", s.writeLeases);
  counter("kvtier_put_bytes_total", "Committed KV bytes.", s.bytesPut);
  counter("kvtier_get_bytes_total", "KV bytes handed out under read leases.", s.bytesGot);
  gauge("kvtier_snapshots", "Snapshots.", s.snapshots);
  gauge("kvtier_gpu_blocks_total", "Blocks the GPU pools hold or can carve.", s.gpuBlocksTotal);
  gauge("kvtier_gpu_blocks_used", "GPU pool blocks in use.", s.gpuBlocksUsed);
  counter("kvtier_gpu_demoted_total", "Blocks moved from a GPU pool to the host pool.",
          s.gpuDemoted);
  counter("kvtier_gpu_promoted_total", "Blocks moved from the host pool to a GPU pool.",
          s.gpuPromoted);
  gauge("kvtier_entries", "Position-independent entries cached.", s.entries);
  counter("kvtier_lane_lookups_total", "Lookups served over sessions' fast lanes.",
          laneStats_.lookups);
  counter("kvtier_lane_puts_total", "Write leases granted over sessions' fast lanes.",
          laneStats_.puts);
  gauge("kvtier_lanes_attached", "Sessions whose fast lane is attached.", laneStats_.attached);
  counter("kvtier_lanes_refused_total", "Fast-lane attaches refused.", laneStats_.refused);
  gauge("kvtier_tenant_quota_bytes", "The most host-pool bytes one tenant may take (0: none).",
        s.tenantQuotaBytes);
  if (!s.tenants.empty()) {
    out += "# HELP kvtier_tenant_bytes_used Host-pool bytes of a tenant's blocks.\n";
    out += "# TYPE kvtier_tenant_bytes_used gauge\n";
    for (const auto& t : s.tenants) {
      std::string name;
      for (const auto& [salt, n] : tenantNames_) {
        if (salt == t.salt) name = n;
      }
      if (name.empty()) {  // a tenant whose namespace came back from disk before its hello
        static constexpr char kHex[] = "0123456789abcdef";
        name = "salt:";
        for (size_t i = 0; i < 4; ++i) {
          name += kHex[t.salt[i] >> 4];
          name += kHex[t.salt[i] & 15];
        }
      }
      out +=
          "kvtier_tenant_bytes_used{tenant=\"" + name + "\"} " + std::to_string(t.bytesUsed) + "\n";
    }
  }
  gauge("kvtier_checkpoints", "Recurrent state checkpoints.", s.checkpoints);
  counter("kvtier_spilled_blocks_total", "Blocks written to the cold tier.", s.spilled);
  counter("kvtier_promoted_blocks_total", "Blocks read back from the cold tier.", s.promoted);
  counter("kvtier_evicted_unspilled_total", "Blocks dropped while spilling was paused.",
          s.evictedUnspilled);
  if (cold_) {
    const ColdServiceStats c = cold_->stats();
    gauge("kvtier_cold_records", "Blocks held on disk.", c.tier.records);
    gauge("kvtier_cold_bytes", "Bytes of the records held on disk (what --disk-bytes bounds).",
          c.tier.bytes);
    gauge("kvtier_cold_disk_bytes",
          "Bytes of the cold tier's files, with what compaction has not yet reclaimed.",
          c.tier.diskBytes);
    counter("kvtier_cold_corrupt_dropped_total", "Records that failed their checks.",
            c.tier.corruptDropped);
    counter("kvtier_cold_quarantined_total",
            "Damaged cold tiers moved aside and replaced by an empty one.", c.tier.quarantined);
    counter("kvtier_cold_spill_errors_total", "Spill batches that failed.", c.spillErrors);
    counter("kvtier_cold_capacity_evicted_total", "Records dropped for the disk bound.",
            c.tier.capacityEvicted);
    gauge("kvtier_cold_spill_paused", "1 while spilling is paused by disk errors.", c.spillPaused);
    gauge("kvtier_cold_snapshots", "Snapshot manifests held on disk.", c.tier.snapshots);
    counter("kvtier_cold_snapshots_dropped_total",
            "Snapshots dropped from disk: their manifest or a record they need failed or was gone.",
            c.tier.snapshotsDropped);
  }
  if (remote_) {
    const RemoteStats r = remote_->stats();
    gauge("kvtier_cluster_members", "Cluster members known, self included.", r.members);
    gauge("kvtier_cluster_members_up", "Live cluster members, self included.", r.membersUp);
    gauge("kvtier_directory_entries", "Directory entries this node is a home of.",
          r.directoryEntries);
    gauge("kvtier_directory_keys", "Distinct block keys this node is the first directory home of.",
          r.directoryKeys);
    gauge("kvtier_directory_held_keys", "Block keys this node holds, as published.", r.heldKeys);
    gauge("kvtier_publish_backlog", "Directory messages not yet sent to their homes.",
          r.publishBacklog);
    counter("kvtier_directory_rehomed_total", "Keys re-sent because their home changed.",
            r.rehomed);
    counter("kvtier_remote_lookups_total", "Lookups that asked the cluster.", r.remoteLookups);
    counter("kvtier_remote_lookups_cut_total",
            "Lookups answered at their deadline, with what had arrived, while their fetch went on.",
            r.remoteLookupsCut);
    counter("kvtier_lookup_peer_messages_total",
            "Peer messages remote lookups sent: directory queries and pins.", r.lookupPeerMessages);
    gauge("kvtier_lookup_peer_messages_max", "The most peer messages one remote lookup sent.",
          r.lookupPeerMessagesMax);
    counter("kvtier_directory_queries_total",
            "Who-holds queries this node answered as a directory home.", r.directoryQueries);
    counter("kvtier_remote_hit_blocks_total", "Blocks fetched from other nodes.",
            r.remoteHitBlocks);
    counter("kvtier_remote_hit_bytes_total", "Bytes fetched from other nodes.", r.remoteHitBytes);
    counter("kvtier_served_blocks_total", "Blocks pinned for other nodes' fetches.",
            r.servedBlocks);
    counter("kvtier_pins_expired_total", "Pins whose lease ran out before release.", r.pinsExpired);
    counter("kvtier_peer_auth_failures_total", "Peers refused for a wrong token.", r.authFailures);
    gauge("kvtier_peer_rtt_microseconds", "Median heartbeat round trip to live peers.",
          r.peerRttMicros);
    const std::pair<const char*, uint64_t> kinds[] = {{"timeout", r.fetchTimeouts},
                                                      {"unavailable", r.fetchUnavailable},
                                                      {"transfer", r.fetchTransfer},
                                                      {"checksum", r.fetchChecksum},
                                                      {"full", r.fetchFull}};
    out += "# HELP kvtier_fetch_errors_total Remote fetch errors by kind.\n";
    out += "# TYPE kvtier_fetch_errors_total counter\n";
    for (const auto& [kind, v] : kinds) {
      out += std::string("kvtier_fetch_errors_total{kind=\"") + kind + "\"} " + std::to_string(v) +
             "\n";
    }
  }
  return out;
}

void Server::taskFailed(kj::Exception&& exception) {
  logWarn("connection_failed", exception.getDescription().cStr());
}

}  // namespace kvtier
