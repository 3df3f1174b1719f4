#include "kernels/block_copy.h"

#include <cstring>

namespace kvtier::kernels {

void packSlots(const BlockGeometry& g, const uint8_t* block, uint32_t firstSlot, uint32_t slots,
               uint8_t* packed, uint64_t packedTokens, uint64_t packedFirst) {
  const uint64_t run = uint64_t{slots} * g.tokenBytes;
  for (uint64_t lkv = 0; lkv < 2ull * g.numLayers; ++lkv) {
    std::memcpy(packed + (lkv * packedTokens + packedFirst) * g.tokenBytes,
                block + (lkv * g.blockTokens + firstSlot) * g.tokenBytes, run);
  }
}

void unpackSlots(const BlockGeometry& g, uint8_t* block, uint32_t firstSlot, uint32_t slots,
                 const uint8_t* packed, uint64_t packedTokens, uint64_t packedFirst) {
  const uint64_t run = uint64_t{slots} * g.tokenBytes;
  for (uint64_t lkv = 0; lkv < 2ull * g.numLayers; ++lkv) {
    std::memcpy(block + (lkv * g.blockTokens + firstSlot) * g.tokenBytes,
                packed + (lkv * packedTokens + packedFirst) * g.tokenBytes, run);
  }
}

}  // namespace kvtier::kernels
