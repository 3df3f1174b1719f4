// Layout: what one KV block holds and how its bytes are arranged.
//
// Bytes inside a block are layer-major: [layer][K|V][token][kvHead][headDim]. One layer's K for
// the block is `blockTokens * tokenBytes()` contiguous bytes, followed by its V.
//
// Prefix states (docs/cache-shapes.md): a layout whose `stateBytes` is not 0 belongs to a model
// with recurrent layers (state-space, linear attention, short convolutions), whose state after a
// prefix cannot be rebuilt from KV. Its sequences' prefixes are cached as KV blocks (the
// attention layers, if any) plus a state of `stateBytes` captured at the prefix's end; a lookup
// then answers only prefixes whose state is cached too. A layout of recurrent layers only has no
// KV (numLayers, numKvHeads and headDim all 0).
#pragma once

#include <cstdint>
#include <string>

#include "kvtier/error.h"

namespace kvtier {

enum class DType : uint8_t {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,
  kFloat8E4M3 = 3,
  kFloat8E5M2 = 4,
  kInt8 = 5
};

// Bytes per element; 0 for a value outside the enum.
uint32_t dtypeBytes(DType dtype);

// Bounds on a layout a client may open (a peer's layout is input, checked where used).
inline constexpr uint32_t kMinBlockTokens = 16;
inline constexpr uint32_t kMaxBlockTokens = 512;
inline constexpr uint32_t kMaxLayers = 1024;
inline constexpr uint32_t kMaxKvHeads = 1024;
inline constexpr uint32_t kMaxHeadDim = 1024;
inline constexpr size_t kMaxModelIdBytes = 256;
// One block must fit in one pool extent and in a 32-bit size.
inline constexpr uint64_t kMaxBlockBytes = 1ull << 30;
// A prefix state: the largest real models' recurrent state per sequence is ~110 MB (hybrid 27B
// class); 4 GiB bounds what a client may declare.
inline constexpr uint64_t kMaxStateBytes = 4ull << 30;
// A state is kept in chunks of the namespace's block size; a layout without KV has no blocks, and
// its states go in chunks of the state's size rounded up to 4 KiB, at most this.
inline constexpr uint64_t kMaxStateChunkBytes = 64ull << 20;
// Chunks of one state (they are pinned together with the prefix's blocks under one lease).
inline constexpr uint32_t kMaxStateChunks = 4096;

// Rotary position embedding of K, as the model applies it. Declaring it lets kvtier remove a
// middle range of a sequence and re-rotate the K of the tokens that move.
enum class RopeStyle : uint8_t {
  kNone = 0,
  kNeox = 1,  // pairs (d, d + rotaryDims/2): GPT-NeoX, Llama (HF), Qwen, Mistral
  kGptj = 2,  // pairs (2d, 2d + 1): GPT-J, original Llama (Meta)
};

struct RopeScheme {
  RopeStyle style = RopeStyle::kNone;
  uint32_t rotaryDims = 0;  // even, <= headDim; the first rotaryDims dims of each head rotate
  double base = 10000.0;    // theta_d = base^(-2d / rotaryDims)
  bool operator==(const RopeScheme&) const = default;
};

struct Layout {
  std::string modelId;
  uint32_t numLayers = 0;
  uint32_t numKvHeads = 0;
  uint32_t headDim = 0;
  DType dtype = DType::kFloat16;
  uint32_t blockTokens = 16;
  RopeScheme rope;  // optional
  // Bytes of the recurrent state captured at a prefix's end (0: the model has none).
  uint64_t stateBytes = 0;

  // Bytes of one token's K (or V) for one layer.
  uint64_t tokenBytes() const { return uint64_t{numKvHeads} * headDim * dtypeBytes(dtype); }
  // Bytes of one token's K and V over all layers.
  uint64_t tokenKvBytes() const { return 2 * numLayers * tokenBytes(); }
  uint64_t blockBytes() const { return tokenKvBytes() * blockTokens; }
  // Offset inside a block of token slot `slot` of layer `layer`, K (kv = 0) or V (kv = 1).
  uint64_t slotOffset(uint32_t layer, uint32_t kv, uint32_t slot) const {
    return ((uint64_t{layer} * 2 + kv) * blockTokens + slot) * tokenBytes();
  }
  bool hasKv() const { return numLayers > 0; }
  bool hasState() const { return stateBytes > 0; }
  // Bytes of one chunk of a prefix state: the block size, or for a layout without KV the state's
  // size rounded up to 4 KiB (at most kMaxStateChunkBytes). Every block of the namespace has this
  // size.
  uint64_t chunkBytes() const {
    if (hasKv()) return blockBytes();
    const uint64_t rounded = (stateBytes + 4095) / 4096 * 4096;
    return rounded < kMaxStateChunkBytes ? rounded : kMaxStateChunkBytes;
  }
  // Bytes of the state at a position `partial` tokens past a block boundary: the KV of those
  // tokens (a block holding them in its first slots) when partial > 0, then the recurrent state.
  uint64_t statePayloadBytes(uint32_t partial) const {
    return (partial > 0 ? blockBytes() : 0) + stateBytes;
  }
  // Chunks of such a state.
  uint32_t stateChunks(uint32_t partial) const {
    const uint64_t chunk = chunkBytes();
    return chunk == 0 ? 0 : static_cast<uint32_t>((statePayloadBytes(partial) + chunk - 1) / chunk);
  }

  // How validate()'s messages name the fields: as these members are named (numKvHeads, ...), or
  // in snake_case (num_kv_heads, ...) as the C ABI's kvtier_layout and the Python binding's
  // keywords name them, so that a caller reads the name it wrote.
  enum class FieldNames : uint8_t { kCpp, kSnakeCase };
  // INVALID_ARGUMENT naming the first bound a field breaks.
  Status validate(FieldNames names = FieldNames::kCpp) const;
  // 64-bit fingerprint of every field and of the byte arrangement; part of every block key.
  uint64_t fingerprint() const;

  bool operator==(const Layout&) const = default;
};

}  // namespace kvtier
