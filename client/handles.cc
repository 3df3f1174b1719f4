// Read and write handles: a lease on pool blocks, released with the handle; and blob handles.

#include <algorithm>
#include <atomic>
#include <cstring>

#include "client/bench_hooks.h"
#include "client/client_internal.h"
#include "kernels/block_sum.h"

namespace kvtier {

// ---------------------------------------------------------------------------------------------
// Leases

ReadHandle::ReadHandle(Space* space, std::unique_ptr<LeaseState> lease) noexcept
    : space_(space), lease_(std::move(lease)) {}
ReadHandle::ReadHandle(ReadHandle&&) noexcept = default;
ReadHandle& ReadHandle::operator=(ReadHandle&&) noexcept = default;
ReadHandle::~ReadHandle() = default;

void ReadHandle::release() {
  // Dropping the lease capability sends the daemon a release message without waiting for an
  // answer: it is ordered before anything else this client sends.
  lease_.reset();
  views_.clear();
  inline_.clear();
}

namespace {
std::atomic<bool> gReaderChecks{true};  // bench_hooks::setReaderChecks
}  // namespace

void bench_hooks::setReaderChecks(bool enabled) { gReaderChecks = enabled; }

Status ReadHandle::copyTo(uint64_t from, uint64_t to, void* out, size_t bytes) const {
  const Layout& layout = space_->layout();
  if (auto s = checkRange("copy", "held", from, to, begin_, end_); !s) return s;
  if (bytes != (to - from) * layout.tokenKvBytes()) {
    return invalid("copy buffer of ", bytes, " bytes, expected ",
                   (to - from) * layout.tokenKvBytes());
  }
  if (views_.empty() && from < to)
    return makeError(ErrorCode::kReleased, "read handle was released");
  if (!layout.hasKv()) return {};  // a layout of recurrent layers only: positions hold no KV
  const uint32_t bt = layout.blockTokens;
  const auto g = geometry(layout);
  auto* packed = static_cast<uint8_t*>(out);
  std::vector<kernels::CopyRun> runs;
  for (uint64_t pos = from; pos < to;) {
    const uint64_t block = (pos - firstPosition_) / bt;
    const uint32_t slot = static_cast<uint32_t>((pos - firstPosition_) % bt);
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(bt - slot, to - pos));
    const std::span<const uint8_t> view = views_[block];
    if (!view.data()) {
      return makeError(ErrorCode::kNotSupported,
                       "block is in GPU memory: gather it with Space::gatherTo");
    }
    if (sum(block) == 0 || !gReaderChecks.load(std::memory_order_relaxed)) {
      kernels::packSlots(g, view.data(), slot, n, packed, to - from, pos - from);
    } else {
      // The block's K and V slots of [pos, pos + n) to their places in `out`, the whole block
      // folded into its checksum in the same pass.
      runs.clear();
      for (uint64_t lkv = 0; lkv < 2ull * layout.numLayers; ++lkv) {
        runs.push_back({layout.slotOffset(static_cast<uint32_t>(lkv / 2),
                                          static_cast<uint32_t>(lkv % 2), slot),
                        uint64_t{n} * g.tokenBytes,
                        packed + (lkv * (to - from) + (pos - from)) * g.tokenBytes});
      }
      if (kernels::copyRunsSummed(view.data(), view.size(), runs,
                                  kernels::CopyDirection::kOutOfPool) != sum(block)) {
        kernels::copyFence();
        reportCorrupt(block);
        return makeError(ErrorCode::kChecksumMismatch, "the block holding positions from ",
                         firstPosition_ + block * bt,
                         " differs from what its writer stored; nothing copied is to be used");
      }
    }
    pos += n;
  }
  kernels::copyFence();
  return {};
}

Status ReadHandle::verify(size_t i) const {
  if (views_.empty()) return makeError(ErrorCode::kReleased, "read handle was released");
  if (i >= views_.size()) return invalid("block ", i, " of a handle holding ", views_.size());
  if (sum(i) == 0) return {};
  const std::span<const uint8_t> view = views_[i];
  if (!view.data()) return makeError(ErrorCode::kNotSupported, "block is in GPU memory");
  if (kernels::blockChecksum(view.data(), view.size()) == sum(i)) return {};
  reportCorrupt(i);
  return makeError(ErrorCode::kChecksumMismatch, "block ", i,
                   " differs from what its writer stored");
}

void ReadHandle::reportCorrupt(size_t i) const {
  if (space_ != nullptr && i < refs_.size()) {
    space_->reportCorrupt(std::span<const BlockRef>(&refs_[i], 1));
  }
}

uint32_t ReadHandle::partialTokens() const {
  const Layout& layout = space_->layout();
  if (stateBlocks_ == 0 || !layout.hasKv()) return 0;
  return static_cast<uint32_t>(end_ % layout.blockTokens);
}

Status ReadHandle::copyState(void* out, size_t bytes) const {
  const Layout& layout = space_->layout();
  if (stateBlocks_ == 0) return makeError(ErrorCode::kNotFound, "the answer holds no state");
  if (bytes != layout.stateBytes) {
    return invalid("state buffer of ", bytes, " bytes, expected ", layout.stateBytes);
  }
  if (views_.empty()) return makeError(ErrorCode::kReleased, "read handle was released");
  // The state's bytes in the payload its chunks hold: after a block of partial KV, if any.
  const uint64_t chunk = layout.chunkBytes();
  const uint64_t from = partialTokens() > 0 ? layout.blockBytes() : 0, to = from + bytes;
  const size_t first = views_.size() - stateBlocks_;
  auto* dst = static_cast<uint8_t*>(out);
  alignas(64) uint8_t scratch[4096];  // where the chunk's bytes that are not the state go
  for (size_t j = 0; j < stateBlocks_; ++j) {
    const std::span<const uint8_t> view = views_[first + j];
    if (view.data() == nullptr) {
      return makeError(ErrorCode::kNotSupported, "state chunk is in GPU memory");
    }
    if (view.size() < chunk) return makeError(ErrorCode::kInternal, "state chunk is too small");
    // The whole chunk is folded into its checksum, read once: the state's part is copied out,
    // the rest passes through the scratch buffer.
    kernels::FusedXxh3 sum(chunk, kernels::copyMethod(kernels::CopyDirection::kOutOfPool));
    const uint64_t base = j * chunk;
    const uint64_t lo = std::clamp(from, base, base + chunk) - base;
    const uint64_t hi = std::clamp(to, base, base + chunk) - base;
    for (uint64_t at = 0; at < chunk;) {
      if (at >= lo && at < hi) {
        sum.feed(dst + (base + at - from), view.data() + at, hi - at);
        at = hi;
        continue;
      }
      const uint64_t n =
          std::min<uint64_t>({sizeof scratch, chunk - at, at < lo ? lo - at : chunk - at});
      sum.feed(scratch, view.data() + at, n);
      at += n;
    }
    kernels::copyFence();
    if (sum.digest() != this->sum(first + j)) {
      reportCorrupt(first + j);
      return makeError(ErrorCode::kChecksumMismatch, "state chunk ", j, " at position ", end_,
                       " differs from what its writer stored");
    }
  }
  return {};
}

namespace {
std::atomic<bool> gWriterChecksums{true};  // bench_hooks::setWriterChecksums
}  // namespace

void bench_hooks::setWriterChecksums(bool enabled) { gWriterChecksums = enabled; }

Status writeIntoViews(const Layout& layout, std::span<const std::span<uint8_t>> views,
                      uint64_t firstPosition, uint64_t from, uint64_t to, const void* kv,
                      BlockSums& sums) {
  const uint32_t bt = layout.blockTokens;
  const auto g = geometry(layout);
  const auto* packed = static_cast<const uint8_t*>(kv);
  sums.sum.resize(views.size());
  sums.fused.resize(views.size());
  for (uint64_t pos = from; pos < to;) {
    const uint64_t block = (pos - firstPosition) / bt;
    const uint32_t slot = static_cast<uint32_t>((pos - firstPosition) % bt);
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(bt - slot, to - pos));
    if (!views[block].data()) {
      return makeError(ErrorCode::kNotSupported,
                       "block is in GPU memory: write it with Space::putPaged");
    }
    if (n == bt && gWriterChecksums.load(std::memory_order_relaxed)) {
      sums.sum[block] =
          kernels::unpackBlockSummed(g, views[block].data(), packed, to - from, pos - from);
      sums.fused[block] = 1;
    } else {
      kernels::unpackSlots(g, views[block].data(), slot, n, packed, to - from, pos - from);
      sums.fused[block] = 0;
    }
    pos += n;
  }
  return {};
}

std::vector<uint64_t> commitSums(const Layout& layout, std::span<const std::span<uint8_t>> views,
                                 uint64_t firstPosition, uint64_t end, const BlockSums& sums) {
  const uint64_t filled = end / layout.blockTokens - firstPosition / layout.blockTokens;
  std::vector<uint64_t> out;
  if (filled > views.size()) return out;
  for (size_t i = 0; i < filled; ++i) {
    if (!views[i].data()) return {};
  }
  if (!gWriterChecksums.load(std::memory_order_relaxed)) return std::vector<uint64_t>(filled, 0);
  out.reserve(filled);
  for (size_t i = 0; i < filled; ++i) {
    out.push_back(sums.fusedSum(i) ? sums.sum[i]
                                   : kernels::blockChecksum(views[i].data(), layout.blockBytes()));
  }
  return out;
}

WriteHandle::WriteHandle(Space* space, std::unique_ptr<LeaseState> lease) noexcept
    : space_(space), lease_(std::move(lease)) {}
WriteHandle::WriteHandle(WriteHandle&&) noexcept = default;
WriteHandle& WriteHandle::operator=(WriteHandle&&) noexcept = default;
WriteHandle::~WriteHandle() = default;

std::span<uint8_t> WriteHandle::block(size_t i) const {
  if (i >= views_.size()) return {};
  // Bytes written through the view are the caller's, up to the commit, which takes their checksum
  // from them (never from a write()'s copy: the caller may write the view after it).
  if (lease_) lease_->sums.handOut(i);
  return views_[i];
}

Status WriteHandle::blockWritten(size_t i, uint64_t checksum) {
  if (!lease_) return makeError(ErrorCode::kReleased, "write handle was committed or aborted");
  if (i >= views_.size()) return invalid("block ", i, " is past the ", views_.size(), " granted");
  BlockSums& sums = lease_->sums;
  if (sums.sum.size() <= i) {
    sums.sum.resize(i + 1, 0);
    sums.fused.resize(i + 1, 0);
  }
  sums.sum[i] = checksum;
  sums.fused[i] = 1;
  if (i < sums.handedOut.size()) sums.handedOut[i] = 0;
  return {};
}

Status WriteHandle::write(uint64_t from, uint64_t to, const void* kv, size_t bytes) {
  if (!lease_) return makeError(ErrorCode::kReleased, "write handle was committed or aborted");
  const Layout& layout = space_->layout();
  if (auto s = checkRange("write", "granted", from, to, begin_, end_); !s) return s;
  if (bytes != (to - from) * layout.tokenKvBytes()) {
    return invalid("write buffer of ", bytes, " bytes, expected ",
                   (to - from) * layout.tokenKvBytes());
  }
  // A lease the fast lane granted always has views: the lane serves clients that map the pool.
  if (!views_.empty() || lease_->lane) {
    return writeIntoViews(layout, views_, firstPosition_, from, to, kv, lease_->sums);
  }
  const uint32_t bt = layout.blockTokens;
  const auto g = geometry(layout);
  const auto* packed = static_cast<const uint8_t*>(kv);
  // Inline: one write message per block, all in flight at once.
  return lease_->client->run([&] {
    auto lease = KJ_ASSERT_NONNULL(lease_->cap).castAs<rpc::WriteLease>();
    kj::Vector<kj::Promise<void>> sends;
    for (uint64_t pos = from; pos < to;) {
      const uint64_t block = (pos - firstPosition_) / bt;
      const uint32_t slot = static_cast<uint32_t>((pos - firstPosition_) % bt);
      const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(bt - slot, to - pos));
      auto req = lease.writeRequest();
      req.setBlock(static_cast<uint32_t>(block));
      req.setFirstSlot(slot);
      req.setSlots(n);
      auto data = req.initData(n * layout.tokenKvBytes());
      // Gather this block's slots out of the caller's packed run into a packed run of n tokens.
      for (uint64_t lkv = 0; lkv < 2ull * layout.numLayers; ++lkv) {
        std::memcpy(data.begin() + lkv * n * g.tokenBytes,
                    packed + (lkv * (to - from) + (pos - from)) * g.tokenBytes, n * g.tokenBytes);
      }
      sends.add(req.send().ignoreResult());
      pos += n;
    }
    return kj::joinPromises(sends.releaseAsArray());
  });
}

Status WriteHandle::writeState(uint64_t offset, const void* data, size_t size) {
  if (!lease_) return makeError(ErrorCode::kReleased, "write handle was committed or aborted");
  if (stateBytes_ == 0) return invalid("writeState on a lease of positions (use write)");
  if (offset > stateBytes_ || size > stateBytes_ - offset) {
    return invalid("state write of [", offset, ", +", size, ") is outside its ", stateBytes_,
                   " bytes");
  }
  const auto* src = static_cast<const uint8_t*>(data);
  if (!views_.empty()) {
    const uint64_t chunk = space_->layout().chunkBytes();
    for (uint64_t at = offset, end = offset + size; at < end;) {
      const uint64_t j = at / chunk, within = at % chunk;
      const uint64_t n = std::min(end - at, chunk - within);
      if (!views_[j].data()) return makeError(ErrorCode::kNotSupported, "chunk in GPU memory");
      std::memcpy(views_[j].data() + within, src + (at - offset), n);
      at += n;
    }
    return {};
  }
  return lease_->client->run([&] {
    auto req = KJ_ASSERT_NONNULL(lease_->cap).castAs<rpc::WriteLease>().writeBlobRequest();
    req.setOffset(offset);
    req.setData(capnp::Data::Reader(src, size));
    return req.send().ignoreResult();
  });
}

Result<CommitInfo> WriteHandle::commit(uint64_t upTo) {
  if (!lease_) return makeError(ErrorCode::kReleased, "write handle was committed or aborted");
  Result<CommitInfo> result = makeError(ErrorCode::kInternal, "commit not sent");
  // Taken by the writer: fused into write()'s copies, or read from the blocks it wrote otherwise.
  // A state's chunks: from their bytes (none for an inline writer: the daemon takes them).
  std::vector<uint64_t> sums;
  if (stateBytes_ > 0) {
    const uint64_t chunk = space_->layout().chunkBytes();
    for (const auto& view : views_) {
      if (!view.data()) {
        sums.clear();
        break;
      }
      sums.push_back(gWriterChecksums.load(std::memory_order_relaxed)
                         ? kernels::blockChecksum(view.data(), chunk)
                         : 0);
    }
  } else {
    sums = commitSums(space_->layout(), views_, firstPosition_, end_, lease_->sums);
  }
  if (lease_->lane) {
    auto r = lease_->lane->commit(lease_->laneLease, upTo, sums);
    if (r) {
      result = CommitInfo{r->length, r->sealedBlocks};
    } else {
      result = r.error();
    }
  } else {
    result = lease_->client->run([&] {
      auto req = KJ_ASSERT_NONNULL(lease_->cap).castAs<rpc::WriteLease>().commitRequest();
      req.setUpTo(upTo);
      auto list = req.initSums(static_cast<unsigned>(sums.size()));
      for (size_t i = 0; i < sums.size(); ++i) list.set(static_cast<unsigned>(i), sums[i]);
      return req.send().then([](capnp::Response<rpc::WriteLease::CommitResults>&& r) {
        return CommitInfo{r.getLength(), r.getSealedBlocks()};
      });
    });
  }
  // A bad upTo leaves the lease open for another try; anything else ends it (the daemon's end of
  // a lane lease too: nothing is left to abort).
  if (result || result.code() != ErrorCode::kInvalidArgument) {
    if (lease_->lane) lease_->laneLease = 0;
    lease_.reset();
    views_.clear();
  }
  return result;
}

Status WriteHandle::abort() {
  if (!lease_) return makeError(ErrorCode::kReleased, "write handle was committed or aborted");
  if (lease_->lane) {
    // Over the lane an abort is one-way: the lease's state sends it as it goes.
    lease_.reset();
    views_.clear();
    return {};
  }
  auto status = lease_->client->run([&] {
    return KJ_ASSERT_NONNULL(lease_->cap)
        .castAs<rpc::WriteLease>()
        .abortRequest()
        .send()
        .ignoreResult();
  });
  lease_.reset();
  views_.clear();
  return status;
}

BlobHandle::BlobHandle(BlobHandle&&) noexcept = default;
BlobHandle& BlobHandle::operator=(BlobHandle&&) noexcept = default;
BlobHandle::~BlobHandle() = default;

void BlobHandle::release() {
  lease_.reset();
  data_ = {};
  inline_.clear();
}

}  // namespace kvtier
