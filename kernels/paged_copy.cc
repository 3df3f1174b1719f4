#include "kernels/paged_copy.h"

#include <cstring>

namespace kvtier::kernels {

std::string checkPagedCopy(const PagedKv& kv, const PagedCopy& c) {
  if (kv.numLayers == 0 || kv.blockTokens == 0 || kv.tokenBytes == 0) {
    return "paged KV needs layers, an engine block size and token bytes";
  }
  if (c.poolTokens == 0) return "pool blocks need a token count";
  if (c.begin > c.end) return "copy range begins after its end";
  if (c.begin / c.poolTokens < c.poolFirst) return "copy range begins before the first pool block";
  if (c.begin != c.end && (!c.tensors || !c.blockTable || !c.poolBlocks)) {
    return "copy tables missing";
  }
  return "";
}

void scatterCpu(const PagedKv& kv, const PagedCopy& c) {
  for (uint32_t plane = 0; plane < 2 * kv.numLayers; ++plane) {
    for (uint64_t pos = c.begin; pos < c.end; ++pos) {
      const PagedRow r = pagedRow(kv, c, plane, pos);
      std::memcpy(r.pool, r.engine, kv.tokenBytes);
    }
  }
}

void gatherCpu(const PagedKv& kv, const PagedCopy& c) {
  for (uint32_t plane = 0; plane < 2 * kv.numLayers; ++plane) {
    for (uint64_t pos = c.begin; pos < c.end; ++pos) {
      const PagedRow r = pagedRow(kv, c, plane, pos);
      std::memcpy(r.engine, r.pool, kv.tokenBytes);
    }
  }
}

uint32_t pagedCopyAlignment(const PagedKv& kv, const PagedCopy& c) {
  uint64_t bits = kv.tokenBytes | 16;
  for (uint32_t plane = 0; plane < 2 * kv.numLayers; ++plane) {
    bits |= reinterpret_cast<uintptr_t>(c.tensors[plane]);
  }
  if (c.begin < c.end) {
    const uint64_t blocks = poolBlockCount(c);
    for (uint64_t j = c.begin / c.poolTokens - c.poolFirst; j < blocks; ++j) {
      bits |= reinterpret_cast<uintptr_t>(c.poolBlocks[j]);
    }
  }
  return static_cast<uint32_t>(bits & (~bits + 1));  // lowest set bit: at most 16
}

}  // namespace kvtier::kernels
