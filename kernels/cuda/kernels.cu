// CUDA kernels: paged KV scatter/gather and RoPE re-rotation. They match the CPU reference in
// kernels/paged_copy.cc and kernels/rope.cc byte for byte (kernels/gpu_test.cc checks): both sides
// address rows with pagedRow (paged_copy.h) and rotate with rope_math.h.
//
// Paged copy: one launch moves every row of a copy. blockIdx.y is the plane (layer * 2 + K|V),
// threadIdx.y picks a row (position) and threadIdx.x walks the row's bytes in vectors of V, so a
// warp reads and writes consecutive 16-byte words (coalesced, vectorised) whenever the rows are
// 16-byte aligned; narrower vectors are used only when alignment forces them.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/gpu_launch.h"
#include "kernels/rope_math.h"

namespace kvtier::kernels::gpu::detail {
namespace {

constexpr unsigned kThreads = 256;

template <typename V, bool kScatter>
__global__ void pagedCopyKernel(PagedKv kv, PagedCopy c, uint64_t rows) {
  const uint64_t row = static_cast<uint64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= rows) return;
  const uint32_t plane = blockIdx.y;
  const PagedRow r = pagedRow(kv, c, plane, c.begin + row);
  const V* src = reinterpret_cast<const V*>(kScatter ? r.engine : r.pool);
  V* dst = reinterpret_cast<V*>(kScatter ? r.pool : r.engine);
  const uint64_t n = kv.tokenBytes / sizeof(V);
  for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

template <typename V>
cudaError_t launchCopy(bool scatter, const PagedKv& kv, const PagedCopy& c, cudaStream_t stream) {
  const uint64_t rows = c.end - c.begin;
  const uint64_t vecs = kv.tokenBytes / sizeof(V);
  unsigned x = 1;
  while (x < vecs && x < kThreads) x <<= 1;
  const dim3 block(x, kThreads / x);
  const uint64_t gridX = (rows + block.y - 1) / block.y;
  if (gridX > 0x7fffffffull || 2ull * kv.numLayers > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(gridX), 2 * kv.numLayers);
  if (scatter) {
    pagedCopyKernel<V, true><<<grid, block, 0, stream>>>(kv, c, rows);
  } else {
    pagedCopyKernel<V, false><<<grid, block, 0, stream>>>(kv, c, rows);
  }
  return cudaGetLastError();
}

__global__ void rotateKernel(RotateArgs a) {
  const uint64_t pairs = a.heads * a.half;
  for (uint64_t t = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < pairs;
       t += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = t / a.half;
    const uint32_t d = static_cast<uint32_t>(t % a.half);
    uint8_t* head = a.k + h * a.headDim * a.elemBytes;
    const uint32_t i = a.neox ? d : 2 * d;
    const uint32_t j = a.neox ? d + a.half : 2 * d + 1;
    kernels::detail::rotatePair(a.dtype, head, a.elemBytes, i, j, a.cosSin[d],
                                a.cosSin[a.half + d]);
  }
}

}  // namespace

cudaError_t pagedCopy(bool scatter, const PagedKv& kv, const PagedCopy& c, uint32_t alignment,
                      cudaStream_t stream) {
  if (c.begin >= c.end) return cudaSuccess;
  switch (alignment) {
    case 16:
      return launchCopy<uint4>(scatter, kv, c, stream);
    case 8:
      return launchCopy<uint2>(scatter, kv, c, stream);
    case 4:
      return launchCopy<uint32_t>(scatter, kv, c, stream);
    case 2:
      return launchCopy<uint16_t>(scatter, kv, c, stream);
    default:
      return launchCopy<uint8_t>(scatter, kv, c, stream);
  }
}

cudaError_t rotateK(const RotateArgs& args, cudaStream_t stream) {
  const uint64_t pairs = args.heads * args.half;
  if (pairs == 0) return cudaSuccess;
  const uint64_t blocks = (pairs + kThreads - 1) / kThreads;
  rotateKernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), kThreads, 0, stream>>>(
      args);
  return cudaGetLastError();
}

}  // namespace kvtier::kernels::gpu::detail
