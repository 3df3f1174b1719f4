// Deterministic synthetic KV for demos, tests and benchmarks.
//
// Like real KV, the bytes at position p depend on every token up to p: each position has a running
// hash of the prefix, and its K and V bytes for each layer come from a splitmix64 stream seeded by
// that hash. Two processes that agree on the tokens therefore agree on the bytes, and a prompt
// that diverges at position d has different KV from d on.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "kvtier/layout.h"

namespace kvtier::synthetic {

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Running prefix hash for every position of `tokens`.
inline std::vector<uint64_t> prefixHashes(std::span<const uint32_t> tokens) {
  std::vector<uint64_t> out(tokens.size());
  uint64_t h = 0x6b76746965720001ull;  // "kvtier"
  for (size_t i = 0; i < tokens.size(); ++i) {
    uint64_t s = h ^ (uint64_t{tokens[i]} * 0x100000001b3ull);
    h = splitmix64(s);
    out[i] = h;
  }
  return out;
}

// Packed KV ([layer][K|V][token][kvHead][headDim]) for positions [from, to) of `tokens`.
inline std::vector<uint8_t> packedKv(const Layout& layout, std::span<const uint32_t> tokens,
                                     uint64_t from, uint64_t to) {
  const auto hashes = prefixHashes(tokens.subspan(0, to));
  const uint64_t tb = layout.tokenBytes(), n = to - from;
  std::vector<uint8_t> out(n * layout.tokenKvBytes());
  for (uint64_t lkv = 0; lkv < 2ull * layout.numLayers; ++lkv) {
    for (uint64_t t = 0; t < n; ++t) {
      uint64_t state = hashes[from + t] ^ (lkv * 0xd6e8feb86659fd93ull);
      uint8_t* dst = out.data() + (lkv * n + t) * tb;
      for (uint64_t i = 0; i < tb; i += 8) {
        const uint64_t v = splitmix64(state);
        std::memcpy(dst + i, &v, std::min<uint64_t>(8, tb - i));
      }
    }
  }
  return out;
}

// A run of pseudo-random token ids.
inline std::vector<uint32_t> tokens(uint64_t seed, size_t n, uint32_t vocab = 128000) {
  std::vector<uint32_t> out(n);
  for (auto& t : out) t = static_cast<uint32_t>(splitmix64(seed) % vocab);
  return out;
}

}  // namespace kvtier::synthetic
