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
