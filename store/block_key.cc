#include "kvtier/block_key.h"

#include <cstdio>
#include <stdexcept>

namespace kvtier {

std::string Key128::hex() const {
  std::string out(32, '0');
  static constexpr char kDigits[] = "0123456789abcdef";
  for (size_t i = 0; i < bytes.size(); ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return out;
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr) throw std::bad_alloc();
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

namespace {

// OpenSSL 3 looks an algorithm up (under a lock) every time EVP_sha256() is passed to an init;
// fetch it once for the process.
const EVP_MD* sha256Digest() {
  static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md;
}

}  // namespace

void Sha256::begin() {
  if (EVP_DigestInit_ex(ctx_, sha256Digest(), nullptr) != 1) {
    throw std::runtime_error("EVP_DigestInit_ex failed");
  }
}

void Sha256::update(const void* data, size_t size) {
  if (EVP_DigestUpdate(ctx_, data, size) != 1) throw std::runtime_error("EVP_DigestUpdate failed");
}

std::array<uint8_t, 32> Sha256::finish() {
  std::array<uint8_t, 32> digest;
  unsigned int size = 0;
  if (EVP_DigestFinal_ex(ctx_, digest.data(), &size) != 1 || size != digest.size()) {
    throw std::runtime_error("EVP_DigestFinal_ex failed");
  }
  return digest;
}

Key128 BlockKeyHasher::next(const Key128* previous, std::span<const uint32_t> tokens) {
  sha_.begin();
  if (previous == nullptr) {
    uint8_t fp[8];
    for (int i = 0; i < 8; ++i) fp[i] = static_cast<uint8_t>(fingerprint_ >> (8 * i));
    sha_.update(fp, sizeof fp);
    sha_.update(salt_.data(), salt_.size());
  } else {
    sha_.update(previous->bytes.data(), previous->bytes.size());
  }
  static_assert(std::endian::native == std::endian::little, "tokens are hashed as little-endian");
  sha_.update(tokens.data(), tokens.size_bytes());
  auto digest = sha_.finish();
  Key128 key;
  std::memcpy(key.bytes.data(), digest.data(), key.bytes.size());
  return key;
}

Salt saltFor(std::string_view tenant) {
  Sha256 sha;
  sha.begin();
  static constexpr std::string_view kDomain = "kvtier-tenant-salt-v1:";
  sha.update(kDomain.data(), kDomain.size());
  sha.update(tenant.data(), tenant.size());
  auto digest = sha.finish();
  Salt salt;
  std::memcpy(salt.data(), digest.data(), salt.size());
  return salt;
}

}  // namespace kvtier
