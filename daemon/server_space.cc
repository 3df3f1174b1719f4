// Space: the RPC object of one namespace a session opened — puts, lookups, reads, sequences,
// snapshots, checkpoints and entries, each a call on the engine.
#include "daemon/server_internal.h"

namespace kvtier::server_internal {
namespace {

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

}  // namespace

kj::Own<rpc::Space::Server> makeSpace(Engine& engine, std::shared_ptr<OwnerScope> scope,
                                      SpaceId space, ColdService* cold, TierService* tiers,
                                      uint8_t tier, RemoteTier* remote) {
  return kj::heap<SpaceImpl>(engine, std::move(scope), space, cold, tiers, tier, remote);
}

}  // namespace kvtier::server_internal
