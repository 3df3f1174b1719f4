// Copies between an engine's paged KV cache and kvtier's pool blocks.
//
// The engine side is vLLM's layout: for each layer a K and a V tensor of shape
// [numBlocks, blockTokens, kvHeads, headDim], and a block table naming the engine block that holds
// each run of `blockTokens` positions of a sequence. kvtier's pool blocks are layer-major:
// [layer][K|V][slot][kvHead][headDim] for `poolTokens` slots. One token's K (or V) for one layer is
// `tokenBytes` contiguous bytes on both sides, so a copy is a gather or scatter of rows.
//
// `scatter` moves positions [begin, end) from the engine's cache into pool blocks, `gather` moves
// them back. The CPU functions here are the reference; kernels/cuda/ has the CUDA kernels, which
// give identical bytes (tests check both ways).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/host_device.h"

namespace kvtier::kernels {

struct PagedKv {
  uint32_t numLayers = 0;
  uint32_t blockTokens = 0;  // the engine's block size (vLLM's block_size)
  uint64_t tokenBytes = 0;   // kvHeads * headDim * element bytes
};

// The pointer tables of one copy. All pointers are in the address space the copy runs in (host
// for the CPU functions; device, or host memory mapped for the device, for the CUDA kernels).
struct PagedCopy {
  uint8_t* const* tensors = nullptr;    // 2 * numLayers bases, [layer][K, V]
  const int32_t* blockTable = nullptr;  // engine block of positions [i * blockTokens, ...)
  uint8_t* const* poolBlocks =
      nullptr;  // pool block poolFirst + j covers [(poolFirst + j) * poolTokens, ...)
  uint32_t poolTokens = 0;
  uint64_t poolFirst = 0;
  uint64_t begin = 0, end = 0;  // positions copied
};

// The two ends of row (plane, pos) of a copy, plane = layer * 2 + (K: 0, V: 1): the engine's and
// the pool's. One definition for the CPU reference and the CUDA kernel, so both address the same
// bytes.
struct PagedRow {
  uint8_t* engine;
  uint8_t* pool;
};
KVTIER_HD PagedRow pagedRow(const PagedKv& kv, const PagedCopy& c, uint32_t plane, uint64_t pos) {
  const uint64_t engineBlock = static_cast<uint64_t>(c.blockTable[pos / kv.blockTokens]);
  uint8_t* engine =
      c.tensors[plane] + (engineBlock * kv.blockTokens + pos % kv.blockTokens) * kv.tokenBytes;
  uint8_t* pool =
      c.poolBlocks[pos / c.poolTokens - c.poolFirst] +
      (static_cast<uint64_t>(plane) * c.poolTokens + pos % c.poolTokens) * kv.tokenBytes;
  return PagedRow{engine, pool};
}

// How many entries of `poolBlocks` a non-empty copy reaches.
inline uint64_t poolBlockCount(const PagedCopy& c) {
  return (c.end - 1) / c.poolTokens - c.poolFirst + 1;
}

// Why a copy's shape is unusable ("" when it is fine): zero sizes, begin > end, a pool block size
// or engine block size of 0. The tables themselves are the caller's to get right.
std::string checkPagedCopy(const PagedKv& kv, const PagedCopy& copy);

// Engine -> pool and pool -> engine, on the CPU. Hot path: no allocation.
void scatterCpu(const PagedKv& kv, const PagedCopy& copy);
void gatherCpu(const PagedKv& kv, const PagedCopy& copy);

// The widest access (16, 8, 4, 2 or 1 bytes) every row of the copy allows: the alignment shared
// by tokenBytes and every base pointer. The CUDA kernels pick their vector width from it.
uint32_t pagedCopyAlignment(const PagedKv& kv, const PagedCopy& copy);

}  // namespace kvtier::kernels
