// Paged KV <-> pool blocks: with kernels/ on the engine's stream for a space on a GPU, with the
// CPU kernels for a host space (an engine whose paged cache is in host memory).

#include "client/client_internal.h"
#include "kernels/paged_copy.h"

#ifdef KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>

#endif

namespace kvtier {

Status Space::pagedCopy(Connection& on, bool scatter, const std::vector<BlockRef>& refs,
                        uint64_t firstPosition, uint64_t from, uint64_t to,
                        const PagedKvCache& cache, std::span<const int32_t> blockTable,
                        void* stream) {
  if (cache.keys.size() != layout_.numLayers || cache.values.size() != layout_.numLayers) {
    return invalid("paged cache has ", cache.keys.size(), " K and ", cache.values.size(),
                   " V tensors; the layout has ", layout_.numLayers, " layers");
  }
  if (cache.blockTokens == 0) return invalid("paged cache block size is 0");
  if (from < to && blockTable.size() < (to - 1) / cache.blockTokens + 1) {
    return invalid("block table has ", blockTable.size(), " entries; positions up to ", to,
                   " need ", (to - 1) / cache.blockTokens + 1);
  }
  if (from == to) return {};
  std::vector<uint8_t*> tensors;
  for (uint32_t l = 0; l < layout_.numLayers; ++l) {
    tensors.push_back(static_cast<uint8_t*>(cache.keys[l]));
    tensors.push_back(static_cast<uint8_t*>(cache.values[l]));
  }
  const kernels::PagedKv kv{layout_.numLayers, cache.blockTokens, layout_.tokenBytes()};
  kernels::PagedCopy copy;
  copy.tensors = tensors.data();
  copy.blockTable = blockTable.data();
  copy.poolTokens = layout_.blockTokens;
  copy.poolFirst = firstPosition / layout_.blockTokens;
  copy.begin = from;
  copy.end = to;
  std::vector<uint8_t*> pool;
  if (device_ < 0) {
    // A host space: the engine's tensors are in host memory, the blocks in the mapped pool.
    if (!on.mapped) {
      return makeError(ErrorCode::kNotSupported,
                       "paged copies need the pool mapped (this client moves bytes inline)");
    }
    for (const auto& ref : refs) {
      auto v = on.grantedView(ref);
      if (!v) return v.error();
      pool.push_back(v->data());
    }
    copy.poolBlocks = pool.data();
    if (auto why = kernels::checkPagedCopy(kv, copy); !why.empty()) return invalid(why);
    if (scatter) {
      kernels::scatterCpu(kv, copy);
    } else {
      kernels::gatherCpu(kv, copy);
    }
    return {};
  }
#ifndef KVTIER_HAVE_CUDA
  (void)stream;
  return makeError(ErrorCode::kNotSupported, "this kvtier client was built without CUDA");
#else
  auto* client = client_.impl_.get();
  std::lock_guard<std::mutex> lock(client->gpuMutex);
  for (const auto& ref : refs) {
    auto p = client->devicePointer(on, ref);
    if (!p) return p.error();
    pool.push_back(*p);
  }
  copy.poolBlocks = pool.data();
  if (auto why = kernels::checkPagedCopy(kv, copy); !why.empty()) return invalid(why);
  auto& copier = client->copiers[device_];
  if (!copier) copier = std::make_unique<kernels::gpu::PagedCopier>(device_);
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t e = scatter ? copier->scatter(kv, copy, s) : copier->gather(kv, copy, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return makeError(ErrorCode::kUnavailable, scatter ? "scatter" : "gather",
                     " kernel failed: ", cudaGetErrorString(e));
  }
  return {};
#endif
}

Result<CommitInfo> Space::putPaged(std::string_view seq, uint64_t begin,
                                   std::span<const uint32_t> tokens, const PagedKvCache& cache,
                                   std::span<const int32_t> blockTable, void* stream,
                                   const PutOptions& options) {
  auto handle = beginPut(seq, begin, tokens, options);
  if (!handle) return handle.error();
  if (auto s = scatterTo(*handle, begin, begin + tokens.size(), cache, blockTable, stream); !s) {
    (void)handle->abort();
    return s.error();
  }
  return handle->commit();
}

Status Space::scatterTo(const WriteHandle& handle, uint64_t from, uint64_t to,
                        const PagedKvCache& cache, std::span<const int32_t> blockTable,
                        void* stream) {
  if (!handle.lease_) {
    return makeError(ErrorCode::kReleased, "write handle was committed or aborted");
  }
  if (auto s = checkRange("scatter", "granted", from, to, handle.begin_, handle.end_); !s) {
    return s;
  }
  // Written by the paged copy: the commit takes these blocks' checksums from their bytes.
  const uint32_t bt = layout_.blockTokens;
  handle.lease_->sums.forget((from - handle.firstPosition_) / bt,
                             (to - handle.firstPosition_ + bt - 1) / bt);
  return pagedCopy(*handle.lease_->connection, true, handle.refs_, handle.firstPosition_, from, to,
                   cache, blockTable, stream);
}

Status Space::gatherTo(const ReadHandle& handle, uint64_t from, uint64_t to,
                       const PagedKvCache& cache, std::span<const int32_t> blockTable,
                       void* stream) {
  if (auto s = checkRange("gather", "held", from, to, handle.begin_, handle.end_); !s) return s;
  if (handle.views_.empty() && from < to) {
    return makeError(ErrorCode::kReleased, "read handle was released");
  }
  if (from == to || !handle.lease_) return {};
  if (auto s = pagedCopy(*handle.lease_->connection, false, handle.refs_, handle.firstPosition_,
                         from, to, cache, blockTable, stream);
      !s || device_ >= 0) {
    return s;
  }
  // A host space: each block read is checked against its writer's checksum after the copy (a
  // second read of it, in the cache still for a block of a few hundred KiB); on a mismatch the
  // engine's cache holds bytes nothing may use, as with copyTo. GPU blocks are checked where they
  // are moved in (docs/reliability.md).
  const uint32_t bt = layout_.blockTokens;
  for (uint64_t b = (from - handle.firstPosition_) / bt; b <= (to - 1 - handle.firstPosition_) / bt;
       ++b) {
    if (auto s = handle.verify(b); !s) return s;
  }
  return {};
}

}  // namespace kvtier
