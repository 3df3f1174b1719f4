// What peer_rpc_fuzz.cc's node holds and expects, shared with make_seeds.cc (whose seeds present
// the token and name the namespace and keys): a cluster token, and one namespace (layout, salt)
// holding kWorldBlocks committed blocks under the client keys worldKey(0..kWorldBlocks-1).
#pragma once

#include <cstdint>

#include "kvtier/block_key.h"
#include "kvtier/layout.h"

namespace kvtier::fuzz {

inline constexpr const char* kFuzzToken = "kvtier-fuzz-cluster-token-0123456789abcdef";
inline constexpr uint32_t kWorldBlocks = 4;

// 1 layer, 1 KV head, head dim 16, fp16, 16 tokens per block: 1 KiB blocks.
inline Layout worldLayout() { return Layout{"fuzz/tiny", 1, 1, 16, DType::kFloat16, 16, {}}; }

inline Salt worldSalt() {
  Salt salt{};
  for (size_t i = 0; i < salt.size(); ++i) salt[i] = static_cast<uint8_t>(0x40 + i);
  return salt;
}

inline Key128 worldKey(uint32_t block) {
  Key128 key;
  for (size_t i = 0; i < key.bytes.size(); ++i)
    key.bytes[i] = static_cast<uint8_t>(0x10 * block + i);
  return key;
}

}  // namespace kvtier::fuzz
