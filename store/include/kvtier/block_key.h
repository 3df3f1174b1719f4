// Block keys: chained, collision-resistant, 128 bits.
//
//   key_0 = H(fingerprint || salt || tokens[0:B]),  key_i = H(key_{i-1} || tokens[iB:(i+1)B])
//
// H is SHA-256 truncated to its first 16 bytes; tokens are hashed as 4-byte little-endian. Keys are
// never computed with a non-cryptographic hash: a key collision would serve one prompt's KV for
// another (vLLM's CVE-2025-25183). Clients may also bring their own 16-byte keys.
#pragma once

#include <openssl/sha.h>

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>

namespace kvtier {

struct Key128 {
  std::array<uint8_t, 16> bytes{};
  bool operator==(const Key128&) const = default;
  std::string hex() const;
};

// Per-tenant salt mixed into key_0: two tenants never share blocks or learn of each other's.
using Salt = std::array<uint8_t, 16>;

// SHA-256 on a context held in place: no allocation per block. Not thread-safe.
class Sha256 {
 public:
  Sha256() = default;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void begin();
  void update(const void* data, size_t size);
  std::array<uint8_t, 32> finish();

 private:
  SHA256_CTX ctx_{};
};

// Computes the key chain of a token list for one namespace. Not thread-safe; cheap to create.
class BlockKeyHasher {
 public:
  BlockKeyHasher(uint64_t fingerprint, const Salt& salt) : fingerprint_(fingerprint), salt_(salt) {}

  // Key of the block holding `tokens` (exactly blockTokens of them), chained after `previous`
  // (nullptr for block 0).
  Key128 next(const Key128* previous, std::span<const uint32_t> tokens);

 private:
  uint64_t fingerprint_;
  Salt salt_;
  Sha256 sha_;
};

// Keys of a prefix state's chunks (Layout::stateBytes; docs/cache-shapes.md). The state after a
// prefix of k * B + r tokens (0 <= r < B) is anchored at the key of the prefix's last whole block
// (for k = 0 at the namespace's root, root()) and named by the r tokens after that block:
//
//   chunk_j = H("kvtier-state-v1" || anchor || tokens[kB : kB + r] || u32 r || u32 j)
//
// with H as for block keys (SHA-256, first 16 bytes), so that a state is found by content, as a
// block is, and never confused with a block or with another position's state. Not thread-safe.
class StateKeyHasher {
 public:
  StateKeyHasher(uint64_t fingerprint, const Salt& salt);
  // The anchor of states inside the first block.
  const Key128& root() const { return root_; }
  // Starts the states anchored at `anchor` at r = 0; add() extends r by one token.
  void begin(const Key128& anchor);
  void add(uint32_t token);
  uint32_t partial() const { return partial_; }
  // Key of chunk `j` of the state at the current r.
  Key128 chunk(uint32_t j) const;

 private:
  SHA256_CTX ctx_{};
  Key128 root_;
  uint32_t partial_ = 0;
};

// SHA-256 of arbitrary text truncated to a Salt (tenant names -> salts).
Salt saltFor(std::string_view tenant);

}  // namespace kvtier

template <>
struct std::hash<kvtier::Key128> {
  size_t operator()(const kvtier::Key128& k) const noexcept {
    // The key is already a uniform cryptographic hash: any 8 bytes of it are a good bucket hash.
    size_t h;
    std::memcpy(&h, k.bytes.data(), sizeof h);
    return h;
  }
};
