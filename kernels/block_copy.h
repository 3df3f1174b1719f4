// CPU block copies between kvtier's layer-major blocks and a packed token buffer.
//
// A block holds [layer][K|V][slot][kvHead][headDim] for `blockTokens` slots. A packed buffer holds
// the same for a run of `packedTokens` consecutive positions: [layer][K|V][token][kvHead][headDim].
// These copy `slots` token slots starting at block slot `firstSlot` to or from packed token index
// `packedFirst`: 2 * numLayers memcpy calls of slots * tokenBytes bytes each.
#pragma once

#include <cstdint>

namespace kvtier::kernels {

struct BlockGeometry {
  uint32_t numLayers;
  uint32_t blockTokens;
  uint64_t tokenBytes;  // one token's K (or V) for one layer
};

// Hot path: no allocation, no syscall.
void packSlots(const BlockGeometry& g, const uint8_t* block, uint32_t firstSlot, uint32_t slots,
               uint8_t* packed, uint64_t packedTokens, uint64_t packedFirst);
void unpackSlots(const BlockGeometry& g, uint8_t* block, uint32_t firstSlot, uint32_t slots,
                 const uint8_t* packed, uint64_t packedTokens, uint64_t packedFirst);

}  // namespace kvtier::kernels
