// Shapes and buffers for the paged copy tests (CPU reference and GPU): an engine's paged K and V
// tensors, a shuffled block table and kvtier pool blocks, all in host memory, plus the expected
// offsets computed element by element (independently of the row arithmetic under test).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/paged_copy.h"

namespace kvtier::kernels::testing {

struct PagedCase {
  std::string name;
  uint32_t layers, engineBlockTokens, poolTokens, heads, headDim, elemBytes;
  uint64_t begin, end;
  bool shuffled;  // block table out of order
};

inline std::vector<PagedCase> pagedCases() {
  return {
      {"one_block_fp16", 2, 16, 16, 8, 128, 2, 0, 16, false},
      {"partial_last_block", 3, 16, 16, 2, 64, 2, 0, 37, true},
      {"append_mid_block", 2, 16, 16, 4, 32, 2, 21, 50, true},
      {"engine_blocks_smaller", 2, 8, 32, 2, 16, 4, 0, 70, true},
      {"engine_blocks_larger", 1, 32, 16, 1, 8, 4, 5, 90, true},
      {"blocks_not_multiples", 2, 12, 16, 3, 4, 1, 3, 61, true},
      {"int8_odd_row", 3, 16, 16, 3, 5, 1, 0, 33, true},  // 15-byte rows: byte accesses
      {"fp32_many_blocks", 4, 16, 16, 2, 32, 4, 0, 16 * 40, true},
      {"empty_range", 1, 16, 16, 1, 8, 2, 7, 7, false},
      // 2 KiB rows: a tile (16 rows of a plane) takes two rounds of a thread block's loads.
      {"large_rows", 2, 16, 16, 8, 128, 2, 3, 16 * 50 + 5, true},
      // 64-byte rows over 1,500 tiles: each GPU thread block copies several tiles in turn, and
      // the tables (18 KiB) take the GPU copier's larger launch-parameter block.
      {"many_small_tiles", 1, 16, 16, 1, 32, 2, 5, 16 * 1500 + 7, true},
  };
}

// Host buffers for one case. Engine tensors hold numBlocks blocks; pool blocks cover [0, end).
struct PagedBuffers {
  PagedCase c;
  uint64_t tokenBytes, engineBlocks, poolBlocks, poolBlockBytes, tensorBytes;
  std::vector<std::vector<uint8_t>> tensors;  // [layer * 2 + kv]
  std::vector<std::vector<uint8_t>> pool;     // [pool block]
  std::vector<int32_t> table;

  explicit PagedBuffers(const PagedCase& pc, uint32_t seed = 1) : c(pc) {
    tokenBytes = uint64_t{c.heads} * c.headDim * c.elemBytes;
    const uint64_t needed =
        std::max<uint64_t>(1, (c.end + c.engineBlockTokens - 1) / c.engineBlockTokens);
    engineBlocks = needed + 3;  // spare blocks the table never names
    poolBlocks = std::max<uint64_t>(1, (c.end + c.poolTokens - 1) / c.poolTokens);
    poolBlockBytes = 2ull * c.layers * c.poolTokens * tokenBytes;
    tensorBytes = engineBlocks * c.engineBlockTokens * tokenBytes;
    std::mt19937 rng(seed);
    tensors.assign(2 * c.layers, std::vector<uint8_t>(tensorBytes));
    for (auto& t : tensors) std::generate(t.begin(), t.end(), [&] { return uint8_t(rng()); });
    pool.assign(poolBlocks, std::vector<uint8_t>(poolBlockBytes));
    for (auto& b : pool) std::generate(b.begin(), b.end(), [&] { return uint8_t(rng()); });
    table.resize(needed);
    std::iota(table.begin(), table.end(), 2);  // never blocks 0 and 1
    if (c.shuffled) std::shuffle(table.begin(), table.end(), rng);
  }

  PagedKv kv() const { return PagedKv{c.layers, c.engineBlockTokens, tokenBytes}; }

  // Byte offsets of element (layer, kv, pos, head, dim): in its tensor, and in its pool block.
  uint64_t engineOffset(uint64_t pos, uint32_t head, uint32_t dim) const {
    const uint64_t block = static_cast<uint64_t>(table[pos / c.engineBlockTokens]);
    const uint64_t slot = pos % c.engineBlockTokens;
    return (((block * c.engineBlockTokens + slot) * c.heads + head) * c.headDim + dim) *
           c.elemBytes;
  }
  uint64_t poolOffset(uint32_t layer, uint32_t kv, uint64_t pos, uint32_t head,
                      uint32_t dim) const {
    const uint64_t slot = pos % c.poolTokens;
    return ((((uint64_t{layer} * 2 + kv) * c.poolTokens + slot) * c.heads + head) * c.headDim +
            dim) *
           c.elemBytes;
  }
};

// Pointer tables over some storage of the buffers' shape (host copies, or device copies).
struct PagedTables {
  std::vector<uint8_t*> tensors, pool;
  PagedCopy copy(const PagedBuffers& b) const {
    PagedCopy c;
    c.tensors = tensors.data();
    c.blockTable = b.table.data();
    c.poolBlocks = pool.data();
    c.poolTokens = b.c.poolTokens;
    c.poolFirst = 0;
    c.begin = b.c.begin;
    c.end = b.c.end;
    return c;
  }
};

inline PagedTables hostTables(PagedBuffers& b) {
  PagedTables t;
  for (auto& x : b.tensors) t.tensors.push_back(x.data());
  for (auto& x : b.pool) t.pool.push_back(x.data());
  return t;
}

}  // namespace kvtier::kernels::testing
