// Helpers shared by the engine's unit tests: a small layout and per-position tags written into
// every layer's K and V slot, so that a test can tell exactly which position's bytes it reads.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kvtier/layout.h"

namespace kvtier::test_util {

inline constexpr uint32_t kTestBlockTokens = 16;

// 2 layers, 1 KV head, head dim 4, fp16: 8 bytes per token per layer for K (and V), 512-byte
// blocks. No RoPE scheme.
inline Layout smallLayout(std::string modelId = "test-model") {
  Layout l;
  l.modelId = std::move(modelId);
  l.numLayers = 2;
  l.numKvHeads = 1;
  l.headDim = 4;
  l.dtype = DType::kFloat16;
  l.blockTokens = kTestBlockTokens;
  return l;
}

// What a test writes into a position: for every layer, K and V, the token slot holds the tag (4
// bytes, little-endian), the layer, K or V, and the tag's complement; zeroed or foreign bytes read
// back as nullopt.
using Tags = std::vector<std::optional<uint32_t>>;

inline void slotBytes(uint32_t tag, uint32_t layer, uint32_t kv, uint8_t out[8]) {
  out[0] = static_cast<uint8_t>(tag);
  out[1] = static_cast<uint8_t>(tag >> 8);
  out[2] = static_cast<uint8_t>(tag >> 16);
  out[3] = static_cast<uint8_t>(tag >> 24);
  out[4] = static_cast<uint8_t>(layer);
  out[5] = static_cast<uint8_t>(kv);
  out[6] = static_cast<uint8_t>(~tag);
  out[7] = static_cast<uint8_t>(~tag >> 8);
}

inline void writeTag(const Layout& l, uint8_t* block, uint32_t slot, uint32_t tag) {
  for (uint32_t layer = 0; layer < l.numLayers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      uint8_t bytes[8];
      slotBytes(tag, layer, kv, bytes);
      std::memcpy(block + l.slotOffset(layer, kv, slot), bytes, sizeof bytes);
    }
  }
}

inline std::optional<uint32_t> readTag(const Layout& l, const uint8_t* block, uint32_t slot) {
  const uint8_t* p = block + l.slotOffset(0, 0, slot);
  const uint32_t tag =
      uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
  for (uint32_t layer = 0; layer < l.numLayers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      uint8_t bytes[8];
      slotBytes(tag, layer, kv, bytes);
      if (std::memcmp(block + l.slotOffset(layer, kv, slot), bytes, sizeof bytes) != 0)
        return std::nullopt;
    }
  }
  return tag;
}

inline std::vector<uint32_t> toks(size_t n, uint32_t first) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = first + static_cast<uint32_t>(i);
  return v;
}

}  // namespace kvtier::test_util
