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
  return client->run([&]() -> kj::Promise<void> {
    auto cap = KJ_ASSERT_NONNULL(lease->cap).castAs<rpc::WriteLease>();
    kj::Promise<void> written = kj::READY_NOW;
    if (const uint8_t* view = client->mapped ? client->view(block) : nullptr) {
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
  auto lease = std::make_unique<LeaseState>();
  lease->client = client_.impl_.get();
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
  auto* client = client_.impl_.get();
  BlobHandle handle;
  handle.lease_ = std::make_unique<LeaseState>();
  handle.lease_->client = client;
  BlockRef block;
  uint64_t bytes = 0;
  auto status = client->run([&] {
    auto req = makeRequest();
    req.setInline(!client->mapped);
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
  const uint8_t* p = client->view(block);
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
