// Position-independent entries and recurrent-state checkpoints: blobs in pool blocks.

#include "client/client_internal.h"

#include <cstring>

#include "kvtier/block_key.h"

namespace kvtier {

// ---------------------------------------------------------------------------------------------
// Snapshots, checkpoints, entries

Key128 contentKey(const void* bytes, size_t size) {
  Sha256 sha;
  sha.begin();
  sha.update(bytes, size);
  const auto digest = sha.finish();
  Key128 key;
  std::memcpy(key.bytes.data(), digest.data(), key.bytes.size());
  return key;
}
Status Space::writeBlob(const void* bytes, size_t size, std::unique_ptr<LeaseState> lease,
                        const BlockRef& block) {
  auto* client = client_.impl_.get();
  const Connection& on = *lease->connection;
  return client->run([&]() -> kj::Promise<void> {
    auto cap = KJ_ASSERT_NONNULL(lease->cap).castAs<rpc::WriteLease>();
    kj::Promise<void> written = kj::READY_NOW;
    if (const uint8_t* view = on.mapped ? on.view(block) : nullptr) {
      std::memcpy(const_cast<uint8_t*>(view), bytes, size);
    } else {
      auto req = cap.writeBlobRequest();
      req.setData(capnp::Data::Reader(static_cast<const uint8_t*>(bytes), size));
      written = req.send().ignoreResult();
    }
    return written.then([cap]() mutable { return cap.commitRequest().send().ignoreResult(); });
  });
}

template <typename MakeRequest>
Status Space::putBlob(MakeRequest&& makeRequest, const void* bytes, size_t size) {
  if (auto s = refresh(); !s) return s;
  auto lease = std::make_unique<LeaseState>();
  lease->client = client_.impl_.get();
  lease->connection = impl_->on().connection;
  auto block = client_.impl_->run([&] {
    return makeRequest().send().then([&lease](auto&& r) {
      lease->cap = r.getLease();
      return refFrom(r.getBlock());
    });
  });
  if (!block) return block.error();
  return writeBlob(bytes, size, std::move(lease), *block);
}

Status Space::putCheckpoint(std::string_view seq, uint64_t pos, const void* state, size_t bytes) {
  return putBlob(
      [&] {
        auto req = impl_->space().putCheckpointRequest();
        req.setSeq(WireText(seq));
        req.setPos(pos);
        req.setBytes(bytes);
        return req;
      },
      state, bytes);
}

Status Space::putEntry(const Key128& key, const void* bytes, size_t size) {
  return putBlob(
      [&] {
        auto req = impl_->space().putEntryRequest();
        req.setKey(capnp::Data::Reader(key.bytes.data(), key.bytes.size()));
        req.setBytes(size);
        return req;
      },
      bytes, size);
}

template <typename MakeRequest>
Result<BlobHandle> Space::readBlob(MakeRequest&& makeRequest) {
  if (auto s = refresh(); !s) return s.error();
  auto* client = client_.impl_.get();
  const auto on = impl_->on();
  BlobHandle handle;
  handle.lease_ = std::make_unique<LeaseState>();
  handle.lease_->client = client;
  handle.lease_->connection = on.connection;
  BlockRef block;
  uint64_t bytes = 0;
  auto status = client->run([&] {
    auto req = makeRequest();
    req.setInline(!on.connection->mapped);
    return req.send().then([&](auto&& r) {
      handle.lease_->cap = r.getLease();
      block = refFrom(r.getBlock());
      bytes = r.getBytes();
      handle.inline_.assign(r.getData().begin(), r.getData().end());
    });
  });
  if (!status) return status.error();
  if (!handle.inline_.empty() || bytes == 0) {
    handle.data_ = std::span<const uint8_t>(handle.inline_);
    return handle;
  }
  const uint8_t* p = on.connection->view(block);
  if (!p || bytes > block.bytes) {
    return makeError(ErrorCode::kInternal, "daemon returned a blob outside the mapped pool");
  }
  handle.data_ = std::span<const uint8_t>(p, bytes);
  return handle;
}

Result<BlobHandle> Space::getCheckpoint(std::string_view seq, uint64_t pos) {
  return readBlob([&] {
    auto req = impl_->space().getCheckpointRequest();
    req.setSeq(WireText(seq));
    req.setPos(pos);
    return req;
  });
}

Result<BlobHandle> Space::getEntry(const Key128& key) {
  return readBlob([&] {
    auto req = impl_->space().getEntryRequest();
    req.setKey(capnp::Data::Reader(key.bytes.data(), key.bytes.size()));
    return req;
  });
}

Result<std::vector<uint64_t>> Space::checkpoints(std::string_view seq) {
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().checkpointsRequest();
    req.setSeq(WireText(seq));
    return req.send().then([](capnp::Response<rpc::Space::CheckpointsResults>&& r) {
      std::vector<uint64_t> out;
      for (uint64_t pos : r.getPositions()) out.push_back(pos);
      return out;
    });
  });
}

}  // namespace kvtier

namespace kvtier {

// ---------------------------------------------------------------------------------------------
// Prefix states

Result<WriteHandle> Space::beginPutStateImpl(std::span<const uint32_t> tokens,
                                             std::span<const Key128> keys) {
  if (!layout_.hasState()) {
    return makeError(ErrorCode::kInvalidArgument,
                     "the space's layout declares no state (Layout::stateBytes)");
  }
  if (tokens.size() > kMaxTokensPerCall) {
    return makeError(ErrorCode::kInvalidArgument, "state after ", tokens.size(), " tokens exceeds ",
                     kMaxTokensPerCall);
  }
  if (auto s = refresh(); !s) return s.error();
  auto* client = client_.impl_.get();
  const auto on = impl_->on();
  auto lease = std::make_unique<LeaseState>();
  lease->client = client;
  lease->connection = on.connection;
  uint64_t position = 0;
  std::vector<BlockRef> refs;
  auto status = client->run([&] {
    auto req = impl_->space().putStateRequest();
    setTokens(req.initTokens(tokens.size()), tokens);
    setKeys(req.initKeys(keys.size()), keys);
    return req.send().then([&](capnp::Response<rpc::Space::PutStateResults>&& r) {
      lease->cap = r.getLease();
      position = r.getPosition();
      for (auto b : r.getBlocks()) refs.push_back(refFrom(b));
    });
  });
  if (!status) return status.error();
  const auto partial = static_cast<uint32_t>(position % layout_.blockTokens);
  if (refs.size() != layout_.stateChunks(partial)) {
    return makeError(ErrorCode::kInternal, "daemon granted ", refs.size(),
                     " chunks for a state of ", layout_.stateChunks(partial));
  }
  WriteHandle handle(this, std::move(lease));
  handle.begin_ = handle.end_ = handle.firstPosition_ = position;
  handle.stateBytes_ = uint64_t{layout_.stateChunks(partial)} * layout_.chunkBytes();
  handle.refs_ = std::move(refs);
  if (on.connection->mapped) {
    for (const auto& ref : handle.refs_) {
      auto v = on.connection->grantedView(ref);
      if (!v) return v.error();
      handle.views_.push_back(*v);
    }
  }
  return handle;
}

Result<WriteHandle> Space::beginPutState(std::span<const uint32_t> tokens) {
  if (tokens.empty()) return makeError(ErrorCode::kInvalidArgument, "a state after no tokens");
  return beginPutStateImpl(tokens, {});
}

Result<WriteHandle> Space::beginPutStateKeys(std::span<const Key128> keys) {
  if (keys.empty()) return makeError(ErrorCode::kInvalidArgument, "a state after no blocks");
  return beginPutStateImpl({}, keys);
}

namespace {

// Writes the state (and the partial block's KV) into a state lease and commits it.
Status fillState(const Layout& layout, WriteHandle& w, uint32_t partial, const void* state,
                 size_t bytes, const void* partialKv) {
  uint64_t offset = 0;
  if (partial > 0) {
    // A block of the layout holding the partial KV in its first slots, the rest zeros.
    std::vector<uint8_t> block(layout.blockBytes(), 0);
    kernels::unpackSlots({layout.numLayers, layout.blockTokens, layout.tokenBytes()}, block.data(),
                         0, partial, static_cast<const uint8_t*>(partialKv), partial, 0);
    if (auto s = w.writeState(0, block.data(), block.size()); !s) return s;
    offset = block.size();
  }
  if (auto s = w.writeState(offset, state, bytes); !s) return s;
  // The last chunk's bytes past the payload are zeros (a chunk is checksummed and spilled whole).
  const uint64_t chunk = layout.chunkBytes(), end = offset + bytes;
  const uint64_t tail = (chunk - end % chunk) % chunk;
  if (tail > 0) {
    std::vector<uint8_t> zeros(tail, 0);
    if (auto s = w.writeState(end, zeros.data(), zeros.size()); !s) return s;
  }
  auto committed = w.commit();
  if (!committed) return committed.error();
  return {};
}

}  // namespace

Status Space::putState(std::span<const uint32_t> tokens, const void* state, size_t bytes,
                       const void* partialKv, size_t partialBytes) {
  const uint32_t partial = static_cast<uint32_t>(tokens.size() % layout_.blockTokens);
  if (bytes != layout_.stateBytes || (bytes > 0 && state == nullptr)) {
    return makeError(ErrorCode::kInvalidArgument, "a state of ", bytes, " bytes; the layout's is ",
                     layout_.stateBytes);
  }
  const uint64_t kvBytes = uint64_t{partial} * layout_.tokenKvBytes();
  if (partialBytes != kvBytes || (kvBytes > 0 && partialKv == nullptr)) {
    return makeError(ErrorCode::kInvalidArgument, "the KV of the ", partial,
                     " positions past the last whole block is ", kvBytes, " bytes, not ",
                     partialBytes);
  }
  auto w = beginPutState(tokens);
  if (!w) return w.error();
  return fillState(layout_, *w, partial, state, bytes, partialKv);
}

Status Space::putStateKeys(std::span<const Key128> keys, const void* state, size_t bytes) {
  if (bytes != layout_.stateBytes || (bytes > 0 && state == nullptr)) {
    return makeError(ErrorCode::kInvalidArgument, "a state of ", bytes, " bytes; the layout's is ",
                     layout_.stateBytes);
  }
  auto w = beginPutStateKeys(keys);
  if (!w) return w.error();
  return fillState(layout_, *w, 0, state, bytes, nullptr);
}

}  // namespace kvtier
