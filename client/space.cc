// A namespace's sequence calls: put, get, lookup, copy-prefix, remove, truncate, and reads of
// block refs.

#include "client/client_internal.h"

namespace kvtier {

// ---------------------------------------------------------------------------------------------
// Space

Space::Space(Client& client, std::unique_ptr<Impl> impl, Layout layout, uint64_t fingerprint,
             int device)
    : client_(client),
      impl_(std::move(impl)),
      layout_(std::move(layout)),
      fingerprint_(fingerprint),
      device_(device) {}

Space::~Space() {
  // The capability, then the connection under it, on the loop thread.
  Client::Impl::NoReconnect quiet;
  (void)client_.impl_->run([this] {
    impl_->cap = nullptr;
    std::lock_guard lock(impl_->mu);
    impl_->connection = nullptr;
  });
}

Status Space::refresh() {
  Client::Impl* client = client_.impl_.get();
  if (client->options.reconnect) client->reconnectIfDue();
  std::lock_guard refreshing(impl_->refreshMutex);
  const auto now = client->connection();
  if (!now || now == impl_->on().connection) return {};
  // The client connected again: the namespace is opened on the new daemon (a new session).
  auto opened = client->openSpace(layout_, device_);
  if (!opened) return opened.error();
  if (opened->fingerprint != fingerprint_) {
    (void)client->run([&] { opened->cap = nullptr; });
    return makeError(ErrorCode::kProtocolMismatch, "kvtierd reopened the namespace with another ",
                     "fingerprint (", opened->fingerprint, ", was ", fingerprint_, ")");
  }
  (void)client->run([&] {
    impl_->cap = kj::mv(opened->cap);  // the old one is dropped here, on the loop thread
    std::shared_ptr<Connection> old;
    {
      std::lock_guard lock(impl_->mu);
      old = std::exchange(impl_->connection, std::move(opened->connection));
      impl_->lane = opened->lane;
    }
  });
  return {};
}

namespace {

// A lane call that found the daemon gone marks its connection lost (the client reconnects).
template <typename T>
const Result<T>& noteLane(Connection& c, const Result<T>& r) {
  if (!r && r.code() == ErrorCode::kUnavailable) c.lost = true;
  return r;
}

}  // namespace

Result<WriteHandle> Space::beginPut(std::string_view seq, uint64_t begin,
                                    std::span<const uint32_t> tokens, const PutOptions& options) {
  if (tokens.size() > kMaxTokensPerCall)
    return invalid("put of ", tokens.size(), " tokens exceeds ", kMaxTokensPerCall);
  if (auto s = refresh(); !s) return s.error();
  auto* client = client_.impl_.get();
  const auto on = impl_->on();
  auto lease = std::make_unique<LeaseState>();
  lease->client = client;
  lease->connection = on.connection;
  struct Granted {
    uint64_t firstPosition;
    std::vector<BlockRef> refs;
  };
  std::optional<Result<Granted>> granted;
  // The fast lane takes the put of a client that maps the pool; its write lease is the lane's.
  if (ClientLane* lane = client->laneHere(*on.connection); lane && on.lane != 0) {
    if (auto answer = lane->put(lanePut(on.lane, seq, begin, tokens, options))) {
      if (!noteLane(*on.connection, *answer)) return answer->error();
      lane::PutReply& r = answer->value();
      lease->lane = on.connection->lane;
      lease->laneLease = r.lease;
      lease->laneWrite = true;
      Granted g{r.firstPosition, {}};
      g.refs.reserve(r.blocks.size());
      for (const auto& b : r.blocks) g.refs.push_back(refFrom(b));
      granted = std::move(g);
    }
  }
  if (!granted) {
    granted = client->run([&] {
      auto req = impl_->space().putRequest();
      req.setSeq(WireText(seq));
      req.setBegin(begin);
      setTokens(req.initTokens(tokens.size()), tokens);
      setKeys(req.initKeys(options.keys.size()), options.keys);
      setSeqOptions(req.initOptions(), options);
      return req.send().then([&lease](capnp::Response<rpc::Space::PutResults>&& r) {
        lease->cap = r.getLease();
        Granted g{r.getFirstPosition(), {}};
        for (auto b : r.getBlocks()) g.refs.push_back(refFrom(b));
        return g;
      });
    });
  }
  if (!*granted) return granted->error();
  WriteHandle handle(this, std::move(lease));
  handle.begin_ = begin;
  handle.end_ = begin + tokens.size();
  handle.firstPosition_ = (*granted)->firstPosition;
  handle.refs_ = std::move((*granted)->refs);
  if (on.connection->mapped) {
    for (const auto& ref : handle.refs_) {
      auto v = on.connection->grantedView(ref);  // empty for GPU memory: written by putPaged
      if (!v) return v.error();
      handle.views_.push_back(*v);
    }
  }
  return handle;
}

Result<CommitInfo> Space::put(std::string_view seq, uint64_t begin,
                              std::span<const uint32_t> tokens, const void* kv, size_t bytes,
                              const PutOptions& options) {
  if (bytes != tokens.size() * layout_.tokenKvBytes()) {
    return invalid("put of ", tokens.size(), " tokens needs ",
                   tokens.size() * layout_.tokenKvBytes(), " bytes of KV, got ", bytes);
  }
  auto handle = beginPut(seq, begin, tokens, options);
  if (!handle) return handle.error();
  if (auto s = handle->write(begin, begin + tokens.size(), kv, bytes); !s) return s.error();
  return handle->commit();
}

std::vector<Result<CommitInfo>> Space::putMany(std::span<const PutItem> items) {
  std::vector<Result<CommitInfo>> results;
  results.reserve(items.size());
  if (auto s = refresh(); !s) {
    results.assign(items.size(), s.error());
    return results;
  }
  const auto on = impl_->on();
  // Items put() would refuse before asking the daemon are refused here the same way; the rest go
  // over the lane as one pipelined batch.
  std::vector<size_t> sent;
  std::vector<lane::PutArgs> args;
  for (size_t i = 0; i < items.size(); ++i) {
    const PutItem& it = items[i];
    if (it.tokens.size() > kMaxTokensPerCall) {
      results.push_back(
          invalid("put of ", it.tokens.size(), " tokens exceeds ", kMaxTokensPerCall));
    } else if (it.bytes != it.tokens.size() * layout_.tokenKvBytes()) {
      results.push_back(invalid("put of ", it.tokens.size(), " tokens needs ",
                                it.tokens.size() * layout_.tokenKvBytes(), " bytes of KV, got ",
                                it.bytes));
    } else {
      results.push_back(makeError(ErrorCode::kInternal, "not put"));
      sent.push_back(i);
      args.push_back(lanePut(on.lane, it.seq, it.begin, it.tokens, it.options));
    }
  }
  auto* client = client_.impl_.get();
  std::optional<std::vector<Result<lane::CommitReply>>> batch;
  if (ClientLane* lane = client->laneHere(*on.connection); lane && on.lane != 0 && !sent.empty()) {
    std::vector<std::span<uint8_t>> views;
    BlockSums fused;
    batch = lane->putMany(
        args, [&](size_t k, const lane::PutReply& grant, std::vector<uint64_t>& sums) -> Status {
          views.clear();
          for (const auto& b : grant.blocks) {
            auto v = on.connection->grantedView(refFrom(b));
            if (!v) return v.error();
            views.push_back(*v);
          }
          const PutItem& it = items[sent[k]];
          const uint64_t end = it.begin + it.tokens.size();
          fused = {};
          if (auto s =
                  writeIntoViews(layout_, views, grant.firstPosition, it.begin, end, it.kv, fused);
              !s) {
            return s;
          }
          sums = commitSums(layout_, views, grant.firstPosition, end, fused);
          return {};
        });
  }
  if (batch) {
    for (const auto& r : *batch) noteLane(*on.connection, r);
  }
  for (size_t k = 0; k < sent.size(); ++k) {
    const PutItem& it = items[sent[k]];
    Result<CommitInfo>& result = results[sent[k]];
    if (!batch) {
      // No lane to pipeline over: one put after another.
      result = put(it.seq, it.begin, it.tokens, it.kv, it.bytes, it.options);
    } else if ((*batch)[k]) {
      result = CommitInfo{(*batch)[k]->length, (*batch)[k]->sealedBlocks};
    } else {
      result = (*batch)[k].error();
    }
  }
  return results;
}

Result<ReadHandle> Space::get(std::string_view seq, uint64_t begin, uint64_t end) {
  if (auto s = refresh(); !s) return s.error();
  auto* client = client_.impl_.get();
  const auto on = impl_->on();
  auto lease = std::make_unique<LeaseState>();
  lease->client = client;
  lease->connection = on.connection;
  ReadHandle handle(this, nullptr);
  auto status = client->run([&] {
    auto req = impl_->space().getRequest();
    req.setSeq(WireText(seq));
    req.setBegin(begin);
    req.setEnd(end);
    req.setInline(!on.connection->mapped);
    return req.send().then([&](capnp::Response<rpc::Space::GetResults>&& r) {
      lease->cap = r.getLease();
      handle.begin_ = begin;
      handle.end_ = r.getEnd();
      handle.firstPosition_ = r.getFirstPosition();
      readBlocks(r, handle.refs_, handle.inline_);
      for (uint64_t sum : r.getSums()) handle.sums_.push_back(sum);
    });
  });
  if (!status) return status.error();
  handle.lease_ = std::move(lease);
  handle.sums_.resize(handle.refs_.size(), 0);
  if (auto s = attachViews(*on.connection, handle.refs_, handle.inline_, handle.views_); !s)
    return s.error();
  return handle;
}

size_t Space::reportCorrupt(std::span<const BlockRef> refs) {
  if (auto s = refresh(); !s) return 0;
  auto dropped = client_.impl_->run([&] {
    auto req = impl_->space().reportCorruptRequest();
    auto out = req.initRefs(static_cast<uint32_t>(refs.size()));
    for (uint32_t i = 0; i < refs.size(); ++i) {
      out[i].setExtent(refs[i].extent);
      out[i].setOffset(refs[i].offset);
      out[i].setBytes(refs[i].bytes);
      out[i].setGeneration(refs[i].generation);
    }
    return req.send().then(
        [](capnp::Response<rpc::Space::ReportCorruptResults>&& r) { return r.getDropped(); });
  });
  return dropped ? *dropped : 0;
}

Result<ReadHandle> Space::lookupImpl(std::span<const uint32_t> tokens, std::span<const Key128> keys,
                                     const LookupOptions& options) {
  if (tokens.size() > kMaxTokensPerCall) {
    return invalid("lookup of ", tokens.size(), " tokens exceeds ", kMaxTokensPerCall);
  }
  if (auto s = refresh(); !s) return s.error();
  auto* client = client_.impl_.get();
  const auto on = impl_->on();
  auto lease = std::make_unique<LeaseState>();
  lease->client = client;
  lease->connection = on.connection;
  ReadHandle handle(this, nullptr);
  const uint32_t remote =
      options.remote == RemoteMode::kLocal      ? uint32_t(rpc::RemoteMode::LOCAL_ONLY)
      : options.remote == RemoteMode::kPrefetch ? uint32_t(rpc::RemoteMode::PREFETCH)
                                                : uint32_t(rpc::RemoteMode::FETCH);
  // A lookup's answer is the matched prefix from position 0; whichever way it came, the handle
  // takes its lease and maps its blocks below.
  handle.begin_ = 0;
  handle.firstPosition_ = 0;
  // The fast lane takes a plain lookup of a client that maps the pool.
  bool answered = false;
  ClientLane* lane = client->laneHere(*on.connection);
  // (A namespace with states: its answers carry the state's chunks, which the lane's do not.)
  if (lane && on.lane != 0 && options.bindSeq.empty() && !layout_.hasState()) {
    if (auto answer = lane->lookup(on.lane, remote, tokens, keys)) {
      if (!noteLane(*on.connection, *answer)) return answer->error();
      lane::LookupReply& r = answer->value();
      lease->lane = on.connection->lane;
      lease->laneLease = r.lease;
      handle.end_ = r.matchedTokens;
      handle.refs_.reserve(r.blocks.size());
      for (const auto& b : r.blocks) handle.refs_.push_back(refFrom(b));
      handle.sums_ = std::move(r.sums);
      answered = true;
    }
  }
  if (!answered) {
    auto status = client->run([&] {
      auto req = impl_->space().lookupRequest();
      setTokens(req.initTokens(tokens.size()), tokens);
      setKeys(req.initKeys(keys.size()), keys);
      req.setBindSeq(options.bindSeq);
      setSeqOptions(req.initOptions(), options);
      req.setInline(!on.connection->mapped);
      req.setRemote(static_cast<rpc::RemoteMode>(remote));
      return req.send().then([&](capnp::Response<rpc::Space::LookupResults>&& r) {
        lease->cap = r.getLease();
        handle.end_ = r.getMatchedTokens();
        readBlocks(r, handle.refs_, handle.inline_);
        handle.stateBlocks_ = std::min<uint32_t>(r.getStateBlocks(), handle.refs_.size());
        for (uint64_t sum : r.getSums()) handle.sums_.push_back(sum);
      });
    });
    if (!status) return status.error();
  }
  handle.lease_ = std::move(lease);
  if (handle.stateBlocks_ > 0) {
    // The answer's shape is checked before anyone reads it: the blocks before the state cover the
    // whole blocks of the prefix, one checksum per chunk, as many chunks as the layout says.
    const uint32_t bt = layout_.blockTokens;
    const uint64_t whole = layout_.hasKv() ? handle.end_ / bt : 0;
    const auto partial = static_cast<uint32_t>(handle.end_ % bt);
    if (handle.refs_.size() != whole + handle.stateBlocks_ ||
        handle.stateBlocks_ != layout_.stateChunks(partial)) {
      return makeError(ErrorCode::kInternal, "daemon answered a state of ", handle.stateBlocks_,
                       " chunks at ", handle.end_, " with ", handle.refs_.size(), " blocks");
    }
  } else if (layout_.hasState() && options.bindSeq.empty() && handle.end_ != 0) {
    // (A lookup that binds a sequence matches blocks alone.)
    return makeError(ErrorCode::kInternal, "daemon answered ", handle.end_,
                     " tokens without their state");
  }
  // One checksum per block (a daemon that sent none, or fewer: none is checked).
  handle.sums_.resize(handle.refs_.size(), 0);
  if (auto s = attachViews(*on.connection, handle.refs_, handle.inline_, handle.views_); !s)
    return s.error();
  return handle;
}

Result<ReadHandle> Space::lookup(std::span<const uint32_t> tokens, const LookupOptions& options) {
  return lookupImpl(tokens, {}, options);
}

Result<ReadHandle> Space::lookupKeys(std::span<const Key128> keys, const LookupOptions& options) {
  return lookupImpl({}, keys, options);
}

Status Space::copyPrefix(std::string_view src, std::string_view dst, uint64_t len, bool detached) {
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().copyPrefixRequest();
    req.setSrc(WireText(src));
    req.setDst(WireText(dst));
    req.setLen(len);
    req.initOptions().setDetached(detached);
    return req.send().ignoreResult();
  });
}

Status Space::remove(std::string_view seq, uint64_t begin, uint64_t end) {
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().removeRequest();
    req.setSeq(WireText(seq));
    req.setBegin(begin);
    req.setEnd(end);
    return req.send().ignoreResult();
  });
}

Status Space::truncate(std::string_view seq, uint64_t len) {
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().truncateRequest();
    req.setSeq(WireText(seq));
    req.setLen(len);
    return req.send().ignoreResult();
  });
}

Result<bool> Space::canResume(std::string_view seq, uint64_t pos) {
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().canResumeRequest();
    req.setSeq(WireText(seq));
    req.setPos(pos);
    return req.send().then(
        [](capnp::Response<rpc::Space::CanResumeResults>&& r) { return r.getOk(); });
  });
}

Result<std::optional<uint64_t>> Space::length(std::string_view seq) {
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().lengthRequest();
    req.setSeq(WireText(seq));
    return req.send().then([](capnp::Response<rpc::Space::LengthResults>&& r) {
      return r.getExists() ? std::optional<uint64_t>(r.getLength()) : std::nullopt;
    });
  });
}

Result<std::vector<std::vector<uint8_t>>> Space::readRefs(std::span<const BlockRef> refs) {
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().readRequest();
    auto out = req.initRefs(refs.size());
    for (uint32_t i = 0; i < refs.size(); ++i) {
      out[i].setExtent(refs[i].extent);
      out[i].setOffset(refs[i].offset);
      out[i].setBytes(refs[i].bytes);
      out[i].setGeneration(refs[i].generation);
    }
    return req.send().then([](capnp::Response<rpc::Space::ReadResults>&& r) {
      std::vector<std::vector<uint8_t>> data;
      for (auto d : r.getData()) data.emplace_back(d.begin(), d.end());
      return data;
    });
  });
}

}  // namespace kvtier
