// CUDA kernels: paged KV scatter/gather and RoPE re-rotation. They match the CPU reference in
// kernels/paged_copy.cc and kernels/rope.cc byte for byte (kernels/gpu_test.cc checks): both sides
// address rows with pagedRow (paged_copy.h) and rotate with rope_math.h.
//
// Paged copy: one launch moves every row of a copy. Positions are cut into tiles of
// g = gcd(engine block, pool block) tokens: every block boundary on either side is a multiple of g,
// so within a tile the rows of one plane (layer * 2 + K|V) are contiguous bytes on both sides. A
// thread block takes a run of tiles of one plane (blockIdx.y), reads its three table entries once
// per tile and copies the tile as one contiguous range in vectors of V, each thread holding kUnroll
// loads in flight before it stores. V is 16 bytes whenever the rows and bases allow it.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/gpu_launch.h"
#include "kernels/rope_math.h"

namespace kvtier::kernels::gpu::detail {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kUnroll = 4;
// Bytes a thread block moves before it ends: enough to hide the table reads and the block's start.
constexpr uint64_t kBytesPerThreadBlock = 32 * 1024;

uint64_t gcd(uint64_t a, uint64_t b) {
  while (b != 0) {
    const uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

// One thread block's share of a copy: tiles t0 .. t0 + tilesPerBlock - 1 of plane blockIdx.y.
template <typename V, bool kScatter>
__device__ void copyTiles(const PagedKv& kv, const PagedCopy& c, uint64_t tileTokens,
                          uint64_t tilesPerBlock) {
  const uint32_t plane = blockIdx.y;
  const uint64_t lastTile = (c.end - 1) / tileTokens;
  const uint64_t t0 = c.begin / tileTokens + static_cast<uint64_t>(blockIdx.x) * tilesPerBlock;
  for (uint64_t t = t0; t < t0 + tilesPerBlock && t <= lastTile; ++t) {
    const uint64_t from = t * tileTokens > c.begin ? t * tileTokens : c.begin;
    const uint64_t to = (t + 1) * tileTokens < c.end ? (t + 1) * tileTokens : c.end;
    const PagedRow r = pagedRow(kv, c, plane, from);
    const V* __restrict__ src = reinterpret_cast<const V*>(kScatter ? r.engine : r.pool);
    V* __restrict__ dst = reinterpret_cast<V*>(kScatter ? r.pool : r.engine);
    const uint64_t n = (to - from) * kv.tokenBytes / sizeof(V);
    for (uint64_t i = threadIdx.x; i < n; i += kUnroll * kThreads) {
      V v[kUnroll];
#pragma unroll
      for (unsigned k = 0; k < kUnroll; ++k) {
        if (i + k * kThreads < n) v[k] = src[i + k * kThreads];
      }
#pragma unroll
      for (unsigned k = 0; k < kUnroll; ++k) {
        if (i + k * kThreads < n) dst[i + k * kThreads] = v[k];
      }
    }
  }
}

template <typename V, bool kScatter>
__global__ void __launch_bounds__(kThreads)
    pagedCopyKernel(PagedKv kv, PagedCopy c, uint64_t tileTokens, uint64_t tilesPerBlock) {
  copyTiles<V, kScatter>(kv, c, tileTokens, tilesPerBlock);
}

// The tables in the launch parameters; __grid_constant__ lets the kernel index them in place. Two
// sizes: the launch sends the whole block, so the common small copy sends 4 KiB, not 31.
template <size_t kBytes>
struct ParamTables {
  alignas(8) uint8_t bytes[kBytes];
};
constexpr size_t kSmallInlineTableBytes = 4096;

template <typename V, bool kScatter, size_t kBytes>
__global__ void __launch_bounds__(kThreads)
    pagedCopyInlineKernel(PagedKv kv, PagedCopy c, InlineLayout layout, uint64_t tileTokens,
                          uint64_t tilesPerBlock,
                          const __grid_constant__ ParamTables<kBytes> tables) {
  c.tensors = reinterpret_cast<uint8_t* const*>(tables.bytes + layout.tensors);
  c.poolBlocks = reinterpret_cast<uint8_t* const*>(tables.bytes + layout.poolBlocks);
  c.blockTable = reinterpret_cast<const int32_t*>(tables.bytes + layout.blockTable);
  copyTiles<V, kScatter>(kv, c, tileTokens, tilesPerBlock);
}

// The launch shape of a copy: tiles of gcd(engine block, pool block) tokens, several per thread
// block when tiles are small, never fewer thread blocks than the chip can use well.
struct Shape {
  dim3 grid;
  uint64_t tileTokens = 0, tilesPerBlock = 0;
  bool ok = false;
};
Shape shapeOf(const PagedKv& kv, const PagedCopy& c) {
  Shape s;
  s.tileTokens = gcd(kv.blockTokens, c.poolTokens);
  const uint64_t tiles = (c.end - 1) / s.tileTokens - c.begin / s.tileTokens + 1;
  const uint64_t tileBytes = s.tileTokens * kv.tokenBytes;
  s.tilesPerBlock = tileBytes >= kBytesPerThreadBlock ? 1 : kBytesPerThreadBlock / tileBytes;
  const uint64_t planes = 2ull * kv.numLayers;
  while (s.tilesPerBlock > 1 && planes * ((tiles + s.tilesPerBlock - 1) / s.tilesPerBlock) < 1024) {
    s.tilesPerBlock /= 2;
  }
  const uint64_t gridX = (tiles + s.tilesPerBlock - 1) / s.tilesPerBlock;
  s.ok = gridX <= 0x7fffffffull && planes <= 65535;
  s.grid = dim3(static_cast<unsigned>(s.ok ? gridX : 1), static_cast<unsigned>(planes));
  return s;
}

// Launches the scatter or the gather instance of a kernel over a copy's shape.
template <typename... Args>
cudaError_t launchEither(bool scatter, void (*scatterKernel)(Args...),
                         void (*gatherKernel)(Args...), const Shape& s, cudaStream_t stream,
                         Args... args) {
  if (!s.ok) return cudaErrorInvalidConfiguration;
  (scatter ? scatterKernel : gatherKernel)<<<s.grid, kThreads, 0, stream>>>(args...);
  return cudaGetLastError();
}

// launch(V{}) with the widest vector type V that `alignment` allows.
template <typename Launch>
cudaError_t byAlignment(uint32_t alignment, Launch&& launch) {
  switch (alignment) {
    case 16:
      return launch(uint4{});
    case 8:
      return launch(uint2{});
    case 4:
      return launch(uint32_t{});
    case 2:
      return launch(uint16_t{});
    default:
      return launch(uint8_t{});
  }
}

// The copy with its host tables packed into a parameter block of kBytes.
template <typename V, size_t kBytes>
cudaError_t launchInline(bool scatter, const PagedKv& kv, const PagedCopy& hostTables,
                         const InlineLayout& layout, cudaStream_t stream) {
  ParamTables<kBytes> params;  // only the used bytes are written
  std::memcpy(params.bytes + layout.tensors, hostTables.tensors,
              layout.poolBlocks - layout.tensors);
  std::memcpy(params.bytes + layout.poolBlocks, hostTables.poolBlocks,
              layout.blockTable - layout.poolBlocks);
  std::memcpy(params.bytes + layout.blockTable, hostTables.blockTable,
              layout.bytes - layout.blockTable);
  const Shape s = shapeOf(kv, hostTables);
  return launchEither(scatter, &pagedCopyInlineKernel<V, true, kBytes>,
                      &pagedCopyInlineKernel<V, false, kBytes>, s, stream, kv, hostTables, layout,
                      s.tileTokens, s.tilesPerBlock, params);
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
  return byAlignment(alignment, [&](auto vector) {
    using V = decltype(vector);
    const Shape s = shapeOf(kv, c);
    return launchEither(scatter, &pagedCopyKernel<V, true>, &pagedCopyKernel<V, false>, s, stream,
                        kv, c, s.tileTokens, s.tilesPerBlock);
  });
}

cudaError_t pagedCopyInline(bool scatter, const PagedKv& kv, const PagedCopy& hostTables,
                            const InlineLayout& layout, uint32_t alignment, cudaStream_t stream) {
  if (hostTables.begin >= hostTables.end) return cudaSuccess;
  if (layout.bytes > kMaxInlineTableBytes) return cudaErrorInvalidValue;
  return byAlignment(alignment, [&](auto vector) {
    using V = decltype(vector);
    return layout.bytes <= kSmallInlineTableBytes
               ? launchInline<V, kSmallInlineTableBytes>(scatter, kv, hostTables, layout, stream)
               : launchInline<V, kMaxInlineTableBytes>(scatter, kv, hostTables, layout, stream);
  });
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
